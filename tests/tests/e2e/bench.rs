//! stampede-bench against the test stack: a small sale through the real edge, whose
//! audit of the invariants must pass.

use std::time::Duration;

use stampede_e2e::{heavy, root, stack_app};

/// `stampede-bench sale <args> --json` (the debug build), within `limit_s`: its report.
async fn bench(args: &[&str], limit_s: u64) -> serde_json::Value {
    run_bench("sale", args, limit_s).await
}

/// `stampede-bench <command> <args> --json` (the debug build), within `limit_s`: its report.
async fn run_bench(command: &str, args: &[&str], limit_s: u64) -> serde_json::Value {
    run_bench_with(command, args, &[], limit_s).await
}

/// [`run_bench`] with variables set in the bench's environment.
pub(crate) async fn run_bench_with(
    command: &str,
    args: &[&str],
    env: &[(&str, &str)],
    limit_s: u64,
) -> serde_json::Value {
    let mut bench = tokio::process::Command::new(root().join("target/debug/stampede-bench"));
    bench
        .arg(command)
        .args(args)
        .arg("--json")
        .envs(env.iter().copied())
        .kill_on_drop(true);
    if command == "sale" {
        // The other tests' scripts run beside it: the test stack is never quiet.
        bench.args(["--quiet-s", "0"]);
    }
    let run = bench.output();
    let out = tokio::time::timeout(Duration::from_secs(limit_s), run)
        .await
        .unwrap_or_else(|_| panic!("the bench ends within {limit_s} s"))
        .expect("target/debug/stampede-bench (cargo build -p stampede-bench)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).expect("--json prints JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_bench_sale_through_the_edge_passes_its_audit() {
    let _heavy = heavy().await;
    // The bench uses the stack's edge and core, with nginx.conf's limits.
    let (_app, _edge) = stack_app().await;
    let report = bench(
        &[
            "--buyers",
            "3000",
            "--units",
            "400",
            "--categories",
            "2",
            "--seats",
            "5x10",
            "--per-user-limit",
            "2",
            "--connections",
            "64",
            "--max-seconds",
            "60",
            "--settle-timeout-s",
            "60",
        ],
        180,
    )
    .await;
    assert_eq!(report["audit"]["ok"], true, "{report:#}");
    assert_eq!(report["audit"]["checks"].as_array().unwrap().len(), 6);
    // 3 000 buyers for 450 units: sold out, never oversold, each 202 an order.
    assert_eq!(report["units"], 450);
    assert_eq!(report["admitted"], report["orders"], "{report:#}");
    assert!(report["orders"].as_u64().unwrap() <= 450);
    // Each part's CPU per order, read from /proc around the sale.
    for part in ["nginx", "core", "redis", "mariadb"] {
        assert!(
            report["cpu_us_per_order"][part]
                .as_f64()
                .is_some_and(|us| us > 0.0),
            "{part}: {report:#}"
        );
    }
    assert!(
        report["answers"]["409 SOLD_OUT"].as_u64().unwrap_or(0) > 0,
        "{report:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bench_train_sale_passes_its_seat_segment_audit_and_reports_utilisation() {
    let _heavy = heavy().await;
    let (_app, _edge) = stack_app().await;
    let report = bench(
        &[
            "--train",
            "8:40",
            "--buyers",
            "400",
            "--connections",
            "16",
            "--max-seconds",
            "60",
            "--settle-timeout-s",
            "60",
        ],
        120,
    )
    .await;
    assert_eq!(report["audit"]["ok"], true, "{report:#}");
    assert_eq!(report["audit"]["checks"].as_array().unwrap().len(), 10);
    // 40 seats × 7 segments; what was sold is what the audit counted in MySQL, all held.
    let train = &report["train"];
    assert_eq!(train["seat_segments_total"], 280, "{report:#}");
    assert_eq!(train["sold"], report["audit"]["seat_segments_ordered"]);
    assert_eq!(train["held"], train["sold"]);
    let sold = train["sold"].as_u64().unwrap();
    assert!(sold > 0 && sold <= 280, "{report:#}");
    assert!(train["counters_12306_sold"].as_u64().unwrap() <= 280);
    for share in [
        "utilisation",
        "sold_of_demanded",
        "counters_12306_utilisation",
    ] {
        assert!(
            train[share]
                .as_f64()
                .is_some_and(|x| (0.0..=1.0).contains(&x)),
            "{share}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bench_waiting_room_sale_recomputes_the_lottery_and_measures_polls() {
    let _heavy = heavy().await;
    let (_app, _edge) = stack_app().await;
    let report = bench(
        &[
            "--waiting-room",
            "--buyers",
            "400",
            "--units",
            "60",
            "--challenge-bits",
            "6",
            "--poll-s",
            "0.5",
            "--connections",
            "16",
            "--cpu-burst-s",
            "1",
            "--max-seconds",
            "60",
            "--settle-timeout-s",
            "60",
        ],
        240,
    )
    .await;
    // The sale's six checks and the lottery's three, all held.
    assert_eq!(report["audit"]["ok"], true, "{report:#}");
    assert_eq!(report["audit"]["checks"].as_array().unwrap().len(), 9);
    let room = &report["waiting_room"];
    let lottery = &room["lottery"];
    assert_eq!(lottery["commitment_ok"], true, "{room:#}");
    assert_eq!(
        lottery["joined"].as_u64().unwrap() + room["joined_late"].as_u64().unwrap(),
        400,
        "{room:#}"
    );
    assert_eq!(lottery["positions_checked"], 400, "{room:#}");
    assert_eq!(lottery["positions_wrong"], 0);
    // 400 buyers for 60 units, one each with its pass: sold out, each 202 an order, and
    // everyone still waiting told so.
    assert_eq!(report["admitted"], 60, "{report:#}");
    assert_eq!(report["orders"], 60);
    // No turn is released beyond the stock (a pass refused SOLD_OUT would be one: the
    // gate once counted a claimed pass as used before its units were taken).
    assert_eq!(room["turns_refused_sold_out"], 0, "{room:#}");
    assert_eq!(room["sold_out_readers"], 340, "{room:#}");
    assert_eq!(room["sold_out_unread"], 0);
    assert!(room["sold_out_read_max_ms"].as_f64().is_some());
    assert!(room["proof_cpu_ms"].as_f64().is_some_and(|ms| ms > 0.0));
    // The polls were the edge's; both bursts of the CPU measurement were answered.
    assert!(room["polls_from_edge"].as_u64().unwrap() > 0, "{room:#}");
    let cpu = &room["edge_cpu"];
    assert!(cpu["polls_from_edge"].as_u64().unwrap() > 0, "{cpu:#}");
    assert!(cpu["rejects_sold_out"].as_u64().unwrap() > 0, "{cpu:#}");
    assert!(
        room["edge_cpu_poll_vs_reject"]
            .as_f64()
            .is_some_and(|r| r > 0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_soak_samples_the_cores_memory_while_orders_are_paid_cancelled_and_timed_out() {
    let _heavy = heavy().await;
    let (_app, _edge) = stack_app().await;
    let out = root().join("target/bench/soak-e2e.json");
    let plot = root().join("target/bench/soak-e2e.svg");
    // 20 s at 15 purchases/s, a sample every 2 s; an 8 s payment window, so orders time
    // out during the soak too.
    let report = run_bench(
        "soak",
        &[
            "--minutes",
            "0.34",
            "--rate",
            "15",
            "--buyers",
            "60",
            "--connections",
            "4",
            "--interval-s",
            "2",
            "--pay-timeout-s",
            "8",
            "--settle-timeout-s",
            "60",
            "--out",
            out.to_str().unwrap(),
            "--plot",
            plot.to_str().unwrap(),
        ],
        180,
    )
    .await;
    assert_eq!(report["audit"]["ok"], true, "{report:#}");
    let samples = report["samples"].as_array().unwrap();
    assert!(samples.len() >= 10, "{report:#}");
    for s in samples {
        assert!(s["rss_mb"].as_f64().unwrap() > 0.0, "{s:#}");
    }
    assert!(report["rss_flat"].is_boolean(), "{report:#}");
    assert_eq!(report["server_errors"], 0, "{report:#}");
    assert_eq!(report["never_created"], 0, "{report:#}");
    let admitted = report["answers"]["202"].as_u64().unwrap_or(0);
    assert!(admitted > 200, "{report:#}");
    // A third each: paid by the provider, cancelled by the buyer, left to time out.
    for fate in ["paid", "cancelled_by_buyer", "timed_out"] {
        assert!(report[fate].as_u64().unwrap() > 0, "{fate}: {report:#}");
    }
    assert_eq!(
        report["paid"].as_u64().unwrap()
            + report["cancelled_by_buyer"].as_u64().unwrap()
            + report["timed_out"].as_u64().unwrap(),
        admitted,
        "every admitted order ended paid or cancelled: {report:#}"
    );
    assert_eq!(report["orders"]["UNPAID"], serde_json::Value::Null);
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(written["event_id"], report["event_id"]);
    assert!(std::fs::read_to_string(&plot).unwrap().contains("<svg"));
}
