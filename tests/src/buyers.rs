//! Buyers and their purchases.

use serde_json::Value;

/// A buyer: a user id and a signed token, from the admin API.
#[derive(Debug, Clone)]
pub struct Buyer {
    pub user_id: u64,
    pub token: String,
}

/// `POST {base}/api/events/{id}/orders` with a token and an Idempotency-Key.
pub async fn purchase(
    http: &reqwest::Client,
    base: &str,
    event_id: u64,
    token: &str,
    key: &str,
    body: Value,
) -> (u16, Value) {
    try_purchase(http, base, event_id, token, key, body)
        .await
        .expect("the purchase gets an answer")
}

/// [`purchase`], or None when no answer came (the core died under it).
pub async fn try_purchase(
    http: &reqwest::Client,
    base: &str,
    event_id: u64,
    token: &str,
    key: &str,
    body: Value,
) -> Option<(u16, Value)> {
    let resp = http
        .post(format!("{base}/api/events/{event_id}/orders"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .ok()?;
    let status = resp.status().as_u16();
    let text = resp.text().await.ok()?;
    Some((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}
