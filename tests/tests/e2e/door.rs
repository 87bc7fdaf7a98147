//! Trust at the door: every path has one spelling at the edge and in the core, the
//! edge is deny-by-default under /api, and a retried purchase gets its first answer even
//! after the sell-out.

use stampede_core::keys::Bucket;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;
use stampede_e2e::{
    RawAnswer, Stack, StoppedCore, eventually, live_units, raw_request, small_sale, stack_app,
};

use crate::edge::{core_answers, open_sale, raw_purchase, the_edge_says_sold_out};

fn assert_not_found(a: &RawAnswer, what: &str) {
    assert_eq!(a.status, 404, "{what}: {a:?}");
    assert_eq!(a.json()["error"]["code"], "NOT_FOUND", "{what}: {a:?}");
}

#[tokio::test]
async fn no_other_spelling_of_the_purchase_path_reaches_a_handler_or_reserves() {
    let (app, _edge) = stack_app().await;
    let stack = Stack::from_env();
    let (event, categories) = open_sale(&app, small_sale(5, 1, 1, 5)).await;
    let ga = categories[0];
    let buyer = app.admin.buyers(1).await.remove(0);
    let auth = format!("Bearer {}", buyer.token);
    let body = json!({"category_id": ga, "quantity": 1}).to_string();
    let e = event;
    let spellings = [
        format!("/api/events/{e}/orders/"),
        format!("/api/events/+{e}/orders"),
        format!("/api/events/0{e}/orders"),
        format!("/api/events/{e}.0/orders"),
        format!("//api/events/{e}/orders"),
        format!("/api//events/{e}/orders"),
        format!("/api/events//{e}/orders"),
        format!("/api/events/{e}//orders"),
        format!("/api/events/{e}/orders//"),
        format!("/api/events/{e}/./orders"),
        format!("/api/./events/{e}/orders"),
        format!("/api/events/{e}/orders/."),
        format!("/api/events/0/../{e}/orders"),
        format!("/api/events/{e}/%6frders"),
        format!("/api/events/{e}/orders%2F"),
        format!("/api/events/{e}/ORDERS"),
        format!("/api/events/{e}/orders;x"),
        format!("/API/events/{e}/orders"),
        "/api/events/18446744073709551617/orders".to_owned(),
    ];
    for (i, path) in spellings.iter().enumerate() {
        for (port, at) in [(stack.edge_port, "edge"), (stack.core_port, "core")] {
            let key = format!("spelling-{i}-{at}");
            let a = raw_purchase(
                port,
                path,
                &[("Authorization", &auth), ("Idempotency-Key", &key)],
                &body,
            )
            .await;
            assert_not_found(&a, &format!("{at} {path}"));
        }
    }
    let stock = app.stock(event, ga).await;
    let held: u64 = app
        .redis
        .clone()
        .hlen(app.keys().held(Bucket::only(event)))
        .await
        .unwrap();
    assert_eq!((stock, held), (5, 0), "nothing reserved");

    // The one spelling does reserve: the checks above could have failed.
    let path = format!("/api/events/{e}/orders");
    let a = raw_purchase(
        stack.edge_port,
        &path,
        &[
            ("Authorization", &auth),
            ("Idempotency-Key", "the-one-spelling"),
        ],
        &body,
    )
    .await;
    assert_eq!(a.status, 202, "{a:?}");
}

