//! The end-to-end harness. `make test` starts a disposable stack (Redis, MariaDB, the
//! RocketMQ name server and broker, a core and the edge) under `.stack-test/` on its own
//! ports; every test then builds its own core in-process on free ports, with its own
//! MariaDB database and Redis key prefix, so tests run in parallel without sharing state.

use std::path::PathBuf;
use std::time::Duration;

use mysql_async::prelude::*;
use rand::Rng;
use serde_json::Value;
use stampede_core::keys::Keys;
use stampede_core::{App, Settings, Stopper};

pub use stampede_core::Settings as CoreSettings;

/// Where the test stack listens; the defaults match `make test`'s profile.
pub struct Stack {
    pub dir: PathBuf,
    pub redis_port: u16,
    pub mysql_port: u16,
    pub namesrv_port: u16,
    pub edge_port: u16,
    pub admin_port: u16,
    /// The stack core's public port (behind the edge).
    pub core_port: u16,
    /// The edge's loopback-only ops server.
    pub ops_port: u16,
    /// The payment provider simulator (a tool, never behind the edge).
    pub paysim_port: u16,
}

fn env_port(name: &str, default: u16) -> u16 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The repository's root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

impl Stack {
    pub fn from_env() -> Stack {
        Stack {
            dir: std::env::var("STACK_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|_| root().join(".stack-test")),
            redis_port: env_port("REDIS_PORT", 16379),
            mysql_port: env_port("MYSQL_PORT", 13306),
            namesrv_port: env_port("NAMESRV_PORT", 19876),
            edge_port: env_port("EDGE_PORT", 18080),
            admin_port: env_port("ADMIN_PORT", 19091),
            core_port: env_port("CORE_PORT", 18081),
            ops_port: env_port("OPS_PORT", 18082),
            paysim_port: env_port("PAYSIM_PORT", 18092),
        }
    }

    pub fn secret(&self, name: &str) -> String {
        let path = self.dir.join(name);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e}. The end-to-end tests need the test stack: run `make test`, \
                     or `make test-stack-up` before `cargo test`",
                    path.display()
                )
            })
            .trim()
            .to_owned()
    }

    pub fn mysql_url(&self, database: &str) -> String {
        format!(
            "mysql://stampede:{}@127.0.0.1:{}/{database}",
            self.secret("mysql.password"),
            self.mysql_port
        )
    }
}

