//! Stock sync (DESIGN.md "Stock sync"): a delivered `stock-sync` message names a batch;
//! its unsynced stock_batch rows (one per ticket category, written by order creation's
//! transaction) are subtracted from `remain`, one UPDATE per category, and marked synced,
//! in one transaction, so a redelivered message changes nothing. (The batch's seats were
//! locked, and its units counted in `committed`, by order creation's own transaction.)
//! stock_batch is also the outbox: the sweeper (`outbox`) re-publishes batches that stay
//! unsynced (their message was lost, or the broker was down when they were created).

pub mod outbox;

use std::sync::Arc;

use anyhow::Context;
use mysql_async::prelude::*;
use mysql_async::{IsolationLevel, Pool, TxOpts};

use crate::domain::EventId;
use crate::messaging::{BatchMessage, Names, Subscription};

/// What one application of a batch changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Synced {
    pub orders: usize,
    pub units: i64,
}

/// The `stock-sync` consumer: each delivered batch is applied once.
pub fn consumer(mysql: Pool, names: &Names) -> Subscription {
    Subscription {
        topic: names.stock_sync.clone(),
        group: names.sync_group.clone(),
        batch_max: 32,
        what: "stock sync",
        apply: Arc::new(move |message: BatchMessage| {
            let pool = mysql.clone();
            Box::pin(async move {
                let synced = apply(&pool, &message.batch_id).await?;
                tracing::debug!(batch = message.batch_id, ?synced, "stock synced");
                Ok(())
            })
        }),
    }
}

/// Applies the batch's unsynced stock_batch rows to ticket_category.remain.
pub async fn apply(pool: &Pool, batch_id: &str) -> anyhow::Result<Synced> {
    let mut conn = crate::infra::mysql::checkout(pool)
        .await
        .context("Failed to get a MySQL connection")?;
    // READ COMMITTED: the batch's rows are locked, not the gaps around them, so order
    // creation can insert the rows of its own batches meanwhile.
    let mut tx = conn
        .start_transaction(
            TxOpts::default()
                .with_isolation_level(IsolationLevel::ReadCommitted)
                .clone(),
        )
        .await?;
    // Locked first, as a cancellation locks its batch's row before the category's.
    let rows: Vec<(u64, i64, u64)> = tx
        .exec(
            "SELECT category_id, CAST(units AS SIGNED), orders FROM stock_batch \
             WHERE batch_id = ? AND synced = 0 ORDER BY category_id FOR UPDATE",
            (batch_id,),
        )
        .await
        .context("Failed to read the batch's stock_batch rows")?;
    if rows.is_empty() {
        tx.commit().await?;
        return Ok(Synced::default());
    }
    for (category_id, units, _) in rows.iter().filter(|(_, units, _)| *units > 0) {
        tx.exec_drop(
            "UPDATE ticket_category SET remain = remain - ? WHERE id = ?",
            (units, category_id),
        )
        .await
        // CHECK (remain >= 0) refuses, never clamps: the batch stays unsynced and the
        // error is logged at each redelivery until someone looks.
        .context("Failed to update ticket_category.remain")?;
    }
    tx.exec_drop(
        "UPDATE stock_batch SET synced = 1, synced_at = UTC_TIMESTAMP(3) \
         WHERE batch_id = ? AND synced = 0",
        (batch_id,),
    )
    .await?;
    tx.commit()
        .await
        .context("Failed to commit the stock sync")?;
    Ok(Synced {
        orders: rows.iter().map(|(_, _, orders)| *orders as usize).sum(),
        units: rows.iter().map(|(_, units, _)| units).sum(),
    })
}

/// For the stats: orders of an event not yet synced and the age of the oldest batch
/// holding one, in seconds.
pub async fn lag(pool: &Pool, event_id: EventId) -> anyhow::Result<(u64, f64)> {
    let mut conn = crate::infra::mysql::checkout(pool).await?;
    let row: Option<(Option<u64>, Option<f64>)> = conn
        .exec_first(
            "SELECT CAST(SUM(orders) AS UNSIGNED), \
             TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(3)) / 1e6 \
             FROM stock_batch WHERE synced = 0 AND event_id = ?",
            (event_id,),
        )
        .await?;
    Ok(row
        .map(|(n, age)| (n.unwrap_or(0), age.unwrap_or(0.0)))
        .unwrap_or((0, 0.0)))
}
