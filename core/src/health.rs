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
        check(async {
            use mysql_async::prelude::Queryable;
            state.api_mysql.get_conn().await?.ping().await?;
            Ok(())
        }),
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

async fn check(f: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::time::timeout(CHECK_TIMEOUT, f)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {} ms", CHECK_TIMEOUT.as_millis()))?
}
