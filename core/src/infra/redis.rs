//! Redis: one multiplexed connection (reconnects by itself; a single Redis's is built
//! anew when the crate gives up on it) to a single Redis or to a Redis Cluster,
//! start-up retries. Everything above speaks to [`Redis`] and never knows which: every
//! script's keys share one hash tag and every pipeline stays in one slot
//! (docs/scaling.md), so the cluster routes each call to one shard.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use super::retry_until;
use crate::config::{RedisMode, RedisSettings};

/// A connection to a single Redis or to a Redis Cluster; cheap to clone (clones share
/// the connections).
#[derive(Clone)]
pub enum Redis {
    Single(Single),
    Cluster(ClusterConnection),
}

/// A single Redis's connection manager, and a new one in its place when the crate has
/// given up on its reconnection.
#[derive(Clone)]
pub struct Single {
    manager: Arc<RwLock<ConnectionManager>>,
    anew: Arc<Anew>,
}

/// What a new manager is built from, and whether one is being built.
struct Anew {
    client: redis::Client,
    config: ConnectionManagerConfig,
    building: AtomicBool,
}

/// How often a manager given up on is tried again.
const REPLACE_EVERY: Duration = Duration::from_secs(1);

impl Single {
    fn current(&self) -> ConnectionManager {
        self.manager
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// A call's result, after starting a new manager if its error says the crate gave up.
    fn seen<T>(&self, result: redis::RedisResult<T>) -> redis::RedisResult<T> {
        if let Err(e) = &result {
            self.replace_if_given_up(e);
        }
        result
    }

    /// The crate retries a reconnection only after an I/O error (redis-rs #984): one
    /// that Redis refused — AUTH (a password changed, or Redis at `maxclients` with a
    /// password set) or SELECT — stays failed, and so would every call after it. Such
    /// an error starts one background task that builds a new manager every
    /// [`REPLACE_EVERY`] until one connects, then puts it in place.
    fn replace_if_given_up(&self, e: &RedisError) {
        if !refused_reconnection(e) || self.anew.building.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!(error = %e, "Redis refused the reconnection; connecting anew every second");
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REPLACE_EVERY).await;
                let anew = &this.anew;
                match ConnectionManager::new_with_config(anew.client.clone(), anew.config.clone())
                    .await
                {
                    Ok(manager) => {
                        *this
                            .manager
                            .write()
                            .unwrap_or_else(|poisoned| poisoned.into_inner()) = manager;
                        tracing::info!("Redis connected anew");
                        break;
                    }
                    Err(e) => tracing::debug!(error = %e, "Redis still refuses"),
                }
            }
            this.anew.building.store(false, Ordering::Release);
        });
    }
}

/// An error only a connection's set-up gives: Redis refused its AUTH or its SELECT.
pub fn refused_reconnection(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || (e.kind() == redis::ErrorKind::ResponseError
            && e.to_string().contains("refused to switch database"))
}

