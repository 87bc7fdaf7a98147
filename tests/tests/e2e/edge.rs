//! The edge of the test stack (nginx + Lua), in front of the test stack's core.

use stampede_e2e::Stack;

fn edge(path: &str) -> String {
    format!("http://127.0.0.1:{}{path}", Stack::from_env().edge_port)
}

#[tokio::test]
async fn the_edge_serves_the_app_and_runs_lua() {
    let http = reqwest::Client::new();
    let page = http
        .get(edge("/"))
        .send()
        .await
        .expect("the test stack's edge answers");
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("<h1>Stampede</h1>"));
    let health = http.get(edge("/edge/health")).send().await.unwrap();
    assert_eq!(health.text().await.unwrap(), "ok");
}

#[tokio::test]
async fn the_edge_proxies_the_api_to_the_core() {
    let resp = reqwest::get(edge("/api/no-such-thing")).await.unwrap();
    assert_eq!(resp.status(), 404);
    // The core's own error shape, so the request went through to it.
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "NOT_FOUND");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/api/no-such-thing"),
        "{body}"
    );
}

#[tokio::test]
async fn the_edge_never_exposes_the_admin_api() {
    let stack = Stack::from_env();
    let token = stack.secret("admin.token");
    let http = reqwest::Client::new();
    for path in ["/admin/events", "/admin", "/admin/../admin/events"] {
        let resp = http
            .get(edge(path))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404, "{path}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "NOT_FOUND");
    }
}

#[tokio::test]
async fn oversized_bodies_get_413_in_the_error_shape() {
    let resp = reqwest::Client::new()
        .post(edge("/api/events/1/orders"))
        .body(vec![b'x'; 64 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "PAYLOAD_TOO_LARGE");
}
