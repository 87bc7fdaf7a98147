//! `compare`: every baseline and the sale in one run, and the ratios between them.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::load::{self, Request};
use crate::record::Recorder;
use crate::report::print_sale;
use crate::stack::{Stack, event_body};
use crate::{baseline, counters, cpu, sale, soak, wrk};

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
    let (nginx_rps, proxy_rps, nginx_burst_rps) = {
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
        // The burst's floor: bare nginx with the sale's connection count.
        let burst_client =
            baseline::http_rate(nginx.bare, sale_args.connections, d, tokens.clone()).await?;
        (bare, proxy, burst_client)
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

    step("edge: the same request to a trivial location (/edge/health)");
    let t0 = cpu::snapshot();
    let make = load::purchase_to("/edge/health".into(), sold_cats[0], tokens.clone(), c);
    let (trivial_rps, trivial_rec) = load::closed_loop_over(&stack.edges, c, d, make).await?;
    anyhow::ensure!(
        trivial_rec.count("200") > 0,
        "the trivial location did not answer 200: {:?}",
        trivial_rec.counts()
    );
    breakdown.push((
        "edge: trivial location, the same request",
        cpu::between(&t0, &cpu::snapshot(), trivial_rec.total()),
    ));

    step("wrk cross-check: the same request, sold out and trivial");
    let wrk_check = wrk::cross_check(
        stack.edge,
        &format!("/api/events/{sold_event}/orders"),
        &format!(r#"{{"category_id":{},"quantity":1}}"#, sold_cats[0]),
        &tokens,
        c,
        d.as_secs(),
    )
    .await?;

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
    let c0 = counters::snapshot(stack).await?;
    let t0 = cpu::snapshot();
    let admitted = edge_loop(stack, open_event, open_cats[0], &tokens, c, d).await;
    let t1 = cpu::snapshot();
    stack.edge_limits(false).await?;
    let (_, admitted_rps, admitted_rec) = admitted?;
    let (_, settled) = stack
        .wait_settled(open_event, Duration::from_secs(600))
        .await?;
    let sustained_orders = admitted_rec.count("202");
    let per_order = counters::per_order(&c0, &counters::snapshot(stack).await?, sustained_orders);
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
    // Before the snapshot: the wait for quiet Redis is not the sale's CPU.
    crate::nodes::wait_quiet(stack, sale_args.quiet_s).await?;
    let t0 = cpu::snapshot();
    let sale = sale::run(stack, sale_args).await?;
    breakdown.push((
        "sale burst, set-up to audit (per request)",
        cpu::between(&t0, &cpu::snapshot(), sale.requests),
    ));
    print_sale(&sale);
    let core_rss_mb = soak::core_rss_mb(stack);

    let usage = |run: &str| {
        breakdown
            .iter()
            .find(|(name, _)| *name == run)
            .map(|(_, u)| u.clone())
            .expect("every loop is in the breakdown")
    };
    let (bare_u, proxy_u, reject_u, trivial_u, settled_u) = (
        usage("nginx return 200"),
        usage("nginx → trivial hyper (core = the trivial backend here)"),
        usage("edge: sold out"),
        usage("edge: trivial location, the same request"),
        usage("admitted, from the first request until settled in MySQL"),
    );
    let burst_u = usage("sale burst, set-up to audit (per request)");
    let edge_cpu_reject_vs_trivial = reject_u.part("nginx") / trivial_u.part("nginx");
    let cpu_per_order_vs_proxy = settled_u.total() / proxy_u.total();
    // What bare nginx needs, with the same client and the sale's connections, to answer
    // as many requests as the burst had buyers.
    let nginx_floor_s = sale.buyers as f64 / nginx_burst_rps;
    let burst_vs_nginx_floor = sale.first_answers_s / nginx_floor_s;
    let p99_202_ms = sale.latency.get("202").map_or(f64::NAN, |l| l.p99_ms);
    let ratios = json!({
        "edge_reject_vs_nginx": reject_rps / nginx_rps,
        "edge_cpu_reject_vs_trivial": edge_cpu_reject_vs_trivial,
        "cpu_per_order_vs_proxy": cpu_per_order_vs_proxy,
        "admitted_vs_proxy": admitted_rps / proxy_rps,
        "burst_vs_rowlock": rowlock.burst_s / sale.first_answers_s,
        "burst_vs_nginx_floor": burst_vs_nginx_floor,
        "admitted_vs_rowlock": admitted_rps / rowlock.completed_per_s,
        "orders_persisted_per_s": orders_persisted_per_s,
        "settle_s": sale.settle_s,
        "p99_202_ms": p99_202_ms,
        "core_rss_mb": core_rss_mb,
        "cpu_us_per_order": {"total": settled_u.total(), "parts": settled_u.us_per_request},
        "fsync_always_vs_everysec": always_rps / admitted_rps,
        "audit_ok": sale.audit.ok,
    });
    let raw = json!({
        "seconds_per_loop": d.as_secs(), "loop_connections": c,
        "nginx_return_200_per_s": nginx_rps, "nginx_proxy_hyper_per_s": proxy_rps,
        "nginx_return_200_per_s_at_sale_connections": nginx_burst_rps,
        "nginx_floor_s": nginx_floor_s,
        "edge_trivial_per_s": trivial_rps, "edge_trivial_answers": trivial_rec.counts(),
        "edge_sold_out_answers_per_s": reject_rps, "edge_sold_out_answers": reject_rec.counts(),
        "edge_admitted_per_s": admitted_rps, "edge_admitted_answers": admitted_rec.counts(),
        "sustained_orders": sustained_orders, "sustained_settled_s": (settled - admitted_started).as_secs_f64(),
        "rowlock": rowlock, "redis_reserve_per_s": redis_rps, "appendfsync": fsync,
        "stores_per_order": per_order,
        "wrk": wrk_check,
        "redis_ceiling_vs_admitted": redis_rps / admitted_rps,
        "sale": sale,
        "cpu": breakdown.iter().map(|(name, u)| json!({"run": name, "usage": u})).collect::<Vec<_>>(),
    });
    let client = |u: &cpu::Usage| u.part("bench client");
    // (figure, value, target, met, the bench client's CPU µs per request behind it)
    let target = |name, value: f64, at_least: bool, bound: f64, client: String| {
        let met = if at_least {
            value >= bound
        } else {
            value <= bound
        };
        let op = if at_least { ">=" } else { "<=" };
        (name, value, format!("{op} {bound}"), met, client)
    };
    let targets: [(&str, f64, String, bool, String); 13] = [
        target(
            "edge_reject_vs_nginx",
            reject_rps / nginx_rps,
            true,
            0.92,
            format!("{:.1} / {:.1}", client(&reject_u), client(&bare_u)),
        ),
        target(
            "edge_cpu_reject_vs_trivial",
            edge_cpu_reject_vs_trivial,
            false,
            1.25,
            format!("{:.1} / {:.1}", client(&reject_u), client(&trivial_u)),
        ),
        target(
            "cpu_per_order_vs_proxy",
            cpu_per_order_vs_proxy,
            false,
            3.0,
            format!("{:.1} / {:.1}", client(&settled_u), client(&proxy_u)),
        ),
        target(
            "mariadb_us_per_order",
            settled_u.part("mariadb"),
            false,
            30.0,
            format!("{:.1}", client(&settled_u)),
        ),
        target(
            "redis_us_per_order",
            settled_u.part("redis"),
            false,
            20.0,
            format!("{:.1}", client(&settled_u)),
        ),
        target(
            "core_us_per_order",
            settled_u.part("core"),
            false,
            30.0,
            format!("{:.1}", client(&settled_u)),
        ),
        target(
            "burst_vs_nginx_floor",
            burst_vs_nginx_floor,
            false,
            1.4,
            format!("{:.1}", client(&burst_u)),
        ),
        target(
            "orders_persisted_per_s",
            orders_persisted_per_s,
            true,
            10000.0,
            format!("{:.1}", client(&settled_u)),
        ),
        target(
            "p99_202_ms",
            p99_202_ms,
            false,
            50.0,
            format!("{:.1}", client(&burst_u)),
        ),
        target("core_rss_mb", core_rss_mb, false, 150.0, String::new()),
        target(
            "admitted_vs_proxy",
            admitted_rps / proxy_rps,
            true,
            0.70,
            format!(
                "{:.1} / {:.1}",
                client(&usage(
                    "edge: admitted (during admission; the pipeline runs too)"
                )),
                client(&proxy_u)
            ),
        ),
        target(
            "burst_vs_rowlock",
            rowlock.burst_s / sale.first_answers_s,
            true,
            10.0,
            format!("{:.1}", client(&burst_u)),
        ),
        target("settle_s", sale.settle_s, false, 5.0, String::new()),
    ];
    println!();
    println!(
        "{:<27} {:>10}  {:<9} {:<4} bench client µs/request",
        "figure", "value", "target", "met"
    );
    for (name, value, target, met, client) in &targets {
        println!(
            "{name:<27} {value:>10.2}  {target:<9} {:<4} {client}",
            if *met { "yes" } else { "no" }
        );
    }
    println!("{:<27} {:>10}", "audit_ok", sale.audit.ok);
    println!();
    println!(
        "raw: nginx {nginx_rps:.0}/s ({nginx_burst_rps:.0}/s at {} connections), nginx→hyper {proxy_rps:.0}/s, edge trivial {trivial_rps:.0}/s, edge sold-out {reject_rps:.0}/s, edge admitted {admitted_rps:.0}/s,",
        sale_args.connections
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
        println!("    {}", u.sched_line());
    }
    match &wrk_check {
        Some(check) => check.lines().iter().for_each(|l| println!("{l}")),
        None => println!("wrk cross-check: skipped (wrk is not on PATH)"),
    }
    println!("what the stores did per admitted order, until settled:");
    println!("  {}", per_order.line());
    let mut doc = ratios.as_object().cloned().unwrap_or_default();
    doc.insert("raw".into(), raw);
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(&doc)?)?;
    eprintln!("wrote {}", out.display());
    Ok(sale.audit.ok)
}
