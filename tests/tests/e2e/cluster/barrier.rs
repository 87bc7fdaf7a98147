//! Writes in one slot that another slot builds on wait for their replicas
//! (`redis.wait_replicas`, core/src/admission/replicated.rs): a seat lock in the
//! event's slot before the buyer's bucket admits on it, and the first step of a move
//! before its units are credited where they go. Each test stops the replica of the
//! event's master and stalls its replication stream, makes the write, kills the master
//! (SIGKILL) and lets the replica take over without it: nothing may have been built on
//! the lost write.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::json;
use stampede_core::admission::replicated::ReplicaBarrier;
use stampede_core::buckets::{Mover, Place};
use stampede_core::domain::{CategoryId, EventId, UserId};
use stampede_core::keys::{self, Bucket};
use stampede_e2e::{Stack, TestApp, eventually, heavy, spawn_app_with};

use super::{
    cluster_port, in_sync_replica_of, master_of, redis_cli, settled, signal_node, stack_sh,
    took_over,
};
use crate::buckets::{bucketed_sale, seated_bucketed_sale};

const BUCKETS: u16 = 3;

/// A core whose writes wait up to 1 s (the most it allows) for one replica: longer than
/// the test takes to kill the master while a round waits. Made once every node agrees on
/// who serves which slot: a client that learned an old map asks nodes for a new one,
/// and a stopped node never answers.
async fn waiting_app(first: u16) -> TestApp {
    settled(first).await;
    spawn_app_with(|s| {
        s.redis.wait_replicas = 1;
        s.redis.wait_timeout_ms = 1_000;
    })
    .await
}

/// Stops the replica at `replica` and stalls its master's stream to it: a 64 MiB value
/// (in `slot_key`'s slot, so on that master) fills the kernel's socket buffers between
/// them, so whatever the master writes next stays in the master's own memory — a
/// stopped replica alone would still find it in its socket when it resumes.
fn stall_replication(stack: &Stack, master: u16, replica: u16, slot_key: &str) {
    signal_node(stack, replica, "-STOP");
    let node = redis::Client::open(format!("redis://127.0.0.1:{master}/")).unwrap();
    let mut node = node.get_connection().unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("{slot_key}:filler"))
        .arg(vec![b'x'; 64 << 20])
        .query(&mut node)
        .unwrap();
}

/// Kills the master at `master` and lets its stalled replica take over (it never
/// received what the master wrote after the stall).
async fn fail_over_to_stopped(stack: &Stack, master: u16, replica: u16) {
    signal_node(stack, master, "-9");
    signal_node(stack, replica, "-CONT");
    assert!(
        took_over(replica).await,
        "the replica {replica} did not take over from {master}"
    );
}

