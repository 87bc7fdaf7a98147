//! The invariants of DESIGN.md, checked from MySQL and the core's books after a sale
//! has settled. Each violation names the offending rows.

use std::collections::{HashMap, HashSet};

use mysql_async::prelude::*;
use serde::Serialize;

use stampede_core::order_tables::{OrderStatus, over_shards};

use crate::stack::Stack;

/// The statuses whose orders hold their units, for SQL.
const LIVE: &str = OrderStatus::LIVE_SQL;

#[derive(Debug, Default, Serialize)]
pub struct Audit {
    pub ok: bool,
    /// Orders of the event in MySQL (any status).
    pub orders: u64,
    /// Each check and whether it held.
    pub checks: Vec<(String, bool)>,
    /// The offending rows, in words.
    pub violations: Vec<String>,
    /// 202s that became orders, that ended FAILED (released, expired, refused), and
    /// that left no trace (lost).
    pub ordered_202: u64,
    pub failed_202: u64,
    pub lost_202: u64,
    /// A train's seat-segments in its orders of any status (what the sale sold), and
    /// in live ones (fewer once orders are cancelled); 0 for any other event.
    pub seat_segments_ordered: u64,
    pub seat_segments_held: u64,
}

impl Audit {
    fn check(&mut self, name: &str, violations: Vec<String>) {
        self.checks.push((name.to_owned(), violations.is_empty()));
        self.violations
            .extend(violations.into_iter().map(|v| format!("{name}: {v}")));
    }

    /// A check made outside the audit (the pay race's), counted like its own.
    pub fn add(&mut self, name: &str, violations: Vec<String>) {
        self.check(name, violations);
        self.ok = self.violations.is_empty();
    }
}

