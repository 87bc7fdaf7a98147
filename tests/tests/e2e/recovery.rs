//! The order pipeline through a core killed mid-burst and a stopped broker: nothing lost.

use stampede_core::keys::Bucket;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;
use stampede_core::keys::Keys;
use stampede_e2e::{
    eventually, ordered_units, scalar, small_sale, spawn_app_with, unsynced_orders,
};

use crate::pipeline::burst;

/// Units in orders + what Redis still has = what was on sale; everything synced.
pub(crate) async fn conserved(
    redis: &mut stampede_core::infra::redis::Redis,
    mysql: &mysql_async::Pool,
    keys: &Keys,
    event: u64,
    category: u64,
    total: i64,
) -> (bool, String) {
    let (ordered, orders) = ordered_units(mysql, event).await;
    let stock: i64 = redis
        .hget(keys.stock(Bucket::only(event)), category)
        .await
        .unwrap();
    let backlog: u64 = redis
        .xlen(keys.order_stream(Bucket::only(event)))
        .await
        .unwrap();
    let unsynced = unsynced_orders(mysql, event).await;
    let logs = scalar(
        mysql,
        &format!("SELECT COUNT(*) FROM stock_log WHERE event_id = {event}"),
    )
    .await;
    let remain = scalar(
        mysql,
        &format!("SELECT remain FROM ticket_category WHERE id = {category}"),
    )
    .await;
    let ok = ordered as i64 + stock == total
        && backlog == 0
        && unsynced == 0
        && logs == orders as i64
        && remain == stock;
    (
        ok,
        format!(
            "ordered {ordered} in {orders} orders, stock {stock}, backlog {backlog}, unsynced {unsynced}, stock_log {logs}, remain {remain}"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_killed_mid_burst_and_restarted_loses_and_duplicates_nothing() {
    let _heavy = stampede_e2e::heavy().await;
    let stack = stampede_e2e::Stack::from_env();
    let (mut settings, database, prefix) = stampede_e2e::test_settings(&stack).await;
    settings.orders.enabled = true;
    let mut core = stampede_e2e::CoreProcess::spawn(&settings).await;
    let admin = stampede_e2e::AdminClient::of(&core.admin_url, &settings);
    let (event, categories) = admin.create_event(small_sale(20_000, 1, 1, 1)).await;
    admin.publish(event).await;
    let ga = categories[0];
    let buyers = admin.buyers(30_000).await;
    let buyer_count = buyers.len();

    // The burst runs while the core is killed under it.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    let mut tasks = tokio::task::JoinSet::new();
    for b in buyers {
        let (http, url, gate) = (http.clone(), core.public_url.clone(), gate.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let body = json!({"category_id": ga, "quantity": 1});
            match stampede_e2e::try_purchase(&http, &url, event, &b.token, "k", body).await? {
                (202, body) => body["request_id"].as_str()?.parse::<u64>().ok(),
                _ => None,
            }
        });
    }
    // Kill once a couple of thousand units are taken: mid-sale, with purchases in flight.
    let mut redis = stampede_e2e::connect_redis(&settings.redis).await;
    let keys = Keys::new(&prefix);
    let stock_key = keys.stock(Bucket::only(event));
    let midway = eventually(Duration::from_secs(30), || {
        let (mut redis, key) = (redis.clone(), stock_key.clone());
        async move { redis.hget::<_, _, i64>(&key, ga).await.unwrap() <= 18_000 }
    })
    .await;
    assert!(midway, "the burst did not get going");
    core.signal("-KILL").await;
    let left_at_kill: i64 = redis.hget(&stock_key, ga).await.unwrap();
    assert!(left_at_kill > 0, "the kill came after the sale was over");
    assert!(!tasks.is_empty(), "no purchase was in flight at the kill");
    let mut promised = Vec::new();
    while let Some(done) = tasks.join_next().await {
        if let Some(order_no) = done.unwrap() {
            promised.push(order_no);
        }
    }
    assert!(
        !promised.is_empty(),
        "the kill came before any purchase was admitted"
    );
    eprintln!(
        "killed with {left_at_kill} units left; {} of {buyer_count} buyers had a 202",
        promised.len()
    );
    core.restart().await;

    let mysql = mysql_async::Pool::new(stack.mysql_url(&database).as_str());
    let mut redis = stampede_e2e::connect_redis(&settings.redis).await;
    let ok = eventually(Duration::from_secs(90), || {
        let (mut redis, mysql, keys) = (redis.clone(), mysql.clone(), keys.clone());
        async move {
            conserved(&mut redis, &mysql, &keys, event, ga, 20_000)
                .await
                .0
        }
    })
    .await;
    let (_, last) = conserved(&mut redis, &mysql, &keys, event, ga, 20_000).await;
    assert!(ok, "not conserved after the restart: {last}");
    // Every 202 answered before the kill is an order now.
    let orders = stampede_e2e::order_numbers(&mysql, event).await;
    let missing: Vec<&u64> = promised.iter().filter(|n| !orders.contains(n)).collect();
    assert!(
        missing.is_empty(),
        "{} admitted purchases never became orders",
        missing.len()
    );
    core.signal("-TERM").await;
    stampede_e2e::drop_database(&mysql, &database).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_stopped_for_twenty_seconds_delays_the_sync_but_loses_nothing() {
    let _heavy = stampede_e2e::heavy().await;
    let own = stampede_e2e::OwnBroker::start();
    let app = spawn_app_with(|s| {
        s.orders.enabled = true;
        s.orders.sweep_after_s = 2;
        s.rocketmq.namesrv_addr = own.namesrv_addr();
    })
    .await;
    let (event, categories) = app.create_event(small_sale(5_000, 1, 1, 1)).await;
    app.publish(event).await;
    let ga = categories[0];
    let buyers = app.buyers(1_500).await;
    let redis = app.redis.clone();
    let check = |redis: stampede_core::infra::redis::Redis| {
        let (mysql, keys) = (app.mysql.clone(), app.keys());
        async move {
            let mut redis = redis;
            conserved(&mut redis, &mysql, &keys, event, ga, 5_000).await
        }
    };

    assert_eq!(
        burst(&app, event, ga, &buyers[..500]).await.get(&202),
        Some(&500)
    );
    assert!(
        eventually(Duration::from_secs(60), || async {
            check(redis.clone()).await.0
        })
        .await,
        "first part not synced"
    );

    own.stop_broker();
    let stopped = std::time::Instant::now();
    assert_eq!(
        burst(&app, event, ga, &buyers[500..1_000]).await.get(&202),
        Some(&500),
        "the sale goes on"
    );
    let created = eventually(Duration::from_secs(20), || async {
        ordered_units(&app.mysql, event).await.0 == 1_000
    })
    .await;
    assert!(created, "orders are created while the broker is down");
    let unsynced = unsynced_orders(&app.mysql, event).await;
    assert!(unsynced > 0, "nothing can sync without the broker");
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(stopped.elapsed())).await;
    own.start_broker();

    assert_eq!(
        burst(&app, event, ga, &buyers[1_000..]).await.get(&202),
        Some(&500)
    );
    let converged = eventually(Duration::from_secs(120), || async {
        check(redis.clone()).await.0
    })
    .await;
    let (_, now) = check(redis.clone()).await;
    assert!(
        converged,
        "did not converge after the broker came back: {now}"
    );
    assert_eq!(ordered_units(&app.mysql, event).await, (1_500, 1_500));
    app.stop().await;
}
