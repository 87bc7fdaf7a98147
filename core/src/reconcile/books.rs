//! The books of an event: what each category's units are doing, in Redis and MySQL.

use std::collections::HashMap;

use mysql_async::Pool;
use mysql_async::prelude::*;
use serde::Serialize;

use crate::order_tables::{self, OrderStatus};

/// One category's books.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CategoryBalance {
    pub category_id: u64,
    pub name: String,
    pub total: i64,
    /// Units Redis still offers; null when the event's keys are not in Redis.
    pub redis_available: Option<i64>,
    /// Units in reservations waiting for the order workers; null when the backlog is
    /// longer than 10 000 reservations (too long to count on every poll).
    pub queued: Option<i64>,
    pub unpaid: i64,
    pub paid: i64,
    /// total − (Redis stock + queued + unpaid + paid): 0 once settled. Positive: units
    /// Redis no longer offers (undersell); negative: Redis offers too many. Null when
    /// `queued` is.
    pub gap: Option<i64>,
    pub db_remain: i64,
    /// Units of live orders stock sync has not yet subtracted from remain.
    pub unsynced: i64,
    /// remain − (total − unpaid − paid + unsynced): 0 whenever MySQL is consistent.
    pub remain_gap: i64,
    /// Units in live orders beyond the total (0 unless MySQL sold more than there was,
    /// which its guards refuse): no pass can heal it; it raises one alarm.
    pub oversold: i64,
    /// A train's class: its books per route segment (null for other categories, and
    /// while `queued` is).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segments: Option<Vec<SegmentBalance>>,
}

/// One route segment of a train's class: the seats Redis has taken on it against the
/// seats queued reservations and live orders (MySQL's `seat_segment` rows) hold there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentBalance {
    /// 0-based: segment k runs from station k to station k + 1.
    pub segment: usize,
    pub redis_taken: i64,
    pub queued: i64,
    pub in_orders: i64,
    /// redis_taken − (queued + in_orders): 0 once settled. Positive: seats Redis no
    /// longer offers on that segment though no order holds them; negative: Redis offers
    /// a seat an order holds there.
    pub gap: i64,
}

impl SegmentBalance {
    /// A class's segments from Redis's seats taken and queued per segment and the
    /// seat-segments live orders hold.
    pub fn of(
        taken: &[i64],
        queued: &[i64],
        in_orders: impl Fn(usize) -> i64,
    ) -> Vec<SegmentBalance> {
        taken
            .iter()
            .zip(queued)
            .enumerate()
            .map(|(k, (&t, &q))| {
                let o = in_orders(k);
                SegmentBalance {
                    segment: k,
                    redis_taken: t,
                    queued: q,
                    in_orders: o,
                    gap: t - (q + o),
                }
            })
            .collect()
    }
}

/// An event's books at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Balance {
    pub event_id: u64,
    /// The event's metadata and stock are in Redis.
    pub loaded: bool,
    /// Reservations in the event's stream.
    pub queued_reservations: u64,
    pub categories: Vec<CategoryBalance>,
    /// Why Redis's half of the books is missing, when Redis is down or too slow: the
    /// books are then MySQL's alone (Redis's figures and the gaps are null).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_unavailable: Option<String>,
    /// Units moving between the event's buckets or in pending seat locks (counted in
    /// Redis's figures); not shown.
    #[serde(skip)]
    pub in_flight: bool,
}

impl Balance {
    /// Every gap is 0.
    pub fn settled(&self) -> bool {
        self.categories.iter().all(|c| {
            c.gap == Some(0) && c.remain_gap == 0 && c.segments.iter().flatten().all(|s| s.gap == 0)
        })
    }
}

/// Units in orders per (category, status), over every order shard: a train ticket's
/// are its seat-segments (quantity × its journey's segments), as the stock counts them.
/// Only a train's orders are joined to their items for that: for any other event the
/// per-order lookup would cost MariaDB an index read per order on every pass of the
/// reconciler (several per event every interval, for as long as the sale is listed).
pub async fn units_by_status(
    pool: &Pool,
    shards: u32,
    event_id: u64,
    train: bool,
) -> anyhow::Result<HashMap<(u64, OrderStatus), i64>> {
    let units = if train {
        "o.quantity * COALESCE((SELECT MAX(i.to_station - i.from_station) FROM {items} i \
         WHERE i.order_no = o.order_no AND i.from_station IS NOT NULL), 1)"
    } else {
        "o.quantity"
    };
    // Summed in each shard first: the union then holds a few rows per shard, not one per
    // order (MariaDB materialises it), and each shard's sum reads the event's orders in
    // the order of its (event, category, status) index.
    let union = order_tables::over_shards(
        shards,
        &format!(
            "(SELECT o.category_id, o.status, SUM({units}) AS quantity FROM {{orders}} o \
             WHERE o.event_id = {event_id} GROUP BY o.category_id, o.status)"
        ),
    );
    let sql = format!(
        "SELECT category_id, status, CAST(SUM(quantity) AS SIGNED) FROM ({union}) o GROUP BY category_id, status"
    );
    let mut conn = crate::infra::mysql::checkout(pool).await?;
    let rows: Vec<(u64, String, i64)> = conn.query(sql).await?;
    rows.into_iter()
        .map(|(c, s, n)| Ok(((c, OrderStatus::parse(&s)?), n)))
        .collect()
}

/// A train's seat-segments held by live orders, per (class, segment): MySQL's
/// `seat_segment` rows (an order's are deleted when it is cancelled or expires), read by
/// the classes' ids, the table's primary key's first column.
pub async fn seat_segments_in_orders(
    pool: &Pool,
    classes: &[u64],
) -> anyhow::Result<HashMap<(u64, usize), i64>> {
    if classes.is_empty() {
        return Ok(HashMap::new());
    }
    let ids: Vec<String> = classes.iter().map(u64::to_string).collect();
    let mut conn = crate::infra::mysql::checkout(pool).await?;
    let rows: Vec<(u64, usize, i64)> = conn
        .query(format!(
            "SELECT category_id, segment, COUNT(*) FROM seat_segment \
             WHERE category_id IN ({}) GROUP BY category_id, segment",
            ids.join(",")
        ))
        .await?;
    Ok(rows.into_iter().map(|(c, k, n)| ((c, k), n)).collect())
}
