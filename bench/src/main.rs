//! stampede-bench: realistic load at the edge, the invariant audit, and the baselines
//! that make its figures mean something — all on loopback, every loop bounded.

mod audit;
mod baseline;
mod cli;
mod compare;
mod counters;
mod cpu;
mod fault;
mod load;
mod nodes;
mod payrace;
mod record;
mod report;
mod room;
mod sale;
mod soak;
mod stack;
mod train;
mod wrk;

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser};

use cli::{Baseline, Cli, Command};
use compare::compare;
use report::{plot_timeline, print_sale};
use stack::Stack;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Sale { sale, .. } | Command::Compare { sale, .. } = &cli.command
        && let Some(why) = sale.conflicts()
    {
        Cli::command()
            .error(clap::error::ErrorKind::ArgumentConflict, why)
            .exit();
    }
    if let Command::Compare { sale, .. } = &cli.command
        && sale.waiting_room
    {
        Cli::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                "--waiting-room is a sale of its own: stampede-bench sale --waiting-room",
            )
            .exit();
    }
    match run(cli).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("stampede-bench: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Ok(false): the audit found a violation.
async fn run(cli: Cli) -> anyhow::Result<bool> {
    if let Command::ServeTrivial { addr } = cli.command {
        baseline::serve_trivial(addr).await?;
        return Ok(true);
    }
    let stack = Stack::open(&cli.stack)?;
    match cli.command {
        Command::ServeTrivial { .. } => unreachable!("handled above"),
        Command::Sale { sale, json, plot } => {
            nodes::wait_quiet(&stack, sale.quiet_s).await?;
            let report = sale::run(&stack, &sale).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_sale(&report);
            }
            if let Some(path) = plot {
                plot_timeline(&path, &report.timeline)?;
            }
            Ok(report.audit.ok)
        }
        Command::Soak { soak, json } => {
            let report = soak::run(&stack, &soak).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                soak::print(&report);
            }
            Ok(report.audit.ok)
        }
        Command::Baseline { which } => {
            match which {
                Baseline::Nginx {
                    connections,
                    seconds,
                }
                | Baseline::Proxy {
                    connections,
                    seconds,
                } => {
                    let proxy = matches!(which, Baseline::Proxy { .. });
                    let nginx = baseline::ScratchNginx::start()?;
                    let target = if proxy { nginx.proxy } else { nginx.bare };
                    // Bearers the size of real tokens; neither baseline reads them.
                    let tokens = (0..1000).map(|i| format!("{i:0>150}")).collect();
                    let rate = baseline::http_rate(
                        target,
                        connections,
                        Duration::from_secs(seconds),
                        tokens,
                    )
                    .await?;
                    println!(
                        "{} {rate:.0} requests/s",
                        if proxy {
                            "nginx → hyper"
                        } else {
                            "nginx return 200"
                        }
                    );
                }
                Baseline::Rowlock {
                    connections,
                    buyers,
                    units,
                    seconds,
                } => {
                    let r = baseline::rowlock(
                        &stack,
                        connections,
                        buyers,
                        units,
                        Duration::from_secs(seconds),
                    )
                    .await?;
                    println!("{}", serde_json::to_string_pretty(&r)?);
                }
                Baseline::Redis {
                    connections,
                    batch,
                    seconds,
                } => {
                    let rate = baseline::redis_reserve(
                        &stack,
                        connections,
                        batch,
                        Duration::from_secs(seconds),
                    )
                    .await?;
                    println!("reserve.lua by EVALSHA {rate:.0} admissions/s");
                }
            }
            Ok(true)
        }
        Command::Compare {
            sale,
            seconds,
            loop_connections,
            out,
        } => {
            compare(
                &stack,
                &sale,
                Duration::from_secs(seconds),
                loop_connections,
                &out,
            )
            .await
        }
    }
}
