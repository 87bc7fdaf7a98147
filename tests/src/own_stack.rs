//! A broker, a Redis, a MariaDB and an edge of the test's own, to stop, start or flush;
//! free ports for them.

use std::path::PathBuf;

use crate::stack::root;

/// A RocketMQ name server and broker of the test's own, run by `scripts/stack.sh`, so a
/// test can stop and start them without disturbing others.
pub struct OwnBroker {
    pub dir: PathBuf,
    pub namesrv_port: u16,
    pub broker_port: u16,
}

impl OwnBroker {
    pub fn start() -> OwnBroker {
        let b = OwnBroker {
            dir: own_dir("broker"),
            namesrv_port: free_port(),
            broker_port: free_broker_port(),
        };
        let up = b.stack(&["up", "namesrv", "broker"]);
        assert!(
            up.status.success(),
            "{}",
            String::from_utf8_lossy(&up.stderr)
        );
        b
    }

    pub fn namesrv_addr(&self) -> String {
        format!("127.0.0.1:{}", self.namesrv_port)
    }

    /// `scripts/stack.sh ARGS` on this stack.
    pub fn stack(&self, args: &[&str]) -> std::process::Output {
        own_stack(
            &self.dir,
            &[
                ("NAMESRV_PORT", self.namesrv_port),
                ("BROKER_PORT", self.broker_port),
            ],
            args,
        )
    }

    pub fn stop_broker(&self) {
        assert!(self.stack(&["down", "broker"]).status.success());
    }

