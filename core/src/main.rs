//! `stampede`: the core's binary. Wires and waits; the library does the work.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use stampede_core::config::Resolved;
use stampede_core::{App, BuildError, Settings, auth, reconcile, telemetry};

/// mimalloc instead of the C library's allocator: per request the core allocates and
/// frees many small buffers (hyper, the Redis and MySQL clients, JSON), and glibc's
/// malloc and free were about a fifth of its CPU under a burst (README "Measured").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

fn main() -> ExitCode {
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
            Ok(ids) => {
                let path = resolved.keyring_file().expect("rotated one");
                println!(
                    "token keyring {}: key ids {} (the first signs; both verify)",
                    path.display(),
                    ids.join(", ")
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("stampede: rotate-token-secret: {e:#}");
                ExitCode::from(EX_CONFIG)
            }
        };
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if resolved.settings.server.worker_threads > 0 {
        runtime.worker_threads(resolved.settings.server.worker_threads);
    }
    match runtime.enable_all().build() {
        Ok(runtime) => runtime.block_on(run(cli.command, resolved)),
        Err(e) => {
            eprintln!("stampede: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What needs the runtime: `serve` and `reconcile`.
async fn run(command: Command, resolved: Resolved) -> ExitCode {
    telemetry::init(&resolved.settings.log);
    if let Command::Reconcile {
        events, dry_run, ..
    } = command
    {
        return match reconcile::report::run_once(&resolved, events, dry_run).await {
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

/// Rotates the keyring file the configuration names; the key ids now in it.
fn rotate_token_secret(config: &Resolved) -> anyhow::Result<Vec<String>> {
    let path = config.keyring_file().ok_or_else(|| {
        anyhow::anyhow!(
            "the token secret is set inline (auth.token_secret); only a keyring file (auth.token_secret_file) can be rotated in place"
        )
    })?;
    auth::keyring::rotate_file(path)
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
