//! Load-test tokens: `POST /admin/tokens {"first_user_id","count","ttl_s"}` → signed user
//! tokens in the format the edge verifies, for users that exist.

use chrono::{TimeDelta, Utc};
use http::StatusCode;
use mysql_async::prelude::*;
use serde::Deserialize;
use serde_json::json;

use crate::http::{ApiError, Request, Response, json, read_json};
use crate::state::AppState;

pub const MAX_TOKENS_PER_CALL: u64 = 200_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IssueTokens {
    first_user_id: i64,
    count: i64,
    ttl_s: i64,
}

pub async fn issue(state: &AppState, req: Request, limit: usize) -> Result<Response, ApiError> {
    let body: IssueTokens = read_json(req, limit).await?;
    let first = u64::try_from(body.first_user_id)
        .ok()
        .filter(|id| *id >= 1)
        .ok_or_else(|| ApiError::Invalid("first_user_id must be at least 1".into()))?;
    let count = u64::try_from(body.count)
        .ok()
        .filter(|n| (1..=MAX_TOKENS_PER_CALL).contains(n))
        .ok_or_else(|| {
            ApiError::Invalid(format!("count must be within 1..={MAX_TOKENS_PER_CALL}"))
        })?;
    // No longer than a login's: a sign-out voids the tokens expiring within
    // admission.token_ttl_s of it (auth::revoked), which must be all of them.
    let max_ttl_s = state.config.settings.admission.token_ttl_s as i64;
    if !(1..=max_ttl_s).contains(&body.ttl_s) {
        return Err(ApiError::Invalid(format!(
            "ttl_s must be within 1..={max_ttl_s} (admission.token_ttl_s)"
        )));
    }
    let last = first + count - 1;
    let mut conn = crate::infra::mysql::checkout(&state.api_mysql).await?;
    let existing: Option<u64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM app_user WHERE id BETWEEN ? AND ?",
            (first, last),
        )
        .await?;
    if existing != Some(count) {
        return Err(ApiError::Invalid(format!(
            "users {first}..={last} do not all exist ({} of {count} do)",
            existing.unwrap_or(0)
        )));
    }
    let expires = Utc::now() + TimeDelta::seconds(body.ttl_s);
    // A signed-out user's token outlives the sign-out (as a login's; from this core's
    // copy of the revocations, read every quarter second).
    let tokens: Vec<String> = (first..=last)
        .map(|id| {
            let at = state.revoked.outlived(id, expires.timestamp());
            state.tokens.sign(id, at)
        })
        .collect();
    Ok(json(
        StatusCode::OK,
        &json!({"first_user_id": first, "count": count, "expires_at": expires, "tokens": tokens}),
    ))
}