    pub fn start_broker(&self) {
        let up = self.stack(&["up", "broker"]);
        assert!(
            up.status.success(),
            "{}",
            String::from_utf8_lossy(&up.stderr)
        );
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        self.stack(&["down"]);
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// `scripts/stack.sh ARGS` for parts of a test's own under `dir`, on `ports`; the
/// other parts point at closed ports.
fn own_stack(dir: &std::path::Path, ports: &[(&str, u16)], args: &[&str]) -> std::process::Output {
    own_stack_with(dir, ports, &[], args)
}

/// [`own_stack`] with more of `scripts/stack.sh`'s settings in `env`.
fn own_stack_with(
    dir: &std::path::Path,
    ports: &[(&str, u16)],
    env: &[(&str, &str)],
    args: &[&str],
) -> std::process::Output {
    let mut cmd = std::process::Command::new(root().join("scripts/stack.sh"));
    cmd.args(args)
        .env("STACK_DIR", dir)
        .envs(env.iter().copied());
    for part in [
        "NAMESRV_PORT",
        "BROKER_PORT",
        "REDIS_PORT",
        "MYSQL_PORT",
        "EDGE_PORT",
        "CORE_PORT",
        "ADMIN_PORT",
        "OPS_PORT",
        "PAYSIM_PORT",
    ] {
        cmd.env(part, "1");
    }
    for (part, port) in ports {
        cmd.env(part, port.to_string());
    }
    cmd.output().expect("scripts/stack.sh runs")
}

/// An edge of the test's own (`scripts/stack.sh up edge`, real nginx) in front of the
/// test stack's core, trusting the stack's token secret, its snapshot read from the
/// Redis on `redis_port`: the stack's (a second edge of the stack), or one that is not
/// there ([`OwnEdge::without_redis`]).
pub struct OwnEdge {
    pub dir: PathBuf,
    pub port: u16,
    ops_port: u16,
    redis_port: u16,
}

impl OwnEdge {
    pub fn start(stack: &crate::Stack, redis_port: u16) -> OwnEdge {
        let e = OwnEdge {
            dir: own_dir("edge"),
            port: free_port(),
            ops_port: free_port(),
            redis_port,
        };
        std::fs::create_dir_all(&e.dir).expect("the edge's folder");
        std::fs::copy(stack.dir.join("token.secret"), e.dir.join("token.secret"))
            .expect("the stack's token secret");
        let up = e.stack(stack, &["up", "edge"]);
        assert!(
            up.status.success(),
            "{}",
            String::from_utf8_lossy(&up.stderr)
        );
        e
    }

    /// An edge whose snapshot never comes, as when an edge cannot reach Redis.
    pub fn without_redis(stack: &crate::Stack) -> OwnEdge {
        OwnEdge::start(stack, free_port())
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn stack(&self, stack: &crate::Stack, args: &[&str]) -> std::process::Output {
        own_stack(
            &self.dir,
            &[
                ("EDGE_PORT", self.port),
                ("OPS_PORT", self.ops_port),
                ("CORE_PORT", stack.core_port),
                ("ADMIN_PORT", stack.admin_port),
                ("REDIS_PORT", self.redis_port),
            ],
            args,
        )
    }
}

impl Drop for OwnEdge {
    fn drop(&mut self) {
        let _ = self.stack(&crate::Stack::from_env(), &["down", "edge"]);
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// A Redis of the test's own, so a test may FLUSHALL it.
pub struct OwnRedis {
    pub dir: PathBuf,
    pub port: u16,
}

impl OwnRedis {
    pub fn start() -> OwnRedis {
        let r = OwnRedis {
            dir: own_dir("redis"),
            port: free_port(),
        };
        let up = own_stack(&r.dir, &[("REDIS_PORT", r.port)], &["up", "redis"]);
        assert!(
            up.status.success(),
            "{}",
            String::from_utf8_lossy(&up.stderr)
        );
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A connection of the test's own (a new one: one made before a restart died with
    /// the old process).
    pub async fn connection(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await
    }

    /// Points a core's settings at this Redis alone (single mode, whatever the stack is).
    pub fn use_in(&self, s: &mut stampede_core::Settings) {
        s.redis.mode = stampede_core::config::RedisMode::Single;
        s.redis.url = self.url();
        s.redis.nodes.clear();
    }

    /// Where it keeps its append-only file (a folder, Redis 7's multi-part AOF).
    pub fn aof_dir(&self) -> PathBuf {
        self.dir.join("redis/appendonlydir")
    }

    /// kill -9: no shutdown, no last fsync.
    pub fn kill9(&self) {
        let pid = std::fs::read_to_string(self.dir.join("pids/redis.pid")).unwrap();
        let killed = std::process::Command::new("kill")
            .args(["-9", pid.trim()])
            .status()
            .unwrap();
        assert!(killed.success());
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("Redis still answers after kill -9");
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`): hung, then awake, connections kept.
    pub fn hang(&self, hung: bool) {
        let pid = std::fs::read_to_string(self.dir.join("pids/redis.pid")).unwrap();
        let signal = if hung { "-STOP" } else { "-CONT" };
        let sent = std::process::Command::new("kill")
            .args([signal, pid.trim()])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    /// Starts it again on its port and folder with the stack's settings (as
    /// `scripts/stack/redis.sh` starts it; appendfsync as `REDIS_APPENDFSYNC` says, by
    /// default always), loading what its AOF holds `key_load_delay_us` µs a key slower
    /// (Redis's `key-load-delay`, serving clients every KB loaded), and returns once it
    /// answers (LOADING, until the load ends).
    pub fn restart_loading_slowly(&self, key_load_delay_us: u32) {
        let dir = self.dir.display();
        let fsync = std::env::var("REDIS_APPENDFSYNC").unwrap_or_else(|_| "always".into());
        let started = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args([
                "--dir",
                &format!("{dir}/redis"),
                "--appendonly",
                "yes",
                "--save",
                "",
            ])
            .args(["--appendfsync", &fsync, "--stream-node-max-entries", "16"])
            .args(["--key-load-delay", &key_load_delay_us.to_string()])
            .args(["--loading-process-events-interval-bytes", "1024"])
            .args([
                "--daemonize",
                "yes",
                "--pidfile",
                &format!("{dir}/pids/redis.pid"),
            ])
            .args(["--logfile", &format!("{dir}/logs/redis.log")])
            .status()
            .expect("redis-server runs");
        assert!(started.success());
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("Redis did not come back on {}", self.port);
    }

    /// Whether it is still loading its data (INFO persistence's `loading:1`).
    pub fn loading(&self) -> bool {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "INFO", "persistence"])
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).contains("loading:1")
    }

    /// Starts it again on its port and folder, from what its AOF holds.
    pub fn restart(&self) {
        let up = own_stack(&self.dir, &[("REDIS_PORT", self.port)], &["up", "redis"]);
        assert!(
            up.status.success(),
            "{}",
            String::from_utf8_lossy(&up.stderr)
        );
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        own_stack(&self.dir, &[("REDIS_PORT", self.port)], &["down"]);
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// A MariaDB of the test's own (`scripts/stack.sh up mysql`: its own datadir, database
/// `stampede` and account `stampede`), started with `MYSQL_SERVER_ARGS`.
pub struct OwnMariadb {
    pub dir: PathBuf,
    pub port: u16,
}

impl OwnMariadb {
    pub fn start_with(server_args: &str) -> OwnMariadb {
        let m = OwnMariadb {
            dir: own_dir("mariadb"),
            port: free_port(),
        };
        let up = own_stack_with(
            &m.dir,
            &[("MYSQL_PORT", m.port)],
            &[("MYSQL_SERVER_ARGS", server_args)],
            &["up", "mysql"],
        );
        assert!(
            up.status.success(),
            "{}",
            String::from_utf8_lossy(&up.stderr)
        );
        m
    }

    fn password(&self) -> String {
        let password = std::fs::read_to_string(self.dir.join("mysql.password")).unwrap();
        password.trim().to_owned()
    }

    /// Its database `stampede`, password included (for the test's own queries).
    pub fn url(&self) -> String {
        let (password, port) = (self.password(), self.port);
        format!("mysql://stampede:{password}@127.0.0.1:{port}/stampede")
    }

    /// Points a core's settings at its database `stampede`.
    pub fn use_in(&self, s: &mut stampede_core::Settings) {
        s.mysql.url = format!("mysql://stampede@127.0.0.1:{}/stampede", self.port);
        s.mysql.password = Some(self.password().into());
    }
}

impl Drop for OwnMariadb {
    fn drop(&mut self) {
        own_stack(&self.dir, &[("MYSQL_PORT", self.port)], &["down"]);
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// A port for a broker: it also takes port-2, port+1 and port+3, so it is handed out
/// as a block of six.
fn free_broker_port() -> u16 {
    free_ports_block(6) + 2
}

/// A port for a test's own server, free when it was handed out and never handed out
/// twice by this process: taken in turn from 22000–26999, below the kernel's ephemeral
/// range (32768 on), so no outgoing connection and no listener bound to port 0 can take
/// it while its server is down between a stop and a start. (A port the kernel picked
/// and released is drawn again by another bind one time in about 7 000 here.) The
/// stacks' fixed ports are outside the range; the Redis Cluster's bus ports of the
/// test stack (27001–27006) too.
pub fn free_port() -> u16 {
    free_ports_block(1)
}

/// `count` consecutive ports, each free a moment ago, the first returned.
fn free_ports_block(count: u16) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 22_000;
    const SPAN: u32 = 5_000;
    // Each process starts at its own place, so two test runs at once rarely meet.
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id() % 50 * 100,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..SPAN {
        let at = NEXT.fetch_add(u32::from(count), Ordering::Relaxed) % SPAN;
        if at + u32::from(count) > SPAN {
            continue;
        }
        let first = u16::try_from(FIRST + at).expect("a port");
        if (first..first + count).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return first;
        }
    }
    panic!("no free port left in {FIRST}–{}", FIRST + SPAN - 1)
}

/// A folder of its own in the temporary directory for a test's server, named by the
/// process and a count, so two servers of one run never share one.
pub fn own_dir(kind: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("stampede-{kind}-{}-{n}", std::process::id()))
}
