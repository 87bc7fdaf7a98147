//! The order lifecycle (DESIGN.md "Timeout, cancel, pay"): an order's owner sees it and
//! may cancel it while UNPAID; the `order-timeout` consumer and the overdue sweep
//! (`timeout`) cancel orders left unpaid past their deadline; the provider's callback
//! pays it (`pay`). Cancelling is a conditional UPDATE (only from UNPAID) in MySQL, then
//! the units and seats go back in Redis by one script, once (`restock`).

pub mod pay;
pub mod restock;
pub mod timeout;

use crate::infra::mysql::CallTimeout;
use crate::infra::redis::Redis;
use anyhow::Context;
use chrono::NaiveDateTime;
use mysql_async::prelude::*;
use mysql_async::{Pool, TxOpts};
use serde::Serialize;

use crate::domain::{CategoryId, OrderNo, UserId};
use crate::keys::Bucket;
use crate::keys::Keys;
use crate::order_tables::{self, OrderStatus, shard_of_order};
use restock::GiveBack;

/// What the lifecycle changes: the order tables, and the event's keys in Redis.
#[derive(Clone)]
pub struct Lifecycle {
    pub mysql: Pool,
    pub redis: Redis,
    pub keys: Keys,
    /// `mysql.order_shards`.
    pub shards: u32,
    /// Bounds the sweeps' MySQL calls (the API's are bounded by the request timeout).
    pub call_timeout: CallTimeout,
}

/// An order as its owner sees it.
#[derive(Debug, Clone, Serialize)]
pub struct OrderView {
    /// A decimal string: order numbers do not fit a JSON double.
    pub order_no: String,
    pub user_id: u64,
    pub event_id: u64,
    pub category_id: u64,
    pub quantity: u32,
    pub amount_cents: u64,
    pub status: OrderStatus,
    pub pay_deadline: chrono::DateTime<chrono::Utc>,
    /// Seats as `"row:col"` (a train's `"carriage:seat"`); empty for unseated tickets.
    pub seats: Vec<String>,
    /// A train ticket's journey: station indexes along the route.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journey: Option<crate::trains::Journey>,
    /// The event's Redis bucket count (its keys' layout), not shown.
    #[serde(skip)]
    pub buckets: u16,
}

impl OrderView {
    /// What giving its units back needs to know of it.
    fn give_back(&self, order_no: OrderNo) -> GiveBack<'_> {
        GiveBack {
            order_no,
            user_id: UserId(self.user_id),
            bucket: self.bucket(),
            category_id: CategoryId(self.category_id),
            quantity: self.quantity,
            seats: &self.seats,
            journey: self.journey,
        }
    }

    /// What it holds of the category's stock: its quantity, or a train ticket's
    /// seat-segments.
    pub fn units(&self) -> u32 {
        crate::trains::units(self.quantity, self.journey)
    }
}

impl OrderView {
    /// The buyer's Redis bucket of the order's event.
    pub fn bucket(&self) -> Bucket {
        Bucket::of_buyer(self.event_id, self.buckets, UserId(self.user_id))
    }
}

type OrderRow = (u64, u64, u64, u32, u64, String, NaiveDateTime, u16);

/// Reads the order (with `FOR UPDATE` when `lock`) and its seats.
pub(crate) async fn load_in<Q: Queryable>(
    conn: &mut Q,
    shards: u32,
    order_no: OrderNo,
    lock: bool,
) -> anyhow::Result<Option<OrderView>> {
    let n = shard_of_order(order_no, shards);
    let row: Option<OrderRow> = conn
        .exec_first(
            format!(
                "SELECT o.user_id, o.event_id, o.category_id, o.quantity, o.amount_cents, o.status, o.pay_deadline, \
                 COALESCE((SELECT e.buckets FROM event e WHERE e.id = o.event_id), 1) \
                 FROM {} o WHERE o.order_no = ?{}",
                order_tables::orders(n),
                if lock { " FOR UPDATE" } else { "" }
            ),
            (order_no,),
        )
        .await?;
    let Some((user_id, event_id, category_id, quantity, amount_cents, status, deadline, buckets)) =
        row
    else {
        return Ok(None);
    };
    let seats: Vec<(u32, u32, Option<u16>, Option<u16>)> = conn
        .exec(
            format!(
                "SELECT row_no, col_no, from_station, to_station FROM {} \
                 WHERE order_no = ? AND row_no IS NOT NULL ORDER BY row_no, col_no",
                order_tables::items(n)
            ),
            (order_no,),
        )
        .await?;
    let journey = seats
        .first()
        .and_then(|&(_, _, from, to)| crate::trains::Journey::from_columns(from, to));
    Ok(Some(OrderView {
        order_no: order_no.to_string(),
        user_id,
        event_id,
        category_id,
        quantity,
        amount_cents,
        status: OrderStatus::parse(&status)?,
        pay_deadline: deadline.and_utc(),
        seats: seats
            .into_iter()
            .map(|(r, c, _, _)| format!("{r}:{c}"))
            .collect(),
        journey,
        buckets,
    }))
}

