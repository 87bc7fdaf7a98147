//! Order creation (DESIGN.md "Order creation"): a 202 is a promise, and this keeps it.
//!
//! Workers (`worker`) read the events' reservation streams through one consumer group,
//! in batches, and take over entries a dead worker left pending. Per batch (`create`),
//! one RocketMQ transactional message on `stock-sync` (`tx`); its local transaction
//! creates the batch's orders, stock_log and stock_batch rows in MySQL (`persist`).
//! Committed → the purchases become CREATED in Redis and the entries are dropped
//! (`redis`), and one delayed `order-timeout` message, naming the batch's orders, goes
//! out. If the broker cannot take the
//! half message, the orders are created all the same and stock_batch (the outbox) waits
//! for stock sync's sweeper. If MySQL is down, the entries stay in the stream and the
//! worker retries with backoff. What happens to an order after that belongs to
//! `stock_sync` and `lifecycle`.

mod create;
pub mod guards;
pub mod persist;
pub mod redis;
pub mod reservation;
pub mod tx;
mod worker;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::infra::mysql::CallTimeout;
use crate::infra::redis::Redis;
use mysql_async::Pool;

use crate::catalog::EventCache;
use crate::config::OrderSettings;
use crate::keys::{Bucket, Keys};
use crate::messaging::MqCell;
use crate::preload::Preloader;

/// Everything the workers share.
pub struct Pipeline {
    pub redis: Redis,
    pub mysql: Pool,
    pub keys: Keys,
    /// The same cache the admission path reads.
    pub events: Arc<EventCache>,
    /// Fences an event whose Redis state went back in time, for a rebuild.
    pub preloader: Preloader,
    pub shards: u32,
    /// Bounds each MySQL call of a batch (`mysql.call_timeout_ms`).
    pub call_timeout: CallTimeout,
    pub settings: OrderSettings,
    /// Names this instance's consumers in the group.
    pub instance: String,
    /// The RocketMQ clients once started; until then, outbox mode.
    pub mq: MqCell,
    /// Why order creation is stuck, if it is (for readiness and stats).
    pub blocked: Mutex<Option<String>>,
    pub orders_created: prometheus::IntCounter,
    pub released: prometheus::IntCounter,
    pub refused: prometheus::IntCounter,
    /// Times Redis was found gone back in time (and the event fenced).
    pub rewinds: prometheus::IntCounter,
    /// Reservations taken over from a consumer that left them idle (XAUTOCLAIM).
    pub taken_over: prometheus::IntCounter,
    /// When this core's workers read each stream for new reservations again; shared
    /// with admission, which wakes the streams it may add to.
    pub idle: Arc<IdleStreams>,
    /// Batches of new reservations per bucket at a time in this core.
    pub reading: Turns,
    /// Whose turn it is to look in each stream for reservations left idle.
    pub claims: Claims,
}

impl Pipeline {
    pub fn blocked_reason(&self) -> Option<String> {
        self.blocked.lock().expect("not poisoned").clone()
    }

    fn set_blocked(&self, reason: Option<String>) {
        *self.blocked.lock().expect("not poisoned") = reason;
    }
}

/// How long a turn holds the other workers back: a batch that takes longer (a slow or
/// hung MySQL, retries, a batch created order by order, reservations past their deadline
/// given back one by one) lets another worker read the stream's new reservations.
pub const TURN_LAPSE: Duration = Duration::from_secs(2);

/// Batches of new reservations this core's workers are reading and creating now, per
/// bucket: at most `orders.batches_per_stream` (1 by default), so what comes in
/// meanwhile waits for the next read and goes into one larger batch (one MySQL
/// transaction, one transactional message, one settle (in chunks) and one order-timeout
/// message per batch), while other buckets and events are served in parallel.
#[derive(Default)]
pub struct Turns {
    /// Per bucket, each turn held: its token and when it was taken.
    held: Mutex<HashMap<Bucket, Vec<(u64, Instant)>>>,
    tokens: AtomicU64,
}

impl Turns {
    /// A turn at `bucket` if fewer than `at_once` are held (a turn older than
    /// [`TURN_LAPSE`] counts no more); given back when dropped.
    pub fn take(&self, bucket: Bucket, at_once: usize, now: Instant) -> Option<Turn<'_>> {
        let mut held = self.held.lock().expect("not poisoned");
        let turns = held.entry(bucket).or_default();
        turns.retain(|(_, since)| now.saturating_duration_since(*since) < TURN_LAPSE);
        if turns.len() >= at_once {
            return None;
        }
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        turns.push((token, now));
        Some(Turn {
            turns: self,
            bucket,
            token,
        })
    }
}

/// A worker's turn at one bucket's new reservations.
pub struct Turn<'a> {
    turns: &'a Turns,
    bucket: Bucket,
    token: u64,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut held = self.turns.held.lock().expect("not poisoned");
        if let Some(turns) = held.get_mut(&self.bucket) {
            // Gone already if it lapsed and was pruned; never another's.
            turns.retain(|(token, _)| *token != self.token);
            if turns.is_empty() {
                held.remove(&self.bucket);
            }
        }
    }
}

