//! The order lifecycle (DESIGN.md "Timeout, cancel, pay"): an order's owner sees it and
//! may cancel it while UNPAID; the `order-timeout` consumer and a sweeper cancel orders
//! left unpaid past their deadline. Cancelling is a conditional UPDATE (only from
//! UNPAID) in MySQL, then the units and seats go back in Redis by one script, once.

pub mod pay;

use std::sync::LazyLock;

use anyhow::Context;
use chrono::NaiveDateTime;
use mysql_async::prelude::*;
use mysql_async::{Pool, TxOpts};
use redis::aio::ConnectionManager;
use serde::Serialize;

use crate::ids::gene;
use crate::keys::Keys;

static RESTOCK: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../../lua/redis/restock.lua")));

/// `restock.lua`'s answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restocked {
    Now = 1,
    Before = 0,
}

impl Restocked {
    fn from_code(code: i64) -> anyhow::Result<Restocked> {
        match code {
            1 => Ok(Restocked::Now),
            0 => Ok(Restocked::Before),
            other => anyhow::bail!("restock.lua returned unknown code {other}"),
        }
    }
}

/// An order as its owner sees it.
#[derive(Debug, Clone, Serialize)]
pub struct OrderView {
    pub order_no: String,
    pub user_id: u64,
    pub event_id: u64,
    pub category_id: u64,
    pub quantity: u32,
    pub amount_cents: u64,
    pub status: String,
    pub pay_deadline: chrono::DateTime<chrono::Utc>,
    /// Seats as `"row:col"`; empty for unseated tickets.
    pub seats: Vec<String>,
}

fn shard(order_no: u64, shards: u32) -> u64 {
    gene(order_no) % u64::from(shards)
}

type OrderRow = (u64, u64, u64, u32, u64, String, NaiveDateTime);

async fn load_in<Q: Queryable>(
    conn: &mut Q,
    shards: u32,
    order_no: u64,
    lock: bool,
) -> anyhow::Result<Option<OrderView>> {
    let n = shard(order_no, shards);
    let row: Option<OrderRow> = conn
        .exec_first(
            format!(
                "SELECT user_id, event_id, category_id, quantity, amount_cents, status, pay_deadline \
                 FROM `order_{n}` WHERE order_no = ?{}",
                if lock { " FOR UPDATE" } else { "" }
            ),
            (order_no,),
        )
        .await?;
    let Some((user_id, event_id, category_id, quantity, amount_cents, status, deadline)) = row
    else {
        return Ok(None);
    };
    let seats: Vec<(u32, u32)> = conn
        .exec(
            format!("SELECT row_no, col_no FROM `order_item_{n}` WHERE order_no = ? AND row_no IS NOT NULL ORDER BY row_no, col_no"),
            (order_no,),
        )
        .await?;
    Ok(Some(OrderView {
        order_no: order_no.to_string(),
        user_id,
        event_id,
        category_id,
        quantity,
        amount_cents,
        status,
        pay_deadline: deadline.and_utc(),
        seats: seats.into_iter().map(|(r, c)| format!("{r}:{c}")).collect(),
    }))
}

/// The order, if `owner` (when given) is its buyer.
pub async fn view(
    pool: &Pool,
    shards: u32,
    order_no: u64,
    owner: Option<u64>,
) -> anyhow::Result<Option<OrderView>> {
    let mut conn = pool
        .get_conn()
        .await
        .context("Failed to get a MySQL connection")?;
    Ok(load_in(&mut conn, shards, order_no, false)
        .await?
        .filter(|o| owner.is_none_or(|u| u == o.user_id)))
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

/// Cancels an UNPAID order: in MySQL (order, remain or its unsynced stock_log row, seats)
/// in one transaction, then in Redis (units, seats, the buyer's limit), once.
/// `owner`: only this buyer's order; `only_if_due`: only past its payment deadline.
pub async fn cancel(
    pool: &Pool,
    redis: &mut ConnectionManager,
    keys: &Keys,
    shards: u32,
    order_no: u64,
    owner: Option<u64>,
    only_if_due: bool,
) -> anyhow::Result<Cancelled> {
    let mut conn = pool
        .get_conn()
        .await
        .context("Failed to get a MySQL connection")?;
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    let Some(mut order) = load_in(&mut tx, shards, order_no, true).await? else {
        return Ok(Cancelled::NotFound);
    };
    if owner.is_some_and(|u| u != order.user_id) {
        return Ok(Cancelled::NotFound);
    }
    if order.status != "UNPAID" {
        return Ok(Cancelled::NotUnpaid(order));
    }
    if only_if_due && order.pay_deadline > chrono::Utc::now() {
        return Ok(Cancelled::NotDue(order));
    }
    let n = shard(order_no, shards);
    tx.exec_drop(
        format!("UPDATE `order_{n}` SET status = 'CANCELLED', cancelled_at = UTC_TIMESTAMP(3) WHERE order_no = ? AND status = 'UNPAID'"),
        (order_no,),
    )
    .await?;
    // Stock sync subtracted this order from remain, or is yet to: add it back, or make
    // sure it never subtracts it.
    let synced: Option<u8> = tx
        .exec_first(
            "SELECT synced FROM stock_log WHERE order_no = ? FOR UPDATE",
            (order_no,),
        )
        .await?;
    if synced == Some(1) {
        tx.exec_drop(
            "UPDATE ticket_category SET remain = remain + ? WHERE id = ?",
            (order.quantity, order.category_id),
        )
        .await?;
    }
    tx.exec_drop(
        "UPDATE stock_log SET status = 'CANCELLED', synced = 1, synced_at = COALESCE(synced_at, UTC_TIMESTAMP(3)) \
         WHERE order_no = ?",
        (order_no,),
    )
    .await?;
    tx.exec_drop(
        "UPDATE seat SET status = 'FREE', order_no = NULL WHERE order_no = ?",
        (order_no,),
    )
    .await?;
    tx.commit()
        .await
        .context("Failed to commit the cancellation")?;
    order.status = "CANCELLED".into();
    let give_back = GiveBack {
        order_no,
        user_id: order.user_id,
        event_id: order.event_id,
        category_id: order.category_id,
        quantity: order.quantity,
        seats: &order.seats,
    };
    let restocked = match restock(redis, keys, give_back).await {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(
                order_no,
                error = format!("{e:#}"),
                "cancelled, but its units are not back in Redis yet"
            );
            false
        }
    };
    tracing::info!(order_no, user_id = order.user_id, "order cancelled");
    Ok(Cancelled::Now { order, restocked })
}

