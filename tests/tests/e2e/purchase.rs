//! Admission against a core of the test's own (its public port, not through the edge).

use stampede_core::keys::Bucket;
use std::collections::HashMap;

use redis::AsyncCommands;
use serde_json::json;
use stampede_core::auth::token::TokenSigner;
use stampede_core::keys::SeatState;
use stampede_e2e::{TestApp, small_sale, spawn_app};

async fn sale(app: &TestApp, units: u32, rows: u32, cols: u32, limit: u32) -> (u64, u64, u64) {
    let (id, categories) = app.create_event(small_sale(units, rows, cols, limit)).await;
    app.publish(id).await;
    (id, categories[0], categories[1])
}

/// A buyer whose purchase's answer was lost asks for it by its Idempotency-Key, without
/// sending it again: the purchase that key admitted, whatever came after it; 404 for a
/// key that admitted nothing (a refused purchase's, another buyer's). With a request id
/// too, the purchase so numbered if that key admitted it. A malformed key is 400.
#[tokio::test]
async fn a_purchase_is_asked_for_by_its_idempotency_key() {
    let app = spawn_app().await;
    let (event, ga, _) = sale(&app, 2, 2, 2, 4).await;
    let buyers = app.buyers(2).await;
    let (buyer, other) = (&buyers[0], &buyers[1]);
    let one = |n: u32| json!({"category_id": ga, "quantity": n});
    let (status, first) = app.buy(event, buyer, "lost-answer", one(1)).await;
    assert_eq!(status, 202, "{first}");
    let first = first["request_id"].as_str().unwrap().to_owned();
    let (status, later) = app.buy(event, buyer, "later", one(1)).await;
    assert_eq!(status, 202, "{later}");
    let (status, refused) = app.buy(event, buyer, "refused", one(1)).await;
    assert_eq!(
        (status, &refused["error"]["code"]),
        (409, &json!("SOLD_OUT"))
    );

    let by_key = |who, key| app.purchase_status_asked(event, who, "", Some(key));
    assert_eq!(
        by_key(buyer, "lost-answer").await,
        (200, json!({"status": "QUEUED", "request_id": first})),
        "the first purchase, not the latest"
    );
    for nothing in ["refused", "never-sent"] {
        let (status, answer) = by_key(buyer, nothing).await;
        assert_eq!(
            (status, &answer["error"]["code"]),
            (404, &json!("NOT_FOUND")),
            "{answer}"
        );
    }
    let (status, answer) = by_key(other, "lost-answer").await;
    assert_eq!(status, 404, "another buyer's key: {answer}");
    // Both: the purchase so numbered, if that key admitted it.
    let key = Some("lost-answer");
    let numbered = |n: &str| format!("request_id={n}");
    assert_eq!(
        app.purchase_status_asked(event, buyer, &numbered(&first), key)
            .await,
        (200, json!({"status": "QUEUED", "request_id": first}))
    );
    let later = later["request_id"].as_str().unwrap().to_owned();
    let (status, answer) = app
        .purchase_status_asked(event, buyer, &numbered(&later), key)
        .await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (404, &json!("NOT_FOUND")),
        "{answer}"
    );
    let long = "k".repeat(65);
    for bad in [&b""[..], b" ", "é".as_bytes(), b"a\tb", long.as_bytes()] {
        let value = reqwest::header::HeaderValue::from_bytes(bad).unwrap();
        let answer = app
            .http
            .get(format!(
                "{}/api/events/{event}/orders/status",
                app.public_url
            ))
            .bearer_auth(&buyer.token)
            .header("Idempotency-Key", value)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 400, "{bad:?}");
        let answer: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(answer["error"]["code"], "INVALID", "{bad:?}: {answer}");
    }
    app.stop().await;
}

