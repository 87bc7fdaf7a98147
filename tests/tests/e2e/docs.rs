//! docs/openapi.yaml against the code: every documented operation exists on the core.

use stampede_e2e::{root, spawn_app};

#[tokio::test]
async fn every_documented_operation_is_served_by_the_core() {
    let spec: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(root().join("docs/openapi.yaml")).unwrap())
            .expect("docs/openapi.yaml is valid YAML");
    let app = spawn_app().await;
    let buyer = app.buyers(1).await.remove(0);
    let paths = spec["paths"].as_mapping().expect("paths");
    assert!(paths.len() >= 18, "only {} paths documented", paths.len());
    for (path, operations) in paths {
        let path = path.as_str().unwrap();
        for (method, _) in operations.as_mapping().unwrap() {
            let method: reqwest::Method = method.as_str().unwrap().to_uppercase().parse().unwrap();
            let concrete = path.replace("{id}", "1").replace("{order_no}", "1");
            let (base, token) = if path.starts_with("/api/") {
                (&app.public_url, &buyer.token)
            } else {
                (&app.admin_url, &app.admin_token)
            };
            let resp = app
                .http
                .request(method.clone(), format!("{base}{concrete}"))
                .bearer_auth(token)
                .header("Idempotency-Key", "docs")
                .json(&serde_json::json!({}))
                .send()
                .await
                .unwrap();
            let status = resp.status();
            let body = resp.text().await.unwrap();
            assert!(
                !(status == 404 && body.contains("no such endpoint")),
                "{method} {path} is documented but not served: {body}"
            );
        }
    }
    app.stop().await;
}
