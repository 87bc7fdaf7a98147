//! Periodic passes over a sale on that nothing changed since its last pass balanced.
//!
//! Sales stay listed for as long as they are on (a train for days), and each periodic
//! pass over one cost MariaDB about ten statements, whether anything had happened or
//! not: with 622 sales listed on the test stack, ~750 a second of an idle MariaDB per
//! core. A pass over a sale on is skipped while what Redis shows of its books — its
//! metadata (status, window, generation, bucket count), each bucket's stock, generation
//! and queue length, its pool, its train's seat versions, its entry in the sales index —
//! is what it was when a pass found the books balanced with nothing queued, moving or
//! healed; every [`FULL_EVERY`]-th pass is made whatever Redis shows. Every admission,
//! give-back, move, rebuild, close and seat change moves one of those; what moves none
//! (a change made in MySQL alone, such as a cancellation whose give-back a crash cut
//! off) waits for that full pass, except a close: a sale MySQL no longer has published
//! as the round began is passed in full (`Reconciler::pass_and_retire`). A sale not on
//! (ahead of its window, past it, closed) is passed every time, as before: its
//! retirement and its keys' checks depend on the clock and on MySQL.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use crate::infra::redis::Redis;
use crate::keys::{Bucket, Keys};

/// One pass in this many over an unchanged sale on is made all the same.
pub const FULL_EVERY: u32 = 6;

/// What Redis shows of a sale's books (see the module's notes); equal when nothing of
/// them changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(Vec<BTreeMap<String, String>>);

/// The sale's [`Fingerprint`] at `now_ms` (Unix ms), or None when it is not on by its
/// metadata (no metadata, closed, outside its window) or the metadata does not read.
pub async fn fingerprint(
    redis: &Redis,
    keys: &Keys,
    event_id: u64,
    now_ms: i64,
) -> anyhow::Result<Option<Fingerprint>> {
    let mut redis = redis.clone();
    let meta: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(keys.event_meta(event_id))
        .query_async(&mut redis)
        .await?;
    let field = |name: &str| meta.get(name).and_then(|v| v.parse::<i64>().ok());
    let (Some(start), Some(end), Some(buckets)) = (
        field("sale_start_ms"),
        field("sale_end_ms"),
        field("buckets")
            .and_then(|b| u16::try_from(b).ok())
            .filter(|&b| b >= 1),
    ) else {
        return Ok(None);
    };
    if meta.get("status").map(String::as_str) != Some("open") || now_ms < start || now_ms >= end {
        return Ok(None);
    }
    let mut parts = vec![meta];
    // One call per bucket (on a cluster, each is a slot of its own).
    for b in Bucket::all(crate::domain::EventId(event_id), buckets) {
        let (stock, epoch, queued): (BTreeMap<String, String>, Option<String>, u64) = redis::pipe()
            .hgetall(keys.stock(b))
            .hget(keys.meta(b), "epoch")
            .xlen(keys.order_stream(b))
            .query_async(&mut redis)
            .await?;
        parts.push(stock);
        parts.push(BTreeMap::from([
            ("epoch".to_owned(), epoch.unwrap_or_default()),
            ("queued".to_owned(), queued.to_string()),
        ]));
    }
    let (pool, seats): (BTreeMap<String, String>, BTreeMap<String, String>) = redis::pipe()
        .hgetall(keys.pool(event_id))
        .hgetall(keys.segment_versions(event_id))
        .query_async(&mut redis)
        .await?;
    let listed: Option<String> = redis::cmd("HGET")
        .arg(keys.sales_index())
        .arg(event_id)
        .query_async(&mut redis)
        .await?;
    parts.extend([
        pool,
        seats,
        BTreeMap::from([("listed".to_owned(), listed.unwrap_or_default())]),
    ]);
    Ok(Some(Fingerprint(parts)))
}

