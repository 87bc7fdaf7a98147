//! The guards of `POST /api/login`, besides the edge's limit per client address:
//!
//! - failed logins per account and client address, with a wait that doubles per failure
//!   — a guesser at one address slows down fast, while the account's owner, elsewhere,
//!   is not locked out by someone else's failures;
//! - failed logins per account from any address, capped (`login.account_max_failures`
//!   in `login.failure_window_s`): guessing spread over many addresses is bounded too,
//!   at the price that someone failing that often can hold the account for the rest of
//!   the window;
//! - a bound on the Argon2 checks running at once (each ~20 ms of CPU and 19 MiB), the
//!   slot held by the check itself, so a client that hangs up frees nothing early; a
//!   login waits for a slot in turn, up to `login.check_wait_ms`, at most
//!   `login.max_waiting` of them at once.
//!
//! The failures are read again once a slot is held, and the slot is kept until the
//! attempt's failure is recorded (unless the client hangs up first, when it learns
//! nothing): a burst of guesses is judged against every failure recorded before it, so
//! with N slots at most N − 1 guesses get past the limits (review: read only before the
//! wait, a burst all waiting passed the same read, some 200 guesses a second past "5 free
//! failures").
//!
//! Failures live in Redis (small keys that expire), so every core instance counts the
//! same failures. Unknown usernames are counted too: the answers must not tell which
//! accounts exist.

use std::sync::Arc;
use std::time::Duration;

use crate::infra::redis::Redis;
use redis::AsyncCommands;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::LoginSettings;
use crate::keys::Keys;

/// Why a login attempt may not be checked now.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Held {
    /// Too many failures for this account (from this address, or from all): the next
    /// attempt after this long.
    #[error("too many failed logins for this account; retry in {0} s")]
    Waiting(u64),
    /// Every password check slot stayed busy for `login.check_wait_ms`, or
    /// `login.max_waiting` logins were waiting already.
    #[error("too many logins at once; retry in a moment")]
    Busy,
}

pub struct LoginGuard {
    settings: LoginSettings,
    checks: Arc<Semaphore>,
    /// Logins waiting for a slot now.
    waiting: Arc<std::sync::atomic::AtomicUsize>,
}