#[tokio::test]
async fn an_admitted_purchase_is_queued_with_its_order_number_in_redis() {
    let app = spawn_app().await;
    let (event, ga, _) = sale(&app, 10, 2, 2, 4).await;
    let buyer = &app.buyers(1).await[0];
    let (status, body) = app
        .buy(
            event,
            buyer,
            "k1",
            json!({"category_id": ga, "quantity": 3}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["status"], "QUEUED");
    let request_id: u64 = body["request_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        stampede_core::ids::gene(request_id),
        stampede_core::ids::gene(buyer.user_id),
        "the order number carries the user's gene"
    );

    assert_eq!(app.stock(event, ga).await, 7);
    let mut r = app.redis.clone();
    let held: u32 = r
        .hget(app.keys().held(Bucket::only(event)), buyer.user_id)
        .await
        .unwrap();
    assert_eq!(held, 3);
    let entries: redis::streams::StreamRangeReply = r
        .xrange_all(app.keys().order_stream(Bucket::only(event)))
        .await
        .unwrap();
    assert_eq!(entries.ids.len(), 1);
    let entry = stampede_core::orders::reservation::Reservation::from_entry(&entries.ids[0])
        .expect("reserve.lua's entry reads as a reservation");
    assert_eq!(entry.order_no.to_string(), request_id.to_string());
    assert_eq!(entry.user_id.0, buyer.user_id);
    assert_eq!(
        (entry.quantity, entry.seq, entry.journey),
        (3, Some(1), None)
    );

    let status = app.purchase_status_asked(event, buyer, "", None).await;
    assert_eq!(
        status,
        (
            200,
            json!({"status": "QUEUED", "request_id": request_id.to_string()})
        )
    );
    app.stop().await;
}

#[tokio::test]
async fn a_repeated_idempotency_key_gets_the_first_answer_and_reserves_nothing_more() {
    let app = spawn_app().await;
    let (event, ga, _) = sale(&app, 10, 2, 2, 4).await;
    let buyer = &app.buyers(1).await[0];
    let body = json!({"category_id": ga, "quantity": 2});
    let (_, first) = app.buy(event, buyer, "same-key", body.clone()).await;
    for _ in 0..3 {
        let (status, again) = app.buy(event, buyer, "same-key", body.clone()).await;
        assert_eq!(status, 202);
        assert_eq!(again["request_id"], first["request_id"]);
    }
    let (status, reused) = app
        .buy(
            event,
            buyer,
            "same-key",
            json!({"category_id": ga, "quantity": 1}),
        )
        .await;
    assert_eq!(
        (status, reused["error"]["code"].as_str()),
        (409, Some("DUPLICATE"))
    );
    assert_eq!(app.stock(event, ga).await, 8);
    assert_eq!(app.stream_len(event).await, 1);
    app.stop().await;
}

#[tokio::test]
async fn sold_out_and_the_per_user_limit_are_refused_with_409() {
    let app = spawn_app().await;
    let (event, ga, _) = sale(&app, 3, 1, 1, 2).await;
    let buyers = app.buyers(3).await;
    let one = json!({"category_id": ga, "quantity": 1});
    assert_eq!(
        app.buy(
            event,
            &buyers[0],
            "a",
            json!({"category_id": ga, "quantity": 2})
        )
        .await
        .0,
        202
    );
    let (status, body) = app.buy(event, &buyers[0], "b", one.clone()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("LIMIT_REACHED"))
    );
    assert_eq!(app.buy(event, &buyers[1], "c", one.clone()).await.0, 202);
    let (status, body) = app.buy(event, &buyers[2], "d", one).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("SOLD_OUT"))
    );
    assert_eq!(app.stock(event, ga).await, 0);
    let flag: Option<u8> = app
        .redis
        .clone()
        .hget(app.keys().sold_out(event), ga)
        .await
        .unwrap();
    assert_eq!(flag, Some(1));
    assert_eq!(app.stream_len(event).await, 2);
    app.stop().await;
}

