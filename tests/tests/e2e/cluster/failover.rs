//! A Redis master killed mid-sale, and a 202 that waits for the master's replica.

use stampede_core::admission::status::PurchaseStatus;
use stampede_core::buckets::Mover;
use stampede_core::domain::{EventId, OrderNo, UserId};
use stampede_core::keys::Bucket;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::json;
use stampede_e2e::{Buyer, Stack, TestApp, eventually, heavy, small_sale, spawn_app_with};

use crate::buckets::bucketed_sale;

use super::{
    cluster_port, in_sync_replica_of, master_of, replica_in_sync, signal_node, stack_sh, took_over,
};

/// Each buyer's one purchase (GA), retried with the same Idempotency-Key while the core
/// answers 503 (a shard failing over: OUTCOME_UNKNOWN or unavailable), within `deadline`.
/// Every 202 is recorded with its request id and the moment it came.
async fn buy_until_answered(
    app: &TestApp,
    event: u64,
    category: u64,
    buyer: &Buyer,
    deadline: Instant,
    admitted: &Mutex<Vec<(u64, u64, Instant)>>,
) {
    let key = format!("u{}", buyer.user_id);
    let body = json!({"category_id": category, "quantity": 1});
    match app.buy_while_busy(event, buyer, &key, body, deadline).await {
        Some((202, body)) => {
            let rid = body["request_id"].as_str().unwrap().parse().unwrap();
            admitted
                .lock()
                .unwrap()
                .push((buyer.user_id, rid, Instant::now()));
        }
        Some((409, _)) | None => {}
        Some((other, body)) => panic!("unexpected answer {other}: {body}"),
    }
}

/// The 202s (user, request id) that ended neither as an order, nor decided in stock_log,
/// nor released in Redis with FAILED: promises nobody kept.
async fn unkept(
    app: &TestApp,
    event: u64,
    buckets: u16,
    admitted: &[(u64, u64)],
) -> Vec<(u64, u64)> {
    let mut kept = stampede_e2e::order_numbers(&app.mysql, event).await;
    let mut conn = app.mysql.get_conn().await.unwrap();
    use mysql_async::prelude::Queryable;
    kept.extend(
        conn.query::<u64, _>(format!(
            "SELECT order_no FROM stock_log WHERE event_id = {event} \
             AND status IN ('EXPIRED', 'REFUSED')"
        ))
        .await
        .unwrap(),
    );
    let mut redis = app.redis.clone();
    let mut left = Vec::new();
    for &(user, rid) in admitted {
        if kept.contains(&rid) {
            continue;
        }
        // The buyer's status, or (replaced by a later purchase) the purchase's own.
        let said: Vec<Option<String>> = redis
            .hget(
                app.keys()
                    .purchase_status(Bucket::of_buyer(event, buckets, UserId(user))),
                &[
                    user.to_string(),
                    stampede_core::keys::replaced_purchase(UserId(user), OrderNo(rid)),
                ],
            )
            .await
            .unwrap();
        let told = said
            .iter()
            .flatten()
            .any(|s| PurchaseStatus::says_failed(s, OrderNo(rid)));
        if !told {
            left.push((user, rid));
        }
    }
    left
}

/// Units of the category Redis holds for sale: every bucket, the pool and what moves.
async fn for_sale(app: &TestApp, event: u64, buckets: u16, category: u64) -> i64 {
    let mover = Mover {
        redis: app.redis.clone(),
        keys: app.keys(),
        replicas: None,
    };
    let (held, moving) = (
        mover.available(EventId(event), buckets).await.unwrap(),
        mover.moving(EventId(event), buckets).await.unwrap(),
    );
    let on_the_way: i64 = moving
        .iter()
        .filter(|(c, _)| *c == category)
        .map(|(_, n)| n)
        .sum();
    held.get(&category).copied().unwrap_or(0) + on_the_way
}