/// What giving a cancelled order's units back needs to know of it.
pub struct GiveBack<'a> {
    pub order_no: u64,
    pub user_id: u64,
    pub event_id: u64,
    pub category_id: u64,
    pub quantity: u32,
    /// `"row:col"`, empty for unseated tickets.
    pub seats: &'a [String],
}

/// Gives a cancelled order's units and seats back in Redis, once (restock.lua).
pub async fn restock(
    redis: &mut ConnectionManager,
    keys: &Keys,
    o: GiveBack<'_>,
) -> anyhow::Result<Restocked> {
    let e = o.event_id;
    let code: i64 = RESTOCK
        .key(keys.restocked(e))
        .key(keys.stock(e))
        .key(keys.sold_out(e))
        .key(keys.held(e))
        .key(keys.purchase_status(e))
        .key(keys.seats(e, o.category_id))
        .key(keys.row_free(e, o.category_id))
        .arg(o.order_no)
        .arg(o.user_id)
        .arg(o.category_id)
        .arg(o.quantity)
        .arg(o.seats.join(","))
        .invoke_async(redis)
        .await?;
    Restocked::from_code(code)
}

/// The `order-timeout` consumer's work: cancel the batch's orders still unpaid at their
/// deadline. A message a little early waits for the deadline (delays are precise to
/// about half a second).
pub async fn expire_batch(
    pool: &Pool,
    redis: &mut ConnectionManager,
    keys: &Keys,
    shards: u32,
    batch_id: &str,
) -> anyhow::Result<usize> {
    let orders: Vec<u64> = pool
        .get_conn()
        .await?
        .exec(
            "SELECT order_no FROM stock_log WHERE batch_id = ? AND status = 'COMMITTED'",
            (batch_id,),
        )
        .await?;
    let mut cancelled = 0;
    for order_no in orders {
        for _ in 0..10 {
            match cancel(pool, redis, keys, shards, order_no, None, true).await? {
                Cancelled::NotDue(o) => {
                    let wait = (o.pay_deadline - chrono::Utc::now())
                        .to_std()
                        .unwrap_or_default();
                    tokio::time::sleep(wait.min(std::time::Duration::from_secs(2))).await;
                }
                Cancelled::Now { .. } => {
                    cancelled += 1;
                    break;
                }
                Cancelled::NotUnpaid(_) | Cancelled::NotFound => break,
            }
        }
    }
    Ok(cancelled)
}

/// The sweeper's: UNPAID orders past their deadline by `overdue_s` (their timeout
/// message was lost), over every shard.
pub async fn overdue(
    pool: &Pool,
    shards: u32,
    overdue_s: u64,
    limit: u32,
) -> anyhow::Result<Vec<u64>> {
    let mut conn = pool.get_conn().await?;
    let mut all = Vec::new();
    for n in 0..shards {
        let found: Vec<u64> = conn
            .exec(
                format!(
                    "SELECT order_no FROM `order_{n}` WHERE status = 'UNPAID' \
                     AND pay_deadline < UTC_TIMESTAMP(3) - INTERVAL ? SECOND LIMIT ?"
                ),
                (overdue_s, limit),
            )
            .await?;
        all.extend(found);
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restock_codes_map_one_to_one() {
        assert_eq!(Restocked::from_code(1).unwrap(), Restocked::Now);
        assert_eq!(Restocked::from_code(0).unwrap(), Restocked::Before);
        assert!(Restocked::from_code(2).is_err());
    }
}
