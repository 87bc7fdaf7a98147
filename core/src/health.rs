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
/// core, kept between checks; checks at once take turns on it.
pub struct MysqlProbe {
    opts: mysql_async::Opts,
    conn: tokio::sync::Mutex<Option<mysql_async::Conn>>,
}

impl MysqlProbe {
    pub fn new(opts: mysql_async::Opts) -> MysqlProbe {
        MysqlProbe {
            opts,
            conn: tokio::sync::Mutex::new(None),
        }
    }

    /// Pings on the kept connection; when that fails (MariaDB closed it after
    /// wait_timeout idle, or restarted), once more on a new one, which is kept. A ping
    /// cut off drops its connection (it is taken out while in use).
    pub async fn ping(&self) -> anyhow::Result<()> {
        use mysql_async::prelude::Queryable;
        let mut kept = self.conn.lock().await;
        if let Some(mut conn) = kept.take()
            && conn.ping().await.is_ok()
        {
            *kept = Some(conn);
            return Ok(());
        }
        let mut conn = mysql_async::Conn::new(self.opts.clone()).await?;
        conn.ping().await?;
        *kept = Some(conn);
        Ok(())
    }
}

async fn check(f: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::time::timeout(CHECK_TIMEOUT, f)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {} ms", CHECK_TIMEOUT.as_millis()))?
}
