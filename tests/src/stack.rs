//! Where the test stack listens, its secrets, and the repository's root.

use std::path::PathBuf;

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
