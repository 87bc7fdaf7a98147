//! The accept loop shared by the public and the admin listener: HTTP/1.1 with
//! keep-alive, stop accepting on shutdown, then drain within a grace period.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::{Request, Response};

/// Something that answers requests; one per listener.
pub trait Handler: Send + Sync + 'static {
    fn handle(self: Arc<Self>, req: Request) -> impl Future<Output = Response> + Send;
}

/// Serves `listener` until `stop` turns true, then waits up to `grace` for open requests.
pub async fn serve<H: Handler>(
    name: &'static str,
    listener: TcpListener,
    handler: Arc<H>,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
) {
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10));
    loop {
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
                let service = service_fn(move |req| {
                    let handler = handler.clone();
                    async move { Ok::<_, Infallible>(handler.handle(req).await) }
                });
                let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(server = name, error = %e, "connection ended with an error");
                    }
                });
            }
            _ = crate::app::stopped(&mut stop) => break,
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
