//! The command line: the subcommands and their options.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::stack::StackArgs;
use crate::train::Train;
use crate::{sale, soak};

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
    /// Minutes of steady purchases, cancellations and payments: the core's RSS and the
    /// 202 latency every interval, plotted, and the audit at the end.
    Soak {
        #[command(flatten)]
        soak: soak::SoakArgs,
        /// Print the report as JSON (the lines per interval go to stderr).
        #[arg(long)]
        json: bool,
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

/// The options of `sale` (and the sale of `compare`).
#[derive(Debug, Clone, Args)]
pub struct SaleArgs {
    /// Buyers in the burst (each a user with a token).
    #[arg(long, default_value_t = 20_000)]
    pub buyers: u64,
    /// Unseated units, split over --categories.
    #[arg(long, default_value_t = 1_000)]
    pub units: u64,
    #[arg(long, default_value_t = 1)]
    pub categories: u32,
    /// A seated block ROWSxCOLS as well (e.g. 10x20); buyers who pick seats buy there.
    #[arg(long, value_parser = parse_grid)]
    pub seats: Option<(u32, u32)>,
    /// A train instead (docs/trains.md): STATIONS (2 … 64) and SEATS (1 … 1000) of one
    /// class, e.g. 10:200; every buyer asks for a journey drawn uniformly over the
    /// route's (from, to) pairs. One Redis bucket.
    #[arg(
        long,
        value_name = "STATIONS:SEATS",
        value_parser = Train::parse,
        conflicts_with_all = ["units", "categories", "seats", "seat_share"]
    )]
    pub train: Option<Train>,
    #[arg(long, default_value_t = 1)]
    pub per_user_limit: u32,
    /// Redis buckets the event's stock is split over (1 … 16; docs/scaling.md): on the
    /// cluster stack, 3 spreads one event's admissions over the 3 masters (the seats of
    /// --seats stay in the event's own slot).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub buckets: u16,
    /// Concurrent connections, each from a loopback source address of its own.
    #[arg(long, default_value_t = 256)]
    pub connections: usize,
    /// Share of buyers who submit again: once with the same Idempotency-Key, once with a new one.
    #[arg(long, default_value_t = 0.05)]
    pub repeat_share: f64,
    /// Share of buyers who act as bots: --bot-attempts rapid submissions, a new key each.
    #[arg(long, default_value_t = 0.02)]
    pub bot_share: f64,
    #[arg(long, default_value_t = 10)]
    pub bot_attempts: u32,
    /// Share of buyers who choose seats (needs --seats).
    #[arg(long, default_value_t = 0.3)]
    pub seat_share: f64,
    /// Most retries of one submission after 429 / 503.
    #[arg(long, default_value_t = 3)]
    pub max_retries: u32,
    /// Submissions per second at most, over all connections (0: as fast as they go).
    /// A paced burst keeps admissions running for a while (the chaos suite's rewind).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// The burst stops after this long whatever is left.
    #[arg(long, default_value_t = 120)]
    pub max_seconds: u64,
    /// How long to wait for everything to settle after the burst.
    #[arg(long, default_value_t = 120)]
    pub settle_timeout_s: u64,
    /// Seconds from creating the event to its sale opening (tokens are fetched meanwhile).
    #[arg(long, default_value_t = 3)]
    pub open_in_s: u64,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Before the event is created, wait up to this many seconds for the Redis masters
    /// to run fewer than 50 scripts a second (an earlier sale's overdue orders being
    /// cancelled, say), so the sale's per-node counters are its own; 0: don't wait.
    #[arg(long, default_value_t = 60)]
    pub quiet_s: u64,
    /// A fault to inject mid-sale: a shell command (`sh -c`) run once, --fault-after-ms
    /// after the open, while the burst goes on (the chaos suite's; see scripts/chaos.sh).
    #[arg(long)]
    pub fault: Option<String>,
    #[arg(long, default_value_t = 500)]
    pub fault_after_ms: u64,
    /// The event's payment window in seconds (short for --pay-race).
    #[arg(long, default_value_t = 900)]
    pub pay_timeout_s: u64,
    /// After the sale settles, pay this many unpaid orders each around its payment deadline,
    /// racing the timeout's cancellation; the audit then checks each ended paid or
    /// cancelled, never both (the chaos suite's pay-race).
    #[arg(long, default_value_t = 0)]
    pub pay_race: u64,
    /// A waiting room in front of the sale (docs/waiting-room.md): every buyer joins it
    /// before the open, polls its place every --poll-s after it and buys once with its
    /// pass when its turn comes; the lottery is recomputed and checked, and the time
    /// for everyone waiting to read sold_out and the edge's CPU per poll are measured.
    #[arg(
        long,
        conflicts_with_all = ["train", "seats", "categories", "fault", "pay_race"]
    )]
    pub waiting_room: bool,
    /// The room's release rate: positions per second (1 … 100 000), or auto.
    #[arg(long, default_value = "auto", value_parser = parse_admit, requires = "waiting_room")]
    pub admit_per_s: String,
    /// Leading zero bits of each join's proof of work (0 … 20, the core's most; 0: none).
    #[arg(
        long,
        default_value_t = 0,
        value_parser = clap::value_parser!(u8).range(0..=20),
        requires = "waiting_room"
    )]
    pub challenge_bits: u8,
    /// How long a pass is good for, seconds (10 … 3 600).
    #[arg(
        long,
        default_value_t = 120,
        value_parser = clap::value_parser!(u32).range(10..=3600),
        requires = "waiting_room"
    )]
    pub pass_ttl_s: u32,
    /// Seconds between a waiting buyer's polls of its place.
    #[arg(long, default_value_t = 2.0, value_parser = parse_poll, requires = "waiting_room")]
    pub poll_s: f64,
    /// The join rate the open is planned for: the sale opens a little after the joins
    /// (and the proofs of work) are expected to be done; later joiners go behind.
    #[arg(long, default_value_t = 1_000, requires = "waiting_room")]
    pub joins_per_s: u64,
    /// Seconds of each burst of the edge's CPU measurement (polls, sold-out rejections).
    #[arg(long, default_value_t = 3, requires = "waiting_room")]
    pub cpu_burst_s: u64,
}

