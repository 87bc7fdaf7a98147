//! A bucketed event on the cluster: its three buckets on three masters, each running
//! its share of the admissions.

use std::collections::HashSet;

use stampede_core::keys::Bucket;
use stampede_e2e::{Stack, spawn_app_with};

use super::{cluster_port, master_of, redis_cli};
use crate::buckets::{bucketed_sale, stampede};

/// Scripts the node at `port` has run (INFO commandstats' EVALSHA calls).
fn evalsha_calls(port: u16) -> u64 {
    redis_cli(port, &["info", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|v| v.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucketed_events_admissions_run_on_every_master() {
    let first = cluster_port(&Stack::from_env());
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(bucketed_sale(300, 1, 3)).await;
    app.publish(event).await;
    let masters: Vec<u16> = Bucket::all(event, 3)
        .map(|b| master_of(first, &app.keys().stock(b)))
        .collect();
    assert_eq!(
        masters.iter().collect::<HashSet<_>>().len(),
        3,
        "one bucket per master: {masters:?}"
    );
    let before: Vec<u64> = masters.iter().map(|m| evalsha_calls(*m)).collect();
    let buyers = app.buyers(300).await;
    let (admitted, sold_out) = stampede(&app, event, categories[0], &buyers).await;
    assert_eq!((admitted.len(), sold_out), (300, 0));
    let ran: Vec<u64> = masters
        .iter()
        .zip(&before)
        .map(|(m, b)| evalsha_calls(*m) - b)
        .collect();
    // About 100 admissions each (the buyers' buckets), plus refills and settles.
    for calls in &ran {
        assert!(*calls >= 60, "scripts per master: {ran:?}");
    }
    println!("scripts per master during 300 admissions over 3 buckets: {ran:?}");
}
