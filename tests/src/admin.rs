//! The admin API as the tests call it: events, publishing, buyers with tokens.

use serde_json::Value;

use crate::buyers::Buyer;

/// An admin API with its token.
#[derive(Clone)]
pub struct AdminClient {
    pub http: reqwest::Client,
    pub url: String,
    pub token: String,
}

impl AdminClient {
    /// The admin API at `url` of a core configured with `settings` (its admin token).
    pub fn of(url: &str, settings: &stampede_core::Settings) -> AdminClient {
        use secrecy::ExposeSecret;
        AdminClient {
            http: reqwest::Client::new(),
            url: url.to_owned(),
            token: settings
                .auth
                .admin_token
                .as_ref()
                .expect("the settings carry an admin token")
                .expose_secret()
                .to_owned(),
        }
    }

    /// An admin call with the admin token; returns status and JSON body.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.expect("the admin API answers");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, None).await
    }

    /// A counter's value from `/metrics`: `series` is its name with its labels as the
    /// core prints them (`name{label="v"}`); None while the core does not print it (a
    /// labelled series never counted, or no such metric).
    pub async fn counter(&self, series: &str) -> Option<u64> {
        let (status, metrics) = self.get("/metrics").await;
        assert_eq!(status, 200, "{metrics}");
        let prefix = format!("{series} ");
        metrics
            .as_str()
            .unwrap_or("")
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str())?.parse::<u64>().ok())
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    /// Creates an event; returns its id and its category ids in order.
    pub async fn create_event(&self, body: Value) -> (u64, Vec<u64>) {
        let (status, created) = self.post("/admin/events", body).await;
        assert_eq!(status, 201, "{created}");
        let categories = created["categories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_u64().unwrap())
            .collect();
        (created["event_id"].as_u64().unwrap(), categories)
    }

    /// Publishes an event; returns the answer's body.
    pub async fn publish(&self, event_id: u64) -> Value {
        let (status, body) = self
            .post(&format!("/admin/events/{event_id}/publish"), Value::Null)
            .await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Closes an event's sale; returns the answer's body.
    pub async fn close(&self, event_id: u64) -> Value {
        let (status, body) = self
            .post(&format!("/admin/events/{event_id}/close"), Value::Null)
            .await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// `count` new users who sign in with `password` (as `user<id>`); the first's id.
    pub async fn users_with_password(&self, count: u64, password: &str) -> u64 {
        let (status, users) = self
            .post(
                "/admin/users",
                serde_json::json!({"count": count, "password": password}),
            )
            .await;
        assert_eq!(status, 201, "{users}");
        users["first_user_id"].as_u64().unwrap()
    }

    /// `count` new users with tokens valid for an hour.
    pub async fn buyers(&self, count: u64) -> Vec<Buyer> {
        let (status, users) = self
            .post("/admin/users", serde_json::json!({"count": count}))
            .await;
        assert_eq!(status, 201, "{users}");
        let first = users["first_user_id"].as_u64().unwrap();
        let (status, tokens) = self
            .post(
                "/admin/tokens",
                serde_json::json!({"first_user_id": first, "count": count, "ttl_s": 3600}),
            )
            .await;
        assert_eq!(status, 200, "{tokens}");
        tokens["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, t)| Buyer {
                user_id: first + i as u64,
                token: t.as_str().unwrap().to_owned(),
            })
            .collect()
    }
}
