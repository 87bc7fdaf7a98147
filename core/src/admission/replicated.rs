//! A 202 that survives its Redis master: with `redis.wait_replicas = N` (N > 0), an
//! admission is answered only once N replicas have its writes (README "What a 202
//! survives"; docs/scaling.md). Redis's `WAIT` gives that, but it blocks the connection
//! that sends it and covers only that connection's own writes; so each event's
//! admissions are committed in groups on a connection of their own: a round writes one
//! counter in the event's slot (a write ordered after every admission already answered
//! by that master), then waits for the replicas; every admission that finished before
//! the round began is covered by it. One round at a time per event; whoever arrives
//! during a round rides the next.
//!
//! The round also reads the event's admission counter `seq`: an admission whose number
//! is above it was lost on the way (the master failed over between the script and the
//! round, to a replica that had not received it), and its buyer is told the outcome is
//! unknown rather than 202.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::domain::EventId;
use crate::infra::redis::Redis;
use crate::keys::Keys;

/// What the replicas confirmed for one admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replicated {
    /// At least the wanted number of replicas have it.
    Yes,
    /// Fewer replicas answered within the timeout (a replica down or far behind): the
    /// admission stands on its master alone.
    TimedOut { acks: u32 },
    /// The master that answered the round no longer has it.
    Lost,
}

/// The group commit of admissions to the replicas, per event.
pub struct ReplicaBarrier {
    /// A connection of its own: WAIT holds the connection it is sent on.
    redis: Redis,
    keys: Keys,
    replicas: u32,
    timeout: Duration,
    events: Mutex<HashMap<EventId, Arc<EventRounds>>>,
    /// When the last "fewer replicas" warning was logged (ms since the epoch).
    warned_ms: AtomicU64,
}

#[derive(Default)]
struct EventRounds {
    /// Admissions that asked to be covered so far (tickets).
    asked: AtomicU64,
    /// The last round: the tickets it covered, its acks and the `seq` it read.
    last: tokio::sync::Mutex<Round>,
}

#[derive(Default, Clone, Copy)]
struct Round {
    covered: u64,
    acks: u32,
    seq: u64,
}

impl ReplicaBarrier {
    pub fn new(redis: Redis, keys: Keys, replicas: u32, timeout: Duration) -> ReplicaBarrier {
        ReplicaBarrier {
            redis,
            keys,
            replicas,
            timeout,
            events: Mutex::new(HashMap::new()),
            warned_ms: AtomicU64::new(0),
        }
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

    /// Waits until a round that began after this admission (number `seq`, 0 when the
    /// answer is a replay) has reached the replicas.
    pub async fn confirm(&self, event_id: EventId, seq: u64) -> redis::RedisResult<Replicated> {
        let rounds = {
            let mut events = self.events.lock().expect("barrier map");
            events.entry(event_id).or_default().clone()
        };
        let ticket = rounds.asked.fetch_add(1, Ordering::SeqCst) + 1;
        let mut last = rounds.last.lock().await;
        if last.covered < ticket {
            // Every ticket up to here belongs to an admission whose script had answered
            // before this round's write is sent.
            let covers = rounds.asked.load(Ordering::SeqCst);
            let (_, seq_now, acks): (u64, Option<u64>, u32) = redis::pipe()
                .incr(self.keys.replication_barrier(event_id), 1)
                .hget(self.keys.event_meta(event_id), "seq")
                .cmd("WAIT")
                .arg(self.replicas)
                .arg(self.timeout.as_millis() as u64)
                .query_async(&mut self.redis.clone())
                .await?;
            *last = Round {
                covered: covers,
                acks,
                seq: seq_now.unwrap_or(0),
            };
        }
        Ok(if seq > last.seq {
            Replicated::Lost
        } else if last.acks < self.replicas {
            Replicated::TimedOut { acks: last.acks }
        } else {
            Replicated::Yes
        })
    }
}
