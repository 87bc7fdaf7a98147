//! Stock sync (DESIGN.md "Stock sync"): a delivered `stock-sync` message names a batch;
//! its unsynced stock_log rows are aggregated per ticket category into one UPDATE of
//! `remain` each, and the rows are marked synced, in one transaction, so a redelivered
//! message changes nothing. (The batch's seats were locked, and its units counted in
//! `committed`, by order creation's own transaction.) stock_log is also the outbox: the sweeper
//! (`outbox`) re-publishes batches whose rows stay unsynced (their message was lost, or
//! the broker was down when they were created).

pub mod outbox;

use std::collections::BTreeMap;
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

/// Applies the batch's unsynced stock_log rows to ticket_category.remain.
pub async fn apply(pool: &Pool, batch_id: &str) -> anyhow::Result<Synced> {
    let mut conn = pool
        .get_conn()
        .await
        .context("Failed to get a MySQL connection")?;
    // READ COMMITTED: the batch's rows are locked, not the gaps around them, so order
    // creation (which holds the category rows this waits for) can insert its own
    // stock_log rows meanwhile instead of deadlocking with this.
    let mut tx = conn
        .start_transaction(
            TxOpts::default()
                .with_isolation_level(IsolationLevel::ReadCommitted)
                .clone(),
        )
        .await?;
    let rows: Vec<(u64, u64, i64)> = tx
        .exec(
            // By the batch's index: the unsynced one would have this lock (and wait for)
            // every unsynced row of every batch it scans.
            "SELECT order_no, category_id, CAST(quantity AS SIGNED) FROM stock_log \
             FORCE INDEX (idx_stock_log_batch) WHERE batch_id = ? AND synced = 0 FOR UPDATE",
            (batch_id,),
        )
        .await
        .context("Failed to read the batch's stock_log rows")?;
    if rows.is_empty() {
        tx.commit().await?;
        return Ok(Synced::default());
    }
    let mut per_category: BTreeMap<u64, i64> = BTreeMap::new();
    for (_, category_id, quantity) in &rows {
        *per_category.entry(*category_id).or_default() += quantity;
    }
    for (category_id, units) in &per_category {
        tx.exec_drop(
            "UPDATE ticket_category SET remain = remain - ? WHERE id = ?",
            (units, category_id),
        )
        .await
        // CHECK (remain >= 0) refuses, never clamps: the batch stays unsynced and the
        // error is logged at each redelivery until someone looks.
        .context("Failed to update ticket_category.remain")?;
    }
    // By the order numbers just locked: the primary key, no second pass over the index.
    let numbers: Vec<String> = rows.iter().map(|(no, _, _)| no.to_string()).collect();
    tx.query_drop(format!(
        "UPDATE stock_log SET synced = 1, synced_at = UTC_TIMESTAMP(3) WHERE order_no IN ({})",
        numbers.join(",")
    ))
    .await?;
    tx.commit()
        .await
        .context("Failed to commit the stock sync")?;
    Ok(Synced {
        orders: rows.len(),
        units: per_category.values().sum(),
    })
}

/// For the stats: unsynced rows of an event and the age of the oldest, in seconds.
pub async fn lag(pool: &Pool, event_id: EventId) -> anyhow::Result<(u64, f64)> {
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