/// The edge takes the Idempotency-Key the core takes (1..=64 visible ASCII characters)
/// and refuses every other itself, before the core and before any flag: 400 INVALID,
/// nothing reserved. The path's one spelling may carry a query.
#[tokio::test]
async fn the_edge_takes_the_idempotency_keys_the_core_takes_and_no_other() {
    let (app, _edge) = stack_app().await;
    let stack = Stack::from_env();
    let (event, categories) = open_sale(&app, small_sale(5, 1, 1, 1)).await;
    let ga = categories[0];
    let buyers = app.admin.buyers(4).await;
    let body = json!({"category_id": ga, "quantity": 1}).to_string();
    let path = format!("/api/events/{event}/orders");
    let post = |buyer: usize, path: String, key: String| {
        let auth = format!("Bearer {}", buyers[buyer].token);
        let body = body.clone();
        async move {
            raw_purchase(
                stack.edge_port,
                &path,
                &[("Authorization", &auth), ("Idempotency-Key", &key)],
                &body,
            )
            .await
        }
    };
    let core_400s = core_answers(&app, 400).await;
    for (why, key) in [
        ("empty", String::new()),
        ("65 characters", "k".repeat(65)),
        ("a space inside", "two words".to_owned()),
        ("DEL", "key\u{7f}".to_owned()),
        ("UTF-8", "clé".to_owned()),
        ("a tab inside", "a\tb".to_owned()),
    ] {
        let a = post(0, path.clone(), key).await;
        assert_eq!(a.status, 400, "{why}: {a:?}");
        assert_eq!(a.json()["error"]["code"], "INVALID", "{why}: {a:?}");
    }
    assert_eq!(
        core_answers(&app, 400).await,
        core_400s,
        "the edge answered them"
    );
    assert_eq!(app.stock(event, ga).await, 5, "nothing reserved");

    // The longest key, the visible range's two ends, and a query on the one spelling.
    for (buyer, path, key) in [
        (1, path.clone(), "k".repeat(64)),
        (2, path.clone(), "!~".to_owned()),
        (3, format!("{path}?from=app"), "with-a-query".to_owned()),
    ] {
        let a = post(buyer, path.clone(), key.clone()).await;
        assert_eq!(a.status, 202, "{path} {key}: {a:?}");
    }
    assert_eq!(app.stock(event, ga).await, 2);
}

