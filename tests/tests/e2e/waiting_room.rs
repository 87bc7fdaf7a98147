//! The waiting room (docs/waiting-room.md) through the test stack's edge: joins before the
//! open, the draw recomputed from the revealed seed, polls answered by the edge, passes
//! released in line order and only as far as the stock can serve, a purchase needing
//! its pass (once), sold out read by everyone waiting, and the hidden path with a proof
//! of work.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{SecondsFormat, Utc};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use stampede_e2e::{Buyer, StackApp, eventually, stack_app};

use crate::edge::core_answers;

/// An unseated sale of `units` (one per buyer) opening in `opens_in`.
fn sale(units: u32, opens_in: Duration) -> Value {
    sale_limited(units, opens_in, 1)
}

fn sale_limited(units: u32, opens_in: Duration, per_user_limit: u32) -> Value {
    let at = |d: chrono::Duration| (Utc::now() + d).to_rfc3339_opts(SecondsFormat::Millis, true);
    json!({
        "title": "Drop", "venue": "Loopback", "show_time": "2031-06-01T20:00:00Z",
        "sale_start": at(chrono::Duration::from_std(opens_in).unwrap()),
        "sale_end": at(chrono::Duration::hours(2)),
        "per_user_limit": per_user_limit, "pay_timeout_s": 900,
        "categories": [{"name": "GA", "price_cents": 500, "quantity": units}],
    })
}

async fn call(
    app: &StackApp,
    method: reqwest::Method,
    path: &str,
    buyer: &Buyer,
    body: Option<Value>,
) -> (u16, Value, Option<String>) {
    let mut req = app
        .http
        .request(method, format!("{}{path}", app.edge_url))
        .bearer_auth(&buyer.token);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let source = resp
        .headers()
        .get("x-queue-source")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
        source,
    )
}

async fn join(app: &StackApp, event: u64, buyer: &Buyer, body: Option<Value>) -> (u16, Value) {
    let (s, b, _) = call(
        app,
        reqwest::Method::POST,
        &format!("/api/events/{event}/queue"),
        buyer,
        body,
    )
    .await;
    (s, b)
}

async fn poll(app: &StackApp, event: u64, buyer: &Buyer) -> (Value, Option<String>) {
    let (s, b, source) = call(
        app,
        reqwest::Method::GET,
        &format!("/api/events/{event}/queue"),
        buyer,
        None,
    )
    .await;
    assert_eq!(s, 200, "{b}");
    (b, source)
}

/// A purchase of one unit of the event's first category, with the pass if any.
async fn buy(
    app: &StackApp,
    event: u64,
    buyer: &Buyer,
    key: &str,
    pass: Option<&str>,
) -> (u16, Value) {
    let (_, e) = app.admin.get(&format!("/admin/events/{event}")).await;
    let category = e["categories"][0]["id"].as_u64().unwrap();
    let mut req = app
        .http
        .post(format!("{}/api/events/{event}/orders", app.edge_url))
        .bearer_auth(&buyer.token)
        .header("Idempotency-Key", key)
        .json(&json!({"category_id": category, "quantity": 1}));
    if let Some(p) = pass {
        req = req.header("Queue-Pass", p);
    }
    let resp = req.send().await.unwrap();
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or(Value::Null),
    )
}

/// PUT /admin/events/{event}/waiting-room with `body`, accepted.
async fn set_room(app: &StackApp, event: u64, body: Value) {
    let path = format!("/admin/events/{event}/waiting-room");
    let (s, b) = app
        .admin
        .call(reqwest::Method::PUT, &path, Some(body))
        .await;
    assert_eq!(s, 200, "{b}");
}

/// The order the fairness record says, recomputed here from its own words: SHA-256 of
/// "<seed>:<user id>" ascending.
fn recomputed(seed: &str, joined: &[u64]) -> Vec<u64> {
    let mut order = joined.to_vec();
    order.sort_by_key(|u| hex::encode(Sha256::digest(format!("{seed}:{u}").as_bytes())));
    order
}

