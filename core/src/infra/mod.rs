//! Connections to what Stampede stands on: Redis, MariaDB, RocketMQ.

pub mod mysql;
pub mod redis;
pub mod rocketmq;

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

/// The delays of every retry against a dependency: from `min`, doubling, at most
/// `max`, for as long as the caller keeps asking.
pub fn backoff(min: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .without_max_times()
}

/// Retries `attempt` with backoff until it succeeds or its delays add up to `timeout`,
/// logging which dependency is down and why.
pub async fn retry_until<T, F, Fut>(
    what: &str,
    target: &str,
    timeout: Duration,
    attempt: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let delays =
        backoff(Duration::from_millis(100), Duration::from_secs(2)).with_total_delay(Some(timeout));
    let value = attempt
        .retry(delays)
        .sleep(tokio::time::sleep)
        .notify(|e: &anyhow::Error, _| {
            tracing::warn!(
                dependency = what,
                target,
                error = format!("{e:#}"),
                "down; retrying"
            );
        })
        .await
        .map_err(|e| {
            e.context(format!(
                "{what} at {target} did not answer within {}s",
                timeout.as_secs()
            ))
        })?;
    tracing::info!(dependency = what, target, "connected");
    Ok(value)
}
