//! Behind the door: the payment simulator, the ops server's stats, token secret rotation.

use std::time::Duration;

use stampede_e2e::{Stack, raw_request, root, stack_app};

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
    // With it: 200 (asserted by the helper).
    crate::edge::edge_stats(&app).await;
}

/// The simulator's page delivers a payment as a provider does: again while the shop
/// answers 5xx or not at all, and then, never confirmed, sends the browser back with
/// `payment=unconfirmed` (the shop may have applied it: its 503 after the commit says
/// so), never "refused"; a 4xx (here a signature the shop does not know) is "refused".
#[tokio::test]
async fn the_payment_simulator_says_unconfirmed_when_the_shop_never_answered() {
    let stack = Stack::from_env();
    let cases = [
        // Nothing listens on a port handed out and never bound.
        (
            format!("http://127.0.0.1:{}/", stampede_e2e::free_port()),
            "unconfirmed",
        ),
        (
            format!("http://127.0.0.1:{}/api/payments/callback", stack.edge_port),
            "refused",
        ),
    ];
    let secret = std::env::temp_dir().join(format!("stampede-paysim-{}", std::process::id()));
    std::fs::write(&secret, "not-the-shop-s-secret-at-all").unwrap();
    for (callback_url, outcome) in cases {
        let port = stampede_e2e::free_port();
        let mut sim = tokio::process::Command::new(stampede_e2e::paysim_binary())
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--secret-file")
            .arg(&secret)
            .args(["--callback-url", &callback_url])
            .args(["--app-origin", "http://127.0.0.1:1"])
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let up = stampede_e2e::eventually(Duration::from_secs(10), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        assert!(up, "the simulator did not start on {port}");
        let own = format!("http://127.0.0.1:{port}");
        let form = [
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Origin", own.as_str()),
        ];
        let started = std::time::Instant::now();
        let a = raw_request(
            port,
            "POST",
            "/paysim/pay",
            &form,
            "order_no=1&amount_cents=1&action=pay&return=%2F",
        )
        .await;
        assert_eq!(a.status, 303, "{callback_url}: {a:?}");
        assert_eq!(
            a.header("location"),
            Some(format!("http://127.0.0.1:1/?payment={outcome}").as_str()),
            "{callback_url}"
        );
        if outcome == "unconfirmed" {
            // Five deliveries, 0.25 + 0.5 + 1 + 2 s apart.
            assert!(
                started.elapsed() >= Duration::from_millis(3_700),
                "{:?}",
                started.elapsed()
            );
        }
        sim.kill().await.unwrap();
    }
    std::fs::remove_file(&secret).unwrap();
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
