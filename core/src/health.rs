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
        check(async {
            crate::infra::rocketmq::probe(
                &state.config.settings.rocketmq.namesrv_addr,
                CHECK_TIMEOUT,
            )
            .await
            .map(drop)
        }),
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

/// MariaDB's readiness, asked on a connection of its own. A ping through the API's
/// pool would wait for one of its connections: with every one of them held by requests
/// on a slow table (a login flood on a locked users' table), every core would fail its
/// check at once and leave the balancer, although MariaDB answers. One connection per
/// core, kept between checks.
///
/// One attempt at a time, in a task of its own: a check cut off at its second leaves
/// the attempt to finish (within [`ATTEMPT_LIMIT`]) and its connection to be kept for
/// the next check, where cutting it off lost a ping or a handshake under way each time,
/// and with it every check on a path slower than the second. Checks at once share
/// attempts: one that ended after a check asked answers it, so a flood of checks costs
/// MariaDB one ping at a time.
pub struct MysqlProbe {
    opts: mysql_async::Opts,
    kept: std::sync::Arc<tokio::sync::Mutex<Kept>>,
}

#[derive(Default)]
struct Kept {
    conn: Option<mysql_async::Conn>,
    /// How long the kept connection's last answered ping took.
    answered_in: Duration,
    /// When the last attempt ended, and how.
    last: Option<(tokio::time::Instant, Result<(), String>)>,
}

/// How long the kept connection has to answer alone before a new one is tried
/// alongside it (a connection a NAT or a failover dropped silently would hold the whole
/// check), the first to answer kept; or twice the kept one's last answer, up to the
/// check's second, if that is longer: a MariaDB answering slowly keeps its connection,
/// not asked for a new one at every check.
const KEPT_PING: Duration = Duration::from_millis(300);

/// The longest an attempt may take (a new connection's handshake on a slow path, a
/// MariaDB that takes connections and never answers) before its connections are
/// dropped.
const ATTEMPT_LIMIT: Duration = Duration::from_secs(5);

impl MysqlProbe {
    pub fn new(opts: mysql_async::Opts) -> MysqlProbe {
        MysqlProbe {
            opts,
            kept: Default::default(),
        }
    }

    /// The outcome of an attempt that ended after this call: one made now, or one
    /// under way when it was made.
    pub async fn ping(&self) -> anyhow::Result<()> {
        let asked = tokio::time::Instant::now();
        let (opts, kept) = (self.opts.clone(), self.kept.clone());
        let attempt = tokio::spawn(async move {
            let mut kept = kept.lock_owned().await;
            if let Some((ended, outcome)) = &kept.last
                && *ended >= asked
            {
                return outcome.clone();
            }
            let outcome = match tokio::time::timeout(ATTEMPT_LIMIT, kept.attempt(opts)).await {
                Ok(done) => done.map_err(|e| format!("{e:#}")),
                Err(_) => Err(format!("no answer within {} ms", ATTEMPT_LIMIT.as_millis())),
            };
            kept.last = Some((tokio::time::Instant::now(), outcome.clone()));
            outcome
        });
        attempt.await?.map_err(anyhow::Error::msg)
    }

    /// Closes the kept connection (at shutdown; an attempt under way is not waited for).
    pub async fn close(&self) {
        if let Ok(mut kept) = self.kept.try_lock()
            && let Some(conn) = kept.conn.take()
        {
            let _ = conn.disconnect().await;
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
                let patience = (self.answered_in * 2).clamp(KEPT_PING, CHECK_TIMEOUT);
                let began = tokio::time::Instant::now();
                match ping_kept(&mut conn, patience, opts).await? {
                    Some(new) => new,
                    None => (conn, began.elapsed()),
                }
            }
            None => connect(opts).await?,
        };
        (self.conn, self.answered_in) = (Some(conn), answered_in);
        Ok(())
    }
}

/// The kept connection's ping, given `patience` alone before a new connection races
/// it: `None` when the kept one answered, the new one (and its ping's time) when it
/// answered first or the kept one failed.
async fn ping_kept(
    conn: &mut mysql_async::Conn,
    patience: Duration,
    opts: mysql_async::Opts,
) -> anyhow::Result<Option<(mysql_async::Conn, Duration)>> {
    use mysql_async::prelude::Queryable;
    let mut ping = Box::pin(conn.ping());
    match tokio::time::timeout(patience, &mut ping).await {
        Ok(Ok(())) => return Ok(None),
        Ok(Err(_)) => return connect(opts).await.map(Some),
        Err(_) => {}
    }
    let mut fresh = Box::pin(connect(opts));
    tokio::select! {
        answer = &mut ping => match answer {
            Ok(()) => {
                // The new connection is made and closed aside: cut off mid-handshake,
                // MariaDB would count it a failed connection (max_connect_errors).
                tokio::spawn(async move {
                    if let Ok(Ok((conn, _))) = tokio::time::timeout(ATTEMPT_LIMIT, fresh).await {
                        let _ = conn.disconnect().await;
                    }
                });
                Ok(None)
            }
            Err(_) => fresh.await.map(Some),
        },
        made = &mut fresh => match made {
            Ok(new) => Ok(Some(new)),
            Err(e) => ping.await.map(|()| None).map_err(|_| e),
        },
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
