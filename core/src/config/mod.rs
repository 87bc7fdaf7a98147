//! Typed, layered configuration, validated before any port is bound.
//!
//! Layers, later wins: `config/stampede.toml` (built in), an optional file, then
//! `STAMPEDE_<SECTION>__<KEY>` environment variables. `resolve` turns them into what
//! the services need.

mod resolve;

pub use resolve::Resolved;

use std::path::{Path, PathBuf};

use secrecy::SecretString;
use serde::Deserialize;

const DEFAULTS: &str = include_str!("../../../config/stampede.toml");

/// Everything the core reads at start-up.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub redis: RedisSettings,
    pub mysql: MysqlSettings,
    pub rocketmq: RocketmqSettings,
    pub auth: AuthSettings,
    pub payments: PaymentSettings,
    pub admission: AdmissionSettings,
    pub login: LoginSettings,
    pub orders: OrderSettings,
    pub ids: IdSettings,
    pub startup: StartupSettings,
    pub preload: PreloadSettings,
    pub reconcile: ReconcileSettings,
    pub log: LogSettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Public API address, reached through the edge.
    pub public_addr: String,
    /// Admin API address; loopback only in the shipped config.
    pub admin_addr: String,
    /// How long in-flight requests may run after a stop signal.
    pub shutdown_grace_s: u64,
    /// Cap on request bodies, so a client cannot make the core buffer megabytes.
    pub max_body_bytes: usize,
    /// Open connections per listener; more wait in the kernel's accept queue.
    pub max_connections: usize,
    /// Longest a client may take to send a request's headers, then its body.
    pub read_timeout_ms: u64,
    /// Longest a request may take from its headers to its answer (503 beyond).
    pub request_timeout_ms: u64,
    /// Threads of the runtime that serves the APIs and runs the pipeline; 0: one per
    /// CPU (`MAX_WORKER_THREADS` at most).
    pub worker_threads: usize,
}

