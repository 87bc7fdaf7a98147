//! The settings resolved into what the services need: every value checked, addresses
//! parsed, secrets read (inline, from a file or the environment).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use super::{ConfigError, Settings};

/// The settings resolved into what the services need: addresses parsed, secrets read.
#[derive(Clone)]
pub struct Resolved {
    pub settings: Settings,
    pub public_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub admin_token: SecretString,
    pub token_secret: SecretString,
    /// The payment provider's signing secret, when payments are configured.
    pub provider_secret: Option<SecretString>,
    /// The pool of the pipeline, the listeners and the sweeps (`mysql.pool_max`).
    pub mysql_opts: mysql_async::Opts,
    /// The same server and session, for the API requests' pool (`mysql.api_pool_max`).
    pub mysql_api_opts: mysql_async::Opts,
}

/// The most orders one worker creates in one batch (`orders.batch_size`).
pub const MAX_BATCH_SIZE: usize = 10_000;

impl Settings {
    /// Checks every value and reads the secrets; nothing is bound or connected yet.
    pub fn resolve(self) -> Result<Resolved, ConfigError> {
        let public_addr = parse_addr("server.public_addr", &self.server.public_addr)?;
        let admin_addr = parse_addr("server.admin_addr", &self.server.admin_addr)?;
        if self.server.max_body_bytes < 1024 {
            return Err(ConfigError(
                "server.max_body_bytes must be at least 1024".into(),
            ));
        }
        // Zero here is never what an operator meant: no connection ever accepted (the
        // core would log "serving" and answer nothing), every request timed out or
        // cut off at once.
        if self.server.max_connections == 0 {
            return Err(ConfigError(
                "server.max_connections must be positive".into(),
            ));
        }
        if self.server.read_timeout_ms < 100 || self.server.request_timeout_ms < 100 {
            return Err(ConfigError(
                "server.read_timeout_ms and server.request_timeout_ms must be at least 100".into(),
            ));
        }
        if self.login.max_concurrent_checks == 0 {
            return Err(ConfigError(
                "login.max_concurrent_checks must be positive".into(),
            ));
        }
        if self.login.check_wait_ms > self.server.request_timeout_ms / 2 {
            return Err(ConfigError(
                "login.check_wait_ms must be at most half of server.request_timeout_ms".into(),
            ));
        }
        if self.server.worker_threads > super::MAX_WORKER_THREADS {
            return Err(ConfigError(format!(
                "server.worker_threads must be 0 (one per CPU) … {}",
                super::MAX_WORKER_THREADS
            )));
        }
        if self.redis.key_prefix.is_empty() || self.redis.key_prefix.contains(['{', '}', ' ']) {
            return Err(ConfigError(
                "redis.key_prefix must be non-empty, without braces or spaces".into(),
            ));
        }
        if self.redis.wait_timeout_ms == 0 || self.redis.wait_timeout_ms > 1000 {
            return Err(ConfigError(
                "redis.wait_timeout_ms must be 1 … 1000 (a round waits that long on a \
                 connection whose calls time out after 2 s)"
                    .into(),
            ));
        }
        match self.redis.mode {
            super::RedisMode::Single => {
                redis::Client::open(self.redis.url.as_str())
                    .map_err(|e| ConfigError(format!("redis.url: {e}")))?;
            }
            super::RedisMode::Cluster => {
                if self.redis.nodes.iter().all(|n| n.trim().is_empty()) {
                    return Err(ConfigError(
                        "redis.mode is \"cluster\" but redis.nodes names no seed node".into(),
                    ));
                }
                for node in self.redis.nodes.iter().filter(|n| !n.trim().is_empty()) {
                    redis::Client::open(node.trim())
                        .map_err(|e| ConfigError(format!("redis.nodes: {node:?}: {e}")))?;
                }
            }
        }
        if !(self.mysql.order_shards.is_power_of_two() && self.mysql.order_shards <= 64) {
            return Err(ConfigError(
                "mysql.order_shards must be a power of two up to 64 (1, 2, 4 … 64)".into(),
            ));
        }
        let a = &self.admission;
        if a.token_ttl_s == 0 || a.user_per_s == 0 || a.user_burst == 0 || a.global_per_s == 0 {
            return Err(ConfigError(
                "admission.token_ttl_s, user_per_s, user_burst and global_per_s must be positive"
                    .into(),
            ));
        }
        let o = &self.orders;
        if o.workers == 0
            || o.batch_size == 0
            || o.batches_per_stream == 0
            || o.max_stream_depth == 0
            || o.claim_idle_ms < 1000
        {
            return Err(ConfigError(
                "orders.workers, batch_size, batches_per_stream and max_stream_depth must be positive, claim_idle_ms ≥ 1000"
                    .into(),
            ));
        }
        // 0 would release every reservation as overdue: each 202 answered FAILED.
        if o.deadline_s == 0 {
            return Err(ConfigError("orders.deadline_s must be positive".into()));
        }
        // A batch is one MySQL transaction (its orders' rows in a few statements, their
        // locks held until it commits), one stream read and one order-timeout message
        // naming each order: past this, a batch would hold its locks for long and its
        // statements and message grow towards MySQL's and the broker's size limits.
        if o.batch_size > MAX_BATCH_SIZE {
            return Err(ConfigError(format!(
                "orders.batch_size must be at most {MAX_BATCH_SIZE} (one MySQL transaction and one broker message per batch)"
            )));
        }
        if !self
            .rocketmq
            .namespace
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(ConfigError(
                "rocketmq.namespace may hold only letters, digits, '_' and '-'".into(),
            ));
        }
        if self.ids.worker_lease_s < 3 {
            return Err(ConfigError("ids.worker_lease_s must be at least 3".into()));
        }
        if self.mysql.pool_max == 0 || self.mysql.api_pool_max == 0 {
            return Err(ConfigError(
                "mysql.pool_max and mysql.api_pool_max must be positive".into(),
            ));
        }
        if !(100..=600_000).contains(&self.mysql.call_timeout_ms) {
            return Err(ConfigError(
                "mysql.call_timeout_ms must be 100 … 600000 (0.1 s to 10 min)".into(),
            ));
        }
        if self.rocketmq.namesrv_addr.trim().is_empty() {
            return Err(ConfigError("rocketmq.namesrv_addr is empty".into()));
        }
        if self.preload.window_s == 0
            || self.preload.interval_s == 0
            || self.preload.lock_ttl_ms < 100
        {
            return Err(ConfigError(
                "preload.window_s and preload.interval_s must be positive, lock_ttl_ms ≥ 100"
                    .into(),
            ));
        }
        let mysql_password = secret(
            "mysql.password",
            self.mysql.password.as_ref(),
            self.mysql.password_file.as_deref(),
            0,
        )?;
        let idle_timeout_s = session_idle_timeout(self.mysql.call_timeout_ms).as_secs();
        let mut mysql_opts = mysql_async::OptsBuilder::from_opts(
            mysql_async::Opts::from_url(&self.mysql.url)
                .map_err(|e| ConfigError(format!("mysql.url: {e}")))?,
        )
        .pool_opts(
            mysql_async::PoolOpts::default()
                .with_constraints(
                    mysql_async::PoolConstraints::new(1, self.mysql.pool_max)
                        .expect("1 ≤ pool_max, checked above"),
                )
                // Keep up to pool_max idle connections (down to one after a minute idle):
                // with the default (no idle lifetime) the pool keeps ONE, and closed every
                // other connection the moment it came back, so each batch, stock sync and
                // sweep under load opened a new TCP connection (handshake, password,
                // session set-up) and MariaDB spent most of its CPU on them.
                .with_inactive_connection_ttl(std::time::Duration::from_secs(60))
                // No COM_RESET_CONNECTION each time a connection goes back to the pool:
                // it costs a round trip, drops the connection's prepared statements (so
                // every checkout prepared them again) and undid the time zone set below
                // (`init` runs on connect only). Nothing here leaves session state
                // behind but user creation, which asks for the reset on its connection;
                // an unfinished transaction is rolled back by the pool either way.
                .with_reset_connection(false),
        )
        // TCP as configured: the driver would otherwise try the server's socket file too
        // on every new connection (another handshake, refused here for a user that may
        // connect from 127.0.0.1 only).
        .prefer_socket(false)
        // Told the session's wait_timeout (set below), and dropping a connection idle
        // for three quarters of it, the pool never hands out one MariaDB has closed.
        .wait_timeout(Some(idle_timeout_s as usize))
        .conn_ttl(Some(Duration::from_secs(idle_timeout_s) * 3 / 4))
        // A peer gone (its host lost, a partition) under a connection waiting for an
        // answer is noticed by TCP keepalive probes after this long idle (then the OS's
        // interval and count), rather than never: what a cut-off call leaves to the
        // pool's clean-up (reading the rest of a result) then ends too.
        .tcp_keepalive(Some(Duration::from_millis(self.mysql.call_timeout_ms)))
        // Every DATETIME Stampede writes or reads is UTC. A session whose client is
        // gone without closing (a call cut off after mysql.call_timeout_ms on a
        // half-open connection, a core's host lost) would keep its open transaction,
        // and the row locks every later batch of its category waits on, for MariaDB's
        // default wait_timeout of 8 hours: it ends after `session_idle_timeout` without
        // a command instead. `setup`, not `init`: run again after a connection's reset
        // (user creation asks for one), which restores the server's defaults.
        .setup(vec![session_setup(idle_timeout_s)]);
        if let Some(pw) = mysql_password {
            mysql_opts = mysql_opts.pass(Some(pw.expose_secret().to_owned()));
        }
        let admin_token = secret(
            "auth.admin_token",
            self.auth.admin_token.as_ref(),
            self.auth.admin_token_file.as_deref(),
            16,
        )?
        .ok_or_else(|| ConfigError("set auth.admin_token or auth.admin_token_file".into()))?;
        let token_secret = secret(
            "auth.token_secret",
            self.auth.token_secret.as_ref(),
            self.auth.token_secret_file.as_deref(),
            16,
        )?
        .ok_or_else(|| ConfigError("set auth.token_secret or auth.token_secret_file".into()))?;
        crate::auth::token::Keyring::parse(token_secret.expose_secret())
            .map_err(|e| ConfigError(format!("auth.token_secret: {e}")))?;
        let provider_secret = secret(
            "payments.provider_secret",
            self.payments.provider_secret.as_ref(),
            self.payments.provider_secret_file.as_deref(),
            16,
        )?;
        let mysql_opts = mysql_async::Opts::from(mysql_opts);
        let mysql_api_opts = mysql_async::OptsBuilder::from_opts(mysql_opts.clone())
            // Every statement of an API session ends when its request can no longer be
            // answered: a request cut off at server.request_timeout_ms drops its
            // connection, but MariaDB does not see a client leave while a statement runs
            // (a wait on a row lock, a long scan): the session would run on, up to
            // innodb_lock_wait_timeout or to its end, while the pool opens another in its
            // place. MariaDB aborts it itself, with no KILL to send (a connection checked
            // out late in a request is bounded by what is left: infra::mysql::checkout).
            .setup(vec![format!(
                "{}, {}",
                session_setup(idle_timeout_s),
                crate::infra::mysql::statement_limit(Duration::from_millis(
                    self.server.request_timeout_ms
                ))
            )])
            .pool_opts(
                mysql_opts.pool_opts().clone().with_constraints(
                    mysql_async::PoolConstraints::new(1, self.mysql.api_pool_max)
                        .expect("1 ≤ api_pool_max, checked above"),
                ),
            )
            .into();
        Ok(Resolved {
            provider_secret,
            settings: self,
            public_addr,
            admin_addr,
            admin_token,
            token_secret,
            mysql_opts,
            mysql_api_opts,
        })
    }
}

