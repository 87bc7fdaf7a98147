//! `stampede-paysim`: the payment provider, simulated, for the demo and the tests. A tool
//! beside Stampede (DESIGN.md), not part of the core: it signs a callback for any order
//! it is asked to, so it serves on a loopback port of its own and the edge never
//! proxies it.

mod sim;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// Exit codes (sysexits): bad configuration, a port not available.
const EX_CONFIG: u8 = 64;
const EX_UNAVAILABLE: u8 = 69;

#[derive(Parser)]
#[command(
    name = "stampede-paysim",
    version,
    about = "The payment provider, simulated"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the provider's payment page for the browser app (`/paysim/pay`): the buyer
    /// pays or declines there; a payment is signed and posted as the provider's callback,
    /// then the browser goes back to the shop.
    Serve {
        /// A loopback address only.
        #[arg(long, default_value = "127.0.0.1:8090")]
        listen: std::net::SocketAddr,
        /// File holding the provider's signing secret (e.g. .stack/provider.secret).
        #[arg(long)]
        secret_file: PathBuf,
        /// e.g. http://127.0.0.1:8080/api/payments/callback
        #[arg(long)]
        callback_url: String,
        /// The shop's origin the browser returns to, e.g. http://127.0.0.1:8080
        #[arg(long)]
        app_origin: String,
    },
    /// Sign and post one payment callback (or the same one several times).
    Pay {
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
    match Cli::parse().command {
        Command::Serve {
            listen,
            secret_file,
            callback_url,
            app_origin,
        } => {
            let Some(secret) = read_secret(&secret_file) else {
                return ExitCode::from(EX_CONFIG);
            };
            let origin = app_origin.trim_end_matches('/');
            if !(origin.starts_with("http://") || origin.starts_with("https://"))
                || origin.parse::<http::Uri>().is_err()
            {
                eprintln!(
                    "stampede-paysim: --app-origin must be an http(s) origin, got {app_origin:?}"
                );
                return ExitCode::from(EX_CONFIG);
            }
            stampede_core::telemetry::init(&stampede_core::Settings::defaults().log);
            let server = sim::PageServer {
                listen,
                secret,
                callback_url,
                app_origin: origin.to_owned(),
            };
            match sim::serve(server).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("stampede-paysim: serve: {e:#}");
                    ExitCode::from(EX_UNAVAILABLE)
                }
            }
        }
        Command::Pay {
            url,
            secret_file,
            order_no,
            amount_cents,
            txn_id,
            times,
            after_s,
        } => {
            let Some(secret) = read_secret(&secret_file) else {
                return ExitCode::from(EX_CONFIG);
            };
            let payment = sim::PaySim {
                url,
                secret,
                order_no,
                amount_cents,
                provider_txn_id: txn_id
                    .unwrap_or_else(|| format!("sim-{:016x}", rand::random::<u64>())),
                times,
                after: Duration::from_secs(after_s),
            };
            match sim::run(payment).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("stampede-paysim: pay: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn read_secret(path: &Path) -> Option<String> {
    match std::fs::read_to_string(path) {
        Ok(s) if !s.trim().is_empty() => Some(s),
        Ok(_) => {
            eprintln!("stampede-paysim: {} is empty", path.display());
            None
        }
        Err(e) => {
            eprintln!("stampede-paysim: cannot read {}: {e}", path.display());
            None
        }
    }
}
