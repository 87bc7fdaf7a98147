//! Reconciliation: Redis losing everything in the middle of a sale, and drift healed in
//! the safe direction only.

use stampede_core::keys::Bucket;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::{Value, json};
use stampede_core::order_tables::OrderStatus;
use stampede_e2e::{
    Buyer, OwnRedis, TestApp, core_binary, core_env, heavy, over_shards, scalar, small_sale,
    spawn_app_with,
};

/// The statuses whose orders hold their units, for SQL.
const LIVE: &str = OrderStatus::LIVE_SQL;

/// Units in live (UNPAID or PAID) orders of the category.
async fn live_units(app: &TestApp, category: u64) -> i64 {
    let union = over_shards(&format!(
        "SELECT quantity FROM {{orders}} WHERE category_id = {category} \
         AND status IN {LIVE}"
    ));
    scalar(
        &app.mysql,
        &format!("SELECT CAST(COALESCE(SUM(quantity), 0) AS SIGNED) FROM ({union}) o"),
    )
    .await
}

/// The event's stats once nothing is queued or unsynced and every gap is 0.
async fn settled_stats(app: &TestApp, event: u64, within: Duration) -> Value {
    let until = Instant::now() + within;
    loop {
        let (_, stats) = app.get(&format!("/admin/events/{event}/stats")).await;
        let settled = stats["queued_reservations"] == 0
            && stats["unsynced_stock_log"] == 0
            && stats["categories"]
                .as_array()
                .is_some_and(|cs| cs.iter().all(|c| c["gap"] == 0 && c["remain_gap"] == 0));
        if settled {
            return stats;
        }
        assert!(Instant::now() < until, "not settled: {stats:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One buyer's two attempts (a GA unit, then a seat), each retried while the core
/// answers 503 (busy, or reloading its keys), within `deadline`; each 202 counted in
/// `admitted` as it comes.
async fn buy_twice(
    app: &TestApp,
    event: u64,
    categories: &[u64],
    buyer: &Buyer,
    deadline: Instant,
    admitted: &AtomicU64,
) {
    for (i, category) in categories.iter().enumerate() {
        let key = format!("u{}-{i}", buyer.user_id);
        let body = json!({"category_id": category, "quantity": 1});
        match app.buy_while_busy(event, buyer, &key, body, deadline).await {
            Some((202, _)) => {
                admitted.fetch_add(1, Ordering::SeqCst);
            }
            Some((409, _)) | None => {}
            Some((other, body)) => panic!("unexpected answer {other}: {body}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_mid_sale_rebuilds_the_keys_and_no_unit_is_sold_twice() {
    let _heavy = heavy().await;
    let redis_server = OwnRedis::start();
    let app = spawn_app_with(|s| {
        redis_server.use_in(s);
        s.orders.enabled = true;
        s.reconcile.interval_s = 1;
        s.reconcile.confirm_ms = 200;
        // Every buyer here is honest; the core's own limiter is not under test.
        s.admission.user_per_s = 1000;
    })
    .await;
    let (event, categories) = app.create_event(small_sale(150, 10, 10, 2)).await;
    app.publish(event).await;
    let buyers = Arc::new(app.buyers(300).await);
    let app = Arc::new(app);
    let admitted = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(90);

    let mut tasks = Vec::new();
    let next = Arc::new(AtomicU64::new(0));
    for _ in 0..24 {
        let (app, buyers, categories) = (app.clone(), buyers.clone(), categories.clone());
        let (admitted, next) = (admitted.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst) as usize;
                let Some(buyer) = buyers.get(i) else { return };
                buy_twice(&app, event, &categories, buyer, deadline, &admitted).await;
            }
        }));
    }
    // Redis loses everything while the sale runs, with reservations queued and batches
    // in the workers' hands.
    let flushed_at = loop {
        let n = admitted.load(Ordering::SeqCst);
        if n >= 40 {
            break n;
        }
        assert!(Instant::now() < deadline, "the sale did not start");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let mut raw = redis::Client::open(redis_server.url().as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let stats = settled_stats(&app, event, Duration::from_secs(60)).await;

    // No oversell, and no unit lost: the reservations Redis forgot went back on sale and
    // were bought by others.
    for (category, total) in categories.iter().zip([150, 100]) {
        assert_eq!(live_units(&app, *category).await, total, "{stats:#}");
        let redis_left: i64 = raw
            .hget(app.keys().stock(Bucket::only(event)), category)
            .await
            .unwrap();
        assert_eq!(redis_left, 0);
    }
    // Every seat in at most one live order, and every live order's seat locked for it.
    let seats = over_shards(&format!(
        "SELECT i.row_no, i.col_no FROM {{items}} i JOIN {{orders}} o \
         ON o.order_no = i.order_no WHERE o.event_id = {event} \
         AND o.status IN {LIVE} AND i.row_no IS NOT NULL"
    ));
    assert_eq!(
        scalar(
            &app.mysql,
            &format!("SELECT COUNT(DISTINCT row_no, col_no) FROM ({seats}) s")
        )
        .await,
        100
    );
    // Nobody above the limit, across what they held before and after the flush.
    let per_user = over_shards(&format!(
        "SELECT user_id, quantity FROM {{orders}} WHERE event_id = {event} \
         AND status IN {LIVE}"
    ));
    assert!(
        scalar(
            &app.mysql,
            &format!(
                "SELECT CAST(COALESCE(MAX(n), 0) AS SIGNED) FROM \
                 (SELECT SUM(quantity) n FROM ({per_user}) u GROUP BY user_id) t"
            )
        )
        .await
            <= 2
    );
    // The gauge says 0 for both categories.
    let (_, metrics) = app.get("/metrics").await;
    let metrics = metrics.as_str().unwrap_or_default().to_owned();
    for category in &categories {
        let line =
            format!("stampede_conservation_gap{{category=\"{category}\",event=\"{event}\"}} 0");
        assert!(metrics.contains(&line), "no `{line}` in\n{metrics}");
    }
    // And the command-line reconciler agrees (exit 0: every gap 0).
    let cli = tokio::process::Command::new(core_binary())
        .args(["reconcile", "--event", &event.to_string()])
        .envs(core_env(&app.settings, 1, 1))
        .output()
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&cli.stdout);
    assert!(
        cli.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    assert!(out.lines().count() >= 3, "{out}");
    println!(
        "flushed after {flushed_at} admissions; {} admitted in all for 250 units",
        admitted.load(Ordering::SeqCst)
    );
}

/// `POST /admin/events/{id}/reconcile`; its report.
async fn reconcile(app: &TestApp, event: u64) -> Value {
    let (status, report) = app
        .post(&format!("/admin/events/{event}/reconcile"), json!({}))
        .await;
    assert_eq!(status, 200, "{report}");
    report
}

fn gap(report: &Value, category: u64) -> i64 {
    report["balance"]["categories"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["category_id"] == category)
        .unwrap()["gap"]
        .as_i64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_healed_downward_during_a_sale_and_upward_only_after_it() {
    let app = spawn_app_with(|s| {
        s.orders.enabled = true;
        s.reconcile.interval_s = 0;
        s.reconcile.confirm_ms = 100;
    })
    .await;
    let (event, categories) = app.create_event(small_sale(20, 2, 2, 4)).await;
    app.publish(event).await;
    let (ga, seated) = (categories[0], categories[1]);
    let buyers = app.buyers(2).await;
    let (status, _) = app
        .buy(
            event,
            &buyers[0],
            "a",
            json!({"category_id": ga, "quantity": 3}),
        )
        .await;
    assert_eq!(status, 202);
    settled_stats(&app, event, Duration::from_secs(30)).await;
    let stock_key = app.keys().stock(Bucket::only(event));
    let mut redis = app.redis.clone();

    // Redis offering 5 units too many is lowered at once, sale or not.
    let _: i64 = redis.hincr(&stock_key, ga, 5).await.unwrap();
    let report = reconcile(&app, event).await;
    assert_eq!(gap(&report, ga), 0, "{report:#}");
    assert_eq!(app.stock(event, ga).await, 17);

    // Redis offering 4 too few is left alone while the sale runs…
    let _: i64 = redis.hincr(&stock_key, ga, -4).await.unwrap();
    let report = reconcile(&app, event).await;
    assert_eq!(gap(&report, ga), 4, "{report:#}");
    assert_eq!(app.stock(event, ga).await, 13);
    // …and raised once it is closed.
    assert_eq!(
        app.post(&format!("/admin/events/{event}/close"), json!({}))
            .await
            .0,
        200
    );
    let report = reconcile(&app, event).await;
    assert_eq!(gap(&report, ga), 0, "{report:#}");
    assert_eq!(app.stock(event, ga).await, 17);
    assert_eq!(
        app.post(&format!("/admin/events/{event}/reopen"), json!({}))
            .await
            .0,
        200
    );

    // A cancelled order whose units never got back to Redis gets them back, once.
    let (status, queued) = app
        .buy(
            event,
            &buyers[1],
            "b",
            json!({"category_id": seated, "quantity": 2}),
        )
        .await;
    assert_eq!(status, 202, "{queued}");
    let order_no = queued["request_id"].as_str().unwrap().to_owned();
    settled_stats(&app, event, Duration::from_secs(30)).await;
    let resp = app
        .http
        .post(format!("{}/api/orders/{order_no}/cancel", app.public_url))
        .bearer_auth(&buyers[1].token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    // Undo what restock.lua did, as if Redis had not answered.
    let restocked = app.keys().restocked(Bucket::only(event));
    let _: i64 = redis.srem(&restocked, &order_no).await.unwrap();
    let _: i64 = redis.hincr(&stock_key, seated, -2).await.unwrap();
    let report = reconcile(&app, event).await;
    assert_eq!(gap(&report, seated), 0, "{report:#}");
    assert_eq!(app.stock(event, seated).await, 4);
    assert!(
        report["actions"][0]
            .as_str()
            .unwrap()
            .starts_with("gave back 2 units of 1 cancelled orders"),
        "{report:#}"
    );
    assert_eq!(reconcile(&app, event).await["actions"], json!([]));

    // MySQL's remain off by 3 is corrected once nothing is left to sync.
    let mut conn = app.mysql.get_conn().await.unwrap();
    use mysql_async::prelude::Queryable;
    conn.exec_drop(
        "UPDATE ticket_category SET remain = remain - 3 WHERE id = ?",
        (ga,),
    )
    .await
    .unwrap();
    let report = reconcile(&app, event).await;
    let ga_books = &report["balance"]["categories"][0];
    assert_eq!(
        (
            ga_books["remain_gap"].as_i64(),
            ga_books["db_remain"].as_i64()
        ),
        (Some(0), Some(17)),
        "{report:#}"
    );
}
