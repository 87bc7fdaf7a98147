//! Order numbers: a snowflake with the buyer's gene in its low bits (seeds 000, 002).
//!
//! ```text
//!  63   62 ........ 22   21 ..... 12   11 ... 6   5 ... 0
//!  0    ms since EPOCH   worker id      sequence   user_id % 64
//! ```
//!
//! The number is minted at admission and is the reservation's request id, so the
//! order is later inserted under a number fixed before any retry: replays are
//! idempotent on it. `order_no % 64 == user_id % 64`, so with a shard count that
//! divides 64 the order number and the user id pick the same order shard.
//! Worker ids are leased from Redis, so core instances never share one.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::infra::redis::Redis;
use anyhow::Context;

use crate::domain::{OrderNo, UserId};
use crate::keys::Keys;
use crate::lock::{Lock, Owned};
use crate::shutdown::Shutdown;

/// 2026-01-01T00:00:00Z: 41 bits of milliseconds from here last until 2095.
pub const EPOCH_MS: u64 = 1_767_225_600_000;
pub const WORKER_BITS: u32 = 10;
pub const SEQUENCE_BITS: u32 = 6;
pub const GENE_BITS: u32 = 6;
pub const MAX_WORKERS: u64 = 1 << WORKER_BITS;
const SEQUENCE_MAX: u64 = (1 << SEQUENCE_BITS) - 1;
const GENE_MASK: u64 = (1 << GENE_BITS) - 1;

/// The gene of an order number or user id: its low bits.
pub fn gene(id: u64) -> u64 {
    id & GENE_MASK
}

/// The worker id that minted an order number (its consumers in the order streams are
/// named for it: `core<worker id>-<n>`).
pub fn worker_of(order_no: u64) -> u64 {
    (order_no >> (SEQUENCE_BITS + GENE_BITS)) & (MAX_WORKERS - 1)
}

/// Mints order numbers for one worker id, only while its lease is surely this
/// instance's: a core that could not renew it stops minting before another may take it.
pub struct OrderIds {
    worker: AtomicU64,
    /// (last millisecond used, sequence within it).
    clock: Mutex<(u64, u64)>,
    /// Until when the lease is surely held (two thirds of a lease past its last renewal).
    held_until: Mutex<Instant>,
    lease: Duration,
}

impl OrderIds {
    /// For a lease of `lease` just taken.
    pub fn new(worker: u64, lease: Duration) -> OrderIds {
        assert!(worker < MAX_WORKERS, "worker id {worker} out of range");
        OrderIds {
            worker: AtomicU64::new(worker),
            clock: Mutex::new((0, 0)),
            held_until: Mutex::new(Instant::now() + lease * 2 / 3),
            lease,
        }
    }

    /// The lease was renewed (or taken) just now.
    fn renewed(&self) {
        *self.held_until.lock().expect("not poisoned") = Instant::now() + self.lease * 2 / 3;
    }

    /// Whether numbers may be minted: the lease has surely not expired.
    pub fn minting(&self) -> bool {
        Instant::now() < *self.held_until.lock().expect("not poisoned")
    }

    pub fn worker(&self) -> u64 {
        self.worker.load(Ordering::Relaxed)
    }

    fn set_worker(&self, worker: u64) {
        self.worker.store(worker, Ordering::Relaxed);
    }

