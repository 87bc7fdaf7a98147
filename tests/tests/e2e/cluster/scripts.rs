//! A master without Stampede's scripts (restarted, or a replica promoted since they were
//! loaded) while another node of the cluster hangs: the core sends a missing script with
//! its call to the one master that needs it (core/src/infra/redis.rs `script`), where the
//! redis crate's own recovery (`SCRIPT LOAD`, sent to every node, replicas included) waited
//! on the hung node until the call timed out.

use stampede_core::keys::Bucket;
use stampede_e2e::{Stack, heavy, spawn_app};

use super::{cluster_port, master_of, redis_cli, replica_of, signal_node};

/// Resumes a stopped node when the test ends, passed or not.
struct Resume(u16);

impl Drop for Resume {
    fn drop(&mut self) {
        signal_node(&Stack::from_env(), self.0, "-CONT");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_without_the_scripts_admits_while_another_node_hangs() {
    let _heavy = heavy().await;
    let stack = Stack::from_env();
    let first = cluster_port(&stack);
    let app = spawn_app().await;
    let (event, ga, buyers) = super::sale_under_way(&app).await;

    // The event's master forgets every script; a replica of another master hangs.
    let master = master_of(first, &app.keys().stock(Bucket::only(event)));
    let other = (first..first + 6)
        .find(|p| *p != master && redis_cli(*p, &["role"]).starts_with("master"))
        .expect("another master");
    let hung = replica_of(first, other);
    assert_eq!(redis_cli(master, &["script", "flush"]), "OK");
    let _resume = Resume(hung);
    signal_node(&stack, hung, "-STOP");

    let (status, body) = app.buy(event, &buyers[1], "b", ga).await;
    assert_eq!(
        status, 202,
        "a purchase on a master without the scripts, a replica elsewhere hung: {body}"
    );
    // Sent with the call (EVAL), it is the master's again.
    let sha = redis::Script::new(stampede_core::admission::reserve::RESERVE_LUA)
        .get_hash()
        .to_owned();
    let loaded = redis_cli(master, &["script", "exists", &sha]);
    assert_eq!(loaded, "1", "reserve.lua is not loaded on the master now");
    app.stop().await;
}