/// Whether `order_no` may be an order of `owner`'s: an order number carries its buyer's
/// gene (`ids`), so one without it is nobody's to look up for this caller.
fn could_be_of(order_no: OrderNo, owner: UserId) -> bool {
    crate::ids::gene(order_no.0) == crate::ids::gene(owner.0)
}

/// What a cancellation did.
#[derive(Debug)]
pub enum Cancelled {
    /// Cancelled now; its units are back in Redis unless `restocked` is false (then the
    /// reconciler brings them back; Redis shows less, never more).
    Now { order: OrderView, restocked: bool },
    /// Not UNPAID (PAID or CANCELLED already): nothing changed.
    NotUnpaid(OrderView),
    /// Not yet past its deadline (timeout cancellations only).
    NotDue(OrderView),
    /// No such order of this owner.
    NotFound,
}

/// Who cancels, which decides what may be cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Canceller {
    /// The buyer: only their own order, at any time while UNPAID.
    Owner(UserId),
    /// The payment deadline: any order, only once past its deadline.
    Deadline,
}

/// An order's stock_log batch and, if the batch has a row for the order's category, its
/// `synced`, `units` and `orders` (NULL from the LEFT JOIN when it has none).
type OrderBatch = (String, Option<u8>, Option<u64>, Option<u64>);

impl Lifecycle {
    /// The order, if `owner` is its buyer.
    pub async fn view(
        &self,
        order_no: OrderNo,
        owner: UserId,
    ) -> anyhow::Result<Option<OrderView>> {
        if !could_be_of(order_no, owner) {
            return Ok(None);
        }
        let mut conn = crate::infra::mysql::checkout(&self.mysql)
            .await
            .context("Failed to get a MySQL connection")?;
        Ok(load_in(&mut *conn, self.shards, order_no, false)
            .await?
            .filter(|o| o.user_id == owner.0))
    }