impl std::fmt::Debug for Resolved {
    // mysql_async's options would print the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved")
            .field("settings", &self.settings)
            .field("public_addr", &self.public_addr)
            .field("admin_addr", &self.admin_addr)
            .finish_non_exhaustive()
    }
}

impl Resolved {
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.settings.server.shutdown_grace_s)
    }

    /// The keyring file the token secrets come from, when they come from one (an inline
    /// `auth.token_secret` wins): the file `rotate-token-secret` rewrites and the core
    /// re-reads.
    pub fn keyring_file(&self) -> Option<&Path> {
        let auth = &self.settings.auth;
        auth.token_secret_file
            .as_deref()
            .filter(|_| auth.token_secret.is_none())
    }
}

fn parse_addr(key: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    value
        .parse()
        .map_err(|e| ConfigError(format!("{key} = {value:?}: {e}")))
}

/// A secret given inline or in a file (trimmed); inline wins. `min_len` 0 allows empty.
fn secret(
    key: &str,
    inline: Option<&SecretString>,
    file: Option<&Path>,
    min_len: usize,
) -> Result<Option<SecretString>, ConfigError> {
    let value = match (inline, file) {
        (Some(s), _) => s.expose_secret().trim().to_owned(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("{key}_file {}: {e}", path.display())))?
            .trim()
            .to_owned(),
        (None, None) => return Ok(None),
    };
    if value.len() < min_len {
        return Err(ConfigError(format!(
            "{key} must be at least {min_len} characters"
        )));
    }
    Ok(Some(SecretString::from(value)))
}