impl ConnectionLike for Redis {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            // A single command answered LOADING was not run: the answer says so as it is.
            Redis::Single(s) => Box::pin(async move {
                let result = s.current().req_packed_command(cmd).await;
                s.seen(result)
            }),
            Redis::Cluster(c) => Box::pin(async move {
                let answer = match c.req_packed_command(cmd).await {
                    answer if no_script(&answer) => match eval_instead(cmd) {
                        Some(eval) => c.req_packed_command(&eval).await,
                        None => answer,
                    },
                    answer => answer,
                };
                match answer {
                    Ok(v) if loading(&v) => Err(may_have_run(&v)),
                    other => other.map_err(after_retries),
                }
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Redis::Single(s) => Box::pin(async move {
                let result = s.current().req_packed_commands(cmd, offset, count).await;
                match s.seen(result) {
                    // Some commands refused while loading, and later ones run once the
                    // load ended: partly run. A transaction's refusal comes as an error
                    // (MULTI itself may have been refused, its commands then run alone).
                    Ok(values) if partly_loading(&values) => Err(may_have_run(&values)),
                    Err(e) if e.kind() == redis::ErrorKind::BusyLoadingError => {
                        Err(may_have_run(&e))
                    }
                    other => other,
                }
            }),
            Redis::Cluster(c) => Box::pin(async move {
                match c.req_packed_commands(cmd, offset, count).await {
                    Ok(values) if values.iter().any(loading) => Err(may_have_run(&values)),
                    other => other.map_err(after_retries),
                }
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Redis::Single(s) => s.anew.client.get_connection_info().redis.db,
            Redis::Cluster(c) => c.get_db(),
        }
    }
}

/// The scripts made by [`script`], by their SHA1.
static SCRIPTS: std::sync::LazyLock<RwLock<std::collections::HashMap<String, &'static str>>> =
    std::sync::LazyLock::new(Default::default);

/// A script of Stampede's, known by its SHA1 to the connection: on a Redis Cluster, an
/// `EVALSHA` of it that a node answers NOSCRIPT (a master restarted, or a replica
/// promoted, since the script was loaded) is sent again as `EVAL` with its body, routed
/// by its first key like the `EVALSHA` — never as the redis crate's `SCRIPT LOAD`, which
/// the crate sends to every node of the cluster, replicas included, so that one hung node
/// anywhere (stopped, swapping) made every such call time out.
pub fn script(body: &'static str) -> redis::Script {
    let script = redis::Script::new(body);
    SCRIPTS
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(script.get_hash().to_owned(), body);
    script
}

/// An answer that says the script asked for is not loaded.
fn no_script(answer: &redis::RedisResult<Value>) -> bool {
    match answer {
        Ok(Value::ServerError(e)) => e.code() == "NOSCRIPT",
        Err(e) => e.kind() == redis::ErrorKind::NoScriptError,
        Ok(_) => false,
    }
}

/// `cmd`, an `EVALSHA` of a script made by [`script`], as the same `EVAL` with its body
/// (None for any other command).
fn eval_instead(cmd: &Cmd) -> Option<Cmd> {
    let mut args = cmd.args_iter();
    let (Some(redis::Arg::Simple(name)), Some(redis::Arg::Simple(sha))) =
        (args.next(), args.next())
    else {
        return None;
    };
    if !name.eq_ignore_ascii_case(b"EVALSHA") {
        return None;
    }
    let body = *SCRIPTS
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(std::str::from_utf8(sha).ok()?)?;
    let mut eval = Cmd::new();
    eval.arg("EVAL").arg(body);
    for arg in args {
        match arg {
            redis::Arg::Simple(bytes) => eval.arg(bytes),
            redis::Arg::Cursor => return None,
        };
    }
    Some(eval)
}

/// A LOADING answer: Redis, restarted, is still loading its data and refused the command
/// without running it. `infra::Down::of` takes an error of that kind as "unavailable,
/// nothing sent" — true of a single command sent to a single Redis. Where the answer
/// cannot say it — a pipeline with commands refused and commands run (the load ended
/// in its middle), or a cluster call the client retried after an earlier attempt may
/// have run — the answer becomes [`may_have_run`]'s error.
fn loading(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.code() == "LOADING")
}

/// Some of a pipeline's commands refused while loading and some not.
fn partly_loading(values: &[Value]) -> bool {
    values.iter().any(loading) && !values.iter().all(loading)
}

/// A LOADING answer as a connection lost after sending: what ran is unknown.
fn may_have_run(answer: &impl std::fmt::Debug) -> RedisError {
    lost_after_sending(format!(
        "Redis is loading its data; what ran is unknown: {answer:?}"
    ))
}

/// An error `infra::Down::of` reads as "Redis down, the call may have run" (the caller
/// answers "outcome unknown", not "not done").
fn lost_after_sending(why: String) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        why,
    ))
}