#[tokio::test]
async fn chosen_seats_are_locked_once_and_best_seats_sit_together() {
    let app = spawn_app().await;
    let (event, _, seated) = sale(&app, 1, 3, 4, 4).await;
    let buyers = app.buyers(3).await;
    let (status, body) = app
        .buy(
            event,
            &buyers[0],
            "a",
            json!({"category_id": seated, "seat_ids": ["1:2", "1:3"]}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["seats"], json!(["1:2", "1:3"]));
    let (status, body) = app
        .buy(
            event,
            &buyers[1],
            "b",
            json!({"category_id": seated, "seat_ids": ["1:3"]}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("SEAT_TAKEN"))
    );
    // Row 1 has no 3 adjacent free seats left; row 2 does.
    let (status, body) = app
        .buy(
            event,
            &buyers[2],
            "c",
            json!({"category_id": seated, "quantity": 3}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["seats"], json!(["2:1", "2:2", "2:3"]));

    let seats: HashMap<String, String> = app
        .redis
        .clone()
        .hgetall(app.keys().seats(Bucket::only(event), seated))
        .await
        .unwrap();
    let locked: Vec<&String> = seats
        .iter()
        .filter(|(_, s)| matches!(SeatState::parse(s), Some(SeatState::Locked(_))))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(locked.len(), 5);
    let row_free: HashMap<u32, i64> = app
        .redis
        .clone()
        .hgetall(app.keys().row_free(Bucket::only(event), seated))
        .await
        .unwrap();
    assert_eq!(row_free, HashMap::from([(1, 2), (2, 1), (3, 4)]));
    assert_eq!(app.stock(event, seated).await, 7);

    let map: serde_json::Value = app
        .http
        .get(format!(
            "{}/api/events/{event}/seats?category={seated}",
            app.public_url
        ))
        .bearer_auth(&buyers[0].token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(map["seats"], json!(["FLLF", "LLLF", "FFFF"]));
    app.stop().await;
}

#[tokio::test]
async fn invalid_purchases_get_400_and_change_nothing() {
    let app = spawn_app().await;
    let (event, ga, seated) = sale(&app, 5, 2, 2, 2).await;
    let buyer = &app.buyers(1).await[0];
    for (why, body) in [
        ("neither quantity nor seats", json!({"category_id": ga})),
        (
            "both",
            json!({"category_id": seated, "quantity": 1, "seat_ids": ["1:1"]}),
        ),
        (
            "unknown category",
            json!({"category_id": 999999, "quantity": 1}),
        ),
        (
            "over the per-user limit",
            json!({"category_id": ga, "quantity": 3}),
        ),
        (
            "seat outside the grid",
            json!({"category_id": seated, "seat_ids": ["3:1"]}),
        ),
        (
            "seats in an unseated category",
            json!({"category_id": ga, "seat_ids": ["1:1"]}),
        ),
        (
            "unknown field",
            json!({"category_id": ga, "quantity": 1, "coupon": "FREE"}),
        ),
    ] {
        let (status, answer) = app.buy(event, buyer, why, body).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some("INVALID")),
            "{why}: {answer}"
        );
    }
    // A key named twice, in any spelling: the edge reads the first, serde_json would
    // keep the last — one body, two categories. Refused whole.
    for (n, text) in [
        format!(r#"{{"category_id":{seated},"quantity":1,"category_id":{ga}}}"#),
        format!(r#"{{"category_id":{seated},"quantity":1,"\u0063ategory_id":{ga}}}"#),
        format!(r#"{{"category_id":{ga},"quantity":1,"quantity":2}}"#),
    ]
    .into_iter()
    .enumerate()
    {
        let resp = app
            .http
            .post(format!("{}/api/events/{event}/orders", app.public_url))
            .bearer_auth(&buyer.token)
            .header("Idempotency-Key", format!("twice-{n}"))
            .header("Content-Type", "application/json")
            .body(text.clone())
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let answer: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some("INVALID")),
            "{text}: {answer}"
        );
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("duplicate field"),
            "{answer}"
        );
    }
    let no_key = app
        .http
        .post(format!("{}/api/events/{event}/orders", app.public_url))
        .bearer_auth(&buyer.token)
        .json(&json!({"category_id": ga, "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status(), 400);
    assert_eq!(app.stock(event, ga).await, 5);
    assert_eq!(app.stock(event, seated).await, 4);
    assert_eq!(app.stream_len(event).await, 0);
    app.stop().await;
}

/// A preload that read the event before an admin closed its sale (another core's
/// scheduler, or a rebuild, waiting on the preload lock meanwhile) writes the event's
/// metadata after the close: the sale stays closed. (It reopened it — the admission
/// script reads the status there — and a purchase after the close was admitted.)
#[tokio::test]
async fn a_preload_that_read_the_event_before_a_close_leaves_the_sale_closed() {
    let app = spawn_app().await;
    let (event, ga, _) = sale(&app, 5, 1, 1, 2).await;
    let before = stampede_core::catalog::load(&app.mysql, event)
        .await
        .unwrap()
        .unwrap();
    app.close(event).await;
    let other_core = stampede_core::preload::Preloader::new(
        app.redis.clone(),
        app.mysql.clone(),
        app.keys(),
        &app.settings,
        stampede_core::infra::mysql::CallTimeout::new(
            std::time::Duration::from_secs(15),
            &stampede_core::metrics::Metrics::new(),
        ),
    );
    other_core.preload(&before).await.unwrap();
    // Where the admission script and the edge read it (the core's own record refuses
    // the purchase below whatever Redis says).
    let status: String = app
        .redis
        .clone()
        .hget(app.keys().meta(Bucket::only(event)), "status")
        .await
        .unwrap();
    assert_eq!(status, "closed");
    let listed: String = app
        .redis
        .clone()
        .hget(app.keys().sales_index(), event)
        .await
        .unwrap();
    assert!(listed.starts_with("closed:"), "{listed}");
    let buyer = &app.buyers(1).await[0];
    let body = json!({"category_id": ga, "quantity": 1});
    let (status, answer) = app.buy(event, buyer, "after-close", body).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (403, Some("NOT_OPEN")),
        "{answer}"
    );
    assert_eq!(app.stock(event, ga).await, 5, "nothing taken");
    app.stop().await;
}

/// The core's own record of a closed sale decides a fresh purchase: whatever status
/// Redis's metadata holds (here written back to "open" by hand, as an older record's
/// preload did), it is NOT_OPEN with nothing taken; a key admitted before the close is
/// answered as the first time.
#[tokio::test]
async fn a_closed_sale_refuses_a_fresh_purchase_whatever_redis_metadata_says() {
    let app = spawn_app().await;
    let (event, ga, _) = sale(&app, 5, 1, 1, 2).await;
    let buyers = app.buyers(2).await;
    let body = json!({"category_id": ga, "quantity": 1});
    let (status, first) = app.buy(event, &buyers[0], "before", body.clone()).await;
    assert_eq!(status, 202, "{first}");
    app.close(event).await;
    let _: () = app
        .redis
        .clone()
        .hset(app.keys().meta(Bucket::only(event)), "status", "open")
        .await
        .unwrap();
    let (status, answer) = app.buy(event, &buyers[1], "after", body.clone()).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (403, Some("NOT_OPEN")),
        "{answer}"
    );
    assert_eq!(
        app.stock(event, ga).await,
        4,
        "only the purchase before the close"
    );
    let (status, again) = app.buy(event, &buyers[0], "before", body).await;
    assert_eq!(
        (status, &again["request_id"]),
        (202, &first["request_id"]),
        "{again}"
    );
    app.stop().await;
}

#[tokio::test]
async fn bad_tokens_get_401_and_closed_sales_403() {
    let app = spawn_app().await;
    let (event, ga, _) = sale(&app, 5, 1, 1, 2).await;
    let buyer = &app.buyers(1).await[0];
    let signer = TokenSigner::from_text(&app.token_secret).unwrap();
    let forger = TokenSigner::from_text("not-the-secret-at-all").unwrap();
    let body = json!({"category_id": ga, "quantity": 1});
    for (why, token) in [
        ("expired", signer.sign(buyer.user_id, 1_000)),
        ("forged", forger.sign(buyer.user_id, 4_000_000_000)),
        ("malformed", "garbage".to_owned()),
    ] {
        let (status, answer) =
            stampede_e2e::purchase(&app.http, &app.public_url, event, &token, why, body.clone())
                .await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (401, Some("UNAUTHORIZED")),
            "{why}"
        );
    }
    app.close(event).await;
    let (status, answer) = app.buy(event, buyer, "closed", body.clone()).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (403, Some("NOT_OPEN"))
    );

    let mut later = small_sale(5, 1, 1, 2);
    later["sale_start"] = json!("2031-01-01T00:00:00Z");
    let (future, categories) = app.create_event(later).await;
    app.publish(future).await;
    let (status, _) = app
        .buy(
            future,
            buyer,
            "early",
            json!({"category_id": categories[0], "quantity": 1}),
        )
        .await;
    assert_eq!(status, 403);
    assert_eq!(app.stock(event, ga).await, 5);
    app.stop().await;
}

