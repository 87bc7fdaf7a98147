//! A second instrument for the edge's two cheapest paths: wrk (Debian's package; `make
//! bench` installs it, `scripts/stack.sh install-bench-tools`) sends the same purchase POST
//! as the bench's own client — a bearer token rotating over the buyers, a fresh
//! Idempotency-Key, `Content-Type: application/json`, the same body — to a sold-out
//! event's purchase path and to `/edge/health` (answered by one line of Lua, no limits),
//! and the ratio of their answers/s and of nginx's CPU per answer is compared with the
//! bench's own figures in the same run.
//!
//! wrk runs with a generated Lua script: `init` reads the tokens from a file (per thread),
//! `request` builds each request with `wrk.format`, `response` counts the answers by
//! status and error code (as [`crate::record::Recorder`] names them: "200", "409 SOLD_OUT"),
//! and `done` adds up every thread's counts (`setup` keeps the threads, `thread:get`) and
//! prints them with the summary as `stampede-wrk…` lines, parsed here. wrk's own CPU is
//! read from `/proc/<pid>/stat` once it has exited and before it is reaped (the zombie
//! still holds every thread's time); nginx's from [`crate::cpu`] over the run, so every
//! nginx process of the machine counts (as in the rest of `compare`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::cpu;

/// wrk's threads (`-t`): one per core of this machine.
pub const THREADS: usize = 2;

/// The trivial path: nginx answers it from one line of Lua, without limits or a token check.
pub const TRIVIAL_PATH: &str = "/edge/health";

/// How long nginx's CPU is read with no load before the runs.
const IDLE_WINDOW: Duration = Duration::from_secs(2);

/// Answers that are not the expected kind above this share make a run unsound.
const UNEXPECTED_MAX: f64 = 0.01;

/// One wrk run against one path.
#[derive(Debug, Clone, Serialize)]
pub struct WrkRun {
    pub path: String,
    /// Complete answers per second, over wrk's own duration.
    pub requests_per_s: f64,
    pub requests: u64,
    pub duration_s: f64,
    /// Answers by status and error code: "200", "409 SOLD_OUT", "429 RATE_LIMITED", …
    pub answers: BTreeMap<String, u64>,
    /// Socket errors: connect, read, write, timeout (wrk's `--timeout`, 2 s).
    pub socket_errors: BTreeMap<String, u64>,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub latency_max_ms: f64,
    /// nginx's CPU (every nginx process, user + system) per answer.
    pub nginx_cpu_us_per_request: f64,
    /// The same less what nginx spent idle over as long (`CrossCheck::nginx_idle_cpu_per_s`:
    /// the edge's refresh timers, other nginx on the machine): an estimate.
    pub nginx_cpu_us_per_request_less_idle: f64,
    /// wrk's own CPU (every thread, user + system) per answer.
    pub client_cpu_us_per_request: f64,
    /// Every part's CPU over the run, per answer (wrk is not among the parts).
    pub cpu: cpu::Usage,
}

/// The two runs and their ratios.
#[derive(Debug, Clone, Serialize)]
pub struct CrossCheck {
    pub threads: usize,
    pub connections: usize,
    pub seconds: u64,
    /// nginx's CPU seconds per second with no load, measured just before the runs.
    pub nginx_idle_cpu_per_s: f64,
    pub sold_out: WrkRun,
    pub trivial: WrkRun,
    /// Sold-out answers/s ÷ trivial answers/s.
    pub reject_vs_trivial_rps: f64,
    /// nginx CPU per sold-out answer ÷ per trivial answer.
    pub nginx_cpu_reject_vs_trivial: f64,
    /// The same, each less nginx's idle CPU.
    pub nginx_cpu_reject_vs_trivial_less_idle: f64,
    /// The sold-out run was answered 409 SOLD_OUT and the trivial one 200, nearly always
    /// (at most 1 % otherwise, socket errors included); `why` says what was found.
    pub sound: bool,
    pub why: String,
}

