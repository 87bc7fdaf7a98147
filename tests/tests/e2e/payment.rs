//! Paying for an order: the provider's callback in the window, late, and many at once.

use redis::AsyncCommands;
use serde_json::json;
use stampede_core::keys::Bucket;
use stampede_core::keys::SeatState;
use stampede_e2e::{TestApp, scalar, small_sale, spawn_app_with};

use crate::lifecycle::{call, created};

/// Posts a callback signed with `secret`; status and body.
pub(crate) async fn callback(
    app: &TestApp,
    secret: &str,
    txn: &str,
    order_no: u64,
    amount: u64,
) -> (u16, serde_json::Value) {
    let body = serde_json::to_vec(
        &json!({"provider_txn_id": txn, "order_no": order_no.to_string(), "amount_cents": amount}),
    )
    .unwrap();
    let signature = stampede_core::lifecycle::pay::sign(secret.as_bytes(), &body);
    let resp = app
        .http
        .post(format!("{}/api/payments/callback", app.public_url))
        .header("X-Signature", signature)
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or_default(),
    )
}

pub(crate) fn provider_secret(app: &TestApp) -> String {
    // test_settings' provider secret: "provider-<tag>-key", the tag from the database name.
    let tag: u64 = app
        .database
        .trim_start_matches("stampede_t_")
        .parse()
        .unwrap();
    format!("provider-{tag:016x}-key")
}

