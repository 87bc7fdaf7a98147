//! The test stack's own core and edge, which the edge tests share.

use std::time::Duration;

use serde_json::Value;
use stampede_core::Settings;
use stampede_core::keys::{Bucket, Keys};

use crate::admin::AdminClient;
use crate::app::stock_in;
use crate::buyers::{Buyer, purchase};
use crate::stack::Stack;

/// The test stack's own core and edge (ports of `make test`), shared by the edge tests.
pub struct StackApp {
    pub admin: AdminClient,
    /// The stack core's database.
    pub mysql: mysql_async::Pool,
    pub edge_url: String,
    pub redis: stampede_core::infra::redis::Redis,
    pub http: reqwest::Client,
}

/// The stack's core and edge, and the lock every test that uses them holds: they share
/// one edge, whose limits a test may change.
pub async fn stack_app() -> (StackApp, tokio::sync::MutexGuard<'static, ()>) {
    static EDGE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let guard = EDGE.lock().await;
    let stack = Stack::from_env();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(512)
        .build()
        .unwrap();
    let app = StackApp {
        mysql: mysql_async::Pool::new(stack.mysql_url("stampede").as_str()),
        admin: AdminClient {
            http: http.clone(),
            url: format!("http://127.0.0.1:{}", stack.admin_port),
            token: stack.secret("admin.token"),
        },
        edge_url: format!("http://127.0.0.1:{}", stack.edge_port),
        redis: stack.redis().await,
        http,
    };
    (app, guard)
}

impl StackApp {
    /// The stack core's Redis keys: the core's own layout, under the default prefix.
    pub fn keys(&self) -> Keys {
        Keys::new(&Settings::defaults().redis.key_prefix)
    }

    /// Units Redis still has for a category (of an event of one bucket).
    pub async fn stock(&self, event_id: u64, category_id: u64) -> i64 {
        stock_in(
            &self.redis,
            self.keys().stock(Bucket::only(event_id)),
            category_id,
        )
        .await
    }

    /// A purchase through the edge.
    pub async fn buy(&self, event_id: u64, buyer: &Buyer, key: &str, body: Value) -> (u16, Value) {
        purchase(
            &self.http,
            &self.edge_url,
            event_id,
            &buyer.token,
            key,
            body,
        )
        .await
    }
}

/// The stack's own core, stopped (SIGTERM, waited for until the process is gone; SIGKILL
/// after 30 s) until [`StoppedCore::start`] or drop, which start it again as it ran: the
/// binary at the same path, the same arguments, environment and directory, read from
/// `/proc` before it stopped; in a session of its own (as `scripts/stack.sh` starts it,
/// it outlives the test run), its output appended to the stack's core log, its pid in
/// the stack's pid file (so `make test-stack-down` stops it). The single stack only: with
/// a second core the edge would send the purchase there.
pub struct StoppedCore {
    stack: crate::stack::Stack,
    cmdline: Vec<std::ffi::OsString>,
    environ: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    cwd: std::path::PathBuf,
    running: bool,
}

/// The NUL-separated strings of a `/proc/<pid>/cmdline` or `environ` (the last one
/// ends with a NUL too).
fn nul_separated(bytes: &[u8]) -> Vec<std::ffi::OsString> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = bytes.strip_suffix(&[0]).unwrap_or(bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    bytes
        .split(|b| *b == 0)
        .map(|part| std::ffi::OsStr::from_bytes(part).to_owned())
        .collect()
}

