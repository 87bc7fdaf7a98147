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
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let (Command::Serve { config } | Command::CheckConfig { config }) = &cli.command;
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

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