/// A core of the test's own, running in-process.
pub struct TestApp {
    pub admin_api: AdminClient,
    pub admin_url: String,
    pub public_url: String,
    pub admin_token: String,
    pub token_secret: String,
    pub database: String,
    pub prefix: String,
    pub mysql: mysql_async::Pool,
    pub redis: redis::aio::MultiplexedConnection,
    pub http: reqwest::Client,
    /// The settings it runs with (for a process of the same configuration).
    pub settings: Settings,
    stopper: Stopper,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// Settings for a core of its own: free ports, a fresh database, a fresh key prefix.
pub async fn test_settings(stack: &Stack) -> (Settings, String, String) {
    let tag: u64 = rand::thread_rng().gen_range(0..u64::from(u32::MAX));
    let database = format!("stampede_t_{tag}");
    let prefix = format!("t{tag}:");
    let server = mysql_async::Pool::new(stack.mysql_url("stampede").as_str());
    server
        .get_conn()
        .await
        .expect("the test stack's MariaDB answers")
        .query_drop(format!("CREATE DATABASE `{database}`"))
        .await
        .expect("create the test database");
    server.disconnect().await.ok();

    let mut s = Settings::defaults();
    s.server.public_addr = "127.0.0.1:0".into();
    s.server.admin_addr = "127.0.0.1:0".into();
    s.server.shutdown_grace_s = 2;
    s.redis.url = format!("redis://127.0.0.1:{}/", stack.redis_port);
    s.redis.key_prefix = prefix.clone();
    s.mysql.url = format!("mysql://stampede@127.0.0.1:{}/{database}", stack.mysql_port);
    s.mysql.password = Some(stack.secret("mysql.password").into());
    s.mysql.pool_max = 8;
    s.rocketmq.namesrv_addr = format!("127.0.0.1:{}", stack.namesrv_port);
    s.rocketmq.namespace = format!("t{tag}-");
    // Most tests look at reservations in the stream; the pipeline tests turn this on.
    s.orders.enabled = false;
    s.orders.claim_idle_ms = 2_000;
    s.auth.admin_token = Some(format!("admin-{tag:016x}-token").into());
    s.auth.token_secret = Some(format!("secret-{tag:016x}-key").into());
    s.payments.provider_secret = Some(format!("provider-{tag:016x}-key").into());
    s.startup.connect_timeout_s = 10;
    s.preload.interval_s = 1;
    (s, database, prefix)
}

/// Builds and starts a core against the test stack.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Like [`spawn_app`], with the settings adjusted first.
pub async fn spawn_app_with(adjust: impl FnOnce(&mut Settings)) -> TestApp {
    let stack = Stack::from_env();
    let (mut settings, database, prefix) = test_settings(&stack).await;
    adjust(&mut settings);
    spawn_app_on(settings, database, prefix).await
}

/// A core on a database and key prefix that exist already (a second core of a test).
pub async fn spawn_app_on(settings: Settings, database: String, prefix: String) -> TestApp {
    let stack = Stack::from_env();
    if std::env::var_os("TEST_LOG").is_some() {
        // The cores' logs on the test's output, for debugging a failure by hand.
        static INIT: std::sync::Once = std::sync::Once::new();
        INIT.call_once(|| stampede_core::telemetry::init(&settings.log));
    }
    let resolved = settings.clone().resolve().expect("test settings are valid");
    let app = App::build(resolved)
        .await
        .expect("the core starts against the test stack");
    let admin_url = format!("http://127.0.0.1:{}", app.admin_port());
    let public_url = format!("http://127.0.0.1:{}", app.public_port());
    let stopper = app.stopper();
    let task = tokio::spawn(app.run_until_stopped());
    let mysql = mysql_async::Pool::new(stack.mysql_url(&database).as_str());
    let redis = redis::Client::open(settings.redis.url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("Redis of the test stack");
    use secrecy::ExposeSecret;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let admin_token = settings
        .auth
        .admin_token
        .clone()
        .unwrap()
        .expose_secret()
        .to_owned();
    TestApp {
        admin_api: AdminClient {
            http: http.clone(),
            url: admin_url.clone(),
            token: admin_token,
        },
        admin_url,
        public_url,
        admin_token: settings
            .auth
            .admin_token
            .as_ref()
            .unwrap()
            .expose_secret()
            .to_owned(),
        token_secret: settings
            .auth
            .token_secret
            .as_ref()
            .unwrap()
            .expose_secret()
            .to_owned(),
        database,
        prefix,
        mysql,
        redis,
        http,
        settings,
        stopper,
        task,
    }
}

/// An admin API with its token.
#[derive(Clone)]
pub struct AdminClient {
    pub http: reqwest::Client,
    pub url: String,
    pub token: String,
}

impl AdminClient {
    /// An admin call with the admin token; returns status and JSON body.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.expect("the admin API answers");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    /// Creates an event; returns its id and its category ids in order.
    pub async fn create_event(&self, body: Value) -> (u64, Vec<u64>) {
        let (status, created) = self.post("/admin/events", body).await;
        assert_eq!(status, 201, "{created}");
        let categories = created["categories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_u64().unwrap())
            .collect();
        (created["event_id"].as_u64().unwrap(), categories)
    }

    /// Publishes an event; returns the answer's body.
    pub async fn publish(&self, event_id: u64) -> Value {
        let (status, body) = self
            .post(&format!("/admin/events/{event_id}/publish"), Value::Null)
            .await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// `count` new users with tokens valid for an hour.
    pub async fn buyers(&self, count: u64) -> Vec<Buyer> {
        let (status, users) = self
            .post("/admin/users", serde_json::json!({"count": count}))
            .await;
        assert_eq!(status, 201, "{users}");
        let first = users["first_user_id"].as_u64().unwrap();
        let (status, tokens) = self
            .post(
                "/admin/tokens",
                serde_json::json!({"first_user_id": first, "count": count, "ttl_s": 3600}),
            )
            .await;
        assert_eq!(status, 200, "{tokens}");
        tokens["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, t)| Buyer {
                user_id: first + i as u64,
                token: t.as_str().unwrap().to_owned(),
            })
            .collect()
    }
}

impl std::ops::Deref for TestApp {
    type Target = AdminClient;
    fn deref(&self) -> &AdminClient {
        &self.admin_api
    }
}

impl TestApp {
    /// One number from MariaDB.
    pub async fn count(&self, sql: &str) -> u64 {
        let mut conn = self.mysql.get_conn().await.unwrap();
        conn.query_first::<u64, _>(sql).await.unwrap().unwrap_or(0)
    }

    /// The event's status column in MySQL.
    pub async fn event_status(&self, event_id: u64) -> String {
        let mut conn = self.mysql.get_conn().await.unwrap();
        conn.exec_first("SELECT status FROM event WHERE id = ?", (event_id,))
            .await
            .unwrap()
            .unwrap_or_default()
    }

    /// Units Redis still has for a category.
    pub async fn stock(&self, event_id: u64, category_id: u64) -> i64 {
        stock_in(&self.redis, self.keys().stock(event_id), category_id).await
    }

    /// Reservations in the event's stream, not yet settled.
    pub async fn stream_len(&self, event_id: u64) -> u64 {
        let key = self.keys().order_stream(event_id);
        redis::AsyncCommands::xlen(&mut self.redis.clone(), key)
            .await
            .unwrap()
    }

    /// This app's Redis keys, under its prefix: the core's own layout.
    pub fn keys(&self) -> Keys {
        Keys::new(&self.prefix)
    }

    /// Stops the core and waits for its drain; the database stays.
    pub async fn halt(self) {
        self.stopper.stop();
        self.task
            .await
            .expect("core task")
            .expect("core stops cleanly");
        self.mysql.disconnect().await.ok();
    }

    /// Stops the core, waits for its drain, and drops the test database.
    pub async fn stop(self) {
        self.stopper.stop();
        self.task
            .await
            .expect("core task")
            .expect("core stops cleanly");
        let mut conn = self.mysql.get_conn().await.unwrap();
        conn.query_drop(format!("DROP DATABASE `{}`", self.database))
            .await
            .unwrap();
        drop(conn);
        self.mysql.disconnect().await.ok();
    }
}

/// A concert with one unseated and one seated category, selling now.
pub fn concert() -> Value {
    serde_json::json!({
        "title": "Concert", "venue": "Arena",
        "show_time": "2031-06-01T20:00:00Z",
        "sale_start": "2020-01-01T00:00:00Z", "sale_end": "2031-06-01T12:00:00Z",
        "per_user_limit": 4, "pay_timeout_s": 900,
        "categories": [
            {"name": "GA", "price_cents": 5000, "quantity": 300},
            {"name": "Seated", "price_cents": 9000, "seats": {"rows": 10, "cols": 20}},
        ],
    })
}

/// Polls `check` every 100 ms until it holds or `within` passes; whether it held.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `stampede` binary the tests run as a process (`cargo build -p stampede-core`).
pub fn core_binary() -> PathBuf {
    std::env::var("STAMPEDE_BIN")
        .map(Into::into)
        .unwrap_or_else(|_| root().join("target/debug/stampede"))
}

/// The payment provider simulator (`cargo build -p stampede-paysim`, built by the stack).
pub fn paysim_binary() -> PathBuf {
    core_binary().with_file_name("stampede-paysim")
}

/// The `STAMPEDE_*` variables that configure a core process like `s`, listening on
/// `admin` and `public`.
pub fn core_env(s: &Settings, admin: u16, public: u16) -> Vec<(String, String)> {
    use secrecy::ExposeSecret;
    let env: Vec<(String, String)> = vec![
        (
            "STAMPEDE_SERVER__PUBLIC_ADDR",
            format!("127.0.0.1:{public}"),
        ),
        ("STAMPEDE_SERVER__ADMIN_ADDR", format!("127.0.0.1:{admin}")),
        ("STAMPEDE_REDIS__URL", s.redis.url.clone()),
        ("STAMPEDE_REDIS__KEY_PREFIX", s.redis.key_prefix.clone()),
        ("STAMPEDE_MYSQL__URL", s.mysql.url.clone()),
        (
            "STAMPEDE_MYSQL__PASSWORD",
            s.mysql
                .password
                .as_ref()
                .unwrap()
                .expose_secret()
                .to_owned(),
        ),
        (
            "STAMPEDE_ROCKETMQ__NAMESRV_ADDR",
            s.rocketmq.namesrv_addr.clone(),
        ),
        ("STAMPEDE_ROCKETMQ__NAMESPACE", s.rocketmq.namespace.clone()),
        (
            "STAMPEDE_AUTH__ADMIN_TOKEN",
            s.auth
                .admin_token
                .as_ref()
                .unwrap()
                .expose_secret()
                .to_owned(),
        ),
        (
            "STAMPEDE_AUTH__TOKEN_SECRET",
            s.auth
                .token_secret
                .as_ref()
                .unwrap()
                .expose_secret()
                .to_owned(),
        ),
        ("STAMPEDE_ORDERS__ENABLED", s.orders.enabled.to_string()),
        (
            "STAMPEDE_ORDERS__CLAIM_IDLE_MS",
            s.orders.claim_idle_ms.to_string(),
        ),
        (
            "STAMPEDE_ADMISSION__USER_PER_S",
            s.admission.user_per_s.to_string(),
        ),
        ("STAMPEDE_LOG__FILTER", "warn".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    env
}

/// The core as a process of its own, configured from a test's settings through
/// `STAMPEDE_*` variables, so a test can SIGTERM it, kill -9 it and start it again.
pub struct CoreProcess {
    child: tokio::process::Child,
    env: Vec<(String, String)>,
    pub admin_url: String,
    pub public_url: String,
}

impl CoreProcess {
    pub async fn spawn(s: &Settings) -> CoreProcess {
        let (admin, public) = (free_port(), free_port());
        let env = core_env(s, admin, public);
        let mut core = CoreProcess {
            child: Self::start(&env),
            env,
            admin_url: format!("http://127.0.0.1:{admin}"),
            public_url: format!("http://127.0.0.1:{public}"),
        };
        core.wait_healthy().await;
        core
    }

    fn start(env: &[(String, String)]) -> tokio::process::Child {
        tokio::process::Command::new(core_binary())
            .arg("serve")
            .envs(env.iter().cloned())
            .kill_on_drop(true)
            .spawn()
            .expect("the stampede binary (cargo build -p stampede-core)")
    }

    pub async fn wait_healthy(&mut self) {
        let http = reqwest::Client::new();
        let url = format!("{}/healthz", self.admin_url);
        let up = eventually(Duration::from_secs(30), || async {
            http.get(&url).send().await.is_ok()
        })
        .await;
        assert!(up, "the core did not start");
    }

    pub fn pid(&self) -> String {
        self.child.id().expect("running").to_string()
    }

    /// Sends `signal` (e.g. "-TERM", "-KILL") and waits for the process to end.
    pub async fn signal(&mut self, signal: &str) -> std::process::ExitStatus {
        let pid = self.pid();
        assert!(
            std::process::Command::new("kill")
                .args([signal, &pid])
                .status()
                .unwrap()
                .success()
        );
        tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .expect("the core ended within 15 s")
            .unwrap()
    }

    /// Starts it again with the same configuration and ports.
    pub async fn restart(&mut self) {
        self.child = Self::start(&self.env);
        self.wait_healthy().await;
    }
}

/// A RocketMQ name server and broker of the test's own, run by `scripts/stack.sh`, so a
/// test can stop and start them without disturbing others.
pub struct OwnBroker {
    pub dir: PathBuf,
    pub namesrv_port: u16,
    pub broker_port: u16,
}

impl OwnBroker {
    pub fn start() -> OwnBroker {
        let b = OwnBroker {
            dir: std::env::temp_dir().join(format!("stampede-broker-{}", free_port())),
            namesrv_port: free_port(),
            broker_port: free_broker_port(),
        };
        let up = b.stack(&["up", "namesrv", "broker"]);
        assert!(
            up.status.success(),
            "{}",
            String::from_utf8_lossy(&up.stderr)
        );
        b
    }

    pub fn namesrv_addr(&self) -> String {
        format!("127.0.0.1:{}", self.namesrv_port)
    }

    /// `scripts/stack.sh ARGS` on this stack.
    pub fn stack(&self, args: &[&str]) -> std::process::Output {
        own_stack(
            &self.dir,
            &[
                ("NAMESRV_PORT", self.namesrv_port),
                ("BROKER_PORT", self.broker_port),
            ],
            args,
        )
    }

    pub fn stop_broker(&self) {
        assert!(self.stack(&["down", "broker"]).status.success());
    }

    pub fn start_broker(&self) {
        let up = self.stack(&["up", "broker"]);
        assert!(
            up.status.success(),
            "{}",
            String::from_utf8_lossy(&up.stderr)
        );
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        self.stack(&["down"]);
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// `scripts/stack.sh ARGS` for parts of a test's own under `dir`, on `ports`; the
/// other parts point at closed ports.
fn own_stack(dir: &std::path::Path, ports: &[(&str, u16)], args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(root().join("scripts/stack.sh"));
    cmd.args(args).env("STACK_DIR", dir);
    for part in [
        "NAMESRV_PORT",
        "BROKER_PORT",
        "REDIS_PORT",
        "MYSQL_PORT",
        "EDGE_PORT",
        "CORE_PORT",
        "ADMIN_PORT",
        "OPS_PORT",
        "PAYSIM_PORT",
    ] {
        cmd.env(part, "1");
    }
    for (part, port) in ports {
        cmd.env(part, port.to_string());
    }
    cmd.output().expect("scripts/stack.sh runs")
}

/// A Redis of the test's own, so a test may FLUSHALL it.
pub struct OwnRedis {
    pub dir: PathBuf,
    pub port: u16,
}

impl OwnRedis {
    pub fn start() -> OwnRedis {
        let r = OwnRedis {
            dir: std::env::temp_dir().join(format!("stampede-redis-{}", free_port())),
            port: free_port(),
        };
        let up = own_stack(&r.dir, &[("REDIS_PORT", r.port)], &["up", "redis"]);
        assert!(
            up.status.success(),
            "{}",
            String::from_utf8_lossy(&up.stderr)
        );
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        own_stack(&self.dir, &[("REDIS_PORT", self.port)], &["down"]);
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// A port for a broker: it also takes port-2, port+1 and port+3.
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

/// Ports that were free a moment ago (bound to 0, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A buyer: a user id and a signed token, from the admin API.
pub struct Buyer {
    pub user_id: u64,
    pub token: String,
}

impl TestApp {
    /// A purchase through this core's public port: status and body.
    pub async fn buy(&self, event_id: u64, buyer: &Buyer, key: &str, body: Value) -> (u16, Value) {
        purchase(
            &self.http,
            &self.public_url,
            event_id,
            &buyer.token,
            key,
            body,
        )
        .await
    }
}

/// A category's units in an event's stock hash `key`.
async fn stock_in(redis: &redis::aio::MultiplexedConnection, key: String, category_id: u64) -> i64 {
    redis::AsyncCommands::hget(&mut redis.clone(), key, category_id)
        .await
        .unwrap()
}

/// `POST {base}/api/events/{id}/orders` with a token and an Idempotency-Key.
pub async fn purchase(
    http: &reqwest::Client,
    base: &str,
    event_id: u64,
    token: &str,
    key: &str,
    body: Value,
) -> (u16, Value) {
    let resp = http
        .post(format!("{base}/api/events/{event_id}/orders"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .expect("the purchase gets an answer");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Held by the tests that fire thousands of requests, so two of them never share the
/// machine's two cores: overlapping, they starve the cores they test.
pub async fn heavy() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}

/// The test stack's own core and edge (ports of `make test`), shared by the edge tests.
pub struct StackApp {
    pub admin: AdminClient,
    /// The stack core's database.
    pub mysql: mysql_async::Pool,
    pub edge_url: String,
    pub redis: redis::aio::MultiplexedConnection,
    pub http: reqwest::Client,
}

/// The stack's core and edge, and the lock every test that uses them holds: they share
/// one edge, whose limits a test may change.
pub async fn stack_app() -> (StackApp, tokio::sync::MutexGuard<'static, ()>) {
    static EDGE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let guard = EDGE.lock().await;
    let stack = Stack::from_env();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(512)
        .build()
        .unwrap();
    let app = StackApp {
        mysql: mysql_async::Pool::new(stack.mysql_url("stampede").as_str()),
        admin: AdminClient {
            http: http.clone(),
            url: format!("http://127.0.0.1:{}", stack.admin_port),
            token: stack.secret("admin.token"),
        },
        edge_url: format!("http://127.0.0.1:{}", stack.edge_port),
        redis: redis::Client::open(format!("redis://127.0.0.1:{}/", stack.redis_port).as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("the test stack's Redis"),
        http,
    };
    (app, guard)
}

impl StackApp {
    /// The stack core's Redis keys: the core's own layout, under the default prefix.
    pub fn keys(&self) -> Keys {
        Keys::new(&Settings::defaults().redis.key_prefix)
    }

    /// Units Redis still has for a category.
    pub async fn stock(&self, event_id: u64, category_id: u64) -> i64 {
        stock_in(&self.redis, self.keys().stock(event_id), category_id).await
    }

    /// A purchase through the edge.
    pub async fn buy(&self, event_id: u64, buyer: &Buyer, key: &str, body: Value) -> (u16, Value) {
        purchase(
            &self.http,
            &self.edge_url,
            event_id,
            &buyer.token,
            key,
            body,
        )
        .await
    }
}

/// The order shards of the tests' cores (mysql.order_shards, 4 by default).
pub const TEST_SHARDS: u32 = 4;

/// `select` over every order shard, as one UNION ALL; `{n}` in it stands for the shard.
pub fn over_shards(select: &str) -> String {
    (0..TEST_SHARDS)
        .map(|n| select.replace("{n}", &n.to_string()))
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
}

/// Units in orders of `event_id` over every order shard, and in how many orders.
pub async fn ordered_units(mysql: &mysql_async::Pool, event_id: u64) -> (u64, u64) {
    let union = over_shards(&format!(
        "SELECT quantity FROM `order_{{n}}` WHERE event_id = {event_id}"
    ));
    let mut conn = mysql.get_conn().await.unwrap();
    let row: Option<(Option<u64>, u64)> = conn
        .query_first(format!(
            "SELECT CAST(SUM(quantity) AS UNSIGNED), COUNT(*) FROM ({union}) o"
        ))
        .await
        .unwrap();
    row.map(|(units, orders)| (units.unwrap_or(0), orders))
        .unwrap_or((0, 0))
}

/// One number from a database.
pub async fn scalar(mysql: &mysql_async::Pool, sql: &str) -> i64 {
    let mut conn = mysql.get_conn().await.unwrap();
    conn.query_first::<Option<i64>, _>(sql)
        .await
        .unwrap()
        .flatten()
        .unwrap_or(0)
}

/// A small event on sale now: `units` unseated units and a rows × cols seated block.
pub fn small_sale(units: u32, rows: u32, cols: u32, per_user_limit: u32) -> Value {
    serde_json::json!({
        "title": "Small sale", "venue": "Loopback",
        "show_time": "2031-06-01T20:00:00Z",
        "sale_start": "2020-01-01T00:00:00Z", "sale_end": "2031-06-01T12:00:00Z",
        "per_user_limit": per_user_limit, "pay_timeout_s": 900,
        "categories": [
            {"name": "GA", "price_cents": 5000, "quantity": units},
            {"name": "Seated", "price_cents": 9000, "seats": {"rows": rows, "cols": cols}},
        ],
    })
}

/// An answer read off the wire: status, headers (names lower-cased), body.
#[derive(Debug)]
pub struct RawAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl RawAnswer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// One HTTP/1.1 request written byte for byte — the path exactly as given, which an
/// HTTP client would normalise — to 127.0.0.1:`port`, and its answer.
pub async fn raw_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> RawAnswer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    req.push_str("Connection: close\r\n");
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut raw))
        .await
        .expect("an answer within 20 s")
        .ok();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect::<Vec<_>>();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    RawAnswer {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}