#[tokio::test]
async fn login_gives_a_token_that_buys_and_a_wrong_password_gets_401() {
    let app = spawn_app().await;
    let user = app.admin_api.users_with_password(1, "correct horse").await;
    let login = |password: &'static str| {
        let http = app.http.clone();
        let url = format!("{}/api/login", app.public_url);
        async move {
            let resp = http
                .post(url)
                .json(&json!({"username": format!("user{user}"), "password": password}))
                .send()
                .await
                .unwrap();
            (
                resp.status().as_u16(),
                resp.json::<serde_json::Value>().await.unwrap(),
            )
        }
    };
    let (status, body) = login("correct horse").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["user_id"], user);
    let signer = TokenSigner::from_text(&app.token_secret).unwrap();
    assert_eq!(signer.verify(body["token"].as_str().unwrap(), 0), Ok(user));
    let (status, body) = login("wrong horse").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("UNAUTHORIZED"))
    );
    app.stop().await;
}

#[tokio::test]
async fn concurrent_buyers_never_take_more_than_the_stock() {
    let _heavy = stampede_e2e::heavy().await;
    let app = spawn_app().await;
    let (event, ga, _) = sale(&app, 50, 1, 1, 2).await;
    let buyers = app.buyers(400).await;
    let mut tasks = tokio::task::JoinSet::new();
    for (i, b) in buyers.into_iter().enumerate() {
        let (http, url) = (app.http.clone(), app.public_url.clone());
        tasks.spawn(async move {
            let q = 1 + (i % 2) as u32;
            let (status, _) = stampede_e2e::purchase(
                &http,
                &url,
                event,
                &b.token,
                "k",
                json!({"category_id": ga, "quantity": q}),
            )
            .await;
            (status, q)
        });
    }
    let mut admitted_units = 0;
    while let Some(done) = tasks.join_next().await {
        let (status, q) = done.unwrap();
        assert!(status == 202 || status == 409, "{status}");
        if status == 202 {
            admitted_units += q;
        }
    }
    assert_eq!(admitted_units, 50);
    assert_eq!(app.stock(event, ga).await, 0);
    app.stop().await;
}