#[tokio::test]
async fn login_and_the_rest_of_the_api_have_one_spelling_and_one_method() {
    let (app, _edge) = stack_app().await;
    let stack = Stack::from_env();
    let creds = json!({"username": "nobody", "password": "wrong"}).to_string();
    let json_type = [("Content-Type", "application/json")];
    for path in [
        "/api/login/",
        "//api/login",
        "/api//login",
        "/api/./login",
        "/api/login/.",
        "/api/%6cogin",
        "/api/login%2F",
        "/api/Login",
        "/api/payments/callback/",
        "/api/payments//callback",
    ] {
        for (port, at) in [(stack.edge_port, "edge"), (stack.core_port, "core")] {
            let a = raw_request(port, "POST", path, &json_type, &creds).await;
            assert_not_found(&a, &format!("{at} {path}"));
        }
    }
    // Deny-by-default: anything else under /api is 404 at the edge, token or not,
    // before any check of a route it might resemble.
    let buyer = app.admin.buyers(1).await.remove(0);
    let auth = format!("Bearer {}", buyer.token);
    for path in [
        "/api",
        "/api/",
        "/api/anything",
        "/api/events/1/orders/x",
        "/api/orders",
        "/api/events/1/seats/",
        "/api/orders/1/refund",
        "/api/healthz",
        "/api/../readyz",
    ] {
        for headers in [&[][..], &[("Authorization", auth.as_str())][..]] {
            let a = raw_request(stack.edge_port, "GET", path, headers, "").await;
            assert_not_found(&a, &format!("edge {path}"));
        }
    }
    // The right path with another method: 405 naming the method it takes.
    for (method, path, allow) in [
        ("GET", "/api/events/1/orders", "POST"),
        ("PUT", "/api/login", "POST"),
        ("DELETE", "/api/events/1", "GET"),
        ("POST", "/api/orders/1", "GET"),
        ("GET", "/api/orders/1/cancel", "POST"),
    ] {
        for (port, at) in [(stack.edge_port, "edge"), (stack.core_port, "core")] {
            let a = raw_request(port, method, path, &[("Authorization", auth.as_str())], "").await;
            assert_eq!(a.status, 405, "{at} {method} {path}: {a:?}");
            assert_eq!(a.header("allow"), Some(allow), "{at} {method} {path}");
            assert_eq!(a.json()["error"]["code"], "METHOD_NOT_ALLOWED");
        }
    }
    // Or the one an Idempotency-Key admitted: the header reaches the core too. An empty
    // one is refused at the edge as at the core (nginx would pass none on).
    for (key, status, code) in [
        ("nothing-here", 404, "NOT_FOUND"),
        ("has space", 400, "INVALID"),
        ("", 400, "INVALID"),
    ] {
        let path = "/api/events/1/orders/status";
        let headers = [("Authorization", auth.as_str()), ("Idempotency-Key", key)];
        for (port, at) in [(stack.edge_port, "edge"), (stack.core_port, "core")] {
            let a = raw_request(port, "GET", path, &headers, "").await;
            assert_eq!(a.status, status, "{at} {key}: {a:?}");
            assert_eq!(a.json()["error"]["code"], code, "{at} {key}: {a:?}");
            let said = a.json()["error"]["message"].as_str().unwrap().to_owned();
            assert!(said.contains("Idempotency-Key"), "{at} {key}: {said}");
        }
    }
    // One purchase's status: the query reaches the core through the edge as sent.
    for (query, status, code) in [
        ("request_id=1", 404, "NOT_FOUND"),
        ("request_id=01", 400, "INVALID"),
        ("request_id=1&request_id=1", 400, "INVALID"),
        ("order_no=1", 400, "INVALID"),
    ] {
        let path = format!("/api/events/1/orders/status?{query}");
        for (port, at) in [(stack.edge_port, "edge"), (stack.core_port, "core")] {
            let a = raw_request(port, "GET", &path, &[("Authorization", auth.as_str())], "").await;
            assert_eq!(a.status, status, "{at} {path}: {a:?}");
            assert_eq!(a.json()["error"]["code"], code, "{at} {path}: {a:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_purchase_gets_its_first_answer_after_the_sell_out() {
    let (app, _edge) = stack_app().await;
    let _heavy = stampede_e2e::heavy().await;
    let units = 20;
    let (event, categories) = open_sale(&app, small_sale(units, 1, 1, 1)).await;
    let body = json!({"category_id": categories[0], "quantity": 1});
    let buyers = app.admin.buyers(80).await;
    // Everyone at once, racing the sell-out.
    let mut racing = tokio::task::JoinSet::new();
    for (i, buyer) in buyers.iter().enumerate() {
        let (http, url) = (app.http.clone(), app.edge_url.clone());
        let (token, body) = (buyer.token.clone(), body.clone());
        racing.spawn(async move {
            let answer =
                stampede_e2e::purchase(&http, &url, event, &token, &format!("race-{i}"), body)
                    .await;
            (i, answer)
        });
    }
    let mut first = vec![(0, json!(null)); buyers.len()];
    while let Some(done) = racing.join_next().await {
        let (i, answer) = done.unwrap();
        first[i] = answer;
    }
    let admitted = first.iter().filter(|(s, _)| *s == 202).count();
    assert_eq!(admitted, units as usize, "{first:?}");

    // The edge knows the category is sold out: a new buyer hears it from the edge, not
    // the core (whose count of 409s stays put).
    let late = app.admin.buyers(1).await.remove(0);
    assert!(
        the_edge_says_sold_out(&app, event, &late, &body, Duration::from_secs(10)).await,
        "the edge never answered SOLD_OUT itself"
    );

    // Every buyer retries with the same key: a 202 stays a 202 with the same request id.
    for (i, buyer) in buyers.iter().enumerate() {
        let (status, answer) = app
            .buy(event, buyer, &format!("race-{i}"), body.clone())
            .await;
        let (first_status, first_answer) = &first[i];
        assert_eq!(
            status, *first_status,
            "buyer {i}: {first_answer} then {answer}"
        );
        if status == 202 {
            assert_eq!(
                answer["request_id"], first_answer["request_id"],
                "buyer {i}"
            );
        } else {
            assert_eq!(
                answer["error"]["code"], first_answer["error"]["code"],
                "buyer {i}"
            );
        }
    }
    let stock = app.stock(event, categories[0]).await;
    assert_eq!(stock, 0);
}

/// Sends SIGCONT to the stack's core when dropped, so a test that froze it leaves it
/// running, failed or not.
/// A purchase retried every 200 ms while it is answered 503 (a core coming back takes
/// its leases), for up to 20 s; the last answer.
async fn buy_past_503s(
    app: &stampede_e2e::StackApp,
    event: u64,
    buyer: &stampede_e2e::Buyer,
    key: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, answer) = app.buy(event, buyer, key, body.clone()).await;
        if status != 503 || tokio::time::Instant::now() > deadline {
            return (status, answer);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

struct Thaw(String);

impl Drop for Thaw {
    fn drop(&mut self) {
        let thawed = std::process::Command::new("kill")
            .args(["-CONT", &self.0])
            .status();
        if !thawed.is_ok_and(|s| s.success()) {
            eprintln!("could not thaw the stack's core (pid {})", self.0);
        }
    }
}

/// A purchase the edge let through to a core that had it and did not answer in time
/// (frozen: nginx waits proxy_read_timeout, 10 s) may have been taken there: the edge
/// says so (503 OUTCOME_UNKNOWN with the status URL, as the core says it when Redis does
/// not answer) and keeps its Idempotency-Key, so the buyer's retry after the
/// sell-out, past the 15 s a key waits for an answer, is answered by the core — 202 with
/// the first request id when the thawed core took it — not SOLD_OUT from the edge's
/// memory.
#[tokio::test]
async fn a_purchase_the_core_did_not_answer_in_time_is_retried_at_the_core_after_the_sell_out() {
    let (app, _edge) = stack_app().await;
    let stack = Stack::from_env();
    let (event, categories) = open_sale(&app, small_sale(1, 1, 1, 1)).await;
    let body = json!({"category_id": categories[0], "quantity": 1});
    let buyers = app.admin.buyers(3).await;
    let (frozen_out, other, late) = (&buyers[0], &buyers[1], &buyers[2]);

    let pid = std::fs::read_to_string(stack.dir.join("pids/core.pid")).unwrap();
    let pid = pid.trim().to_owned();
    let thaw = Thaw(pid.clone());
    let frozen = std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap();
    assert!(frozen.success());
    let (status, answer) = app.buy(event, frozen_out, "frozen", body.clone()).await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "OUTCOME_UNKNOWN", "{answer}");
    assert_eq!(
        answer["error"]["status_url"],
        format!("/api/events/{event}/orders/status"),
        "{answer}"
    );
    // Any other call to the frozen core: unavailable, nothing is unknown about it.
    let page = app
        .http
        .get(format!("{}/api/events/{event}", app.edge_url))
        .bearer_auth(&frozen_out.token)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 503);
    let answer: serde_json::Value = page.json().await.unwrap();
    assert_eq!(answer["error"]["code"], "UNAVAILABLE", "{answer}");
    drop(thaw);

    // The thawed core may still take the frozen request; one of the two buys the unit.
    // (A moment of 503 SALE_BUSY is possible while it renews its leases.)
    let (others_status, others_answer) = buy_past_503s(&app, event, other, "other", &body).await;
    assert!(
        others_status == 202 || others_status == 409,
        "{others_status} {others_answer}"
    );
    assert!(
        the_edge_says_sold_out(&app, event, late, &body, Duration::from_secs(10)).await,
        "the edge never answered SOLD_OUT itself"
    );

    // Past the lifetime of a key that never had an answer (access.lua's PENDING_TTL_S).
    tokio::time::sleep(Duration::from_secs(16)).await;
    let expected = if others_status == 409 { 202 } else { 409 };
    let before = core_answers(&app, expected).await;
    let (status, answer) = app.buy(event, frozen_out, "frozen", body).await;
    assert_eq!(
        status, expected,
        "the other buyer had {others_status}; the retry got {answer}"
    );
    assert_eq!(
        core_answers(&app, expected).await,
        before + 1,
        "the edge answered from memory a key it had let through to a core that had it"
    );
}

/// A purchase the edge could not hand to any core (the stack's only core stopped: the
/// connection refused, not a byte sent) was taken nowhere, and the edge says so: 503
/// UNAVAILABLE with `Retry-After: 1` and no status URL; the same key retried once the
/// core is back is admitted as a first request (one order). And the edge forgets the
/// Idempotency-Key it let through: a key retried after the sell-out is refused from the
/// flags, not let through again as if a core might have admitted it — checked within
/// the 15 s a key let through is remembered without an answer (access.lua's
/// PENDING_TTL_S), past which a key never forgotten would have lapsed anyway.
#[tokio::test]
async fn a_purchase_to_a_stopped_core_is_unavailable_and_its_key_forgotten() {
    let (app, _edge) = stack_app().await;
    let stack = Stack::from_env();
    let (event, categories) = open_sale(&app, small_sale(2, 1, 1, 1)).await;
    let body = json!({"category_id": categories[0], "quantity": 1});
    let buyers = app.admin.buyers(4).await;
    let (back, sold_out, other, late) = (&buyers[0], &buyers[1], &buyers[2], &buyers[3]);
    let path = format!("/api/events/{event}/orders");

    let core = StoppedCore::stop(Stack::from_env()).await;
    let refused_at = tokio::time::Instant::now();
    for (buyer, key) in [(back, "back"), (sold_out, "sold-out")] {
        let auth = format!("Bearer {}", buyer.token);
        let a = raw_purchase(
            stack.edge_port,
            &path,
            &[("Authorization", &auth), ("Idempotency-Key", key)],
            &body.to_string(),
        )
        .await;
        assert_eq!(a.status, 503, "{a:?}");
        assert_eq!(a.json()["error"]["code"], "UNAVAILABLE", "{a:?}");
        assert_eq!(a.json()["error"].get("status_url"), None, "{a:?}");
        assert_eq!(a.header("retry-after"), Some("1"), "{a:?}");
    }
    assert_eq!(app.stock(event, categories[0]).await, 2);
    let recorded: bool = app
        .redis
        .clone()
        .hexists(
            app.keys().idempotency(Bucket::only(event)),
            format!("{}:back", back.user_id),
        )
        .await
        .unwrap();
    assert!(!recorded, "a purchase no core saw left its key in Redis");
    core.start().await;

    // The same key with the core back: admitted now (a moment of 503 is possible while
    // the core takes its leases).
    let (status, answer) = buy_past_503s(&app, event, back, "back", &body).await;
    assert_eq!(status, 202, "{answer}");
    let (status, answer) = app.buy(event, other, "other", body.clone()).await;
    assert_eq!(status, 202, "{answer}");
    assert!(
        the_edge_says_sold_out(&app, event, late, &body, Duration::from_secs(10)).await,
        "the edge never answered SOLD_OUT itself"
    );
    let before = core_answers(&app, 409).await;
    let (status, answer) = app.buy(event, sold_out, "sold-out", body.clone()).await;
    assert!(
        refused_at.elapsed() < Duration::from_secs(14),
        "too slow to tell a forgotten key from a lapsed one ({:?})",
        refused_at.elapsed()
    );
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["code"], "SOLD_OUT", "{answer}");
    assert_eq!(
        core_answers(&app, 409).await,
        before,
        "the edge let a key through again that no core ever saw"
    );

    // Two orders: the buyer who came back, and the other.
    let filter = |user: u64| format!("event_id = {event} AND user_id = {user}");
    let ordered = eventually(Duration::from_secs(20), || async {
        live_units(&app.mysql, &format!("event_id = {event}")).await == 2
    })
    .await;
    assert!(ordered, "the event's two units never became orders");
    assert_eq!(live_units(&app.mysql, &filter(back.user_id)).await, 1);
    assert_eq!(live_units(&app.mysql, &filter(other.user_id)).await, 1);
    assert_eq!(live_units(&app.mysql, &filter(sold_out.user_id)).await, 0);
}

/// The edge sends the core the headers it reads, no others: a request carrying 150 of
/// its own still gets the core's answer (hyper refuses over 100 with a bare 431), and a
/// purchase's headers still arrive.
#[tokio::test]
async fn the_core_gets_the_headers_it_reads_and_no_others() {
    let (app, _edge) = stack_app().await;
    let (event, categories) = open_sale(&app, small_sale(5, 1, 1, 2)).await;
    let buyer = app.admin.buyers(1).await.remove(0);
    let auth = format!("Bearer {}", buyer.token);
    let names: Vec<String> = (0..150).map(|i| format!("X-Noise-{i}")).collect();
    let mut headers: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
    headers.push(("Authorization", &auth));
    let port = Stack::from_env().edge_port;
    let a = raw_request(port, "GET", &format!("/api/events/{event}"), &headers, "").await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.json()["id"], event, "{a:?}");
    // A purchase with them: Authorization and Idempotency-Key reach the core.
    headers.push(("Idempotency-Key", "noisy"));
    headers.push(("Content-Type", "application/json"));
    let body = json!({"category_id": categories[0], "quantity": 1}).to_string();
    let path = format!("/api/events/{event}/orders");
    let a = raw_request(port, "POST", &path, &headers, &body).await;
    assert_eq!(a.status, 202, "{a:?}");
    let again = raw_request(port, "POST", &path, &headers, &body).await;
    assert_eq!(
        (again.status, again.json()["request_id"].clone()),
        (202, a.json()["request_id"].clone()),
        "the same key, the first answer"
    );
}

