//! Healing an event whose books do not balance: cancelled orders given back, then Redis
//! stock lowered (or raised, once the sale is not running) and MySQL's remain corrected,
//! each only when two measurements agree. Runs under the event's preload lock.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use anyhow::Context;
use chrono::Utc;
use mysql_async::prelude::*;

use super::{Balance, Reconciler};
use crate::buckets::Mover;
use crate::catalog::EventRecord;
use crate::domain::{CategoryId, EventId, OrderNo, UserId};
use crate::keys::Bucket;
use crate::lifecycle::restock::{GiveBack, Restocked, restock};
use crate::order_tables::{self, OrderStatus};

static REPAIR: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(crate::with_lua_lib!("seat_repair.lua")));

/// `seat_repair.lua`'s answer: the seats it changed and the class's stock after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repaired(pub u64, pub i64);

static ADJUST: LazyLock<redis::Script> = LazyLock::new(|| {
    crate::infra::redis::script(include_str!("../../../lua/redis/adjust_stock.lua"))
});

/// `adjust_stock.lua`'s answer: the category's stock after the change, or -1 when it was
/// no longer the stock measured (nothing changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adjusted(pub i64);

impl Reconciler {
    /// Returns the books as last measured when nothing was changed after measuring
    /// them (the caller needs no other measurement), None after a heal.
    pub(super) async fn heal_locked(
        &self,
        event: &EventRecord,
        actions: &mut Vec<String>,
    ) -> anyhow::Result<Option<Balance>> {
        let (orders, units) = self.give_back_cancelled(event.id, event.buckets).await?;
        if orders > 0 {
            actions.push(format!(
                "gave back {units} units of {orders} cancelled orders Redis had not got back"
            ));
        }
        let first = self.measure(event).await?;
        if first.settled() || first.queued_reservations > 0 {
            return Ok(Some(first));
        }
        tokio::time::sleep(self.confirm).await;
        let second = self.measure(event).await?;
        if second != first {
            // The sale moved: not sure of anything; the next pass looks again.
            return Ok(Some(second));
        }
        let running = event.on_sale_at(Utc::now());
        if !running && second.categories.iter().any(|c| c.gap.unwrap_or(0) > 0) {
            // A cancellation committed after the give-back above read the cancelled
            // orders, its own restock lost (Redis blipped, its core stopped), shows as
            // this gap: raising the stock by it, and the next pass giving the order back
            // as well, would count its units twice (review). Give back again first; if
            // that finds any, the gap was theirs: measure anew at the next pass.
            let (orders, units) = self.give_back_cancelled(event.id, event.buckets).await?;
            if orders > 0 {
                actions.push(format!(
                    "gave back {units} units of {orders} cancelled orders Redis had not got back"
                ));
                return Ok(None);
            }
        }
        let mut redis = self.redis.clone();
        for c in &second.categories {
            let gap = c.gap.unwrap_or(0);
            // Stock already at 0 cannot go lower: an oversold category, alarmed once by
            // the pass, not "healed" again at every one.
            let lower = gap < 0 && c.redis_available.is_some_and(|a| a > 0);
            let raise = gap > 0 && !running;
            // A train's seats off their orders: the seats are mended (and the stock
            // with them); a counter off seats that are right is adjusted like any other.
            if c.segments.iter().flatten().any(|s| s.gap != 0) {
                self.repair_seats(event, c.category_id, running, actions)
                    .await?;
            } else if lower || raise {
                let Some(mut measured) = c.redis_available else {
                    continue;
                };
                let mut stock = self.keys.stock(Bucket::only(event.id));
                if event.buckets > 1 {
                    // Every unit of the category into the pool, which is then adjusted
                    // (conditional on what it holds, as for one bucket).
                    let mover = Mover {
                        redis: redis.clone(),
                        keys: self.keys.clone(),
                        replicas: self.replicas.clone(),
                    };
                    let category = CategoryId(c.category_id);
                    let Some(pool) = mover
                        .drain_to_pool(EventId(event.id), event.buckets, category)
                        .await?
                    else {
                        continue; // Buyers are draining it: the next pass looks again.
                    };
                    // The gap was measured against every place's units together; the
                    // drained pool must hold exactly that, or something moved since (a
                    // late restock, another core's heal, a purchase): adjusting the pool
                    // by the old gap would count that change twice (review). The next
                    // pass measures again.
                    if pool != measured {
                        continue;
                    }
                    (stock, measured) = (self.keys.pool(event.id), pool);
                }
                let Adjusted(left) = ADJUST
                    .key(stock)
                    .key(self.keys.sold_out(event.id))
                    .arg(c.category_id)
                    .arg(gap)
                    .arg(measured)
                    .invoke_async(&mut redis)
                    .await
                    .map(Adjusted)
                    .context("Failed to adjust the stock")?;
                if left < 0 {
                    continue; // It moved since the measurement: the next pass looks again.
                }
                actions.push(format!(
                    "category {}: Redis stock {} by {} to {left}",
                    c.category_id,
                    if lower { "lowered" } else { "raised" },
                    gap.abs()
                ));
            } else if gap > 0 {
                actions.push(format!(
                    "category {}: Redis offers {} units fewer than it could; left until the sale is not running",
                    c.category_id, gap
                ));
            }
            if c.remain_gap != 0 && c.unsynced == 0 {
                // Conditional on the remain measured, so a concurrent sync makes it a no-op.
                let mut conn = crate::infra::mysql::checkout(&self.mysql).await?;
                conn.exec_drop(
                    "UPDATE ticket_category SET remain = remain - ? WHERE id = ? AND remain = ?",
                    (c.remain_gap, c.category_id, c.db_remain),
                )
                .await?;
                if conn.affected_rows() == 1 {
                    actions.push(format!(
                        "category {}: MySQL remain corrected by {} to {}",
                        c.category_id,
                        -c.remain_gap,
                        c.db_remain - c.remain_gap
                    ));
                }
            }
        }
        Ok(None)
    }