#[tokio::test]
async fn a_waiting_room_draws_fairly_releases_by_stock_and_admits_only_with_a_pass() {
    let (app, _edge) = stack_app().await;
    let units = 5;
    let (event, categories) = app
        .admin
        .create_event(sale(units, Duration::from_secs(8)))
        .await;
    let ga = categories[0];
    let body = |key: &str| (key.to_owned(), json!({"category_id": ga, "quantity": 1}));
    // Hostile settings change nothing.
    for bad in [
        json!({"admit_per_s": 0}),
        json!({"admit_per_s": "fast"}),
        json!({"pass_ttl_s": 5}),
        json!({"challenge_bits": 40}),
        json!({"seed": "00"}),
        json!({"enabled": 1}),
        json!({"require_pass_at_open": null}),
    ] {
        let (s, b) = app
            .admin
            .call(
                reqwest::Method::PUT,
                &format!("/admin/events/{event}/waiting-room"),
                Some(bad.clone()),
            )
            .await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (400, Some("INVALID")),
            "{bad}: {b}"
        );
    }
    let (s, room) = app
        .admin
        .call(
            reqwest::Method::PUT,
            &format!("/admin/events/{event}/waiting-room"),
            Some(
                json!({"enabled": true, "opens_before_s": 600, "admit_per_s": 2, "pass_ttl_s": 10}),
            ),
        )
        .await;
    assert_eq!(s, 200, "{room}");
    let commitment = room["waiting_room"]["commitment"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(commitment.len(), 64);
    app.admin.publish(event).await;
    let buyers = app.admin.buyers(13).await;
    let (early, late) = buyers.split_at(12);

    // Before the open: the commitment only; joins hold no position yet.
    let (s, fair, _) = call(
        &app,
        reqwest::Method::GET,
        &format!("/api/events/{event}/queue/fairness"),
        &buyers[0],
        None,
    )
    .await;
    assert_eq!(s, 200, "{fair}");
    assert_eq!(
        (fair["commitment"].as_str(), fair.get("seed")),
        (Some(commitment.as_str()), None)
    );
    for b in early {
        let (s, a) = join(&app, event, b, None).await;
        assert_eq!(
            (s, a["state"].as_str(), &a["position"]),
            (200, Some("waiting"), &Value::Null),
            "{a}"
        );
    }
    assert_eq!(
        join(&app, event, &early[0], None).await.0,
        200,
        "joining again keeps the place"
    );
    let (s, b) = buy(&app, event, &early[0], "early", None).await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("NOT_OPEN")),
        "{b}"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            poll(&app, event, &early[3]).await.1.as_deref() == Some("edge")
        })
        .await,
        "the edge never answered a poll itself"
    );

    // The open: the draw, recomputable by anyone from the revealed seed.
    let drawn = eventually(Duration::from_secs(20), || async {
        let (a, _) = poll(&app, event, &early[11]).await;
        a["position"].is_u64()
    })
    .await;
    assert!(drawn, "no position after the open");
    let (_, fair, _) = call(
        &app,
        reqwest::Method::GET,
        &format!("/api/events/{event}/queue/fairness"),
        &buyers[0],
        None,
    )
    .await;
    let seed = fair["seed"]
        .as_str()
        .expect("the seed is revealed after the draw");
    assert_eq!(
        hex::encode(Sha256::digest(seed.as_bytes())),
        commitment,
        "the seed is the one committed to"
    );
    let joined: Vec<u64> = fair["joined"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_u64().unwrap())
        .collect();
    let mut ids: Vec<u64> = early.iter().map(|b| b.user_id).collect();
    ids.sort_unstable();
    assert_eq!(joined, ids, "joined: exactly who joined before the open");
    let order = recomputed(seed, &joined);
    // Passes are signed with the lifetime in force: it cannot change after the draw.
    let (s, b) = app
        .admin
        .call(
            reqwest::Method::PUT,
            &format!("/admin/events/{event}/waiting-room"),
            Some(json!({"pass_ttl_s": 20})),
        )
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (409, Some("INVALID_STATE")),
        "{b}"
    );
    let by_user: HashMap<u64, &Buyer> = early.iter().map(|b| (b.user_id, b)).collect();
    let in_line: Vec<&Buyer> = order.iter().map(|u| by_user[u]).collect();
    // Not in line: 404, the second time from the edge itself; joining ends that at once.
    let queue_path = format!("/api/events/{event}/queue");
    let not_in = || call(&app, reqwest::Method::GET, &queue_path, &late[0], None);
    assert_eq!(not_in().await.0, 404);
    let core_404s = core_answers(&app, 404).await;
    let (s, b, _) = not_in().await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (404, Some("NOT_FOUND")),
        "{b}"
    );
    assert_eq!(
        core_answers(&app, 404).await,
        core_404s,
        "the edge remembered who is not in line"
    );
    let (s, a) = join(&app, event, &late[0], None).await;
    assert_eq!(
        (s, a["position"].as_u64()),
        (200, Some(13)),
        "a late joiner goes behind everyone drawn: {a}"
    );

    // Passes go out in line order, at most as many as the stock can serve: 5 units, no
    // purchase yet → positions 1..=5 and no further while their passes last.
    let mut positions = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut released_five = false;
    while !released_five && Instant::now() < deadline {
        let mut turns = Vec::new();
        for (i, b) in in_line.iter().enumerate() {
            let (a, _) = poll(&app, event, b).await;
            positions.insert(b.user_id, a["position"].as_u64());
            if a["state"] == "your_turn" {
                turns.push(i + 1);
            }
        }
        // Never someone behind before someone ahead.
        assert!(
            turns.iter().enumerate().all(|(i, p)| *p == i + 1),
            "turns out of line order: {turns:?}"
        );
        assert!(
            turns.len() <= units as usize,
            "more turns than units: {turns:?}"
        );
        released_five = turns.len() == units as usize;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(released_five, "the first five never had their turn");
    for (i, b) in in_line.iter().enumerate() {
        assert_eq!(
            positions[&b.user_id],
            Some(i as u64 + 1),
            "the edge's position is the lottery's"
        );
    }
    let (sixth, _) = poll(&app, event, in_line[5]).await;
    assert_eq!(
        (sixth["state"].as_str(), sixth["ahead"].as_u64()),
        (Some("waiting"), Some(0)),
        "{sixth}"
    );

    // The pass: needed, the buyer's own, once.
    let first = in_line[0];
    let (mine, _) = poll(&app, event, first).await;
    let pass = mine["pass"].as_str().unwrap().to_owned();
    let (theirs, _) = poll(&app, event, in_line[1]).await;
    let other_pass = theirs["pass"].as_str().unwrap().to_owned();
    let before = core_answers(&app, 403).await;
    let forged = pass.replacen(
        &format!(".{}.", first.user_id),
        &format!(".{}.", in_line[1].user_id),
        1,
    );
    for (key, p, why) in [
        ("none", None, "without a pass"),
        ("theirs", Some(other_pass.as_str()), "another buyer's"),
        ("forged", Some(forged.as_str()), "forged"),
        ("garbage", Some("x.y.z"), "malformed"),
    ] {
        let (s, b) = buy(&app, event, first, key, p).await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (403, Some("QUEUE_REQUIRED")),
            "{why}: {b}"
        );
    }
    assert_eq!(
        core_answers(&app, 403).await,
        before,
        "the edge refused them itself"
    );
    let (k, order_body) = body("mine");
    let first_answer = app
        .http
        .post(format!("{}/api/events/{event}/orders", app.edge_url))
        .bearer_auth(&first.token)
        .header("Idempotency-Key", &k)
        .header("Queue-Pass", &pass)
        .json(&order_body)
        .send()
        .await
        .unwrap();
    assert_eq!(first_answer.status().as_u16(), 202);
    let request_id = first_answer.json::<Value>().await.unwrap()["request_id"].clone();
    let again = |key: &'static str| {
        app.http
            .post(format!("{}/api/events/{event}/orders", app.edge_url))
            .bearer_auth(&first.token)
            .header("Idempotency-Key", key)
            .header("Queue-Pass", &pass)
            .json(&order_body)
            .send()
    };
    // The edge's per-buyer limit (5 purchases a second) is not what is tested here.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let repeat = again("mine").await.unwrap();
    assert_eq!(
        repeat.status().as_u16(),
        202,
        "a repeated key gets its first answer"
    );
    assert_eq!(
        repeat.json::<Value>().await.unwrap()["request_id"],
        request_id
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let reused = again("another").await.unwrap();
    assert_eq!(reused.status().as_u16(), 403, "a pass admits one purchase");
    assert_eq!(
        reused.json::<Value>().await.unwrap()["error"]["code"],
        "QUEUE_REQUIRED"
    );
    // A pass on another event's purchase.
    let (other_event, _) = app.admin.create_event(sale(1, Duration::ZERO)).await;
    app.admin
        .call(
            reqwest::Method::PUT,
            &format!("/admin/events/{other_event}/waiting-room"),
            Some(json!({"enabled": true})),
        )
        .await;
    app.admin.publish(other_event).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            let (s, b) = buy(&app, other_event, first, "elsewhere", Some(&pass)).await;
            s == 403 && b["error"]["code"] == "QUEUE_REQUIRED"
        })
        .await
    );

    // 4 units left and positions 2..=5 hold unused passes: nobody further gets a turn
    // until those passes expire (10 s), then the next four do.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        poll(&app, event, in_line[5]).await.0["state"],
        "waiting",
        "released past the stock"
    );
    let moved_on = eventually(Duration::from_secs(20), || async {
        poll(&app, event, in_line[1]).await.0["state"] == "expired"
            && poll(&app, event, in_line[8]).await.0["state"] == "your_turn"
    })
    .await;
    assert!(moved_on, "unused passes never went to the next in line");
    assert_eq!(poll(&app, event, in_line[9]).await.0["state"], "waiting");
    let (s, _) = buy(&app, event, in_line[1], "late", Some(&other_pass)).await;
    assert_eq!(s, 403, "an expired pass admits nothing");

    // The next four buy the rest; everyone still waiting reads sold_out within a second.
    for b in &in_line[5..9] {
        let (a, _) = poll(&app, event, b).await;
        let (s, ans) = buy(&app, event, b, "turn", a["pass"].as_str()).await;
        assert_eq!(s, 202, "{ans}");
    }
    let sold_at = Instant::now();
    let all_read = eventually(Duration::from_secs(10), || async {
        let mut all = true;
        for b in in_line[9..].iter().copied().chain(late.iter()) {
            all &= poll(&app, event, b).await.0["state"] == "sold_out";
        }
        all
    })
    .await;
    assert!(all_read, "waiting buyers never read sold_out");
    println!(
        "sold_out read by every waiting buyer {:?} after the last purchase",
        sold_at.elapsed()
    );
    let (s, stats) = app.admin.get(&format!("/admin/events/{event}/stats")).await;
    assert_eq!(s, 200);
    let f = &stats["waiting_room"]["figures"];
    assert_eq!(
        (f["joined"].as_u64(), f["passes_used"].as_u64()),
        (Some(13), Some(5)),
        "{f}"
    );
    assert_eq!(app.stock(event, ga).await, 0);
}

