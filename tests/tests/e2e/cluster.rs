//! On the cluster stack only (`make test-cluster`: STACK_MODE=cluster, a Redis Cluster of
//! three masters with a replica each): a master killed mid-sale, one of two cores killed
//! mid-sale. `make test` skips this module; the other modules run on either stack.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::json;
use stampede_core::order_tables::OrderStatus;
use stampede_e2e::{
    Buyer, Stack, TestApp, eventually, heavy, over_shards, root, scalar, small_sale, spawn_app_with,
};

/// The first port of the stack's Redis Cluster (its six nodes follow it).
fn cluster_port(stack: &Stack) -> u16 {
    stack
        .redis_cluster_port
        .expect("the cluster tests need the cluster stack: make test-cluster")
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The node that serves `key`'s slot as master: it answers a read of the key, where
/// every other node (a replica too) redirects.
fn master_of(first: u16, key: &str) -> u16 {
    (first..first + 6)
        .find(|p| redis_cli(*p, &["exists", key]).parse::<u8>().is_ok())
        .unwrap_or_else(|| panic!("no master serves {key}"))
}

/// Whether the node at `port` is a replica whose link to its master is up (in sync: it
/// could take over now).
fn replica_in_sync(port: u16) -> bool {
    let info = redis_cli(port, &["info", "replication"]);
    info.contains("role:slave") && info.contains("master_link_status:up")
}

/// `scripts/stack.sh ARGS` on the test's stack (its settings are in the environment).
fn stack_sh(args: &[&str]) {
    let status = std::process::Command::new(root().join("scripts/stack.sh"))
        .args(args)
        .status()
        .expect("scripts/stack.sh");
    assert!(status.success(), "scripts/stack.sh {args:?} failed");
}

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
    while Instant::now() < deadline {
        let (status, body) = app
            .buy(
                event,
                buyer,
                &key,
                json!({"category_id": category, "quantity": 1}),
            )
            .await;
        match status {
            202 => {
                let rid = body["request_id"].as_str().unwrap().parse().unwrap();
                admitted
                    .lock()
                    .unwrap()
                    .push((buyer.user_id, rid, Instant::now()));
                return;
            }
            503 => tokio::time::sleep(Duration::from_millis(50)).await,
            409 => return,
            other => panic!("unexpected answer {other}: {body}"),
        }
    }
}

