//! MariaDB/MySQL: the pool, start-up retries, and the schema migrations in `sql/`.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Context;
use mysql_async::prelude::*;
use mysql_async::{Opts, Pool};
use refinery::Migration;

use super::retry_until;

/// The migrations, in order. A file marked `-- per-shard:` is expanded once per order
/// shard (`{shard}` → 0 … N-1) into one migration of `CREATE TABLE IF NOT EXISTS`
/// statements, so a run cut short can simply be repeated.
pub const MIGRATIONS: &[(&str, &str)] = &[
    ("V1__event", include_str!("../../../sql/V1__event.sql")),
    (
        "V2__ticket_category",
        include_str!("../../../sql/V2__ticket_category.sql"),
    ),
    ("V3__seat", include_str!("../../../sql/V3__seat.sql")),
    (
        "V4__app_user",
        include_str!("../../../sql/V4__app_user.sql"),
    ),
    (
        "V5__order_shards",
        include_str!("../../../sql/V5__order_shards.sql"),
    ),
    (
        "V6__order_item_shards",
        include_str!("../../../sql/V6__order_item_shards.sql"),
    ),
    (
        "V7__stock_log",
        include_str!("../../../sql/V7__stock_log.sql"),
    ),
    (
        "V8__consumed_message",
        include_str!("../../../sql/V8__consumed_message.sql"),
    ),
    ("V9__payment", include_str!("../../../sql/V9__payment.sql")),
    (
        "V10__redis_epoch",
        include_str!("../../../sql/V10__redis_epoch.sql"),
    ),
    (
        "V11__mysql_guards",
        include_str!("../../../sql/V11__mysql_guards.sql"),
    ),
    (
        "V12__mysql_guards_backfill",
        include_str!("../../../sql/V12__mysql_guards_backfill.sql"),
    ),
    (
        "V13__drop_consumed_message",
        include_str!("../../../sql/V13__drop_consumed_message.sql"),
    ),
    (
        "V14__event_buckets",
        include_str!("../../../sql/V14__event_buckets.sql"),
    ),
    (
        "V15__category_name_exact",
        include_str!("../../../sql/V15__category_name_exact.sql"),
    ),
    ("V16__trains", include_str!("../../../sql/V16__trains.sql")),
    (
        "V17__order_item_journey",
        include_str!("../../../sql/V17__order_item_journey.sql"),
    ),
    (
        "V18__waiting_room",
        include_str!("../../../sql/V18__waiting_room.sql"),
    ),
    (
        "V19__order_request_index",
        include_str!("../../../sql/V19__order_request_index.sql"),
    ),
    (
        "V20__stock_log_by_order",
        include_str!("../../../sql/V20__stock_log_by_order.sql"),
    ),
    (
        "V21__order_rows_by_order",
        include_str!("../../../sql/V21__order_rows_by_order.sql"),
    ),
    (
        "V22__stock_batch",
        include_str!("../../../sql/V22__stock_batch.sql"),
    ),
    (
        "V23__stock_log_unflagged",
        include_str!("../../../sql/V23__stock_log_unflagged.sql"),
    ),
    (
        "V24__stock_log_batch_index",
        include_str!("../../../sql/V24__stock_log_batch_index.sql"),
    ),
    (
        "V25__stock_log_reason",
        include_str!("../../../sql/V25__stock_log_reason.sql"),
    ),
];

const PER_SHARD_MARK: &str = "-- per-shard:";

/// Builds the refinery migrations for `shards` order shards.
pub fn migrations(shards: u32) -> anyhow::Result<Vec<Migration>> {
    MIGRATIONS
        .iter()
        .map(|(name, sql)| {
            let sql = if sql.starts_with(PER_SHARD_MARK) {
                (0..shards)
                    .map(|n| sql.replace("{shard}", &n.to_string()))
                    .collect::<Vec<_>>()
                    .join("\n")
            } else {
                (*sql).to_owned()
            };
            Migration::unapplied(name, &sql).with_context(|| format!("migration {name}"))
        })
        .collect()
}

