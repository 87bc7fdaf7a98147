//! A 202 that survives its Redis master: with `redis.wait_replicas = N` (N > 0), an
//! admission is answered only once N replicas have its writes (README "What a 202
//! survives"; docs/scaling.md). Redis's `WAIT` gives that, but it holds the connection
//! that sends it and covers only that connection's own writes; so each slot's writes
//! are committed in groups, on a connection of the slot's own: a round writes one
//! counter in the slot (ordered after every write that master has answered), reads the
//! records of the writes it covers, and waits for the replicas. One round at a time per
//! slot; whoever arrives during a round rides the next.
//!
//! Four writes wait for a round before anything is built on them: an admission (in its
//! bucket), a seat lock in the event's slot before the buyer's bucket admits on it, the
//! first step of a move between an event's places before the units are credited where
//! they go, and that credit before the move's record is deleted. A write whose record
//! the round does not find was lost on the way (its master failed over, between the
//! script and the round, to a replica that had not received it): nothing is built on it
//! — an admission's buyer is told the outcome is unknown, never 202; a lost seat lock
//! admits nobody; a lost move credits nothing; a lost credit keeps its move's record,
//! which the sweeper credits again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OnceCell;

use crate::config::RedisSettings;
use crate::domain::{OrderNo, UserId};
use crate::infra::redis::Redis;
use crate::keys::{self, Bucket, Keys};
use crate::telemetry::Throttle;

/// What the replicas confirmed for one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replicated {
    /// At least the wanted number of replicas have it.
    Yes,
    /// Fewer replicas answered within the timeout (a replica down or far behind): the
    /// write stands on its master alone.
    TimedOut { acks: u32 },
    /// The master the round reached does not have it.
    Lost,
    /// Its round failed before it could look (it went with the round another write
    /// ran): kept or lost, nobody knows.
    Unknown,
}

/// Why a write is not known to be kept by the replicas: nothing may be built on it.
#[derive(Debug, thiserror::Error)]
pub enum NotKept {
    #[error("its master failed over before the replicas had it")]
    Lost,
    #[error("the barrier round that covered it failed")]
    Unknown,
    #[error("the barrier round failed: {0:#}")]
    Failed(anyhow::Error),
}

/// The record a round looks for: a field of a hash, or a member of a set, in the
/// round's slot, and what it must say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The hash (or set) it is in.
    hash: String,
    field: String,
    look: Look,
}

/// What makes a [`Record`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    /// The field is an Idempotency-Key record naming this request.
    Names(OrderNo),
    /// The field, whatever its value.
    Field,
    /// `hash` is a set, with `field` a member.
    Member,
}

impl Record {
    /// Request `rid`'s admission under `user`'s `idempotency_key`, in `bucket`.
    pub fn admission(
        keys: &Keys,
        bucket: Bucket,
        user: UserId,
        idempotency_key: &str,
        rid: OrderNo,
    ) -> Record {
        Record {
            hash: keys.idempotency(bucket),
            field: keys::idempotency_field(user, idempotency_key),
            look: Look::Names(rid),
        }
    }

    /// Request `rid`'s seat lock (`seat_lock.lua`), in the event's slot.
    pub fn seat_lock(keys: &Keys, event: crate::domain::EventId, rid: OrderNo) -> Record {
        Record {
            hash: keys.seat_lock_records(event),
            field: rid.to_string(),
            look: Look::Field,
        }
    }

    /// Move `id`'s record in the hash of moves (`move_out.lua`) of the place it left.
    pub fn move_out(moves: String, id: &str) -> Record {
        Record {
            hash: moves,
            field: id.to_owned(),
            look: Look::Field,
        }
    }

    /// Move `id`'s credit (`move_in.lua`) in the set of moves credited to the place it
    /// went to.
    pub fn move_in(credited: String, id: &str) -> Record {
        Record {
            hash: credited,
            field: id.to_owned(),
            look: Look::Member,
        }
    }

    /// Whether a round's reply for this record (an HMGET's value, or for a set's
    /// member "1" when SMISMEMBER found it) says the write is there.
    fn found(&self, value: Option<String>) -> bool {
        match self.look {
            Look::Names(rid) => value.is_some_and(|r| keys::idempotency_request(&r) == Some(rid)),
            Look::Field => value.is_some(),
            Look::Member => value.as_deref() == Some("1"),
        }
    }
}

/// The group commit of writes to the replicas, per slot.
pub struct ReplicaBarrier {
    settings: RedisSettings,
    keys: Keys,
    replicas: u32,
    timeout: Duration,
    slots: Mutex<HashMap<Bucket, Arc<SlotRounds>>>,
    /// The "fewer replicas" warning, at most every 10 s.
    warned: Throttle,
}