impl SaleArgs {
    /// What clap cannot check by itself: a train has one bucket, whatever --buckets' value.
    pub fn conflicts(&self) -> Option<&'static str> {
        (self.train.is_some() && self.buckets > 1).then_some(
            "--train has one Redis bucket (a seat's segments stay in one slot): drop --buckets",
        )
    }
}

fn parse_admit(s: &str) -> Result<String, String> {
    match s.parse::<u32>() {
        _ if s == "auto" => Ok(s.to_owned()),
        Ok(n) if (1..=100_000).contains(&n) => Ok(s.to_owned()),
        _ => Err("auto, or positions per second within 1..=100000".into()),
    }
}

fn parse_poll(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.05..=60.0).contains(&x) => Ok(x),
        _ => Err("seconds within 0.05 … 60".into()),
    }
}

fn parse_grid(s: &str) -> Result<(u32, u32), String> {
    let (r, c) = s.split_once('x').ok_or("ROWSxCOLS, e.g. 10x20")?;
    let rows: u32 = r.parse().map_err(|_| "rows must be a number")?;
    let cols: u32 = c.parse().map_err(|_| "cols must be a number")?;
    if rows == 0 || cols == 0 {
        return Err("rows and cols must be at least 1".into());
    }
    Ok((rows, cols))
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::{Cli, Command};
    use crate::stack::StackMode;

    #[test]
    fn the_arguments_are_well_formed() {
        Cli::command().debug_assert();
    }

    /// The stack's options are taken before or after the command (`sale --cluster`).
    #[test]
    fn the_stack_is_named_before_or_after_the_command() {
        for line in [
            &["stampede-bench", "--cluster", "sale"][..],
            &["stampede-bench", "sale", "--cluster"],
            &["stampede-bench", "compare", "--stack-mode", "cluster"],
        ] {
            let cli = Cli::try_parse_from(line).unwrap();
            assert!(
                cli.stack.cluster || cli.stack.stack_mode == Some(StackMode::Cluster),
                "{line:?}"
            );
        }
        let cli = Cli::try_parse_from(["stampede-bench", "sale", "--stack-dir", "/x"]).unwrap();
        assert_eq!(cli.stack.stack_dir, std::path::PathBuf::from("/x"));
        assert!(matches!(cli.command, Command::Sale { .. }));
        assert!(Cli::try_parse_from(["stampede-bench", "sale", "--cluster=yes"]).is_err());
    }
}
