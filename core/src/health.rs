//! Liveness and readiness: ready only when Redis, MariaDB and RocketMQ all answer.

use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};

use crate::http::{Response, json};
use crate::state::AppState;

const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

pub fn healthz() -> Response {
    json(StatusCode::OK, &json!({"status": "ok"}))
}

/// 200 with every dependency "up", or 503 naming what is down and why.
pub async fn readyz(state: &AppState) -> Response {
    let (redis, mysql, rocketmq) = tokio::join!(
        check(async {
            let mut con = state.redis.clone();
            redis::cmd("PING").query_async::<String>(&mut con).await?;
            Ok(())
        }),
        check(state.mysql_probe.ping()),
        check(state.rocketmq_probe.ask(|()| {
            let namesrv = state.config.settings.rocketmq.namesrv_addr.clone();
            async move {
                let answer = crate::infra::rocketmq::probe(&namesrv, CHECK_TIMEOUT).await;
                ((), answer.map(drop))
            }
        })),
    );
    let mut ready = true;
    let mut body = serde_json::Map::new();
    for (name, outcome) in [("redis", redis), ("mysql", mysql), ("rocketmq", rocketmq)] {
        let up = outcome.is_ok();
        ready &= up;
        state
            .metrics
            .dependency_up
            .with_label_values(&[name])
            .set(i64::from(up));
        let value: Value = match outcome {
            Ok(()) => "up".into(),
            Err(e) => format!("down: {e:#}").into(),
        };
        body.insert(name.to_owned(), value);
    }
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(status, &json!({"ready": ready, "dependencies": body}))
}

/// A dependency's check, one attempt at a time, in a task of its own, holding the
/// `T` it needs (a kept connection) while it runs. Checks share attempts: one that
/// ended after a check asked answers it, so a flood of checks (/readyz is on the
/// public port too) costs the dependency one check at a time and the core one task,
/// whatever their rate. A check cut off at its second leaves the attempt to finish and
/// put back what it holds, where cutting it off lost a ping or a handshake under way
/// each time.
pub struct Probe<T> {
    shared: std::sync::Arc<Flight<T>>,
}

struct Flight<T> {
    state: std::sync::Mutex<FlightState<T>>,
    /// Bumped at the end of each attempt.
    ended: tokio::sync::watch::Sender<u64>,
}

struct FlightState<T> {
    /// Here between attempts; in the attempt's task while one runs.
    held: Option<T>,
    /// When the last attempt ended, and how.
    last: Option<(tokio::time::Instant, Result<(), String>)>,
    /// Set at shutdown: no attempt starts after it.
    closed: bool,
}

impl<T: Default + Send + 'static> Probe<T> {
    pub fn new(held: T) -> Probe<T> {
        let state = FlightState {
            held: Some(held),
            last: None,
            closed: false,
        };
        Probe {
            shared: std::sync::Arc::new(Flight {
                state: std::sync::Mutex::new(state),
                ended: tokio::sync::watch::channel(0).0,
            }),
        }
    }

    /// The outcome of an attempt that ended after this call: the one under way, or
    /// `attempt` started now (it gives back what it held; it bounds its own time).
    pub async fn ask<A>(&self, attempt: impl Fn(T) -> A) -> anyhow::Result<()>
    where
        A: Future<Output = (T, anyhow::Result<()>)> + Send + 'static,
    {
        let asked = tokio::time::Instant::now();
        let mut ended = self.shared.ended.subscribe();
        loop {
            let held = {
                let mut state = self.shared.state.lock().expect("the probe's state");
                if let Some((at, outcome)) = &state.last
                    && *at >= asked
                {
                    return outcome.clone().map_err(anyhow::Error::msg);
                }
                anyhow::ensure!(!state.closed, "the core is shutting down");
                state.held.take()
            };
            if let Some(held) = held {
                let (shared, run) = (self.shared.clone(), attempt(held));
                tokio::spawn(async move {
                    use futures_util::FutureExt;
                    // A panic in the attempt must not leave every later check waiting
                    // for a `held` that never comes back.
                    let (held, outcome) =
                        match std::panic::AssertUnwindSafe(run).catch_unwind().await {
                            Ok((held, outcome)) => (held, outcome.map_err(|e| format!("{e:#}"))),
                            Err(_) => (T::default(), Err("the check failed (a panic)".to_owned())),
                        };
                    {
                        let mut state = shared.state.lock().expect("the probe's state");
                        state.last = Some((tokio::time::Instant::now(), outcome));
                        state.held = Some(held);
                    }
                    shared.ended.send_modify(|n| *n = n.wrapping_add(1));
                });
            }
            // The sender lives as long as `self`.
            ended.changed().await?;
        }
    }

    /// No attempt starts from now on; what the probe holds, once an attempt under way
    /// has given it back (within `wait`).
    pub async fn close(&self, wait: Duration) -> Option<T> {
        let mut ended = self.shared.ended.subscribe();
        let held = async {
            loop {
                {
                    let mut state = self.shared.state.lock().expect("the probe's state");
                    state.closed = true;
                    if let Some(held) = state.held.take() {
                        return Some(held);
                    }
                }
                if ended.changed().await.is_err() {
                    return None;
                }
            }
        };
        tokio::time::timeout(wait, held).await.ok().flatten()
    }
}

