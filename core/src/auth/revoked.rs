//! Signed-out tokens: `POST /api/logout` (the caller's own) and
//! `POST /admin/users/{id}/revoke-tokens` (an operator's, e.g. for a stolen account).
//!
//! A token carries its expiry, not its issue time, and every token lives
//! `admission.token_ttl_s`: "every token issued until now" is "every token expiring at
//! or before now + ttl". Per user, Redis keeps that instant (`auth:revoked`, user id →
//! Unix s, raised only — past itself when there was one, which also voids the token a
//! login after the last sign-out got: `revoke_tokens.lua`), plus [`SKEW_S`] for the
//! clocks of the cores that issued them, bumps the hash's version (field `v`) and logs
//! the change under it (`l:<version>`, the last [`LOG_KEEP`]). Every core asks for the
//! version every [`REFRESH`] and, when it changed, reads the changes since its own from
//! the log, or the whole hash when the log no longer has them (`revoked_read.lua`, which
//! once a minute also drops the entries that void nothing any more, five minutes past);
//! every edge likewise with each snapshot. A sign-out costs each reader the change, not
//! the whole hash: with 100 000 users signed out and four sign-outs a second, re-reading
//! the hash on each took the edge 0.88 of a core (measured). Both refuse a token it
//! voids, 401. A login after a sign-out gets a token expiring after the user's entry,
//! so it is never born void. The core that signs a user out refuses the token at once,
//! the other cores and the edges within their next read.

use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};
use std::time::Duration;

use anyhow::Context;

use crate::infra::redis::Redis;
use crate::keys::Keys;
use crate::shutdown::Shutdown;
use crate::telemetry::Throttle;

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

/// Entries are dropped only this long after the tokens they void expired (the clocks
/// of the core that prunes and of the one that issued them may differ).
const PRUNE_MARGIN_S: i64 = 300;
/// One read in this many also prunes (once a minute at [`REFRESH`]).
const PRUNE_EVERY: u32 = 240;
/// The changes `revoke_tokens.lua` keeps in the hash's log (its LOG_KEEP).
pub const LOG_KEEP: u64 = 1000;
/// At most this many changes are read from the log at once; more, the whole hash.
const MAX_CHANGES: u64 = LOG_KEEP;

/// What a [`Revoked::refresh`] read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// Nothing changed (the version alone).
    Unchanged,
    /// This many changes, from the log.
    Changes(usize),
    /// The whole hash.
    Whole,
}

/// The revocations in force, as this core last read them.
#[derive(Default)]
pub struct Revoked {
    until: RwLock<HashMap<u64, i64>>,
    /// The hash's version the map is of ("" before the first read), and the change
    /// that made it (its `l:<version>`, "" when the log had none).
    version: RwLock<(String, String)>,
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

    /// Reads the revocations in force when the hash changed since the last read (one
    /// HGET when it did not): the changes since this core's version from the hash's log
    /// (one HMGET) when it still has them all, else the whole hash; with `prune`, the
    /// whole hash after dropping the entries that void nothing any more. What it read.
    pub async fn refresh(
        &self,
        redis: &Redis,
        keys: &Keys,
        now_s: i64,
        prune: bool,
    ) -> anyhow::Result<Read> {
        let (have, have_change) = self
            .version
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // The version and the change that made this core's, with a plain command, most
        // reads: no script call while nothing changed (and none a SCRIPT FLUSH would turn
        // into NOSCRIPT each tick). A Redis that failed over to a replica behind it, or
        // was restored from an older copy, may reach this core's version again with
        // other sign-outs: told by that change differing, and read whole.
        if !prune && !have.is_empty() {
            let (now, at_have): (Option<String>, Option<String>) = redis::cmd("HMGET")
                .arg(keys.revoked_tokens())
                .arg("v")
                .arg(format!("l:{have}"))
                .query_async(&mut redis.clone())
                .await
                .context("Failed to read the revoked tokens' version")?;
            let now = now.unwrap_or_else(|| "0".into());
            if at_have.unwrap_or_default() == have_change {
                if now == have {
                    return Ok(Read::Unchanged);
                }
                if let Some((changes, last)) = self.changes_since(redis, keys, &have, &now).await? {
                    let n = changes.len();
                    let mut mine = self.until.write().unwrap_or_else(|p| p.into_inner());
                    for (user, until) in changes {
                        let e = mine.entry(user).or_insert(until);
                        *e = (*e).max(until);
                    }
                    *self.version.write().unwrap_or_else(|p| p.into_inner()) = (now, last);
                    return Ok(Read::Changes(n));
                }
            }
        }
        let flat: Vec<String> = READ
            .key(keys.revoked_tokens())
            .arg(now_s - PRUNE_MARGIN_S)
            .arg(if prune { "1" } else { "0" })
            .invoke_async(&mut redis.clone())
            .await
            .context("revoked_read.lua failed")?;
        let [version, change, pairs @ ..] = flat.as_slice() else {
            anyhow::bail!(
                "revoked_read.lua answered {} values, not 2 or more",
                flat.len()
            );
        };
        // A pair that does not parse is skipped, not the whole read.
        let mut until: HashMap<u64, i64> = pairs
            .chunks_exact(2)
            .filter_map(|p| Some((p[0].parse().ok()?, p[1].parse().ok()?)))
            .collect();
        let mut mine = self.until.write().unwrap_or_else(|p| p.into_inner());
        // A revocation this core made while the read was under way is kept: entries only
        // ever rise, and go when they void nothing any more.
        for (user, v) in mine.iter() {
            if *v >= now_s {
                let e = until.entry(*user).or_insert(*v);
                *e = (*e).max(*v);
            }
        }
        *mine = until;
        *self.version.write().unwrap_or_else(|p| p.into_inner()) =
            (version.clone(), change.clone());
        Ok(Read::Whole)
    }