/// How long a MySQL call may take (`mysql.call_timeout_ms`), and the counts of calls cut
/// off (`stampede_mysql_calls_cut_total`) and of how their sessions ended
/// (`stampede_mysql_sessions_ended_total`).
///
/// mysql_async has no timeout of its own for a command, and TCP notices a peer that
/// stopped answering only after many minutes (a host gone, a partition) or never (a
/// hung server whose kernel still acknowledges). Cutting a call drops its future, which
/// leaves no connection out of step: one dropped in the middle of a command is marked
/// broken and closed, never reused (MariaDB rolls back its open transaction once the
/// session ends: at once for a batch's transaction, whose session [`end_session`] kills,
/// else after `wait_timeout`, config/resolve.rs); one dropped while reading a
/// result's rows goes back to the pool's clean-up, which reads the rest and rolls back
/// before reuse (on a dead peer that clean-up holds a pool slot until TCP keepalive
/// gives up). Every caller treats the cut as a crash at that point, which its flow
/// survives: a batch's transaction is of unknown outcome, and the retry reads what
/// committed.
#[derive(Clone)]
pub struct CallTimeout {
    pub limit: Duration,
    cut: prometheus::IntCounter,
    sessions_ended: prometheus::IntCounterVec,
}

/// A MySQL call that did not finish within `mysql.call_timeout_ms`.
#[derive(Debug, thiserror::Error)]
#[error("no answer from MySQL within {} ms (mysql.call_timeout_ms)", .0.as_millis())]
pub struct TimedOut(pub Duration);

impl CallTimeout {
    pub fn new(limit: Duration, metrics: &crate::metrics::Metrics) -> CallTimeout {
        CallTimeout {
            limit,
            cut: metrics.mysql_calls_cut.clone(),
            sessions_ended: metrics.mysql_sessions_ended.clone(),
        }
    }

    /// [`end_session`] within this limit, its outcome counted.
    pub async fn end_session(
        &self,
        conn: mysql_async::Conn,
        server: &ServerIdentity,
        since: Instant,
    ) -> SessionEnd {
        let outcome = end_session(conn, server, since, self.limit).await;
        self.sessions_ended
            .with_label_values(&[outcome.label()])
            .inc();
        outcome
    }

    /// `call`'s outcome, or TimedOut once `limit` has passed (the call dropped, logged).
    pub async fn within<F: Future>(&self, what: &str, call: F) -> Result<F::Output, TimedOut> {
        tokio::time::timeout(self.limit, call).await.map_err(|_| {
            self.cut.inc();
            tracing::warn!(
                what,
                limit_ms = self.limit.as_millis() as u64,
                "a MySQL call did not finish in time; it and its connection are given up"
            );
            TimedOut(self.limit)
        })
    }

    /// The bound of a background pass over one event (a preload, a reconcile pass, a
    /// purge: a few MySQL calls and Redis round trips): four calls' worth, and at least
    /// a minute, so a large event's rebuild is never cut for being large. Cut off, it is
    /// as if the core had stopped there (its Redis lock lapses after its TTL), and the
    /// next pass does it again.
    pub fn for_pass(&self) -> CallTimeout {
        CallTimeout {
            limit: (self.limit * 4).max(Duration::from_secs(60)),
            ..self.clone()
        }
    }

    /// [`within`](Self::within) for a fallible call: its error or the cut, as one.
    pub async fn try_within<T, E: Into<anyhow::Error>>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, E>>,
    ) -> anyhow::Result<T> {
        self.within(what, call).await?.map_err(Into::into)
    }
}

/// The server a session id was given by, as MariaDB names itself: its host name, port
/// and `server_id` (which replication requires to differ between a primary and its
/// replicas). Read on a call's connection before the call, so that [`end_session`] sends
/// a KILL for that session to that server only — not to whichever server the address
/// leads to by then (a virtual IP moved to a replica after a failover), where the id
/// may be anyone's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerIdentity {
    pub hostname: String,
    pub port: u32,
    pub server_id: u64,
}

impl ServerIdentity {
    /// The server `conn` is connected to (one round trip).
    pub async fn of(conn: &mut mysql_async::Conn) -> Result<ServerIdentity, mysql_async::Error> {
        let row: Option<(String, u32, u64)> = conn
            .query_first("SELECT @@hostname, @@port, @@server_id")
            .await?;
        let (hostname, port, server_id) =
            row.ok_or_else(|| mysql_async::Error::Other("no answer to SELECT @@hostname".into()))?;
        Ok(ServerIdentity {
            hostname,
            port,
            server_id,
        })
    }
}

