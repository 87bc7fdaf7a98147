//! `stampede`: the core's binary. Wires and waits; the library does the work.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use stampede_core::{App, BuildError, Settings, telemetry};

/// Exit codes (sysexits): bad configuration, a dependency or port not available.
const EX_CONFIG: u8 = 64;
const EX_UNAVAILABLE: u8 = 69;

#[derive(Parser)]
#[command(name = "stampede", version, about = "Stampede flash-sale core")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the public and admin APIs until SIGINT or SIGTERM.
    Serve {
        /// Configuration file layered over the built-in defaults.
        #[arg(long, env = "STAMPEDE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Check the configuration and print it (secrets hidden), then exit.
    CheckConfig {
        #[arg(long, env = "STAMPEDE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Compare Redis with MySQL for events with a sale and heal drift (one pass); print
    /// the books. Exits 0 when every gap is 0 afterwards, 1 when one remains.
    Reconcile {
        #[arg(long, env = "STAMPEDE_CONFIG")]
        config: Option<PathBuf>,
        /// Only this event (repeatable); default: every event with a sale.
        #[arg(long = "event")]
        events: Vec<u64>,
        /// Measure only; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Rotate the user-token secret in auth.token_secret_file: a new secret signs from
    /// now on, the one it replaces still verifies (no one is logged out), any older one
    /// is dropped. A running core picks it up within a second; reload the edge
    /// (`scripts/stack.sh rotate-token-secret` does both).
    RotateTokenSecret {
        #[arg(long, env = "STAMPEDE_CONFIG")]
        config: Option<PathBuf>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match cli.command {
        Command::Serve { ref config }
        | Command::CheckConfig { ref config }
        | Command::Reconcile { ref config, .. }
        | Command::RotateTokenSecret { ref config } => config.clone(),
    };
    let resolved = match Settings::load(config.as_deref()).and_then(Settings::resolve) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("stampede: {e}");
            return ExitCode::from(EX_CONFIG);
        }
    };
    if let Command::CheckConfig { .. } = cli.command {
        println!("{resolved:#?}");
        return ExitCode::SUCCESS;
    }
    if let Command::RotateTokenSecret { .. } = cli.command {
        return match rotate_token_secret(&resolved) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("stampede: rotate-token-secret: {e:#}");
                ExitCode::from(EX_CONFIG)
            }
        };
    }
    telemetry::init(&resolved.settings.log);
    if let Command::Reconcile {
        events, dry_run, ..
    } = cli.command
    {
        return match reconcile(&resolved, events, dry_run).await {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("stampede: reconcile: {e:#}");
                ExitCode::from(EX_UNAVAILABLE)
            }
        };
    }
    let app = match App::build(resolved).await {
        Ok(app) => app,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            eprintln!("stampede: {e}");
            return ExitCode::from(match e {
                BuildError::Dependency(_) | BuildError::Bind { .. } => EX_UNAVAILABLE,
            });
        }
    };
    let stopper = app.stopper();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("stop signal received");
        stopper.stop();
    });
    match app.run_until_stopped().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "stopped with an error");
            ExitCode::FAILURE
        }
    }
}

/// Rewrites the keyring file: a new current secret, the old current kept as previous.
fn rotate_token_secret(config: &stampede_core::config::Resolved) -> anyhow::Result<()> {
    use anyhow::{Context, bail};
    use stampede_core::auth::token::{Keyring, rotated};
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let auth = &config.settings.auth;
    let Some(path) = auth
        .token_secret_file
        .as_ref()
        .filter(|_| auth.token_secret.is_none())
    else {
        bail!(
            "the token secret is set inline (auth.token_secret); only a keyring file (auth.token_secret_file) can be rotated in place"
        )
    };
    let current =
        std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let next = rotated(&current).context("the keyring in force")?;
    let tmp = path.with_extension("rotating");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("write {}", tmp.display()))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(next.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("replace {}", path.display()))?;
    let ids = Keyring::parse(&next)?.ids().join(", ");
    println!(
        "token keyring {}: key ids {ids} (the first signs; both verify)",
        path.display()
    );
    Ok(())
}

/// One reconciliation pass, printed as a table; true when every gap is 0 afterwards.
async fn reconcile(
    config: &stampede_core::config::Resolved,
    events: Vec<u64>,
    dry_run: bool,
) -> anyhow::Result<bool> {
    let reconciler = stampede_core::reconcile::Reconciler::connect(config).await?;
    let events = if events.is_empty() {
        reconciler.events(config.settings.preload.window_s).await?
    } else {
        events
    };
    let mut balanced = true;
    println!(
        "{:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>5} {:>8} {:>8} {:>6}",
        "event",
        "category",
        "total",
        "redis",
        "queued",
        "unpaid",
        "paid",
        "gap",
        "remain",
        "unsynced",
        "r_gap"
    );
    for id in events {
        let Some(report) = reconciler.reconcile(id, !dry_run).await? else {
            eprintln!("stampede: no event {id}");
            balanced = false;
            continue;
        };
        for c in &report.balance.categories {
            let redis = opt(c.redis_available);
            println!(
                "{:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>5} {:>8} {:>8} {:>6}",
                id,
                c.category_id,
                c.total,
                redis,
                opt(c.queued),
                c.unpaid,
                c.paid,
                opt(c.gap),
                c.db_remain,
                c.unsynced,
                c.remain_gap
            );
        }
        for action in &report.actions {
            println!("event {id}: {action}");
        }
        balanced &= report.balance.settled();
    }
    Ok(balanced)
}

fn opt(n: Option<i64>) -> String {
    n.map_or("-".to_owned(), |n| n.to_string())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
