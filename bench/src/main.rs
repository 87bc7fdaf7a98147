//! stampede-bench: realistic load at the edge, the invariant audit, and the baselines
//! that make its figures mean something — all on loopback, every loop bounded.

mod audit;
mod baseline;
mod cpu;
mod load;
mod sale;
mod stack;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use serde_json::json;

use load::Request;
use stack::{Stack, StackArgs, event_body};

#[derive(Parser)]
#[command(
    name = "stampede-bench",
    about = "Load, invariant audit and baselines for Stampede"
)]
struct Cli {
    #[command(flatten)]
    stack: StackArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A burst of buyers at a sale's open through the edge, then the audit.
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
enum Baseline {
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

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
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

fn print_sale(r: &sale::SaleReport) {
    println!(
        "sale: event {}, {} buyers for {} units over {} connections",
        r.event_id, r.buyers, r.units, r.connections
    );
    println!(
        "  requests          {:>10}  in {:.2} s = {:.0}/s (every buyer's first answer after {:.2} s)",
        r.requests, r.burst_s, r.requests_per_s, r.first_answers_s
    );
    println!(
        "  admitted (202)    {:>10}  = {:.0}/s",
        r.admitted, r.admitted_per_s
    );
    println!(
        "  orders in MySQL   {:>10}  = {:.0}/s from the first request to settled",
        r.orders, r.orders_persisted_per_s
    );
    println!(
        "  settled           {:>10.2} s after the last answer ({:.2} s until every reservation was an order, the rest stock sync)",
        r.settle_s, r.created_s
    );
    if r.errors > 0 {
        println!("  transport errors  {:>10}", r.errors);
    }
    println!(
        "  {:<24} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "answer", "count", "p50 ms", "p95 ms", "p99 ms", "max ms"
    );
    for (kind, l) in &r.latency {
        println!(
            "  {:<24} {:>8} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            kind, l.count, l.p50_ms, l.p95_ms, l.p99_ms, l.max_ms
        );
    }
    println!(
        "  audit: {}",
        if r.audit.ok {
            "every invariant held"
        } else {
            "VIOLATED"
        }
    );
    for (check, held) in &r.audit.checks {
        println!("    {} {check}", if *held { "ok  " } else { "FAIL" });
    }
    for v in &r.audit.violations {
        println!("    {v}");
    }
}

fn plot_timeline(path: &std::path::Path, timeline: &[(f64, u64, u64)]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let per_s = |n: u64| n as f64 / load::BUCKET.as_secs_f64();
    let max_t = timeline.last().map_or(1.0, |t| t.0 + 0.1);
    let max_y = timeline
        .iter()
        .map(|t| per_s(t.1.max(t.2)))
        .fold(1.0, f64::max);
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("admissions and rejects per second", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_t, 0.0..max_y * 1.1)?;
    chart
        .configure_mesh()
        .x_desc("s since the sale opened")
        .draw()?;
    chart
        .draw_series(LineSeries::new(
            timeline.iter().map(|t| (t.0, per_s(t.1))),
            &BLUE,
        ))?
        .label("admitted (202)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(LineSeries::new(
            timeline.iter().map(|t| (t.0, per_s(t.2))),
            &RED,
        ))?
        .label("rejected (4xx/5xx)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart.configure_series_labels().border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

/// Purchases through the edge for `duration`, rotating over `tokens`: (answers/s, 202/s).
async fn edge_loop(
    stack: &Stack,
    event: u64,
    category: u64,
    tokens: &[String],
    connections: usize,
    duration: Duration,
) -> anyhow::Result<(f64, f64, load::Recorder)> {
    let make = load::purchase_maker(event, category, tokens.to_vec(), connections);
    let started = Instant::now();
    let (rate, rec) = load::closed_loop(stack.edge, connections, duration, make).await?;
    let admitted = rec.count("202") as f64 / started.elapsed().as_secs_f64();
    Ok((rate, admitted, rec))
}

async fn compare(
    stack: &Stack,
    sale_args: &sale::SaleArgs,
    d: Duration,
    c: usize,
    out: &std::path::Path,
) -> anyhow::Result<bool> {
    let step = |s: &str| eprintln!("==> {s}");
    step("baselines: bare nginx, nginx → trivial hyper");
    let mut breakdown: Vec<(&str, cpu::Usage)> = Vec::new();
    let (_, tokens) = stack.buyers(20_000).await?;
    let (nginx_rps, proxy_rps) = {
        let nginx = baseline::ScratchNginx::start()?;
        let t0 = cpu::snapshot();
        let bare = baseline::http_rate(nginx.bare, c, d, tokens.clone()).await?;
        let t1 = cpu::snapshot();
        let proxy = baseline::http_rate(nginx.proxy, c, d, tokens.clone()).await?;
        let t2 = cpu::snapshot();
        breakdown.push((
            "nginx return 200",
            cpu::between(&t0, &t1, (bare * d.as_secs_f64()) as u64),
        ));
        breakdown.push((
            "nginx → trivial hyper (core = the trivial backend here)",
            cpu::between(&t1, &t2, (proxy * d.as_secs_f64()) as u64),
        ));
        (bare, proxy)
    };

    step("edge: purchases for a sold-out event");
    let (sold_event, sold_cats) = stack
        .event(&event_body("bench sold out", 1, 1, None, 1, Duration::ZERO))
        .await?;
    // The edge learns of a new sale within its 200 ms refresh.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let first = load::call(
        stack.edge,
        &Request::post(
            format!("/api/events/{sold_event}/orders"),
            &json!({"category_id": sold_cats[0], "quantity": 1}),
        )
        .bearer(&tokens[0])
        .idempotency_key("the-one"),
    )
    .await?;
    anyhow::ensure!(
        first.status == 202,
        "the one unit was not sold: {}",
        String::from_utf8_lossy(&first.body)
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t0 = cpu::snapshot();
    let (reject_rps, _, reject_rec) =
        edge_loop(stack, sold_event, sold_cats[0], &tokens, c, d).await?;
    breakdown.push((
        "edge: sold out",
        cpu::between(&t0, &cpu::snapshot(), reject_rec.total()),
    ));

    step("edge: admitted purchases (edge limits raised for the run)");
    let (open_event, open_cats) = stack
        .event(&event_body(
            "bench admitted",
            10_000_000,
            1,
            None,
            1_000,
            Duration::ZERO,
        ))
        .await?;
    stack.edge_limits(true).await?;
    let admitted_started = Instant::now();
    let t0 = cpu::snapshot();
    let admitted = edge_loop(stack, open_event, open_cats[0], &tokens, c, d).await;
    let t1 = cpu::snapshot();
    stack.edge_limits(false).await?;
    let (_, admitted_rps, admitted_rec) = admitted?;
    let (_, settled) = stack
        .wait_settled(open_event, Duration::from_secs(600))
        .await?;
    let sustained_orders = admitted_rec.count("202");
    breakdown.push((
        "edge: admitted (during admission; the pipeline runs too)",
        cpu::between(&t0, &t1, sustained_orders),
    ));
    breakdown.push((
        "admitted, from the first request until settled in MySQL",
        cpu::between(&t0, &cpu::snapshot(), sustained_orders),
    ));
    let orders_persisted_per_s =
        sustained_orders as f64 / (settled - admitted_started).as_secs_f64();

    step("baseline: the row-lock design against the same MariaDB");
    let rowlock =
        baseline::rowlock(stack, c.min(120), sale_args.buyers, sale_args.units, d).await?;
    step("baseline: reserve.lua straight to Redis, pipelined");
    let t0 = cpu::snapshot();
    let redis_rps = baseline::redis_reserve(stack, 2, 200, d).await?;
    breakdown.push((
        "reserve.lua by EVALSHA, pipelined",
        cpu::between(&t0, &cpu::snapshot(), (redis_rps * d.as_secs_f64()) as u64),
    ));

    step(&format!(
        "sale: {} buyers for {} units",
        sale_args.buyers, sale_args.units
    ));
    let t0 = cpu::snapshot();
    let sale = sale::run(stack, sale_args).await?;
    breakdown.push((
        "sale burst, set-up to audit (per request)",
        cpu::between(&t0, &cpu::snapshot(), sale.requests),
    ));
    print_sale(&sale);

    let ratios = json!({
        "edge_reject_vs_nginx": reject_rps / nginx_rps,
        "admitted_vs_proxy": admitted_rps / proxy_rps,
        "burst_vs_rowlock": rowlock.burst_s / sale.first_answers_s,
        "admitted_vs_rowlock": admitted_rps / rowlock.completed_per_s,
        "orders_persisted_per_s": orders_persisted_per_s,
        "settle_s": sale.settle_s,
        "audit_ok": sale.audit.ok,
    });
    let raw = json!({
        "seconds_per_loop": d.as_secs(), "loop_connections": c,
        "nginx_return_200_per_s": nginx_rps, "nginx_proxy_hyper_per_s": proxy_rps,
        "edge_sold_out_answers_per_s": reject_rps, "edge_sold_out_answers": reject_rec.counts(),
        "edge_admitted_per_s": admitted_rps, "edge_admitted_answers": admitted_rec.counts(),
        "sustained_orders": sustained_orders, "sustained_settled_s": (settled - admitted_started).as_secs_f64(),
        "rowlock": rowlock, "redis_reserve_per_s": redis_rps,
        "redis_ceiling_vs_admitted": redis_rps / admitted_rps,
        "sale": sale,
        "cpu": breakdown.iter().map(|(name, u)| json!({"run": name, "usage": u})).collect::<Vec<_>>(),
    });
    let targets = [
        (
            "edge_reject_vs_nginx",
            reject_rps / nginx_rps,
            ">= 0.90",
            reject_rps / nginx_rps >= 0.90,
        ),
        (
            "admitted_vs_proxy",
            admitted_rps / proxy_rps,
            ">= 0.70",
            admitted_rps / proxy_rps >= 0.70,
        ),
        (
            "burst_vs_rowlock",
            rowlock.burst_s / sale.first_answers_s,
            ">= 10",
            rowlock.burst_s / sale.first_answers_s >= 10.0,
        ),
        (
            "admitted_vs_rowlock",
            admitted_rps / rowlock.completed_per_s,
            ">= 4",
            admitted_rps / rowlock.completed_per_s >= 4.0,
        ),
        (
            "orders_persisted_per_s",
            orders_persisted_per_s,
            ">= 20000",
            orders_persisted_per_s >= 20_000.0,
        ),
        ("settle_s", sale.settle_s, "<= 5", sale.settle_s <= 5.0),
    ];
    println!();
    println!("{:<24} {:>12}  {:<9} met", "ratio", "value", "target");
    for (name, value, target, met) in targets {
        println!(
            "{name:<24} {value:>12.2}  {target:<9} {}",
            if met { "yes" } else { "no" }
        );
    }
    println!("{:<24} {:>12}", "audit_ok", sale.audit.ok);
    println!();
    println!(
        "raw: nginx {nginx_rps:.0}/s, nginx→hyper {proxy_rps:.0}/s, edge sold-out {reject_rps:.0}/s, edge admitted {admitted_rps:.0}/s,"
    );
    println!(
        "     row-lock burst {:.2} s vs the sale's first answers {:.2} s, row-lock {:.0} purchases/s, reserve.lua by EVALSHA {redis_rps:.0}/s",
        rowlock.burst_s, sale.first_answers_s, rowlock.completed_per_s
    );
    println!();
    println!("where the time goes (CPU µs per request, every part on the same cores):");
    for (name, u) in &breakdown {
        println!("  {name}: {}", u.line());
    }
    let mut doc = ratios.as_object().cloned().unwrap_or_default();
    doc.insert("raw".into(), raw);
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(&doc)?)?;
    eprintln!("wrote {}", out.display());
    Ok(sale.audit.ok)
}