#[tokio::test]
async fn the_hidden_path_issues_passes_from_the_open_after_a_proof_of_work() {
    let (app, _edge) = stack_app().await;
    let (event, categories) = app
        .admin
        .create_event(sale(3, Duration::from_secs(3)))
        .await;
    let ga = categories[0];
    set_room(
        &app,
        event,
        json!({"require_pass_at_open": true, "challenge_bits": 8, "pass_ttl_s": 30}),
    )
    .await;
    app.admin.publish(event).await;
    let buyers = app.admin.buyers(2).await;
    let buyer = &buyers[0];
    let challenge_path = format!("/api/events/{event}/queue/challenge");
    // Before the open: no challenge (no work done ahead) and no pass.
    let (s, c, _) = call(&app, reqwest::Method::GET, &challenge_path, buyer, None).await;
    assert_eq!(
        (s, c["error"]["code"].as_str()),
        (403, Some("NOT_OPEN")),
        "{c}"
    );
    let (s, b) = join(&app, event, buyer, None).await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("CHALLENGE_FAILED")),
        "{b}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (s, c, _) = call(&app, reqwest::Method::GET, &challenge_path, buyer, None).await;
    assert_eq!((s, c["bits"].as_u64()), (200, Some(8)), "{c}");
    let challenge = c["challenge"].as_str().unwrap().to_owned();
    // A proof for this user, found here from the documented hash. At 8 bits one
    // nonce in 256 also proves work for any other user, so the nonce taken is one
    // that does not for the other buyer: the refusal below is then the binding to
    // the user, not luck.
    let proves = |user: u64, n: &str| {
        Sha256::digest(format!("{challenge}:{user}:{event}:{n}").as_bytes())[0] == 0
    };
    let nonce = (0u64..)
        .map(|n| n.to_string())
        .find(|n| proves(buyer.user_id, n) && !proves(buyers[1].user_id, n))
        .unwrap();
    let (s, b) = join(&app, event, buyer, None).await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("CHALLENGE_FAILED")),
        "{b}"
    );
    let (s, b) = join(
        &app,
        event,
        &buyers[1],
        Some(json!({"challenge": challenge, "nonce": nonce})),
    )
    .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("CHALLENGE_FAILED")),
        "another user's proof: {b}"
    );
    let (s, b) = join(
        &app,
        event,
        buyer,
        Some(json!({"challenge": challenge, "nonce": nonce})),
    )
    .await;
    assert_eq!((s, b["state"].as_str()), (200, Some("your_turn")), "{b}");
    let pass = b["pass"].as_str().unwrap().to_owned();
    let order = json!({"category_id": ga, "quantity": 1});
    let with = |key: &str, p: Option<&str>| {
        let mut r = app
            .http
            .post(format!("{}/api/events/{event}/orders", app.edge_url))
            .bearer_auth(&buyer.token)
            .header("Idempotency-Key", key)
            .json(&order);
        if let Some(p) = p {
            r = r.header("Queue-Pass", p);
        }
        r.send()
    };
    let refused = eventually(Duration::from_secs(5), || async {
        let r = with("bare", None).await.unwrap();
        r.status().as_u16() == 403
            && r.json::<Value>().await.unwrap()["error"]["code"] == "QUEUE_REQUIRED"
    })
    .await;
    assert!(refused, "a purchase without a pass went through");
    assert_eq!(
        with("mine", Some(&pass)).await.unwrap().status().as_u16(),
        202
    );
    assert_eq!(
        with("twice", Some(&pass)).await.unwrap().status().as_u16(),
        403,
        "one purchase per pass"
    );
    // The core says the same to anyone who skips the edge.
    let stack = stampede_e2e::Stack::from_env();
    let direct = app
        .http
        .post(format!(
            "http://127.0.0.1:{}/api/events/{event}/orders",
            stack.core_port
        ))
        .bearer_auth(&buyer.token)
        .header("Idempotency-Key", "direct")
        .json(&order)
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status().as_u16(), 403);
    assert_eq!(app.stock(event, ga).await, 2);
}