/// Every session's set-up: UTC, and MariaDB's wait_timeout ([`session_idle_timeout`]).
fn session_setup(idle_timeout_s: u64) -> String {
    format!("SET time_zone = '+00:00', wait_timeout = {idle_timeout_s}")
}

/// MariaDB's `wait_timeout` for Stampede's sessions: four times
/// `mysql.call_timeout_ms`, at least 10 s (the shipped 15 s gives a minute), so a
/// session a cut-off call left behind holds its locks about that long at most, while no
/// call Stampede makes leaves its connection idle inside a transaction for so long.
pub fn session_idle_timeout(call_timeout_ms: u64) -> std::time::Duration {
    std::time::Duration::from_millis(call_timeout_ms.saturating_mul(4))
        .max(std::time::Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_secrets() -> Settings {
        let mut s = Settings::defaults();
        s.auth.admin_token = Some("a".repeat(32).into());
        s.auth.token_secret = Some("s".repeat(32).into());
        s
    }

    #[test]
    fn defaults_with_secrets_resolve() {
        let r = with_secrets().resolve().expect("valid");
        assert_eq!(r.public_addr.port(), 8081);
        assert_eq!(r.admin_addr.port(), 9091);
        assert_eq!(r.settings.mysql.order_shards, 4);
    }

    #[test]
    fn missing_admin_token_is_a_config_error() {
        let mut s = with_secrets();
        s.auth.admin_token = None;
        let err = s.resolve().unwrap_err();
        assert!(err.0.contains("auth.admin_token"), "{err}");
    }

    #[test]
    fn short_secrets_and_bad_addresses_are_rejected() {
        let mut s = with_secrets();
        s.auth.token_secret = Some("short".to_string().into());
        assert!(s.resolve().unwrap_err().0.contains("token_secret"));
        let mut s = with_secrets();
        s.server.admin_addr = "localhost".into();
        assert!(s.resolve().unwrap_err().0.contains("server.admin_addr"));
        let mut s = with_secrets();
        s.server.worker_threads = 257;
        assert!(s.resolve().unwrap_err().0.contains("server.worker_threads"));
        for shards in [0, 3, 128] {
            let mut s = with_secrets();
            s.mysql.order_shards = shards;
            assert!(
                s.resolve().unwrap_err().0.contains("order_shards"),
                "{shards}"
            );
        }
        let mut s = with_secrets();
        s.redis.key_prefix = "a{b".into();
        assert!(s.resolve().unwrap_err().0.contains("key_prefix"));
        for (size, ok) in [
            (0, false),
            (1, true),
            (MAX_BATCH_SIZE, true),
            (MAX_BATCH_SIZE + 1, false),
        ] {
            let mut s = with_secrets();
            s.orders.batch_size = size;
            match s.resolve() {
                Ok(_) => assert!(ok, "{size} accepted"),
                Err(e) => assert!(!ok && e.0.contains("batch_size"), "{size}: {e}"),
            }
        }
        let mut s = with_secrets();
        s.orders.batches_per_stream = 0;
        assert!(s.resolve().unwrap_err().0.contains("batches_per_stream"));
    }

    #[test]
    fn zero_limits_and_timeouts_are_refused() {
        let refused = |change: &dyn Fn(&mut Settings), key: &str| {
            let mut s = with_secrets();
            change(&mut s);
            let e = s.resolve().map(|_| ()).expect_err(key);
            assert!(e.0.contains(key), "{key}: {e}");
        };
        refused(&|s| s.server.max_connections = 0, "server.max_connections");
        refused(&|s| s.mysql.pool_max = 0, "mysql.pool_max");
        refused(&|s| s.mysql.api_pool_max = 0, "mysql.api_pool_max");
        refused(&|s| s.server.read_timeout_ms = 0, "server.read_timeout_ms");
        refused(
            &|s| s.server.request_timeout_ms = 99,
            "server.request_timeout_ms",
        );
        refused(
            &|s| s.login.max_concurrent_checks = 0,
            "login.max_concurrent_checks",
        );
        refused(
            &|s| s.login.check_wait_ms = s.server.request_timeout_ms / 2 + 1,
            "login.check_wait_ms",
        );
        refused(&|s| s.orders.deadline_s = 0, "orders.deadline_s");
        let mut s = with_secrets();
        (s.server.max_connections, s.server.read_timeout_ms) = (1, 100);
        (s.server.request_timeout_ms, s.orders.deadline_s) = (100, 1);
        (s.login.max_concurrent_checks, s.login.check_wait_ms) = (1, 0);
        s.login.max_waiting = 0;
        assert!(s.resolve().is_ok(), "the smallest allowed values");
    }

    #[test]
    fn cluster_mode_needs_valid_seed_nodes() {
        use crate::config::RedisMode;
        let cluster = |nodes: &[&str]| {
            let mut s = with_secrets();
            s.redis.mode = RedisMode::Cluster;
            s.redis.nodes = nodes.iter().map(|n| n.to_string()).collect();
            s.resolve().map(|_| ()).map_err(|e| e.0)
        };
        assert!(cluster(&[]).unwrap_err().contains("redis.nodes"));
        assert!(cluster(&["", " "]).unwrap_err().contains("redis.nodes"));
        assert!(
            cluster(&["redis://127.0.0.1:7001/", "http://x"])
                .unwrap_err()
                .contains("http://x")
        );
        assert_eq!(
            cluster(&["redis://127.0.0.1:7001/", "", "redis://127.0.0.1:7002/"]),
            Ok(())
        );
        for bad in [0, 1001] {
            let mut s = with_secrets();
            s.redis.wait_timeout_ms = bad;
            assert!(
                s.resolve().unwrap_err().0.contains("wait_timeout_ms"),
                "{bad}"
            );
        }
        // Single mode reads only `url`: seed nodes left in the file change nothing.
        let mut s = with_secrets();
        s.redis.nodes = vec!["not a url".into()];
        assert!(s.resolve().is_ok());
    }

    #[test]
    fn mysql_calls_are_bounded_and_abandoned_sessions_end_soon_after() {
        for bad in [0, 99, 600_001] {
            let mut s = with_secrets();
            s.mysql.call_timeout_ms = bad;
            assert!(
                s.resolve().unwrap_err().0.contains("call_timeout_ms"),
                "{bad}"
            );
        }
        let r = with_secrets().resolve().unwrap();
        // The shipped 15 s: a session a cut-off call left ends after a minute idle.
        assert_eq!(r.mysql_opts.wait_timeout(), Some(60));
        let setup = r.mysql_opts.setup().join(";");
        assert!(setup.contains("wait_timeout = 60"), "{setup}");
        assert_eq!(r.mysql_opts.conn_ttl(), Some(Duration::from_secs(45)));
        // The API's pool: the same session, its own size.
        let (workers, api) = (&r.mysql_opts, &r.mysql_api_opts);
        // The API's sessions also end each statement at the request's limit (15 s), set
        // in the same statement.
        assert_eq!(
            api.setup(),
            [format!("{setup}, max_statement_time = 15.000")]
        );
        assert!(!setup.contains("max_statement_time"), "{setup}");
        let limit = |ms| crate::infra::mysql::statement_limit(Duration::from_millis(ms));
        assert_eq!(limit(1_250), "max_statement_time = 1.250");
        assert_eq!(limit(0), "max_statement_time = 0.010", "never 0: no limit");
        assert_eq!(api.pass(), workers.pass());
        assert_eq!(api.conn_ttl(), workers.conn_ttl());
        assert_eq!(workers.pool_opts().constraints().max(), 32);
        assert_eq!(api.pool_opts().constraints().max(), 8);
        assert_eq!(session_idle_timeout(1_000).as_secs(), 10);
        assert_eq!(session_idle_timeout(600_000).as_secs(), 2_400);
    }

    #[test]
    fn secrets_never_print() {
        let r = with_secrets().resolve().unwrap();
        let shown = format!("{r:?}");
        assert!(!shown.contains(&"a".repeat(32)));
        assert!(!shown.contains(&"s".repeat(32)));
    }
}
