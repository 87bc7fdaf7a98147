use std::process::Command;
use std::time::Duration;

use stampede_e2e::{Stack, eventually, free_port, root, spawn_app, spawn_app_with, test_settings};

#[tokio::test]
async fn readyz_is_ready_when_redis_mysql_and_rocketmq_answer() {
    let app = spawn_app().await;
    for base in [&app.admin_url, &app.public_url] {
        let resp = app.http.get(format!("{base}/readyz")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(
            body["dependencies"],
            serde_json::json!({"redis": "up", "mysql": "up", "rocketmq": "up"})
        );
        let health = app
            .http
            .get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap();
        assert_eq!(health.status(), 200);
    }
    let (status, metrics) = app.get("/metrics").await;
    assert_eq!(status, 200);
    let metrics = metrics.as_str().unwrap().to_owned();
    assert!(
        metrics.contains("stampede_dependency_up{dependency=\"rocketmq\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("stampede_http_responses_total"),
        "{metrics}"
    );
    app.stop().await;
}

/// Ports for a broker of the test's own: it also takes port-2, port+1 and port+3.
fn free_broker_port() -> u16 {
    loop {
        let p = free_port();
        if p > 20_000
            && [p - 2, p + 1, p + 3]
                .iter()
                .all(|q| std::net::TcpListener::bind(("127.0.0.1", *q)).is_ok())
        {
            return p;
        }
    }
}

/// `scripts/stack.sh` on a stack of the test's own (name server and broker only).
fn own_stack(
    dir: &std::path::Path,
    namesrv: u16,
    broker: u16,
    args: &[&str],
) -> std::process::Output {
    Command::new(root().join("scripts/stack.sh"))
        .args(args)
        .env("STACK_DIR", dir)
        .env("NAMESRV_PORT", namesrv.to_string())
        .env("BROKER_PORT", broker.to_string())
        // Ports nothing listens on, so the other parts read as not started.
        .env("REDIS_PORT", "1")
        .env("MYSQL_PORT", "1")
        .env("EDGE_PORT", "1")
        .env("CORE_PORT", "1")
        .env("ADMIN_PORT", "1")
        .output()
        .expect("scripts/stack.sh runs")
}

#[tokio::test]
async fn stopping_the_broker_turns_readyz_to_503_and_status_names_it() {
    let dir = std::env::temp_dir().join(format!("stampede-broker-{}", free_port()));
    let (namesrv, broker) = (free_port(), free_broker_port());
    let up = own_stack(&dir, namesrv, broker, &["up", "namesrv", "broker"]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let app = spawn_app_with(|s| s.rocketmq.namesrv_addr = format!("127.0.0.1:{namesrv}")).await;
    let readyz = || async {
        let resp = app
            .http
            .get(format!("{}/readyz", app.admin_url))
            .send()
            .await
            .unwrap();
        (
            resp.status().as_u16(),
            resp.json::<serde_json::Value>().await.unwrap(),
        )
    };
    assert_eq!(readyz().await.0, 200);

    let down = own_stack(&dir, namesrv, broker, &["down", "broker"]);
    assert!(down.status.success());
    let went_down = eventually(Duration::from_secs(10), || async {
        readyz().await.0 == 503
    })
    .await;
    let last = readyz().await;
    assert!(went_down, "{}", last.1);
    assert!(
        last.1["dependencies"]["rocketmq"]
            .as_str()
            .unwrap()
            .starts_with("down"),
        "{}",
        last.1
    );
    assert_eq!(last.1["dependencies"]["redis"], "up");

    let status = own_stack(&dir, namesrv, broker, &["status"]);
    assert!(
        !status.status.success(),
        "status exits non-zero while a part is down"
    );
    let table = String::from_utf8_lossy(&status.stdout);
    let line = |part: &str| {
        table
            .lines()
            .find(|l| l.starts_with(part))
            .unwrap_or("")
            .to_owned()
    };
    assert!(line("broker").contains("down"), "{table}");
    assert!(line("namesrv").contains(" up"), "{table}");

    // Back up: ready again.
    assert!(
        own_stack(&dir, namesrv, broker, &["up", "broker"])
            .status
            .success()
    );
    let back = eventually(Duration::from_secs(10), || async {
        readyz().await.0 == 200
    })
    .await;
    assert!(back, "ready again once the broker is back");
    app.stop().await;
    own_stack(&dir, namesrv, broker, &["down"]);
    std::fs::remove_dir_all(&dir).ok();
}

fn core_binary() -> std::path::PathBuf {
    std::env::var("STAMPEDE_BIN")
        .map(Into::into)
        .unwrap_or_else(|_| root().join("target/debug/stampede"))
}

#[test]
fn bad_config_is_refused_with_exit_64_before_any_port_is_bound() {
    let port = free_port();
    let out = Command::new(core_binary())
        .arg("serve")
        .env("STAMPEDE_SERVER__PUBLIC_ADDR", format!("127.0.0.1:{port}"))
        .env("STAMPEDE_SERVER__ADMIN_ADDR", "not-an-address")
        .env("STAMPEDE_AUTH__ADMIN_TOKEN", "a-long-enough-admin-token")
        .env("STAMPEDE_AUTH__TOKEN_SECRET", "a-long-enough-token-secret")
        .output()
        .expect("the stampede binary (cargo build -p stampede-core)");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.admin_addr"));
    assert!(
        std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
        "nothing was bound"
    );

    let out = Command::new(core_binary())
        .arg("serve")
        .env_remove("STAMPEDE_AUTH__ADMIN_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("admin_token"));
}

#[tokio::test]
async fn sigterm_stops_the_core_cleanly() {
    let stack = Stack::from_env();
    let (s, database, _) = test_settings(&stack).await;
    let admin = free_port();
    let mut child = tokio::process::Command::new(core_binary())
        .arg("serve")
        .env(
            "STAMPEDE_SERVER__PUBLIC_ADDR",
            format!("127.0.0.1:{}", free_port()),
        )
        .env("STAMPEDE_SERVER__ADMIN_ADDR", format!("127.0.0.1:{admin}"))
        .env("STAMPEDE_REDIS__URL", &s.redis.url)
        .env("STAMPEDE_REDIS__KEY_PREFIX", &s.redis.key_prefix)
        .env("STAMPEDE_MYSQL__URL", &s.mysql.url)
        .env("STAMPEDE_MYSQL__PASSWORD", stack.secret("mysql.password"))
        .env("STAMPEDE_ROCKETMQ__NAMESRV_ADDR", &s.rocketmq.namesrv_addr)
        .env("STAMPEDE_AUTH__ADMIN_TOKEN", "a-long-enough-admin-token")
        .env("STAMPEDE_AUTH__TOKEN_SECRET", "a-long-enough-token-secret")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    let healthz = format!("http://127.0.0.1:{admin}/healthz");
    let up = eventually(Duration::from_secs(10), || async {
        http.get(&healthz).send().await.is_ok()
    })
    .await;
    assert!(up, "the core did not start");
    let pid = child.id().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("stopped within 15 s")
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(
        http.get(format!("http://127.0.0.1:{admin}/healthz"))
            .send()
            .await
            .is_err(),
        "no longer listening"
    );
    let pool = mysql_async::Pool::new(stack.mysql_url("stampede").as_str());
    use mysql_async::prelude::Queryable;
    pool.get_conn()
        .await
        .unwrap()
        .query_drop(format!("DROP DATABASE `{database}`"))
        .await
        .unwrap();
}