/// A hidden path's pass on a sold-out sale would read `your_turn` for a purchase that
/// can only be refused: the answer says sold out, with no pass (attacker review).
#[tokio::test]
async fn the_hidden_path_gives_no_pass_once_the_sale_is_sold_out() {
    let (app, _edge) = stack_app().await;
    let (event, categories) = app.admin.create_event(sale(1, Duration::ZERO)).await;
    set_room(&app, event, json!({"require_pass_at_open": true})).await;
    app.admin.publish(event).await;
    let buyers = app.admin.buyers(2).await;
    let (s, b) = join(&app, event, &buyers[0], None).await;
    assert_eq!((s, b["state"].as_str()), (200, Some("your_turn")), "{b}");
    let pass = b["pass"].as_str().unwrap().to_owned();
    // (The edge's snapshot learns of the open within its refresh.)
    let bought = eventually(Duration::from_secs(5), || async {
        buy(&app, event, &buyers[0], "only", Some(&pass)).await.0 == 202
    })
    .await;
    assert!(bought, "the pass did not buy");
    assert_eq!(app.stock(event, categories[0]).await, 0);
    // The flag follows the last unit (the order pipeline's settle, at most a moment).
    let last = std::cell::RefCell::new(Value::Null);
    let told = eventually(Duration::from_secs(10), || async {
        let (s, b) = join(&app, event, &buyers[1], None).await;
        assert_eq!(s, 200, "{b}");
        let sold = b["state"] == "sold_out";
        *last.borrow_mut() = b;
        sold
    })
    .await;
    let last = last.into_inner();
    assert!(
        told,
        "the hidden path still gives passes on a sold-out sale: {last}"
    );
    assert!(last.get("pass").is_none(), "{last}");
    assert_eq!(last["position"], Value::Null, "{last}");
}

