//! Where the time goes: CPU seconds (user + system) per part of the stack over a
//! measurement, read from /proc, so a ratio comes with its per-stage breakdown.

use std::collections::BTreeMap;

use serde::Serialize;

/// The parts, by process name (`/proc/<pid>/comm`, at most 15 characters).
const PARTS: [(&str, &str); 7] = [
    ("nginx", "nginx"),
    ("stampede", "core"),
    ("redis-server", "redis"),
    ("mariadbd", "mariadb"),
    ("mysqld", "mariadb"),
    ("rocketmq-broker", "broker"),
    ("stampede-bench", "bench client"),
];

/// CPU ticks used so far, per part.
#[derive(Debug, Clone, Default)]
pub struct Snapshot(BTreeMap<&'static str, u64>);

pub fn snapshot() -> Snapshot {
    let mut by_part = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Snapshot(by_part);
    };
    for entry in dir.flatten() {
        let path = entry.path();
        let Ok(comm) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        let Some((_, part)) = PARTS.iter().find(|(name, _)| *name == comm.trim()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue;
        };
        *by_part.entry(*part).or_default() += ticks_of(&stat).unwrap_or(0);
    }
    Snapshot(by_part)
}

/// This process's CPU seconds so far (user + system, every thread).
pub fn own_s() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| ticks_of(&s))
        .unwrap_or(0) as f64
        / 100.0 // USER_HZ on Linux
}

/// utime + stime of a `/proc/<pid>/stat` line. Fields after the parenthesised name
/// (which may hold spaces or parentheses): state is field 3, utime 14, stime 15.
fn ticks_of(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i - 3)?.parse::<u64>().ok();
    Some(field(14)? + field(15)?)
}

/// CPU used between two snapshots, per part.
#[derive(Debug, Clone, Serialize)]
pub struct Usage {
    /// Seconds of CPU per part.
    pub cpu_s: BTreeMap<String, f64>,
    /// Microseconds of CPU per request (or per unit of `per`), per part.
    pub us_per_request: BTreeMap<String, f64>,
}

pub fn between(before: &Snapshot, after: &Snapshot, requests: u64) -> Usage {
    let hz = 100.0; // USER_HZ on Linux
    let mut cpu_s = BTreeMap::new();
    let mut us_per_request = BTreeMap::new();
    for (part, end) in &after.0 {
        let start = before.0.get(part).copied().unwrap_or(0);
        let secs = end.saturating_sub(start) as f64 / hz;
        if secs > 0.0 {
            cpu_s.insert(part.to_string(), secs);
            us_per_request.insert(part.to_string(), secs * 1e6 / requests.max(1) as f64);
        }
    }
    Usage {
        cpu_s,
        us_per_request,
    }
}

impl Usage {
    /// µs per request of one part (0 when it used nothing).
    pub fn part(&self, name: &str) -> f64 {
        self.us_per_request.get(name).copied().unwrap_or(0.0)
    }

    /// µs per request of every part together.
    pub fn total(&self) -> f64 {
        self.us_per_request.values().sum()
    }

    /// "nginx 12.3 µs, core 20.1 µs, …" per request, largest first.
    pub fn line(&self) -> String {
        let mut parts: Vec<(&String, &f64)> = self.us_per_request.iter().collect();
        parts.sort_by(|a, b| b.1.total_cmp(a.1));
        parts
            .iter()
            .map(|(p, us)| format!("{p} {us:.1} µs"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_user_plus_system_ticks_even_with_odd_names() {
        let line = "4242 (nginx: worker) S 1 4242 4242 0 -1 4194624 900 0 0 0 123 45 0 0 20 0 1 0";
        assert_eq!(ticks_of(line), Some(168));
        assert_eq!(ticks_of("1 (a) b) R 0 0 0 0 0 0 0 0 0 0 7 8"), Some(15));
        assert_eq!(ticks_of("garbage"), None);
    }

    #[test]
    fn usage_is_per_part_and_per_request() {
        let before = Snapshot(BTreeMap::from([("nginx", 100), ("core", 50)]));
        let after = Snapshot(BTreeMap::from([
            ("nginx", 300),
            ("core", 50),
            ("redis", 10),
        ]));
        let u = between(&before, &after, 1_000_000);
        assert_eq!(u.cpu_s.get("nginx"), Some(&2.0));
        assert_eq!(u.us_per_request.get("nginx"), Some(&2.0));
        assert_eq!(u.us_per_request.get("redis"), Some(&0.1));
        assert!(
            !u.cpu_s.contains_key("core"),
            "a part that used nothing is left out"
        );
        assert!(u.line().starts_with("nginx 2.0 µs"));
        assert_eq!(u.part("nginx"), 2.0);
        assert_eq!(u.part("core"), 0.0);
        assert!((u.total() - 2.1).abs() < 1e-9);
    }
}
