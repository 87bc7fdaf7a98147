//! Baselines measured on the same machine in the same run, for honest ratios: bare
//! nginx, nginx proxying to a trivial hyper backend, the row-lock design of seed 004
//! against the same MariaDB, and the reserve script straight to Redis.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use mysql_async::prelude::*;
use serde::Serialize;

use crate::load;
use crate::stack::Stack;

/// A scratch nginx (and, for the proxy, a trivial backend), stopped when dropped.
pub struct ScratchNginx {
    dir: PathBuf,
    backend: Option<std::process::Child>,
    pub bare: SocketAddr,
    pub proxy: SocketAddr,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl ScratchNginx {
    pub fn start() -> anyhow::Result<ScratchNginx> {
        let (bare, proxy, backend_port) = (free_port()?, free_port()?, free_port()?);
        let dir = std::env::temp_dir().join(format!("stampede-bench-nginx-{bare}"));
        std::fs::create_dir_all(dir.join("logs"))?;
        std::fs::create_dir_all(dir.join("conf"))?;
        // The edge's worker settings, and nothing else.
        std::fs::write(
            dir.join("conf/nginx.conf"),
            format!(
                "worker_processes auto;\npid logs/nginx.pid;\nerror_log logs/error.log warn;\n\
                 events {{ worker_connections 16384; }}\n\
                 http {{\n  access_log off;\n  keepalive_requests 100000;\n\
                 upstream backend {{ server 127.0.0.1:{backend_port}; keepalive 256; }}\n\
                 server {{ listen 127.0.0.1:{bare} reuseport; location / {{ return 200; }} }}\n\
                 server {{ listen 127.0.0.1:{proxy} reuseport; location / {{ proxy_pass http://backend; \
                 proxy_http_version 1.1; proxy_set_header Connection \"\"; }} }}\n}}\n"
            ),
        )?;
        let backend = std::process::Command::new(std::env::current_exe()?)
            .args(["serve-trivial", &format!("127.0.0.1:{backend_port}")])
            .spawn()
            .context("start the trivial backend")?;
        let status = std::process::Command::new("nginx")
            .args([
                "-p",
                &format!("{}/", dir.display()),
                "-c",
                "conf/nginx.conf",
            ])
            .status()
            .context("nginx (make up installs it)")?;
        anyhow::ensure!(
            status.success(),
            "the scratch nginx did not start; see {}/logs",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(500));
        Ok(ScratchNginx {
            dir,
            backend: Some(backend),
            bare: SocketAddr::from(([127, 0, 0, 1], bare)),
            proxy: SocketAddr::from(([127, 0, 0, 1], proxy)),
        })
    }
}

impl Drop for ScratchNginx {
    fn drop(&mut self) {
        let _ = std::process::Command::new("nginx")
            .args([
                "-p",
                &format!("{}/", self.dir.display()),
                "-c",
                "conf/nginx.conf",
                "-s",
                "stop",
            ])
            .stderr(std::process::Stdio::null())
            .status();
        if let Some(mut b) = self.backend.take() {
            let _ = b.kill();
            let _ = b.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The trivial backend: 200 `{}` to everything.
pub async fn serve_trivial(addr: SocketAddr) -> anyhow::Result<()> {
    use http_body_util::Full;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|_req| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                    bytes::Bytes::from_static(b"{}"),
                )))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Requests per second of the same purchase POST against `target`.
/// Requests per second of the purchase POST (the edge's, `tokens` as its bearers)
/// against `target`.
pub async fn http_rate(
    target: SocketAddr,
    connections: usize,
    duration: Duration,
    tokens: Vec<String>,
) -> anyhow::Result<f64> {
    let make = load::purchase_maker(1, 1, tokens, connections);
    let (rate, rec) = load::closed_loop(target, connections, duration, make).await?;
    anyhow::ensure!(
        rec.count("200") > 0,
        "no 200 from {target}: {:?}",
        rec.counts()
    );
    Ok(rate)
}

#[derive(Debug, Clone, Serialize)]
pub struct RowLock {
    pub connections: usize,
    /// The burst: `buyers` purchases for `units` units, answered in `burst_s`.
    pub buyers: u64,
    pub units: u64,
    pub burst_s: f64,
    /// Purchases completed per second with stock to spare, over `duration_s`.
    pub completed_per_s: f64,
    pub duration_s: f64,
}

/// Seed 004's first design done properly: one transaction per purchase, a conditional
/// decrement of the row and the order insert.
pub async fn rowlock(
    stack: &Stack,
    connections: usize,
    buyers: u64,
    units: u64,
    duration: Duration,
) -> anyhow::Result<RowLock> {
    let pool = stack.mysql.clone();
    let mut conn = pool.get_conn().await?;
    conn.query_drop(
        "CREATE TABLE IF NOT EXISTS bench_rowlock_stock (id INT PRIMARY KEY, stock BIGINT NOT NULL) ENGINE=InnoDB",
    )
    .await?;
    conn.query_drop(
        "CREATE TABLE IF NOT EXISTS bench_rowlock_order (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
         user_id BIGINT NOT NULL, item_id INT NOT NULL, created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB",
    )
    .await?;
    drop(conn);
    let run = |stock: u64, limit: Option<u64>, until: Option<Instant>| {
        let pool = pool.clone();
        async move {
            let mut c = pool.get_conn().await?;
            c.query_drop("TRUNCATE bench_rowlock_order").await?;
            c.exec_drop(
                "REPLACE INTO bench_rowlock_stock (id, stock) VALUES (1, ?)",
                (stock,),
            )
            .await?;
            drop(c);
            let next = Arc::new(AtomicU64::new(0));
            let done = Arc::new(AtomicU64::new(0));
            let started = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..connections {
                let (pool, next, done) = (pool.clone(), next.clone(), done.clone());
                tasks.push(tokio::spawn(async move {
                    let mut c = pool.get_conn().await?;
                    loop {
                        let user = next.fetch_add(1, Ordering::SeqCst);
                        if limit.is_some_and(|l| user >= l) || until.is_some_and(|u| Instant::now() >= u) {
                            return anyhow::Ok(());
                        }
                        let mut tx = c.start_transaction(mysql_async::TxOpts::default()).await?;
                        tx.query_drop("UPDATE bench_rowlock_stock SET stock = stock - 1 WHERE id = 1 AND stock > 0")
                            .await?;
                        if tx.affected_rows() == 1 {
                            tx.exec_drop("INSERT INTO bench_rowlock_order (user_id, item_id) VALUES (?, 1)", (user,))
                                .await?;
                            done.fetch_add(1, Ordering::SeqCst);
                        }
                        tx.commit().await?;
                    }
                }));
            }
            for t in tasks {
                t.await??;
            }
            anyhow::Ok((started.elapsed().as_secs_f64(), done.load(Ordering::SeqCst)))
        }
    };
    let (burst_s, sold) = run(units, Some(buyers), None).await?;
    anyhow::ensure!(
        sold == units.min(buyers),
        "the row-lock design sold {sold} of {units}"
    );
    let (elapsed, completed) = run(u64::MAX / 2, None, Some(Instant::now() + duration)).await?;
    let mut c = pool.get_conn().await?;
    c.query_drop("TRUNCATE bench_rowlock_order").await?;
    Ok(RowLock {
        connections,
        buyers,
        units,
        burst_s,
        completed_per_s: completed as f64 / elapsed,
        duration_s: elapsed,
    })
}

/// Admissions per second of reserve.lua by EVALSHA straight to Redis, `batch` calls per
/// pipeline over `connections` connections, on keys of a scratch prefix.
pub async fn redis_reserve(
    stack: &Stack,
    connections: usize,
    batch: usize,
    duration: Duration,
) -> anyhow::Result<f64> {
    let keys = stampede_core::keys::Keys::new("stampede-bench:");
    let event = stampede_core::keys::Bucket::only(1);
    let names = [
        keys.meta(event),
        keys.stock(event),
        keys.dry(event),
        keys.held(event),
        keys.idempotency(event),
        keys.purchase_status(event),
        keys.order_stream(event),
        keys.seats(event, 1),
        keys.row_free(event, 1),
    ];
    let mut setup = stack.redis().await?;
    let now = chrono::Utc::now().timestamp_millis();
    let () = redis::pipe()
        .del(&names)
        .ignore()
        .hset_multiple(
            &names[0],
            &[
                ("status", "open".to_owned()),
                ("sale_start_ms", (now - 60_000).to_string()),
                ("sale_end_ms", (now + 3_600_000).to_string()),
                ("per_user_limit", "1000000000".to_owned()),
                ("epoch", "1".to_owned()),
            ],
        )
        .ignore()
        .hset(&names[1], 1, 1_000_000_000_000_i64)
        .ignore()
        .query_async(&mut setup)
        .await?;
    let script = stampede_core::admission::reserve::RESERVE_LUA;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script)
        .query_async(&mut setup)
        .await?;
    let started = Instant::now();
    let until = started + duration;
    let calls = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..connections {
        let (sha, names, calls) = (sha.clone(), names.clone(), calls.clone());
        // A connection of its own per task, as the single-Redis baseline always had.
        let mut conn = stack.redis().await?;
        tasks.push(tokio::spawn(async move {
            let mut n: u64 = c as u64 * 1_000_000_000;
            while Instant::now() < until {
                let mut pipe = redis::pipe();
                let now = chrono::Utc::now().timestamp_millis();
                for _ in 0..batch {
                    n += 1;
                    pipe.cmd("EVALSHA")
                        .arg(&sha)
                        .arg(names.len())
                        .arg(&names[..]);
                    pipe.arg(1)
                        .arg(n % 1_000_000)
                        .arg(1)
                        .arg(n)
                        .arg("k")
                        .arg(now);
                    pipe.arg("none").arg(0).arg(1_000_000_000_000_u64).ignore();
                }
                let () = pipe.query_async(&mut conn).await?;
                calls.fetch_add(batch as u64, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let rate = calls.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    let () = redis::cmd("DEL")
        .arg(&names)
        .query_async(&mut setup)
        .await?;
    Ok(rate)
}