#[tokio::test]
async fn queue_endpoints_have_one_spelling_and_need_a_room() {
    let (app, _edge) = stack_app().await;
    let (event, _) = app.admin.create_event(sale(1, Duration::ZERO)).await;
    app.admin.publish(event).await;
    let buyer = &app.admin.buyers(1).await[0];
    for path in ["queue", "queue/challenge", "queue/fairness"] {
        let (s, b, _) = call(
            &app,
            reqwest::Method::GET,
            &format!("/api/events/{event}/{path}"),
            buyer,
            None,
        )
        .await;
        assert_eq!(s, 404, "{path} without a room: {b}");
    }
    let (s, _) = join(&app, event, buyer, None).await;
    assert_eq!(s, 404);
    for (method, path, status) in [
        (
            reqwest::Method::PUT,
            format!("/api/events/{event}/queue"),
            405,
        ),
        (
            reqwest::Method::POST,
            format!("/api/events/{event}/queue/fairness"),
            405,
        ),
        (
            reqwest::Method::GET,
            format!("/api/events/{event}/queue/"),
            404,
        ),
        (
            reqwest::Method::GET,
            format!("/api/events/0{event}/queue"),
            404,
        ),
        (
            reqwest::Method::GET,
            format!("/api/events/{event}//queue"),
            404,
        ),
        (
            reqwest::Method::GET,
            format!("/api/events/{event}/%71ueue"),
            404,
        ),
        (
            reqwest::Method::GET,
            format!("/api/events/{event}/queue/seed"),
            404,
        ),
    ] {
        let (s, b, _) = call(&app, method.clone(), &path, buyer, None).await;
        assert_eq!(s, status, "{method} {path}: {b}");
    }
    let anon = app
        .http
        .get(format!("{}/api/events/{event}/queue", app.edge_url))
        .send()
        .await
        .unwrap();
    assert_eq!(anon.status().as_u16(), 401);
}

