//! Where the running stack is (the ports and secrets `scripts/stack.sh` uses), and
//! its admin API.

use stampede_core::domain::UserId;
use stampede_core::keys::Bucket;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use serde_json::Value;

use stampede_core::config::{RedisMode, RedisSettings};

use crate::load::{self, Request};

/// The stack under test; defaults are `make up`'s, and the same variables as
/// `scripts/stack.sh` override them. Given before or after the command.
#[derive(Debug, Clone, Args)]
pub struct StackArgs {
    /// The state directory holding admin.token and mysql.password.
    #[arg(long, global = true, env = "STACK_DIR", default_value = ".stack")]
    pub stack_dir: PathBuf,
    #[arg(long, global = true, env = "EDGE_PORT", default_value_t = 8080)]
    pub edge_port: u16,
    #[arg(long, global = true, env = "ADMIN_PORT", default_value_t = 9091)]
    pub admin_port: u16,
    #[arg(long, global = true, env = "MYSQL_PORT", default_value_t = 3306)]
    pub mysql_port: u16,
    #[arg(long, global = true, env = "REDIS_PORT", default_value_t = 6379)]
    pub redis_port: u16,
    /// `cluster`: the stack of `STACK_MODE=cluster make up` — a Redis Cluster on
    /// REDIS_CLUSTER_PORT … +5 and a second edge on EDGE2_PORT; connections are spread
    /// over both edges and Redis is read through the cluster. By default, the mode the
    /// stack in --stack-dir was started in (its `mode` file), else single.
    #[arg(long, global = true, env = "STACK_MODE")]
    pub stack_mode: Option<StackMode>,
    /// The cluster stack: `--stack-mode cluster`, whatever STACK_MODE or --stack-mode say.
    #[arg(long, global = true)]
    pub cluster: bool,
    #[arg(
        long,
        global = true,
        env = "REDIS_CLUSTER_PORT",
        default_value_t = 7001
    )]
    pub redis_cluster_port: u16,
    #[arg(long, global = true, env = "EDGE2_PORT", default_value_t = 8084)]
    pub edge2_port: u16,
    #[arg(
        long,
        global = true,
        env = "MYSQL_DATABASE",
        default_value = "stampede"
    )]
    pub mysql_database: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StackMode {
    Single,
    Cluster,
}

pub struct Stack {
    pub dir: PathBuf,
    /// The first edge (the only one of a single stack).
    pub edge: SocketAddr,
    /// Every edge: connections are spread over them.
    pub edges: Vec<SocketAddr>,
    pub admin: SocketAddr,
    pub admin_token: String,
    pub mysql: mysql_async::Pool,
    /// How the core reaches Redis (single or cluster).
    pub redis: RedisSettings,
    /// Every Redis node, for what each must be asked itself (CONFIG, INFO).
    pub redis_nodes: Vec<String>,
}

impl Stack {
    pub fn open(a: &StackArgs) -> anyhow::Result<Stack> {
        let password = read_secret(&a.stack_dir, "mysql.password")?;
        let opts = mysql_async::OptsBuilder::default()
            .ip_or_hostname("127.0.0.1")
            .tcp_port(a.mysql_port)
            .user(Some("stampede"))
            .pass(Some(password))
            .db_name(Some(a.mysql_database.clone()));
        let edge = SocketAddr::from(([127, 0, 0, 1], a.edge_port));
        let mut redis = stampede_core::Settings::defaults().redis;
        redis.url = format!("redis://127.0.0.1:{}/", a.redis_port);
        let mode = a.cluster.then_some(StackMode::Cluster);
        let mode = mode.or(a.stack_mode).unwrap_or_else(|| {
            match std::fs::read_to_string(a.stack_dir.join("mode")).as_deref() {
                Ok("cluster\n") | Ok("cluster") => StackMode::Cluster,
                _ => StackMode::Single,
            }
        });
        let (edges, redis_nodes) = match mode {
            StackMode::Single => (vec![edge], vec![redis.url.clone()]),
            StackMode::Cluster => {
                redis.mode = RedisMode::Cluster;
                redis.nodes = (a.redis_cluster_port..a.redis_cluster_port + 6)
                    .map(|p| format!("redis://127.0.0.1:{p}/"))
                    .collect();
                (
                    vec![edge, SocketAddr::from(([127, 0, 0, 1], a.edge2_port))],
                    redis.nodes.clone(),
                )
            }
        };
        Ok(Stack {
            dir: a.stack_dir.clone(),
            edge,
            edges,
            admin: SocketAddr::from(([127, 0, 0, 1], a.admin_port)),
            admin_token: read_secret(&a.stack_dir, "admin.token")?,
            mysql: mysql_async::Pool::new(opts),
            redis,
            redis_nodes,
        })
    }

