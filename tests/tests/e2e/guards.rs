//! MySQL as the last line of defence: whatever Redis admits, order creation's
//! transaction refuses oversell, a seat in two live orders and a buyer over the limit;
//! and a Redis that went back in time is caught and rebuilt from MySQL.

use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;
use stampede_core::keys::SeatState;
use stampede_e2e::{
    Buyer, OwnRedis, TestApp, eventually, ordered_units, scalar, small_sale, spawn_app_with,
};

/// Buys one unit of `category` for each buyer, one key each; the statuses answered.
async fn buy_one_each(app: &TestApp, event: u64, category: u64, buyers: &[Buyer]) -> Vec<u16> {
    let mut answers = Vec::new();
    for b in buyers {
        let body = json!({"category_id": category, "quantity": 1});
        answers.push(app.buy(event, b, "k1", body).await.0);
    }
    answers
}

/// Nothing queued any more for the event.
async fn drained(app: &TestApp, event: u64) -> bool {
    eventually(Duration::from_secs(30), || async {
        app.stream_len(event).await == 0
    })
    .await
}

/// `SELECT committed FROM ticket_category`.
async fn committed(app: &TestApp, category: u64) -> i64 {
    scalar(
        &app.mysql,
        &format!("SELECT committed FROM ticket_category WHERE id = {category}"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_refuses_units_redis_should_not_have_offered_and_redis_is_corrected_down() {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(small_sale(10, 1, 2, 2)).await;
    app.publish(event).await;
    let ga = categories[0];
    let first = app.buyers(10).await;
    assert_eq!(buy_one_each(&app, event, ga, &first).await, vec![202; 10]);
    assert!(drained(&app, event).await);
    assert_eq!(ordered_units(&app.mysql, event).await, (10, 10));
    // Redis loses what it sold (as if it had restarted from an old copy) and offers 5.
    let mut redis = app.redis.clone();
    let _: () = redis.hset(app.keys().stock(event), ga, 5).await.unwrap();
    let _: () = redis.hdel(app.keys().sold_out(event), ga).await.unwrap();
    let late = app.buyers(5).await;
    assert_eq!(buy_one_each(&app, event, ga, &late).await, vec![202; 5]);
    assert!(drained(&app, event).await);

    assert_eq!(
        ordered_units(&app.mysql, event).await,
        (10, 10),
        "MySQL took no more than the category has"
    );
    assert_eq!(committed(&app, ga).await, 10);
    for b in &late {
        let status = app.purchase_status(event, b).await;
        assert_eq!(status["status"], "FAILED", "{status}");
        assert_eq!(status["reason"], "sold out", "{status}");
    }
    let refused = scalar(
        &app.mysql,
        &format!("SELECT COUNT(*) FROM stock_log WHERE event_id = {event} AND status = 'REFUSED'"),
    )
    .await;
    assert_eq!(refused, 5);
    assert_eq!(
        app.stock(event, ga).await,
        0,
        "corrected down to what MySQL has"
    );
    let flag: Option<u8> = redis.hget(app.keys().sold_out(event), ga).await.unwrap();
    assert_eq!(flag, Some(1));
    let answer = buy_one_each(&app, event, ga, &app.buyers(1).await).await;
    assert_eq!(answer, vec![409], "sold out at admission again");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_refuses_a_seat_in_two_live_orders_and_a_buyer_over_the_limit() {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(small_sale(10, 1, 2, 1)).await;
    app.publish(event).await;
    let (ga, seated) = (categories[0], categories[1]);
    let buyers = app.buyers(2).await;
    let (owner, other) = (&buyers[0], &buyers[1]);
    let seat = json!({"category_id": seated, "seat_ids": ["1:1"]});
    assert_eq!(app.buy(event, owner, "seat", seat.clone()).await.0, 202);
    assert!(drained(&app, event).await);
    let status = app.purchase_status(event, owner).await;
    let order_no: u64 = status["order_no"].as_str().unwrap().parse().unwrap();
    let locked_for = scalar(
        &app.mysql,
        &format!(
            "SELECT order_no FROM seat WHERE category_id = {seated} AND row_no = 1 \
             AND col_no = 1 AND status = 'LOCKED'"
        ),
    )
    .await;
    assert_eq!(
        locked_for as u64, order_no,
        "locked by order creation itself"
    );
    // Redis forgets the seat's lock and the owner's share.
    let mut redis = app.redis.clone();
    let _: () = redis
        .hset(app.keys().seats(event, seated), "1:1", SeatState::FREE)
        .await
        .unwrap();
    let _: () = redis
        .hincr(app.keys().row_free(event, seated), 1, 1)
        .await
        .unwrap();
    let _: () = redis
        .hdel(app.keys().held(event), owner.user_id)
        .await
        .unwrap();
    assert_eq!(app.buy(event, other, "seat", seat).await.0, 202);
    let more = json!({"category_id": ga, "quantity": 1});
    assert_eq!(app.buy(event, owner, "more", more).await.0, 202);
    assert!(drained(&app, event).await);

    let taken = app.purchase_status(event, other).await;
    assert_eq!(taken["status"], "FAILED", "{taken}");
    assert_eq!(taken["reason"], "a chosen seat is taken", "{taken}");
    let over = app.purchase_status(event, owner).await;
    assert_eq!(over["status"], "FAILED", "{over}");
    assert_eq!(over["reason"], "over the per-user limit", "{over}");
    assert_eq!(
        ordered_units(&app.mysql, event).await,
        (1, 1),
        "only the first order"
    );
    let seat_now = scalar(
        &app.mysql,
        &format!(
            "SELECT order_no FROM seat WHERE category_id = {seated} AND row_no = 1 AND col_no = 1"
        ),
    )
    .await;
    assert_eq!(
        seat_now as u64, order_no,
        "the seat stays its first order's"
    );
    let held = scalar(
        &app.mysql,
        &format!(
            "SELECT units FROM user_hold WHERE event_id = {event} AND user_id = {}",
            owner.user_id
        ),
    )
    .await;
    assert_eq!(held, 1);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_behind_mysql_is_fenced_at_the_next_pass_and_rebuilt_exactly() {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(small_sale(20, 1, 1, 2)).await;
    app.publish(event).await;
    let ga = categories[0];
    assert_eq!(
        buy_one_each(&app, event, ga, &app.buyers(6).await).await,
        vec![202; 6]
    );
    assert!(drained(&app, event).await);
    // Redis as it was after two admissions: its counter and stock behind MySQL's orders.
    let mut redis = app.redis.clone();
    let meta = app.keys().event_meta(event);
    let epoch: u64 = redis.hget(&meta, "epoch").await.unwrap();
    let _: () = redis.hset(&meta, "seq", 2).await.unwrap();
    let _: () = redis.hset(app.keys().stock(event), ga, 18).await.unwrap();

    let (status, report) = app
        .post(&format!("/admin/events/{event}/reconcile"), json!({}))
        .await;
    assert_eq!(status, 200, "{report}");
    let actions = report["actions"].to_string();
    assert!(actions.contains("Redis was behind MySQL"), "{report}");
    assert!(actions.contains("rebuilt"), "{report}");
    assert_eq!(app.stock(event, ga).await, 14, "20 − the 6 units in orders");
    let rebuilt: u64 = redis.hget(&meta, "epoch").await.unwrap();
    assert!(rebuilt > epoch);
    let seq: u64 = redis.hget(&meta, "seq").await.unwrap();
    assert_eq!(seq, 6, "counts on from MySQL's largest admission number");
    assert_eq!(
        buy_one_each(&app, event, ga, &app.buyers(2).await).await,
        vec![202; 2]
    );
    assert!(drained(&app, event).await);
    assert_eq!(ordered_units(&app.mysql, event).await, (8, 8));
    app.stop().await;
}

/// The review's case, end to end: Redis restarted from an AOF cut back to an earlier
/// point of the sale. Admissions go on from the old state; the first reissued number
/// fences the event, the rebuild puts Redis right, and nothing breaks an invariant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_from_an_older_aof_oversells_nothing() {
    let _heavy = stampede_e2e::heavy().await;
    let redis_server = OwnRedis::start();
    let app = spawn_app_with(|s| {
        s.orders.enabled = true;
        s.redis.url = redis_server.url();
        s.reconcile.interval_s = 0;
    })
    .await;
    let (event, categories) = app.create_event(small_sale(30, 2, 5, 2)).await;
    app.publish(event).await;
    let (ga, seated) = (categories[0], categories[1]);
    let early = app.buyers(10).await;
    assert_eq!(buy_one_each(&app, event, ga, &early).await, vec![202; 10]);
    assert!(drained(&app, event).await);
    // The AOF as it is now (everysec: wait for the fsync), kept aside.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let aside = redis_server.aof_dir().with_extension("aside");
    copy_dir(&redis_server.aof_dir(), &aside);
    let later = app.buyers(15).await;
    assert_eq!(buy_one_each(&app, event, ga, &later).await, vec![202; 15]);
    for (i, b) in later.iter().take(5).enumerate() {
        let body = json!({"category_id": seated, "seat_ids": [format!("1:{}", i + 1)]});
        assert_eq!(app.buy(event, b, "seat", body).await.0, 202);
    }
    assert!(drained(&app, event).await);
    assert_eq!(ordered_units(&app.mysql, event).await, (30, 30));
    redis_server.kill9();
    std::fs::remove_dir_all(redis_server.aof_dir()).unwrap();
    std::fs::rename(&aside, redis_server.aof_dir()).unwrap();
    redis_server.restart();

    // MySQL: 25 of the 30 GA units and 5 of the 10 seats in orders. Redis, from the
    // older AOF, believes 20 GA units and every seat are free.
    let newcomers = app.buyers(25).await;
    let answers = buy_one_each(&app, event, ga, &newcomers).await;
    for (i, b) in newcomers.iter().take(5).enumerate() {
        let body = json!({"category_id": seated, "seat_ids": [format!("1:{}", i + 1)]});
        app.buy(event, b, "seat", body).await;
    }
    let settled = eventually(Duration::from_secs(60), || async {
        // The test's own connection died with the old Redis: a new one.
        let Ok(mut redis) = redis::Client::open(redis_server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
        else {
            return false;
        };
        let queued: Option<u64> = redis.xlen(app.keys().order_stream(event)).await.ok();
        let stock: Option<i64> = redis.hget(app.keys().stock(event), ga).await.ok();
        queued == Some(0) && stock == Some(5)
    })
    .await;
    let mut fresh = redis::Client::open(redis_server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let queued: u64 = fresh.xlen(app.keys().order_stream(event)).await.unwrap();
    let stock: Option<i64> = fresh.hget(app.keys().stock(event), ga).await.unwrap();
    assert!(
        settled,
        "not settled: {queued} queued, stock {stock:?}; answers {answers:?}"
    );
    let ga_units = scalar(
        &app.mysql,
        &format!(
            "SELECT CAST(COALESCE(SUM(quantity), 0) AS SIGNED) FROM ({}) o",
            stampede_e2e::over_shards(&format!(
                "SELECT quantity FROM {{orders}} WHERE category_id = {ga} AND status IN ('UNPAID', 'PAID')"
            ))
        ),
    )
    .await;
    assert_eq!(
        ga_units, 25,
        "nothing the rewound Redis admitted became an order"
    );
    let seats_twice = scalar(
        &app.mysql,
        &format!(
            "SELECT COUNT(*) FROM (SELECT row_no, col_no FROM ({}) s GROUP BY row_no, col_no HAVING COUNT(*) > 1) t",
            stampede_e2e::over_shards(&format!(
                "SELECT i.row_no, i.col_no FROM {{items}} i JOIN {{orders}} o ON o.order_no = i.order_no \
                 WHERE o.event_id = {event} AND o.status IN ('UNPAID', 'PAID') AND i.row_no IS NOT NULL"
            ))
        ),
    )
    .await;
    assert_eq!(seats_twice, 0, "no seat in two live orders");
    let over_limit = scalar(
        &app.mysql,
        &format!("SELECT COUNT(*) FROM user_hold WHERE event_id = {event} AND units > 2"),
    )
    .await;
    assert_eq!(over_limit, 0);
    // Every 202 is terminal: CREATED, or FAILED with a reason (a reservation the
    // rebuild dropped says so).
    for (b, _) in newcomers.iter().zip(&answers).filter(|(_, a)| **a == 202) {
        let status = app.purchase_status(event, b).await;
        let word = status["status"].as_str().unwrap_or_default();
        assert!(["CREATED", "FAILED"].contains(&word), "{status}");
    }
    let rewinds = scalar(
        &app.mysql,
        &format!("SELECT redis_epoch FROM event WHERE id = {event}"),
    )
    .await;
    assert!(rewinds >= 2, "rebuilt after the restart (epoch {rewinds})");
    // The sale goes on from MySQL's books: the 5 units left, then sold out.
    let last = app.buyers(6).await;
    let answers = buy_one_each(&app, event, ga, &last).await;
    assert_eq!(answers, vec![202, 202, 202, 202, 202, 409], "{answers:?}");
    let done = eventually(Duration::from_secs(30), || async {
        ordered_units(&app.mysql, event).await == (35, 35)
    })
    .await;
    assert!(done, "{:?}", ordered_units(&app.mysql, event).await);
    app.stop().await;
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// Redis hung (SIGSTOP) while a buyer presses buy: the answer is true — not a 500 — and
/// once Redis wakes the buyer learns what became of the purchase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_redis_never_answered_is_outcome_unknown_and_then_known() {
    let _heavy = stampede_e2e::heavy().await;
    let redis_server = OwnRedis::start();
    let app = spawn_app_with(|s| {
        s.orders.enabled = true;
        s.redis.url = redis_server.url();
    })
    .await;
    let (event, categories) = app.create_event(small_sale(10, 1, 2, 2)).await;
    app.publish(event).await;
    let ga = categories[0];
    let buyers = app.buyers(2).await;
    let (first, buyer) = (&buyers[0], &buyers[1]);
    let body = json!({"category_id": ga, "quantity": 1});
    // Redis knows the script by its hash from here on (a hung EVALSHA of a script it has
    // never seen would just fail, with nothing admitted: also the truth).
    assert_eq!(app.buy(event, first, "k", body.clone()).await.0, 202);

    redis_server.hang(true);
    let (status, answer) = app.buy(event, buyer, "k", body.clone()).await;
    let seats = app
        .http
        .get(format!(
            "{}/api/events/{event}/seats?category={}",
            app.public_url, categories[1]
        ))
        .bearer_auth(&buyer.token)
        .send()
        .await
        .unwrap();
    let (seats_status, seats_body) = (seats.status().as_u16(), seats.text().await.unwrap());
    let (stats_status, stats) = app.get(&format!("/admin/events/{event}/stats")).await;
    redis_server.hang(false);

    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "OUTCOME_UNKNOWN", "{answer}");
    assert_eq!(
        answer["error"]["status_url"],
        format!("/api/events/{event}/orders/status")
    );
    assert_eq!(seats_status, 503, "{seats_body}");
    assert!(seats_body.contains("Redis is unavailable"), "{seats_body}");
    assert_eq!(stats_status, 200, "{stats}");
    assert!(stats["redis_unavailable"].is_string(), "{stats}");
    assert!(
        stats["categories"][0]["redis_available"].is_null(),
        "{stats}"
    );
    // Redis ran the script once it woke: the purchase was admitted after all.
    let known = eventually(Duration::from_secs(20), || async {
        app.purchase_status(event, buyer).await["status"] == "CREATED"
    })
    .await;
    assert!(known, "{}", app.purchase_status(event, buyer).await);
    let (again, first) = app.buy(event, buyer, "k", body).await;
    assert_eq!(again, 202, "the same key answers the first answer: {first}");
    let both = eventually(Duration::from_secs(20), || async {
        ordered_units(&app.mysql, event).await == (2, 2)
    })
    .await;
    assert!(both, "{:?}", ordered_units(&app.mysql, event).await);
    app.stop().await;
}