    /// A train class whose seats in Redis are not its live orders' (docs/trains.md):
    /// each seat's string set to the segments MySQL's `seat_segment` rows hold, only
    /// while it is the string read here, the class's stock moved with it
    /// (`seat_repair.lua`). Segments taken in Redis that no order holds are freed only
    /// once the sale is not running (as stock is raised only then); segments an order
    /// holds that Redis offers are taken back at once. Redis is read before MySQL and
    /// only with no reservation queued, so an order committed in between was queued.
    async fn repair_seats(
        &self,
        event: &EventRecord,
        class: u64,
        running: bool,
        actions: &mut Vec<String>,
    ) -> anyhow::Result<()> {
        let b = Bucket::only(event.id);
        let key = self.keys.segments(b, class);
        let versions = self.keys.segment_versions(event.id);
        let mut redis = self.redis.clone();
        type Read = (HashMap<String, String>, u64, Option<u64>);
        let (seats, queued, version): Read = redis::pipe()
            .atomic()
            .hgetall(&key)
            .xlen(self.keys.order_stream(b))
            .hget(&versions, class)
            .query_async(&mut redis)
            .await?;
        if queued > 0 {
            return Ok(());
        }
        let mut conn = crate::infra::mysql::checkout(&self.mysql).await?;
        let held: Vec<(u32, u32, usize)> = conn
            .exec(
                "SELECT row_no, col_no, segment FROM seat_segment WHERE category_id = ?",
                (class,),
            )
            .await?;
        // Every seat of the grid as it should be: a seat missing from Redis, or with a
        // string of another length, is written whole.
        let length = event.segments();
        let Some(grid) = event
            .categories
            .iter()
            .find(|c| c.id == class)
            .and_then(|c| c.seats)
        else {
            return Ok(());
        };
        let mut wanted: HashMap<String, Vec<u8>> = HashMap::new();
        for r in 1..=grid.rows {
            for c in 1..=grid.cols {
                let seat = format!("{r}:{c}");
                // What Redis may keep: while the sale runs, nothing is freed.
                let keep = match seats.get(&seat) {
                    Some(now) if running && now.len() == length => now.as_bytes().to_vec(),
                    _ => vec![b'0'; length],
                };
                wanted.insert(seat, keep);
            }
        }
        for (row, col, k) in held {
            if let Some(s) = wanted
                .get_mut(&format!("{row}:{col}"))
                .and_then(|w| w.get_mut(k))
            {
                *s = b'1';
            }
        }
        let mut call = REPAIR.prepare_invoke();
        call.key(&key)
            .key(self.keys.stock(b))
            .key(self.keys.sold_out(event.id))
            .key(&versions)
            .arg(class)
            .arg(version.unwrap_or(0));
        let mut fixes = 0;
        for (seat, want) in &wanted {
            let now = seats.get(seat).map_or("", String::as_str);
            if want.as_slice() != now.as_bytes() {
                call.arg(seat)
                    .arg(now)
                    .arg(String::from_utf8_lossy(want).as_ref());
                fixes += 1;
            }
        }
        if fixes == 0 {
            actions.push(format!(
                "train class {class}: the books per segment are off but every seat matches its live orders; left for a rebuild"
            ));
            return Ok(());
        }
        let Repaired(changed, left) = call
            .invoke_async(&mut redis)
            .await
            .map(|(changed, left)| Repaired(changed, left))
            .context("Failed to repair the train's seats")?;
        if changed > 0 {
            actions.push(format!(
                "train class {class}: {changed} seats set to their live orders' segments, stock now {left}"
            ));
        }
        Ok(())
    }