    /// The edge connection `c` goes through: the edges in turn.
    pub fn edge_for(&self, c: usize) -> SocketAddr {
        self.edges[c % self.edges.len()]
    }

    /// A connection to the stack's Redis as the core makes it (single or cluster).
    pub async fn redis(&self) -> anyhow::Result<stampede_core::infra::redis::Redis> {
        stampede_core::infra::redis::connect(&self.redis, Duration::from_secs(10)).await
    }

    /// The event's Redis bucket count (its keys' layout).
    pub async fn buckets(&self, event: u64) -> anyhow::Result<u16> {
        use mysql_async::prelude::Queryable;
        let mut conn = self.mysql.get_conn().await?;
        let n: Option<u16> = conn
            .exec_first("SELECT buckets FROM event WHERE id = ?", (event,))
            .await?;
        Ok(n.unwrap_or(1))
    }

    /// The buyer's bucket of the event.
    pub async fn bucket_of(&self, event: u64, user: u64) -> anyhow::Result<Bucket> {
        Ok(Bucket::of_buyer(
            event,
            self.buckets(event).await?,
            UserId(user),
        ))
    }

    /// Order numbers whose units are back in Redis (every bucket's restocked set).
    pub async fn restocked(&self, event: u64) -> anyhow::Result<std::collections::HashSet<u64>> {
        let keys =
            stampede_core::keys::Keys::new(&stampede_core::Settings::defaults().redis.key_prefix);
        let mut redis = self.redis().await?;
        let mut all = std::collections::HashSet::new();
        for b in Bucket::all(event, self.buckets(event).await?) {
            let members: Vec<u64> = redis::cmd("SMEMBERS")
                .arg(keys.restocked(b))
                .query_async(&mut redis)
                .await?;
            all.extend(members);
        }
        Ok(all)
    }

    /// A connection to one node by itself (CONFIG and INFO are per node).
    pub async fn redis_node(&self, url: &str) -> anyhow::Result<redis::aio::MultiplexedConnection> {
        Ok(redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?)
    }

    /// One of the secrets `scripts/stack.sh` generated (admin.token, provider.secret, …).
    pub fn secret(&self, name: &str) -> anyhow::Result<String> {
        read_secret(&self.dir, name)
    }

    /// An admin call; fails unless the status is one of `ok`.
    pub async fn admin(&self, req: Request, ok: &[u16]) -> anyhow::Result<Value> {
        let path = req.path.clone();
        let a = load::call(self.admin, &req.bearer(&self.admin_token))
            .await
            .with_context(|| format!("admin API at {} ({path})", self.admin))?;
        if !ok.contains(&a.status) {
            bail!(
                "admin {path} answered {}: {}",
                a.status,
                String::from_utf8_lossy(&a.body)
            );
        }
        Ok(a.json())
    }