    /// Cancels an UNPAID order: in MySQL (order, remain or its batch's unsynced units,
    /// seats) in one transaction, then in Redis (units, seats, the buyer's limit), once.
    pub async fn cancel(&self, order_no: OrderNo, by: Canceller) -> anyhow::Result<Cancelled> {
        if matches!(by, Canceller::Owner(owner) if !could_be_of(order_no, owner)) {
            // Not the caller's gene: nobody's to cancel for them, no connection taken.
            return Ok(Cancelled::NotFound);
        }
        let mut conn = crate::infra::mysql::checkout(&self.mysql)
            .await
            .context("Failed to get a MySQL connection")?;
        if let Canceller::Owner(owner) = by {
            // Nothing is locked before the order is known to be the caller's: a locking
            // read of another buyer's order held their row (their payment waited), and
            // of a number with no order the index gap where it would go — past every
            // order, the gap each new order is inserted into, so a stream of cancels of
            // made-up numbers held order creation back (review). A number that cannot
            // be the caller's (not their gene) cost no query at all (above).
            let buyer: Option<u64> = conn
                .exec_first(
                    format!(
                        "SELECT user_id FROM {} WHERE order_no = ?",
                        order_tables::orders(shard_of_order(order_no, self.shards))
                    ),
                    (order_no,),
                )
                .await?;
            if buyer != Some(owner.0) {
                return Ok(Cancelled::NotFound);
            }
        }
        let mut tx = conn.start_transaction(TxOpts::default()).await?;
        let Some(mut order) = load_in(&mut tx, self.shards, order_no, true).await? else {
            return Ok(Cancelled::NotFound);
        };
        if matches!(by, Canceller::Owner(u) if u.0 != order.user_id) {
            return Ok(Cancelled::NotFound);
        }
        if order.status != OrderStatus::Unpaid {
            return Ok(Cancelled::NotUnpaid(order));
        }
        if by == Canceller::Deadline && order.pay_deadline > chrono::Utc::now() {
            return Ok(Cancelled::NotDue(order));
        }
        tx.exec_drop(
            format!(
                "UPDATE {} SET status = ?, cancelled_at = UTC_TIMESTAMP(3) WHERE order_no = ? AND status = ?",
                order_tables::orders(shard_of_order(order_no, self.shards))
            ),
            (OrderStatus::Cancelled, order_no, OrderStatus::Unpaid),
        )
        .await?;
        // Stock sync subtracted this order from remain, or is yet to: add it back, or take
        // it out of what its batch will subtract. One read locks the order's stock_log row
        // and its batch's row, before the category's, as stock sync locks them.
        let found: Option<OrderBatch> = tx
            .exec_first(
                "SELECT l.batch_id, b.synced, b.units, b.orders FROM stock_log l \
                 LEFT JOIN stock_batch b ON b.batch_id = l.batch_id AND b.category_id = ? \
                 WHERE l.order_no = ? FOR UPDATE",
                (order.category_id, order_no),
            )
            .await?;
        let batch = found.as_ref().map(|(batch, ..)| batch.clone());
        let row = found.and_then(|(_, synced, units, orders)| Some((synced?, units?, orders?)));
        let units = u64::from(order.units());
        match (row, &batch) {
            (Some((1, _, _)), _) => {
                tx.exec_drop(
                    "UPDATE ticket_category SET remain = remain + ? WHERE id = ?",
                    (units, order.category_id),
                )
                .await?;
            }
            (Some((_, left, orders)), Some(batch)) if left >= units && orders >= 1 => {
                // The last order out: nothing is left to subtract, the batch is synced.
                let last = orders == 1 && left == units;
                tx.exec_drop(
                    "UPDATE stock_batch SET units = ?, orders = ?, synced = ?, \
                     synced_at = IF(?, UTC_TIMESTAMP(3), NULL) WHERE batch_id = ? AND category_id = ?",
                    (
                        left - units,
                        orders - 1,
                        last,
                        last,
                        batch,
                        order.category_id,
                    ),
                )
                .await?;
            }
            (row, _) => tracing::error!(
                %order_no,
                ?batch,
                ?row,
                "ALARM: the order's batch does not hold its units for stock sync; \
                 cancelling with remain left as it is (the reconciler reports the gap)"
            ),
        }
        // The guards' counters: the units and the buyer's share are free again.
        tx.exec_drop(
            "UPDATE ticket_category SET committed = committed - ? WHERE id = ?",
            (order.units(), order.category_id),
        )
        .await?;
        tx.exec_drop(
            "UPDATE user_hold SET units = units - ? WHERE event_id = ? AND user_id = ?",
            (order.quantity, order.event_id, order.user_id),
        )
        .await?;
        tx.exec_drop(
            "UPDATE stock_log SET status = 'CANCELLED' WHERE order_no = ?",
            (order_no,),
        )
        .await?;
        tx.exec_drop(
            "UPDATE seat SET status = 'FREE', order_no = NULL WHERE order_no = ?",
            (order_no,),
        )
        .await?;
        if order.journey.is_some() {
            tx.exec_drop("DELETE FROM seat_segment WHERE order_no = ?", (order_no,))
                .await?;
        }
        tx.commit()
            .await
            .context("Failed to commit the cancellation")?;
        order.status = OrderStatus::Cancelled;
        let restocked = match restock::restock(
            &mut self.redis.clone(),
            &self.keys,
            order.give_back(order_no),
        )
        .await
        {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(
                    %order_no,
                    error = format!("{e:#}"),
                    "cancelled, but its units are not back in Redis yet"
                );
                false
            }
        };
        tracing::info!(%order_no, user_id = order.user_id, "order cancelled");
        Ok(Cancelled::Now { order, restocked })
    }
}