impl StoppedCore {
    pub async fn stop(stack: crate::stack::Stack) -> StoppedCore {
        use std::os::unix::ffi::OsStrExt;
        assert!(
            !stack.dir.join("pids/core2.pid").exists(),
            "a stack of two cores: stopping one stops no purchase"
        );
        let pid_file = stack.dir.join("pids/core.pid");
        let pid: u32 = std::fs::read_to_string(&pid_file)
            .expect("the stack's core pid file")
            .trim()
            .parse()
            .expect("a pid in the stack's core pid file");
        let proc = std::path::PathBuf::from(format!("/proc/{pid}"));
        let cmdline = nul_separated(&std::fs::read(proc.join("cmdline")).expect("the core runs"));
        let is_core = cmdline.len() == 2
            && cmdline[0].as_bytes().ends_with(b"/stampede")
            && cmdline[1] == "serve";
        assert!(is_core, "pid {pid} is not the stack's core: {cmdline:?}");
        let environ = nul_separated(&std::fs::read(proc.join("environ")).expect("its environment"))
            .into_iter()
            .filter_map(|pair| {
                let bytes = pair.as_bytes();
                let at = bytes.iter().position(|b| *b == b'=')?;
                Some((
                    std::ffi::OsStr::from_bytes(&bytes[..at]).to_owned(),
                    std::ffi::OsStr::from_bytes(&bytes[at + 1..]).to_owned(),
                ))
            })
            .collect();
        let cwd = std::fs::read_link(proc.join("cwd")).expect("its directory");
        let signal = |name: &str| {
            std::process::Command::new("kill")
                .args([name, &pid.to_string()])
                .status()
                .is_ok_and(|s| s.success())
        };
        assert!(
            signal("-TERM"),
            "could not stop the stack's core (pid {pid})"
        );
        // Gone, not only deaf: a core stopping still answers on the connections it has.
        let gone = async || {
            crate::wait::eventually(Duration::from_secs(30), || async { !proc.exists() }).await
        };
        if !gone().await {
            signal("-KILL");
            assert!(gone().await, "the stack's core (pid {pid}) did not end");
        }
        StoppedCore {
            stack,
            cmdline,
            environ,
            cwd,
            running: false,
        }
    }

    fn spawn(&mut self) -> Result<(), String> {
        // In a session of its own, as scripts/stack.sh leaves it: no signal meant for the
        // test run reaches it, and it outlives the test.
        let started = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"log=$1; shift; setsid "$@" >>"$log" 2>&1 </dev/null & echo $!"#)
            .arg("sh")
            .arg(self.stack.dir.join("logs/core.log"))
            .args(&self.cmdline)
            .env_clear()
            .envs(self.environ.iter().cloned())
            .current_dir(&self.cwd)
            .output()
            .map_err(|e| format!("the core did not start again: {e}"))?;
        let pid = String::from_utf8_lossy(&started.stdout).trim().to_owned();
        if !started.status.success() || pid.parse::<u32>().is_err() {
            return Err(format!("the core did not start again: {started:?}"));
        }
        std::fs::write(self.stack.dir.join("pids/core.pid"), format!("{pid}\n"))
            .map_err(|e| format!("the stack's core pid file: {e}"))?;
        self.running = true;
        Ok(())
    }

    fn health_url(&self) -> String {
        format!("http://127.0.0.1:{}/healthz", self.stack.admin_port)
    }

    /// Starts it again and waits until it answers on its admin port.
    pub async fn start(mut self) {
        self.spawn().unwrap();
        let (http, url) = (reqwest::Client::new(), self.health_url());
        let up = crate::wait::eventually(Duration::from_secs(60), || async {
            http.get(&url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        assert!(up, "the stack's core did not come back");
    }
}

impl Drop for StoppedCore {
    /// A test that failed with the core stopped: start it again and wait for it (up to
    /// 60 s), so the next test meets a core; never panic here (a panic while unwinding
    /// aborts the test run).
    fn drop(&mut self) {
        if self.running {
            return;
        }
        if let Err(e) = self.spawn() {
            eprintln!("{e}");
            return;
        }
        let admin = format!("127.0.0.1:{}", self.stack.admin_port);
        for _ in 0..600 {
            if std::net::TcpStream::connect(&admin).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("the stack's core did not come back within 60 s");
    }
}