/// Reservations in every bucket's stream, not yet settled.
async fn backlog(app: &TestApp, event: u64, buckets: u16) -> u64 {
    let mut redis = app.redis.clone();
    let mut total = 0;
    for b in Bucket::all(event, buckets) {
        let len: u64 = redis.xlen(app.keys().order_stream(b)).await.unwrap();
        total += len;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_master_killed_mid_sale_fails_over_and_no_unit_or_promise_is_lost() {
    master_killed_mid_sale(1).await;
}

/// The same with the event's stock over three buckets, one per master: the master of
/// the first bucket dies; the buyers of the other two go on, and the rewind check fences
/// and rebuilds every bucket from MySQL if the promoted replica lacked admissions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucketed_events_master_killed_mid_sale_fails_over_and_no_unit_or_promise_is_lost() {
    master_killed_mid_sale(3).await;
}

async fn master_killed_mid_sale(buckets: u16) {
    let _heavy = heavy().await;
    let stack = Stack::from_env();
    let first = cluster_port(&stack);
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    const UNITS: i64 = 400;
    let sale = if buckets == 1 {
        small_sale(UNITS as u32, 1, 1, 1)
    } else {
        bucketed_sale(UNITS as u32, 1, buckets)
    };
    let (event, categories) = app.create_event(sale).await;
    app.publish(event).await;
    let ga = categories[0];
    let buyers = app.buyers(700).await;
    let victim = Bucket::all(event, buckets).next().unwrap();
    let master = master_of(first, &app.keys().stock(victim));
    // Its replica must be able to take over.
    let replica = in_sync_replica_of(first, master).await;

    let admitted = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_secs(90);
    // Few buyers at once, so that the sale lasts long enough to be cut in the middle.
    let gate = Arc::new(tokio::sync::Semaphore::new(4));
    let app = Arc::new(app);
    let mut tasks = tokio::task::JoinSet::new();
    for b in buyers {
        let (app, admitted, gate) = (app.clone(), admitted.clone(), gate.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            buy_until_answered(&app, event, ga, &b, deadline, &admitted).await;
        });
    }
    // Kill the event's master once a quarter of the units are taken. Looked at every
    // few milliseconds: on an idle machine the 400 units sell in about 100 ms, and a
    // look every 100 ms found the sale over before the kill (nothing admitted after it).
    let midway = async {
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            if for_sale(&app, event, buckets, ga).await <= UNITS * 3 / 4 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    }
    .await;
    assert!(midway, "the sale did not get going");
    let killed_at = Instant::now();
    signal_node(&stack, master, "-9");
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    // The killed node comes back as a replica of the one that took over, once that one
    // has: restarted before the failover, it would come back as the master it was.
    assert!(
        took_over(replica).await,
        "the replica {replica} did not take over from {master}"
    );
    stack_sh(&["up", "rediscluster"]);
    let demoted = eventually(Duration::from_secs(30), || async {
        replica_in_sync(master)
    })
    .await;
    assert!(
        demoted,
        "the killed master did not come back as an in-sync replica"
    );

    let admitted = admitted.lock().unwrap().clone();
    let after_kill = admitted.iter().filter(|a| a.2 > killed_at).count();
    assert!(
        after_kill > 0,
        "no purchase was admitted after the failover ({} before)",
        admitted.len()
    );
    let promised: Vec<(u64, u64)> = admitted.iter().map(|a| (a.0, a.1)).collect();
    let settled = eventually(Duration::from_secs(90), || async {
        backlog(&app, event, buckets).await == 0
            && unkept(&app, event, buckets, &promised).await.is_empty()
    })
    .await;
    let left = unkept(&app, event, buckets, &promised).await;
    assert!(
        settled,
        "{} of {} 202s never became an order nor a FAILED status: {:?}",
        left.len(),
        promised.len(),
        &left[..left.len().min(10)]
    );
    // No oversell: live units within the stock, and Redis agreeing with MySQL.
    let live = stampede_e2e::live_units(&app.mysql, &format!("category_id = {ga}")).await;
    assert!(live <= UNITS, "{live} units sold of {UNITS}");
    let conserved = eventually(Duration::from_secs(60), || async {
        let (_, stats) = app.get(&format!("/admin/events/{event}/stats")).await;
        stats["categories"][0]["gap"] == 0 && stats["categories"][0]["remain_gap"] == 0
    })
    .await;
    let (_, stats) = app.get(&format!("/admin/events/{event}/stats")).await;
    assert!(conserved, "the books do not balance: {stats:#}");
    eprintln!(
        "{buckets} bucket(s), master {master} killed: {} 202s ({after_kill} after the kill), \
         {live} units in live orders",
        promised.len()
    );
    Arc::try_unwrap(app).ok().unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_202_waits_until_the_masters_replica_has_the_admission() {
    let stack = Stack::from_env();
    let first = cluster_port(&stack);
    let app = spawn_app_with(|s| {
        s.redis.wait_replicas = 1;
        s.redis.wait_timeout_ms = 1_000;
    })
    .await;
    let (event, ga, buyers) = super::sale_under_way(&app).await;

    // The event's replica stops for 600 ms: the next 202 waits for it.
    let master = master_of(first, &app.keys().stock(Bucket::only(event)));
    let replica = in_sync_replica_of(first, master).await;
    signal_node(&stack, replica, "-STOP");
    let paused = Instant::now();
    let resume = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(600)).await;
        signal_node(&Stack::from_env(), replica, "-CONT");
    });
    let (status, body) = app.buy(event, &buyers[1], "b", ga).await;
    let waited = paused.elapsed();
    resume.await.unwrap();
    assert_eq!(status, 202, "{body}");
    assert!(
        waited >= Duration::from_millis(550),
        "answered 202 after {waited:?}, while the replica was stopped"
    );
    // And the replica has it: the buyer's status, read from the replica itself.
    let read = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "printf 'READONLY\\nHGET {} {}\\n' | redis-cli -h 127.0.0.1 -p {replica}",
            app.keys().purchase_status(Bucket::only(event)),
            buyers[1].user_id
        ))
        .output()
        .unwrap();
    let read = String::from_utf8_lossy(&read.stdout).into_owned();
    assert!(read.contains("QUEUED:"), "the replica has: {read:?}");
    app.stop().await;
}
