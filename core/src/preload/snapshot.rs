//! What an event's Redis keys must say, read from MySQL under a fence (seed 002's
//! "refresh once when empty", made exact). The event row's redis_epoch is incremented
//! under its exclusive lock: order creation holds the shared lock, so every batch in
//! flight has committed before the snapshot is read, and every later batch refuses the
//! reservations of the older generation. The snapshot therefore counts every unit that
//! is or ever will be in an order of the old generation.

use std::collections::HashMap;

use anyhow::Context;
use mysql_async::prelude::*;
use mysql_async::{Pool, TxOpts};

use crate::domain::EventId;
use crate::domain::OrderNo;
use crate::keys::SeatState;
use crate::order_tables::{self, OrderStatus};

/// The event's sale as MySQL knows it, fenced at `epoch`.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The new generation of the keys; reservations must carry at least this.
    pub epoch: u64,
    /// Per bucket, the largest admission number an order of the bucket has (≡ its
    /// index mod the bucket count; the index itself if none): where the bucket's
    /// `meta.seq` resumes, so Redis never hands one out twice.
    pub seq: Vec<u64>,
    /// Units in live (UNPAID or PAID) orders, per category.
    pub live_units: HashMap<u64, i64>,
    /// Units each user holds in live orders.
    pub held: HashMap<u64, i64>,
    /// Each user's latest purchase, as the status hash writes it (`CREATED:<no>`, …).
    pub status: HashMap<u64, String>,
    /// Orders whose units went back, with their buyers: the restocked sets, so no
    /// restock counts them twice.
    pub given_back: Vec<(u64, u64)>,
    /// Seats of live orders: (category, row, col) → `L:<no>` or `S:<no>`.
    pub seat_owner: HashMap<(u64, u32, u32), String>,
    /// A train's seats of live orders on their journeys: (class, carriage, seat,
    /// journey); their seat-segments are in `live_units`.
    pub journeys: Vec<(u64, u32, u32, crate::trains::Journey)>,
}

/// The purchase-status word an order of this status shows its buyer.
pub(crate) fn status_word(status: OrderStatus) -> &'static str {
    match status {
        OrderStatus::Unpaid => "CREATED",
        OrderStatus::Paid => "PAID",
        OrderStatus::Cancelled | OrderStatus::RefundPending => "CANCELLED",
    }
}

type OrderRow = (u64, u64, u64, i64, String);

/// The largest admission number among the event's orders (0 for none).
pub async fn max_seq<Q: Queryable>(conn: &mut Q, event_id: EventId) -> anyhow::Result<u64> {
    let seq: Option<Option<u64>> = conn
        .exec_first(
            "SELECT MAX(seq) FROM stock_log WHERE event_id = ?",
            (event_id,),
        )
        .await
        .context("Failed to read the event's largest admission number")?;
    Ok(seq.flatten().unwrap_or(0))
}

/// Per bucket of an event of `count`, the largest admission number of its orders: the
/// numbers of bucket k are ≡ k mod `count` (reserve.lua adds `count`); k for none.
pub async fn max_seq_per_bucket<Q: Queryable>(
    conn: &mut Q,
    event_id: EventId,
    count: u16,
) -> anyhow::Result<Vec<u64>> {
    let count = u64::from(count.max(1));
    let mut seq: Vec<u64> = (0..count).collect();
    if count == 1 {
        seq[0] = max_seq(conn, event_id).await?;
        return Ok(seq);
    }
    let rows: Vec<(u64, u64)> = conn
        .exec(
            // EXPIRED and REFUSED rows have no number.
            "SELECT seq MOD ?, MAX(seq) FROM stock_log \
             WHERE event_id = ? AND seq IS NOT NULL GROUP BY seq MOD ?",
            (count, event_id, count),
        )
        .await
        .context("Failed to read the buckets' largest admission numbers")?;
    for (bucket, max) in rows {
        if let Some(s) = seq.get_mut(bucket as usize) {
            *s = max;
        }
    }
    Ok(seq)
}

