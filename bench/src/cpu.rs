//! Where the time goes: CPU seconds (user + system) per part of the stack over a
//! measurement, read from /proc, so a ratio comes with its per-stage breakdown; and how
//! often each part's threads were put on a CPU and how long they waited for one (the
//! scheduler's own counts, `/proc/<pid>/task/<tid>/schedstat`).

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

/// CPU ticks one part used so far: user + system, and of which system.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Ticks {
    all: u64,
    system: u64,
}

/// One thread's scheduler counts so far: times put on a CPU (woken, or given the CPU
/// back after a preemption) and nanoseconds runnable waiting for one.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sched {
    part: &'static str,
    runs: u64,
    wait_ns: u64,
}

/// What each part used so far: its processes' ticks (which keep their exited threads'),
/// and each living thread's scheduler counts by (pid, tid), so a delta is taken per
/// thread: one that exits in between drops out of both sides, one that starts counts
/// from zero.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    ticks: BTreeMap<&'static str, Ticks>,
    threads: BTreeMap<(u32, u32), Sched>,
}

pub fn snapshot() -> Snapshot {
    let mut snap = Snapshot::default();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return snap;
    };
    for entry in dir.flatten() {
        let Some(pid) = id_of(&entry) else {
            continue;
        };
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
        let ticks = snap.ticks.entry(*part).or_default();
        let (user, system) = ticks_of(&stat).unwrap_or((0, 0));
        ticks.all += user + system;
        ticks.system += system;
        for task in std::fs::read_dir(path.join("task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let Some(tid) = id_of(&task) else {
                continue;
            };
            if let Some((runs, wait_ns)) = std::fs::read_to_string(task.path().join("schedstat"))
                .ok()
                .and_then(|s| schedstat_of(&s))
            {
                snap.threads.insert(
                    (pid, tid),
                    Sched {
                        part,
                        runs,
                        wait_ns,
                    },
                );
            }
        }
    }
    snap
}

/// The number a `/proc` (or `/proc/<pid>/task`) entry is named by, if it is one.
fn id_of(entry: &std::fs::DirEntry) -> Option<u32> {
    entry.file_name().to_str()?.parse().ok()
}

/// This process's CPU seconds so far (user + system, every thread).
pub fn own_s() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| ticks_of(&s))
        .map_or(0, |(user, system)| user + system) as f64
        / 100.0 // USER_HZ on Linux
}

/// (utime, stime) of a `/proc/<pid>/stat` line. Fields after the parenthesised name
/// (which may hold spaces or parentheses): state is field 3, utime 14, stime 15.
fn ticks_of(stat: &str) -> Option<(u64, u64)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i - 3)?.parse::<u64>().ok();
    Some((field(14)?, field(15)?))
}

/// Times run and nanoseconds waited of a `schedstat` line: "<ns on a CPU> <ns waiting
/// for one> <times run>".
fn schedstat_of(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace().map(|f| f.parse::<u64>().ok());
    let (_on_cpu, waited, runs) = (fields.next()??, fields.next()??, fields.next()??);
    Some((runs, waited))
}

/// CPU used between two snapshots, per part.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Usage {
    /// Seconds of CPU per part.
    pub cpu_s: BTreeMap<String, f64>,
    /// Microseconds of CPU per request (or per unit of `per`), per part.
    pub us_per_request: BTreeMap<String, f64>,
    /// Of `us_per_request`, the microseconds in the kernel (system time).
    pub system_us_per_request: BTreeMap<String, f64>,
    /// Times the part's threads were put on a CPU, per request.
    pub runs_per_request: BTreeMap<String, f64>,
    /// Microseconds the part's threads waited, runnable, for a CPU, per request.
    pub wait_us_per_request: BTreeMap<String, f64>,
}