    /// `count` users and a token for each: (first user id, tokens).
    pub async fn buyers(&self, count: u64) -> anyhow::Result<(u64, Vec<String>)> {
        let mut first = None;
        let mut tokens = Vec::with_capacity(count as usize);
        let mut left = count;
        while left > 0 {
            let n = left.min(100_000);
            let made = self
                .admin(
                    Request::post("/admin/users", &serde_json::json!({"count": n})),
                    &[201, 200],
                )
                .await?;
            let from = made["first_user_id"].as_u64().context("first_user_id")?;
            first.get_or_insert(from);
            let issued = self
                .admin(
                    Request::post(
                        "/admin/tokens",
                        &serde_json::json!({"first_user_id": from, "count": n, "ttl_s": 3600}),
                    ),
                    &[200, 201],
                )
                .await?;
            tokens.extend(
                issued["tokens"]
                    .as_array()
                    .context("tokens")?
                    .iter()
                    .filter_map(|t| t.as_str().map(str::to_owned)),
            );
            left -= n;
        }
        Ok((first.unwrap_or(0), tokens))
    }

    /// Creates and publishes an event; its id and category ids.
    pub async fn event(&self, body: &Value) -> anyhow::Result<(u64, Vec<u64>)> {
        let created = self
            .admin(Request::post("/admin/events", body), &[201])
            .await?;
        let id = created["event_id"].as_u64().context("event_id")?;
        let categories = created["categories"]
            .as_array()
            .context("categories")?
            .iter()
            .filter_map(|c| c["id"].as_u64())
            .collect();
        self.admin(
            Request::post(
                format!("/admin/events/{id}/publish"),
                &serde_json::json!({}),
            ),
            &[200],
        )
        .await?;
        Ok((id, categories))
    }

    pub async fn stats(&self, event: u64) -> anyhow::Result<Value> {
        self.admin(Request::get(format!("/admin/events/{event}/stats")), &[200])
            .await
    }

    /// What is left of the event's pipeline: reservations still in its streams (the
    /// stats' `queued_reservations`, XLEN of each bucket's stream) and orders not yet
    /// synced (its `unsynced_stock_log`), read from Redis and MySQL directly. Not
    /// the stats endpoint: it counts every order of the event (about 12 ms of MariaDB's
    /// CPU per call at 36 556 orders, measured), which polled every 50 ms was charged to
    /// the pipeline's CPU per order. `redis`: a connection kept between calls (made when
    /// None; dropped on an error).
    pub async fn left_to_settle(
        &self,
        event: u64,
        redis: &mut Option<stampede_core::infra::redis::Redis>,
    ) -> anyhow::Result<(u64, u64)> {
        use mysql_async::prelude::Queryable;
        // One round trip: the event's bucket count (its streams) and its unsynced orders,
        // summed by idx_stock_batch_unsynced (synced, event_id, …): those batches only.
        let mut mysql = self.mysql.get_conn().await?;
        let (buckets, unsynced): (Option<u16>, u64) = mysql
            .exec_first(
                "SELECT (SELECT buckets FROM event WHERE id = ?), \
                 (SELECT CAST(COALESCE(SUM(orders), 0) AS UNSIGNED) FROM stock_batch \
                  WHERE synced = 0 AND event_id = ?)",
                (event, event),
            )
            .await?
            .context("no row")?;
        drop(mysql);
        let keys =
            stampede_core::keys::Keys::new(&stampede_core::Settings::defaults().redis.key_prefix);
        let conn = match redis {
            Some(conn) => conn,
            None => redis.insert(self.redis().await?),
        };
        let mut queued = 0;
        for b in Bucket::all(event, buckets.unwrap_or(1)) {
            match redis::cmd("XLEN")
                .arg(keys.order_stream(b))
                .query_async::<u64>(conn)
                .await
            {
                Ok(n) => queued += n,
                Err(e) => {
                    *redis = None;
                    return Err(e.into());
                }
            }
        }
        Ok((queued, unsynced))
    }

