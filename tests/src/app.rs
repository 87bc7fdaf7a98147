//! A core of the test's own, in-process: its settings, start and stop, what it reads.

use std::time::Duration;

use mysql_async::prelude::*;
use rand::Rng;
use serde_json::Value;
use stampede_core::config::RedisSettings;
use stampede_core::keys::{Bucket, Keys};
use stampede_core::{App, Settings, Stopper, TestFaults};

use crate::admin::AdminClient;
use crate::buyers::{Buyer, purchase};
use crate::stack::Stack;

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
    pub redis: stampede_core::infra::redis::Redis,
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
    crate::sql::create_database(&server, &database).await;
    server.disconnect().await.ok();

    let mut s = Settings::defaults();
    s.server.public_addr = "127.0.0.1:0".into();
    s.server.admin_addr = "127.0.0.1:0".into();
    s.server.shutdown_grace_s = 2;
    s.redis = RedisSettings {
        key_prefix: prefix.clone(),
        ..stack.redis_settings()
    };
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
    spawn_faulty_app(adjust, TestFaults::default()).await
}

/// Like [`spawn_app_with`], with faults only a test can inject.
pub async fn spawn_faulty_app(adjust: impl FnOnce(&mut Settings), faults: TestFaults) -> TestApp {
    let stack = Stack::from_env();
    let (mut settings, database, prefix) = test_settings(&stack).await;
    adjust(&mut settings);
    spawn_app_on_with(settings, database, prefix, faults).await
}

/// A core on a database and key prefix that exist already (a second core of a test).
pub async fn spawn_app_on(settings: Settings, database: String, prefix: String) -> TestApp {
    spawn_app_on_with(settings, database, prefix, TestFaults::default()).await
}

async fn spawn_app_on_with(
    settings: Settings,
    database: String,
    prefix: String,
    faults: TestFaults,
) -> TestApp {
    let stack = Stack::from_env();
    if std::env::var_os("TEST_LOG").is_some() {
        // The cores' logs on the test's output, for debugging a failure by hand.
        static INIT: std::sync::Once = std::sync::Once::new();
        INIT.call_once(|| stampede_core::telemetry::init(&settings.log));
    }
    let resolved = settings.clone().resolve().expect("test settings are valid");
    let app = App::build(resolved)
        .await
        .expect("the core starts against the test stack")
        .inject(faults);
    let admin_url = format!("http://127.0.0.1:{}", app.admin_port());
    let public_url = format!("http://127.0.0.1:{}", app.public_port());
    let stopper = app.stopper();
    let task = tokio::spawn(app.run_until_stopped());
    let mysql = mysql_async::Pool::new(stack.mysql_url(&database).as_str());
    let redis = crate::stack::connect_redis(&settings.redis).await;
    use secrecy::ExposeSecret;
    // The core closes a connection idle for its header read timeout (10 s): one kept
    // longer may be closed under the next request.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_idle_timeout(Duration::from_secs(5))
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

impl std::ops::Deref for TestApp {
    type Target = AdminClient;
    fn deref(&self) -> &AdminClient {
        &self.admin_api
    }
}

impl TestApp {
    /// Up to `count` new reservations of `bucket`'s stream, read as an order worker named
    /// `consumer` reads them (its consumer group made if missing): they are then pending
    /// for it, as a batch's are.
    pub async fn read_reservations(
        &self,
        bucket: stampede_core::keys::Bucket,
        consumer: &str,
        count: usize,
    ) -> Vec<stampede_core::orders::reservation::Reservation> {
        use stampede_core::orders::redis as stream;
        let (keys, mut redis) = (self.keys(), self.redis.clone());
        stream::ensure_group(&mut redis, &keys, bucket)
            .await
            .unwrap();
        let entries = stream::read(
            &mut redis,
            &keys,
            bucket,
            consumer,
            count,
            stream::Entries::New,
        )
        .await
        .unwrap();
        entries
            .iter()
            .map(|e| stampede_core::orders::reservation::Reservation::from_entry(e).unwrap())
            .collect()
    }

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

    /// Units Redis still has for a category (of an event of one bucket).
    pub async fn stock(&self, event_id: u64, category_id: u64) -> i64 {
        stock_in(
            &self.redis,
            self.keys().stock(Bucket::only(event_id)),
            category_id,
        )
        .await
    }

    /// Reservations in the event's stream, not yet settled.
    pub async fn stream_len(&self, event_id: u64) -> u64 {
        let key = self.keys().order_stream(Bucket::only(event_id));
        redis::AsyncCommands::xlen(&mut self.redis.clone(), key)
            .await
            .unwrap()
    }

    /// This app's Redis keys, under its prefix: the core's own layout.
    pub fn keys(&self) -> Keys {
        Keys::new(&self.prefix)
    }

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

    /// [`TestApp::buy`] again with the same Idempotency-Key while the core answers 503
    /// (busy, reloading its keys, a shard failing over), until `deadline`: the first
    /// other answer, or None if every one before the deadline was 503.
    pub async fn buy_while_busy(
        &self,
        event_id: u64,
        buyer: &Buyer,
        key: &str,
        body: Value,
        deadline: std::time::Instant,
    ) -> Option<(u16, Value)> {
        while std::time::Instant::now() < deadline {
            let answer = self.buy(event_id, buyer, key, body.clone()).await;
            if answer.0 != 503 {
                return Some(answer);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// The buyer's latest purchase in the event, as `GET …/orders/status` answers it
    /// (`{"status": …}`, or the 404 error body).
    pub async fn purchase_status(&self, event_id: u64, buyer: &Buyer) -> Value {
        self.purchase_status_asked(event_id, buyer, "", None)
            .await
            .1
    }

    /// `GET …/orders/status[?<query>]` as the buyer (one purchase: `request_id=<n>`, or
    /// the one an `Idempotency-Key` admitted): status and body.
    pub async fn purchase_status_asked(
        &self,
        event_id: u64,
        buyer: &Buyer,
        query: &str,
        key: Option<&str>,
    ) -> (u16, Value) {
        let mut url = format!("{}/api/events/{event_id}/orders/status", self.public_url);
        if !query.is_empty() {
            url = format!("{url}?{query}");
        }
        let mut ask = self.http.get(url).bearer_auth(&buyer.token);
        if let Some(key) = key {
            ask = ask.header("Idempotency-Key", key);
        }
        let answer = ask.send().await.unwrap();
        (answer.status().as_u16(), answer.json().await.unwrap())
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

/// A category's units in an event's stock hash `key`.
pub(crate) async fn stock_in(
    redis: &stampede_core::infra::redis::Redis,
    key: String,
    category_id: u64,
) -> i64 {
    redis::AsyncCommands::hget(&mut redis.clone(), key, category_id)
        .await
        .unwrap()
}