impl std::fmt::Display for ServerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{} (server_id {})",
            self.hostname, self.port, self.server_id
        )
    }
}

/// Ends the MariaDB session of `conn`, whose call was cut off: MariaDB never hears that a
/// client behind a half-open connection is gone, so the session would keep its
/// transaction and its locks until `wait_timeout` (four call timeouts), and every batch
/// of the category would wait on them meanwhile. KILL over a connection of its own (not
/// the pool's, whose idle ones may be half-open too), `conn` held until it is done, so the
/// pool cannot hand the session to another task first. Its transaction rolls back unless
/// its COMMIT got there first. Bounded by `within`; on failure MariaDB still ends the
/// session after `wait_timeout`.
///
/// A session id means something only to the server that gave it. So the KILL is sent
/// only to `server` (read on `conn` before the call): the new connection may reach
/// another one (the address moved, a failover), whose session of that id may be another
/// core's. And only to a server up for longer than since `since` (when the cut call
/// began, its connection taken after): one restarted since numbers its sessions afresh
/// (and the cut session went with the restart).
pub async fn end_session(
    conn: mysql_async::Conn,
    server: &ServerIdentity,
    since: Instant,
    within: Duration,
) -> SessionEnd {
    let (id, opts) = (conn.id(), conn.opts().clone());
    let kill = async {
        let mut killer = mysql_async::Conn::new(opts).await?;
        let here = ServerIdentity::of(&mut killer).await?;
        if here != *server {
            return Ok(SessionEnd::OtherServer(here));
        }
        let uptime: Option<(String, u64)> = killer
            .query_first("SHOW GLOBAL STATUS LIKE 'Uptime'")
            .await?;
        let up = Duration::from_secs(uptime.map_or(0, |(_, s)| s));
        if up < since.elapsed() {
            return Ok(SessionEnd::Restarted(up));
        }
        killer.query_drop(format!("KILL CONNECTION {id}")).await?;
        Ok::<_, mysql_async::Error>(SessionEnd::Killed)
        // The killer disconnects as it drops, in the background.
    };
    let outcome = match tokio::time::timeout(within, kill).await {
        Ok(Ok(outcome)) => outcome,
        // 1094: no such thread — it ended already.
        Ok(Err(mysql_async::Error::Server(e))) if e.code == 1094 => SessionEnd::Gone,
        Ok(Err(e)) => SessionEnd::Failed(e.to_string()),
        Err(_) => SessionEnd::Unanswered,
    };
    match &outcome {
        SessionEnd::Killed => tracing::warn!(
            session = id,
            "killed the MariaDB session of a cut-off call (its transaction rolls back, unless its COMMIT had landed)"
        ),
        SessionEnd::Restarted(up) => tracing::warn!(
            session = id,
            uptime_s = up.as_secs(),
            "MariaDB restarted since a cut-off call began: its session is gone, nothing killed"
        ),
        SessionEnd::OtherServer(here) => tracing::warn!(
            session = id,
            was = %server,
            now = %here,
            "the address of a cut-off call's MariaDB leads to another server now: nothing killed; the session ends after wait_timeout, if its server still runs"
        ),
        SessionEnd::Gone => {}
        SessionEnd::Failed(e) => tracing::warn!(
            session = id,
            error = %e,
            "could not end the session of a cut-off call; MariaDB ends it after wait_timeout"
        ),
        SessionEnd::Unanswered => tracing::warn!(
            session = id,
            "no answer to KILL for a cut-off call's session; MariaDB ends it after wait_timeout"
        ),
    }
    drop(conn);
    outcome
}

/// What [`end_session`] did (`stampede_mysql_sessions_ended_total`'s `outcome`).
#[derive(Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// KILL CONNECTION went through.
    Killed,
    /// The server has been up this long: less than the cut call has run. Nothing killed.
    Restarted(Duration),
    /// The address now leads to this server, not the one that gave the session id.
    /// Nothing killed.
    OtherServer(ServerIdentity),
    /// The session had ended already.
    Gone,
    /// The KILL (or the connection for it) failed: the session ends after wait_timeout.
    Failed(String),
    /// No answer within the bound: the session ends after wait_timeout.
    Unanswered,
}