/// The most runtime threads `server.worker_threads` may ask for.
pub const MAX_WORKER_THREADS: usize = 256;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// `single`: one Redis (or a primary behind a proxy) at `url`; `cluster`: a Redis
    /// Cluster found through the seed `nodes`.
    pub mode: RedisMode,
    /// The Redis of `single` mode.
    pub url: String,
    /// `cluster` mode's seed nodes (any few of the cluster's nodes; the rest are found
    /// through them). From the environment: `STAMPEDE_REDIS__NODES=url1,url2,…`.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// A 202 waits until this many replicas have the admission (Redis WAIT, in groups
    /// per event); 0: answered on the master's word.
    pub wait_replicas: u32,
    /// How long an admission waits for them; past it, 202 on the master's word (logged).
    pub wait_timeout_ms: u64,
    /// Prefix of every key, so tests and several deployments can share one Redis.
    pub key_prefix: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    Single,
    Cluster,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MysqlSettings {
    /// URL without the password (it would end up in logs).
    pub url: String,
    pub password: Option<SecretString>,
    pub password_file: Option<PathBuf>,
    /// Connections of the pool the order pipeline, the broker's listeners, the event
    /// cache, the preload and the sweeps share.
    pub pool_max: usize,
    /// Connections of the API requests' own pool: logins, order views, cancels,
    /// payments, the admin API and readiness. Apart from `pool_max`'s, so requests
    /// waiting on MySQL never hold a connection order creation needs, nor the reverse.
    pub api_pool_max: usize,
    /// Longest the pipeline, the broker's listeners, the event cache and the sweeps wait
    /// for one MySQL call (a batch's transaction, a check-back, an event's read) before
    /// they give up on it and its connection (`infra::mysql::CallTimeout`).
    pub call_timeout_ms: u64,
    /// Number of order shard tables; the user-id gene picks one.
    pub order_shards: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RocketmqSettings {
    pub namesrv_addr: String,
    /// Prefix of topics and groups, so deployments and tests can share a broker.
    pub namespace: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    pub admin_token: Option<SecretString>,
    pub admin_token_file: Option<PathBuf>,
    pub token_secret: Option<SecretString>,
    pub token_secret_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentSettings {
    pub provider_secret: Option<SecretString>,
    pub provider_secret_file: Option<PathBuf>,
    /// The provider's payment page the buyer app sends a buyer to (`POST /api/orders/{no}/pay`
    /// answers it as `provider.page`); none: the app has nowhere to send them.
    pub provider_page_url: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoginSettings {
    /// Failed logins in a row an account may have before each next one must wait.
    pub free_failures: u32,
    /// The first wait; it doubles with every further failure, up to `max_delay_s`.
    pub base_delay_ms: u64,
    pub max_delay_s: u64,
    /// An account's failures are forgotten this long after its last one (or on success).
    pub failure_window_s: u64,
    /// Failures of one account from every address in `failure_window_s` before it takes
    /// no attempt at all until the window ends.
    pub account_max_failures: u32,
    /// Password checks (Argon2, ~20 ms of CPU and 19 MiB each) running at once; more
    /// wait for a slot up to `check_wait_ms`, then answer 503 with Retry-After instead of
    /// queueing without bound.
    pub max_concurrent_checks: usize,
    /// How long a login waits for a password check slot (0: not at all): a burst of
    /// sign-ins before a sale is served in turn, not turned away at the first full slot.
    pub check_wait_ms: u64,
    /// Logins waiting for a slot at once; more answer 503 at once (each holds a
    /// connection while it waits).
    pub max_waiting: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionSettings {
    pub token_ttl_s: u64,
    pub event_cache_ttl_ms: u64,
    /// Second-line rate limits, behind the edge's.
    pub user_per_s: u32,
    pub user_burst: u32,
    pub global_per_s: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderSettings {
    pub enabled: bool,
    pub workers: usize,
    pub batch_size: usize,
    pub claim_idle_ms: u64,
    /// Backpressure: admission pauses (503 SALE_BUSY) past this many queued reservations.
    pub max_stream_depth: u64,
    pub sweep_after_s: u64,
    /// A reservation older than this is released rather than created late.
    pub deadline_s: u64,
    pub checkback_grace_s: u64,
    /// Batches of one stream's new reservations a core creates at once (at least 1;
    /// more than `workers` adds nothing).
    #[serde(default = "default_batches_per_stream")]
    pub batches_per_stream: usize,
}

fn default_batches_per_stream() -> usize {
    1
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdSettings {
    pub worker_lease_s: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartupSettings {
    pub connect_timeout_s: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreloadSettings {
    pub window_s: u64,
    pub interval_s: u64,
    pub lock_ttl_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcileSettings {
    /// Seconds between passes of the periodic reconciler; 0 turns it off.
    pub interval_s: u64,
    /// A drift is healed only if a second measurement this much later agrees.
    pub confirm_ms: u64,
    /// Seconds after its sale's end (or its close) that a pass retires an event whose books balance
    /// with nothing queued, unpaid or under way: it leaves the sales index, so no worker, edge,
    /// sweeper or pass reads it any more (README "Reconciliation").
    #[serde(default = "default_retire_after_s")]
    pub retire_after_s: u64,
    /// Seconds after its retirement that a sale's buyers' records are deleted from Redis
    /// (retire.rs); 0 keeps them.
    #[serde(default = "default_purge_after_s")]
    pub purge_after_s: u64,
}

fn default_purge_after_s() -> u64 {
    86_400
}

fn default_retire_after_s() -> u64 {
    60
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
    pub filter: String,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// A configuration that cannot be used; the binary exits with code 64.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl Settings {
    /// Reads the layers. `file` is the operator's file, if any; then the process's
    /// environment ([`Settings::load_with`]).
    pub fn load(file: Option<&Path>) -> Result<Settings, ConfigError> {
        // vars_os: a variable that is not Unicode (anyone's, in the environment) must
        // not stop the core; none of ours can be one.
        let env = std::env::vars_os().filter_map(|(name, value)| {
            Some((name.into_string().ok()?, value.into_string().ok()?))
        });
        Settings::load_with(file, env)
    }

    /// Reads the layers with `env` as the environment. Only variables of the form
    /// `STAMPEDE_<SECTION>__<KEY>` are configuration (every key lives in a section):
    /// other `STAMPEDE_*` names — `STAMPEDE_CONFIG`, the edge's `STAMPEDE_TOKEN_SECRET`,
    /// Compose's `STAMPEDE_ADMIN_TOKEN` — are not this file's and stopped the core with
    /// "unknown field" when they were read as keys. A misspelt key of that form
    /// (`STAMPEDE_SERVER__PORTT`) is still refused, and so is a section's key written
    /// with one underscore (`STAMPEDE_REDIS_URL`), naming the spelling meant: ignored,
    /// it left the default in place without a word.
    pub fn load_with(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        let mut keys = config::Map::new();
        for (name, value) in env {
            let Some(rest) = name.strip_prefix("STAMPEDE_") else {
                continue;
            };
            if rest.contains("__") {
                keys.insert(name, value);
                continue;
            }
            let lower = rest.to_ascii_lowercase();
            if let Some(section) = SECTIONS
                .iter()
                .find(|s| lower.strip_prefix(**s).is_some_and(|k| k.starts_with('_')))
            {
                return Err(ConfigError(format!(
                    "environment variable {name} is not configuration: a key of [{section}] \
                     is STAMPEDE_{}__{}",
                    section.to_ascii_uppercase(),
                    &rest[section.len() + 1..]
                )));
            }
        }
        let env = keys;
        let mut builder = config::Config::builder()
            .add_source(config::File::from_str(DEFAULTS, config::FileFormat::Toml));
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError(format!(
                    "config file {} does not exist",
                    file.display()
                )));
            }
            builder = builder.add_source(config::File::from(file));
        }
        builder
            .add_source(
                config::Environment::with_prefix("STAMPEDE")
                    .prefix_separator("_")
                    .separator("__")
                    .try_parsing(true)
                    .list_separator(",")
                    .with_list_parse_key("redis.nodes")
                    .source(Some(env)),
            )
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(|e| ConfigError(e.to_string()))
    }

    /// The built-in defaults alone (tests start from these).
    pub fn defaults() -> Settings {
        config::Config::builder()
            .add_source(config::File::from_str(DEFAULTS, config::FileFormat::Toml))
            .build()
            .and_then(|c| c.try_deserialize())
            .expect("built-in defaults are valid")
    }
}

/// The configuration's sections, as `STAMPEDE_<SECTION>__<KEY>` names them.
const SECTIONS: [&str; 14] = [
    "server",
    "redis",
    "mysql",
    "rocketmq",
    "auth",
    "payments",
    "admission",
    "login",
    "orders",
    "ids",
    "startup",
    "preload",
    "reconcile",
    "log",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_section_keys_in_the_environment_are_configuration() {
        let s = Settings::load_with(
            None,
            env(&[
                ("STAMPEDE_CONFIG", "/etc/stampede.toml"),
                ("STAMPEDE_TOKEN_SECRET", "for the edge"),
                ("STAMPEDE_TOKEN_SECRET_FILE", "/run/secret"),
                ("STAMPEDE_ADMIN_TOKEN", "for compose"),
                ("STAMPEDE_BIN", "/usr/bin/stampede"),
                ("STAMPEDE_SERVER__ADMIN_ADDR", "127.0.0.1:9999"),
                ("STAMPEDE_ORDERS__BATCH_SIZE", "250"),
                ("OTHER__THING", "x"),
            ]),
        )
        .expect("the other STAMPEDE_* names are not keys");
        assert_eq!(s.server.admin_addr, "127.0.0.1:9999");
        assert_eq!(s.orders.batch_size, 250);
    }

    #[test]
    fn a_misspelt_key_in_the_environment_is_still_refused() {
        for (name, value) in [
            ("STAMPEDE_SERVER__ADMIN_ADRR", "127.0.0.1:9999"),
            ("STAMPEDE_SERVRE__ADMIN_ADDR", "127.0.0.1:9999"),
            ("STAMPEDE_ORDERS__BATCH_SIZE", "many"),
            ("STAMPEDE_REDIS_URL", "redis://elsewhere:6379/"),
            ("STAMPEDE_MYSQL_PASSWORD_FILE", "/run/pw"),
        ] {
            let e = Settings::load_with(None, env(&[(name, value)]))
                .expect_err(&format!("{name}={value} accepted"));
            assert!(!e.0.is_empty(), "{name}");
        }
        let e =
            Settings::load_with(None, env(&[("STAMPEDE_REDIS_URL", "redis://x/")])).unwrap_err();
        assert!(e.0.contains("STAMPEDE_REDIS__URL"), "{}", e.0);
    }
}