/// Two requests of one purchase (same buyer, same Idempotency-Key, same pass) at once,
/// one of them refused: the refused one must not hand back the pass the other spent, or
/// the pass buys again under a new key.
#[tokio::test]
async fn one_pass_buys_once_even_when_twin_requests_race() {
    let (app, _edge) = stack_app().await;
    let (event, categories) = app
        .admin
        .create_event(sale_limited(20, Duration::ZERO, 5))
        .await;
    let ga = categories[0];
    set_room(&app, event, json!({"require_pass_at_open": true})).await;
    app.admin.publish(event).await;
    let mut buyers = app.admin.buyers(7).await;
    let prober = buyers.pop().unwrap();
    let order = |buyer: &Buyer, key: &str, pass: &str, quantity: u32| {
        app.http
            .post(format!("{}/api/events/{event}/orders", app.edge_url))
            .bearer_auth(&buyer.token)
            .header("Idempotency-Key", key)
            .header("Queue-Pass", pass)
            .json(&json!({"category_id": ga, "quantity": quantity}))
            .send()
    };
    // Once the edge knows the sale: a purchase without a pass is refused for it.
    let known = eventually(Duration::from_secs(5), || async {
        let (s, b) = buy(&app, event, &prober, "probe", None).await;
        s == 403 && b["error"]["code"] == "QUEUE_REQUIRED"
    })
    .await;
    assert!(known, "the edge never saw the hidden path");
    // The twins below go on two connections, maybe to two workers: both must know it.
    stampede_e2e::edge_workers_catch_up().await;
    for buyer in &buyers {
        let (s, b) = join(&app, event, buyer, None).await;
        assert_eq!(s, 200, "{b}");
        let pass = b["pass"].as_str().unwrap().to_owned();
        // quantity 6 is over the limit of 5: refused (400) while its twin is admitted.
        let (bad, good) = tokio::join!(
            order(buyer, "twin", &pass, 6),
            order(buyer, "twin", &pass, 1)
        );
        let answer =
            |r: reqwest::Response| async move { (r.status().as_u16(), r.text().await.unwrap()) };
        let (bad, good) = (answer(bad.unwrap()).await, answer(good.unwrap()).await);
        assert!(bad.0 == 400 || bad.0 == 409, "{bad:?}");
        assert_eq!(good.0, 202, "{good:?}");
        let again = order(buyer, "other", &pass, 1).await.unwrap();
        assert_eq!(again.status().as_u16(), 403, "the pass bought twice");
    }
    assert_eq!(app.stock(event, ga).await, 20 - 6, "one unit per pass");
}

