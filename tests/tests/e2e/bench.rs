//! stampede-bench against the test stack: a small sale through the real edge, whose
//! audit of the invariants must pass.

use std::time::Duration;

use stampede_e2e::{heavy, root, stack_app};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_bench_sale_through_the_edge_passes_its_audit() {
    let _heavy = heavy().await;
    // The bench uses the stack's edge and core, with nginx.conf's limits.
    let (_app, _edge) = stack_app().await;
    let run = tokio::process::Command::new(root().join("target/debug/stampede-bench"))
        .args([
            "sale",
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
            "--json",
        ])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("the bench ends within 3 minutes")
        .expect("target/debug/stampede-bench (cargo build -p stampede-bench)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("--json prints JSON");
    assert_eq!(report["audit"]["ok"], true, "{report:#}");
    assert_eq!(report["audit"]["checks"].as_array().unwrap().len(), 6);
    // 3 000 buyers for 450 units: sold out, never oversold, each 202 an order.
    assert_eq!(report["units"], 450);
    assert_eq!(report["admitted"], report["orders"], "{report:#}");
    assert!(report["orders"].as_u64().unwrap() <= 450);
    assert!(
        report["answers"]["409 SOLD_OUT"].as_u64().unwrap_or(0) > 0,
        "{report:#}"
    );
}
