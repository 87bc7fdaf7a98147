use stampede_core::keys::Bucket;
use std::collections::HashMap;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;
use stampede_core::keys::SeatState;
use stampede_e2e::{concert, eventually, spawn_app, spawn_app_with};

#[tokio::test]
async fn creating_an_event_writes_it_its_categories_and_seats_to_mysql() {
    let app = spawn_app().await;
    let (id, categories) = app.create_event(concert()).await;
    assert_eq!(categories.len(), 2);
    assert_eq!(app.event_status(id).await, "DRAFT");
    let sql =
        format!("SELECT SUM(total) FROM ticket_category WHERE event_id = {id} AND remain = total");
    assert_eq!(app.count(&sql).await, 500);
    let sql = format!("SELECT COUNT(*) FROM seat WHERE event_id = {id} AND status = 'FREE'");
    assert_eq!(app.count(&sql).await, 200);

    let (status, event) = app.get(&format!("/admin/events/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(event["title"], "Concert");
    assert_eq!(
        event["categories"][1]["seats"],
        json!({"rows": 10, "cols": 20})
    );
    let (status, _) = app.get("/admin/events/999999").await;
    assert_eq!(status, 404);
    app.stop().await;
}

/// Names the API takes as different are different categories in MySQL too (the fuzzer
/// found two emoji that the old collation took for one: a 500).
#[tokio::test]
async fn category_names_that_differ_only_in_case_or_as_emoji_are_two_categories() {
    let app = spawn_app().await;
    let mut body = concert();
    body["categories"] = json!([
        {"name": "GA", "price_cents": 1, "quantity": 1},
        {"name": "ga", "price_cents": 1, "quantity": 1},
        {"name": "\u{1D962}", "price_cents": 1, "quantity": 1},
        {"name": "\u{FFD1D}", "price_cents": 1, "quantity": 1},
        {"name": "e\u{301}", "price_cents": 1, "quantity": 1},
        {"name": "\u{E9}", "price_cents": 1, "quantity": 1},
    ]);
    let (id, categories) = app.create_event(body).await;
    assert_eq!(categories.len(), 6);
    let names = format!("SELECT COUNT(DISTINCT name) FROM ticket_category WHERE event_id = {id}");
    assert_eq!(app.count(&names).await, 6);
    app.stop().await;
}

#[tokio::test]
async fn bad_admin_input_gets_400_and_leaves_no_rows() {
    let app = spawn_app().await;
    let with = |pointer: &str, value: serde_json::Value| {
        let mut body = concert();
        *body.pointer_mut(pointer).unwrap() = value;
        body
    };
    let mut unknown_field = concert();
    unknown_field["colour"] = json!("red");
    for (why, body) in [
        (
            "sale window reversed",
            with("/sale_start", json!("2031-06-01T13:00:00Z")),
        ),
        ("not a time", with("/show_time", json!("next friday"))),
        ("no categories", with("/categories", json!([]))),
        ("zero rows", with("/categories/1/seats/rows", json!(0))),
        (
            "negative quantity",
            with("/categories/0/quantity", json!(-5)),
        ),
        ("unknown field", unknown_field),
    ] {
        let (status, answer) = app.post("/admin/events", body).await;
        assert_eq!(status, 400, "{why}: {answer}");
        assert_eq!(answer["error"]["code"], "INVALID", "{why}");
        assert!(
            !answer["error"]["message"].as_str().unwrap().is_empty(),
            "{why}"
        );
    }
    let raw = app
        .http
        .post(format!("{}/admin/events", app.admin_url))
        .bearer_auth(&app.admin_token)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    for table in ["event", "ticket_category", "seat"] {
        assert_eq!(
            app.count(&format!("SELECT COUNT(*) FROM {table}")).await,
            0,
            "{table}"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn publishing_preloads_stock_seats_and_the_sale_window_into_redis() {
    let app = spawn_app().await;
    let (id, categories) = app.create_event(concert()).await;
    let (ga, seated) = (categories[0], categories[1]);
    assert_eq!(app.publish(id).await["status"], "PUBLISHED");
    assert_eq!(app.event_status(id).await, "PUBLISHED");

    let mut r = app.redis.clone();
    let stock: HashMap<u64, i64> = r.hgetall(app.keys().stock(Bucket::only(id))).await.unwrap();
    assert_eq!(stock, HashMap::from([(ga, 300), (seated, 200)]));
    let seats: HashMap<String, String> = r
        .hgetall(app.keys().seats(Bucket::only(id), seated))
        .await
        .unwrap();
    assert_eq!(seats.len(), 200);
    assert!(seats.values().all(|s| s == SeatState::FREE));
    assert_eq!(
        seats.get("10:20").map(String::as_str),
        Some(SeatState::FREE)
    );
    let row_free: Vec<u32> = r
        .hvals(app.keys().row_free(Bucket::only(id), seated))
        .await
        .unwrap();
    assert_eq!(row_free, vec![20; 10]);
    let meta: HashMap<String, String> = r.hgetall(app.keys().event_meta(id)).await.unwrap();
    assert_eq!(meta["status"], "open");
    assert_eq!(meta["sale_start_ms"], "1577836800000");
    assert_eq!(meta["per_user_limit"], "4");
    assert_eq!(meta["categories"], format!("{ga},{seated}"));
    let index: String = r.hget(app.keys().sales_index(), id).await.unwrap();
    assert_eq!(index, "open:1577836800000:1938081600000");
    app.stop().await;
}

#[tokio::test]
async fn publishing_again_during_a_sale_never_resets_stock() {
    let app = spawn_app().await;
    let (id, categories) = app.create_event(concert()).await;
    app.publish(id).await;
    let mut r = app.redis.clone();
    let stock_key = app.keys().stock(Bucket::only(id));
    // A sale has taken 7 units.
    let _: i64 = r.hincr(&stock_key, categories[0], -7).await.unwrap();
    let again = app.publish(id).await;
    assert_eq!(
        again["preload"],
        json!({"stock_written": 0, "seat_maps_written": 0, "epoch": 0})
    );
    let left: i64 = r.hget(&stock_key, categories[0]).await.unwrap();
    assert_eq!(left, 293);
    app.stop().await;
}

#[tokio::test]
async fn close_and_reopen_move_the_sale_in_mysql_and_redis() {
    let app = spawn_app().await;
    let (id, _) = app.create_event(concert()).await;
    let (status, body) = app
        .post(&format!("/admin/events/{id}/close"), json!({}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("INVALID_STATE")),
        "a draft cannot be closed"
    );

    app.publish(id).await;
    let (status, _) = app
        .post(&format!("/admin/events/{id}/close"), json!({}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(app.event_status(id).await, "CLOSED");
    let mut r = app.redis.clone();
    let meta = app.keys().event_meta(id);
    assert_eq!(
        r.hget::<_, _, String>(&meta, "status").await.unwrap(),
        "closed"
    );
    assert!(
        r.hget::<_, _, String>(app.keys().sales_index(), id)
            .await
            .unwrap()
            .starts_with("closed:")
    );
    let (status, _) = app
        .post(&format!("/admin/events/{id}/publish"), json!({}))
        .await;
    assert_eq!(status, 409, "a closed sale is reopened, not published");

    let (status, body) = app
        .post(&format!("/admin/events/{id}/reopen"), json!({}))
        .await;
    assert_eq!((status, body["status"].as_str()), (200, Some("PUBLISHED")));
    assert_eq!(
        r.hget::<_, _, String>(&meta, "status").await.unwrap(),
        "open"
    );
    assert_eq!(app.event_status(id).await, "PUBLISHED");
    app.stop().await;
}

#[tokio::test]
async fn the_scheduler_preloads_a_published_event_whose_keys_are_gone() {
    // The reconciler off: its passes rebuild missing keys too.
    let app = spawn_app_with(|s| s.reconcile.interval_s = 0).await;
    let r = app.redis.clone();
    // All of its keys gone; its stock alone (the scheduler finds the bucket count in the
    // metadata left, and MySQL is not read for a sale whose keys are all there); its
    // stock, with a metadata bucket count that does not parse (MySQL's then).
    for case in ["all", "stock", "stock and a garbled count"] {
        let (id, _) = app.create_event(concert()).await;
        app.publish(id).await;
        let (meta, stock) = (
            app.keys().event_meta(id),
            app.keys().stock(Bucket::only(id)),
        );
        match case {
            "all" => r.clone().del::<_, ()>(&[&meta, &stock]).await.unwrap(),
            "stock" => r.clone().del::<_, ()>(&stock).await.unwrap(),
            _ => {
                let _: () = r.clone().hset(&meta, "buckets", "x").await.unwrap();
                r.clone().del::<_, ()>(&stock).await.unwrap()
            }
        }
        let back = eventually(Duration::from_secs(5), || {
            let (mut r, meta, stock) = (r.clone(), meta.clone(), stock.clone());
            async move {
                r.exists::<_, bool>(&stock).await.unwrap()
                    && r.exists::<_, bool>(&meta).await.unwrap()
            }
        })
        .await;
        assert!(
            back,
            "{case}: the scheduler did not preload the event again within 5 s"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn stats_show_every_category_with_redis_and_mysql_figures() {
    let app = spawn_app().await;
    let (id, _) = app.create_event(concert()).await;
    let (status, before) = app.get(&format!("/admin/events/{id}/stats")).await;
    assert_eq!(status, 200);
    assert_eq!(before["categories"][0]["redis_available"], json!(null));
    // Not loaded: every unit is missing from Redis.
    assert_eq!(before["categories"][0]["gap"], 300);
    app.publish(id).await;
    let (_, stats) = app.get(&format!("/admin/events/{id}/stats")).await;
    let ga = &stats["categories"][0];
    for field in [
        "category_id",
        "name",
        "total",
        "redis_available",
        "queued",
        "unpaid",
        "paid",
        "gap",
        "db_remain",
        "unsynced",
        "remain_gap",
    ] {
        assert!(ga.get(field).is_some(), "missing {field} in {ga}");
    }
    assert_eq!(
        (ga["gap"].as_i64(), ga["remain_gap"].as_i64()),
        (Some(0), Some(0))
    );
    assert_eq!(stats["loaded"], true);
    assert_eq!(
        (
            ga["total"].as_u64(),
            ga["redis_available"].as_i64(),
            ga["db_remain"].as_i64()
        ),
        (Some(300), Some(300), Some(300))
    );
    assert_eq!(stats["categories"][1]["total"], 200);
    let (status, _) = app.get("/admin/events/999999/stats").await;
    assert_eq!(status, 404);
    app.stop().await;
}

#[tokio::test]
async fn admin_calls_need_the_admin_token() {
    let app = spawn_app().await;
    for token in [None, Some("wrong-token-of-good-length")] {
        let mut req = app
            .http
            .post(format!("{}/admin/events", app.admin_url))
            .json(&concert());
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 401);
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "UNAUTHORIZED");
    }
    assert_eq!(app.count("SELECT COUNT(*) FROM event").await, 0);
    let metrics = app
        .http
        .get(format!("{}/metrics", app.admin_url))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 401);
    app.stop().await;
}
