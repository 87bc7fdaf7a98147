//! The outbox sweeper: batches whose stock_batch rows stay unsynced (their `stock-sync`
//! message was lost, or the broker was down when their orders were created) are
//! published again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use mysql_async::Pool;
use mysql_async::prelude::*;

use crate::infra::mysql::CallTimeout;
use crate::messaging::{BatchMessage, MqCell};
use crate::shutdown::Shutdown;

/// Until `stop`: every 2 s, re-publishes batches unsynced for `sweep_after_s`, once the
/// broker's clients have started. A batch published again is left alone for another
/// `sweep_after_s` (doubling each time, up to a minute): while stock sync merely lags,
/// its messages are on their way and publishing them every 2 s only adds to the lag.
pub async fn run(
    mysql: Pool,
    call_timeout: CallTimeout,
    mq: MqCell,
    sweep_after_s: u64,
    mut stop: Shutdown,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    let mut published = Republished::default();
    let first_wait = Duration::from_secs(sweep_after_s.max(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait() => return,
        }
        let Some(mq) = mq.get() else { continue };
        let find = stale_batches(&mysql, sweep_after_s, 500);
        match call_timeout.try_within("the outbox sweep", find).await {
            Err(e) => tracing::warn!(error = format!("{e:#}"), "outbox sweep failed"),
            Ok(batches) => {
                published.keep_only(&batches);
                for (batch_id, event_id) in batches {
                    if !published.due(&batch_id) {
                        continue;
                    }
                    let message = BatchMessage {
                        batch_id,
                        event_id,
                        orders: Vec::new(),
                    };
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
                    published.sent(message.batch_id, first_wait);
                }
            }
        }
    }
}

/// Batches unsynced for longer than `older_than_s`, oldest first.
pub async fn stale_batches(
    pool: &Pool,
    older_than_s: u64,
    limit: u32,
) -> anyhow::Result<Vec<(String, u64)>> {
    let mut conn = crate::infra::mysql::checkout(pool).await?;
    conn.exec(
        "SELECT batch_id, MIN(event_id) FROM stock_batch WHERE synced = 0 \
         AND created_at < UTC_TIMESTAMP(3) - INTERVAL ? SECOND GROUP BY batch_id ORDER BY MIN(created_at) LIMIT ?",
        (older_than_s, limit),
    )
    .await
    .context("Failed to find unsynced batches")
}

/// When each unsynced batch may be published again, and the wait after that.
#[derive(Default)]
struct Republished(HashMap<String, (Instant, Duration)>);

impl Republished {
    /// Forgets the batches no longer unsynced.
    fn keep_only(&mut self, stale: &[(String, u64)]) {
        self.0
            .retain(|batch, _| stale.iter().any(|(b, _)| b == batch));
    }

    fn due(&self, batch: &str) -> bool {
        self.0
            .get(batch)
            .is_none_or(|(at, _)| Instant::now() >= *at)
    }

    fn sent(&mut self, batch: String, first_wait: Duration) {
        let wait = self
            .0
            .get(&batch)
            .map_or(first_wait, |(_, w)| (*w * 2).min(Duration::from_secs(60)));
        self.0.insert(batch, (Instant::now() + wait, wait));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_published_again_waits_longer_each_time_and_is_forgotten_once_synced() {
        let mut p = Republished::default();
        let wait = Duration::from_secs(5);
        assert!(p.due("b"));
        p.sent("b".into(), wait);
        assert!(!p.due("b"), "not again at the next sweep");
        assert_eq!(p.0["b"].1, wait);
        p.sent("b".into(), wait);
        assert_eq!(p.0["b"].1, wait * 2);
        p.keep_only(&[("other".into(), 1)]);
        assert!(p.due("b"), "synced, then unsynced again: due at once");
    }
}