impl SessionEnd {
    pub fn label(&self) -> &'static str {
        match self {
            SessionEnd::Killed => "killed",
            SessionEnd::Restarted(_) => "restarted",
            SessionEnd::OtherServer(_) => "other_server",
            SessionEnd::Gone => "gone",
            SessionEnd::Failed(_) => "failed",
            SessionEnd::Unanswered => "unanswered",
        }
    }
}

/// A connection checked out this long into an API request has its statements bounded
/// by what is left of the request, not by the whole of it.
const LATE_CHECKOUT: Duration = Duration::from_millis(100);

/// The least statement limit set: MariaDB takes 0 for none.
const LEAST_STATEMENT_LIMIT: Duration = Duration::from_millis(10);

/// MariaDB's `max_statement_time` for `limit` (at least [`LEAST_STATEMENT_LIMIT`]), in
/// seconds to the millisecond, as a `SET` list item.
pub fn statement_limit(limit: Duration) -> String {
    let ms = limit.max(LEAST_STATEMENT_LIMIT).as_millis();
    format!("max_statement_time = {}.{:03}", ms / 1_000, ms % 1_000)
}

tokio::task_local! {
    /// The API request being served: when it must be answered by, and its whole limit
    /// (`server.request_timeout_ms`).
    static REQUEST: (tokio::time::Instant, Duration);
}

/// Runs `f` as an API request that must be answered by `deadline`, of `limit` in all:
/// the connections of the API's pool it checks out late are bounded by what is left
/// ([`checkout`]).
pub async fn within_request<F: Future>(
    deadline: tokio::time::Instant,
    limit: Duration,
    f: F,
) -> F::Output {
    REQUEST.scope((deadline, limit), f).await
}

/// A connection out of a pool, as [`checkout`] gives it: used as a `Conn`.
pub struct Checkout {
    conn: Option<mysql_async::Conn>,
    /// The session's own statement limit, to set again once this use is over, when
    /// this use shortened it; and how long that may take.
    restore: Option<(String, Duration)>,
}

/// Checks a connection out of `pool`. Every session of the API's pool ends each
/// statement at a whole request's limit (its setup): a request cut off drops its
/// connection, and MariaDB does not notice a client leave while a statement waits on a
/// row lock or scans, so its session would run on while the pool opens another in its
/// place. A request that gets its connection late (it waited for the pool, for a
/// password check, for Redis) would still leave its session running past its answer,
/// and under a flood every connection is given late: so, more than [`LATE_CHECKOUT`]
/// into a request, the connection's statements are bounded by what is left of it (a
/// statement stopped so answers 503, as the request's own cut-off would), and the
/// session's own limit is set again when the connection goes back. Outside a request,
/// or on the pipeline's pool (no statement limit), the connection as it is.
pub async fn checkout(pool: &Pool) -> Result<Checkout, mysql_async::Error> {
    let mut conn = pool.get_conn().await?;
    let Ok((deadline, limit)) = REQUEST.try_with(|r| *r) else {
        return Ok(Checkout {
            conn: Some(conn),
            restore: None,
        });
    };
    let bounded = conn
        .opts()
        .setup()
        .iter()
        .any(|s| s.contains("max_statement_time"));
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    if !bounded || left + LATE_CHECKOUT >= limit {
        return Ok(Checkout {
            conn: Some(conn),
            restore: None,
        });
    }
    conn.query_drop(format!("SET {}", statement_limit(left)))
        .await?;
    Ok(Checkout {
        conn: Some(conn),
        restore: Some((format!("SET {}", statement_limit(limit)), limit)),
    })
}

impl std::ops::Deref for Checkout {
    type Target = mysql_async::Conn;
    fn deref(&self) -> &mysql_async::Conn {
        self.conn.as_ref().expect("present until dropped")
    }
}

impl std::ops::DerefMut for Checkout {
    fn deref_mut(&mut self) -> &mut mysql_async::Conn {
        self.conn.as_mut().expect("present until dropped")
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        let (Some(mut conn), Some((restore, within))) = (self.conn.take(), self.restore.take())
        else {
            return;
        };
        // One cut off mid-call is out of step with its server: the pool discards it.
        if conn.is_disconnected() {
            return;
        }
        // Off the request's path, before the pool hands the connection out again, and
        // bounded: a connection that does not answer the SET (its path died) is dropped
        // mid-call, so discarded, rather than held for as long as TCP retries.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to run it on: the pool resets the session instead (its setup
            // sets the whole limit again).
            conn.reset_connection(true);
            return;
        };
        runtime.spawn(async move {
            match tokio::time::timeout(within, conn.query_drop(restore)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "a shortened session's limit not set back: discarded");
                    let _ = conn.disconnect().await;
                }
                Err(_) => tracing::debug!("a shortened session's limit not set back in time: discarded"),
            }
        });
    }
}