/// The first wait before a stream found empty is read again, doubled while it stays
/// empty: up to [`IDLE_AWAKE`] after this core tried to queue a purchase in it, else up
/// to [`IDLE_MAX`].
pub const IDLE_FIRST: Duration = Duration::from_millis(10);
/// The longest a stream this core tried to queue in since its last read waits: a stream
/// under this core's admissions is read as it was before idle streams waited longer.
pub const IDLE_AWAKE: Duration = Duration::from_millis(200);
/// The longest any listed stream waits (another core's admissions, which that core's
/// workers read at once; or a core gone before its workers read them).
pub const IDLE_MAX: Duration = Duration::from_secs(2);

/// Streams found empty, per bucket: when this core's workers last read each and how long
/// they wait before the next read. A stream with entries is read again at once. Every
/// listed sale's streams are read by every core, so what an idle stack spends grows
/// with the sales listed: 275 listed on the test stack were 1 145 XREADGROUPs a second
/// when every empty stream was read every 200 ms. A stream waits up to [`IDLE_MAX`] now,
/// and a purchase this core tries to queue in it brings its next read back within
/// [`IDLE_AWAKE`]: reservations queued by another core (whose workers read them at
/// once) wait here up to [`IDLE_MAX`].
#[derive(Default)]
pub struct IdleStreams(Mutex<HashMap<Bucket, Idle>>);

#[derive(Clone, Copy)]
struct Idle {
    read_at: Instant,
    wait: Duration,
    /// When this core last tried to queue a purchase in the stream.
    woken_at: Option<Instant>,
}

impl IdleStreams {
    /// Whether this core's workers should read the stream for new entries now.
    pub fn due(&self, bucket: Bucket, now: Instant) -> bool {
        let idle = self.0.lock().expect("not poisoned");
        idle.get(&bucket).is_none_or(|i| now >= i.read_at + i.wait)
    }

    /// After a read of new entries that started at `started`: an empty stream waits
    /// longer each time, unless a purchase was queued while it was read (its entry may
    /// have come after the read: [`IDLE_FIRST`]); one with entries is read again at once.
    pub fn read(&self, bucket: Bucket, found: bool, started: Instant, now: Instant) {
        let mut idle = self.0.lock().expect("not poisoned");
        if found {
            idle.remove(&bucket);
            return;
        }
        let wait = match idle.get(&bucket) {
            None => IDLE_FIRST,
            Some(i) if i.woken_at.is_some_and(|at| at >= started) => IDLE_FIRST,
            Some(i) => (i.wait * 2).min(IDLE_MAX),
        };
        idle.insert(
            bucket,
            Idle {
                read_at: now,
                wait,
                woken_at: None,
            },
        );
    }

    /// This core tried to queue a purchase in the stream (admitted or not: a script
    /// whose answer was lost may have queued it): read it within [`IDLE_AWAKE`] of the
    /// last read (at once if that is past).
    pub fn woken(&self, bucket: Bucket, now: Instant) {
        let mut idle = self.0.lock().expect("not poisoned");
        if let Some(i) = idle.get_mut(&bucket) {
            i.wait = i.wait.min(IDLE_AWAKE);
            i.woken_at = Some(now);
        }
    }

    /// Forgets the buckets no longer listed (retired sales).
    pub fn keep(&self, listed: &HashSet<Bucket>) {
        let mut idle = self.0.lock().expect("not poisoned");
        idle.retain(|b, _| listed.contains(b));
    }
}

/// When one of this core's workers last looked in each stream for reservations a
/// consumer left idle (`claim_stale.lua`): one worker a core looks, every half of
/// `orders.claim_idle_ms`, and the next at once when a look found a full batch (so a
/// backlog is taken over as fast as before). Each worker used to, so an idle cluster
/// with 11 sales of 3 buckets listed ran 110 of those scripts a second (4 workers × 2
/// cores × 33 streams every 2.5 s).
#[derive(Default)]
pub struct Claims(Mutex<HashMap<Bucket, Instant>>);

impl Claims {
    /// True (and the turn taken) for the first worker to ask `every` after the last.
    pub fn due(&self, bucket: Bucket, every: Duration, now: Instant) -> bool {
        let mut last = self.0.lock().expect("not poisoned");
        if last.get(&bucket).is_some_and(|at| now < *at + every) {
            return false;
        }
        last.insert(bucket, now);
        true
    }

    /// The next worker to ask looks at once: the last look found a full batch, so more
    /// may be waiting (a backlog left by an outage, a killed core's entries behind it).
    pub fn again(&self, bucket: Bucket) {
        self.0.lock().expect("not poisoned").remove(&bucket);
    }