/// The 202s (user, request id) that ended neither as an order, nor decided in stock_log,
/// nor released in Redis with FAILED: promises nobody kept.
async fn unkept(app: &TestApp, event: u64, admitted: &[(u64, u64)]) -> Vec<(u64, u64)> {
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
        let status: Option<String> = redis
            .hget(app.keys().purchase_status(event), user)
            .await
            .unwrap();
        if !status.is_some_and(|s| s.starts_with("FAILED:")) {
            left.push((user, rid));
        }
    }
    left
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_master_killed_mid_sale_fails_over_and_no_unit_or_promise_is_lost() {
    let _heavy = heavy().await;
    let stack = Stack::from_env();
    let first = cluster_port(&stack);
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    const UNITS: i64 = 400;
    let (event, categories) = app.create_event(small_sale(UNITS as u32, 1, 1, 1)).await;
    app.publish(event).await;
    let ga = categories[0];
    let buyers = app.buyers(700).await;
    let master = master_of(first, &app.keys().stock(event));
    // A replica that is still syncing (a node restarted by an earlier run) cannot take
    // over: wait until the master's replica is in sync.
    let replica = replica_of(first, master);
    let synced = eventually(Duration::from_secs(30), || async {
        replica_in_sync(replica)
    })
    .await;
    assert!(synced, "the replica {replica} of {master} is not in sync");
    let pid_file = stack.dir.join(format!("pids/rediscluster-{master}.pid"));
    let pid = std::fs::read_to_string(&pid_file).unwrap();

    let admitted = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_secs(90);
    let gate = Arc::new(tokio::sync::Semaphore::new(16));
    let app = Arc::new(app);
    let mut tasks = tokio::task::JoinSet::new();
    for b in buyers {
        let (app, admitted, gate) = (app.clone(), admitted.clone(), gate.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            buy_until_answered(&app, event, ga, &b, deadline, &admitted).await;
        });
    }
    // Kill the event's master once a quarter of the units are taken.
    let midway = eventually(Duration::from_secs(30), || async {
        app.stock(event, ga).await <= UNITS * 3 / 4
    })
    .await;
    assert!(midway, "the sale did not get going");
    let killed_at = Instant::now();
    let killed = std::process::Command::new("kill")
        .args(["-9", pid.trim()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -9 {pid}");
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    // The killed node comes back as a replica of the one that took over.
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
        app.stream_len(event).await == 0 && unkept(&app, event, &promised).await.is_empty()
    })
    .await;
    let left = unkept(&app, event, &promised).await;
    assert!(
        settled,
        "{} of {} 202s never became an order nor a FAILED status: {:?}",
        left.len(),
        promised.len(),
        &left[..left.len().min(10)]
    );
    // No oversell: live units within the stock, and Redis agreeing with MySQL.
    let live = scalar(
        &app.mysql,
        &format!(
            "SELECT CAST(COALESCE(SUM(quantity), 0) AS SIGNED) FROM ({}) o",
            over_shards(&format!(
                "SELECT quantity FROM {{orders}} WHERE category_id = {ga} AND status IN {}",
                OrderStatus::LIVE_SQL
            ))
        ),
    )
    .await;
    assert!(live <= UNITS, "{live} units sold of {UNITS}");
    let conserved = eventually(Duration::from_secs(60), || async {
        let (_, stats) = app.get(&format!("/admin/events/{event}/stats")).await;
        stats["categories"][0]["gap"] == 0 && stats["categories"][0]["remain_gap"] == 0
    })
    .await;
    let (_, stats) = app.get(&format!("/admin/events/{event}/stats")).await;
    assert!(conserved, "the books do not balance: {stats:#}");
    eprintln!(
        "master {master} killed: {} 202s ({after_kill} after the kill), {live} units in live orders",
        promised.len()
    );
    Arc::try_unwrap(app).ok().unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_two_cores_killed_mid_sale_and_the_other_settles_its_reservations() {
    let _heavy = heavy().await;
    let stack = Stack::from_env();
    cluster_port(&stack);
    let (mut settings, database, _prefix) = stampede_e2e::test_settings(&stack).await;
    settings.orders.enabled = true;
    let mut doomed = stampede_e2e::CoreProcess::spawn(&settings).await;
    let survivor = stampede_e2e::CoreProcess::spawn(&settings).await;
    let admin = stampede_e2e::AdminClient::of(&survivor.admin_url, &settings);
    const UNITS: i64 = 3_000;
    let (event, categories) = admin.create_event(small_sale(UNITS as u32, 1, 1, 1)).await;
    admin.publish(event).await;
    let ga = categories[0];
    let buyers = admin.buyers(4_000).await;

    // Buyers alternate between the cores; one whose core is gone asks the other with
    // the same Idempotency-Key (what the edge's upstream does).
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let urls = [doomed.public_url.clone(), survivor.public_url.clone()];
    let gate = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, b) in buyers.into_iter().enumerate() {
        let (http, urls, gate) = (http.clone(), urls.clone(), gate.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            for url in [&urls[i % 2], &urls[1]] {
                let Ok(resp) = http
                    .post(format!("{url}/api/events/{event}/orders"))
                    .bearer_auth(&b.token)
                    .header("Idempotency-Key", "k")
                    .json(&json!({"category_id": ga, "quantity": 1}))
                    .send()
                    .await
                else {
                    continue; // no answer: the core died under it
                };
                match resp.status().as_u16() {
                    202 => {
                        let body: serde_json::Value = resp.json().await.ok()?;
                        return body["request_id"].as_str()?.parse::<u64>().ok();
                    }
                    // Unavailable: the other core.
                    502 | 503 => continue,
                    _ => return None,
                }
            }
            None
        });
    }
    let redis = stack.redis().await;
    let keys = stampede_core::keys::Keys::new(&settings.redis.key_prefix);
    let midway = eventually(Duration::from_secs(30), || {
        let (mut redis, key) = (redis.clone(), keys.stock(event));
        async move { redis.hget::<_, _, i64>(&key, ga).await.unwrap_or(UNITS) <= UNITS * 2 / 3 }
    })
    .await;
    assert!(midway, "the sale did not get going");
    doomed.signal("-KILL").await;
    let mut promised = Vec::new();
    while let Some(done) = tasks.join_next().await {
        promised.extend(done.unwrap());
    }
    assert!(!promised.is_empty());

    let mysql = mysql_async::Pool::new(stack.mysql_url(&database).as_str());
    let settled = eventually(Duration::from_secs(90), || {
        let (mut redis, mysql, keys) = (redis.clone(), mysql.clone(), keys.clone());
        async move {
            crate::recovery::conserved(&mut redis, &mysql, &keys, event, ga, UNITS)
                .await
                .0
        }
    })
    .await;
    let (_, books) =
        crate::recovery::conserved(&mut redis.clone(), &mysql, &keys, event, ga, UNITS).await;
    assert!(settled, "not settled after the kill: {books}");
    let orders = stampede_e2e::order_numbers(&mysql, event).await;
    let missing = promised.iter().filter(|n| !orders.contains(n)).count();
    assert_eq!(
        missing,
        0,
        "{missing} of {} admitted purchases never became orders",
        promised.len()
    );
    eprintln!(
        "{} admitted through two cores, one killed: {books}",
        promised.len()
    );
    let mut survivor = survivor;
    survivor.signal("-TERM").await;
    stampede_e2e::drop_database(&mysql, &database).await;
}