pub fn between(before: &Snapshot, after: &Snapshot, requests: u64) -> Usage {
    let hz = 100.0; // USER_HZ on Linux
    let per = requests.max(1) as f64;
    let mut sched: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (key, end) in &after.threads {
        let (runs, wait_ns) = before
            .threads
            .get(key)
            .filter(|start| start.part == end.part)
            .map_or((0, 0), |start| (start.runs, start.wait_ns));
        let sum = sched.entry(end.part).or_default();
        sum.0 += end.runs.saturating_sub(runs);
        sum.1 += end.wait_ns.saturating_sub(wait_ns);
    }
    let mut usage = Usage::default();
    for (part, end) in &after.ticks {
        let start = before.ticks.get(part).copied().unwrap_or_default();
        let secs = end.all.saturating_sub(start.all) as f64 / hz;
        if secs > 0.0 {
            let (runs, wait_ns) = sched.get(part).copied().unwrap_or_default();
            let part = part.to_string();
            usage.cpu_s.insert(part.clone(), secs);
            usage.us_per_request.insert(part.clone(), secs * 1e6 / per);
            usage.system_us_per_request.insert(
                part.clone(),
                end.system.saturating_sub(start.system) as f64 / hz * 1e6 / per,
            );
            usage
                .runs_per_request
                .insert(part.clone(), runs as f64 / per);
            usage
                .wait_us_per_request
                .insert(part, wait_ns as f64 / 1e3 / per);
        }
    }
    usage
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
        line(&self.us_per_request)
    }

    /// "per request: nginx 40 % in the kernel, on a CPU 2.10 times (waited 3.0 µs), …",
    /// in `line`'s order.
    pub fn sched_line(&self) -> String {
        let mut parts: Vec<(&String, &f64)> = self.us_per_request.iter().collect();
        parts.sort_by(|a, b| b.1.total_cmp(a.1));
        let parts: Vec<String> = parts
            .iter()
            .map(|(p, us)| {
                let kernel = self.system_us_per_request.get(*p).copied().unwrap_or(0.0);
                let runs = self.runs_per_request.get(*p).copied().unwrap_or(0.0);
                let wait = self.wait_us_per_request.get(*p).copied().unwrap_or(0.0);
                format!(
                    "{p} {:.0} % in the kernel, on a CPU {runs:.2} times (waited {wait:.1} µs)",
                    100.0 * kernel / *us
                )
            })
            .collect();
        format!("per request: {}", parts.join(", "))
    }
}

/// "nginx 12.3 µs, core 20.1 µs, …": µs per part, largest first.
pub fn line(us_per_part: &BTreeMap<String, f64>) -> String {
    let mut parts: Vec<(&String, &f64)> = us_per_part.iter().collect();
    parts.sort_by(|a, b| b.1.total_cmp(a.1));
    parts
        .iter()
        .map(|(p, us)| format!("{p} {us:.1} µs"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_user_plus_system_ticks_even_with_odd_names() {
        let line = "4242 (nginx: worker) S 1 4242 4242 0 -1 4194624 900 0 0 0 123 45 0 0 20 0 1 0";
        assert_eq!(ticks_of(line), Some((123, 45)));
        assert_eq!(ticks_of("1 (a) b) R 0 0 0 0 0 0 0 0 0 0 7 8"), Some((7, 8)));
        assert_eq!(ticks_of("garbage"), None);
    }

    #[test]
    fn usage_is_per_part_and_per_request() {
        let ticks = |all| Ticks {
            all,
            system: all / 4,
        };
        let thread = |part, runs, wait_ns| Sched {
            part,
            runs,
            wait_ns,
        };
        let before = Snapshot {
            ticks: BTreeMap::from([("nginx", ticks(100)), ("core", ticks(50))]),
            threads: BTreeMap::from([
                ((1, 1), thread("nginx", 10, 0)),
                ((2, 2), thread("core", 5, 0)),
                // Exits in between: its lifetime counts must not come off the others'.
                ((1, 7), thread("nginx", 900_000, 9_000_000_000)),
            ]),
        };
        let after = Snapshot {
            ticks: BTreeMap::from([
                ("nginx", ticks(300)),
                ("core", ticks(50)),
                ("redis", ticks(10)),
            ]),
            threads: BTreeMap::from([
                ((1, 1), thread("nginx", 1_000_010, 1_000_000_000)),
                // Started in between: every count is the window's.
                ((1, 8), thread("nginx", 1_000_000, 2_000_000_000)),
                ((2, 2), thread("core", 5, 0)),
                ((3, 3), thread("redis", 500_000, 0)),
            ]),
        };
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
        assert_eq!(u.runs_per_request.get("nginx"), Some(&2.0));
        assert_eq!(u.system_us_per_request.get("nginx"), Some(&0.5));
        assert_eq!(u.wait_us_per_request.get("nginx"), Some(&3.0));
        assert_eq!(u.runs_per_request.get("redis"), Some(&0.5));
        assert_eq!(
            u.sched_line(),
            "per request: nginx 25 % in the kernel, on a CPU 2.00 times (waited 3.0 µs), \
             redis 20 % in the kernel, on a CPU 0.50 times (waited 0.0 µs)"
        );
    }

    #[test]
    fn schedstat_lines_give_runs_and_waits() {
        assert_eq!(
            schedstat_of("12670780769 4638126741 293352\n"),
            Some((293352, 4638126741))
        );
        assert_eq!(schedstat_of("1 2"), None);
        assert_eq!(schedstat_of("a b c"), None);
    }
}