/// A purchase the core refused with a 503 that admitted nothing (SALE_BUSY: the sale's
/// keys are being rebuilt) is a refused one to the edge: its Idempotency-Key, retried
/// after the sell-out, hears the flags' SOLD_OUT from the edge — not let through to the
/// core as a key a core may have taken (as after OUTCOME_UNKNOWN or no answer).
#[tokio::test]
async fn a_key_the_core_refused_with_nothing_admitted_is_not_let_past_the_flags_again() {
    let (app, _edge) = stack_app().await;
    let (event, categories) = open_sale(&app, small_sale(1, 1, 1, 1)).await;
    let body = json!({"category_id": categories[0], "quantity": 1});
    let buyers = app.admin.buyers(3).await;
    let (refused, other, late) = (&buyers[0], &buyers[1], &buyers[2]);
    // The sale's metadata gone, as when the event is fenced: admission answers SALE_BUSY
    // until the preloader has rebuilt the keys.
    let _: () = app
        .redis
        .clone()
        .del(app.keys().meta(Bucket::only(event)))
        .await
        .unwrap();
    let auth = format!("Bearer {}", refused.token);
    let a = raw_purchase(
        Stack::from_env().edge_port,
        &format!("/api/events/{event}/orders"),
        &[("Authorization", &auth), ("Idempotency-Key", "busy")],
        &body.to_string(),
    )
    .await;
    assert_eq!(
        (a.status, a.json()["error"]["code"].as_str()),
        (503, Some("SALE_BUSY")),
        "{a:?}"
    );
    assert_eq!(
        a.header("x-stampede-admitted"),
        None,
        "the core's word to the edge reached the client: {a:?}"
    );
    let bought = eventually(Duration::from_secs(20), || async {
        app.buy(event, other, "other", body.clone()).await.0 == 202
    })
    .await;
    assert!(bought, "the rebuilt sale never admitted the other buyer");
    assert!(
        the_edge_says_sold_out(&app, event, late, &body, Duration::from_secs(10)).await,
        "the edge never answered SOLD_OUT itself"
    );
    let before = core_answers(&app, 409).await;
    let (status, answer) = app.buy(event, refused, "busy", body).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (409, Some("SOLD_OUT")),
        "{answer}"
    );
    assert_eq!(
        core_answers(&app, 409).await,
        before,
        "the edge let a refused key through to the core again"
    );
}
