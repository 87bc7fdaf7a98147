//! Trust at the door: every path has one spelling at the edge and in the core, the
//! edge is deny-by-default under /api, a retried purchase gets its first answer even
//! after the sell-out, the payment simulator is nowhere on the public port, the ops
//! server's counters need the admin token, and the token secret rotates live.

use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;
use stampede_e2e::{RawAnswer, Stack, eventually, raw_request, root, small_sale, stack_app};

use crate::edge::{core_answers, open_sale};

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
            let headers = [
                ("Authorization", auth.as_str()),
                ("Idempotency-Key", key.as_str()),
                ("Content-Type", "application/json"),
            ];
            let a = raw_request(port, "POST", path, &headers, &body).await;
            assert_not_found(&a, &format!("{at} {path}"));
        }
    }
    let stock = app.stock(event, ga).await;
    let held: u64 = app
        .redis
        .clone()
        .hlen(app.keys().held(event))
        .await
        .unwrap();
    assert_eq!((stock, held), (5, 0), "nothing reserved");

    // The one spelling does reserve: the checks above could have failed.
    let key = "the-one-spelling";
    let headers = [
        ("Authorization", auth.as_str()),
        ("Idempotency-Key", key),
        ("Content-Type", "application/json"),
    ];
    let a = raw_request(
        stack.edge_port,
        "POST",
        &format!("/api/events/{e}/orders"),
        &headers,
        &body,
    )
    .await;
    assert_eq!(a.status, 202, "{a:?}");
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
    let mut n = 0;
    let edge_says_sold_out = eventually(Duration::from_secs(10), || {
        n += 1;
        let key = format!("late-{n}");
        let (app, late, body) = (&app, &late, body.clone());
        async move {
            let before = core_answers(app, 409).await;
            let (status, answer) = app.buy(event, late, &key, body).await;
            status == 409
                && answer["error"]["code"] == "SOLD_OUT"
                && core_answers(app, 409).await == before
        }
    })
    .await;
    assert!(
        edge_says_sold_out,
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

#[tokio::test]
async fn the_payment_simulator_is_not_on_the_public_port_and_redirects_home_only() {
    let (app, _edge) = stack_app().await;
    let stack = Stack::from_env();
    for (method, path) in [
        ("GET", "/paysim/pay?order_no=1&amount_cents=1&return=%2F"),
        ("POST", "/paysim/pay"),
        ("GET", "/paysim/health"),
    ] {
        let a = raw_request(
            stack.edge_port,
            method,
            path,
            &[],
            "order_no=1&amount_cents=1",
        )
        .await;
        assert_eq!(a.status, 404, "edge {method} {path}: {a:?}");
    }
    // The simulator itself, on its loopback port: only its own page posts its form, only
    // under its own address (no other site, no name rebound to 127.0.0.1).
    let own = format!("http://127.0.0.1:{}", stack.paysim_port);
    let decline = "order_no=1&amount_cents=1&action=decline&return=%2F";
    let form_type = ("Content-Type", "application/x-www-form-urlencoded");
    for (headers, status) in [
        (vec![form_type], 403),
        (vec![form_type, ("Origin", "http://evil.example")], 403),
        (vec![form_type, ("Origin", "null")], 403),
        (
            vec![
                form_type,
                ("Origin", own.as_str()),
                ("Host", "evil.example"),
            ],
            421,
        ),
    ] {
        let a = raw_request(stack.paysim_port, "POST", "/paysim/pay", &headers, decline).await;
        assert_eq!(a.status, status, "{headers:?}: {a:?}");
        assert_eq!(a.header("location"), None);
    }
    // A return path on the shop only.
    let form = [form_type, ("Origin", own.as_str())];
    for ret in [
        "%2F%5Cevil.example",
        "/%5Cevil.example",
        "%2F%2Fevil.example",
        "https://evil.example",
        "/a%0Ab",
        "/a%0D%0ASet-Cookie:%20x=1",
        "/a%00",
        "/%C3%A9",
    ] {
        let body = format!("order_no=1&amount_cents=1&action=decline&return={ret}");
        let a = raw_request(stack.paysim_port, "POST", "/paysim/pay", &form, &body).await;
        assert_eq!(a.status, 400, "return={ret}: {a:?}");
        assert_eq!(a.header("location"), None, "return={ret}");
    }
    let a = raw_request(
        stack.paysim_port,
        "POST",
        "/paysim/pay",
        &form,
        "order_no=1&amount_cents=1&action=decline&return=%2F%23%2Forder%2F1",
    )
    .await;
    assert_eq!(a.status, 303, "{a:?}");
    assert_eq!(
        a.header("location"),
        Some(
            format!(
                "http://127.0.0.1:{}/#/order/1?payment=declined",
                stack.edge_port
            )
            .as_str()
        )
    );
    let health = raw_request(stack.paysim_port, "GET", "/paysim/health", &[], "").await;
    assert_eq!(
        (health.status, health.body.as_str()),
        (200, "ok"),
        "still serving"
    );
    // It will not listen where others could reach it.
    let out = tokio::process::Command::new(stampede_e2e::paysim_binary())
        .args(["serve", "--listen", "0.0.0.0:0", "--secret-file"])
        .arg(stack.dir.join("provider.secret"))
        .args([
            "--callback-url",
            "http://127.0.0.1:1/",
            "--app-origin",
            "http://127.0.0.1:1",
        ])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback only"));
    drop(app);
}

#[tokio::test]
async fn the_ops_servers_edge_stats_need_the_admin_token() {
    let (app, _edge) = stack_app().await;
    let stack = Stack::from_env();
    for auth in ["", "Bearer wrong-token-of-some-length"] {
        let headers: Vec<(&str, &str)> = if auth.is_empty() {
            vec![]
        } else {
            vec![("Authorization", auth)]
        };
        let a = raw_request(stack.ops_port, "GET", "/edge/stats", &headers, "").await;
        assert_eq!(a.status, 401, "{auth:?}: {a:?}");
        assert_eq!(a.json()["error"]["code"], "UNAUTHORIZED");
    }
    let auth = format!("Bearer {}", app.admin.token);
    let a = raw_request(
        stack.ops_port,
        "GET",
        "/edge/stats",
        &[("Authorization", &auth)],
        "",
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
}

#[tokio::test]
async fn the_token_secret_rotates_with_no_restart_and_no_logout() {
    let (app, _edge) = stack_app().await;
    let stack = Stack::from_env();
    let before = app.admin.buyers(1).await.remove(0);
    let kid = |token: &str| token.split('.').next().unwrap().to_owned();
    let old_kid = kid(&before.token);
    let out = std::process::Command::new(root().join("scripts/stack.sh"))
        .arg("rotate-token-secret")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The core re-reads the keyring within a second; its new tokens carry the new key.
    let mut after = None;
    for _ in 0..50 {
        let b = app.admin.buyers(1).await.remove(0);
        if kid(&b.token) != old_kid {
            after = Some(b);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after =
        after.unwrap_or_else(|| panic!("the core still signs with key {old_kid} after 5 s"));
    let keyring = stack.secret("token.secret");
    assert_eq!(
        keyring.lines().count(),
        2,
        "the new secret and the previous one"
    );
    // Both tokens work at the edge and at the core: nobody was logged out.
    for (who, token) in [("before", &before.token), ("after", &after.token)] {
        let auth = format!("Bearer {token}");
        for (port, at) in [(stack.edge_port, "edge"), (stack.core_port, "core")] {
            let a = raw_request(port, "GET", "/api/events", &[("Authorization", &auth)], "").await;
            assert_eq!(a.status, 200, "{who} at the {at}: {a:?}");
        }
    }
}

async fn login(app: &stampede_e2e::TestApp, username: &str, password: &str) -> reqwest::Response {
    login_from(app, "127.0.0.1", username, password).await
}

/// A login as the edge would pass it on for a client at `address` (a header only).
async fn login_from(
    app: &stampede_e2e::TestApp,
    address: &str,
    username: &str,
    password: &str,
) -> reqwest::Response {
    app.http
        .post(format!("{}/api/login", app.public_url))
        .header("X-Forwarded-For", address)
        .json(&json!({"username": username, "password": password}))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn failed_logins_make_that_account_wait_longer_and_longer() {
    let app = stampede_e2e::spawn_app_with(|s| {
        s.login.free_failures = 3;
        s.login.base_delay_ms = 60_000;
        s.login.account_max_failures = 6;
    })
    .await;
    let (status, users) = app
        .admin_api
        .post(
            "/admin/users",
            json!({"count": 2, "password": "right-password"}),
        )
        .await;
    assert_eq!(status, 201, "{users}");
    let first = users["first_user_id"].as_u64().unwrap();
    let (victim, bystander) = (format!("user{first}"), format!("user{}", first + 1));
    // Spellings the database matches to the same account count as that account.
    let upper = victim.to_uppercase();
    let padded = format!("{victim}  ");
    for (attempt, name) in [&victim, &upper, &padded].into_iter().enumerate() {
        let resp = login(&app, name, "guess").await;
        assert_eq!(resp.status(), 401, "attempt {attempt} as {name:?}");
    }
    // The next try from that address waits, even with the right password: it is not
    // even checked.
    let resp = login(&app, &victim.replacen('u', "U", 1), "right-password").await;
    assert_eq!(resp.status(), 429);
    let wait: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((50..=60).contains(&wait), "Retry-After {wait}");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "RATE_LIMITED");
    // The owner, at another address, is not locked out by the guesser's failures.
    let owner = login_from(&app, "127.0.0.2", &victim, "right-password").await;
    assert_eq!(owner.status(), 200);
    // A guesser spread over addresses meets the account's ceiling: 6 failures in all.
    for _ in 0..3 {
        let resp = login_from(&app, "127.0.0.3", &victim, "guess").await;
        assert_eq!(resp.status(), 401);
    }
    let resp = login_from(&app, "127.0.0.4", &victim, "right-password").await;
    assert_eq!(
        resp.status(),
        429,
        "the account's ceiling holds at every address"
    );
    // Unknown accounts are counted alike, so the answers do not tell who exists.
    for _ in 0..3 {
        assert_eq!(login(&app, "no-such-user", "guess").await.status(), 401);
    }
    assert_eq!(login(&app, "no-such-user", "guess").await.status(), 429);
    // Another account is not held up; its success forgets its failures there.
    assert_eq!(login(&app, &bystander, "guess").await.status(), 401);
    assert_eq!(
        login(&app, &bystander, "right-password").await.status(),
        200
    );
    let key = app.keys().login_failures(&bystander, "127.0.0.1");
    let left: bool = app.redis.clone().exists(&key).await.unwrap();
    assert!(!left, "a success forgets the failures");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_checks_at_once_are_bounded_with_503_and_retry_after() {
    let app = stampede_e2e::spawn_app_with(|s| s.login.max_concurrent_checks = 1).await;
    let (_, users) = app
        .admin_api
        .post(
            "/admin/users",
            json!({"count": 1, "password": "right-password"}),
        )
        .await;
    let user = format!("user{}", users["first_user_id"].as_u64().unwrap());
    let mut logins = tokio::task::JoinSet::new();
    for _ in 0..12 {
        let (http, url, user) = (app.http.clone(), app.public_url.clone(), user.clone());
        logins.spawn(async move {
            let resp = http
                .post(format!("{url}/api/login"))
                .json(&json!({"username": user, "password": "right-password"}))
                .send()
                .await
                .unwrap();
            let retry = resp.headers().get("retry-after").is_some();
            (resp.status().as_u16(), retry)
        });
    }
    let mut answers = Vec::new();
    while let Some(a) = logins.join_next().await {
        answers.push(a.unwrap());
    }
    assert!(
        answers.iter().all(|(s, _)| *s == 200 || *s == 503),
        "{answers:?}"
    );
    assert!(answers.iter().any(|(s, _)| *s == 200), "{answers:?}");
    assert!(answers.iter().any(|(s, _)| *s == 503), "{answers:?}");
    assert!(
        answers.iter().filter(|(s, _)| *s == 503).all(|(_, r)| *r),
        "Retry-After on every 503"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_body_that_never_arrives_is_cut_off_with_408() {
    let app = stampede_e2e::spawn_app_with(|s| s.server.read_timeout_ms = 500).await;
    let port: u16 = app.public_url.rsplit(':').next().unwrap().parse().unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream
        .write_all(b"POST /api/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"user")
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("the core answers a stalled body")
        .ok();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("REQUEST_TIMEOUT"), "{text}");
    app.stop().await;
}

#[tokio::test]
async fn past_the_connection_cap_a_client_waits_for_a_free_one() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = stampede_e2e::spawn_app_with(|s| s.server.max_connections = 2).await;
    let port: u16 = app.public_url.rsplit(':').next().unwrap().parse().unwrap();
    let connect = || tokio::net::TcpStream::connect(("127.0.0.1", port));
    // Two idle connections hold both permits.
    let first = connect().await.unwrap();
    let _second = connect().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = connect().await.unwrap(); // the kernel queues it
    third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let early =
        tokio::time::timeout(Duration::from_millis(500), third.read_to_end(&mut answer)).await;
    assert!(
        early.is_err(),
        "answered past the cap: {:?}",
        String::from_utf8_lossy(&answer)
    );
    // One closes: the queued connection is served.
    drop(first);
    tokio::time::timeout(Duration::from_secs(5), third.read_to_end(&mut answer))
        .await
        .expect("served once a permit is free")
        .unwrap();
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
    app.stop().await;
}