#[tokio::test]
async fn a_redis_that_lost_the_scripts_gets_them_again_and_the_purchase_goes_through() {
    // Redis restarted without its scripts (or SCRIPT FLUSH): the core's EVALSHA hears
    // NOSCRIPT, loads the script and calls it again, within the one purchase. A Redis of
    // its own: no other test loads the script in between.
    let redis_server = stampede_e2e::OwnRedis::start();
    let app = stampede_e2e::spawn_app_with(|s| redis_server.use_in(s)).await;
    let (event, ga, _) = sale(&app, 10, 1, 1, 2).await;
    let buyers = app.buyers(2).await;
    let (status, _) = app
        .buy(
            event,
            &buyers[0],
            "k",
            json!({"category_id": ga, "quantity": 1}),
        )
        .await;
    assert_eq!(status, 202);
    let mut raw = redis_server.connection().await.unwrap();
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut raw)
        .await
        .unwrap();
    let (status, body) = app
        .buy(
            event,
            &buyers[1],
            "k",
            json!({"category_id": ga, "quantity": 1}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["status"], "QUEUED");
    let errors: String = redis::cmd("INFO")
        .arg("errorstats")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        errors.contains("errorstat_NOSCRIPT:count=1"),
        "the script was called once without being there: {errors}"
    );
    let stock: i64 = app.stock(event, ga).await;
    assert_eq!(stock, 8, "both purchases took their unit");
    app.stop().await;
}