    /// The changes that made versions `have` + 1 ..= `now` (user, Unix s), from the
    /// hash's log; None when a whole read is needed instead: a version that is not a
    /// number or went back (a Redis restored from an older copy), more changes than the
    /// log keeps or [`MAX_CHANGES`], or one the log no longer has.
    async fn changes_since(
        &self,
        redis: &Redis,
        keys: &Keys,
        have: &str,
        now: &str,
    ) -> anyhow::Result<Option<(Vec<(u64, i64)>, String)>> {
        let (Ok(have), Ok(now)) = (have.parse::<u64>(), now.parse::<u64>()) else {
            return Ok(None);
        };
        if now <= have || now - have > MAX_CHANGES {
            return Ok(None);
        }
        let mut hmget = redis::cmd("HMGET");
        hmget.arg(keys.revoked_tokens());
        for v in have + 1..=now {
            hmget.arg(format!("l:{v}"));
        }
        let logged: Vec<Option<String>> = hmget
            .query_async(&mut redis.clone())
            .await
            .context("Failed to read the revoked tokens' changes")?;
        let changes: Option<Vec<(u64, i64)>> = logged
            .iter()
            .map(|change| {
                let (user, until) = change.as_deref()?.split_once(':')?;
                Some((user.parse().ok()?, until.parse().ok()?))
            })
            .collect();
        let last = logged.last().cloned().flatten().unwrap_or_default();
        Ok(changes.map(|c| (c, last)))
    }

    /// Reads the revocations every [`REFRESH`] until `stop`; a failed read keeps the
    /// last (logged at most once a minute).
    /// Each read that found a change counted in `counted` by what it read (`changes`,
    /// `whole`; `prune` for the whole reads of the minute's prune).
    pub async fn run(
        &self,
        redis: Redis,
        keys: Keys,
        counted: prometheus::IntCounterVec,
        mut stop: Shutdown,
    ) {
        let mut tick = tokio::time::interval(REFRESH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let warned = Throttle::new(Duration::from_secs(60));
        let mut reads = 0u32;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let now_s = chrono::Utc::now().timestamp();
                    reads = reads.wrapping_add(1);
                    let prune = reads.is_multiple_of(PRUNE_EVERY);
                    match self.refresh(&redis, &keys, now_s, prune).await {
                        Ok(Read::Unchanged) => {}
                        Ok(Read::Changes(_)) => counted.with_label_values(&["changes"]).inc(),
                        Ok(Read::Whole) if prune => counted.with_label_values(&["prune"]).inc(),
                        Ok(Read::Whole) => counted.with_label_values(&["whole"]).inc(),
                        Err(e) => {
                            if warned.due() {
                                tracing::warn!(error = format!("{e:#}"), "could not read the revoked tokens; keeping the last");
                            }
                        }
                    }
                }
                _ = stop.wait() => return,
            }
        }
    }
}

/// Voids every token of `user` made until now by this deployment's cores (their tokens
/// live `admission.token_ttl_s`): a sign-out, the user's or an operator's. The user's
/// entry after it (Unix s).
pub async fn sign_out(state: &crate::state::AppState, user: u64) -> anyhow::Result<i64> {
    state
        .revoked
        .revoke(
            &state.redis,
            &state.keys,
            user,
            chrono::Utc::now().timestamp(),
            state.config.settings.admission.token_ttl_s as i64,
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_keeps_as_many_changes_as_the_readers_expect() {
        let script = include_str!("../../../lua/redis/revoke_tokens.lua");
        assert!(script.contains(&format!("local LOG_KEEP = {LOG_KEEP} ")));
        let read = include_str!("../../../lua/redis/revoked_read.lua");
        assert!(read.contains(&format!("local LOG_KEEP = {LOG_KEEP} ")));
        let edge = include_str!("../../../lua/edge/stampede/state.lua");
        assert!(edge.contains(&format!("local LOG_KEEP = {LOG_KEEP} ")));
    }

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