impl CrossCheck {
    /// The summary lines `compare` prints.
    pub fn lines(&self) -> Vec<String> {
        let run = |name: &str, r: &WrkRun| {
            format!(
                "  {name} {}: {:.0}/s, nginx {:.1} µs ({:.1} less idle), wrk {:.1} µs per answer, p99 {:.1} ms, {}",
                r.path,
                r.requests_per_s,
                r.nginx_cpu_us_per_request,
                r.nginx_cpu_us_per_request_less_idle,
                r.client_cpu_us_per_request,
                r.latency_p99_ms,
                answers_line(&r.answers)
            )
        };
        vec![
            format!(
                "wrk cross-check (-t{} -c{} -d{}s, the same POST): sold out ÷ trivial {:.2} answers/s, nginx CPU per answer {:.2} ({:.2} less idle nginx, {:.3} CPU s/s){}",
                self.threads,
                self.connections,
                self.seconds,
                self.reject_vs_trivial_rps,
                self.nginx_cpu_reject_vs_trivial,
                self.nginx_cpu_reject_vs_trivial_less_idle,
                self.nginx_idle_cpu_per_s,
                if self.sound {
                    String::new()
                } else {
                    format!(" — NOT SOUND: {}", self.why)
                }
            ),
            run("sold out", &self.sold_out),
            run("trivial ", &self.trivial),
        ]
    }
}

