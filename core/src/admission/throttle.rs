//! The core's second line of rate limits (governor), behind the edge's: per user and
//! in all, so the core's own port is no way around the edge's limits.

use std::num::NonZeroU32;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};

use super::Refusal;
use crate::config::AdmissionSettings;
use crate::domain::UserId;
use crate::shutdown::Shutdown;

pub struct Throttle {
    per_user: DefaultKeyedRateLimiter<u64>,
    global: DefaultDirectRateLimiter,
    clock: DefaultClock,
}

fn nonzero(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("validated positive in config")
}

impl Throttle {
    pub fn new(s: &AdmissionSettings) -> Throttle {
        Throttle {
            per_user: RateLimiter::keyed(
                Quota::per_second(nonzero(s.user_per_s)).allow_burst(nonzero(s.user_burst)),
            ),
            global: RateLimiter::direct(Quota::per_second(nonzero(s.global_per_s))),
            clock: DefaultClock::default(),
        }
    }

    /// Takes one purchase from the user's and the global allowance.
    pub fn check(&self, user_id: UserId) -> Result<(), Refusal> {
        let wait = match (self.per_user.check_key(&user_id.0), self.global.check()) {
            (Ok(()), Ok(())) => return Ok(()),
            (Err(n), _) | (_, Err(n)) => n.wait_time_from(self.clock.now()),
        };
        Err(Refusal::RateLimited {
            retry_after_s: wait.as_secs().max(1),
        })
    }

    /// Drops the state of users idle long enough to be back at a full allowance.
    pub fn forget_idle(&self) {
        self.per_user.retain_recent();
        self.per_user.shrink_to_fit();
    }

    /// [`Throttle::forget_idle`] every 30 s until `stop`.
    pub async fn forget_idle_until(&self, mut stop: Shutdown) {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(30));
        loop {
            tokio::select! {
                _ = tick.tick() => self.forget_idle(),
                _ = stop.wait() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_over_the_burst_is_told_when_to_retry_and_others_are_not() {
        let t = Throttle::new(&AdmissionSettings {
            token_ttl_s: 60,
            event_cache_ttl_ms: 100,
            user_per_s: 1,
            user_burst: 2,
            global_per_s: 1000,
        });
        assert_eq!(t.check(UserId(1)), Ok(()));
        assert_eq!(t.check(UserId(1)), Ok(()));
        assert_eq!(
            t.check(UserId(1)),
            Err(Refusal::RateLimited { retry_after_s: 1 })
        );
        assert_eq!(t.check(UserId(2)), Ok(()));
    }
}