/// `admitted`: (user id, request id) of every 202 the burst got, deduplicated.
pub async fn run(
    stack: &Stack,
    event: u64,
    per_user_limit: u32,
    admitted: &[(u64, u64)],
) -> anyhow::Result<Audit> {
    let mut conn = stack.mysql.get_conn().await?;
    let shards = stampede_core::order_tables::count_shards(&mut conn).await?;
    anyhow::ensure!(shards > 0, "no order tables in the stack's database");
    let mut audit = Audit::default();
    let orders = over_shards(
        shards,
        &format!(
            "SELECT order_no, user_id, category_id, quantity, status FROM {{orders}} WHERE event_id = {event}"
        ),
    );
    audit.orders = conn
        .query_first::<u64, _>(format!("SELECT COUNT(*) FROM ({orders}) o"))
        .await?
        .unwrap_or(0);

    // 1. No oversell: per category, units in live orders ≤ total.
    let oversold: Vec<(u64, i64, i64)> = conn
        .query(format!(
            "SELECT c.id, c.total, CAST(COALESCE(SUM(o.quantity), 0) AS SIGNED) \
             FROM ticket_category c LEFT JOIN ({orders}) o \
               ON o.category_id = c.id AND o.status IN {LIVE} \
             WHERE c.event_id = {event} GROUP BY c.id, c.total HAVING SUM(o.quantity) > c.total"
        ))
        .await?;
    audit.check(
        "no oversell",
        oversold
            .into_iter()
            .map(|(c, total, sold)| format!("category {c}: {sold} units in orders of {total}"))
            .collect(),
    );

    // 2. Conservation, as the core's reconciler books it (Redis + queued + unpaid +
    //    paid = total; MySQL remain agrees).
    let stats = stack.stats(event).await?;
    let unbalanced: Vec<String> = stats["categories"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .filter(|c| c["gap"] != 0 || c["remain_gap"] != 0)
                .map(|c| c.to_string())
                .collect()
        })
        .unwrap_or_else(|| vec![format!("no stats: {stats}")]);
    audit.check("conservation", unbalanced);

    // 3. The per-user limit across all of a user's live orders.
    let over_limit: Vec<(u64, i64)> = conn
        .query(format!(
            "SELECT user_id, CAST(SUM(quantity) AS SIGNED) n FROM ({orders}) o \
             WHERE status IN {LIVE} GROUP BY user_id HAVING n > {per_user_limit} LIMIT 20"
        ))
        .await?;
    audit.check(
        "per-user limit",
        over_limit
            .into_iter()
            .map(|(u, n)| format!("user {u} holds {n} (limit {per_user_limit})"))
            .collect(),
    );

    // 4. No seat in two live orders (a train's seats: by segment, below).
    let items = over_shards(
        shards,
        &format!(
            "SELECT i.category_id, i.row_no, i.col_no, i.order_no FROM {{items}} i \
             JOIN {{orders}} o ON o.order_no = i.order_no \
             WHERE o.event_id = {event} AND o.status IN {LIVE} AND i.row_no IS NOT NULL \
             AND i.from_station IS NULL"
        ),
    );
    let doubled: Vec<(u64, u32, u32, String)> = conn
        .query(format!(
            "SELECT category_id, row_no, col_no, GROUP_CONCAT(order_no) FROM ({items}) s \
             GROUP BY category_id, row_no, col_no HAVING COUNT(*) > 1 LIMIT 20"
        ))
        .await?;
    audit.check(
        "one order per seat",
        doubled
            .into_iter()
            .map(|(c, r, col, o)| format!("category {c} seat {r}:{col} in orders {o}"))
            .collect(),
    );

    // 5. Every 202 reached a terminal status: its order exists, or it was released
    //    (EXPIRED in stock_log, or the buyer's status FAILED).
    let mut found: HashSet<u64> = HashSet::new();
    for chunk in admitted.chunks(5_000) {
        let list: Vec<String> = chunk.iter().map(|(_, r)| r.to_string()).collect();
        let list = list.join(",");
        let ordered: Vec<u64> = conn
            .query(format!(
                "SELECT order_no FROM ({orders}) o WHERE order_no IN ({list})"
            ))
            .await?;
        audit.ordered_202 += ordered.len() as u64;
        let decided: Vec<u64> = conn
            .query(format!(
                "SELECT order_no FROM stock_log WHERE order_no IN ({list}) AND status IN ('EXPIRED', 'REFUSED')"
            ))
            .await?;
        found.extend(ordered);
        found.extend(decided);
    }
    // Released in Redis alone (FAILED there, naming it, nothing in MySQL): told, so not
    // lost.
    let unknown: Vec<&(u64, u64)> = admitted
        .iter()
        .filter(|(_, r)| !found.contains(r))
        .collect();
    if !unknown.is_empty() {
        let keys =
            stampede_core::keys::Keys::new(&stampede_core::Settings::defaults().redis.key_prefix);
        let mut redis = stack.redis().await?;
        use stampede_core::admission::status::PurchaseStatus;
        use stampede_core::domain::{OrderNo, UserId};
        for (user, rid) in unknown {
            // The buyer's status, or (replaced by a later purchase) the purchase's own.
            let said: Vec<Option<String>> = redis::cmd("HMGET")
                .arg(keys.purchase_status(stack.bucket_of(event, *user).await?))
                .arg(user)
                .arg(stampede_core::keys::replaced_purchase(
                    UserId(*user),
                    OrderNo(*rid),
                ))
                .query_async(&mut redis)
                .await?;
            if said
                .iter()
                .flatten()
                .any(|s| PurchaseStatus::says_failed(s, OrderNo(*rid)))
            {
                found.insert(*rid);
            }
        }
    }
    audit.lost_202 = admitted.iter().filter(|(_, r)| !found.contains(r)).count() as u64;
    audit.failed_202 = admitted.len() as u64 - audit.ordered_202 - audit.lost_202;
    let missing: Vec<String> = admitted
        .iter()
        .filter(|(_, r)| !found.contains(r))
        .take(20)
        .map(|(u, r)| format!("user {u}: 202 with request {r}, no order and no release"))
        .collect();
    audit.check("every 202 terminal", missing);

    // 6. Every batch's stock synced.
    let unsynced: Vec<(String, u64, u64)> = conn
        .query(format!(
            "SELECT batch_id, category_id, orders FROM stock_batch WHERE synced = 0 AND event_id = {event} LIMIT 20"
        ))
        .await?;
    audit.check(
        "stock synced",
        unsynced
            .into_iter()
            .map(|(b, c, n)| format!("batch {b} (category {c}, {n} orders) not synced"))
            .collect(),
    );
    let kind: Option<String> = conn
        .exec_first("SELECT kind FROM event WHERE id = ?", (event,))
        .await?;
    if kind.as_deref() == Some("train") {
        seat_segments(stack, &mut conn, shards, event, &mut audit).await?;
    }
    audit.ok = audit.violations.is_empty();
    Ok(audit)
}

/// A seat of a train class: (class, carriage, seat).
type Seat = (u64, u32, u32);

