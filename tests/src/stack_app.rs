//! The test stack's own core and edge, which the edge tests share.

use std::time::Duration;

use serde_json::Value;
use stampede_core::Settings;
use stampede_core::keys::{Bucket, Keys};

use crate::admin::AdminClient;
use crate::app::stock_in;
use crate::buyers::{Buyer, purchase};
use crate::stack::Stack;

/// The test stack's own core and edge (ports of `make test`), shared by the edge tests.
pub struct StackApp {
    pub admin: AdminClient,
    /// The stack core's database.
    pub mysql: mysql_async::Pool,
    pub edge_url: String,
    pub redis: stampede_core::infra::redis::Redis,
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
        redis: stack.redis().await,
        http,
    };
    (app, guard)
}

impl StackApp {
    /// The stack core's Redis keys: the core's own layout, under the default prefix.
    pub fn keys(&self) -> Keys {
        Keys::new(&Settings::defaults().redis.key_prefix)
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