fn answers_line(answers: &BTreeMap<String, u64>) -> String {
    answers
        .iter()
        .map(|(k, n)| format!("{k} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// wrk on PATH, if it is there.
pub fn find_wrk() -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("wrk"))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The sold-out purchase path, then `/edge/health`, each for `seconds` with
/// `connections` connections (`-t2 -c<connections> -d<seconds>s --latency`), the same
/// request on both. None (and a note on stderr) when wrk is not on PATH.
pub async fn cross_check(
    edge: SocketAddr,
    sold_out_path: &str,
    body: &str,
    tokens: &[String],
    connections: usize,
    seconds: u64,
) -> anyhow::Result<Option<CrossCheck>> {
    let Some(wrk) = find_wrk() else {
        eprintln!(
            "note: wrk is not on PATH: the wrk cross-check is skipped (scripts/stack.sh install-bench-tools installs it; make bench does)"
        );
        return Ok(None);
    };
    anyhow::ensure!(!tokens.is_empty(), "the wrk cross-check needs tokens");
    anyhow::ensure!(seconds > 0, "the wrk cross-check needs a duration");
    let connections = connections.max(THREADS);
    let dir = ScratchDir::new()?;
    let tokens_file = dir.0.join("tokens");
    std::fs::write(&tokens_file, tokens.join("\n") + "\n")?;
    let script = dir.0.join("purchase.lua");
    std::fs::write(&script, lua_script(&tokens_file, body, &run_nonce()))?;
    // What nginx spends with no load (timers, refreshes), to tell it from the runs' cost.
    let idle_started = Instant::now();
    let t0 = cpu::snapshot();
    tokio::time::sleep(IDLE_WINDOW).await;
    let idle = cpu::between(&t0, &cpu::snapshot(), 1);
    let nginx_idle_cpu_per_s =
        idle.cpu_s.get("nginx").copied().unwrap_or(0.0) / idle_started.elapsed().as_secs_f64();
    let mut runs = Vec::new();
    for (i, path) in [sold_out_path, TRIVIAL_PATH].into_iter().enumerate() {
        if i > 0 {
            // The first run's connections closed before the second opens its own.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let (wrk, script, out) = (wrk.clone(), script.clone(), dir.0.join(format!("out-{i}")));
        let url = format!("http://{edge}{path}");
        let path = path.to_owned();
        let run = tokio::task::spawn_blocking(move || {
            run_once(&wrk, &script, &url, &out, connections, seconds)
        })
        .await??;
        runs.push(run.into_run(path, nginx_idle_cpu_per_s));
    }
    let trivial = runs.pop().expect("two runs");
    let sold_out = runs.pop().expect("two runs");
    let (sound, why) = soundness(&sold_out, &trivial);
    Ok(Some(CrossCheck {
        threads: THREADS,
        connections,
        seconds,
        nginx_idle_cpu_per_s,
        reject_vs_trivial_rps: sold_out.requests_per_s / trivial.requests_per_s,
        nginx_cpu_reject_vs_trivial: sold_out.nginx_cpu_us_per_request
            / trivial.nginx_cpu_us_per_request,
        nginx_cpu_reject_vs_trivial_less_idle: sold_out.nginx_cpu_us_per_request_less_idle
            / trivial.nginx_cpu_us_per_request_less_idle,
        sold_out,
        trivial,
        sound,
        why,
    }))
}

/// Whether each run heard what its path answers, and what it heard otherwise.
fn soundness(sold_out: &WrkRun, trivial: &WrkRun) -> (bool, String) {
    let mut problems = Vec::new();
    let mut found = Vec::new();
    for (run, expected) in [(sold_out, "409 SOLD_OUT"), (trivial, "200")] {
        let errors: u64 = run.socket_errors.values().sum();
        let seen = run.answers.get(expected).copied().unwrap_or(0);
        let all = run.requests + errors;
        let share = seen as f64 / all.max(1) as f64;
        found.push(format!(
            "{}: {expected} {:.2} % of {all}",
            run.path,
            share * 100.0
        ));
        if all == 0 {
            problems.push(format!("{}: no answer at all", run.path));
        } else if share < 1.0 - UNEXPECTED_MAX {
            let others: BTreeMap<&String, &u64> = run
                .answers
                .iter()
                .filter(|(k, _)| k.as_str() != expected)
                .collect();
            problems.push(format!(
                "{}: {expected} only {:.1} % of {all} (others {others:?}, socket errors {:?})",
                run.path,
                share * 100.0,
                run.socket_errors
            ));
        }
    }
    if problems.is_empty() {
        (true, found.join("; "))
    } else {
        (false, problems.join("; "))
    }
}

/// A per-run prefix of the Idempotency-Keys: never a key of an earlier run.
fn run_nonce() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{:x}", nanos as u64 ^ u64::from(std::process::id()) << 40)
}

/// A temporary directory for the tokens, the script and wrk's output; removed when dropped.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new() -> anyhow::Result<ScratchDir> {
        let dir = std::env::temp_dir().join(format!(
            "stampede-bench-wrk-{}-{}",
            std::process::id(),
            run_nonce()
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        Ok(ScratchDir(dir))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A Lua string literal of `s` (any bytes).
fn lua_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for b in s.bytes() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b' '..=b'~' => out.push(b as char),
            // Three digits always: a digit after the escape cannot extend it.
            _ => out.push_str(&format!("\\{b:03}")),
        }
    }
    out.push('"');
    out
}

/// The script wrk runs: the same request as the bench's own purchase loop, every answer
/// counted by kind, the counts and the summary printed as `stampede-wrk…` lines.
fn lua_script(tokens_file: &Path, body: &str, nonce: &str) -> String {
    format!(
        r#"-- Written by stampede-bench (bench/src/wrk.rs) for one cross-check.
local tokens_file = {tokens_file}
local body = {body}
local nonce = {nonce}
local nthreads = {THREADS}
local threads = {{}}

function setup(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end

function init(args)
  tokens = {{}}
  for line in io.lines(tokens_file) do
    if #line > 0 then tokens[#tokens + 1] = line end
  end
  assert(#tokens > 0, "no tokens in " .. tokens_file)
  n = 0
  answers = {{}}
end

function request()
  n = n + 1
  local headers = {{
    ["Authorization"] = "Bearer " .. tokens[(n * nthreads + id) % #tokens + 1],
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = "wrk" .. nonce .. "-" .. id .. "-" .. n,
  }}
  return wrk.format("POST", nil, headers, body)
end

function response(status, headers, resp)
  local code = resp and resp:match('"code":"([^"]*)"')
  local kind = code and (status .. " " .. code) or tostring(status)
  answers[kind] = (answers[kind] or 0) + 1
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "stampede-wrk requests=%d duration_us=%d bytes=%d connect=%d read=%d write=%d status=%d timeout=%d p50_us=%d p99_us=%d max_us=%d\n",
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(99), latency.max))
  local all = {{}}
  for _, t in ipairs(threads) do
    for kind, count in pairs(t:get("answers") or {{}}) do
      all[kind] = (all[kind] or 0) + count
    end
  end
  for kind, count in pairs(all) do
    io.write(string.format("stampede-wrk-answer %s %d\n", kind, count))
  end
end
"#,
        tokens_file = lua_string(&tokens_file.to_string_lossy()),
        body = lua_string(body),
        nonce = lua_string(nonce),
    )
}

/// What one wrk run printed, and the CPU around it.
struct Outcome {
    summary: Summary,
    wrk_ticks: u64,
    usage: cpu::Usage,
}

impl Outcome {
    fn into_run(self, path: String, nginx_idle_cpu_per_s: f64) -> WrkRun {
        let s = self.summary;
        let requests = s.requests;
        let per = |secs: f64| secs * 1e6 / requests.max(1) as f64;
        let nginx_s = self.usage.cpu_s.get("nginx").copied().unwrap_or(0.0);
        let idle_s = nginx_idle_cpu_per_s * s.duration_us as f64 / 1e6;
        WrkRun {
            path,
            requests_per_s: requests as f64 / (s.duration_us as f64 / 1e6).max(1e-9),
            requests,
            duration_s: s.duration_us as f64 / 1e6,
            answers: s.answers,
            socket_errors: BTreeMap::from([
                ("connect".to_owned(), s.connect),
                ("read".to_owned(), s.read),
                ("write".to_owned(), s.write),
                ("timeout".to_owned(), s.timeout),
            ]),
            latency_p50_ms: s.p50_us as f64 / 1000.0,
            latency_p99_ms: s.p99_us as f64 / 1000.0,
            latency_max_ms: s.max_us as f64 / 1000.0,
            nginx_cpu_us_per_request: per(nginx_s),
            nginx_cpu_us_per_request_less_idle: per((nginx_s - idle_s).max(0.0)),
            client_cpu_us_per_request: per(self.wrk_ticks as f64 / 100.0), // USER_HZ
            cpu: self.usage,
        }
    }
}

/// Runs wrk once, to the end of its duration; its CPU read before it is reaped.
fn run_once(
    wrk: &Path,
    script: &Path,
    url: &str,
    out: &Path,
    connections: usize,
    seconds: u64,
) -> anyhow::Result<Outcome> {
    let stdout = std::fs::File::create(out.with_extension("stdout"))?;
    let stderr = std::fs::File::create(out.with_extension("stderr"))?;
    let t0 = cpu::snapshot();
    let mut child = std::process::Command::new(wrk)
        .arg(format!("-t{THREADS}"))
        .arg(format!("-c{connections}"))
        .arg(format!("-d{seconds}s"))
        .arg("--latency")
        .arg("-s")
        .arg(script)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("start {}", wrk.display()))?;
    // wrk stops itself after `seconds`; a stuck one is killed well after.
    let ticks = wait_exited(&mut child, Duration::from_secs(seconds + 30))?;
    let t1 = cpu::snapshot();
    let status = child.wait()?;
    let text = std::fs::read_to_string(out.with_extension("stdout"))?;
    let errors = std::fs::read_to_string(out.with_extension("stderr")).unwrap_or_default();
    anyhow::ensure!(
        status.success(),
        "wrk {url} failed ({status}): {}{errors}",
        text.trim()
    );
    let summary = parse(&text).with_context(|| {
        format!("no stampede-wrk line in wrk's output for {url}:\n{text}{errors}")
    })?;
    let usage = cpu::between(&t0, &t1, summary.requests);
    Ok(Outcome {
        summary,
        wrk_ticks: ticks,
        usage,
    })
}

/// Waits until `child` has exited, without reaping it; its CPU ticks (user + system, every
/// thread), read from the zombie, which still holds them. Kills it after `within`.
fn wait_exited(child: &mut std::process::Child, within: Duration) -> anyhow::Result<u64> {
    let stat = PathBuf::from(format!("/proc/{}/stat", child.id()));
    let deadline = Instant::now() + within;
    let read = || {
        std::fs::read_to_string(&stat)
            .ok()
            .as_deref()
            .and_then(state_and_ticks)
    };
    let mut ticks = 0;
    while let Some((state, t)) = read() {
        ticks = t;
        if state == 'Z' || state == 'X' {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!(
                "process {} did not stop within {within:?}; killed",
                child.id()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(ticks)
}

/// The state letter and utime + stime of a `/proc/<pid>/stat` line (fields 3, 14, 15
/// after the parenthesised name, which may hold spaces or parentheses).
fn state_and_ticks(stat: &str) -> Option<(char, u64)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let field = |i: usize| fields.get(i - 3)?.parse::<u64>().ok();
    Some((state, field(14)? + field(15)?))
}

/// What the script's `done` printed (and wrk's own Requests/sec, to check against).
#[derive(Debug, Default, PartialEq)]
struct Summary {
    requests: u64,
    duration_us: u64,
    bytes: u64,
    connect: u64,
    read: u64,
    write: u64,
    /// wrk's "Non-2xx or 3xx responses" (status > 399).
    status: u64,
    timeout: u64,
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
    answers: BTreeMap<String, u64>,
    /// wrk's own `Requests/sec:` line.
    wrk_requests_per_s: Option<f64>,
}

/// wrk's output with the script's lines; None without the `stampede-wrk` summary line.
fn parse(text: &str) -> Option<Summary> {
    let mut summary = None;
    let mut answers = BTreeMap::new();
    let mut wrk_rps = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("stampede-wrk-answer ") {
            let (kind, count) = rest.rsplit_once(' ')?;
            *answers.entry(kind.to_owned()).or_insert(0) += count.parse::<u64>().ok()?;
        } else if let Some(rest) = line.strip_prefix("stampede-wrk ") {
            let fields: BTreeMap<&str, u64> = rest
                .split_whitespace()
                .map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k, v.parse().ok()?))
                })
                .collect::<Option<_>>()?;
            let get = |k: &str| fields.get(k).copied();
            summary = Some(Summary {
                requests: get("requests")?,
                duration_us: get("duration_us")?,
                bytes: get("bytes")?,
                connect: get("connect")?,
                read: get("read")?,
                write: get("write")?,
                status: get("status")?,
                timeout: get("timeout")?,
                p50_us: get("p50_us")?,
                p99_us: get("p99_us")?,
                max_us: get("max_us")?,
                ..Summary::default()
            });
        } else if let Some(rest) = line.strip_prefix("Requests/sec:") {
            wrk_rps = rest.trim().parse().ok();
        }
    }
    let mut summary = summary?;
    summary.answers = answers;
    summary.wrk_requests_per_s = wrk_rps;
    Some(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// wrk 4.1.0's output with the script's lines, as a run against a sold-out event prints it.
    const OUTPUT: &str = "Running 8s test @ http://127.0.0.1:18080/api/events/7/orders
  2 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.62ms  431.12us  14.02ms   78.39%
    Req/Sec    19.91k     1.21k   22.57k    71.88%
  Latency Distribution
     50%    1.55ms
     75%    1.80ms
     90%    2.12ms
     99%    3.07ms
  317019 requests in 8.00s, 98.74MB read
  Non-2xx or 3xx responses: 317019
Requests/sec:  39616.43
Transfer/sec:     12.34MB
stampede-wrk requests=317019 duration_us=8002186 bytes=103537152 connect=0 read=0 write=0 status=317019 timeout=0 p50_us=1550 p99_us=3070 max_us=14020
stampede-wrk-answer 409 SOLD_OUT 317000
stampede-wrk-answer 429 RATE_LIMITED 19
";

    #[test]
    fn the_summary_line_and_the_answers_are_parsed() {
        let s = parse(OUTPUT).expect("parsed");
        assert_eq!(s.requests, 317_019);
        assert_eq!(s.duration_us, 8_002_186);
        assert_eq!(s.bytes, 103_537_152);
        assert_eq!((s.connect, s.read, s.write, s.timeout), (0, 0, 0, 0));
        assert_eq!(s.status, 317_019);
        assert_eq!((s.p50_us, s.p99_us, s.max_us), (1550, 3070, 14_020));
        assert_eq!(
            s.answers,
            BTreeMap::from([
                ("409 SOLD_OUT".to_owned(), 317_000),
                ("429 RATE_LIMITED".to_owned(), 19)
            ])
        );
        assert_eq!(s.wrk_requests_per_s, Some(39_616.43));
        // The rate from the summary line is wrk's own.
        let rps = s.requests as f64 / (s.duration_us as f64 / 1e6);
        assert!((rps - 39_616.43).abs() < 1.0, "{rps}");
    }

    #[test]
    fn output_without_the_summary_line_or_with_a_broken_one_is_none() {
        assert_eq!(parse("Running 8s test @ x\nRequests/sec: 1.0\n"), None);
        assert_eq!(parse("stampede-wrk requests=1 duration_us=2\n"), None);
        assert_eq!(
            parse(&OUTPUT.replace("bytes=103537152", "bytes=lots")),
            None
        );
        assert_eq!(
            parse(&OUTPUT.replace("SOLD_OUT 317000", "SOLD_OUT many")),
            None
        );
    }

    #[test]
    fn a_plain_status_is_a_kind_of_its_own() {
        let s = parse(
            "stampede-wrk requests=3 duration_us=1000000 bytes=9 connect=0 read=1 write=0 status=0 timeout=2 p50_us=1 p99_us=2 max_us=3\n\
             stampede-wrk-answer 200 3\n",
        )
        .expect("parsed");
        assert_eq!(s.answers, BTreeMap::from([("200".to_owned(), 3)]));
        assert_eq!(s.wrk_requests_per_s, None);
        let run = Outcome {
            summary: s,
            wrk_ticks: 3,
            usage: cpu::Usage {
                cpu_s: BTreeMap::from([("nginx".to_owned(), 2.0)]),
                ..Default::default()
            },
        }
        // Idle, nginx spent 0.5 CPU s a second: 0.5 of the run's 2 s were not the answers'.
        .into_run("/edge/health".into(), 0.5);
        assert_eq!(run.requests_per_s, 3.0);
        assert_eq!(run.client_cpu_us_per_request, 10_000.0);
        assert_eq!(run.nginx_cpu_us_per_request, 2e6 / 3.0);
        assert_eq!(run.nginx_cpu_us_per_request_less_idle, 1.5e6 / 3.0);
        assert_eq!(run.socket_errors["timeout"], 2);
    }

    #[test]
    fn proc_stat_gives_the_state_and_the_ticks() {
        let line = "4242 (wrk) Z 1 4242 4242 0 -1 4194624 900 0 0 0 123 45 0 0 20 0 1 0";
        assert_eq!(state_and_ticks(line), Some(('Z', 168)));
        assert_eq!(
            state_and_ticks("1 (a) b) R 0 0 0 0 0 0 0 0 0 0 7 8"),
            Some(('R', 15))
        );
        assert_eq!(state_and_ticks("garbage"), None);
        // This very process's line parses (its state is its main thread's).
        let own = std::fs::read_to_string("/proc/self/stat").expect("procfs");
        assert!(state_and_ticks(&own).is_some_and(|(s, _)| "RSD".contains(s)));
    }

    #[test]
    fn a_child_s_cpu_is_read_before_it_is_reaped() {
        // The reference: a reaped child's time goes to this process's cutime + cstime.
        let children = || {
            let stat = std::fs::read_to_string("/proc/self/stat").expect("procfs");
            let (_, rest) = stat.rsplit_once(')').expect("stat");
            let f: Vec<u64> = rest
                .split_whitespace()
                .skip(13)
                .take(2)
                .map(|v| v.parse().expect("ticks"))
                .collect();
            f[0] + f[1]
        };
        let mut child = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"])
            .spawn()
            .expect("sh");
        let before = children();
        let ticks = wait_exited(&mut child, Duration::from_secs(60)).expect("exited");
        assert!(child.wait().expect("reaped").success());
        let reaped = children() - before;
        assert!(ticks >= 5, "the loop burns CPU: {ticks} ticks");
        assert!(
            ticks.abs_diff(reaped) <= 1,
            "zombie {ticks} vs reaped {reaped}"
        );
    }

    #[test]
    fn lua_strings_hold_any_text() {
        assert_eq!(lua_string("plain"), r#""plain""#);
        assert_eq!(
            lua_string(r#"{"category_id":3,"quantity":1}"#),
            r#""{\"category_id\":3,\"quantity\":1}""#
        );
        assert_eq!(lua_string("a\\b\n1"), r#""a\\b\0101""#);
        assert_eq!(lua_string("é"), r#""\195\169""#);
    }

    #[test]
    fn the_script_sends_the_same_post_and_counts_every_thread() {
        let s = lua_script(Path::new("/tmp/x/tokens"), r#"{"quantity":1}"#, "n1");
        for needle in [
            r#"local tokens_file = "/tmp/x/tokens""#,
            r#"local body = "{\"quantity\":1}""#,
            "local nthreads = 2",
            r#"wrk.format("POST", nil, headers, body)"#,
            r#"["Authorization"] = "Bearer " .."#,
            r#"["Content-Type"] = "application/json""#,
            r#"["Idempotency-Key"] = "wrk" .. nonce"#,
            r#"t:get("answers")"#,
            "stampede-wrk requests=%d",
            "stampede-wrk-answer %s %d",
        ] {
            assert!(s.contains(needle), "{needle} not in\n{s}");
        }
        // The summary line's fields are the ones `parse` asks for.
        for field in [
            "requests=",
            "duration_us=",
            "bytes=",
            "connect=",
            "read=",
            "write=",
            "status=",
            "timeout=",
            "p50_us=",
            "p99_us=",
            "max_us=",
        ] {
            assert!(s.contains(field), "{field}");
        }
    }

    fn run(path: &str, answers: &[(&str, u64)], timeouts: u64) -> WrkRun {
        let answers: BTreeMap<String, u64> =
            answers.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        WrkRun {
            path: path.into(),
            requests_per_s: 1.0,
            requests: answers.values().sum(),
            duration_s: 1.0,
            answers,
            socket_errors: BTreeMap::from([("timeout".to_owned(), timeouts)]),
            latency_p50_ms: 0.0,
            latency_p99_ms: 0.0,
            latency_max_ms: 0.0,
            nginx_cpu_us_per_request: 1.0,
            nginx_cpu_us_per_request_less_idle: 1.0,
            client_cpu_us_per_request: 1.0,
            cpu: cpu::between(&cpu::Snapshot::default(), &cpu::Snapshot::default(), 1),
        }
    }

    #[test]
    fn a_run_is_sound_only_when_each_path_answered_what_it_should() {
        let trivial = run("/edge/health", &[("200", 1000)], 0);
        let (ok, why) = soundness(
            &run(
                "/api/events/7/orders",
                &[("409 SOLD_OUT", 999), ("429 RATE_LIMITED", 1)],
                0,
            ),
            &trivial,
        );
        assert!(ok, "{why}");
        let (ok, why) = soundness(
            &run(
                "/api/events/7/orders",
                &[("409 SOLD_OUT", 10), ("401 UNAUTHORIZED", 990)],
                0,
            ),
            &trivial,
        );
        assert!(!ok);
        assert!(
            why.contains("409 SOLD_OUT only 1.0 %") && why.contains("401 UNAUTHORIZED"),
            "{why}"
        );
        // Socket errors count against a run too.
        let (ok, why) = soundness(
            &run("/api/events/7/orders", &[("409 SOLD_OUT", 900)], 100),
            &trivial,
        );
        assert!(!ok, "{why}");
        let (ok, why) = soundness(
            &run("/api/events/7/orders", &[("409 SOLD_OUT", 1000)], 0),
            &run("/edge/health", &[], 0),
        );
        assert!(!ok && why.contains("no answer at all"), "{why}");
    }

    /// By hand, against a running stack (the test stack: the variables of `make
    /// test-stack-up`, as `scripts/stack.sh` reads them):
    /// `STACK_DIR=$PWD/.stack-test EDGE_PORT=18080 ADMIN_PORT=19091 MYSQL_PORT=13306
    /// REDIS_PORT=16379 cargo test -p stampede-bench wrk::tests::against_the_stack -- --ignored --nocapture`
    /// (WRK_SECONDS, WRK_CONNECTIONS: 8 and 64 by default).
    #[tokio::test]
    #[ignore = "needs a running stack and wrk"]
    async fn against_the_stack() {
        use clap::Parser;

        use crate::load::{self, Request};
        use crate::stack::{Stack, StackArgs, event_body};

        #[derive(Parser)]
        struct Args {
            #[command(flatten)]
            stack: StackArgs,
        }
        let env = |k: &str, d: u64| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        let (seconds, connections) = (env("WRK_SECONDS", 8), env("WRK_CONNECTIONS", 64) as usize);
        let stack = Stack::open(&Args::parse_from(["wrk-test"]).stack).expect("the stack");
        let (_, tokens) = stack.buyers(20_000).await.expect("buyers");
        let (event, cats) = stack
            .event(&event_body("wrk sold out", 1, 1, None, 1, Duration::ZERO))
            .await
            .expect("event");
        // The edge learns of a new sale within its 200 ms refresh.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let body = format!(r#"{{"category_id":{},"quantity":1}}"#, cats[0]);
        let path = format!("/api/events/{event}/orders");
        let first = load::call(
            stack.edge,
            &Request::post(&path, &serde_json::from_str(&body).expect("json"))
                .bearer(&tokens[0])
                .idempotency_key("the-one"),
        )
        .await
        .expect("the one purchase");
        assert_eq!(
            first.status,
            202,
            "{}",
            String::from_utf8_lossy(&first.body)
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // Twice: the edge's workers first see these tokens (each verified once per worker,
        // then remembered), then know them all, as after the bench's own sold-out loop.
        for pass in ["fresh tokens", "tokens known to the edge"] {
            let check = cross_check(stack.edge, &path, &body, &tokens, connections, seconds)
                .await
                .expect("cross-check")
                .expect("wrk on PATH");
            println!("-- {pass}");
            for line in check.lines() {
                println!("{line}");
            }
            println!("{}", serde_json::to_string(&check).expect("json"));
            assert!(check.sound, "{}", check.why);
        }
        // The bench's own client on the same two paths, the same request, for comparison.
        let d = Duration::from_secs(seconds);
        let mut own = Vec::new();
        for target in [path.clone(), TRIVIAL_PATH.to_owned()] {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let make = load::purchase_maker(event, cats[0], tokens.clone(), connections);
            let t = target.clone();
            let t0 = cpu::snapshot();
            let (rps, rec) = load::closed_loop(stack.edge, connections, d, move |c, n| {
                let mut r = make(c, n);
                r.path = t.clone();
                r
            })
            .await
            .expect("own loop");
            let usage = cpu::between(&t0, &cpu::snapshot(), rec.total());
            println!(
                "bench client {target}: {rps:.0}/s, {:?}, {}",
                rec.counts(),
                usage.line()
            );
            own.push((
                rps,
                usage.us_per_request.get("nginx").copied().unwrap_or(0.0),
            ));
        }
        println!(
            "bench client: sold out ÷ trivial {:.2} answers/s, nginx CPU per answer {:.2}",
            own[0].0 / own[1].0,
            own[0].1 / own[1].1
        );
    }
}