    /// Polls the event's pipeline (`left_to_settle`) every 50 ms until nothing is queued
    /// and nothing is left to sync, within `within`: (when every reservation was an
    /// order, when everything was synced).
    pub async fn wait_settled(
        &self,
        event: u64,
        within: Duration,
    ) -> anyhow::Result<(Instant, Instant)> {
        let until = Instant::now() + within;
        let spinner = indicatif::ProgressBar::new_spinner();
        spinner.set_message(format!("waiting for event {event} to settle"));
        let mut created = None;
        let mut redis = None;
        loop {
            // While a part is down Redis or MySQL may not answer: ask again.
            // Bounded: a store that hangs (the chaos suite's SIGSTOP) is asked again.
            let left = tokio::time::timeout(
                Duration::from_secs(5),
                self.left_to_settle(event, &mut redis),
            )
            .await
            .unwrap_or_else(|_| {
                redis = None;
                Err(anyhow::anyhow!("Redis or MySQL did not answer within 5 s"))
            });
            let (queued, unsynced) = match left {
                Ok(left) => left,
                Err(e) if Instant::now() < until => {
                    spinner.set_message(format!("waiting for event {event} to settle ({e:#})"));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(e) => {
                    return Err(e.context(format!("event {event} not settled within {within:?}")));
                }
            };
            spinner.tick();
            if queued == 0 {
                let at = *created.get_or_insert_with(Instant::now);
                if unsynced == 0 {
                    spinner.finish_and_clear();
                    return Ok((at, Instant::now()));
                }
            }
            anyhow::ensure!(
                Instant::now() < until,
                "event {event} not settled within {within:?}: {queued} reservations queued, \
                 {unsynced} orders unsynced"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Edge limits raised out of the way (for measuring the purchase path itself), or
    /// restored to nginx.conf's with `None`.
    pub async fn edge_limits(&self, high: bool) -> anyhow::Result<()> {
        let body = if high {
            serde_json::json!({
                "orders_ip": {"algo": "token_bucket", "rate": 1e9, "burst": 1e9},
                "orders_user": {"algo": "sliding_window", "limit": 1e9, "window_s": 1},
                "orders_event": {"algo": "leaky_bucket", "rate": 1e9, "burst": 1e9},
            })
        } else {
            serde_json::json!({"orders_ip": null, "orders_user": null, "orders_event": null})
        };
        let mut req = Request::post("/admin/limits", &body);
        req.method = http::Method::PUT;
        self.admin(req, &[200]).await?;
        // Every edge worker picks limits up within a second.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        Ok(())
    }
}

fn read_secret(dir: &std::path::Path, name: &str) -> anyhow::Result<String> {
    let path = dir.join(name);
    Ok(std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {} (is the stack up? make up)", path.display()))?
        .trim()
        .to_owned())
}

/// An event body: `units` split over `categories` unseated categories, plus a seated
/// block when `seats` is (rows, cols); selling from `start_in` from now for an hour.
pub fn event_body(
    title: &str,
    units: u64,
    categories: u32,
    seats: Option<(u32, u32)>,
    per_user_limit: u32,
    start_in: Duration,
) -> Value {
    let now = chrono::Utc::now();
    let start = now + chrono::Duration::from_std(start_in).unwrap_or_default();
    let mut cats: Vec<Value> = (0..categories)
        .map(|i| {
            let share = units / u64::from(categories)
                + u64::from(u64::from(i) < units % u64::from(categories));
            serde_json::json!({"name": format!("Zone {}", i + 1), "price_cents": 5000, "quantity": share})
        })
        .collect();
    if let Some((rows, cols)) = seats {
        cats.push(serde_json::json!({"name": "Seated", "price_cents": 9000, "seats": {"rows": rows, "cols": cols}}));
    }
    serde_json::json!({
        "title": title, "venue": "loopback",
        "show_time": (now + chrono::Duration::days(30)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "sale_start": start.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "sale_end": (start + chrono::Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "per_user_limit": per_user_limit, "pay_timeout_s": 900,
        "categories": cats,
    })
}
