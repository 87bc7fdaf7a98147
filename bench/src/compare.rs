//! `compare`: every baseline and the sale in one run, and the ratios between them.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::load::{self, Request};
use crate::record::Recorder;
use crate::report::print_sale;
use crate::stack::{Stack, event_body};
use crate::{baseline, cpu, sale};

/// Purchases through the edge for `duration`, rotating over `tokens`: (answers/s, 202/s).
async fn edge_loop(
    stack: &Stack,
    event: u64,
    category: u64,
    tokens: &[String],
    connections: usize,
    duration: Duration,
) -> anyhow::Result<(f64, f64, Recorder)> {
    let make = load::purchase_maker(event, category, tokens.to_vec(), connections);
    let started = Instant::now();
    let (rate, rec) = load::closed_loop_over(&stack.edges, connections, duration, make).await?;
    let admitted = rec.count("202") as f64 / started.elapsed().as_secs_f64();
    Ok((rate, admitted, rec))
}

/// Redis's `appendfsync` now; set to `to` first if given (CONFIG SET applies at once).
/// Returns the setting it had.
/// Returns the setting it had (the first node's: every node of a cluster is set alike).
async fn appendfsync(stack: &Stack, to: Option<&str>) -> anyhow::Result<String> {
    let mut had = None;
    for node in &stack.redis_nodes {
        let mut redis = stack.redis_node(node).await?;
        let (_, before): (String, String) = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendfsync")
            .query_async(&mut redis)
            .await?;
        had.get_or_insert(before);
        if let Some(to) = to {
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("appendfsync")
                .arg(to)
                .query_async::<()>(&mut redis)
                .await?;
        }
    }
    anyhow::Context::context(had, "no Redis node")
}

pub async fn compare(
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
    let fsync_before = appendfsync(stack, Some("everysec")).await?;
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

    step(
        "edge: admitted purchases again, Redis fsyncing its AOF on every write (appendfsync always)",
    );
    let (always_event, always_cats) = stack
        .event(&event_body(
            "bench admitted, appendfsync always",
            10_000_000,
            1,
            None,
            1_000,
            Duration::ZERO,
        ))
        .await?;
    appendfsync(stack, Some("always")).await?;
    stack.edge_limits(true).await?;
    let always = edge_loop(stack, always_event, always_cats[0], &tokens, c, d).await;
    stack.edge_limits(false).await?;
    appendfsync(stack, Some(&fsync_before)).await?;
    let (_, always_rps, always_rec) = always?;
    stack
        .wait_settled(always_event, Duration::from_secs(600))
        .await?;
    let p99_202 = |rec: &Recorder| rec.latencies().get("202").map_or(f64::NAN, |l| l.p99_ms);
    let fsync = json!({
        "everysec": {"admitted_per_s": admitted_rps, "p99_202_ms": p99_202(&admitted_rec)},
        "always": {"admitted_per_s": always_rps, "p99_202_ms": p99_202(&always_rec)},
        "stack_setting": fsync_before,
    });

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
        "fsync_always_vs_everysec": always_rps / admitted_rps,
        "audit_ok": sale.audit.ok,
    });
    let raw = json!({
        "seconds_per_loop": d.as_secs(), "loop_connections": c,
        "nginx_return_200_per_s": nginx_rps, "nginx_proxy_hyper_per_s": proxy_rps,
        "edge_sold_out_answers_per_s": reject_rps, "edge_sold_out_answers": reject_rec.counts(),
        "edge_admitted_per_s": admitted_rps, "edge_admitted_answers": admitted_rec.counts(),
        "sustained_orders": sustained_orders, "sustained_settled_s": (settled - admitted_started).as_secs_f64(),
        "rowlock": rowlock, "redis_reserve_per_s": redis_rps, "appendfsync": fsync,
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
    println!(
        "     admitted with appendfsync everysec {admitted_rps:.0}/s (202 p99 {:.1} ms), always {always_rps:.0}/s (202 p99 {:.1} ms)",
        p99_202(&admitted_rec),
        p99_202(&always_rec)
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