/// Increments the event's redis_epoch and reads its orders, in one transaction (for a
/// `train`, its tickets' journeys too).
pub async fn fence_and_read(
    pool: &Pool,
    shards: u32,
    event_id: EventId,
    buckets: u16,
    train: bool,
) -> anyhow::Result<Snapshot> {
    let mut conn = crate::infra::mysql::checkout(pool)
        .await
        .context("Failed to get a MySQL connection")?;
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    // Waits for the batches being created (they hold the shared lock) and holds off the
    // next ones until the snapshot is read.
    tx.exec_drop(
        "UPDATE event SET redis_epoch = redis_epoch + 1 WHERE id = ?",
        (event_id,),
    )
    .await
    .context("Failed to fence the event")?;
    let epoch: u64 = tx
        .exec_first("SELECT redis_epoch FROM event WHERE id = ?", (event_id,))
        .await?
        .with_context(|| format!("no event {event_id}"))?;
    let seq = max_seq_per_bucket(&mut tx, event_id, buckets).await?;
    let mut snap = Snapshot {
        epoch,
        seq,
        ..Snapshot::default()
    };
    let mut latest: HashMap<u64, u64> = HashMap::new();
    let orders: Vec<OrderRow> = tx
        .exec(
            order_tables::over_shards(
                shards,
                "SELECT order_no, user_id, category_id, CAST(quantity AS SIGNED), status \
                 FROM {orders} WHERE event_id = ?",
            ),
            order_tables::per_shard(shards, &[event_id.into()]),
        )
        .await
        .context("Failed to read the event's orders")?;
    for (order_no, user, category, quantity, status) in orders {
        let status = OrderStatus::parse(&status)?;
        if status.is_live() {
            // A train ticket's units are its seat-segments, counted from its items below.
            if !train {
                *snap.live_units.entry(category).or_default() += quantity;
            }
            *snap.held.entry(user).or_default() += quantity;
        } else {
            snap.given_back.push((order_no, user));
        }
        if latest.get(&user).is_none_or(|&l| order_no > l) {
            latest.insert(user, order_no);
            snap.status
                .insert(user, format!("{}:{order_no}", status_word(status)));
        }
    }
    type SeatRow = (u64, u64, u32, u32, String, Option<u16>, Option<u16>);
    let seats: Vec<SeatRow> = tx
        .exec(
            order_tables::over_shards(
                shards,
                &format!(
                    "SELECT i.order_no, i.category_id, i.row_no, i.col_no, o.status, \
                     i.from_station, i.to_station \
                     FROM {{items}} i JOIN {{orders}} o ON o.order_no = i.order_no \
                     WHERE o.event_id = ? AND o.status IN {} AND i.row_no IS NOT NULL",
                    OrderStatus::LIVE_SQL
                ),
            ),
            order_tables::per_shard(shards, &[event_id.into()]),
        )
        .await
        .context("Failed to read the seats of live orders")?;
    for (order_no, category, row, col, status, from, to) in seats {
        if let (Some(from), Some(to)) = (from, to) {
            let journey = crate::trains::Journey { from, to };
            *snap.live_units.entry(category).or_default() += i64::from(journey.span());
            snap.journeys.push((category, row, col, journey));
            continue;
        }
        let state = if OrderStatus::parse(&status)? == OrderStatus::Paid {
            SeatState::Sold(OrderNo(order_no))
        } else {
            SeatState::Locked(OrderNo(order_no))
        };
        snap.seat_owner.insert((category, row, col), state.encode());
    }
    tx.commit().await.context("Failed to commit the fence")?;
    Ok(snap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_order_status_shows_its_buyer_a_purchase_status() {
        assert_eq!(status_word(OrderStatus::Unpaid), "CREATED");
        assert_eq!(status_word(OrderStatus::Paid), "PAID");
        assert_eq!(status_word(OrderStatus::Cancelled), "CANCELLED");
        assert_eq!(status_word(OrderStatus::RefundPending), "CANCELLED");
    }
}
