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
/// core, kept between checks. Checks at once share pings: one that began after a check
/// asked answers it too, so a flood of checks costs MariaDB one ping at a time.
pub struct MysqlProbe {
    opts: mysql_async::Opts,
    kept: tokio::sync::Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    conn: Option<mysql_async::Conn>,
    /// When the last ping that MariaDB answered began.
    answered_from: Option<tokio::time::Instant>,
}

/// How long the kept connection has to answer before a new one is tried (a connection
/// a NAT or a failover dropped silently would hold the whole check).
const KEPT_PING: Duration = Duration::from_millis(300);

impl MysqlProbe {
    pub fn new(opts: mysql_async::Opts) -> MysqlProbe {
        MysqlProbe {
            opts,
            kept: Default::default(),
        }
    }

    /// Pings on the kept connection; when that fails or is slow (MariaDB closed it
    /// after wait_timeout idle, restarted, or the path to it died), once more on a new
    /// one, which is kept. A ping cut off drops its connection (it is taken out while in
    /// use).
    pub async fn ping(&self) -> anyhow::Result<()> {
        use mysql_async::prelude::Queryable;
        let asked = tokio::time::Instant::now();
        let mut kept = self.kept.lock().await;
        if kept.answered_from.is_some_and(|from| from >= asked) {
            return Ok(());
        }
        let began = tokio::time::Instant::now();
        if let Some(mut conn) = kept.conn.take()
            && let Ok(Ok(())) = tokio::time::timeout(KEPT_PING, conn.ping()).await
        {
            (kept.conn, kept.answered_from) = (Some(conn), Some(began));
            return Ok(());
        }
        let began = tokio::time::Instant::now();
        let mut conn = mysql_async::Conn::new(self.opts.clone()).await?;
        conn.ping().await?;
        (kept.conn, kept.answered_from) = (Some(conn), Some(began));
        Ok(())
    }

    /// Closes the kept connection (at shutdown).
    pub async fn close(&self) {
        if let Some(conn) = self.kept.lock().await.conn.take() {
            let _ = conn.disconnect().await;
        }
    }
}

async fn check(f: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::time::timeout(CHECK_TIMEOUT, f)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {} ms", CHECK_TIMEOUT.as_millis()))?
}
