//! The order pipeline with the real broker and MariaDB: reservations become orders
//! through RocketMQ transactional messages, stock_log and the stock-sync consumer.

use std::collections::HashMap;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;
use stampede_e2e::{TestApp, eventually, ordered_units, scalar, small_sale, spawn_app_with};

/// Fires one purchase of `quantity` per buyer, 256 at a time; answers by status.
async fn burst(
    app: &TestApp,
    event: u64,
    category: u64,
    buyers: &[stampede_e2e::Buyer],
) -> HashMap<u16, u64> {
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(256));
    let mut tasks = tokio::task::JoinSet::new();
    for b in buyers {
        let (http, url, token, gate) = (
            app.http.clone(),
            app.public_url.clone(),
            b.token.clone(),
            gate.clone(),
        );
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let body = json!({"category_id": category, "quantity": 1});
            stampede_e2e::purchase(&http, &url, event, &token, "k", body)
                .await
                .0
        });
    }
    let mut answers = HashMap::new();
    while let Some(status) = tasks.join_next().await {
        *answers.entry(status.unwrap()).or_default() += 1;
    }
    answers
}

/// Stream drained, every stock_log row synced, and `remain` as in Redis.
async fn settled(app: &TestApp, event: u64, category: u64, units: u64) -> bool {
    let (ordered, _) = ordered_units(&app.mysql, event).await;
    let backlog: u64 = app
        .redis
        .clone()
        .xlen(app.key(&format!("{{ev:{event}}}:orders")))
        .await
        .unwrap();
    let unsynced = scalar(
        &app.mysql,
        &format!("SELECT COUNT(*) FROM stock_log WHERE event_id = {event} AND synced = 0"),
    )
    .await;
    let remain = scalar(
        &app.mysql,
        &format!("SELECT remain FROM ticket_category WHERE id = {category}"),
    )
    .await;
    ordered == units && backlog == 0 && unsynced == 0 && remain == 5_000 - units as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_buyers_for_five_thousand_units_end_as_five_thousand_ordered_units() {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(small_sale(5_000, 1, 1, 2)).await;
    app.publish(event).await;
    let ga = categories[0];
    let buyers = app.buyers(20_000).await;
    let answers = burst(&app, event, ga, &buyers).await;
    assert_eq!(answers.get(&202), Some(&5_000), "{answers:?}");
    assert_eq!(answers.get(&409), Some(&15_000), "{answers:?}");

    let done = eventually(Duration::from_secs(60), || settled(&app, event, ga, 5_000)).await;
    let (units, orders) = ordered_units(&app.mysql, event).await;
    assert!(
        done,
        "not settled within 60 s: {units} units in {orders} orders"
    );
    assert_eq!(orders, 5_000);
    let statuses: HashMap<u64, String> = app
        .redis
        .clone()
        .hgetall(app.key(&format!("{{ev:{event}}}:status")))
        .await
        .unwrap();
    assert_eq!(statuses.len(), 5_000, "only admitted buyers have a status");
    assert!(
        statuses.values().all(|s| s.starts_with("CREATED:")),
        "every admitted buyer's status is CREATED"
    );
    let distinct = scalar(
        &app.mysql,
        &format!("SELECT COUNT(DISTINCT order_no) FROM stock_log WHERE event_id = {event}"),
    )
    .await;
    assert_eq!(distinct, 5_000, "one stock_log row per order");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_left_unknown_is_resolved_by_the_broker_check_back() {
    // The listener answers UNKNOW after committing, and the sweeper is out of the way:
    // only the broker's check-back can deliver the stock-sync messages.
    let app = spawn_app_with(|s| {
        s.orders.enabled = true;
        s.orders.inject_unknown = true;
        s.orders.sweep_after_s = 3_600;
    })
    .await;
    let (event, categories) = app.create_event(small_sale(5_000, 1, 1, 2)).await;
    app.publish(event).await;
    let buyers = app.buyers(20).await;
    let answers = burst(&app, event, categories[0], &buyers).await;
    assert_eq!(answers.get(&202), Some(&20));
    let created = eventually(Duration::from_secs(20), || async {
        ordered_units(&app.mysql, event).await.0 == 20
    })
    .await;
    assert!(created, "orders not created");
    let unsynced = scalar(
        &app.mysql,
        &format!("SELECT COUNT(*) FROM stock_log WHERE event_id = {event} AND synced = 0"),
    )
    .await;
    assert!(unsynced > 0, "nothing may sync before the check-back");
    let resolved = eventually(Duration::from_secs(60), || {
        settled(&app, event, categories[0], 20)
    })
    .await;
    assert!(
        resolved,
        "the check-back did not commit the messages within 60 s"
    );
    let (_, metrics) = app.get("/metrics").await;
    let metrics = metrics.as_str().unwrap().to_owned();
    assert!(
        metrics.contains("stampede_checkbacks_total{answer=\"commit\"}"),
        "{metrics}"
    );
    app.stop().await;
}
