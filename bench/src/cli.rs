//! The command line: the subcommands and their options.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::sale;
use crate::stack::StackArgs;

#[derive(Parser)]
#[command(
    name = "stampede-bench",
    about = "Load, invariant audit and baselines for Stampede"
)]
pub struct Cli {
    #[command(flatten)]
    pub stack: StackArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// A burst of buyers at a sale's open through the edge, then the audit.
    // An option given twice: the last one counts (the chaos suite adds to a base line).
    #[command(args_override_self = true)]
    Sale {
        #[command(flatten)]
        sale: sale::SaleArgs,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Draw admissions and rejects over time into this SVG.
        #[arg(long)]
        plot: Option<PathBuf>,
    },
    /// One baseline alone.
    Baseline {
        #[command(subcommand)]
        which: Baseline,
    },
    /// Every baseline and the sale in one run; every ratio, as a table and as JSON.
    Compare {
        #[command(flatten)]
        sale: sale::SaleArgs,
        /// Seconds per closed-loop measurement.
        #[arg(long, default_value_t = 8)]
        seconds: u64,
        /// Connections of the closed-loop measurements (and the row-lock design).
        #[arg(long, default_value_t = 64)]
        loop_connections: usize,
        /// Also write the comparison here.
        #[arg(long, default_value = "target/bench/compare.json")]
        out: PathBuf,
    },
    #[command(hide = true)]
    ServeTrivial { addr: SocketAddr },
}

#[derive(Subcommand)]
pub enum Baseline {
    /// Bare nginx `return 200`.
    Nginx {
        #[arg(long, default_value_t = 64)]
        connections: usize,
        #[arg(long, default_value_t = 8)]
        seconds: u64,
    },
    /// nginx proxying to a trivial hyper backend.
    Proxy {
        #[arg(long, default_value_t = 64)]
        connections: usize,
        #[arg(long, default_value_t = 8)]
        seconds: u64,
    },
    /// One MariaDB transaction per purchase (seed 004's first design).
    Rowlock {
        #[arg(long, default_value_t = 64)]
        connections: usize,
        #[arg(long, default_value_t = 20_000)]
        buyers: u64,
        #[arg(long, default_value_t = 1_000)]
        units: u64,
        #[arg(long, default_value_t = 8)]
        seconds: u64,
    },
    /// reserve.lua by EVALSHA straight to Redis, pipelined.
    Redis {
        #[arg(long, default_value_t = 2)]
        connections: usize,
        #[arg(long, default_value_t = 200)]
        batch: usize,
        #[arg(long, default_value_t = 8)]
        seconds: u64,
    },
}
