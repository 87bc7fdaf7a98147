//! A Redis lock with an owner token and a Lua release, so one core instance cannot
//! free the lock another one holds after its own has expired.

use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;

static RELEASE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(include_str!("../../../lua/redis/release_lock.lua"))
});

/// The return codes of `release_lock.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockRelease {
    Released = 1,
    NotOwner = 0,
}

impl LockRelease {
    fn from_code(code: i64) -> anyhow::Result<LockRelease> {
        match code {
            1 => Ok(LockRelease::Released),
            0 => Ok(LockRelease::NotOwner),
            other => anyhow::bail!("release_lock.lua returned unknown code {other}"),
        }
    }
}

/// A held lock; release it with [`Lock::release`].
#[derive(Debug)]
pub struct Lock {
    key: String,
    token: String,
}

impl Lock {
    /// Tries to take `key` for `ttl`, waiting up to `wait`; None if someone else holds it.
    pub async fn acquire(
        redis: &mut ConnectionManager,
        key: String,
        ttl: Duration,
        wait: Duration,
    ) -> redis::RedisResult<Option<Lock>> {
        let token = format!("{:032x}", rand::random::<u128>());
        let deadline = Instant::now() + wait;
        loop {
            let taken: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(ttl.as_millis() as u64)
                .query_async(redis)
                .await?;
            if taken.is_some() {
                return Ok(Some(Lock { key, token }));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn release(self, redis: &mut ConnectionManager) -> anyhow::Result<LockRelease> {
        let code: i64 = RELEASE
            .key(&self.key)
            .arg(&self.token)
            .invoke_async(redis)
            .await?;
        let outcome = LockRelease::from_code(code)?;
        if outcome == LockRelease::NotOwner {
            tracing::warn!(
                key = self.key,
                "lock expired before release; the work outlived lock_ttl_ms"
            );
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_code_maps_to_one_variant() {
        assert_eq!(LockRelease::from_code(1).unwrap(), LockRelease::Released);
        assert_eq!(LockRelease::from_code(0).unwrap(), LockRelease::NotOwner);
        assert!(LockRelease::from_code(2).is_err());
        assert_eq!(LockRelease::Released as i64, 1);
    }
}