/// A slot without a write for this long loses its rounds and connection when another
/// slot's writes start: a core that sold many sales keeps connections for the ones
/// selling, not for every one since it started.
const IDLE_DROP_MS: u64 = 5 * 60 * 1000;

#[derive(Default)]
struct SlotRounds {
    /// The slot's own connection (WAIT holds it), made at its first write.
    redis: OnceCell<Redis>,
    /// When a write last came (ms on the monotonic clock of `confirm`).
    used_ms: AtomicU64,
    /// Writes waiting for a round. A ticket is taken and its entry pushed under this
    /// lock, so a round that takes the list takes exactly the tickets up to the last
    /// one issued.
    waiting: Mutex<Waiting>,
    /// What the rounds found: the tickets covered so far, the last round's acks, and
    /// whether each covered write's record was there (taken by its write).
    rounds: tokio::sync::Mutex<Rounds>,
}

/// The last ticket issued, and the writes no round has taken yet.
#[derive(Default)]
struct Waiting {
    issued: u64,
    entries: Vec<(u64, Record)>,
}

#[derive(Default)]
struct Rounds {
    covered: u64,
    acks: u32,
    found: HashMap<u64, bool>,
}

impl ReplicaBarrier {
    /// The barrier `redis.wait_replicas` asks for (None when it is 0). Its connections
    /// are its own, one per slot: WAIT holds the one it is sent on.
    pub fn from_settings(settings: &RedisSettings) -> Option<Arc<ReplicaBarrier>> {
        (settings.wait_replicas > 0).then(|| {
            Arc::new(ReplicaBarrier::new(
                settings.clone(),
                Keys::new(&settings.key_prefix),
                settings.wait_replicas,
                Duration::from_millis(settings.wait_timeout_ms),
            ))
        })
    }

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
            slots: Mutex::new(HashMap::new()),
            warned: Throttle::new(Duration::from_secs(10)),
        }
    }

    /// Waits until a round that began after the write of `record` in `slot` (a bucket's
    /// keys, or with [`Bucket::seat_home`] the event's own) has reached the replicas. Ok
    /// when they have it, or when fewer than `redis.wait_replicas` answered within
    /// `redis.wait_timeout_ms` (a replica down or far behind: the write then stands on
    /// its master's word, logged at most every 10 s — a stopped replica must not stop
    /// the sale); else why it is not known to be kept.
    pub async fn kept(&self, slot: Bucket, record: Record) -> Result<(), NotKept> {
        match self.confirm(slot, record).await {
            Ok(Replicated::Yes) => Ok(()),
            Ok(Replicated::TimedOut { acks }) => {
                self.warn_timed_out(acks);
                Ok(())
            }
            Ok(Replicated::Lost) => Err(NotKept::Lost),
            Ok(Replicated::Unknown) => Err(NotKept::Unknown),
            Err(e) => Err(NotKept::Failed(e)),
        }
    }

    /// One round's verdict on `record`: whether the master that round reached had it.
    async fn confirm(&self, slot: Bucket, record: Record) -> anyhow::Result<Replicated> {
        let rounds_of = {
            // Milliseconds of a monotonic clock: a jump of the wall clock prunes nothing.
            static START: std::sync::LazyLock<std::time::Instant> =
                std::sync::LazyLock::new(std::time::Instant::now);
            let now = START.elapsed().as_millis() as u64;
            let mut slots = self.slots.lock().expect("barrier map");
            if !slots.contains_key(&slot) {
                slots.retain(|_, e| {
                    now.saturating_sub(e.used_ms.load(Ordering::Relaxed)) < IDLE_DROP_MS
                });
            }
            let rounds_of = slots.entry(slot).or_default().clone();
            rounds_of.used_ms.store(now, Ordering::Relaxed);
            rounds_of
        };
        let ticket = {
            let mut waiting = rounds_of.waiting.lock().expect("barrier queue");
            waiting.issued += 1;
            let ticket = waiting.issued;
            waiting.entries.push((ticket, record));
            ticket
        };
        let mut rounds = rounds_of.rounds.lock().await;
        if rounds.covered < ticket {
            let (covers, batch) = {
                let mut waiting = rounds_of.waiting.lock().expect("barrier queue");
                (waiting.issued, std::mem::take(&mut waiting.entries))
            };
            if batch.is_empty() {
                // Every waiting entry went with a round that failed: nothing to look for.
                rounds.covered = covers;
                return Ok(Replicated::Unknown);
            }
            let redis = rounds_of
                .redis
                .get_or_try_init(|| {
                    crate::infra::redis::connect(&self.settings, Duration::from_secs(2))
                })
                .await?;
            // One HMGET per hash the batch's records are in (SMISMEMBER per set), in
            // the order first met.
            let mut hashes: Vec<&str> = Vec::new();
            for (_, r) in &batch {
                if !hashes.contains(&r.hash.as_str()) {
                    hashes.push(&r.hash);
                }
            }
            let mut pipe = redis::pipe();
            pipe.incr(self.keys.replication_barrier(slot), 1).ignore();
            for hash in &hashes {
                let fields: Vec<&(u64, Record)> =
                    batch.iter().filter(|(_, r)| r.hash == *hash).collect();
                let set = fields.iter().any(|(_, r)| r.look == Look::Member);
                // A key is a hash or a set: a field read as a member would be found by
                // SMISMEMBER's 0.
                debug_assert!(fields.iter().all(|(_, r)| (r.look == Look::Member) == set));
                pipe.cmd(if set { "SMISMEMBER" } else { "HMGET" })
                    .arg(*hash)
                    .arg(
                        fields
                            .iter()
                            .map(|(_, r)| r.field.as_str())
                            .collect::<Vec<_>>(),
                    );
            }
            pipe.cmd("WAIT")
                .arg(self.replicas)
                .arg(self.timeout.as_millis() as u64);
            let replies: Vec<redis::Value> = pipe.query_async(&mut redis.clone()).await?;
            anyhow::ensure!(
                replies.len() == hashes.len() + 1,
                "a barrier round answered {} replies for {} hashes",
                replies.len(),
                hashes.len()
            );
            // Every reply read before any is recorded: a reply of an unexpected shape
            // leaves the batch unknown, not judged on the last round's acks.
            let mut found = Vec::with_capacity(batch.len());
            for (hash, reply) in hashes.iter().zip(&replies) {
                // SMISMEMBER's 1s and 0s read as "1" and "0"; HMGET's missing fields as
                // None.
                let values: Vec<Option<String>> = redis::from_redis_value(reply)?;
                let entries = batch.iter().filter(|(_, r)| r.hash == *hash);
                for ((t, record), value) in entries.zip(values) {
                    found.push((*t, record.found(value)));
                }
            }
            let acks: u32 = redis::from_redis_value(&replies[hashes.len()])?;
            rounds.found.extend(found);
            rounds.covered = covers;
            rounds.acks = acks;
        }
        // Absent: its round failed before it could look (the next one did not carry it).
        Ok(match rounds.found.remove(&ticket) {
            None => Replicated::Unknown,
            Some(false) => Replicated::Lost,
            Some(true) if rounds.acks < self.replicas => Replicated::TimedOut { acks: rounds.acks },
            Some(true) => Replicated::Yes,
        })
    }

    /// The longest a round waits for the replicas (`redis.wait_timeout_ms`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Logs, at most every 10 s, that writes stand on their master alone.
    fn warn_timed_out(&self, acks: u32) {
        if self.warned.due() {
            tracing::warn!(
                acks,
                wanted = self.replicas,
                timeout_ms = self.timeout.as_millis() as u64,
                "fewer replicas than redis.wait_replicas confirmed writes in time; \
                 going on (a 202 too) on the master's word (a replica is down or far behind)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::EventId;

    #[test]
    fn an_admission_is_found_only_under_its_own_request_and_other_records_by_presence() {
        let keys = Keys::new("t:");
        let bucket = Bucket::only(EventId(7));
        let admission = Record::admission(&keys, bucket, UserId(42), "k", OrderNo(9));
        assert_eq!(admission.hash, keys.idempotency(bucket));
        assert_eq!(admission.field, "42:k");
        assert!(admission.found(Some("9|202".into())));
        // The key answered another request first (a twin): not this admission's.
        assert!(!admission.found(Some("8|202".into())));
        assert!(!admission.found(None));

        let lock = Record::seat_lock(&keys, EventId(7), OrderNo(9));
        assert_eq!(
            (lock.hash.as_str(), lock.field.as_str()),
            (keys.seat_lock_records(EventId(7)).as_str(), "9")
        );
        assert!(lock.found(Some("3|42|0|1:1|k".into())));
        assert!(!lock.found(None));

        let moved = Record::move_out(keys.pool_moves(EventId(7)), "00ff");
        assert!(moved.found(Some("0|3|5|0|1".into())));
        assert!(!moved.found(None));

        // A set's member, as SMISMEMBER answers (1 or 0, read as text).
        let credited = Record::move_in(keys.credited(bucket), "00ff");
        assert!(credited.found(Some("1".into())));
        assert!(!credited.found(Some("0".into())));
        assert!(!credited.found(None));
        let reply = redis::Value::Array(vec![redis::Value::Int(1), redis::Value::Int(0)]);
        let read: Vec<Option<String>> = redis::from_redis_value(&reply).unwrap();
        assert_eq!(read, [Some("1".to_owned()), Some("0".to_owned())]);
    }
}