/// A seat map is one HGETALL of the category's seat hash on the Redis that admits the
/// purchases: many viewers (or one client asking as fast as the edge lets it) asking at
/// once make one read, kept a moment, and a change still shows within that moment.
#[tokio::test]
async fn many_asks_for_a_seat_map_make_one_read_of_redis_and_it_follows_the_seats() {
    let redis_server = stampede_e2e::OwnRedis::start();
    let app = stampede_e2e::spawn_app_with(|s| {
        redis_server.use_in(s);
        s.reconcile.interval_s = 0; // its passes read hashes of this Redis too
    })
    .await;
    let (event, _, seated) = sale(&app, 5, 2, 2, 2).await;
    let buyers = app.buyers(1).await;
    let url = format!(
        "{}/api/events/{event}/seats?category={seated}",
        app.public_url
    );
    let map = || async {
        let resp = app
            .http
            .get(&url)
            .bearer_auth(&buyers[0].token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.json::<serde_json::Value>().await.unwrap()
    };
    let mut own = redis_server.connection().await.unwrap();
    let hgetall_calls = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_hgetall:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    };
    let before: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut own)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut asks = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let (http, url, token) = (app.http.clone(), url.clone(), buyers[0].token.clone());
        asks.spawn(async move {
            let resp = http.get(&url).bearer_auth(&token).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            resp.json::<serde_json::Value>().await.unwrap()
        });
    }
    let answers = asks.join_all().await;
    let elapsed = started.elapsed();
    let after: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut own)
        .await
        .unwrap();
    assert!(
        answers.iter().all(|a| a["seats"] == json!(["FF", "FF"])),
        "{:?}",
        answers[0]
    );
    let reads = hgetall_calls(after) - hgetall_calls(before);
    // One read per 250 ms at most (and none of anything else's: this Redis is the test's).
    let most = 1 + elapsed.as_millis() as u64 / 250;
    assert!(
        reads <= most,
        "40 asks in {elapsed:?} read the seat hash {reads} times (at most {most})"
    );
    let seat = json!({"category_id": seated, "seat_ids": ["2:1"]});
    assert_eq!(app.buy(event, &buyers[0], "s", seat).await.0, 202);
    let shown = stampede_e2e::eventually(std::time::Duration::from_secs(2), || async {
        map().await["seats"] == json!(["FF", "LF"])
    })
    .await;
    assert!(shown, "the map never showed the seat locked");
    app.stop().await;
}

/// An event id above the largest MySQL has is no event, told without reading it: a
/// sweep of made-up ids (any token may ask, as fast as the edge lets it) costs MySQL a
/// look for a newer largest id at most every 100 ms, not a read per id. An event
/// created meanwhile is found at once.
#[tokio::test]
async fn made_up_event_ids_cost_mysql_no_read_each() {
    let app = spawn_app().await;
    let buyer = app.buyers(1).await.remove(0);
    let reads = || async {
        app.admin_api
            .counter("stampede_event_reads_total")
            .await
            .unwrap_or(0)
    };
    let before = reads().await;
    let started = std::time::Instant::now();
    for n in 0..200u64 {
        let resp = app
            .http
            .get(format!(
                "{}/api/events/{}",
                app.public_url,
                1_000_000_000_000 + n
            ))
            .bearer_auth(&buyer.token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404);
    }
    let looks = reads().await - before;
    let most = 2 + started.elapsed().as_millis() as u64 / 100;
    assert!(
        looks <= most,
        "200 made-up ids read MySQL {looks} times (at most {most})"
    );
    let (event, _, _) = sale(&app, 5, 1, 1, 2).await;
    let resp = app
        .http
        .get(format!("{}/api/events/{event}", app.public_url))
        .bearer_auth(&buyer.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "the event just created");
    app.stop().await;
}