#[tokio::test]
async fn two_edges_give_the_same_answers() {
    let stack = Stack::from_env();
    cluster_port(&stack);
    let edge2 = stack
        .edge2_port
        .expect("the cluster stack has a second edge");
    let (app, _edge) = stampede_e2e::stack_app().await;
    let edges = [app.edge_url.clone(), format!("http://127.0.0.1:{edge2}")];
    let (event, categories) = crate::edge::open_sale(&app, small_sale(1, 1, 1, 1)).await;
    let (not_yet, _) = app
        .admin
        .create_event(json!({
            "title": "Not yet", "venue": "Loopback", "show_time": "2031-06-01T20:00:00Z",
            "sale_start": "2031-01-01T00:00:00Z", "sale_end": "2031-06-01T12:00:00Z",
            "per_user_limit": 1, "pay_timeout_s": 900,
            "categories": [{"name": "GA", "price_cents": 100, "quantity": 5}],
        }))
        .await;
    app.admin.publish(not_yet).await;
    let buyers = app.admin.buyers(3).await;
    let ga = json!({"category_id": categories[0], "quantity": 1});
    assert_eq!(app.buy(event, &buyers[0], "a", ga.clone()).await.0, 202);

    // What each edge answers, once both have refreshed (sold out is the edge's own).
    let answers = |edge: String, buyer: Buyer| {
        let http = app.http.clone();
        let ga = ga.clone();
        async move {
            let mut seen = Vec::new();
            for (event, key, token) in [
                (event, "b", buyer.token.as_str()),
                (not_yet, "c", buyer.token.as_str()),
                (event, "d", "not-a-token"),
            ] {
                let r = http
                    .post(format!("{edge}/api/events/{event}/orders"))
                    .bearer_auth(token)
                    .header("Idempotency-Key", key)
                    .json(&ga)
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let body: serde_json::Value = r.json().await.unwrap_or_default();
                seen.push((status, body["error"]["code"].clone()));
            }
            let mut detail: serde_json::Value = http
                .get(format!("{edge}/api/events/{event}"))
                .bearer_auth(&buyer.token)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            // The clock is each answer's own.
            for field in ["server_time", "server_time_ms"] {
                detail.as_object_mut().unwrap().remove(field);
            }
            (seen, detail)
        }
    };
    // Both edges refresh every 0.2 s; after a second both know the category is gone.
    // One round each (a buyer asking again and again would meet the per-user limit).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let one = answers(edges[0].clone(), buyers[1].clone()).await;
    let two = answers(edges[1].clone(), buyers[2].clone()).await;
    assert_eq!(one, two, "the two edges disagree");
    assert_eq!(
        one.0.iter().map(|a| a.0).collect::<Vec<_>>(),
        vec![409, 403, 401],
        "{one:?}"
    );
    assert_eq!(one.0[0].1, "SOLD_OUT");
}

/// The replica of the master at `master` (its `ROLE` names that master).
fn replica_of(first: u16, master: u16) -> u16 {
    (first..first + 6)
        .find(|p| {
            let role = redis_cli(*p, &["role"]);
            let lines: Vec<&str> = role.lines().collect();
            lines.first() == Some(&"slave") && lines.get(2) == Some(&master.to_string().as_str())
        })
        .unwrap_or_else(|| panic!("no replica of {master}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_202_waits_until_the_masters_replica_has_the_admission() {
    let stack = Stack::from_env();
    let first = cluster_port(&stack);
    let app = spawn_app_with(|s| {
        s.redis.wait_replicas = 1;
        s.redis.wait_timeout_ms = 10_000;
    })
    .await;
    let (event, categories) = app.create_event(small_sale(10, 1, 1, 1)).await;
    app.publish(event).await;
    let buyers = app.buyers(2).await;
    let ga = json!({"category_id": categories[0], "quantity": 1});
    assert_eq!(app.buy(event, &buyers[0], "a", ga.clone()).await.0, 202);

    // The event's replica stops for a second: the next 202 waits for it.
    let master = master_of(first, &app.keys().stock(event));
    let replica = replica_of(first, master);
    let pid = std::fs::read_to_string(stack.dir.join(format!("pids/rediscluster-{replica}.pid")))
        .unwrap()
        .trim()
        .to_owned();
    let signal = |sig: &'static str, pid: String| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP", pid.clone());
    let paused = Instant::now();
    let resume = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        signal("-CONT", pid);
    });
    let (status, body) = app.buy(event, &buyers[1], "b", ga).await;
    let waited = paused.elapsed();
    resume.await.unwrap();
    assert_eq!(status, 202, "{body}");
    assert!(
        waited >= Duration::from_millis(900),
        "answered 202 after {waited:?}, while the replica was stopped"
    );
    // And the replica has it: the buyer's status, read from the replica itself.
    let read = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "printf 'READONLY\\nHGET {} {}\\n' | redis-cli -h 127.0.0.1 -p {replica}",
            app.keys().purchase_status(event),
            buyers[1].user_id
        ))
        .output()
        .unwrap();
    let read = String::from_utf8_lossy(&read.stdout).into_owned();
    assert!(read.contains("QUEUED:"), "the replica has: {read:?}");
    app.stop().await;
}