/// Polls `check` every 20 ms for up to 10 s: the master must die within the round's
/// `wait_timeout_ms` (1 s) of the write the round waits for.
async fn soon(mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Brings the killed node back (as a replica of the one that took over) when the test
/// ends, passed or not: the tests after it need all six nodes (they wait for the
/// replica they use to be in sync).
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        stack_sh(&["up", "rediscluster"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seat_lock_its_master_lost_before_the_replica_had_it_admits_nobody() {
    let _heavy = heavy().await;
    let stack = Stack::from_env();
    let first = cluster_port(&stack);
    let app = waiting_app(first).await;
    let (event, categories) = app.create_event(seated_bucketed_sale(2, 2)).await;
    let seated = categories[1];
    app.publish(event).await;
    let home = master_of(first, &app.keys().pool(event));
    let replica = in_sync_replica_of(first, home).await;
    // Two buyers whose buckets are on other masters than the seats: the seat lock is
    // the only write the killed master holds for them.
    let elsewhere: Vec<u16> = Bucket::all(event, BUCKETS)
        .filter(|b| master_of(first, &app.keys().stock(*b)) != home)
        .map(|b| b.index)
        .collect();
    let buyers = app.buyers(40).await;
    let mut theirs = buyers
        .iter()
        .filter(|b| elsewhere.contains(&Bucket::of_buyer(event, BUCKETS, UserId(b.user_id)).index));
    let (lost, later) = (theirs.next().unwrap(), theirs.next().unwrap());
    let seat = json!({"category_id": seated, "seat_ids": ["1:1"]});
    let seats = app.keys().seats(Bucket::only(event), seated);

    let _restore = Restore;
    stall_replication(&stack, home, replica, &app.keys().pool(event));
    let kill = async {
        let locked = soon(|| {
            let state = redis_cli(home, &["hget", &seats, "1:1"]);
            state.starts_with("P:") || state.starts_with("L:")
        })
        .await;
        fail_over_to_stopped(&stack, home, replica).await;
        locked
    };
    let ((status, answer), locked) = tokio::join!(app.buy(event, lost, "lost", seat.clone()), kill);
    assert!(locked, "the seat was never locked on its master");
    assert_eq!(
        status, 503,
        "a purchase whose seat lock its master lost was answered {status}: {answer}"
    );
    // Nothing admitted for them: their bucket never recorded the key.
    let recorded: bool = app
        .redis
        .clone()
        .hexists(
            app.keys()
                .idempotency(Bucket::of_buyer(event, BUCKETS, UserId(lost.user_id))),
            keys::idempotency_field(UserId(lost.user_id), "lost"),
        )
        .await
        .unwrap();
    assert!(!recorded, "the buyer's bucket admitted on a lost seat lock");
    // The promoted replica has the seat free: the next buyer gets it, the only 202.
    let deadline = Instant::now() + Duration::from_secs(30);
    let second = app
        .buy_while_busy(event, later, "later", seat, deadline)
        .await;
    assert!(
        matches!(&second, Some((202, _))),
        "the seat after the failover: {second:?}"
    );
    app.stop().await;
}

/// Units in the sales of the move tests.
const UNITS: i64 = 300;

/// A published sale of [`UNITS`] units over [`BUCKETS`] buckets on a waiting core, a
/// bucket on another master than the pool, and a mover that waits as the core's does.
struct MoveRig {
    app: TestApp,
    event: u64,
    ga: CategoryId,
    /// The master of the pool (the event's own slot).
    pool_home: u16,
    to: Bucket,
    mover: Mover,
}

impl MoveRig {
    async fn new(first: u16) -> MoveRig {
        let app = waiting_app(first).await;
        let (event, categories) = app
            .create_event(bucketed_sale(UNITS as u32, 1, BUCKETS))
            .await;
        app.publish(event).await;
        let pool_home = master_of(first, &app.keys().pool(event));
        let to = Bucket::all(event, BUCKETS)
            .find(|b| master_of(first, &app.keys().stock(*b)) != pool_home)
            .expect("a bucket on another master than the pool");
        let mover = Mover {
            redis: app.redis.clone(),
            keys: app.keys(),
            replicas: ReplicaBarrier::from_settings(&app.settings.redis),
        };
        MoveRig {
            ga: CategoryId(categories[0]),
            app,
            event,
            pool_home,
            to,
            mover,
        }
    }

    /// Units of the category for sale in the pool and the buckets (-1: unread).
    async fn for_sale(&self) -> i64 {
        match self.mover.available(EventId(self.event), BUCKETS).await {
            Ok(available) => available.get(&self.ga.0).copied().unwrap_or(0),
            Err(_) => -1,
        }
    }

    /// Moves units from the pool into the bucket while `kill` runs.
    async fn transfer_while<T>(&self, kill: impl Future<Output = T>) -> (anyhow::Result<i64>, T) {
        tokio::join!(self.transfer(), kill)
    }

    async fn transfer(&self) -> anyhow::Result<i64> {
        let from = Place::Pool(EventId(self.event));
        self.mover
            .transfer(from, Place::Bucket(self.to), self.ga, 1, 1)
            .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_its_master_lost_before_the_replica_had_it_is_credited_nowhere() {
    let _heavy = heavy().await;
    let stack = Stack::from_env();
    let first = cluster_port(&stack);
    let rig = MoveRig::new(first).await;
    let (app, event, ga, home) = (&rig.app, rig.event, rig.ga, rig.pool_home);
    let replica = in_sync_replica_of(first, home).await;
    assert_eq!(rig.for_sale().await, UNITS);
    let pool_before: i64 = app
        .redis
        .clone()
        .hget(app.keys().pool(event), ga.0)
        .await
        .unwrap();
    assert!(pool_before > 0, "the pool holds none of the units to move");

    let _restore = Restore;
    stall_replication(&stack, home, replica, &app.keys().pool(event));
    let pool = app.keys().pool(event);
    let kill = async {
        let taken = soon(|| {
            // Empty: the field is gone (none left).
            let left = redis_cli(home, &["hget", &pool, &ga.0.to_string()]);
            left.is_empty() || left.parse::<i64>().is_ok_and(|left| left < pool_before)
        })
        .await;
        fail_over_to_stopped(&stack, home, replica).await;
        taken
    };
    let (moved, taken) = rig.transfer_while(kill).await;
    assert!(
        taken,
        "the move never took the units out of the pool on its master"
    );
    // The pool came back with every unit (the replica never saw them taken): crediting
    // the bucket as well would count them twice.
    let counted = eventually(Duration::from_secs(30), || async {
        rig.for_sale().await >= 0
    })
    .await;
    assert!(
        counted,
        "the event's places did not answer after the failover"
    );
    assert_eq!(
        rig.for_sale().await,
        UNITS,
        "units for sale after a move its master lost (the move answered {moved:?})"
    );
    rig.app.stop().await;
}

/// Stalls the replica of the master of `rig`'s bucket, runs `credit` (which has a move
/// credited to that bucket) while watching that master for the credit, kills it once
/// the credit is there and lets the replica take over without it; then every unit must
/// be for sale again within 30 s. What `credit` returned.
async fn credit_lost<T>(rig: &MoveRig, first: u16, credit: impl Future<Output = T>) -> T {
    let stack = Stack::from_env();
    let home = master_of(first, &rig.app.keys().stock(rig.to));
    let replica = in_sync_replica_of(first, home).await;
    assert_eq!(rig.for_sale().await, UNITS);
    let stock = rig.app.keys().stock(rig.to);
    let field = rig.ga.0.to_string();
    let before: i64 = redis_cli(home, &["hget", &stock, &field])
        .parse()
        .unwrap_or(0);

    let _restore = Restore;
    stall_replication(&stack, home, replica, &stock);
    let kill = async {
        let credited = soon(|| {
            redis_cli(home, &["hget", &stock, &field])
                .parse::<i64>()
                .is_ok_and(|n| n > before)
        })
        .await;
        fail_over_to_stopped(&stack, home, replica).await;
        credited
    };
    let (answer, credited) = tokio::join!(credit, kill);
    assert!(credited, "the move never credited the bucket on its master");
    let whole = eventually(Duration::from_secs(30), || async {
        rig.for_sale().await == UNITS
    })
    .await;
    assert!(
        whole,
        "{} units for sale of {UNITS} after a credit its master lost",
        rig.for_sale().await
    );
    answer
}

/// A move's credit that its destination's master lost before the replica had it: the
/// credit waits for the replicas before the move's record is deleted, so the record is
/// still there after the failover and the core's sweeper credits it again (once stale,
/// crate::buckets::STALE_MOVE) — every unit is for sale, and the record goes. Without
/// that wait the record went at once and the moved units were nowhere (never sold;
/// buyers told SOLD_OUT once the rest was gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credit_its_master_lost_before_the_replica_had_it_is_made_again() {
    let _heavy = heavy().await;
    let first = cluster_port(&Stack::from_env());
    let rig = MoveRig::new(first).await;
    let moved = credit_lost(&rig, first, rig.transfer()).await;
    assert!(moved.is_err(), "a credit its master lost: {moved:?}");
    let recorded = eventually(Duration::from_secs(10), || async {
        rig.mover
            .recorded(EventId(rig.event), BUCKETS)
            .await
            .is_ok_and(|moves| moves.is_empty())
    })
    .await;
    assert!(recorded, "the move's record was not deleted once credited");
    rig.app.stop().await;
}

/// The same for a credit the core's sweeper makes: a move a stopped core left half done
/// (its units out of the pool, its record 10 s old, nothing credited) is credited by the
/// sweeper into a bucket whose master then dies before its replica has the credit. The
/// sweeper's credit waits for the replicas as a buyer's does, so the record is kept and
/// the next sweep credits it again. Without that wait the sweeper deleted the record at
/// once and the units were nowhere (290 of 300 for sale: checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credit_the_sweeper_made_and_its_master_lost_is_made_again() {
    let _heavy = heavy().await;
    let first = cluster_port(&Stack::from_env());
    let rig = MoveRig::new(first).await;
    let keys = rig.app.keys();
    let mut redis = rig.app.redis.clone();
    let epoch: Option<u64> = redis.hget(keys.meta(rig.to), "epoch").await.unwrap();
    // As move_out.lua leaves it, by a core that stopped before the credit.
    const MOVED: i64 = 10;
    let half_done = async {
        let left: i64 = redis
            .hincr(keys.pool(EventId(rig.event)), rig.ga.0, -MOVED)
            .await
            .unwrap();
        assert!(left >= 0, "the pool held fewer than {MOVED} units");
        let at = chrono::Utc::now().timestamp_millis() - 10_000;
        let record = format!(
            "{}|{}|{MOVED}|{at}|{}",
            rig.to.index,
            rig.ga.0,
            epoch.unwrap_or(0)
        );
        let _: () = redis
            .hset(keys.pool_moves(EventId(rig.event)), "0badc0de", record)
            .await
            .unwrap();
    };
    credit_lost(&rig, first, half_done).await;
    rig.app.stop().await;
}