/// MariaDB's readiness, asked on a connection of its own. A ping through the API's
/// pool would wait for one of its connections: with every one of them held by requests
/// on a slow table (a login flood on a locked users' table), every core would fail its
/// check at once and leave the balancer, although MariaDB answers. One connection per
/// core, kept between checks (and a second one from a race against a slow answer that
/// the kept one won, until the next check closes it).
pub struct MysqlProbe {
    opts: mysql_async::Opts,
    probe: Probe<Kept>,
}

#[derive(Default)]
struct Kept {
    conn: Option<mysql_async::Conn>,
    /// How long the kept connection's last answered ping took.
    answered_in: Duration,
    /// A new connection being made, in a task of its own, since it raced a slow kept
    /// one that then answered: the next attempt that needs a new connection takes it
    /// rather than making another; one that does not closes it if it is made by then.
    making: Option<tokio::task::JoinHandle<anyhow::Result<(mysql_async::Conn, Duration)>>>,
}

/// How long the kept connection has to answer alone before a new one is tried
/// alongside it (a connection a NAT or a failover dropped silently would hold the whole
/// check), the first to answer kept; or twice the kept one's last answer, up to the
/// check's second, if that is longer: a MariaDB answering slowly keeps its connection,
/// not asked for a new one at every check.
const KEPT_PING: Duration = Duration::from_millis(300);

/// The longest an attempt, or the making of a connection, may take (a handshake on a
/// slow path, a MariaDB that takes connections and never answers) before what it holds
/// is dropped.
const ATTEMPT_LIMIT: Duration = Duration::from_secs(5);

impl MysqlProbe {
    pub fn new(opts: mysql_async::Opts) -> MysqlProbe {
        MysqlProbe {
            opts,
            probe: Probe::new(Kept::default()),
        }
    }

    /// A ping on the kept connection (or a new one), shared with the checks at once.
    pub async fn ping(&self) -> anyhow::Result<()> {
        self.probe
            .ask(|mut kept| {
                let opts = self.opts.clone();
                async move {
                    let outcome = tokio::time::timeout(ATTEMPT_LIMIT, kept.attempt(opts))
                        .await
                        .unwrap_or_else(|_| {
                            anyhow::bail!("no answer within {} ms", ATTEMPT_LIMIT.as_millis())
                        });
                    (kept, outcome)
                }
            })
            .await
    }

    /// Closes the kept connection (at shutdown), once an attempt under way has ended.
    pub async fn close(&self) {
        if let Some(mut kept) = self.probe.close(ATTEMPT_LIMIT).await {
            if let Some(conn) = kept.conn.take() {
                let _ = conn.disconnect().await;
            }
            // A connection still being made is let finish, then closed (cut off
            // mid-handshake, MariaDB would count it a failed connection).
            if let Some(making) = kept.making.take()
                && let Ok(Ok(Ok((spare, _)))) = tokio::time::timeout(ATTEMPT_LIMIT, making).await
            {
                let _ = spare.disconnect().await;
            }
        }
    }
}

impl Kept {
    /// Pings on the kept connection; when that fails, once more on a new one, which is
    /// kept; when it is slow (the path to it died, or MariaDB is slow), a new connection
    /// races its answer. The connection in use is taken out: an attempt cut off drops
    /// it.
    async fn attempt(&mut self, opts: mysql_async::Opts) -> anyhow::Result<()> {
        let (conn, answered_in) = match self.conn.take() {
            Some(mut conn) => {
                self.close_spare().await;
                let patience = (self.answered_in * 2).clamp(KEPT_PING, CHECK_TIMEOUT);
                let began = tokio::time::Instant::now();
                match self.ping_kept(&mut conn, patience, opts).await? {
                    Some(new) => new,
                    None => (conn, began.elapsed()),
                }
            }
            None => self.new_conn(opts).await??,
        };
        (self.conn, self.answered_in) = (Some(conn), answered_in);
        Ok(())
    }

