//! The order lifecycle: the owner's view and cancel, and cancellation at the deadline.

use stampede_core::keys::Bucket;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;
use stampede_core::keys::SeatState;
use stampede_e2e::{Buyer, TestApp, eventually, scalar, small_sale, spawn_app_with};

/// Waits until the buyer's purchase is CREATED; its order number.
pub(crate) async fn created(app: &TestApp, event: u64, buyer: &Buyer) -> u64 {
    let mut order_no = None;
    for _ in 0..100 {
        let status = app.purchase_status(event, buyer).await;
        if status["status"] == "CREATED" {
            order_no = status["order_no"].as_str().map(|s| s.parse().unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    order_no.expect("the purchase became an order within 10 s")
}

/// `POST /api/orders/{order_no}/cancel` as `buyer`: the status and the answer.
pub(crate) async fn cancel(
    app: &TestApp,
    order_no: impl std::fmt::Display,
    buyer: &Buyer,
) -> (u16, serde_json::Value) {
    call(
        app,
        reqwest::Method::POST,
        &format!("/api/orders/{order_no}/cancel"),
        buyer,
    )
    .await
}

pub(crate) async fn call(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    buyer: &Buyer,
) -> (u16, serde_json::Value) {
    let resp = app
        .http
        .request(method, format!("{}{path}", app.public_url))
        .bearer_auth(&buyer.token)
        .send()
        .await
        .unwrap();
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_sees_and_cancels_an_unpaid_order_and_nobody_else_can() {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(small_sale(10, 2, 2, 4)).await;
    app.publish(event).await;
    let (ga, seated) = (categories[0], categories[1]);
    let buyers = app.buyers(2).await;
    let (owner, other) = (&buyers[0], &buyers[1]);
    assert_eq!(
        app.buy(
            event,
            owner,
            "a",
            json!({"category_id": seated, "seat_ids": ["1:1", "1:2"]})
        )
        .await
        .0,
        202
    );
    let order_no = created(&app, event, owner).await;

    let (status, order) = call(
        &app,
        reqwest::Method::GET,
        &format!("/api/orders/{order_no}"),
        owner,
    )
    .await;
    assert_eq!(status, 200, "{order}");
    assert_eq!(
        (order["status"].as_str(), order["quantity"].as_u64()),
        (Some("UNPAID"), Some(2))
    );
    assert_eq!(order["seats"], json!(["1:1", "1:2"]));
    assert_eq!(order["amount_cents"], 18_000);
    for method in [reqwest::Method::GET] {
        assert_eq!(
            call(&app, method, &format!("/api/orders/{order_no}"), other)
                .await
                .0,
            404
        );
    }
    assert_eq!(
        call(
            &app,
            reqwest::Method::POST,
            &format!("/api/orders/{order_no}/cancel"),
            other
        )
        .await
        .0,
        404
    );

    // Cancelled before its batch's settle marked it CREATED (a settle waiting to be
    // replayed): the status still says QUEUED for this order, and the cancel moves it.
    let () = app
        .redis
        .clone()
        .hset(
            app.keys().purchase_status(Bucket::only(event)),
            owner.user_id,
            format!("QUEUED:{order_no}"),
        )
        .await
        .unwrap();
    let (status, cancelled) = call(
        &app,
        reqwest::Method::POST,
        &format!("/api/orders/{order_no}/cancel"),
        owner,
    )
    .await;
    assert_eq!(
        (status, cancelled["status"].as_str()),
        (200, Some("CANCELLED")),
        "{cancelled}"
    );
    let purchase = app.purchase_status(event, owner).await;
    assert_eq!(
        (purchase["status"].as_str(), purchase["order_no"].as_str()),
        (Some("CANCELLED"), Some(order_no.to_string().as_str())),
        "{purchase}"
    );
    let (status, again) = call(
        &app,
        reqwest::Method::POST,
        &format!("/api/orders/{order_no}/cancel"),
        owner,
    )
    .await;
    assert_eq!(
        (status, again["error"]["code"].as_str()),
        (409, Some("NOT_CANCELLABLE"))
    );

    let mut r = app.redis.clone();
    let stock: i64 = app.stock(event, seated).await;
    assert_eq!(stock, 4, "both seats back on sale, once");
    let seat: String = r
        .hget(app.keys().seats(Bucket::only(event), seated), "1:1")
        .await
        .unwrap();
    assert_eq!(SeatState::parse(&seat), Some(SeatState::Free));
    let held: Option<i64> = r
        .hget(app.keys().held(Bucket::only(event)), owner.user_id)
        .await
        .unwrap();
    assert_eq!(held, None, "the owner's limit is free again");
    let synced_back = eventually(Duration::from_secs(10), || async {
        scalar(
            &app.mysql,
            &format!("SELECT remain FROM ticket_category WHERE id = {seated}"),
        )
        .await
            == 4
    })
    .await;
    assert!(synced_back, "MySQL remain is back to 4");
    assert_eq!(
        scalar(
            &app.mysql,
            &format!("SELECT COUNT(*) FROM seat WHERE category_id = {seated} AND status = 'FREE'")
        )
        .await,
        4
    );
    // The owner can buy again: the same seats, even.
    assert_eq!(
        app.buy(
            event,
            owner,
            "b",
            json!({"category_id": seated, "seat_ids": ["1:1"]})
        )
        .await
        .0,
        202
    );
    let _ = ga;
    app.stop().await;
}

/// A cancel locks nothing before the order is known to be the caller's: not another
/// buyer's order row (their payment would wait), not the gap where a made-up number
/// would go (new orders are inserted there; not shown here: a gap lock never waits, so
/// a test cannot see one taken). Here the victim's order row is held by another
/// session: a cancel of it by someone else — of the victim's gene or not — still
/// answers 404 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_an_order_not_the_callers_locks_nothing() {
    use mysql_async::prelude::Queryable;
    use stampede_core::ids::gene;
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(small_sale(10, 1, 1, 4)).await;
    app.publish(event).await;
    // 65 buyers: two of them share a gene (64 genes), so the victim's order number is
    // one the attacker's gene could have.
    let buyers = app.buyers(65).await;
    let (victim, attacker) = buyers
        .iter()
        .enumerate()
        .find_map(|(i, a)| {
            buyers[i + 1..]
                .iter()
                .find(|b| gene(b.user_id) == gene(a.user_id))
                .map(|b| (a, b))
        })
        .expect("two buyers of one gene");
    let stranger = buyers
        .iter()
        .find(|b| gene(b.user_id) != gene(victim.user_id))
        .unwrap();
    let ga = json!({"category_id": categories[0], "quantity": 1});
    assert_eq!(app.buy(event, victim, "v", ga).await.0, 202);
    let order_no = created(&app, event, victim).await;
    let table = stampede_core::order_tables::orders(stampede_core::order_tables::shard_of(
        order_no,
        app.settings.mysql.order_shards,
    ));

    let mut holder = app.mysql.get_conn().await.unwrap();
    holder.query_drop("START TRANSACTION").await.unwrap();
    let held: Option<u64> = holder
        .exec_first(
            format!("SELECT order_no FROM {table} WHERE order_no = ? FOR UPDATE"),
            (order_no,),
        )
        .await
        .unwrap();
    assert_eq!(held, Some(order_no));
    for (who, number) in [(attacker, order_no), (stranger, order_no)] {
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(12), cancel(&app, number, who)).await;
        let (status, body) = answer.expect("the cancel waited on a lock it should never take");
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (404, Some("NOT_FOUND")),
            "{body}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a cancel of order {number} by user {} waited {:?} on the victim's lock",
            who.user_id,
            started.elapsed()
        );
    }
    holder.query_drop("ROLLBACK").await.unwrap();
    drop(holder);
    let (status, body) = cancel(&app, order_no, victim).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("CANCELLED")),
        "{body}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_unpaid_past_its_window_is_cancelled_and_its_unit_sold_again() {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let mut sale = small_sale(1, 1, 1, 1);
    sale["pay_timeout_s"] = json!(2);
    let (event, categories) = app.create_event(sale).await;
    app.publish(event).await;
    let ga = categories[0];
    let buyers = app.buyers(2).await;
    assert_eq!(
        app.buy(
            event,
            &buyers[0],
            "a",
            json!({"category_id": ga, "quantity": 1})
        )
        .await
        .0,
        202
    );
    let order_no = created(&app, event, &buyers[0]).await;
    let (status, body) = app
        .buy(
            event,
            &buyers[1],
            "b",
            json!({"category_id": ga, "quantity": 1}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("SOLD_OUT"))
    );

    // The batch's order-timeout message comes after 2 s and cancels the unpaid order:
    // MySQL first, then Redis gives the unit back and marks the buyer's purchase
    // CANCELLED in the same script, so once both say so the unit is on sale again.
    let cancelled = eventually(Duration::from_secs(20), || async {
        call(
            &app,
            reqwest::Method::GET,
            &format!("/api/orders/{order_no}"),
            &buyers[0],
        )
        .await
        .1["status"]
            == "CANCELLED"
            && app.purchase_status(event, &buyers[0]).await["status"] == "CANCELLED"
    })
    .await;
    assert!(
        cancelled,
        "the unpaid order was not cancelled after its window"
    );
    let (status, body) = app
        .buy(
            event,
            &buyers[1],
            "c",
            json!({"category_id": ga, "quantity": 1}),
        )
        .await;
    assert_eq!(status, 202, "the unit is on sale again: {body}");
    let resold = created(&app, event, &buyers[1]).await;
    assert_ne!(resold, order_no);
    app.stop().await;
}
