//! Through the real nginx + Lua edge of the test stack, in front of the stack's core:
//! what it serves, what it proxies, and what it refuses itself. These tests share that
//! edge (and may change its limits), so each holds its lock.

use std::time::Duration;

use serde_json::json;
use stampede_core::auth::token::TokenSigner;
use stampede_e2e::{RawAnswer, Stack, StackApp, eventually, raw_request, small_sale, stack_app};

async fn edge_get(app: &StackApp, path: &str, token: Option<&str>) -> reqwest::Response {
    let mut req = app.http.get(format!("{}{path}", app.edge_url));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.expect("the test stack's edge answers")
}

/// How many answers of `status` the stack's core gave on its public port.
pub(crate) async fn core_answers(app: &StackApp, status: u16) -> u64 {
    app.admin
        .counter(&format!(
            "stampede_http_responses_total{{listener=\"public\",status=\"{status}\"}}"
        ))
        .await
        .unwrap_or(0)
}

/// Whether, `within` this long, `buyer` (a fresh Idempotency-Key each ask, `late-<n>`)
/// hears SOLD_OUT from the edge itself for `body`, over eight fresh connections in a
/// row (so from every worker of the edge: each adopts a flag on its own refresh timer,
/// and a test that went on after one worker's answer met another still without it on a
/// loaded machine): the core's count of 409 answers stays put meanwhile.
pub(crate) async fn the_edge_says_sold_out(
    app: &StackApp,
    event: u64,
    buyer: &stampede_e2e::Buyer,
    body: &serde_json::Value,
    within: Duration,
) -> bool {
    let port = Stack::from_env().edge_port;
    the_edge_on_says_sold_out(app, port, event, buyer, body, within).await
        && every_edge_worker_has_the_published_snapshot(app).await
}

