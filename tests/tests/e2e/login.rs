//! The login guard: failed logins wait longer and longer, password checks are bounded.

use redis::AsyncCommands;
use serde_json::json;

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

/// Logins sent all at once from one client address, each `(username, password)`: each
/// answer's status, whether it carried Retry-After, and its body, in the order sent.
async fn logins_at_once(
    app: &stampede_e2e::TestApp,
    address: &str,
    attempts: Vec<(String, String)>,
) -> Vec<(u16, bool, serde_json::Value)> {
    let mut logins = tokio::task::JoinSet::new();
    for (i, (user, password)) in attempts.into_iter().enumerate() {
        let (http, url) = (app.http.clone(), app.public_url.clone());
        let address = address.to_owned();
        logins.spawn(async move {
            let resp = http
                .post(format!("{url}/api/login"))
                .header("X-Forwarded-For", address)
                .json(&json!({"username": user, "password": password}))
                .send()
                .await
                .unwrap();
            let retry = resp.headers().get("retry-after").is_some();
            let status = resp.status().as_u16();
            let body = resp.json().await.unwrap_or(serde_json::Value::Null);
            (i, (status, retry, body))
        });
    }
    let mut answers = Vec::new();
    while let Some(a) = logins.join_next().await {
        answers.push(a.unwrap());
    }
    answers.sort_by_key(|(i, _)| *i);
    answers.into_iter().map(|(_, a)| a).collect()
}

#[tokio::test]
async fn failed_logins_make_that_account_wait_longer_and_longer() {
    let app = stampede_e2e::spawn_app_with(|s| {
        s.login.free_failures = 3;
        s.login.base_delay_ms = 60_000;
        s.login.account_max_failures = 6;
    })
    .await;
    let first = app.admin_api.users_with_password(2, "right-password").await;
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
    let app = stampede_e2e::spawn_app_with(|s| {
        (s.login.max_concurrent_checks, s.login.check_wait_ms) = (1, 0);
    })
    .await;
    let first = app.admin_api.users_with_password(1, "right-password").await;
    let user = format!("user{first}");
    let attempts = vec![(user, "right-password".to_owned()); 12];
    let answers: Vec<(u16, bool)> = logins_at_once(&app, "127.0.0.1", attempts)
        .await
        .into_iter()
        .map(|(status, retry, _)| (status, retry))
        .collect();
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

/// A burst of sign-ins larger than the slots is served in turn while each waits less
/// than `login.check_wait_ms` (one slot here, a wait far longer than the burst needs):
/// every login succeeds. Without the wait all but the first answered 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_logins_waits_its_turn_for_the_password_checks() {
    let app = stampede_e2e::spawn_app_with(|s| {
        (s.login.max_concurrent_checks, s.login.check_wait_ms) = (1, 7_000);
    })
    .await;
    let first = app.admin_api.users_with_password(6, "right-password").await;
    let attempts = (first..first + 6)
        .map(|user| (format!("user{user}"), "right-password".to_owned()))
        .collect();
    let answers: Vec<(u16, Option<u64>, u64)> = logins_at_once(&app, "127.0.0.1", attempts)
        .await
        .into_iter()
        .zip(first..)
        .map(|((status, _, body), user)| (status, body["user_id"].as_u64(), user))
        .collect();
    assert!(
        answers
            .iter()
            .all(|&(s, id, user)| s == 200 && id == Some(user)),
        "{answers:?}"
    );
    app.stop().await;
}

/// A burst of guesses at one account from one address, all at once and each willing to
/// wait for a slot: each is judged once it holds a slot, against every failure recorded
/// before it, so no more than `free_failures` + (slots − 1) passwords are checked; the
/// others wait their turn and are told to wait (429). Read before the wait, the whole
/// burst passed the same read and every guess was checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_guesses_gets_no_more_checks_than_the_free_failures() {
    let app = stampede_e2e::spawn_app_with(|s| {
        (s.login.max_concurrent_checks, s.login.check_wait_ms) = (2, 7_000);
        (s.login.free_failures, s.login.max_waiting) = (3, 100);
    })
    .await;
    let first = app.admin_api.users_with_password(1, "right-password").await;
    let user = format!("user{first}");
    let attempts = (0..24)
        .map(|n| (user.clone(), format!("guess-{n}")))
        .collect();
    let answers: Vec<u16> = logins_at_once(&app, "127.0.0.9", attempts)
        .await
        .into_iter()
        .map(|(status, _, _)| status)
        .collect();
    let checked = answers.iter().filter(|s| **s == 401).count();
    assert!(
        answers.iter().all(|s| *s == 401 || *s == 429),
        "{answers:?}"
    );
    assert!((3..=4).contains(&checked), "passwords checked: {answers:?}");
    app.stop().await;
}

/// `token`'s answer from a core's public API (an authenticated read).
async fn asked_with(app: &stampede_e2e::TestApp, token: &str) -> u16 {
    app.http
        .get(format!("{}/api/events", app.public_url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// A core's reads of the signed-out users, by kind (`stampede_revoked_reads_total`).
async fn revoked_reads(app: &stampede_e2e::TestApp, read: &str) -> u64 {
    let series = format!("stampede_revoked_reads_total{{read=\"{read}\"}}");
    app.admin_api.counter(&series).await.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_out_on_one_core_reaches_the_other_as_a_change() {
    let first = stampede_e2e::spawn_app().await;
    let second = stampede_e2e::spawn_app_on(
        first.settings.clone(),
        first.database.clone(),
        first.prefix.clone(),
    )
    .await;
    let buyers = first.admin_api.buyers(3).await;
    for b in &buyers {
        for core in [&first, &second] {
            assert_eq!(asked_with(core, &b.token).await, 200);
        }
    }
    // Each core read the hash whole before it served (not counted); from now on only
    // its changes.
    let whole_before = [
        revoked_reads(&first, "whole").await,
        revoked_reads(&second, "whole").await,
    ];
    let sign_out = |core: &stampede_e2e::TestApp, token: &str| {
        let request = core
            .http
            .post(format!("{}/api/logout", core.public_url))
            .bearer_auth(token);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    // Each core's sign-out is refused by the other within its next reads.
    for (signed_out, by, other) in [(0, &first, &second), (1, &second, &first)] {
        let token = &buyers[signed_out].token;
        assert_eq!(sign_out(by, token).await, 200);
        assert_eq!(asked_with(by, token).await, 401, "the core signed out on");
        let refused = stampede_e2e::eventually(std::time::Duration::from_secs(5), || async {
            asked_with(other, token).await == 401
        })
        .await;
        assert!(refused, "the other core took a signed-out token");
    }
    for (core, whole_before) in [&first, &second].into_iter().zip(whole_before) {
        assert_eq!(asked_with(core, &buyers[0].token).await, 401);
        assert_eq!(asked_with(core, &buyers[1].token).await, 401);
        assert_eq!(asked_with(core, &buyers[2].token).await, 200, "a bystander");
        // Read as changes: no core read the whole hash again.
        assert_eq!(revoked_reads(core, "whole").await, whole_before);
        assert!(revoked_reads(core, "changes").await >= 1);
    }
    second.halt().await;
    first.stop().await;
}