/// The cluster client retries a call that met an I/O error, so a refused connection at
/// the end says nothing of an earlier attempt that may have run: it is reported as a
/// connection lost after sending (the caller then answers "outcome unknown", not "not
/// done").
fn after_retries(e: RedisError) -> RedisError {
    if e.is_connection_refusal() || e.kind() == redis::ErrorKind::BusyLoadingError {
        lost_after_sending(format!(
            "{e} (after retries: an earlier attempt may have run)"
        ))
    } else {
        e
    }
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Connects as `settings.mode` says, waiting up to `timeout` for Redis to answer a PING.
pub async fn connect(settings: &RedisSettings, timeout: Duration) -> anyhow::Result<Redis> {
    match settings.mode {
        RedisMode::Single => connect_single(&settings.url, timeout).await,
        RedisMode::Cluster => connect_cluster(&settings.nodes, timeout).await,
    }
}

async fn connect_single(url: &str, timeout: Duration) -> anyhow::Result<Redis> {
    let client = redis::Client::open(url).context("Invalid Redis URL")?;
    let target = client.get_connection_info().addr.to_string();
    // After a lost connection every call waits on one reconnection, which tries again
    // after a pause it takes from `backon`: the first pause is 1 s, each next one the
    // last times `factor`, at most `max_delay` ms, each plus up to as much again at
    // random. The crate's `factor` of 100 (documented as milliseconds, redis-rs #1556,
    // #1830) made the second pause 60–120 s: a Redis back within seconds of a kill -9
    // was left unused for a minute or two whenever the first two tries came too early.
    // Here a reconnection is two tries 1–2 s apart (factor and max_delay matter only if
    // the retries are raised); when both fail, the next call starts another, so the
    // core is back within ~2 s of Redis answering, and a call waits on a reconnection
    // at most ~6 s (two 2 s connection timeouts and the pause, for a hung Redis).
    // A reconnection that fails with a non-I/O error (a refused AUTH or SELECT) is not
    // retried by the crate: [`Single`] replaces the manager then.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(CONNECT_TIMEOUT)
        .set_response_timeout(RESPONSE_TIMEOUT)
        .set_number_of_retries(1)
        .set_factor(2)
        .set_max_delay(1_000);
    retry_until("Redis", &target, timeout, || async {
        let mut con = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        redis::cmd("PING").query_async::<String>(&mut con).await?;
        Ok(Redis::Single(Single {
            manager: Arc::new(RwLock::new(con)),
            anew: Arc::new(Anew {
                client: client.clone(),
                config: config.clone(),
                building: AtomicBool::new(false),
            }),
        }))
    })
    .await
}

async fn connect_cluster(nodes: &[String], timeout: Duration) -> anyhow::Result<Redis> {
    let seeds: Vec<&str> = nodes
        .iter()
        .map(|n| n.trim())
        .filter(|n| !n.is_empty())
        .collect();
    let client = ClusterClientBuilder::new(seeds.clone())
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(RESPONSE_TIMEOUT)
        // A call that meets a moved slot or a shard being failed over retries 4 times,
        // then fails like a single Redis that is down (the crate's default, 16 retries
        // from 1.3 s apart, would hold a buyer for minutes). The crate waits a random
        // time from `min_retry_wait` up to 10 · 2^n ms, at most `max_retry_wait`: about
        // 0.1 s before each of the first four, ~0.5 s in all (a retry that reconnects
        // does not wait). Every script is safe to run twice (an Idempotency-Key, a
        // stream entry, an order number or the stock it was measured against makes the
        // second run a no-op), so a retried call never counts twice.
        .retries(4)
        .min_retry_wait(100)
        .max_retry_wait(1000)
        .build()
        .context("Invalid Redis Cluster seed nodes")?;
    let target = seeds.join(",");
    retry_until("Redis Cluster", &target, timeout, || async {
        let mut con = client.get_async_connection().await?;
        // Every shard must answer, not just one.
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut con)
            .await?;
        if !info.contains("cluster_state:ok") {
            anyhow::bail!("the cluster's state is not ok yet");
        }
        Ok(Redis::Cluster(con))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infra::Down;

    #[test]
    fn an_evalsha_of_a_known_script_is_sent_again_as_eval_with_its_keys_and_arguments() {
        let known = script("return {KEYS[1], ARGV[1]} -- eval_instead test");
        let mut evalsha = Cmd::new();
        evalsha
            .arg("EVALSHA")
            .arg(known.get_hash())
            .arg(1)
            .arg("{ev:1}:k")
            .arg("a b");
        let eval = eval_instead(&evalsha).expect("a known script");
        let args: Vec<Vec<u8>> = eval
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                redis::Arg::Cursor => panic!("no cursor"),
            })
            .collect();
        let want: Vec<&[u8]> = vec![
            b"EVAL",
            b"return {KEYS[1], ARGV[1]} -- eval_instead test",
            b"1",
            b"{ev:1}:k",
            b"a b",
        ];
        assert_eq!(args, want);

        // A script nobody made here, and any other command: left alone.
        let mut unknown = Cmd::new();
        unknown.arg("EVALSHA").arg("0".repeat(40)).arg(0);
        assert!(eval_instead(&unknown).is_none());
        assert!(eval_instead(redis::cmd("GET").arg("k")).is_none());

        let noscript = redis::parse_redis_value(b"-NOSCRIPT No matching script.\r\n").unwrap();
        assert!(no_script(&Ok(noscript)));
        assert!(!no_script(&Ok(loading_answer())));
        assert!(!no_script(&Ok(Value::Okay)));
    }

    fn loading_answer() -> Value {
        redis::parse_redis_value(b"-LOADING Redis is loading the dataset in memory\r\n").unwrap()
    }

    /// A pipeline refused whole ran nothing; one refused in part ran what came after.
    #[test]
    fn a_pipeline_is_partly_run_only_when_some_answers_are_not_loading() {
        let ok = Value::Okay;
        assert!(!partly_loading(&[loading_answer(), loading_answer()]));
        assert!(partly_loading(&[loading_answer(), ok.clone()]));
        assert!(!partly_loading(&[ok.clone(), ok]));
        assert!(!partly_loading(&[]));
    }

    /// What the caller answers: a LOADING refusal sent nothing; what ran unknown (a
    /// pipeline partly run, a cluster call retried) may have been sent.
    #[test]
    fn a_loading_refusal_sent_nothing_and_an_unknown_run_may_have() {
        let refused = || loading_answer().extract_error().unwrap_err();
        assert_eq!(refused().kind(), redis::ErrorKind::BusyLoadingError);
        assert_eq!(
            Down::of(&anyhow::Error::new(refused())),
            Some(Down::Redis { maybe_sent: false })
        );
        for unknown in [
            may_have_run(&vec![loading_answer(), Value::Okay]),
            after_retries(refused()),
        ] {
            assert_eq!(
                Down::of(&anyhow::Error::new(unknown)),
                Some(Down::Redis { maybe_sent: true })
            );
        }
    }
}