/// 7–10, for a train (docs/trains.md): no seat-segment in two live orders; MySQL's
/// `seat_segment` guard holds exactly the live orders' seat-segments; no class sold
/// beyond seats × segments; Redis's seats are taken exactly there, and its class stock
/// plus the seat-segments sold is the total.
async fn seat_segments(
    stack: &Stack,
    conn: &mut mysql_async::Conn,
    shards: u32,
    event: u64,
    audit: &mut Audit,
) -> anyhow::Result<()> {
    let journeys: Vec<(u64, u32, u32, u8, u8, u64)> = conn
        .query(over_shards(
            shards,
            &format!(
                "SELECT i.category_id, i.row_no, i.col_no, i.from_station, i.to_station, \
                 i.order_no FROM {{items}} i JOIN {{orders}} o ON o.order_no = i.order_no \
                 WHERE o.event_id = {event} AND o.status IN {LIVE} AND i.from_station IS NOT NULL"
            ),
        ))
        .await?;
    // (seat, segment) → the live order holding it.
    let mut held: HashMap<(Seat, u8), u64> = HashMap::new();
    let mut doubled = Vec::new();
    for (c, row, col, from, to, order) in journeys {
        for k in from..to {
            if let Some(other) = held.insert(((c, row, col), k), order) {
                doubled.push(format!(
                    "class {c} seat {row}:{col} segment {k} in orders {other} and {order}"
                ));
            }
        }
    }
    audit.seat_segments_held = held.len() as u64;
    audit.seat_segments_ordered = conn
        .query_first::<u64, _>(format!(
            "SELECT CAST(COALESCE(SUM(n), 0) AS UNSIGNED) FROM ({}) s",
            over_shards(
                shards,
                &format!(
                    "SELECT i.to_station - i.from_station AS n FROM {{items}} i \
                     JOIN {{orders}} o ON o.order_no = i.order_no \
                     WHERE o.event_id = {event} AND i.from_station IS NOT NULL"
                ),
            )
        ))
        .await?
        .unwrap_or(0);
    doubled.truncate(20);
    audit.check("one order per seat-segment", doubled);

    let guard: HashMap<(Seat, u8), u64> = conn
        .query::<(u64, u32, u32, u8, u64), _>(format!(
            "SELECT category_id, row_no, col_no, segment, order_no FROM seat_segment \
             WHERE event_id = {event}"
        ))
        .await?
        .into_iter()
        .map(|(c, row, col, k, order)| (((c, row, col), k), order))
        .collect();
    let mut differ: Vec<String> = held
        .iter()
        .filter(|(at, order)| guard.get(at) != Some(order))
        .map(|(((c, r, s), k), order)| {
            format!("class {c} seat {r}:{s} segment {k}: held by order {order}, no guard row of it")
        })
        .collect();
    differ.extend(guard.iter().filter(|(at, _)| !held.contains_key(at)).map(
        |(((c, r, s), k), order)| {
            format!("class {c} seat {r}:{s} segment {k}: guard row of order {order}, not live")
        },
    ));
    differ.truncate(20);
    audit.check("seat_segment guard = live journeys", differ);

    let segments: u32 = conn
        .exec_first(
            "SELECT COUNT(*) - 1 FROM event_station WHERE event_id = ?",
            (event,),
        )
        .await?
        .unwrap_or(0);
    let classes: Vec<(u64, i64, u32, u32)> = conn
        .exec(
            "SELECT id, total, seat_rows, seat_cols FROM ticket_category WHERE event_id = ?",
            (event,),
        )
        .await?;
    let keys =
        stampede_core::keys::Keys::new(&stampede_core::Settings::defaults().redis.key_prefix);
    let b = stampede_core::keys::Bucket::only(event);
    let mut redis = stack.redis().await?;
    let (mut beyond, mut apart) = (Vec::new(), Vec::new());
    for (c, total, rows, cols) in classes {
        let sold = held.keys().filter(|((class, ..), _)| *class == c).count() as i64;
        if total != i64::from(rows * cols * segments) || sold > total {
            beyond.push(format!(
                "class {c}: {sold} seat-segments sold of {total}; {rows} × {cols} seats, {segments} segments"
            ));
        }
        let stock: Option<i64> = redis::cmd("HGET")
            .arg(keys.stock(b))
            .arg(c)
            .query_async(&mut redis)
            .await?;
        if stock != Some(total - sold) {
            apart.push(format!(
                "class {c}: Redis stock {stock:?} + {sold} sold ≠ {total}"
            ));
        }
        let strings: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(keys.segments(b, c))
            .query_async(&mut redis)
            .await?;
        if strings.len() != (rows * cols) as usize {
            apart.push(format!(
                "class {c}: {} seats in Redis, not {rows} × {cols}",
                strings.len()
            ));
        }
        for row in 1..=rows {
            for col in 1..=cols {
                // `1` on each segment a live order holds, `0` elsewhere.
                let want: String = (0..segments as u8)
                    .map(|k| char::from(b'0' + u8::from(held.contains_key(&((c, row, col), k)))))
                    .collect();
                let got = strings.get(&format!("{row}:{col}"));
                if got != Some(&want) {
                    apart.push(format!(
                        "class {c} seat {row}:{col}: Redis {got:?}, live orders {want}"
                    ));
                }
            }
        }
    }
    audit.check("seat-segments within seats × segments", beyond);
    apart.truncate(20);
    audit.check("Redis seats and stock = live journeys", apart);
    Ok(())
}