    /// A new order number for `user_id`, unique per worker and increasing in time; None
    /// while the lease is not surely held (see [`OrderIds::minting`]).
    pub fn next(&self, user_id: UserId) -> Option<OrderNo> {
        if !self.minting() {
            return None;
        }
        let (ms, seq) = {
            let mut clock = self
                .clock
                .lock()
                .expect("the id clock lock is never poisoned");
            let mut now = now_ms().max(clock.0); // never backwards, even if the wall clock is
            if now == clock.0 {
                if clock.1 == SEQUENCE_MAX {
                    // 64 ids used this millisecond: take the next one.
                    now += 1;
                    clock.1 = 0;
                } else {
                    clock.1 += 1;
                }
            } else {
                clock.1 = 0;
            }
            clock.0 = now;
            *clock
        };
        Some(OrderNo(
            ((ms - EPOCH_MS) << (WORKER_BITS + SEQUENCE_BITS + GENE_BITS))
                | (self.worker() << (SEQUENCE_BITS + GENE_BITS))
                | (seq << GENE_BITS)
                | gene(user_id.0),
        ))
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// Takes a free worker id from Redis (`worker:<n>`, a lock with ttl `lease`).
pub async fn lease_worker_id(
    redis: &mut Redis,
    keys: &Keys,
    lease: Duration,
) -> anyhow::Result<Lock> {
    let start = rand::random::<u64>() % MAX_WORKERS;
    for i in 0..MAX_WORKERS {
        let id = (start + i) % MAX_WORKERS;
        if let Some(lock) = Lock::try_acquire(redis, keys.worker_lease(id), lease)
            .await
            .context("Failed to lease a worker id")?
        {
            return Ok(lock);
        }
    }
    anyhow::bail!("all {MAX_WORKERS} worker ids are leased")
}

/// The worker id a lease stands for.
pub fn leased_id(lock: &Lock) -> u64 {
    lock.key()
        .rsplit(':')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("worker lease keys end in the id")
}

/// After a renewal that failed, the next try comes this soon (or at the next third of
/// the lease, if sooner), not a third of the lease later: two failures a third apart
/// (two short Redis outages, a failover each) stopped minting (two thirds past the last
/// renewal) for up to a third of the lease with Redis back all along.
const RENEW_RETRY: Duration = Duration::from_secs(1);

/// Renews the lease every third of its time, and after a renewal that failed (Redis
/// down or slow) every [`RENEW_RETRY`] until one lands; if it was lost (Redis down
/// longer than the lease), takes a new id so two instances never mint with one.
pub async fn keep_lease(
    mut lock: Lock,
    ids: std::sync::Arc<OrderIds>,
    mut redis: Redis,
    keys: Keys,
    lease: Duration,
    mut stop: Shutdown,
) {
    let every = lease / 3;
    let retry = RENEW_RETRY.min(every);
    // Retried every second while Redis is down: said at the first failure, then every 10 s.
    let failing = crate::telemetry::Throttle::new(Duration::from_secs(10));
    // At once first: the lease was taken before the rest of the start-up.
    let mut wait = Duration::ZERO;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait() => break,
        }
        wait = every;
        match lock.renew(&mut redis, lease).await {
            Ok(Owned::Yes) => {
                ids.renewed();
                if failing.recovered() {
                    tracing::info!("worker id lease renewed again");
                }
            }
            Ok(Owned::No) => match lease_worker_id(&mut redis, &keys, lease).await {
                Ok(new) => {
                    tracing::warn!(
                        old = ids.worker(),
                        new = leased_id(&new),
                        "worker id lease lost; took a new id"
                    );
                    ids.set_worker(leased_id(&new));
                    ids.renewed();
                    failing.recovered();
                    lock = new;
                }
                Err(e) => {
                    // Tried again at the next third: a try is a SET NX per id.
                    if failing.due() {
                        tracing::error!(
                            error = format!("{e:#}"),
                            "worker id lease lost and none free"
                        );
                    }
                }
            },
            Err(e) => {
                if failing.due() {
                    tracing::warn!(
                        error = format!("{e:#}"),
                        retry_in_ms = retry.as_millis() as u64,
                        "could not renew the worker id lease; retrying"
                    );
                }
                wait = retry;
            }
        }
    }
    let _ = lock.release(&mut redis).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn order_numbers_carry_the_user_gene_and_worker() {
        let ids = OrderIds::new(777, Duration::from_secs(30));
        for user in [1u64, 63, 64, 65, 1_000_003] {
            let no = ids.next(UserId(user)).unwrap().0;
            assert_eq!(gene(no), gene(user));
            assert_eq!(worker_of(no), 777);
            assert_eq!(no % 4, user % 4, "same shard of 4");
        }
    }

    #[test]
    fn no_number_is_minted_once_the_lease_may_have_expired() {
        let ids = OrderIds::new(3, Duration::from_millis(30));
        assert!(ids.next(UserId(1)).is_some());
        std::thread::sleep(Duration::from_millis(25));
        assert!(
            ids.next(UserId(1)).is_none(),
            "two thirds of the lease passed"
        );
        ids.renewed();
        assert!(ids.next(UserId(1)).is_some());
    }

    #[test]
    fn order_numbers_are_unique_and_increasing_past_the_per_millisecond_sequence() {
        let ids = OrderIds::new(1, Duration::from_secs(30));
        let numbers: Vec<u64> = (0..10_000)
            .map(|_| ids.next(UserId(42)).unwrap().0)
            .collect();
        assert!(numbers.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(numbers.iter().collect::<HashSet<_>>().len(), numbers.len());
        assert!(numbers[0] < 1 << 63, "fits a signed 64-bit column");
    }
}
