//! A 202 that survives its Redis master: with `redis.wait_replicas = N` (N > 0), an
//! admission is answered only once N replicas have its writes (README "What a 202
//! survives"; docs/scaling.md). Redis's `WAIT` gives that, but it holds the connection
//! that sends it and covers only that connection's own writes; so each event's
//! admissions are committed in groups, on a connection of the event's own: a round
//! writes one counter in the event's slot (ordered after every admission that master
//! has answered), reads the Idempotency-Key records of the admissions it covers, and
//! waits for the replicas. One round at a time per event; whoever arrives during a
//! round rides the next.
//!
//! An admission whose record the round does not find was lost on the way (its master
//! failed over, between the script and the round, to a replica that had not received
//! it): its buyer is told the outcome is unknown, never 202.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OnceCell;

use crate::config::RedisSettings;
use crate::domain::{OrderNo, UserId};
use crate::infra::redis::Redis;
use crate::keys::{self, Bucket, Keys};

/// What the replicas confirmed for one admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replicated {
    /// At least the wanted number of replicas have it.
    Yes,
    /// Fewer replicas answered within the timeout (a replica down or far behind): the
    /// admission stands on its master alone.
    TimedOut { acks: u32 },
    /// The master the round reached does not have it.
    Lost,
}

/// The group commit of admissions to the replicas, per event.
pub struct ReplicaBarrier {
    settings: RedisSettings,
    keys: Keys,
    replicas: u32,
    timeout: Duration,
    events: Mutex<HashMap<Bucket, Arc<EventRounds>>>,
    /// When the last "fewer replicas" warning was logged (ms since the epoch).
    warned_ms: AtomicU64,
}

/// A bucket without an admission for this long loses its rounds and connection when
/// another bucket's admissions start: a core that sold many sales keeps connections for
/// the ones selling, not for every one since it started.
const IDLE_DROP_MS: u64 = 5 * 60 * 1000;

#[derive(Default)]
struct EventRounds {
    /// The event's own connection (WAIT holds it), made at its first admission.
    redis: OnceCell<Redis>,
    /// When an admission last came (ms on the monotonic clock of `confirm`).
    used_ms: AtomicU64,
    /// Admissions waiting for a round. A ticket is taken and its entry pushed under this
    /// lock, so a round that takes the list takes exactly the tickets up to the last
    /// one issued.
    waiting: Mutex<Waiting>,
    /// What the rounds found: the tickets covered so far, the last round's acks, and
    /// whether each covered admission's record was there (taken by its admission).
    rounds: tokio::sync::Mutex<Rounds>,
}

/// The last ticket issued, and the admissions no round has taken yet.
#[derive(Default)]
struct Waiting {
    issued: u64,
    /// (ticket, Idempotency-Key field, request id)
    entries: Vec<(u64, String, OrderNo)>,
}

#[derive(Default)]
struct Rounds {
    covered: u64,
    acks: u32,
    found: HashMap<u64, bool>,
}

impl ReplicaBarrier {
    pub fn new(
        settings: RedisSettings,
        keys: Keys,
        replicas: u32,
        timeout: Duration,
    ) -> ReplicaBarrier {
        ReplicaBarrier {
            settings,
            keys,
            replicas,
            timeout,
            events: Mutex::new(HashMap::new()),
            warned_ms: AtomicU64::new(0),
        }
    }

    /// Waits until a round that began after this admission (request `rid` of `user` with
    /// `idempotency_key`, in `bucket`) has reached the replicas (rounds are per bucket: the
    /// bucket is the slot, so the master, its admission reached).
    pub async fn confirm(
        &self,
        bucket: Bucket,
        user: UserId,
        idempotency_key: &str,
        rid: OrderNo,
    ) -> anyhow::Result<Replicated> {
        let event = {
            // Milliseconds of a monotonic clock: a jump of the wall clock prunes nothing.
            static START: std::sync::LazyLock<std::time::Instant> =
                std::sync::LazyLock::new(std::time::Instant::now);
            let now = START.elapsed().as_millis() as u64;
            let mut events = self.events.lock().expect("barrier map");
            if !events.contains_key(&bucket) {
                events.retain(|_, e| {
                    now.saturating_sub(e.used_ms.load(Ordering::Relaxed)) < IDLE_DROP_MS
                });
            }
            let event = events.entry(bucket).or_default().clone();
            event.used_ms.store(now, Ordering::Relaxed);
            event
        };
        let ticket = {
            let mut waiting = event.waiting.lock().expect("barrier queue");
            waiting.issued += 1;
            let ticket = waiting.issued;
            waiting
                .entries
                .push((ticket, keys::idempotency_field(user, idempotency_key), rid));
            ticket
        };
        let mut rounds = event.rounds.lock().await;
        if rounds.covered < ticket {
            let (covers, batch) = {
                let mut waiting = event.waiting.lock().expect("barrier queue");
                (waiting.issued, std::mem::take(&mut waiting.entries))
            };
            if batch.is_empty() {
                // Every waiting entry went with a round that failed: nothing to look for.
                rounds.covered = covers;
                return Ok(Replicated::Lost);
            }
            let redis = event
                .redis
                .get_or_try_init(|| {
                    crate::infra::redis::connect(&self.settings, Duration::from_secs(2))
                })
                .await?;
            let fields: Vec<&str> = batch.iter().map(|(_, f, _)| f.as_str()).collect();
            let (_, records, acks): (u64, Vec<Option<String>>, u32) = redis::pipe()
                .incr(self.keys.replication_barrier(bucket), 1)
                .cmd("HMGET")
                .arg(self.keys.idempotency(bucket))
                .arg(&fields)
                .cmd("WAIT")
                .arg(self.replicas)
                .arg(self.timeout.as_millis() as u64)
                .query_async(&mut redis.clone())
                .await?;
            for ((t, _, rid), record) in batch.iter().zip(records) {
                let found = record.is_some_and(|r| keys::idempotency_request(&r) == Some(*rid));
                rounds.found.insert(*t, found);
            }
            rounds.covered = covers;
            rounds.acks = acks;
        }
        // Absent: its round failed before it could look (the next one did not carry it).
        Ok(if !rounds.found.remove(&ticket).unwrap_or(false) {
            Replicated::Lost
        } else if rounds.acks < self.replicas {
            Replicated::TimedOut { acks: rounds.acks }
        } else {
            Replicated::Yes
        })
    }

    /// Logs, at most every 10 s, that admissions stand on their master alone.
    pub fn warn_timed_out(&self, acks: u32) {
        let now = chrono::Utc::now().timestamp_millis() as u64;
        let last = self.warned_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 10_000
            && self
                .warned_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                acks,
                wanted = self.replicas,
                timeout_ms = self.timeout.as_millis() as u64,
                "fewer replicas than redis.wait_replicas confirmed admissions in time; \
                 answering 202 on the master's word (a replica is down or far behind)"
            );
        }
    }
}
