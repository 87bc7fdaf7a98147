//! Waiting: polling until a condition holds, the edge's workers catching up, and the lock
//! the heavy tests take turns on.

use std::time::Duration;

/// Polls `check` every 100 ms until it holds or `within` passes; whether it held.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Once one of the edge's workers answered from a new snapshot (a sale it now knows, a
/// flag it now has), the others adopt it on their own next refresh timer (nginx.conf's
/// refresh_interval_s = 0.2): within two intervals every worker has it. A test that then
/// sends requests on several connections (several workers) waits this long first.
pub async fn edge_workers_catch_up() {
    tokio::time::sleep(Duration::from_millis(400)).await;
}

/// Held by the tests that fire thousands of requests, so two of them never share the
/// machine's two cores: overlapping, they starve the cores they test.
pub async fn heavy() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}
