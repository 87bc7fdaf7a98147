//! The accept loop shared by the public and the admin listener: HTTP/1.1 with
//! keep-alive, stop accepting on shutdown, then drain within a grace period. Bounded
//! like mini-redis's: at most `max_connections` open at once (a semaphore: the next
//! accept waits for a permit), a client has `read_timeout` to send its headers and
//! then its body, and every request is answered within `request_timeout`.

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::shutdown::Shutdown;

use super::{ApiError, Request, Response};

/// The bounds of one listener (`[server]` in the configuration).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub read_timeout: Duration,
    pub request_timeout: Duration,
}

/// Put in every request's extensions: when reading its body must have ended.
#[derive(Debug, Clone, Copy)]
pub struct BodyDeadline(pub tokio::time::Instant);

/// Something that answers requests; one per listener.
pub trait Handler: Send + Sync + 'static {
    fn handle(self: Arc<Self>, req: Request) -> impl Future<Output = Response> + Send;
}

/// Serves `listener` until `stop` turns true, then waits up to `grace` for open requests.
pub async fn serve<H: Handler>(
    name: &'static str,
    listener: TcpListener,
    handler: Arc<H>,
    mut stop: Shutdown,
    grace: Duration,
    limits: Limits,
) {
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout);
    let open = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        // A permit first: at the cap, new connections wait in the kernel's queue.
        let permit = tokio::select! {
            permit = open.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            _ = stop.wait() => break,
        };
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(server = name, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let handler = handler.clone();
                let service = service_fn(move |mut req: Request| {
                    let handler = handler.clone();
                    let now = tokio::time::Instant::now();
                    req.extensions_mut().insert(BodyDeadline(now + limits.read_timeout));
                    async move {
                        // The request's deadline goes with it to the MySQL connections it
                        // checks out (infra::mysql::checkout).
                        let handled = crate::infra::mysql::within_request(
                            now + limits.request_timeout,
                            limits.request_timeout,
                            AssertUnwindSafe(handler.handle(req)).catch_unwind(),
                        );
                        let answer = match tokio::time::timeout(limits.request_timeout, handled).await {
                            Ok(Ok(answer)) => answer,
                            // A bug, never a dropped connection: 500, and the cause in the log.
                            Ok(Err(_)) => ApiError::Unexpected(anyhow::anyhow!("the handler panicked")).into_response(),
                            Err(_) => {
                                tracing::warn!(server = name, timeout_ms = limits.request_timeout.as_millis() as u64, "request timed out");
                                ApiError::Unavailable("the request took too long; retry shortly".into()).into_response()
                            }
                        };
                        Ok::<_, Infallible>(answer)
                    }
                });
                let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(server = name, error = %e, "connection ended with an error");
                    }
                    drop(permit);
                });
            }
            _ = stop.wait() => break,
        }
    }
    drop(listener);
    tracing::info!(
        server = name,
        "stopped accepting; draining open connections"
    );
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!(server = name, "drained"),
        _ = tokio::time::sleep(grace) => {
            tracing::warn!(server = name, grace_s = grace.as_secs(), "grace period over; dropping open connections")
        }
    }
}
