//! `--fault CMD --fault-after-ms N`: one shell command run once during a sale (the
//! chaos suite's way to kill, hang or rewind a part at a chosen moment).

use std::time::{Duration, Instant};

use serde::Serialize;

/// What the injected fault did.
#[derive(Debug, Clone, Serialize)]
pub struct FaultReport {
    pub command: String,
    /// Its exit status (None: killed by a signal, or could not start).
    pub exit: Option<i32>,
    /// When it started and ended, seconds after the open.
    pub started_s: f64,
    pub ended_s: f64,
}

/// Runs `command` once, `after` past `open`.
pub async fn inject(command: String, open: Instant, after: Duration) -> FaultReport {
    tokio::time::sleep_until((open + after).into()).await;
    let started_s = open.elapsed().as_secs_f64();
    let exit = tokio::process::Command::new("sh")
        .args(["-c", &command])
        .status()
        .await
        .ok()
        .and_then(|s| s.code());
    FaultReport {
        command,
        exit,
        started_s,
        ended_s: open.elapsed().as_secs_f64(),
    }
}