/// A sale behind a pass, past its end: a buyer without a pass hears NOT_OPEN, from the
/// edge and from the core, never QUEUE_REQUIRED (to join a line for a sale that is
/// over). Also in the moment after the end when the edge still sends purchases on to the
/// core, until it knows every key the sale admitted. A buyer admitted with a pass who
/// retries the same key without it hears the first 202.
#[tokio::test]
async fn a_sale_past_its_end_says_not_open_to_a_buyer_without_a_pass() {
    let (app, _edge) = stack_app().await;
    let end = Utc::now() + chrono::Duration::seconds(6);
    let mut sale = sale(5, Duration::ZERO);
    sale["sale_end"] = json!(end.to_rfc3339_opts(SecondsFormat::Millis, true));
    let (event, categories) = app.admin.create_event(sale).await;
    set_room(&app, event, json!({"require_pass_at_open": true})).await;
    app.admin.publish(event).await;
    let mut buyers = app.admin.buyers(11).await;
    let admitted = buyers.pop().unwrap();
    let known = eventually(Duration::from_secs(5), || async {
        let (s, b) = buy(&app, event, &buyers[0], "probe", None).await;
        s == 403 && b["error"]["code"] == "QUEUE_REQUIRED"
    })
    .await;
    assert!(known, "the edge never saw the sale's pass rule");
    stampede_e2e::edge_workers_catch_up().await;
    let (s, b) = join(&app, event, &admitted, None).await;
    assert_eq!(s, 200, "{b}");
    let pass = b["pass"].as_str().unwrap().to_owned();
    let (s, first) = buy(&app, event, &admitted, "bought", Some(&pass)).await;
    assert_eq!(s, 202, "{first}");

    let wait = end.timestamp_millis() + 30 - Utc::now().timestamp_millis();
    assert!(wait > 0, "the set-up outlasted the sale");
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    // A fresh key every 40 ms for 1.5 s, the buyers in turn (each under its own rate
    // limit): the first few land before the edge refuses the ended sale from memory.
    let mut heard = std::collections::BTreeMap::<String, Vec<u128>>::new();
    let started = Instant::now();
    for n in 0.. {
        let at = started.elapsed().as_millis();
        if at > 1_500 {
            break;
        }
        let buyer = &buyers[n % buyers.len()];
        let (s, b) = buy(&app, event, buyer, &format!("late-{n}"), None).await;
        let code = b["error"]["code"].as_str().unwrap_or("-").to_owned();
        heard.entry(format!("{s} {code}")).or_default().push(at);
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert_eq!(
        heard.keys().collect::<Vec<_>>(),
        ["403 NOT_OPEN"],
        "what the edge answered after the end (ms after it + 30): {heard:?}"
    );
    // The core's own answer, for a purchase that reaches it.
    let core = stampede_e2e::Stack::from_env().core_port;
    let r = app
        .http
        .post(format!("http://127.0.0.1:{core}/api/events/{event}/orders"))
        .bearer_auth(&buyers[1].token)
        .header("Idempotency-Key", "at-the-core")
        .json(&json!({"category_id": categories[0], "quantity": 1}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let b: Value = r.json().await.unwrap();
    assert_eq!(
        (status, &b["error"]["code"]),
        (403, &json!("NOT_OPEN")),
        "{b}"
    );
    // The admitted purchase, retried without its pass: its first answer.
    let (s, again) = buy(&app, event, &admitted, "bought", None).await;
    assert_eq!(s, 202, "{again}");
    assert_eq!(again["request_id"], first["request_id"], "{again}");
}

/// A sale closed while a buyer's turn runs, and reopened after the pass's whole lifetime:
/// the turn is not lost. The buyer reads `your_turn` again, with a pass that has the time
/// it had left at the close, and buys with it; the pass signed before the close is
/// refused (its own expiry has passed).
#[tokio::test]
async fn a_turn_a_close_interrupts_keeps_the_time_it_had_left_after_the_reopen() {
    let (app, _edge) = stack_app().await;
    let (event, _) = app.admin.create_event(sale(5, Duration::ZERO)).await;
    set_room(
        &app,
        event,
        json!({"enabled": true, "admit_per_s": 1, "pass_ttl_s": 10}),
    )
    .await;
    app.admin.publish(event).await;
    let buyer = app.admin.buyers(1).await.pop().unwrap();
    let joined = eventually(Duration::from_secs(10), || async {
        join(&app, event, &buyer, None).await.0 == 200
    })
    .await;
    assert!(joined, "the buyer could not join");
    let first = turn_within(&app, event, &buyer, Duration::from_secs(20)).await;
    let (before, expired_at) = first.expect("the buyer's turn never came");

    let closed_ms = Utc::now().timestamp_millis();
    app.admin.close(event).await;
    let reads_closed = eventually(Duration::from_secs(5), || async {
        poll(&app, event, &buyer).await.0["state"] == "closed"
    })
    .await;
    assert!(reads_closed, "the closed sale's room does not read closed");
    // Someone in line behind: while the sale is closed the gate releases nobody, whatever
    // budget a tick has (room_release.lua returns at once).
    let store = stampede_core::room::store::RoomStore {
        redis: app.redis.clone(),
        keys: app.keys(),
    };
    let _: () = redis::cmd("ZADD")
        .arg(app.keys().room_positions(event))
        .arg(2)
        .arg(990_002)
        .query_async(&mut app.redis.clone())
        .await
        .unwrap();
    let tick = store.release(event.into(), 100, 100, 10_000, 1.0, 0);
    let released = tick.await.unwrap();
    assert_eq!((released.served, released.now), (1, 0), "{released:?}");
    // Closed past the pass's own expiry.
    let past = (expired_at - Utc::now().timestamp_millis()).max(0) as u64 + 1_000;
    tokio::time::sleep(Duration::from_millis(past)).await;
    // Closed again: the first close's moment stands.
    app.admin.close(event).await;
    let reopened_ms = Utc::now().timestamp_millis();
    let (s, b) = app
        .admin
        .post(&format!("/admin/events/{event}/reopen"), json!({}))
        .await;
    assert_eq!(s, 200, "{b}");

    let again = turn_within(&app, event, &buyer, Duration::from_secs(5)).await;
    let (now, _) = poll(&app, event, &buyer).await;
    let (after, expires_at) =
        again.unwrap_or_else(|| panic!("the turn was lost to the close: {now}"));
    let left_at_close = expired_at - closed_ms;
    let left_now = expires_at - reopened_ms;
    assert!(
        (left_now - left_at_close).abs() < 1_500,
        "the pass had {left_at_close} ms left at the close and {left_now} ms at the reopen"
    );
    // Reopened again: nothing more moves.
    let (s, b) = app
        .admin
        .post(&format!("/admin/events/{event}/reopen"), json!({}))
        .await;
    assert_eq!(s, 200, "{b}");
    let (a, _) = poll(&app, event, &buyer).await;
    assert_eq!(a["pass_expires_ms"].as_i64(), Some(expires_at), "{a}");
    let (s, b) = buy(&app, event, &buyer, "old-pass", Some(&before)).await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("QUEUE_REQUIRED")),
        "the pass signed before the close: {b}"
    );
    let (s, b) = buy(&app, event, &buyer, "new-pass", Some(&after)).await;
    assert_eq!(s, 202, "{b}");
}

/// The buyer's pass and its expiry once a poll reads `your_turn`, within `wait`.
async fn turn_within(
    app: &StackApp,
    event: u64,
    buyer: &Buyer,
    wait: Duration,
) -> Option<(String, i64)> {
    let until = Instant::now() + wait;
    while Instant::now() < until {
        let (a, _) = poll(app, event, buyer).await;
        if a["state"] == "your_turn" {
            let pass = a["pass"].as_str().unwrap().to_owned();
            return Some((pass, a["pass_expires_ms"].as_i64().unwrap()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}