/// `GET /edge/stats` of the stack's edge (its ops server, with the admin token): 200,
/// its JSON.
pub(crate) async fn edge_stats(app: &StackApp) -> serde_json::Value {
    let auth = format!("Bearer {}", app.admin.token);
    let ops_port = Stack::from_env().ops_port;
    let a = raw_request(
        ops_port,
        "GET",
        "/edge/stats",
        &[("Authorization", &auth)],
        "",
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    a.json()
}

/// Whether every worker of the stack's edge answers from the sales snapshot published
/// now, or a newer one, within 5 s (`/edge/stats`). Fresh connections reach a worker
/// the kernel picks: eight of them saying sold out may all have reached one, and a
/// worker left behind answered otherwise later (the last notes' flake).
pub(crate) async fn every_edge_worker_has_the_published_snapshot(app: &StackApp) -> bool {
    let stats = || async { edge_stats(app).await["snapshot"].clone() };
    let published = stats().await["published"].as_i64().expect("published");
    let last = std::sync::Mutex::new(serde_json::Value::Null);
    let caught_up = eventually(Duration::from_secs(5), || {
        let (got, last) = (stats(), &last);
        async move {
            let got = got.await;
            let workers = got["workers"].as_object().cloned().unwrap_or_default();
            *last.lock().unwrap() = got;
            !workers.is_empty()
                && workers
                    .values()
                    .all(|v| v.as_i64().is_some_and(|v| v >= published))
        }
    })
    .await;
    if !caught_up {
        let last = last.lock().unwrap();
        eprintln!("an edge worker is behind the snapshot published ({published}): {last}");
    }
    caught_up
}

/// [`the_edge_says_sold_out`] of the edge on `port` (one of the test's own).
pub(crate) async fn the_edge_on_says_sold_out(
    app: &StackApp,
    port: u16,
    event: u64,
    buyer: &stampede_e2e::Buyer,
    body: &serde_json::Value,
    within: Duration,
) -> bool {
    let path = format!("/api/events/{event}/orders");
    let (auth, body) = (format!("Bearer {}", buyer.token), body.to_string());
    let mut n = 0;
    eventually(within, || {
        let (path, auth, body) = (path.clone(), auth.clone(), body.clone());
        let first = n;
        n += 8;
        async move {
            let before = core_answers(app, 409).await;
            for k in first..first + 8 {
                let key = format!("late-{k}");
                let headers = [("Authorization", auth.as_str()), ("Idempotency-Key", &key)];
                let a = raw_purchase(port, &path, &headers, &body).await;
                if a.status != 409 || !a.body.contains("\"SOLD_OUT\"") {
                    return false;
                }
            }
            core_answers(app, 409).await == before
        }
    })
    .await
}

/// Creates and publishes a sale, then waits until the edge knows it is open.
pub(crate) async fn open_sale(app: &StackApp, sale: serde_json::Value) -> (u64, Vec<u64>) {
    let (event, categories) = app.admin.create_event(sale).await;
    app.admin.publish(event).await;
    let probe = app.admin.buyers(1).await.remove(0);
    let known = eventually(Duration::from_secs(3), || async {
        // An empty body reaches the core (400) once the edge's gate lets the event through.
        let (status, _) = app.buy(event, &probe, "probe", json!({})).await;
        status != 403
    })
    .await;
    assert!(known, "the edge did not learn of event {event}");
    stampede_e2e::edge_workers_catch_up().await;
    (event, categories)
}

#[tokio::test]
async fn the_edge_serves_the_app_runs_lua_and_hides_the_admin_api() {
    let (app, _edge) = stack_app().await;
    let page = edge_get(&app, "/", None).await;
    assert_eq!(page.status(), 200);
    assert!(
        page.text()
            .await
            .unwrap()
            .contains(r#"<script src="/app.js"></script>"#)
    );
    let script = edge_get(&app, "/app.js", None).await;
    assert_eq!(script.status(), 200);
    assert!(
        script.headers()["content-type"]
            .to_str()
            .unwrap()
            .contains("javascript")
    );
    // The edge's counters are the ops server's, not the public port's.
    assert_eq!(edge_get(&app, "/edge/stats", None).await.status(), 404);
    assert_eq!(
        edge_get(&app, "/edge/health", None)
            .await
            .text()
            .await
            .unwrap(),
        "ok"
    );
    for path in ["/admin/events", "/admin", "/admin/../admin/events"] {
        let resp = edge_get(&app, path, Some(&app.admin.token)).await;
        assert_eq!(resp.status(), 404, "{path}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "NOT_FOUND");
    }
}

#[tokio::test]
async fn the_edge_proxies_the_api_to_the_core_for_a_valid_token() {
    let (app, _edge) = stack_app().await;
    let buyer = app.admin.buyers(1).await.remove(0);
    let resp = edge_get(&app, "/api/events", Some(&buyer.token)).await;
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert!(
        body["events"].is_array() && body["server_time_ms"].is_i64(),
        "{body}"
    );
    // Deny-by-default: a path the core does not serve is the edge's own 404.
    let resp = edge_get(&app, "/api/no-such-thing", Some(&buyer.token)).await;
    assert_eq!(resp.status(), 404);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "NOT_FOUND");
    assert_eq!(
        body["error"]["message"], "no such endpoint",
        "the edge's answer: {body}"
    );
}

#[tokio::test]
async fn oversized_bodies_get_413_in_the_error_shape() {
    let (app, _edge) = stack_app().await;
    let resp = app
        .http
        .post(format!("{}/api/events/1/orders", app.edge_url))
        .body(vec![b'x'; 64 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "PAYLOAD_TOO_LARGE");
}

/// `a` is the whole refusal: `status`, a JSON body in the error shape with exactly
/// `code` and `message` and nothing else, its length declared (not chunked).
fn assert_refusal(a: &RawAnswer, status: u16, code: &str, message: &str) {
    let body = format!(r#"{{"error":{{"code":"{code}","message":"{message}"}}}}"#);
    assert_eq!(
        (a.status, a.body.as_str()),
        (status, body.as_str()),
        "{a:?}"
    );
    assert_eq!(a.header("content-type"), Some("application/json"), "{a:?}");
    assert_eq!(
        a.header("content-length"),
        Some(body.len().to_string().as_str()),
        "{a:?}"
    );
    assert_eq!(a.header("transfer-encoding"), None, "{a:?}");
}

/// A purchase POST to `port` as raw bytes: `headers` (its token, Idempotency-Key) and the
/// JSON body's.
pub(crate) async fn raw_purchase(
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> RawAnswer {
    let mut all = vec![("Content-Type", "application/json")];
    all.extend_from_slice(headers);
    raw_request(port, "POST", path, &all, body).await
}

/// `raw_purchase` to the stack's edge.
async fn raw_edge_purchase(path: &str, headers: &[(&str, &str)], body: &str) -> RawAnswer {
    raw_purchase(Stack::from_env().edge_port, path, headers, body).await
}

#[tokio::test]
async fn every_refusal_of_the_edge_is_a_whole_answer_with_its_own_message() {
    let (app, _edge) = stack_app().await;
    let (event, categories) = open_sale(&app, small_sale(2, 1, 1, 20)).await;
    let buyers = app.admin.buyers(2).await;
    let auth = format!("Bearer {}", buyers[0].token);
    let body = json!({"category_id": categories[0], "quantity": 1}).to_string();
    let path = format!("/api/events/{event}/orders");
    let mut before = Vec::new();
    for status in [400, 401, 403, 404, 405, 429] {
        before.push((status, core_answers(&app, status).await));
    }
    let with_key = |key: &'static str| [("Authorization", auth.as_str()), ("Idempotency-Key", key)];

    // The purchase location's pattern takes 20 digits; the Lua refuses past u64.
    let a = raw_edge_purchase(
        "/api/events/99999999999999999999/orders",
        &with_key("k1"),
        &body,
    )
    .await;
    assert_refusal(&a, 404, "NOT_FOUND", "no such endpoint");
    let a = raw_edge_purchase(&path, &with_key(""), &body).await;
    assert_refusal(
        &a,
        400,
        "INVALID",
        "header Idempotency-Key is required: 1..=64 visible ASCII characters",
    );
    // A body Lua builds (the method the endpoint takes), through its status's location.
    let a = raw_request(
        Stack::from_env().edge_port,
        "GET",
        &path,
        &with_key("k1"),
        "",
    )
    .await;
    assert_refusal(&a, 405, "METHOD_NOT_ALLOWED", "this endpoint takes POST");
    assert_eq!(a.header("allow"), Some("POST"), "{a:?}");

    // Up to the per-user limit's five a second, then 429 with when to come back.
    let mut buys = tokio::task::JoinSet::new();
    for n in 0..8 {
        let (path, body, auth) = (path.clone(), body.clone(), auth.clone());
        buys.spawn(async move {
            let key = format!("burst-{n}");
            raw_edge_purchase(
                &path,
                &[("Authorization", &auth), ("Idempotency-Key", &key)],
                &body,
            )
            .await
        });
    }
    let answers = buys.join_all().await;
    let limited: Vec<_> = answers.iter().filter(|a| a.status == 429).collect();
    assert!(
        !limited.is_empty(),
        "8 purchases at once, 5 a second allowed: {answers:?}"
    );
    for a in limited {
        assert_refusal(a, 429, "RATE_LIMITED", "too many requests");
        assert!(
            a.header("retry-after")
                .is_some_and(|s| s.parse::<u32>().is_ok()),
            "{a:?}"
        );
    }

    // The two units are gone: the edge's flag, then the whole answer.
    let late = &buyers[1];
    let sold = json!({"category_id": categories[0], "quantity": 1});
    assert!(the_edge_says_sold_out(&app, event, late, &sold, Duration::from_secs(10)).await);
    let late_auth = format!("Bearer {}", late.token);
    let a = raw_edge_purchase(
        &path,
        &[("Authorization", &late_auth), ("Idempotency-Key", "after")],
        &body,
    )
    .await;
    assert_refusal(&a, 409, "SOLD_OUT", "sold out");

    let mut later = small_sale(5, 1, 1, 2);
    later["sale_start"] = json!("2031-01-01T00:00:00Z");
    let (closed, _) = app.admin.create_event(later).await;
    app.admin.publish(closed).await;
    tokio::time::sleep(Duration::from_millis(600)).await; // past two edge refreshes
    let a = raw_edge_purchase(
        &format!("/api/events/{closed}/orders"),
        &with_key("k2"),
        &body,
    )
    .await;
    assert_refusal(&a, 403, "NOT_OPEN", "the sale is not open");

    for (status, count) in before {
        let now = core_answers(&app, status).await;
        assert_eq!(
            now, count,
            "{status}s from the core: the edge should have answered"
        );
    }
}

#[tokio::test]
async fn bad_expired_and_forged_tokens_get_401_at_the_edge() {
    let (app, _edge) = stack_app().await;
    // A sale on now: only a refusal from memory (sold out, not open) comes before the
    // signature (the next test).
    let (event, _) = open_sale(&app, small_sale(5, 1, 1, 2)).await;
    let buyer = app.admin.buyers(1).await.remove(0);
    let secret = Stack::from_env().secret("token.secret");
    let signer = TokenSigner::from_text(&secret).unwrap();
    let forger = TokenSigner::from_text("some-other-secret-entirely").unwrap();
    let cases = [
        (None, "missing bearer token"),
        (
            Some(format!("Basic {}", buyer.token)),
            "missing bearer token",
        ),
        (Some("Bearer garbage".to_owned()), "malformed token"),
        (
            Some(format!("Bearer {}", signer.sign(buyer.user_id, 1_000))),
            "token expired",
        ),
        (
            Some(format!(
                "Bearer {}",
                forger.sign(buyer.user_id, 4_000_000_000)
            )),
            "token signed with a retired or unknown key",
        ),
        (
            Some(format!(
                "Bearer {}",
                claiming(&buyer.token, buyer.user_id + 1)
            )),
            "bad token signature",
        ),
    ];
    let before = core_answers(&app, 401).await;
    for (auth, why) in cases {
        let headers: Vec<(&str, &str)> = auth
            .iter()
            .map(|a| ("Authorization", a.as_str()))
            .chain([("Idempotency-Key", "k")])
            .collect();
        let a = raw_edge_purchase(&format!("/api/events/{event}/orders"), &headers, "{}").await;
        assert_refusal(&a, 401, "UNAUTHORIZED", why);
    }
    assert_eq!(
        core_answers(&app, 401).await,
        before,
        "the edge answered them"
    );
}

/// A token claiming `user_id` with `token`'s signature: well formed, signed by a key of
/// the keyring, never valid.
fn claiming(token: &str, user_id: u64) -> String {
    let mut parts: Vec<&str> = token.split('.').collect();
    let user = user_id.to_string();
    parts[1] = &user;
    parts.join(".")
}

/// A sold-out sale is refused from memory before the token's signature is checked (its
/// form, key and expiry are): the refusal says what the listing says, and a stampede's
/// buyers each bring a token the edge has not seen. A purchase that would go on to the
/// core — a remembered Idempotency-Key — meets the signature first, and a bad one hears
/// the same refusal as any other.
#[tokio::test]
async fn a_sold_out_sale_is_refused_before_the_signature_and_nothing_unsigned_passes_or_learns() {
    let (app, _edge) = stack_app().await;
    let (event, categories) = open_sale(&app, small_sale(1, 1, 1, 2)).await;
    let buyers = app.admin.buyers(2).await;
    let (owner, late) = (&buyers[0], &buyers[1]);
    let ga = json!({"category_id": categories[0], "quantity": 1});
    let (status, first) = app.buy(event, owner, "mine", ga.clone()).await;
    assert_eq!(status, 202, "{first}");
    assert!(the_edge_says_sold_out(&app, event, late, &ga, Duration::from_secs(10)).await);

    let path = format!("/api/events/{event}/orders");
    let body = ga.to_string();
    let secret = Stack::from_env().secret("token.secret");
    let expired = TokenSigner::from_text(&secret)
        .unwrap()
        .sign(owner.user_id, 1_000);
    // The late buyer's token made to claim the owner: a signature that does not verify.
    let forged = format!("Bearer {}", claiming(&late.token, owner.user_id));
    let before = (core_answers(&app, 401).await, core_answers(&app, 409).await);
    let send = |auth: Option<String>, key: &'static str| {
        let (path, body) = (path.clone(), body.clone());
        async move {
            let mut headers: Vec<(&str, &str)> = vec![("Idempotency-Key", key)];
            if let Some(a) = auth.as_deref() {
                headers.push(("Authorization", a));
            }
            raw_edge_purchase(&path, &headers, &body).await
        }
    };
    // The cheap checks still come first.
    let a = send(None, "fresh-1").await;
    assert_refusal(&a, 401, "UNAUTHORIZED", "missing bearer token");
    let a = send(Some("Bearer garbage".into()), "fresh-2").await;
    assert_refusal(&a, 401, "UNAUTHORIZED", "malformed token");
    let a = send(Some(format!("Bearer {expired}")), "fresh-3").await;
    assert_refusal(&a, 401, "UNAUTHORIZED", "token expired");
    // An unverified claim hears what anyone would: sold out.
    let a = send(Some(forged.clone()), "fresh-4").await;
    assert_refusal(&a, 409, "SOLD_OUT", "sold out");
    // The owner's remembered key would go on to the core, and a forged claim to it is
    // refused at the edge with the same answer: 401 would tell the forger the key was
    // used.
    let a = send(Some(forged.clone()), "mine").await;
    assert_refusal(&a, 409, "SOLD_OUT", "sold out");
    let a = send(None, "").await;
    assert_refusal(&a, 401, "UNAUTHORIZED", "missing bearer token");
    let a = send(Some(forged.clone()), "").await;
    assert_refusal(
        &a,
        400,
        "INVALID",
        "header Idempotency-Key is required: 1..=64 visible ASCII characters",
    );
    let forged_expired = format!("Bearer {}", claiming(&expired, late.user_id));
    let a = send(Some(forged_expired), "fresh-5").await;
    assert_refusal(&a, 401, "UNAUTHORIZED", "token expired");
    // Nor does a forged token ever count as verified: over fresh connections (any of
    // nginx's workers), the same token on a sale still open is 401.
    let (open, open_categories) = open_sale(&app, small_sale(5, 1, 1, 2)).await;
    let open_body = json!({"category_id": open_categories[0], "quantity": 1}).to_string();
    for n in 0..8 {
        let sold = send(Some(forged.clone()), "fresh-6").await;
        assert_refusal(&sold, 409, "SOLD_OUT", "sold out");
        let key = format!("open-{n}");
        let a = raw_edge_purchase(
            &format!("/api/events/{open}/orders"),
            &[("Authorization", &forged), ("Idempotency-Key", &key)],
            &open_body,
        )
        .await;
        assert_refusal(&a, 401, "UNAUTHORIZED", "bad token signature");
    }
    assert_eq!(
        (core_answers(&app, 401).await, core_answers(&app, 409).await),
        before,
        "the edge answered every one of them"
    );
    let (status, again) = app.buy(event, owner, "mine", ga.clone()).await;
    assert_eq!(
        (status, &again["request_id"]),
        (202, &first["request_id"]),
        "{again}"
    );
}

#[tokio::test]
async fn a_sale_not_yet_open_gets_403_at_the_edge() {
    let (app, _edge) = stack_app().await;
    let mut later = small_sale(5, 1, 1, 2);
    later["sale_start"] = json!("2031-01-01T00:00:00Z");
    let (event, categories) = app.admin.create_event(later).await;
    app.admin.publish(event).await;
    let buyer = app.admin.buyers(1).await.remove(0);
    tokio::time::sleep(Duration::from_millis(600)).await; // past two edge refreshes
    let (status, body) = app
        .buy(
            event,
            &buyer,
            "k",
            json!({"category_id": categories[0], "quantity": 1}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("NOT_OPEN")),
        "{body}"
    );
    let stock = app.stock(event, categories[0]).await;
    assert_eq!(stock, 5);
}

/// One token asking an order view (a MySQL read at the core) 400 times at once meets
/// the edge's per-user API limit (`api_user`: 50 a second, bursts of 100) long before
/// its address's: most are answered 429 RATE_LIMITED with Retry-After by the edge, and
/// the core sees no more than the burst and what refilled; another buyer at the same
/// address is not held back.
#[tokio::test]
async fn one_token_asking_in_a_loop_meets_the_per_user_api_limit() {
    let (app, _edge) = stack_app().await;
    let buyers = app.admin.buyers(2).await;
    let before = core_answers(&app, 404).await;
    let started = std::time::Instant::now();
    let mut asks = tokio::task::JoinSet::new();
    for _ in 0..400 {
        let ask = app
            .http
            .get(format!("{}/api/orders/123456789", app.edge_url))
            .bearer_auth(&buyers[0].token);
        asks.spawn(async move { ask.send().await.expect("the test stack's edge answers") });
    }
    let answers = asks.join_all().await;
    let elapsed = started.elapsed();
    let mut limited = 0;
    for a in answers {
        if a.status() == 429 {
            limited += 1;
            assert!(a.headers().contains_key("retry-after"), "{a:?}");
            let body: serde_json::Value = a.json().await.unwrap();
            assert_eq!(body["error"]["code"], "RATE_LIMITED", "{body}");
        } else {
            assert_eq!(a.status(), 404);
        }
    }
    let passed = 400 - limited;
    let most = 100 + 50 * (elapsed.as_millis() as u64 / 1000 + 1);
    assert!(
        passed <= most,
        "{passed} of 400 passed in {elapsed:?} (at most {most})"
    );
    assert!(core_answers(&app, 404).await - before >= passed);
    let other = edge_get(&app, "/api/orders/123456789", Some(&buyers[1].token)).await;
    assert_eq!(other.status(), 404, "another buyer is not held back");
}

/// One address holding more requests open than the edge's cap (`limit_conn`, 2048) is
/// answered 429 RATE_LIMITED with Retry-After, as every other 429 (untested before; it
/// had no Retry-After). The open requests are payment callbacks whose bodies never come
/// (nginx holds each, reading its body, until its timeout or the close).
#[tokio::test]
async fn an_address_over_the_connection_cap_hears_429_with_retry_after() {
    use tokio::io::AsyncWriteExt;
    const CAP: usize = 2048;
    let (_app, _edge) = stack_app().await;
    // A few hundred over the cap: a held request some other limit refuses (the
    // address's api_ip window, shared with other tests' traffic) must not leave the
    // address under the cap.
    const HELD: usize = CAP + 256;
    let port = Stack::from_env().edge_port;
    // The held sockets, and some: the soft open-file limit up to the hard one.
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct given.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        let want = (HELD as libc::rlim_t + 512).min(limit.rlim_max);
        if limit.rlim_cur < want {
            limit.rlim_cur = want;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
        }
    }
    assert!(
        limit.rlim_max >= HELD as libc::rlim_t + 512,
        "this test opens {HELD} connections: the hard open-file limit is {}",
        limit.rlim_max
    );
    let head = format!(
        "POST /api/payments/callback HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    );
    let mut held = Vec::with_capacity(HELD);
    for _ in 0..HELD {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        s.write_all(head.as_bytes()).await.unwrap();
        held.push(s);
    }
    // Every held request counts once nginx has read its header: a moment.
    let last = std::cell::RefCell::new(None);
    let refused = eventually(Duration::from_secs(10), || async {
        let a = raw_request(port, "GET", "/edge/health", &[], "").await;
        let refused = a.status == 429;
        *last.borrow_mut() = Some(a);
        refused
    })
    .await;
    let a = last.into_inner().unwrap();
    if !refused {
        // What the held requests heard already, if anything: the first line of each.
        let mut heard = std::collections::BTreeMap::<String, usize>::new();
        for s in &held {
            let mut buf = [0u8; 64];
            let line = match s.try_read(&mut buf) {
                Ok(0) => "closed".to_owned(),
                Ok(n) => String::from_utf8_lossy(&buf[..n])
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_owned(),
                Err(_) => "nothing".to_owned(),
            };
            *heard.entry(line).or_default() += 1;
        }
        panic!("no 429 with {HELD} requests held; they heard {heard:?}; the last probe: {a:?}");
    }
    assert_eq!(a.json()["error"]["code"], "RATE_LIMITED", "{a:?}");
    assert_eq!(a.header("retry-after"), Some("1"), "{a:?}");
    drop(held);
    let back = eventually(Duration::from_secs(10), || async {
        raw_request(port, "GET", "/edge/health", &[], "")
            .await
            .status
            == 200
    })
    .await;
    assert!(
        back,
        "the address stayed capped after its connections closed"
    );
}

/// A buyer signs out (`POST /api/logout`): from then on that token is refused 401 by
/// the edge itself (the core never sees it) and by the core, for a view and for a
/// purchase, while another buyer's token works; a login right after (the same second)
/// gives a token that works. An operator's revoke-tokens does the same for any user.
/// Hostile variants: no token, another method, an unknown user, no admin token.
#[tokio::test]
async fn a_signed_out_token_is_refused_everywhere_and_a_new_login_works() {
    let (app, _edge) = stack_app().await;
    let stack = Stack::from_env();
    let core = format!("http://127.0.0.1:{}", stack.core_port);
    let (event, categories) = open_sale(&app, small_sale(5, 1, 1, 20)).await;
    let user = app.admin.users_with_password(1, "sign-out-pass").await;
    let login = || async {
        let r = app
            .http
            .post(format!("{}/api/login", app.edge_url))
            .json(&json!({"username": format!("user{user}"), "password": "sign-out-pass"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.json::<serde_json::Value>().await.unwrap()["token"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let get = |base: String, token: String| {
        let http = app.http.clone();
        async move {
            let r = http
                .get(format!("{base}/api/events"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.text().await.unwrap())
        }
    };
    let first = login().await;
    let other = app.admin.buyers(1).await.remove(0);
    assert_eq!(get(app.edge_url.clone(), first.clone()).await.0, 200);

    let r = app
        .http
        .post(format!("{}/api/logout", app.edge_url))
        .bearer_auth(&first)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["signed_out"], true, "{body}");
    // At once: a token that outlives the sign-out.
    let second = login().await;
    assert_eq!(get(core.clone(), first.clone()).await.0, 401, "the core");
    let refused_at_edge = eventually(Duration::from_secs(5), || async {
        let (status, body) = get(app.edge_url.clone(), first.clone()).await;
        status == 401 && body.contains("signed out")
    })
    .await;
    assert!(refused_at_edge, "the edge still takes the signed-out token");
    stampede_e2e::edge_workers_catch_up().await;
    let before = core_answers(&app, 401).await;
    for i in 0..8 {
        assert_eq!(get(app.edge_url.clone(), first.clone()).await.0, 401);
        let (status, a) = app
            .buy(
                event,
                &stampede_e2e::Buyer {
                    user_id: user,
                    token: first.clone(),
                },
                &format!("after-{i}"),
                json!({"category_id": categories[0], "quantity": 1}),
            )
            .await;
        assert_eq!(status, 401, "{a}");
    }
    assert_eq!(
        core_answers(&app, 401).await,
        before,
        "the edge let a signed-out token through to the core"
    );
    for token in [&second, &other.token] {
        assert_eq!(get(app.edge_url.clone(), token.clone()).await.0, 200);
        assert_eq!(get(core.clone(), token.clone()).await.0, 200);
    }
    // Signed out again at once: the token of the login after the first sign-out (made
    // to outlive it) is void too, and a third login works.
    let r = app
        .http
        .post(format!("{}/api/logout", app.edge_url))
        .bearer_auth(&second)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        get(core.clone(), second.clone()).await.0,
        401,
        "the second token"
    );
    let second = login().await;
    assert_eq!(
        get(core.clone(), second.clone()).await.0,
        200,
        "a third login"
    );

    // An operator signs another user out.
    let path = format!("/admin/users/{}/revoke-tokens", other.user_id);
    let (status, body) = app.admin.post(&path, serde_json::Value::Null).await;
    assert_eq!(status, 200, "{body}");
    let refused = eventually(Duration::from_secs(5), || async {
        get(app.edge_url.clone(), other.token.clone()).await.0 == 401
    })
    .await;
    assert!(refused, "the edge still takes the revoked token");
    assert_eq!(get(core.clone(), other.token.clone()).await.0, 401);
    assert_eq!(get(app.edge_url.clone(), second.clone()).await.0, 200);

    // Hostile variants.
    let (status, _) = app
        .admin
        .post(
            "/admin/users/999999999999/revoke-tokens",
            serde_json::Value::Null,
        )
        .await;
    assert_eq!(status, 404);
    let (status, _) = app.admin.get(&path).await;
    assert_eq!(status, 405);
    let r = app
        .http
        .post(format!("http://127.0.0.1:{}{path}", stack.admin_port))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "no admin token");
    let r = app
        .http
        .post(format!("{}/api/logout", app.edge_url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "no token");
    let r = app
        .http
        .get(format!("{}/api/logout", app.edge_url))
        .bearer_auth(&second)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(get(app.edge_url.clone(), second.clone()).await.0, 200);
}

/// What the edge and the core read of the signed-out users, in reads that found a
/// change: whole, and changes (with the edge's five-minute and the core's one-minute
/// whole reads, which take in any change pending too); and the core's pid.
#[derive(Debug, Clone, PartialEq)]
struct RevokedReads {
    edge_whole: u64,
    edge_changes: u64,
    core_whole: u64,
    core_changes: u64,
    core_pid: String,
}

async fn revoked_reads(app: &StackApp) -> RevokedReads {
    let stats = edge_stats(app).await;
    let r = &stats["revoked"];
    let n = |field: &str| r[field].as_u64().unwrap_or_else(|| panic!("{field}: {r}"));
    let core = |read: &'static str| async move {
        app.admin
            .counter(&format!("stampede_revoked_reads_total{{read=\"{read}\"}}"))
            .await
            .unwrap_or(0)
    };
    RevokedReads {
        edge_whole: n("whole_reads"),
        edge_changes: n("change_reads") + n("again_reads"),
        core_whole: core("whole").await,
        core_changes: core("changes").await + core("prune").await,
        core_pid: std::fs::read_to_string(Stack::from_env().dir.join("pids/core.pid"))
            .unwrap_or_default(),
    }
}

/// A sign-out reaches each core and edge as a change read from the hash's log
/// (revoke_tokens.lua's `l:<version>`), not as a read of every signed-out user: with
/// 100 000 of them and four sign-outs a second, the edge spent 0.88 of a core re-reading
/// and re-encoding the hash. A reader that cannot catch up from the log (its changes
/// gone), or whose version Redis reached again with other changes (a failover to a
/// replica behind it), reads the whole hash once, and follows the changes again after.
#[tokio::test]
async fn sign_outs_reach_the_edge_and_the_core_as_changes_and_a_gap_as_one_whole_read() {
    let (app, _edge) = stack_app().await;
    let (app, stack) = (&app, &Stack::from_env());
    let buyers = app.admin.buyers(5).await;
    let sign_out = |token: String| {
        let http = app.http.clone();
        let url = format!("{}/api/logout", app.edge_url);
        async move {
            let r = http.post(url).bearer_auth(token).send().await.unwrap();
            assert_eq!(r.status(), 200);
        }
    };
    // Over a fresh connection each (any worker of the edge).
    let refused = |token: String| async move {
        let auth = format!("Bearer {token}");
        let a = raw_request(
            stack.edge_port,
            "GET",
            "/api/events",
            &[("Authorization", &auth)],
            "",
        )
        .await;
        a.status == 401 && a.body.contains("signed out")
    };
    // By the edge itself: eight asks in a row refused, the core's 401s unchanged.
    let refused_by_the_edge = |token: String| async move {
        eventually(Duration::from_secs(5), || {
            let token = token.clone();
            async move {
                let before = core_answers(app, 401).await;
                for _ in 0..8 {
                    if !refused(token.clone()).await {
                        return false;
                    }
                }
                core_answers(app, 401).await == before
            }
        })
        .await
    };
    // The reads after `before` that found changes, and the whole ones.
    let changes_only = |before: &RevokedReads, after: &RevokedReads| {
        assert_eq!(
            after.edge_whole, before.edge_whole,
            "the edge read the whole hash: {before:?} → {after:?}"
        );
        assert!(
            after.edge_changes > before.edge_changes,
            "the edge read no change: {before:?} → {after:?}"
        );
        // (A core restarted meanwhile counts from 0 again.)
        if after.core_pid == before.core_pid {
            assert_eq!(
                after.core_whole, before.core_whole,
                "the core read the whole hash: {before:?} → {after:?}"
            );
            assert!(
                after.core_changes > before.core_changes,
                "the core read no change: {before:?} → {after:?}"
            );
        }
    };
    let whole_once = |before: RevokedReads| async move {
        eventually(Duration::from_secs(5), || {
            let before = before.clone();
            async move {
                let after = revoked_reads(app).await;
                after.edge_whole > before.edge_whole
                    && (after.core_pid != before.core_pid || after.core_whole > before.core_whole)
            }
        })
        .await
    };
    let mut redis = stack.redis().await;
    let key = stampede_core::keys::Keys::new(&stack.redis_settings().key_prefix).revoked_tokens();

    // Sign-outs: changes.
    let before = revoked_reads(app).await;
    for b in &buyers[..3] {
        sign_out(b.token.clone()).await;
    }
    for b in &buyers[..3] {
        assert!(
            refused_by_the_edge(b.token.clone()).await,
            "the edge took a signed-out token"
        );
    }
    tokio::time::sleep(Duration::from_millis(600)).await; // the core's next read (250 ms)
    changes_only(&before, &revoked_reads(app).await);

    // A version the log has no changes for (raised past it): one whole read each.
    let before = revoked_reads(app).await;
    let _: i64 = redis::cmd("HINCRBY")
        .arg(&key)
        .arg("v")
        .arg(5_000)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(
        whole_once(before).await,
        "no whole read after a gap in the log"
    );

    // The readers' version reached again with another change (as after a failover to a
    // replica that had not yet the last sign-out): one whole read, and that sign-out
    // refused by the edge (with the version alone compared, it never was).
    let before = revoked_reads(app).await;
    let v: i64 = redis::cmd("HINCRBY")
        .arg(&key)
        .arg("v")
        .arg(-1)
        .query_async(&mut redis)
        .await
        .unwrap();
    let _: i64 = redis::cmd("HDEL")
        .arg(&key)
        .arg(format!("l:{}", v + 1))
        .query_async(&mut redis)
        .await
        .unwrap();
    sign_out(buyers[3].token.clone()).await;
    assert!(
        whole_once(before).await,
        "the same version with another change: no whole read"
    );
    assert!(
        refused_by_the_edge(buyers[3].token.clone()).await,
        "the edge took a signed-out token"
    );

    // And changes again after.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let before = revoked_reads(app).await;
    sign_out(buyers[4].token.clone()).await;
    assert!(
        refused_by_the_edge(buyers[4].token.clone()).await,
        "the edge took a signed-out token"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    changes_only(&before, &revoked_reads(app).await);
    // Still signed out, all of them; another buyer's token still works.
    for b in &buyers {
        assert!(refused(b.token.clone()).await);
    }
    let other = app.admin.buyers(1).await.remove(0);
    assert!(!refused(other.token).await);
}

/// Lines of Redis's MONITOR on `port` for `within`: every command any client sent.
async fn monitored(port: u16, within: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("the test's Redis answers");
    conn.write_all(b"MONITOR\r\n").await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let until = tokio::time::Instant::now() + within;
    while let Ok(Ok(n)) = tokio::time::timeout_at(until, conn.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_asked_about_is_read_every_tick_and_one_nobody_asks_about_once_a_second() {
    // An edge of its own on a Redis of its own, with two sales on written by hand, each
    // of one category sold out (the edge answers their purchases itself).
    let stack = Stack::from_env();
    let redis_server = stampede_e2e::OwnRedis::start();
    let mut redis = redis_server.connection().await.unwrap();
    let keys = stampede_core::keys::Keys::new(&stack.redis_settings().key_prefix);
    let now_ms = chrono::Utc::now().timestamp_millis();
    let (asked, quiet) = (9_100_001u64, 9_100_002u64);
    for id in [asked, quiet] {
        let window = format!("open:{}:{}", now_ms - 3_600_000, now_ms + 3_600_000);
        let _: () = redis::pipe()
            .hset_multiple(
                keys.event_meta(id),
                &[("categories", "1"), ("epoch", "1"), ("buckets", "1")],
            )
            .hset(keys.sold_out(id), "1", "1")
            .hset(keys.sales_index(), id, window)
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    let edge = stampede_e2e::OwnEdge::start(&stack, redis_server.port);
    let token = TokenSigner::from_text(&stack.secret("token.secret"))
        .unwrap()
        .sign(1, chrono::Utc::now().timestamp() + 3_600);
    let http = reqwest::Client::new();
    let ask = |n: u32| {
        let request = http
            .post(format!("{}/api/events/{asked}/orders", edge.url()))
            .bearer_auth(&token)
            .header("Idempotency-Key", format!("k{n}"))
            .json(&json!({"category_id": 1, "quantity": 1}));
        async move { request.send().await.unwrap().status().as_u16() }
    };
    let answered = eventually(Duration::from_secs(10), || async { ask(0).await == 409 }).await;
    assert!(answered, "the edge did not refuse the sold-out sale");
    // Asked about every 100 ms for four seconds, the other sale never.
    let watch = tokio::spawn(monitored(redis_server.port, Duration::from_secs(4)));
    for n in 1..=40 {
        assert_eq!(ask(n).await, 409);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let commands = watch.await.unwrap();
    let reads = |id: u64| {
        commands
            .matches(&format!("\"{}\"", keys.sold_out(id)))
            .count()
    };
    let (asked_reads, quiet_reads) = (reads(asked), reads(quiet));
    // Every 0.2 s (20 in four seconds) against every second (4).
    assert!(
        (2..=6).contains(&quiet_reads) && asked_reads >= 2 * quiet_reads + 2,
        "sold-out flags read {asked_reads} times for the sale asked about, {quiet_reads} for the other"
    );
}

/// A train nobody asks about through an edge keeps its seat stamp between the reads of
/// its quiet ticks, so a journey's kept count still answers after a lull (HIT). The
/// quiet ticks dropped the stamp: a first ask after a lull went to the core for a full
/// count of every seat, past the cache, the lock and the budget (review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_train_nobody_asks_about_keeps_its_kept_counts_between_reads() {
    let (app, _edge) = stack_app().await;
    let (event, _) = open_sale(&app, crate::trains::small_train("G9")).await;
    let stack = Stack::from_env();
    // An edge of its own (its own cache and marks) on the stack's Redis and core.
    let edge = stampede_e2e::OwnEdge::start(&stack, stack.redis_port);
    let buyer = app.admin.buyers(1).await.remove(0);
    let url = format!("{}/api/events/{event}/availability?from=0&to=2", edge.url());
    let ask = || async {
        let r = app
            .http
            .get(&url)
            .bearer_auth(&buyer.token)
            .send()
            .await
            .unwrap();
        let cache = r
            .headers()
            .get("x-cache")
            .map(|v| v.to_str().unwrap().to_owned());
        (r.status().as_u16(), cache.unwrap_or_default())
    };
    let counted = eventually(Duration::from_secs(10), || async {
        ask().await == (200, "MISS".to_owned())
    })
    .await;
    assert!(counted, "the own edge did not count the journey");
    let kept = eventually(Duration::from_secs(3), || async {
        ask().await == (200, "HIT".to_owned())
    })
    .await;
    assert!(kept, "the count was not kept");
    // Three lulls past the "asked about" mark (5 s): each ask after one lands on a quiet
    // tick four times in five, where a dropped stamp would send it to the core.
    for lull in 0..3 {
        tokio::time::sleep(Duration::from_millis(5_600)).await;
        assert_eq!(ask().await, (200, "HIT".to_owned()), "after lull {lull}");
    }
}