/// An unpaid order past its payment window is being cancelled: starting a payment for
/// it is refused (409 NOT_PAYABLE, saying the window passed), not handed to the
/// provider to land on a cancelled order and wait for a refund. Here the deadline is
/// moved into the past in MySQL, before the timeout cancels the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_is_not_started_past_the_orders_window() {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(small_sale(10, 1, 1, 2)).await;
    app.publish(event).await;
    let buyer = &app.buyers(1).await[0];
    let ga = json!({"category_id": categories[0], "quantity": 1});
    assert_eq!(app.buy(event, buyer, "a", ga).await.0, 202);
    let order_no = created(&app, event, buyer).await;
    let path = format!("/api/orders/{order_no}/pay");
    let pay = || call(&app, reqwest::Method::POST, &path, buyer);
    assert_eq!(pay().await.0, 200, "in the window");
    stampede_e2e::update_order(
        &app.mysql,
        order_no,
        "pay_deadline = UTC_TIMESTAMP(3) - INTERVAL 1 SECOND",
    )
    .await;
    let (status, answer) = pay().await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (409, Some("NOT_PAYABLE")),
        "{answer}"
    );
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("payment window passed")),
        "{answer}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_in_the_window_marks_the_order_paid_and_its_seats_sold_once() {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(small_sale(10, 2, 2, 4)).await;
    app.publish(event).await;
    let seated = categories[1];
    let buyer = &app.buyers(1).await[0];
    assert_eq!(
        app.buy(
            event,
            buyer,
            "a",
            json!({"category_id": seated, "seat_ids": ["2:1", "2:2"]})
        )
        .await
        .0,
        202
    );
    let order_no = created(&app, event, buyer).await;
    let (status, start) = call(
        &app,
        reqwest::Method::POST,
        &format!("/api/orders/{order_no}/pay"),
        buyer,
    )
    .await;
    assert_eq!(
        (status, start["amount_cents"].as_u64()),
        (200, Some(18_000)),
        "{start}"
    );

    let secret = provider_secret(&app);
    let (status, body) =
        callback(&app, "not-the-provider-secret", "forged", order_no, 18_000).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("UNAUTHORIZED")),
        "forged"
    );
    // The wrong amount: refused, the order unchanged, the money recorded for refund;
    // delivered again, the same answer.
    for _ in 0..2 {
        let (status, body) = callback(&app, &secret, "short", order_no, 100).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (409, Some("AMOUNT_MISMATCH")),
            "{body}"
        );
    }
    assert_eq!(
        scalar(
            &app.mysql,
            &format!(
                "SELECT COUNT(*) FROM payment WHERE provider_txn_id = 'short' \
                 AND order_no = {order_no} AND amount_cents = 100 AND status = 'REFUND_PENDING'"
            )
        )
        .await,
        1
    );

    // Paid before its batch's settle marked it CREATED (a settle waiting to be
    // replayed): the status still says QUEUED for this order, and the payment moves it.
    let () = app
        .redis
        .clone()
        .hset(
            app.keys().purchase_status(Bucket::only(event)),
            buyer.user_id,
            format!("QUEUED:{order_no}"),
        )
        .await
        .unwrap();
    // stampede-paysim plays the provider, posting the same callback twice.
    let secret_file = std::env::temp_dir().join(format!("{}.provider", app.database));
    std::fs::write(&secret_file, &secret).unwrap();
    let out = tokio::process::Command::new(stampede_e2e::paysim_binary())
        .args([
            "pay",
            "--url",
            &format!("{}/api/payments/callback", app.public_url),
        ])
        .args([
            "--secret-file",
            secret_file.to_str().unwrap(),
            "--order-no",
            &order_no.to_string(),
        ])
        .args([
            "--amount-cents",
            "18000",
            "--txn-id",
            "txn-1",
            "--times",
            "2",
        ])
        .output()
        .await
        .unwrap();
    std::fs::remove_file(&secret_file).ok();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = printed.lines().collect();
    assert!(
        lines[0].contains("200") && lines[0].contains("\"PAID\""),
        "{printed}"
    );
    assert!(
        lines[1].contains("200") && lines[1].contains("\"DUPLICATE\""),
        "{printed}"
    );

    let (_, order) = call(
        &app,
        reqwest::Method::GET,
        &format!("/api/orders/{order_no}"),
        buyer,
    )
    .await;
    assert_eq!(order["status"], "PAID");
    assert_eq!(
        scalar(
            &app.mysql,
            &format!("SELECT COUNT(*) FROM seat WHERE order_no = {order_no} AND status = 'SOLD'")
        )
        .await,
        2
    );
    assert_eq!(
        scalar(
            &app.mysql,
            &format!(
                "SELECT COUNT(*) FROM payment WHERE order_no = {order_no} AND status = 'APPLIED'"
            )
        )
        .await,
        1
    );
    let seat: String = app
        .redis
        .clone()
        .hget(app.keys().seats(Bucket::only(event), seated), "2:1")
        .await
        .unwrap();
    assert_eq!(
        SeatState::parse(&seat),
        Some(SeatState::Sold(stampede_core::domain::OrderNo(order_no)))
    );
    let (_, status) = call(
        &app,
        reqwest::Method::GET,
        &format!("/api/events/{event}/orders/status"),
        buyer,
    )
    .await;
    assert_eq!(status["status"], "PAID");
    // The first delivery committed but Redis never heard (its answer lost, its core
    // stopped before marking): the provider's next delivery marks the seats and the
    // status, and still answers DUPLICATE, changing nothing in MySQL.
    let mut r = app.redis.clone();
    let b = Bucket::only(event);
    let () = r
        .hset(app.keys().seats(b, seated), "2:1", format!("L:{order_no}"))
        .await
        .unwrap();
    let () = r
        .hset(
            app.keys().purchase_status(b),
            buyer.user_id,
            format!("CREATED:{order_no}"),
        )
        .await
        .unwrap();
    let (status, body) = callback(&app, &secret, "txn-1", order_no, 18_000).await;
    assert_eq!(
        (status, body["result"].as_str(), body["recorded"].as_str()),
        (200, Some("DUPLICATE"), Some("PAID")),
        "{body}"
    );
    let seat: String = r.hget(app.keys().seats(b, seated), "2:1").await.unwrap();
    assert_eq!(
        SeatState::parse(&seat),
        Some(SeatState::Sold(stampede_core::domain::OrderNo(order_no))),
        "the replayed delivery marked the seat sold"
    );
    let status = app.purchase_status(event, buyer).await;
    assert_eq!(status["status"], "PAID", "{status}");
    assert_eq!(
        scalar(
            &app.mysql,
            &format!(
                "SELECT COUNT(*) FROM payment WHERE order_no = {order_no} AND status = 'APPLIED'"
            )
        )
        .await,
        1
    );
    let (_, stats) = app.get(&format!("/admin/events/{event}/stats")).await;
    assert_eq!(stats["refunds_pending"], 1, "the wrong amount's: {stats}");
    let (status, again) = call(
        &app,
        reqwest::Method::POST,
        &format!("/api/orders/{order_no}/cancel"),
        buyer,
    )
    .await;
    assert_eq!(
        (status, again["error"]["code"].as_str()),
        (409, Some("NOT_CANCELLABLE")),
        "a paid order stays paid"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_after_the_cancellation_is_recorded_for_refund() {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(small_sale(10, 1, 1, 4)).await;
    app.publish(event).await;
    let buyer = &app.buyers(1).await[0];
    assert_eq!(
        app.buy(
            event,
            buyer,
            "a",
            json!({"category_id": categories[0], "quantity": 2})
        )
        .await
        .0,
        202
    );
    let order_no = created(&app, event, buyer).await;
    assert_eq!(
        call(
            &app,
            reqwest::Method::POST,
            &format!("/api/orders/{order_no}/cancel"),
            buyer
        )
        .await
        .0,
        200
    );

    let (status, body) = callback(&app, &provider_secret(&app), "late-txn", order_no, 10_000).await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("REFUND_PENDING")),
        "{body}"
    );
    // Delivered again (its answer lost on the way): what the first one was recorded as.
    let (status, body) = callback(&app, &provider_secret(&app), "late-txn", order_no, 10_000).await;
    assert_eq!(
        (status, body["result"].as_str(), body["recorded"].as_str()),
        (200, Some("DUPLICATE"), Some("REFUND_PENDING")),
        "{body}"
    );
    let (_, order) = call(
        &app,
        reqwest::Method::GET,
        &format!("/api/orders/{order_no}"),
        buyer,
    )
    .await;
    assert_eq!(order["status"], "CANCELLED", "never silently accepted");
    let (_, stats) = app.get(&format!("/admin/events/{event}/stats")).await;
    assert_eq!(stats["refunds_pending"], 1, "{stats}");
    let stock: i64 = app.stock(event, categories[0]).await;
    assert_eq!(stock, 10, "the cancelled units stay on sale");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deliveries_of_one_payment_answer_paid_once_and_duplicate_never_500() {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(small_sale(10, 2, 2, 4)).await;
    app.publish(event).await;
    let buyers = app.buyers(2).await;
    let (buyer, other) = (&buyers[0], &buyers[1]);
    let body = json!({"category_id": categories[0], "quantity": 2});
    assert_eq!(app.buy(event, buyer, "a", body.clone()).await.0, 202);
    let order_no = created(&app, event, buyer).await;
    assert_eq!(app.buy(event, other, "a", body).await.0, 202);
    let others = created(&app, event, other).await;
    let secret = provider_secret(&app);
    let app = std::sync::Arc::new(app);
    let mut deliveries = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (app, secret) = (app.clone(), secret.clone());
        deliveries
            .spawn(async move { callback(&app, &secret, "txn-race", order_no, 10_000).await });
    }
    let mut results = Vec::new();
    while let Some(answer) = deliveries.join_next().await {
        let (status, body) = answer.unwrap();
        assert_eq!(status, 200, "{body}");
        let said = |field: &str| body[field].as_str().map(str::to_owned);
        results.push((said("result"), said("recorded")));
    }
    results.sort();
    // Each repeat says what the one that paid was recorded as.
    let duplicate = (Some("DUPLICATE".to_owned()), Some("PAID".to_owned()));
    let mut expected = vec![duplicate; 7];
    expected.push((Some("PAID".to_owned()), None));
    assert_eq!(results, expected);
    let payments = scalar(
        &app.mysql,
        &format!("SELECT COUNT(*) FROM payment WHERE order_no = {order_no}"),
    )
    .await;
    assert_eq!(payments, 1);
    // The same transaction for another order: it paid this one, nothing there.
    let (status, body) = callback(&app, &secret, "txn-race", others, 10_000).await;
    assert_eq!(
        (status, body["result"].as_str(), body["recorded"].as_str()),
        (200, Some("DUPLICATE"), Some("OTHER_ORDER")),
        "{body}"
    );
    let (_, order) = call(
        &app,
        reqwest::Method::GET,
        &format!("/api/orders/{others}"),
        other,
    )
    .await;
    assert_eq!(order["status"], "UNPAID", "{order}");
    let app = std::sync::Arc::into_inner(app).unwrap();
    app.stop().await;
}
