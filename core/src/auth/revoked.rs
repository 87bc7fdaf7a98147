//! Signed-out tokens: `POST /api/logout` (the caller's own) and
//! `POST /admin/users/{id}/revoke-tokens` (an operator's, e.g. for a stolen account).
//!
//! A token carries its expiry, not its issue time, and every token lives
//! `admission.token_ttl_s`: "every token issued until now" is "every token expiring at
//! or before now + ttl". Per user, Redis keeps that instant (`auth:revoked`, user id →
//! Unix s, raised only: `revoke_tokens.lua`), plus [`SKEW_S`] for the clocks of the
//! cores that issued them. Every core reads the whole hash every [`REFRESH`]
//! (`revoked_read.lua`, which drops the entries that void nothing any more), every edge
//! with each snapshot; both refuse a token it voids, 401. A login after a sign-out gets
//! a token expiring after the user's entry, so it is never born void.

use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};
use std::time::Duration;

use anyhow::Context;

use crate::infra::redis::Redis;
use crate::keys::Keys;
use crate::shutdown::Shutdown;

/// How often each core reads the revocations (the edges: each snapshot, ~200 ms).
pub const REFRESH: Duration = Duration::from_millis(250);
/// Added to a revocation for the clocks of the cores that issued the tokens it voids.
pub const SKEW_S: i64 = 5;

static REVOKE: LazyLock<redis::Script> = LazyLock::new(|| {
    crate::infra::redis::script(include_str!("../../../lua/redis/revoke_tokens.lua"))
});
static READ: LazyLock<redis::Script> = LazyLock::new(|| {
    crate::infra::redis::script(include_str!("../../../lua/redis/revoked_read.lua"))
});

/// The revocations in force, as this core last read them.
#[derive(Default)]
pub struct Revoked {
    until: RwLock<HashMap<u64, i64>>,
}

impl Revoked {
    /// Whether `user`'s token expiring at `expires_s` is void.
    pub fn voids(&self, user: u64, expires_s: i64) -> bool {
        self.until
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&user)
            .is_some_and(|until| expires_s <= *until)
    }

    /// `expires_s`, or just past `user`'s revocation if that voids it (this core's copy).
    pub fn outlived(&self, user: u64, expires_s: i64) -> i64 {
        match self
            .until
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&user)
        {
            Some(until) if expires_s <= *until => until + 1,
            _ => expires_s,
        }
    }

    /// Voids every token of `user` issued until now (`now_s`) by a core whose tokens
    /// live `ttl_s`, here at once and on every core and edge within their next read.
    /// The user's entry after it (Unix s).
    pub async fn revoke(
        &self,
        redis: &Redis,
        keys: &Keys,
        user: u64,
        now_s: i64,
        ttl_s: i64,
    ) -> anyhow::Result<i64> {
        let until: i64 = REVOKE
            .key(keys.revoked_tokens())
            .arg(user)
            .arg(now_s + ttl_s + SKEW_S)
            .invoke_async(&mut redis.clone())
            .await
            .context("revoke_tokens.lua failed")?;
        self.until
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(user, until);
        Ok(until)
    }

    /// `user`'s entry in Redis, read now (a login's: never a token born void), if any.
    pub async fn until(redis: &Redis, keys: &Keys, user: u64) -> anyhow::Result<Option<i64>> {
        redis::cmd("HGET")
            .arg(keys.revoked_tokens())
            .arg(user)
            .query_async(&mut redis.clone())
            .await
            .context("Failed to read the user's revoked tokens")
    }

    /// Reads the revocations in force (and drops those past, `now_s`).
    pub async fn refresh(&self, redis: &Redis, keys: &Keys, now_s: i64) -> anyhow::Result<()> {
        let flat: Vec<i64> = READ
            .key(keys.revoked_tokens())
            .arg(now_s)
            .invoke_async(&mut redis.clone())
            .await
            .context("revoked_read.lua failed")?;
        let until = flat
            .chunks_exact(2)
            .filter_map(|p| Some((u64::try_from(p[0]).ok()?, p[1])))
            .collect();
        *self.until.write().unwrap_or_else(|p| p.into_inner()) = until;
        Ok(())
    }

    /// Reads the revocations every [`REFRESH`] until `stop`; a failed read keeps the
    /// last (logged at most once a minute).
    pub async fn run(&self, redis: Redis, keys: Keys, mut stop: Shutdown) {
        let mut tick = tokio::time::interval(REFRESH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut warned: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let now_s = chrono::Utc::now().timestamp();
                    if let Err(e) = self.refresh(&redis, &keys, now_s).await
                        && warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60))
                    {
                        warned = Some(tokio::time::Instant::now());
                        tracing::warn!(error = format!("{e:#}"), "could not read the revoked tokens; keeping the last");
                    }
                }
                _ = stop.wait() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revocation_voids_the_tokens_expiring_at_or_before_it() {
        let r = Revoked::default();
        r.until.write().unwrap().insert(7, 1_000);
        assert!(r.voids(7, 999));
        assert!(r.voids(7, 1_000));
        assert!(!r.voids(7, 1_001), "a token issued after the sign-out");
        assert!(!r.voids(8, 10), "another user's");
    }
}