/// Which Redis processes hold the sales, and which history each serves: each one's
/// `run_id` and `master_replid` (on a cluster, each master's, by address), sorted. A
/// Redis that goes back in time — restarted from an older copy, a replica behind its
/// master taking over, a node fully resynced from a lagging master — is another
/// process or another replication history, and may show a sale exactly as a balanced
/// pass left it although MySQL has orders it lacks (the last admissions before a crash
/// are what a lagging replica misses): a new identity makes every sale's next pass a
/// full one, whose rewind check (`Preloader::behind`) sees it. INFO is in Redis's
/// `@dangerous` ACL category: a user without it skips nothing (README).
pub async fn redis_identity(redis: &Redis) -> anyhow::Result<String> {
    let mut nodes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (section, field) in [("server", "run_id"), ("replication", "master_replid")] {
        let reply: redis::Value = redis::cmd("INFO")
            .arg(section)
            .query_async(&mut redis.clone())
            .await?;
        // A single Redis answers its text; a cluster a map of each master's address to
        // its (the masters it could reach: none is no answer).
        let answers: Vec<(String, &redis::Value)> = match &reply {
            redis::Value::Map(each) => each
                .iter()
                .map(|(node, info)| Ok((redis::from_redis_value(node)?, info)))
                .collect::<redis::RedisResult<_>>()?,
            one => vec![(String::new(), one)],
        };
        anyhow::ensure!(!answers.is_empty(), "no node answered INFO {section}");
        for (node, info) in answers {
            let text: String = redis::from_redis_value(info)?;
            let value = text
                .lines()
                .find_map(|l| l.strip_prefix(field).and_then(|v| v.strip_prefix(':')))
                .ok_or_else(|| anyhow::anyhow!("INFO {section} of {node:?} has no {field}"))?;
            nodes
                .entry(node)
                .or_default()
                .push(format!("{field}={}", value.trim()));
        }
    }
    Ok(nodes
        .into_iter()
        .map(|(node, ids)| format!("{node}:{}", ids.join("/")))
        .collect::<Vec<_>>()
        .join(","))
}

/// Per sale on: the fingerprint its last full pass balanced with, and the passes
/// skipped since; and the [`redis_identity`] those fingerprints were read from.
#[derive(Default)]
pub struct Unchanged {
    seen: Mutex<HashMap<u64, (Fingerprint, u32)>>,
    redis: Mutex<Option<String>>,
}

impl Unchanged {
    /// Redis is `identity` now (None: unknown): when it is not the one the fingerprints
    /// were read from, every sale's next pass is a full one.
    pub fn redis_is(&self, identity: Option<String>) {
        let mut was = self.redis.lock().unwrap_or_else(|p| p.into_inner());
        if identity.is_none() || *was != identity {
            if was.is_some() {
                tracing::info!(
                    "Redis is not the process the last passes read (restarted or failed over): every sale on passed in full"
                );
            }
            self.seen.lock().unwrap_or_else(|p| p.into_inner()).clear();
            *was = identity;
        }
    }

    /// Whether the pass over `event_id` may be skipped, `now` showing `now` (counted as
    /// skipped if so).
    pub fn skip(&self, event_id: u64, now: &Fingerprint) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match seen.get_mut(&event_id) {
            Some((balanced, skipped)) if balanced == now && *skipped + 1 < FULL_EVERY => {
                *skipped += 1;
                true
            }
            _ => false,
        }
    }

    /// A full pass found the books balanced, with nothing queued, moving or healed,
    /// Redis showing `then` before it.
    pub fn balanced(&self, event_id: u64, then: Fingerprint) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.insert(event_id, (then, 0));
    }

    /// The next pass over `event_id` is a full one.
    pub fn forget(&self, event_id: u64) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&event_id);
    }

    /// Keeps only the sales in `listed` (the others were retired or deleted).
    pub fn keep(&self, listed: &HashSet<u64>) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| listed.contains(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn print(stock: &str) -> Fingerprint {
        Fingerprint(vec![BTreeMap::from([("1".to_owned(), stock.to_owned())])])
    }

    #[test]
    fn an_unchanged_sale_is_passed_every_full_every_th_time_and_a_change_at_once() {
        let unchanged = Unchanged::default();
        assert!(
            !unchanged.skip(7, &print("10")),
            "never passed: a full pass"
        );
        unchanged.balanced(7, print("10"));
        let made: Vec<bool> = (0..2 * FULL_EVERY)
            .map(|_| {
                let skipped = unchanged.skip(7, &print("10"));
                if !skipped {
                    unchanged.balanced(7, print("10"));
                }
                !skipped
            })
            .collect();
        let full = made.iter().filter(|&&m| m).count();
        assert_eq!(full, 2, "{made:?}");
        assert!(made[FULL_EVERY as usize - 1], "{made:?}");
        assert!(!unchanged.skip(7, &print("9")), "a change: a full pass");
        unchanged.forget(7);
        assert!(!unchanged.skip(7, &print("10")), "forgotten: a full pass");
        unchanged.balanced(7, print("10"));
        unchanged.keep(&HashSet::from([8]));
        assert!(!unchanged.skip(7, &print("10")), "no longer listed");
    }

    #[test]
    fn another_redis_process_makes_every_next_pass_a_full_one() {
        let unchanged = Unchanged::default();
        unchanged.redis_is(Some("=a".to_owned()));
        unchanged.balanced(7, print("10"));
        unchanged.redis_is(Some("=a".to_owned()));
        assert!(unchanged.skip(7, &print("10")), "the same Redis: skipped");
        unchanged.redis_is(Some("=b".to_owned()));
        assert!(!unchanged.skip(7, &print("10")), "restarted: a full pass");
        unchanged.balanced(7, print("10"));
        unchanged.redis_is(None);
        assert!(!unchanged.skip(7, &print("10")), "unknown: a full pass");
    }
}
