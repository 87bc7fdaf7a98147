//! `stampede-bench sale --cluster` against the cluster stack: its connections over both
//! edges, Redis read through the cluster, a bucketed event's admissions measured on
//! each master, and the audit of the invariants passing.

use stampede_e2e::{Stack, stack_app};

use super::{cluster_port, settled};
use crate::bench::run_bench_with;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bench_sells_a_bucketed_event_over_the_three_masters_and_its_audit_passes() {
    let first = cluster_port(&Stack::from_env()); // the cluster stack, or a clear failure
    // The test before may have killed a master and brought it back: its sale is measured
    // on a cluster whose nodes agree again.
    settled(first).await;
    let (_app, _edge) = stack_app().await;
    // STACK_MODE says single (and the stack dir's mode file, cluster): --cluster decides.
    let report = run_bench_with(
        "sale",
        &[
            "--cluster",
            "--buckets",
            "3",
            "--buyers",
            "4000",
            "--units",
            "900",
            "--per-user-limit",
            "2",
            "--connections",
            "64",
            "--max-seconds",
            "60",
            "--settle-timeout-s",
            "90",
        ],
        &[("STACK_MODE", "single")],
        240,
    )
    .await;
    assert_eq!(report["audit"]["ok"], true, "{report:#}");
    assert_eq!(report["buckets"], 3);
    // 4 000 buyers for 900 units: every unit sold (none left in a bucket while a buyer
    // was told SOLD_OUT), each an order. What the buyers heard says why if not.
    let heard = serde_json::json!({
        "answers": report["answers"],
        "connection errors": report["errors"],
        "burst_s": report["burst_s"],
    });
    assert_eq!(report["admitted"], 900, "the buyers heard {heard}");
    assert_eq!(report["orders"], 900, "the buyers heard {heard}");
    // Every node of the cluster counted; each master ran a share of the event.
    let nodes = report["redis_nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 6, "{report:#}");
    let masters: Vec<u64> = nodes
        .iter()
        .filter(|n| n["role"] == "master")
        .map(|n| n["evalsha_calls"].as_u64().unwrap())
        .collect();
    assert_eq!(masters.len(), 3, "{report:#}");
    assert!(
        masters.iter().all(|&calls| calls >= 100),
        "{masters:?}; the buyers heard {heard}"
    );
    // One bucket puts every admission on one master (a spread near 3); the issue's
    // bound, 15 %, is for bench-sized sales (docs/scaling.md), not one this small.
    let spread = report["masters_spread"].as_f64().unwrap();
    assert!(spread < 0.5, "spread {spread}: {masters:?}");
    println!("masters' scripts {masters:?}, spread {spread:.2}");
}
