//! Connections to what Stampede stands on: Redis, MariaDB, RocketMQ.

pub mod mysql;
pub mod redis;
pub mod rocketmq;

use std::future::Future;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};

/// Retries `attempt` with backoff until it succeeds or `timeout` passes, logging which
/// dependency is down and why.
pub async fn retry_until<T, F, Fut>(
    what: &str,
    target: &str,
    timeout: Duration,
    mut attempt: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let deadline = Instant::now() + timeout;
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .without_max_times()
        .build();
    let mut delay = delays.next().unwrap_or(Duration::from_secs(2));
    loop {
        match attempt().await {
            Ok(value) => {
                tracing::info!(dependency = what, target, "connected");
                return Ok(value);
            }
            Err(e) if Instant::now() + delay < deadline => {
                tracing::warn!(
                    dependency = what,
                    target,
                    error = format!("{e:#}"),
                    "down; retrying"
                );
                tokio::time::sleep(delay).await;
                delay = delays.next().unwrap_or(Duration::from_secs(2));
            }
            Err(e) => {
                return Err(e.context(format!(
                    "{what} at {target} did not answer within {}s",
                    timeout.as_secs()
                )));
            }
        }
    }
}