    /// The kept connection's ping, given `patience` alone before a new connection races
    /// it: `None` when the kept one answered, the new one (and its ping's time) when it
    /// answered first or the kept one failed.
    async fn ping_kept(
        &mut self,
        conn: &mut mysql_async::Conn,
        patience: Duration,
        opts: mysql_async::Opts,
    ) -> anyhow::Result<Option<(mysql_async::Conn, Duration)>> {
        use mysql_async::prelude::Queryable;
        let mut ping = Box::pin(conn.ping());
        match tokio::time::timeout(patience, &mut ping).await {
            Ok(Ok(())) => return Ok(None),
            Ok(Err(_)) => return self.new_conn(opts).await?.map(Some),
            Err(_) => {}
        }
        let mut fresh = self.new_conn(opts);
        tokio::select! {
            answer = &mut ping => match answer {
                Ok(()) => {
                    // Left to be made: cut off mid-handshake, MariaDB would count it a
                    // failed connection (max_connect_errors).
                    self.making = Some(fresh);
                    Ok(None)
                }
                Err(_) => fresh.await?.map(Some),
            },
            made = &mut fresh => match made? {
                Ok(new) => Ok(Some(new)),
                Err(e) => ping.await.map(|()| None).map_err(|_| e),
            },
        }
    }

    /// The new connection being made, or one started now.
    fn new_conn(
        &mut self,
        opts: mysql_async::Opts,
    ) -> tokio::task::JoinHandle<anyhow::Result<(mysql_async::Conn, Duration)>> {
        self.making.take().unwrap_or_else(|| {
            tokio::spawn(async move {
                tokio::time::timeout(ATTEMPT_LIMIT, connect(opts))
                    .await
                    .unwrap_or_else(|_| {
                        anyhow::bail!("no connection within {} ms", ATTEMPT_LIMIT.as_millis())
                    })
            })
        })
    }

    /// Closes a new connection made since a race the kept one won (one connection is
    /// enough); one still being made is left to the next race.
    async fn close_spare(&mut self) {
        if self.making.as_ref().is_some_and(|m| m.is_finished())
            && let Some(making) = self.making.take()
            && let Ok(Ok((spare, _))) = making.await
        {
            let _ = spare.disconnect().await;
        }
    }
}

/// A new connection that has answered a ping, and how long its ping took.
async fn connect(opts: mysql_async::Opts) -> anyhow::Result<(mysql_async::Conn, Duration)> {
    use mysql_async::prelude::Queryable;
    let mut conn = mysql_async::Conn::new(opts).await?;
    let began = tokio::time::Instant::now();
    conn.ping().await?;
    Ok((conn, began.elapsed()))
}

async fn check(f: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::time::timeout(CHECK_TIMEOUT, f)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {} ms", CHECK_TIMEOUT.as_millis()))?
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Checks at once share one attempt; a check asked after it ended starts another.
    #[tokio::test]
    async fn checks_at_once_share_one_attempt() {
        let probe = Probe::new(0u32);
        let made = AtomicUsize::new(0);
        let attempt = |n: u32| {
            made.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                (n + 1, Ok(()))
            }
        };
        let answers = futures_util::future::join_all((0..20).map(|_| probe.ask(attempt))).await;
        assert!(answers.iter().all(Result::is_ok));
        assert_eq!(made.load(Ordering::SeqCst), 1);
        probe.ask(attempt).await.unwrap();
        assert_eq!(made.load(Ordering::SeqCst), 2);
        assert_eq!(probe.close(Duration::from_secs(1)).await, Some(2));
        let closed = probe.ask(attempt).await.unwrap_err();
        assert_eq!(closed.to_string(), "the core is shutting down");
    }

    /// An attempt that panics answers its checks "down" and leaves the next check its
    /// own attempt, not a wait for what it held.
    #[tokio::test]
    async fn a_panicking_attempt_is_down_and_the_next_check_tries_again() {
        let probe = Probe::new(7u32);
        let down = tokio::time::timeout(
            Duration::from_secs(1),
            probe.ask(|_| async { panic!("inside the check") }),
        )
        .await
        .expect("an answer within the second")
        .unwrap_err();
        assert!(down.to_string().contains("panic"), "{down}");
        let up = tokio::time::timeout(
            Duration::from_secs(1),
            probe.ask(|n| async move { (n, Ok(())) }),
        )
        .await;
        assert!(matches!(up, Ok(Ok(()))), "{up:?}");
    }
}