/// One login counted among the waiting while it waits.
struct Waiting(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl LoginGuard {
    pub fn new(settings: &LoginSettings) -> LoginGuard {
        LoginGuard {
            settings: settings.clone(),
            checks: Arc::new(Semaphore::new(settings.max_concurrent_checks.max(1))),
            waiting: Default::default(),
        }
    }

    /// A slot to check a password in, unless the account must wait or all slots stay
    /// busy. The failures are read before the wait (an attempt that must wait is told
    /// so at once, taking no place in the queue) and again once the slot is held, as
    /// they are then (keep the slot until this attempt's failure is recorded).
    pub async fn admit(
        &self,
        redis: &mut Redis,
        keys: &Keys,
        username: &str,
        address: &str,
    ) -> Result<Result<OwnedSemaphorePermit, Held>, redis::RedisError> {
        if let Some(wait) = self.must_wait(redis, keys, username, address).await? {
            return Ok(Err(wait));
        }
        let slot = match self.slot().await {
            Ok(slot) => slot,
            Err(busy) => return Ok(Err(busy)),
        };
        Ok(
            match self.must_wait(redis, keys, username, address).await? {
                Some(wait) => Err(wait),
                None => Ok(slot),
            },
        )
    }

    /// The wait the account's failures ask of an attempt from `address` now, if any.
    async fn must_wait(
        &self,
        redis: &mut Redis,
        keys: &Keys,
        username: &str,
        address: &str,
    ) -> Result<Option<Held>, redis::RedisError> {
        let now_ms = chrono::Utc::now().timestamp_millis();
        let all = keys.login_failures_all(username);
        let ((n, last_ms), failures, ttl_s): ((Option<u32>, Option<i64>), Option<u32>, i64) =
            redis::pipe()
                .hget(keys.login_failures(username, address), &["n", "last_ms"])
                .get(&all)
                .ttl(&all)
                .query_async(redis)
                .await?;
        // The wait follows from the failures in a row and the time of the last one.
        if let (Some(n), Some(last_ms)) = (n, last_ms) {
            let until = last_ms + self.wait_after(n).as_millis() as i64;
            if until > now_ms {
                return Ok(Some(Held::Waiting(
                    ((until - now_ms) as u64).div_ceil(1000),
                )));
            }
        }
        if failures.is_some_and(|n| n >= self.settings.account_max_failures) {
            return Ok(Some(Held::Waiting(ttl_s.max(1) as u64)));
        }
        Ok(None)
    }

    /// A password check slot, waited for in turn up to `check_wait_ms` by at most
    /// `max_waiting` logins at once (more are Busy at once).
    async fn slot(&self) -> Result<OwnedSemaphorePermit, Held> {
        use std::sync::atomic::Ordering::Relaxed;
        let checks = self.checks.clone();
        if let Ok(free) = checks.clone().try_acquire_owned() {
            return Ok(free);
        }
        let s = &self.settings;
        if s.check_wait_ms == 0 {
            return Err(Held::Busy);
        }
        if self.waiting.fetch_add(1, Relaxed) >= s.max_waiting {
            self.waiting.fetch_sub(1, Relaxed);
            return Err(Held::Busy);
        }
        let _waiting = Waiting(self.waiting.clone());
        let wait = Duration::from_millis(s.check_wait_ms);
        match tokio::time::timeout(wait, checks.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            // Timed out (the semaphore is never closed).
            _ => Err(Held::Busy),
        }
    }

    /// Records a failed attempt, in one round trip: the wait before this address's next.
    pub async fn failed(
        &self,
        redis: &mut Redis,
        keys: &Keys,
        username: &str,
        address: &str,
        now_ms: i64,
    ) -> Result<Duration, redis::RedisError> {
        let key = keys.login_failures(username, address);
        let all = keys.login_failures_all(username);
        let window = self.settings.failure_window_s as i64;
        let (n,): (u32,) = redis::pipe()
            .hincr(&key, "n", 1)
            .hset(&key, "last_ms", now_ms)
            .ignore()
            .expire(&key, window)
            .ignore()
            .incr(&all, 1)
            .ignore()
            // NX: the window counts from the first failure, so a steady trickle ends.
            .cmd("EXPIRE")
            .arg(&all)
            .arg(window)
            .arg("NX")
            .ignore()
            .query_async(redis)
            .await?;
        Ok(self.wait_after(n))
    }

    /// A success forgets this address's failures for the account (not the others').
    pub async fn succeeded(
        &self,
        redis: &mut Redis,
        keys: &Keys,
        username: &str,
        address: &str,
    ) -> Result<(), redis::RedisError> {
        redis.del(keys.login_failures(username, address)).await
    }

    /// The wait after `n` failures in a row: none below `free_failures`, then the base
    /// delay doubling per failure, at most `max_delay_s`.
    pub fn wait_after(&self, n: u32) -> Duration {
        let s = &self.settings;
        let Some(over) = n.checked_sub(s.free_failures) else {
            return Duration::ZERO;
        };
        let ms = s.base_delay_ms.saturating_mul(1u64 << over.min(40));
        Duration::from_millis(ms).min(Duration::from_secs(s.max_delay_s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> LoginGuard {
        LoginGuard::new(&LoginSettings {
            free_failures: 5,
            base_delay_ms: 1000,
            max_delay_s: 300,
            failure_window_s: 900,
            account_max_failures: 100,
            max_concurrent_checks: 2,
            check_wait_ms: 0,
            max_waiting: 1,
        })
    }

    #[test]
    fn the_wait_doubles_after_the_free_failures_up_to_the_cap() {
        let g = guard();
        let waits: Vec<u64> = (0..=16)
            .map(|n| g.wait_after(n).as_millis() as u64)
            .collect();
        assert_eq!(&waits[..5], &[0; 5]);
        assert_eq!(&waits[5..10], &[1000, 2000, 4000, 8000, 16000]);
        assert_eq!(waits[16], 300_000);
        assert_eq!(g.wait_after(u32::MAX), Duration::from_secs(300));
    }

    #[tokio::test]
    async fn password_checks_are_bounded() {
        let g = guard();
        let a = g.checks.clone().try_acquire_owned().unwrap();
        let _b = g.checks.clone().try_acquire_owned().unwrap();
        assert!(g.checks.clone().try_acquire_owned().is_err());
        drop(a);
        assert!(g.checks.clone().try_acquire_owned().is_ok());
    }

    #[tokio::test]
    async fn a_login_waits_its_turn_for_a_slot_up_to_check_wait_ms() {
        let mut g = guard();
        g.settings.check_wait_ms = 50;
        let a = g.slot().await.unwrap();
        let _b = g.slot().await.unwrap();
        // Both busy for the whole wait: turned away once it has passed.
        let started = std::time::Instant::now();
        assert_eq!(g.slot().await.unwrap_err(), Held::Busy);
        assert!(started.elapsed() >= Duration::from_millis(50));
        // A slot freed during the wait is the waiter's (a wait far longer than needed).
        g.settings.check_wait_ms = 60_000;
        let freed = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(a);
        });
        let _c = g.slot().await.unwrap();
        freed.await.unwrap();
        // 0: no wait at all (the slot taken above is still held).
        g.settings.check_wait_ms = 0;
        assert_eq!(g.slot().await.unwrap_err(), Held::Busy);
        assert_eq!(g.waiting.load(std::sync::atomic::Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn no_more_than_max_waiting_logins_wait_for_a_slot() {
        use std::sync::atomic::Ordering::Relaxed;
        let mut g = guard();
        g.settings.check_wait_ms = 60_000;
        let g = Arc::new(g);
        let _a = g.slot().await.unwrap();
        let _b = g.slot().await.unwrap();
        // The one login allowed to wait (max_waiting = 1)…
        let waiter = tokio::spawn({
            let g = g.clone();
            async move { g.slot().await.map(drop) }
        });
        while g.waiting.load(Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
        // …and the next is turned away at once, not after the minute.
        let started = std::time::Instant::now();
        assert_eq!(g.slot().await.unwrap_err(), Held::Busy);
        assert!(started.elapsed() < Duration::from_secs(30));
        assert_eq!(g.waiting.load(Relaxed), 1);
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(g.waiting.load(Relaxed), 0, "a waiter gone is not counted");
    }
}
