use serde_json::json;
use stampede_core::auth::token::TokenSigner;
use stampede_e2e::spawn_app;

#[tokio::test]
async fn bulk_users_arrive_as_one_contiguous_id_range() {
    let app = spawn_app().await;
    let (status, first) = app.post("/admin/users", json!({"count": 100_000})).await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(first["count"], 100_000);
    let (status, second) = app
        .post(
            "/admin/users",
            json!({"count": 5, "password": "correct horse"}),
        )
        .await;
    assert_eq!(status, 201);
    assert_eq!(
        second["first_user_id"].as_u64(),
        first["last_user_id"].as_u64().map(|l| l + 1)
    );
    assert_eq!(app.count("SELECT COUNT(*) FROM app_user").await, 100_005);
    let last = second["last_user_id"].as_u64().unwrap();
    assert_eq!(
        app.count(&format!("SELECT COUNT(*) FROM app_user WHERE id = {last} AND username = 'user{last}' AND password_hash LIKE '$argon2%'")).await,
        1
    );
    for bad in [
        json!({"count": 0}),
        json!({"count": 2_000_000}),
        json!({"count": 3, "password": "short"}),
        json!({}),
    ] {
        let (status, body) = app.post("/admin/users", bad.clone()).await;
        assert_eq!(status, 400, "{bad} → {body}");
    }
    assert_eq!(app.count("SELECT COUNT(*) FROM app_user").await, 100_005);
    app.stop().await;
}

#[tokio::test]
async fn tokens_are_signed_for_existing_users_only() {
    let app = spawn_app().await;
    let (_, users) = app.post("/admin/users", json!({"count": 10})).await;
    let first = users["first_user_id"].as_u64().unwrap();
    let (status, body) = app
        .post(
            "/admin/tokens",
            json!({"first_user_id": first, "count": 10, "ttl_s": 600}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let tokens = body["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 10);
    let signer = TokenSigner::from_text(&app.token_secret).unwrap();
    let now = chrono_now();
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(
            signer.verify(t.as_str().unwrap(), now),
            Ok(first + i as u64)
        );
    }
    let (status, body) = app
        .post(
            "/admin/tokens",
            json!({"first_user_id": first + 5, "count": 10, "ttl_s": 600}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("do not all exist"),
        "{body}"
    );
    let (status, _) = app
        .post(
            "/admin/tokens",
            json!({"first_user_id": first, "count": 1, "ttl_s": 0}),
        )
        .await;
    assert_eq!(status, 400);
    app.stop().await;
}

fn chrono_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}
