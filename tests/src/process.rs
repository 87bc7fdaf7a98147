//! The core and the payment simulator as processes of their own.

use std::path::PathBuf;
use std::time::Duration;

use stampede_core::Settings;
use stampede_core::config::RedisMode;

use crate::own_stack::free_port;
use crate::stack::root;
use crate::wait::eventually;

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
        (
            "STAMPEDE_REDIS__MODE",
            match s.redis.mode {
                RedisMode::Single => "single",
                RedisMode::Cluster => "cluster",
            }
            .to_owned(),
        ),
        ("STAMPEDE_REDIS__NODES", s.redis.nodes.join(",")),
        (
            "STAMPEDE_REDIS__WAIT_REPLICAS",
            s.redis.wait_replicas.to_string(),
        ),
        (
            "STAMPEDE_REDIS__WAIT_TIMEOUT_MS",
            s.redis.wait_timeout_ms.to_string(),
        ),
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
