//! A Redis lock with an owner token (seed 004): taken with `SET NX PX`, renewed and
//! released by Lua scripts that check the token, so one core instance can never free
//! or extend a lock another one holds after its own has expired. Used by the per-event
//! preload lock (a preload, a heal, a retirement, a purge) and by the order-id worker
//! lease.

use std::sync::LazyLock;
use std::time::Duration;

use backon::{ConstantBuilder, Retryable};

use crate::infra::redis::Redis;

use crate::script_codes::ScriptCode;

/// How often a waiting [`Lock::acquire`] tries again.
const POLL: Duration = Duration::from_millis(50);

static RELEASE: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(include_str!("../../lua/redis/release_lock.lua")));
static RENEW: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(include_str!("../../lua/redis/renew_lock.lua")));

/// The return codes of `release_lock.lua` and `renew_lock.lua`: 1 done, 0 not the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    Yes = 1,
    No = 0,
}

impl ScriptCode for Owned {
    const SCRIPT: &'static str = "release_lock.lua or renew_lock.lua";
    const ALL: &'static [Owned] = &[Owned::Yes, Owned::No];

    fn code(self) -> i64 {
        self as i64
    }
}

/// A held lock; release it with [`Lock::release`].
#[derive(Debug)]
pub struct Lock {
    key: String,
    token: String,
}

impl Lock {
    /// Tries once to take `key` for `ttl`.
    pub async fn try_acquire(
        redis: &mut Redis,
        key: String,
        ttl: Duration,
    ) -> redis::RedisResult<Option<Lock>> {
        let token = format!("{:032x}", rand::random::<u128>());
        let taken: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query_async(redis)
            .await?;
        Ok(taken.map(|_| Lock { key, token }))
    }

    /// Tries to take `key` for `ttl`, waiting up to `wait`; None if someone else holds it.
    pub async fn acquire(
        redis: &mut Redis,
        key: String,
        ttl: Duration,
        wait: Duration,
    ) -> redis::RedisResult<Option<Lock>> {
        /// Why one attempt did not take the lock.
        enum Missed {
            Held,
            Failed(redis::RedisError),
        }
        let attempts = (wait.as_millis() / POLL.as_millis()) as usize;
        let taken = (|| {
            let (mut redis, key) = (redis.clone(), key.clone());
            async move {
                match Lock::try_acquire(&mut redis, key, ttl).await {
                    Ok(Some(lock)) => Ok(lock),
                    Ok(None) => Err(Missed::Held),
                    Err(e) => Err(Missed::Failed(e)),
                }
            }
        })
        .retry(
            ConstantBuilder::new()
                .with_delay(POLL)
                .with_max_times(attempts),
        )
        .sleep(tokio::time::sleep)
        .when(|m| matches!(m, Missed::Held))
        .await;
        match taken {
            Ok(lock) => Ok(Some(lock)),
            Err(Missed::Held) => Ok(None),
            Err(Missed::Failed(e)) => Err(e),
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// Extends the lock to `ttl` from now if still ours.
    pub async fn renew(&self, redis: &mut Redis, ttl: Duration) -> anyhow::Result<Owned> {
        let code: i64 = RENEW
            .key(&self.key)
            .arg(&self.token)
            .arg(ttl.as_millis() as u64)
            .invoke_async(redis)
            .await?;
        Owned::from_code(code)
    }

    /// Runs `work` while holding the lock, renewing it every third of `ttl` until the
    /// work is done, so work that outlasts `ttl` (a rebuild of a large event, MySQL
    /// slow) keeps it and no second holder starts beside it. Work with no end keeps it
    /// too: every caller bounds its work (a pass's `for_pass`, a request's timeout), and
    /// dropped, it renews no more. A lock found lost is logged once with `what` and not
    /// renewed again; the work runs to its end either way (its own fences decide what
    /// it may still write).
    pub async fn renewed_while<F: Future>(
        &self,
        redis: &Redis,
        ttl: Duration,
        what: &str,
        work: F,
    ) -> F::Output {
        let renewing = async {
            let mut conn = redis.clone();
            let mut tick = tokio::time::interval(ttl / 3);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                match self.renew(&mut conn, ttl).await {
                    Ok(Owned::Yes) => {}
                    Ok(Owned::No) => {
                        tracing::error!(
                            key = self.key,
                            what,
                            "the lock expired while its work ran"
                        );
                        return std::future::pending::<std::convert::Infallible>().await;
                    }
                    Err(e) => tracing::warn!(
                        key = self.key,
                        what,
                        error = format!("{e:#}"),
                        "could not renew the lock"
                    ),
                }
            }
        };
        tokio::pin!(work, renewing);
        tokio::select! {
            done = &mut work => done,
            never = &mut renewing => match never {},
        }
    }

    pub async fn release(self, redis: &mut Redis) -> anyhow::Result<Owned> {
        let code: i64 = RELEASE
            .key(&self.key)
            .arg(&self.token)
            .invoke_async(redis)
            .await?;
        let outcome = Owned::from_code(code)?;
        if outcome == Owned::No {
            tracing::warn!(
                key = self.key,
                "lock expired before release; the work outlived its ttl"
            );
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_of_both_scripts_maps_to_one_variant() {
        for script in [
            include_str!("../../lua/redis/release_lock.lua"),
            include_str!("../../lua/redis/renew_lock.lua"),
        ] {
            crate::script_codes::assert_mirrored::<Owned>(script);
        }
    }
}
