//! Structured logs through tracing: text for people, JSON for collectors.

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSettings};

/// Installs the global subscriber; RUST_LOG, when set, wins over `log.filter`.
pub fn init(log: &LogSettings) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&log.filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    let _ = match log.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// When a warning repeated while its cause lasts is due again: at once, then at most once
/// per `every` (a Redis down for minutes is a line every `every`, not one per try). Shared
/// between tasks; [`Throttle::recovered`] when the cause ends says whether one was logged.
#[derive(Debug)]
pub struct Throttle {
    every: std::time::Duration,
    last: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Throttle {
    pub const fn new(every: std::time::Duration) -> Throttle {
        Throttle {
            every,
            last: std::sync::Mutex::new(None),
        }
    }

    pub fn every(&self) -> std::time::Duration {
        self.every
    }

    /// Whether the warning is due now; if so it counts as logged.
    pub fn due(&self) -> bool {
        self.due_at(std::time::Instant::now())
    }

    /// [`Throttle::due`] at `now`.
    pub fn due_at(&self, now: std::time::Instant) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let due = last.is_none_or(|at| now.saturating_duration_since(at) >= self.every);
        if due {
            *last = Some(now);
        }
        due
    }

    /// The cause ended: whether a warning was logged since the last recovery (a note
    /// may say it is over). The next failure warns at once.
    pub fn recovered(&self) -> bool {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::Throttle;
    use std::time::{Duration, Instant};

    #[test]
    fn a_throttled_warning_is_due_at_once_then_once_per_period_and_at_once_after_recovery() {
        let t = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(!t.recovered(), "nothing logged yet");
        assert!(t.due_at(t0));
        assert!(!t.due_at(t0 + Duration::from_secs(9)));
        assert!(t.due_at(t0 + Duration::from_secs(10)));
        assert!(!t.due_at(t0 + Duration::from_secs(11)));
        assert!(t.recovered());
        assert!(!t.recovered(), "said once");
        assert!(t.due_at(t0 + Duration::from_secs(12)), "a new failure");
    }
}
