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
    /// Serve the payment provider's page for the browser app (`/paysim/pay`): the buyer
    /// pays or declines there; a payment is signed and posted as the provider's callback.
    PaySimServe {
        #[arg(long, default_value = "127.0.0.1:8090")]
        listen: std::net::SocketAddr,
        /// File holding the provider's signing secret (e.g. .stack/provider.secret).
        #[arg(long)]
        secret_file: PathBuf,
        /// e.g. http://127.0.0.1:8080/api/payments/callback
        #[arg(long)]
        callback_url: String,
    },
    /// Play the payment provider: sign and post a payment callback.
    PaySim {
        /// The callback URL, e.g. http://127.0.0.1:8080/api/payments/callback
        #[arg(long)]
        url: String,
        /// File holding the provider's signing secret (e.g. .stack/provider.secret).
        #[arg(long)]
        secret_file: PathBuf,
        #[arg(long)]
        order_no: String,
        #[arg(long)]
        amount_cents: u64,
        /// The provider's transaction id (default: one made up per run).
        #[arg(long)]
        txn_id: Option<String>,
        /// Post the same callback this many times (a provider retrying).
        #[arg(long, default_value_t = 1)]
        times: u32,
        /// Wait this long first (a late payment).
        #[arg(long, default_value_t = 0)]
        after_s: u64,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match cli.command {
        Command::PaySim {
            url,
            secret_file,
            order_no,
            amount_cents,
            txn_id,
            times,
            after_s,
        } => {
            let Ok(secret) = std::fs::read_to_string(&secret_file) else {
                eprintln!("stampede: cannot read {}", secret_file.display());
                return ExitCode::from(EX_CONFIG);
            };
            let sim = stampede_core::paysim::PaySim {
                url,
                secret,
                order_no,
                amount_cents,
                provider_txn_id: txn_id.unwrap_or_else(|| format!("sim-{:016x}", rand_id())),
                times,
                after: std::time::Duration::from_secs(after_s),
            };
            return match stampede_core::paysim::run(sim).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("stampede: pay-sim: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::PaySimServe {
            listen,
            secret_file,
            callback_url,
        } => {
            let Ok(secret) = std::fs::read_to_string(&secret_file) else {
                eprintln!("stampede: cannot read {}", secret_file.display());
                return ExitCode::from(EX_CONFIG);
            };
            telemetry::init(&Settings::defaults().log);
            let server = stampede_core::paysim::PageServer {
                listen,
                secret,
                callback_url,
            };
            return match stampede_core::paysim::serve(server).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("stampede: pay-sim-serve: {e:#}");
                    ExitCode::from(EX_UNAVAILABLE)
                }
            };
        }
        Command::Serve { ref config }
        | Command::CheckConfig { ref config }
        | Command::Reconcile { ref config, .. } => config.clone(),
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

/// A made-up provider transaction id's random part.
fn rand_id() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
