//! Stock sync (DESIGN.md "Stock sync"): a delivered `stock-sync` message names a batch;
//! its unsynced stock_log rows are aggregated per ticket category into one UPDATE each,
//! its seats are marked LOCKED, and the rows are marked synced, in one transaction, so
//! a redelivered message changes nothing. stock_log is also the outbox: the sweeper
//! (`outbox`) re-publishes batches whose rows stay unsynced (their message was lost, or
//! the broker was down when they were created).

pub mod outbox;

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use mysql_async::prelude::*;
use mysql_async::{Pool, TxOpts};

use crate::messaging::{BatchMessage, Names, Subscription};
use crate::order_tables::{self, shard_of};

/// What one application of a batch changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Synced {
    pub orders: usize,
    pub units: i64,
}

/// The `stock-sync` consumer: each delivered batch is applied once.
pub fn consumer(mysql: Pool, shards: u32, names: &Names) -> Subscription {
    Subscription {
        topic: names.stock_sync.clone(),
        group: names.sync_group.clone(),
        batch_max: 32,
        what: "stock sync",
        apply: Arc::new(move |message: BatchMessage| {
            let pool = mysql.clone();
            Box::pin(async move {
                let synced = apply(&pool, shards, &message.batch_id).await?;
                tracing::debug!(batch = message.batch_id, ?synced, "stock synced");
                Ok(())
            })
        }),
    }
}

/// Applies the batch's unsynced stock_log rows to ticket_category and seat.
pub async fn apply(pool: &Pool, shards: u32, batch_id: &str) -> anyhow::Result<Synced> {
    let mut conn = pool
        .get_conn()
        .await
        .context("Failed to get a MySQL connection")?;
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    let rows: Vec<(u64, u64, i64)> = tx
        .exec(
            "SELECT order_no, category_id, CAST(quantity AS SIGNED) FROM stock_log \
             WHERE batch_id = ? AND synced = 0 FOR UPDATE",
            (batch_id,),
        )
        .await
        .context("Failed to read the batch's stock_log rows")?;
    if rows.is_empty() {
        tx.commit().await?;
        return Ok(Synced::default());
    }
    let mut per_category: BTreeMap<u64, i64> = BTreeMap::new();
    let mut per_shard: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for (order_no, category_id, quantity) in &rows {
        *per_category.entry(*category_id).or_default() += quantity;
        per_shard
            .entry(shard_of(*order_no, shards))
            .or_default()
            .push(order_no.to_string());
    }
    for (category_id, units) in &per_category {
        tx.exec_drop(
            "UPDATE ticket_category SET remain = remain - ? WHERE id = ?",
            (units, category_id),
        )
        .await
        .context("Failed to update ticket_category.remain")?;
    }
    for (shard, orders) in per_shard {
        // Seats of these orders: one statement per shard, inserting over the seat rows; a
        // seat its order has paid for already (payment came first) stays SOLD.
        tx.query_drop(format!(
            "INSERT INTO seat (category_id, row_no, col_no, event_id, status, order_no) \
             SELECT i.category_id, i.row_no, i.col_no, o.event_id, 'LOCKED', i.order_no \
             FROM {} i JOIN {} o ON o.order_no = i.order_no \
             WHERE i.order_no IN ({}) AND i.row_no IS NOT NULL \
             ON DUPLICATE KEY UPDATE \
               status = IF(seat.status = 'SOLD' AND seat.order_no = VALUES(order_no), 'SOLD', 'LOCKED'), \
               order_no = VALUES(order_no)",
            order_tables::items(shard),
            order_tables::orders(shard),
            orders.join(",")
        ))
        .await
        .context("Failed to lock the batch's seats")?;
    }
    tx.exec_drop(
        "UPDATE stock_log SET synced = 1, synced_at = UTC_TIMESTAMP(3) WHERE batch_id = ? AND synced = 0",
        (batch_id,),
    )
    .await?;
    let negative: Vec<(u64, i64)> = tx
        .query(format!(
            "SELECT id, remain FROM ticket_category WHERE id IN ({}) AND remain < 0",
            per_category
                .keys()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ))
        .await?;
    tx.commit()
        .await
        .context("Failed to commit the stock sync")?;
    for (category_id, remain) in negative {
        // Never clamped: a negative remain means more was sold than MySQL thinks existed.
        tracing::error!(
            category_id,
            remain,
            "ALARM: ticket_category.remain below zero"
        );
    }
    Ok(Synced {
        orders: rows.len(),
        units: per_category.values().sum(),
    })
}

/// For the stats: unsynced rows of an event and the age of the oldest, in seconds.
pub async fn lag(pool: &Pool, event_id: u64) -> anyhow::Result<(u64, f64)> {
    let mut conn = pool.get_conn().await?;
    let row: Option<(u64, Option<f64>)> = conn
        .exec_first(
            "SELECT COUNT(*), TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(3)) / 1e6 \
             FROM stock_log WHERE event_id = ? AND synced = 0",
            (event_id,),
        )
        .await?;
    Ok(row
        .map(|(n, age)| (n, age.unwrap_or(0.0)))
        .unwrap_or((0, 0.0)))
}