    /// Forgets the buckets no longer listed (retired sales).
    pub fn keep(&self, listed: &HashSet<Bucket>) {
        let mut last = self.0.lock().expect("not poisoned");
        last.retain(|b, _| listed.contains(b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::EventId;

    #[test]
    fn an_empty_stream_waits_longer_until_this_core_queues_in_it() {
        let idle = IdleStreams::default();
        let (a, b) = (Bucket::only(EventId(1)), Bucket::only(EventId(2)));
        let t0 = Instant::now();
        assert!(idle.due(a, t0), "a stream never read is read at once");
        // Empty reads: 10, 20, 40 … ms, then IDLE_MAX.
        let mut t = t0;
        let mut waits = Vec::new();
        for _ in 0..12 {
            idle.read(a, false, t, t);
            let mut wait = Duration::ZERO;
            while !idle.due(a, t + wait) {
                wait += Duration::from_millis(1);
            }
            waits.push(wait.as_millis());
            t += wait;
        }
        assert_eq!(
            waits,
            [10, 20, 40, 80, 160, 320, 640, 1280, 2000, 2000, 2000, 2000]
        );
        assert!(idle.due(b, t), "each stream has its own wait");
        // An idle stream (waiting IDLE_MAX) this core queues in: due IDLE_AWAKE after
        // its last read.
        let quiet = |at: Instant| {
            for _ in 0..10 {
                idle.read(a, false, at, at);
            }
        };
        quiet(t);
        assert!(!idle.due(a, t + IDLE_AWAKE), "waiting IDLE_MAX");
        idle.woken(a, t + Duration::from_millis(100));
        assert!(!idle.due(a, t + IDLE_AWAKE - Duration::from_millis(1)));
        assert!(idle.due(a, t + IDLE_AWAKE));
        // A purchase 900 ms after the read: due at once.
        quiet(t);
        let later = t + Duration::from_millis(900);
        assert!(!idle.due(a, later));
        idle.woken(a, later);
        assert!(idle.due(a, later));
        // Queued while a read was under way (the read may have missed it): the first
        // wait, not double IDLE_AWAKE. Queued before the read began: the read saw it.
        quiet(t);
        let (started, woke, ended) = (
            t + Duration::from_millis(1),
            t + Duration::from_millis(2),
            t + Duration::from_millis(3),
        );
        idle.woken(a, woke);
        idle.read(a, false, started, ended);
        assert!(idle.due(a, ended + IDLE_FIRST));
        quiet(t);
        idle.woken(a, t);
        idle.read(a, false, started, ended);
        assert!(!idle.due(a, ended + IDLE_AWAKE), "doubled from IDLE_AWAKE");
        assert!(idle.due(a, ended + 2 * IDLE_AWAKE));
        // Entries found: read at once; a shorter wait is never lengthened.
        idle.read(a, true, t, t);
        assert!(idle.due(a, t));
        idle.read(a, false, t, t);
        idle.woken(a, t);
        assert!(idle.due(a, t + IDLE_FIRST), "still the first wait");
        idle.keep(&HashSet::from([b]));
        assert!(idle.due(a, t), "a stream no longer listed is forgotten");
    }

    #[test]
    fn one_worker_a_core_looks_for_idle_reservations_per_stream_and_period() {
        let claims = Claims::default();
        let (a, b) = (Bucket::only(EventId(1)), Bucket::only(EventId(2)));
        let every = Duration::from_millis(2_500);
        let t0 = Instant::now();
        assert!(claims.due(a, every, t0), "the first to ask looks");
        assert!(!claims.due(a, every, t0), "the next worker does not");
        assert!(
            !claims.due(a, every, t0 + every / 2),
            "nor before the period is over"
        );
        assert!(claims.due(b, every, t0), "each stream has its own turn");
        assert!(
            claims.due(a, every, t0 + every),
            "and again after the period"
        );
        claims.again(a);
        assert!(
            claims.due(a, every, t0 + every),
            "at once after a look that found a full batch"
        );
        assert!(!claims.due(a, every, t0 + every));
        claims.keep(&HashSet::from([b]));
        assert!(
            claims.due(a, every, t0 + every),
            "a stream no longer listed is forgotten"
        );
    }

    #[test]
    fn turns_per_bucket_up_to_the_limit_until_given_back_or_lapsed() {
        let turns = Turns::default();
        let (a, b) = (Bucket::only(EventId(1)), Bucket::only(EventId(2)));
        let t0 = Instant::now();
        let first = turns.take(a, 1, t0).expect("a free bucket");
        assert!(
            turns.take(a, 1, t0).is_none(),
            "a second batch of the same bucket"
        );
        assert!(
            turns.take(a, 1, t0).is_none(),
            "a refused turn gives back nobody's"
        );
        let other = turns
            .take(b, 1, t0)
            .expect("another bucket is served meanwhile");
        drop(first);
        let again = turns.take(a, 1, t0).expect("given back when dropped");
        // Two at once when the setting says so.
        let second = turns
            .take(a, 2, t0)
            .expect("a second turn under a limit of two");
        assert!(turns.take(a, 2, t0).is_none());
        drop(second);
        // A turn held past the lapse no longer holds the others back, and giving it
        // back later does not give back the one taken since.
        let late = t0 + TURN_LAPSE;
        let after = turns.take(a, 1, late).expect("the held turn lapsed");
        drop(again);
        assert!(
            turns.take(a, 1, late).is_none(),
            "the lapsed one gave back another's"
        );
        drop(after);
        drop(other);
        assert!(
            turns.held.lock().unwrap().is_empty(),
            "nothing kept per bucket"
        );
    }
}