    /// Cancelled orders whose units are not back in Redis (the restock after the
    /// cancellation failed): gives them back, once each. Returns (orders, units).
    async fn give_back_cancelled(
        &self,
        event_id: u64,
        buckets: u16,
    ) -> anyhow::Result<(usize, i64)> {
        let mut conn = crate::infra::mysql::checkout(&self.mysql).await?;
        let mut redis = self.redis.clone();
        let (mut orders, mut units) = (0, 0);
        let statuses = [
            event_id.into(),
            OrderStatus::Cancelled.into(),
            OrderStatus::RefundPending.into(),
        ];
        // The restocked sets only ever hold cancelled orders (restock.lua adds an order
        // once its cancellation committed; a rebuild adds those MySQL has), so when they
        // hold as many as MySQL has cancelled, none is missing: counted first (Redis
        // before MySQL, so a cancellation committing in between makes them differ), the
        // orders themselves are read only when the counts differ. Before, every pass read
        // every cancelled order of every listed event and asked Redis about each.
        let mut given_back: u64 = 0;
        for b in Bucket::all(event_id, buckets) {
            let n: u64 = redis::cmd("SCARD")
                .arg(self.keys.restocked(b))
                .query_async(&mut redis)
                .await?;
            given_back += n;
        }
        let counts: Vec<u64> = conn
            .exec(
                order_tables::over_shards(
                    self.shards,
                    "SELECT COUNT(*) FROM {orders} WHERE event_id = ? AND status IN (?, ?)",
                ),
                order_tables::per_shard(self.shards, &statuses),
            )
            .await?;
        if counts.iter().sum::<u64>() == given_back {
            return Ok((0, 0));
        }
        let cancelled: Vec<(u64, u64, u64, u32)> = conn
            .exec(
                order_tables::over_shards(
                    self.shards,
                    "SELECT order_no, user_id, category_id, quantity FROM {orders} \
                     WHERE event_id = ? AND status IN (?, ?)",
                ),
                order_tables::per_shard(self.shards, &statuses),
            )
            .await?;
        let bucket_of = |user: u64| Bucket::of_buyer(event_id, buckets, UserId(user));
        let mut missing: HashSet<u64> = HashSet::new();
        for b in Bucket::all(event_id, buckets) {
            let numbers: Vec<u64> = cancelled
                .iter()
                .filter(|o| bucket_of(o.1) == b)
                .map(|o| o.0)
                .collect();
            for chunk in numbers.chunks(10_000) {
                let found: Vec<bool> = redis::cmd("SMISMEMBER")
                    .arg(self.keys.restocked(b))
                    .arg(chunk)
                    .query_async(&mut redis)
                    .await?;
                missing.extend(chunk.iter().zip(found).filter(|(_, k)| !k).map(|(n, _)| *n));
            }
        }
        for (order_no, user_id, category_id, quantity) in cancelled {
            if !missing.contains(&order_no) {
                continue;
            }
            let order_no = OrderNo(order_no);
            let items: Vec<(u32, u32, Option<u16>, Option<u16>)> = conn
                .exec(
                    format!(
                        "SELECT row_no, col_no, from_station, to_station FROM {} \
                         WHERE order_no = ? AND row_no IS NOT NULL",
                        order_tables::items(order_tables::shard_of_order(order_no, self.shards))
                    ),
                    (order_no.0,),
                )
                .await?;
            let seats: Vec<String> = items
                .iter()
                .map(|(r, c, _, _)| format!("{r}:{c}"))
                .collect();
            let journey = items
                .first()
                .and_then(|&(_, _, from, to)| crate::trains::Journey::from_columns(from, to));
            let done = restock(
                &mut redis,
                &self.keys,
                GiveBack {
                    order_no,
                    user_id: UserId(user_id),
                    bucket: bucket_of(user_id),
                    category_id: CategoryId(category_id),
                    quantity,
                    seats: &seats,
                    journey,
                },
            )
            .await?;
            if done == Restocked::Now {
                orders += 1;
                units += i64::from(crate::trains::units(quantity, journey));
            }
        }
        Ok((orders, units))
    }
}
