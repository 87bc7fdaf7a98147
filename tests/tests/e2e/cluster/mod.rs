//! On the cluster stack only (`make test-cluster`: STACK_MODE=cluster, a Redis Cluster of
//! three masters with a replica each, two cores, two edges): a master killed mid-sale, a
//! 202 waiting for its replica, one of two cores killed mid-sale, two edges agreeing, a
//! bucketed event's admissions on every master (and `stampede-bench sale --cluster`
//! measuring them), a seat lock or a move its master lost before its replica had it.
//! `make test` runs this module through `scripts/test-cluster.sh --short`; its own stack
//! skips it.

mod barrier;
mod bench;
mod buckets;
mod cores;
mod failover;
mod scripts;

use stampede_e2e::{Stack, root};

/// The first port of the stack's Redis Cluster (its six nodes follow it).
pub(crate) fn cluster_port(stack: &Stack) -> u16 {
    stack
        .redis_cluster_port
        .expect("the cluster tests need the cluster stack: make test-cluster")
}

pub(crate) fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The node that serves `key`'s slot as master: it answers a read of the key, where
/// every other node (a replica too) redirects.
pub(crate) fn master_of(first: u16, key: &str) -> u16 {
    (first..first + 6)
        .find(|p| redis_cli(*p, &["exists", key]).parse::<u8>().is_ok())
        .unwrap_or_else(|| panic!("no master serves {key}"))
}

/// Whether the node at `port` is a replica whose link to its master is up (in sync: it
/// could take over now).
pub(crate) fn replica_in_sync(port: u16) -> bool {
    let info = redis_cli(port, &["info", "replication"]);
    info.contains("role:slave") && info.contains("master_link_status:up")
}

/// `scripts/stack.sh ARGS` on the test's stack (its settings are in the environment).
pub(crate) fn stack_sh(args: &[&str]) {
    let status = std::process::Command::new(root().join("scripts/stack.sh"))
        .args(args)
        .status()
        .expect("scripts/stack.sh");
    assert!(status.success(), "scripts/stack.sh {args:?} failed");
}

/// The replica of the master at `master` (its `ROLE` names that master).
pub(crate) fn replica_of(first: u16, master: u16) -> u16 {
    (first..first + 6)
        .find(|p| {
            let role = redis_cli(*p, &["role"]);
            let lines: Vec<&str> = role.lines().collect();
            lines.first() == Some(&"slave") && lines.get(2) == Some(&master.to_string().as_str())
        })
        .unwrap_or_else(|| panic!("no replica of {master}"))
}

/// The replica of `master`, once it is in sync (a node restarted by an earlier test may
/// still be syncing, and such a replica cannot take over).
pub(crate) async fn in_sync_replica_of(first: u16, master: u16) -> u16 {
    let replica = replica_of(first, master);
    let synced = stampede_e2e::eventually(std::time::Duration::from_secs(30), || async {
        replica_in_sync(replica)
    })
    .await;
    assert!(synced, "the replica {replica} of {master} is not in sync");
    replica
}

/// Whether the replica at `replica` has taken over as master within 30 s (the stack's
/// node timeout is 2 s).
pub(crate) async fn took_over(replica: u16) -> bool {
    stampede_e2e::eventually(std::time::Duration::from_secs(30), || async {
        redis_cli(replica, &["role"]).starts_with("master")
    })
    .await
}

/// Waits (at most 30 s) until every node agrees on who serves which slot and every slot
/// is served: an earlier test's failover may still be spreading, or the master it
/// killed and brought back still rejoining (answering CLUSTERDOWN, or a map of before
/// the failover, meanwhile).
pub(crate) async fn settled(first: u16) {
    let agreed = stampede_e2e::eventually(std::time::Duration::from_secs(30), || async {
        let check = std::process::Command::new("redis-cli")
            .args(["--cluster", "check", &format!("127.0.0.1:{first}")])
            .output()
            .expect("redis-cli --cluster check");
        let said = String::from_utf8_lossy(&check.stdout).into_owned();
        said.contains("All nodes agree about slots configuration")
            && said.contains("All 16384 slots covered")
            && !said.contains("[ERR]")
    })
    .await;
    assert!(agreed, "the cluster's nodes do not agree on its slots");
}

/// `kill SIGNAL` to the cluster node on `port` (its pid file in the stack's state dir).
pub(crate) fn signal_node(stack: &Stack, port: u16, signal: &str) {
    let pid = std::fs::read_to_string(stack.dir.join(format!("pids/rediscluster-{port}.pid")))
        .unwrap_or_else(|e| panic!("the pid of cluster node {port}: {e}"));
    let ok = std::process::Command::new("kill")
        .args([signal, pid.trim()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {signal} {} (node {port})", pid.trim());
}

/// A published sale of one bucket (10 GA units, one each) with one 202 made: (event, the
/// GA purchase body, two buyers — the first has bought).
pub(crate) async fn sale_under_way(
    app: &stampede_e2e::TestApp,
) -> (u64, serde_json::Value, Vec<stampede_e2e::Buyer>) {
    let (event, categories) = app
        .create_event(stampede_e2e::small_sale(10, 1, 1, 1))
        .await;
    app.publish(event).await;
    let buyers = app.buyers(2).await;
    let ga = serde_json::json!({"category_id": categories[0], "quantity": 1});
    assert_eq!(app.buy(event, &buyers[0], "a", ga.clone()).await.0, 202);
    (event, ga, buyers)
}
