//! Purchases: `POST /api/events/{id}/orders` and the status a buyer polls.

use http::StatusCode;
use serde_json::json;

use crate::admission::{self, AdmissionError, status};
use crate::app::AppState;
use crate::http::{ApiError, Request, Response, json, read_json};

/// Longest Idempotency-Key accepted.
const MAX_KEY_LEN: usize = 64;

pub async fn create(
    state: &AppState,
    event_id: Result<u64, ApiError>,
    user_id: u64,
    req: Request,
) -> Result<Response, ApiError> {
    let event_id = event_id?;
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| {
            !k.is_empty() && k.len() <= MAX_KEY_LEN && k.bytes().all(|b| b.is_ascii_graphic())
        })
        .ok_or_else(|| {
            ApiError::Invalid(format!(
                "header Idempotency-Key is required: 1..={MAX_KEY_LEN} visible ASCII characters"
            ))
        })?
        .to_owned();
    let body = read_json(req, state.config.settings.server.max_body_bytes).await?;
    match admission::admit(state, event_id, user_id, &key, body).await {
        Ok(r) => Ok(json(
            StatusCode::ACCEPTED,
            &json!({"status": "QUEUED", "request_id": r.request_id.to_string(), "seats": r.seats}),
        )),
        Err(AdmissionError::Refused(refusal)) => Err(refusal.into()),
        Err(AdmissionError::Unexpected(e)) => Err(ApiError::Unexpected(e)),
    }
}

pub async fn status(
    state: &AppState,
    event_id: Result<u64, ApiError>,
    user_id: u64,
) -> Result<Response, ApiError> {
    let event_id = event_id?;
    match status::of_user(state, event_id, user_id).await? {
        Some(s) => Ok(json(StatusCode::OK, &s)),
        None => Err(ApiError::NotFound(format!(
            "no purchase of yours in event {event_id}"
        ))),
    }
}
