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

/// The stack's own core, stopped (SIGTERM, waited for until its public port refuses
/// connections) until [`StoppedCore::start`] or drop, which start it again as it ran:
/// the same binary, arguments, environment and directory, read from `/proc` before it
/// stopped; its output appended to the stack's core log, its pid in the stack's pid file
/// (so `make test-stack-down` stops it).
pub struct StoppedCore {
    stack: crate::stack::Stack,
    cmdline: Vec<std::ffi::OsString>,
    environ: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    cwd: std::path::PathBuf,
    running: bool,
}

impl StoppedCore {
    pub async fn stop(stack: crate::stack::Stack) -> StoppedCore {
        use std::os::unix::ffi::OsStrExt;
        let pid_file = stack.dir.join("pids/core.pid");
        let pid = std::fs::read_to_string(&pid_file).expect("the stack's core pid file");
        let pid = pid.trim().to_owned();
        let proc = std::path::PathBuf::from(format!("/proc/{pid}"));
        let split = |bytes: Vec<u8>| -> Vec<std::ffi::OsString> {
            bytes
                .split(|b| *b == 0)
                .filter(|part| !part.is_empty())
                .map(|part| std::ffi::OsStr::from_bytes(part).to_owned())
                .collect()
        };
        let cmdline = split(std::fs::read(proc.join("cmdline")).expect("the core's command line"));
        let environ = split(std::fs::read(proc.join("environ")).expect("the core's environment"))
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
        let cwd = std::fs::read_link(proc.join("cwd")).expect("the core's directory");
        assert!(
            !cmdline.is_empty(),
            "no command line for the core (pid {pid})"
        );
        let stopped = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(
            stopped.success(),
            "could not stop the stack's core (pid {pid})"
        );
        let public = format!("127.0.0.1:{}", stack.core_port);
        let gone = crate::wait::eventually(Duration::from_secs(30), || async {
            tokio::net::TcpStream::connect(&public).await.is_err()
        })
        .await;
        assert!(gone, "the stack's core still takes connections");
        StoppedCore {
            stack,
            cmdline,
            environ,
            cwd,
            running: false,
        }
    }

    fn spawn(&mut self) {
        // Through a shell that leaves it running in the background, as scripts/stack.sh
        // starts it: the core is nobody's child here, and outlives the test.
        let started = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"log=$1; shift; "$@" >>"$log" 2>&1 </dev/null & echo $!"#)
            .arg("sh")
            .arg(self.stack.dir.join("logs/core.log"))
            .args(&self.cmdline)
            .env_clear()
            .envs(self.environ.iter().cloned())
            .current_dir(&self.cwd)
            .output()
            .expect("the core starts again");
        let pid = String::from_utf8_lossy(&started.stdout).trim().to_owned();
        assert!(
            started.status.success() && pid.parse::<u32>().is_ok(),
            "the core did not start again: {started:?}"
        );
        std::fs::write(self.stack.dir.join("pids/core.pid"), format!("{pid}\n"))
            .expect("the stack's core pid file");
        self.running = true;
    }

    /// Starts it again and waits until it answers on its admin port.
    pub async fn start(mut self) {
        self.spawn();
        let http = reqwest::Client::new();
        let url = format!("http://127.0.0.1:{}/healthz", self.stack.admin_port);
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
    fn drop(&mut self) {
        if !self.running {
            self.spawn();
        }
    }
}
