//! The outbox sweeper: stock_log rows that stay unsynced (their `stock-sync` message was
//! lost, or the broker was down when their orders were created) are published again.

use std::time::Duration;

use anyhow::Context;
use mysql_async::Pool;
use mysql_async::prelude::*;

use crate::messaging::{BatchMessage, MqCell};
use crate::shutdown::Shutdown;

/// Until `stop`: every 2 s, re-publishes batches unsynced for `sweep_after_s`, once the
/// broker's clients have started.
pub async fn run(mysql: Pool, mq: MqCell, sweep_after_s: u64, mut stop: Shutdown) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait() => return,
        }
        let Some(mq) = mq.get() else { continue };
        match stale_batches(&mysql, sweep_after_s, 500).await {
            Ok(batches) => {
                for (batch_id, event_id) in batches {
                    let message = BatchMessage { batch_id, event_id };
                    if let Err(e) = mq.publish_sync(&message).await {
                        tracing::warn!(
                            error = format!("{e:#}"),
                            "outbox: broker still unavailable"
                        );
                        break;
                    }
                    tracing::info!(
                        batch = message.batch_id,
                        "outbox: re-published an unsynced batch"
                    );
                }
            }
            Err(e) => tracing::warn!(error = format!("{e:#}"), "outbox sweep failed"),
        }
    }
}

/// Batches with rows unsynced for longer than `older_than_s`, oldest first.
pub async fn stale_batches(
    pool: &Pool,
    older_than_s: u64,
    limit: u32,
) -> anyhow::Result<Vec<(String, u64)>> {
    let mut conn = pool.get_conn().await?;
    conn.exec(
        "SELECT batch_id, MIN(event_id) FROM stock_log WHERE synced = 0 \
         AND created_at < UTC_TIMESTAMP(3) - INTERVAL ? SECOND GROUP BY batch_id ORDER BY MIN(id) LIMIT ?",
        (older_than_s, limit),
    )
    .await
    .context("Failed to find unsynced batches")
}