/// Opens the pool and waits (up to `timeout`) until MariaDB answers.
pub async fn connect(opts: Opts, timeout: Duration) -> anyhow::Result<Pool> {
    let target = format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port());
    let pool = Pool::new(opts);
    retry_until("MariaDB", &target, timeout, || async {
        pool.get_conn().await?.ping().await?;
        Ok(())
    })
    .await?;
    Ok(pool)
}

/// Refuses a server that is not MariaDB, naming it: the migrations use MariaDB's
/// `IF [NOT] EXISTS` forms of ALTER TABLE and the API's sessions MariaDB's
/// `max_statement_time`, so on MySQL the start would otherwise fail later on a syntax
/// error or an unknown variable that says neither.
pub async fn require_mariadb(pool: &Pool) -> anyhow::Result<()> {
    let version: Option<String> = pool
        .get_conn()
        .await?
        .query_first("SELECT VERSION()")
        .await
        .context("Failed to read the database server's version")?;
    is_mariadb(version.as_deref().unwrap_or_default())
}

fn is_mariadb(version: &str) -> anyhow::Result<()> {
    if version.to_ascii_lowercase().contains("mariadb") {
        return Ok(());
    }
    anyhow::bail!(
        "the database server is {version:?}, not MariaDB: Stampede needs MariaDB (tested with \
         10.11) for its schema's ALTER TABLE … IF NOT EXISTS and its API sessions' \
         max_statement_time"
    )
}

/// Applies the migrations not yet applied; refuses a shard count that differs from
/// the one the schema was installed with.
pub async fn migrate(pool: &Pool, shards: u32) -> anyhow::Result<()> {
    let existing = crate::order_tables::count_shards(&mut pool.get_conn().await?)
        .await
        .context("Failed to count the order shard tables")?;
    if existing != 0 && existing != shards {
        anyhow::bail!(
            "the database has {existing} order shard tables but mysql.order_shards = {shards}; \
             the shard count is fixed when the schema is installed"
        );
    }
    let migrations = migrations(shards)?;
    let report = refinery::Runner::new(&migrations)
        .set_migration_table_name("schema_history")
        .run_async(&mut pool.clone())
        .await
        .context("Failed to apply the schema migrations")?;
    for m in report.applied_migrations() {
        tracing::info!(migration = %m, "applied");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_in_sql_is_a_listed_migration_in_order() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../sql");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|f| f.ends_with(".sql"))
            .map(|f| f.trim_end_matches(".sql").to_owned())
            .collect();
        files.sort_by_key(|f| f[1..f.find("__").unwrap()].parse::<u32>().unwrap());
        let listed: Vec<&str> = MIGRATIONS.iter().map(|(n, _)| *n).collect();
        assert_eq!(files, listed);
    }

    #[test]
    fn only_mariadb_is_accepted_and_a_refusal_names_the_server() {
        for ok in [
            "10.11.19-MariaDB-0+deb12u1",
            "11.4.2-MariaDB",
            "5.5.5-10.6.12-MariaDB-log",
        ] {
            assert!(is_mariadb(ok).is_ok(), "{ok}");
        }
        for other in ["8.0.36", "8.4.0-commercial", "5.7.44-log", ""] {
            let e = is_mariadb(other).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{other:?}")) && e.contains("needs MariaDB"),
                "{e}"
            );
        }
    }

    #[test]
    fn shard_files_expand_once_per_shard() {
        let ms = migrations(3).unwrap();
        let orders = ms.iter().find(|m| m.name() == "order_shards").unwrap();
        for n in 0..3 {
            assert!(orders.sql().unwrap().contains(&format!("`order_{n}`")));
        }
        assert!(!orders.sql().unwrap().contains("order_3"));
        assert!(!orders.sql().unwrap().contains("{shard}"));
    }
}
