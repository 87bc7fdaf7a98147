use std::process::Command;
use std::time::Duration;

use stampede_e2e::{
    CoreProcess, OwnBroker, OwnMariadb, Stack, TestApp, core_binary, eventually, free_port, scalar,
    spawn_app, spawn_app_with, test_settings,
};

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

/// `/readyz` on `base` (the app's admin or public URL): status and body.
pub(crate) async fn readyz(app: &TestApp, base: &str) -> (u16, serde_json::Value) {
    let resp = app.http.get(format!("{base}/readyz")).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

#[tokio::test]
async fn stopping_the_broker_turns_readyz_to_503_and_status_names_it() {
    let own = OwnBroker::start();
    let app = spawn_app_with(|s| s.rocketmq.namesrv_addr = own.namesrv_addr()).await;
    let readyz = || readyz(&app, &app.admin_url);
    assert_eq!(readyz().await.0, 200);

    own.stop_broker();
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

    let status = own.stack(&["status"]);
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

    own.start_broker();
    let back = eventually(Duration::from_secs(10), || async {
        readyz().await.0 == 200
    })
    .await;
    assert!(back, "ready again once the broker is back");
    app.stop().await;
}

/// /readyz's own MariaDB connection: when the kept one stops answering (a path that
/// died silently), a new one answers within the same check; a MariaDB that takes
/// connections and never answers is down within the check's second; one that refuses
/// them is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_mariadb_on_a_connection_of_its_own() {
    let stack = Stack::from_env();
    let relay = stampede_e2e::StallingRelay::start(([127, 0, 0, 1], stack.mysql_port).into()).await;
    let port = relay.port;
    let app = spawn_app_with(|s| relay.carry_mysql_of(s, stack.mysql_port)).await;
    let readyz = || readyz(&app, &app.admin_url);
    let down = |body: &serde_json::Value, why: &str| {
        let mysql = body["dependencies"]["mysql"].as_str().unwrap();
        assert!(mysql.starts_with(why), "{body}");
        assert_eq!(body["dependencies"]["redis"], "up", "{body}");
    };
    let (status, body) = readyz().await;
    assert_eq!(
        (status, &body["dependencies"]["mysql"]),
        (200, &"up".into())
    );

    relay.stall_open_connections();
    let (status, body) = readyz().await;
    assert_eq!(status, 200, "a new connection answers: {body}");

    // A listener that completes handshakes and never speaks, where MariaDB was.
    drop(relay);
    let silent = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let (status, body) = readyz().await;
    assert_eq!(status, 503, "{body}");
    down(&body, "down: no answer within 1000 ms");

    drop(silent);
    let (status, body) = readyz().await;
    assert_eq!(status, 503, "{body}");
    down(&body, "down: ");
    app.stop().await;
}

/// A MariaDB that answers slowly, but within the check's second, keeps the core ready
/// on the kept connection: with every ping 400 ms late (the client's bytes held on the
/// way), five checks in a row are 200. Cutting the kept ping off at 300 ms for a new
/// connection, as the probe did, made every check wait for a new handshake on the slow
/// path, past the second: 503 from a MariaDB that answers. A hundred checks at once
/// share attempts (MariaDB's and RocketMQ's: asked once per check, RocketMQ's name
/// server left some of them unanswered within the second). And when the kept connection
/// is lost on that path, the new one's handshake (four of the client's turns, 1.6 s) is
/// finished past the check that began it and kept, so the core is ready again; cut off
/// with its check, it never was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_keeps_its_connection_to_a_slow_mariadb() {
    let stack = Stack::from_env();
    let relay = stampede_e2e::StallingRelay::start(([127, 0, 0, 1], stack.mysql_port).into()).await;
    let app = spawn_app_with(|s| relay.carry_mysql_of(s, stack.mysql_port)).await;
    let readyz = || readyz(&app, &app.admin_url);
    let up = |(status, body): &(u16, serde_json::Value)| {
        (*status, &body["dependencies"]["mysql"]) == (200, &"up".into())
    };
    let answer = readyz().await;
    assert!(up(&answer), "{answer:?}");

    relay.delay_client_bytes(Duration::from_millis(400));
    for check in 1..=5 {
        let answer = readyz().await;
        assert!(
            up(&answer),
            "check {check} of a MariaDB answering in 400 ms: {answer:?}"
        );
    }
    // A hundred checks at once share attempts: each answered within its second.
    let mut checks = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let (http, url) = (app.http.clone(), format!("{}/readyz", app.admin_url));
        checks.spawn(async move {
            let resp = http.get(url).send().await.unwrap();
            (resp.status().as_u16(), resp.json().await.unwrap())
        });
    }
    let many = checks.join_all().await;
    let down = many.iter().filter(|a| !up(a)).count();
    assert_eq!(
        down,
        0,
        "of 100 checks at once: {:?}",
        many.iter().find(|a| !up(a))
    );

    relay.stall_open_connections();
    let back = eventually(Duration::from_secs(8), || async { up(&readyz().await) }).await;
    assert!(
        back,
        "never ready again on a new connection over the slow path"
    );
    drop(relay);
    app.stop().await;
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

/// A real MariaDB that reports MySQL 8's version (mariadbd --version=8.0.36): the core
/// refuses it by name before the migrations touch it, rather than failing on a syntax
/// error or on the API sessions' unknown max_statement_time.
#[tokio::test]
async fn a_database_server_that_is_not_mariadb_is_refused_by_name_before_any_table() {
    let stack = Stack::from_env();
    let (mut s, _, _) = test_settings(&stack).await;
    let other = OwnMariadb::start_with("--version=8.0.36");
    other.use_in(&mut s);
    let err = match stampede_core::App::build(s.clone().resolve().unwrap()).await {
        Ok(_) => panic!("the core started on a server that says it is MySQL 8.0.36"),
        Err(e) => e,
    };
    assert!(
        matches!(err, stampede_core::BuildError::Dependency(_)),
        "{err}"
    );
    let said = err.to_string();
    assert!(said.contains("\"8.0.36\", not MariaDB"), "{said}");

    let server = mysql_async::Pool::new(other.url().as_str());
    let tables = "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'stampede'";
    assert_eq!(scalar(&server, tables).await, 0, "no migration ran");
    server.disconnect().await.ok();
}

#[tokio::test]
async fn sigterm_stops_the_core_cleanly() {
    let stack = Stack::from_env();
    let (s, database, _) = test_settings(&stack).await;
    let mut core = CoreProcess::spawn(&s).await;
    let status = core.signal("-TERM").await;
    assert!(status.success(), "{status}");
    let http = reqwest::Client::new();
    assert!(
        http.get(format!("{}/healthz", core.admin_url))
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
