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

/// A part the core stands on that is down or too slow, as a failure shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Down {
    /// Redis; `maybe_sent`: the command may have reached it (a timeout, a connection
    /// dropped while waiting), so what it did is unknown.
    Redis {
        maybe_sent: bool,
    },
    MySql,
}

impl Down {
    /// The part a failure (anywhere in its chain) says is unavailable, if it says so.
    pub fn of(e: &anyhow::Error) -> Option<Down> {
        e.chain().find_map(|cause| {
            if let Some(r) = cause.downcast_ref::<::redis::RedisError>() {
                use ::redis::ErrorKind::*;
                // Redis refused a reconnection's AUTH or SELECT: unavailable, and nothing
                // was sent (infra/redis.rs builds the connection anew).
                if crate::infra::redis::refused_reconnection(r) {
                    return Some(Down::Redis { maybe_sent: false });
                }
                // Redis still loading its data refused the command: nothing ran
                // (infra/redis.rs turns the answers where that is not known — a
                // pipeline partly run, a cluster call retried — into a lost connection).
                if r.kind() == BusyLoadingError {
                    return Some(Down::Redis { maybe_sent: false });
                }
                // A cluster failing a shard over: down for now. The cluster client
                // retries a call that met an I/O error, so its last error says nothing
                // of whether an earlier attempt ran: such a call may have been sent.
                let failing_over = matches!(
                    r.kind(),
                    ClusterDown
                        | MasterDown
                        | TryAgain
                        | Moved
                        | Ask
                        | ReadOnly
                        | ClusterConnectionNotFound
                );
                let down = failing_over
                    || r.is_timeout()
                    || r.is_connection_dropped()
                    || r.is_connection_refusal()
                    || r.is_io_error();
                return down.then_some(Down::Redis {
                    maybe_sent: !r.is_connection_refusal(),
                });
            }
            if cause.is::<crate::infra::mysql::TimedOut>() {
                return Some(Down::MySql);
            }
            match cause.downcast_ref::<mysql_async::Error>() {
                Some(mysql_async::Error::Io(_) | mysql_async::Error::Driver(_)) => {
                    Some(Down::MySql)
                }
                // Too slow or in the way, the statement (a deadlock's: its transaction)
                // undone: a statement past the API's sessions' max_statement_time
                // (1969), a lock waited on past innodb_lock_wait_timeout (1205), a
                // deadlock's victim (1213).
                Some(mysql_async::Error::Server(s)) if [1969, 1205, 1213].contains(&s.code) => {
                    Some(Down::MySql)
                }
                _ => None,
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Down::Redis { .. } => "Redis",
            Down::MySql => "MySQL",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_or_dead_part_is_named_and_a_refused_connection_sent_nothing() {
        let io = |kind| {
            anyhow::Error::new(::redis::RedisError::from(std::io::Error::new(kind, "x")))
                .context("Redis call failed")
        };
        assert_eq!(
            Down::of(&io(std::io::ErrorKind::TimedOut)),
            Some(Down::Redis { maybe_sent: true })
        );
        assert_eq!(
            Down::of(&io(std::io::ErrorKind::ConnectionRefused)),
            Some(Down::Redis { maybe_sent: false })
        );
        let script =
            ::redis::RedisError::from((::redis::ErrorKind::ResponseError, "ERR", "x".into()));
        assert_eq!(
            Down::of(&anyhow::Error::new(script)),
            None,
            "an answer, not an outage"
        );
        assert_eq!(Down::of(&anyhow::anyhow!("other")), None);
        let cut = anyhow::Error::new(crate::infra::mysql::TimedOut(
            std::time::Duration::from_secs(1),
        ))
        .context("Failed to read the event");
        assert_eq!(Down::of(&cut), Some(Down::MySql), "a MySQL call cut off");
        let refused = |code| {
            anyhow::Error::new(mysql_async::Error::Server(mysql_async::ServerError {
                code,
                message: "x".into(),
                state: "HY000".into(),
            }))
            .context("Failed to change the event status")
        };
        assert_eq!(Down::of(&refused(1969)), Some(Down::MySql), "too slow");
        assert_eq!(Down::of(&refused(1205)), Some(Down::MySql), "too slow");
        assert_eq!(Down::of(&refused(1213)), Some(Down::MySql), "a deadlock");
        assert_eq!(Down::of(&refused(1062)), None, "an answer, not an outage");
        let auth = ::redis::RedisError::from((
            ::redis::ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert_eq!(
            Down::of(&anyhow::Error::new(auth).context("Redis call failed")),
            Some(Down::Redis { maybe_sent: false }),
            "a reconnection refused: down, nothing sent"
        );
        let select = ::redis::RedisError::from((
            ::redis::ErrorKind::ResponseError,
            "Redis server refused to switch database",
            "ERR DB index is out of range".to_owned(),
        ));
        assert_eq!(
            Down::of(&anyhow::Error::new(select)),
            Some(Down::Redis { maybe_sent: false })
        );
        for (kind, code) in [
            (::redis::ErrorKind::ClusterDown, "CLUSTERDOWN"),
            (::redis::ErrorKind::TryAgain, "TRYAGAIN"),
            (::redis::ErrorKind::ReadOnly, "READONLY"),
        ] {
            let failover = ::redis::RedisError::from((kind, code, "x".into()));
            assert_eq!(
                Down::of(&anyhow::Error::new(failover)),
                Some(Down::Redis { maybe_sent: true }),
                "{code}"
            );
        }
    }
}
