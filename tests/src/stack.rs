//! Where the test stack listens, its secrets, and the repository's root.

use std::path::PathBuf;

use stampede_core::config::{RedisMode, RedisSettings};

/// Where the test stack listens; the defaults match `make test`'s profile.
pub struct Stack {
    pub dir: PathBuf,
    /// The single Redis (`STACK_MODE=single`, the default).
    pub redis_port: u16,
    /// `STACK_MODE=cluster`: the stack's Redis Cluster, its first node's port (the six
    /// nodes are on it … +5) — `make test-cluster`.
    pub redis_cluster_port: Option<u16>,
    pub mysql_port: u16,
    pub namesrv_port: u16,
    pub edge_port: u16,
    /// The cluster stack's second edge (`EDGE2_PORT`, 18084).
    pub edge2_port: Option<u16>,
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
        let cluster = std::env::var("STACK_MODE").as_deref() == Ok("cluster");
        Stack {
            dir: std::env::var("STACK_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|_| root().join(".stack-test")),
            redis_port: env_port("REDIS_PORT", 16379),
            redis_cluster_port: cluster.then(|| env_port("REDIS_CLUSTER_PORT", 17001)),
            mysql_port: env_port("MYSQL_PORT", 13306),
            namesrv_port: env_port("NAMESRV_PORT", 19876),
            edge_port: env_port("EDGE_PORT", 18080),
            edge2_port: cluster.then(|| env_port("EDGE2_PORT", 18084)),
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

    /// How a core reaches the stack's Redis: the single one, or the cluster's nodes.
    pub fn redis_settings(&self) -> RedisSettings {
        let mut s = stampede_core::Settings::defaults().redis;
        s.url = format!("redis://127.0.0.1:{}/", self.redis_port);
        if let Some(first) = self.redis_cluster_port {
            s.mode = RedisMode::Cluster;
            // As the cluster stack's cores: a 202 once a replica has it.
            s.wait_replicas = 1;
            s.nodes = (first..first + 6)
                .map(|p| format!("redis://127.0.0.1:{p}/"))
                .collect();
        }
        s
    }

    /// A connection to the stack's Redis, single or cluster, as the core makes it.
    pub async fn redis(&self) -> stampede_core::infra::redis::Redis {
        connect_redis(&self.redis_settings()).await
    }

    pub fn mysql_url(&self, database: &str) -> String {
        format!(
            "mysql://stampede:{}@127.0.0.1:{}/{database}",
            self.secret("mysql.password"),
            self.mysql_port
        )
    }
}

/// A connection as the core makes it (single or cluster, as `settings` say).
pub async fn connect_redis(settings: &RedisSettings) -> stampede_core::infra::redis::Redis {
    stampede_core::infra::redis::connect(settings, std::time::Duration::from_secs(10))
        .await
        .expect("the test stack's Redis answers")
}
