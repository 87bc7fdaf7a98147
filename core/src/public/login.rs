//! `POST /api/login {"username","password"}` → a user token.

use std::sync::LazyLock;

use anyhow::Context;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use chrono::{TimeDelta, Utc};
use http::StatusCode;
use mysql_async::prelude::*;
use serde::Deserialize;
use serde_json::json;

use crate::auth::login::Held;
use crate::auth::revoked::Revoked;
use crate::http::{ApiError, Request, Response, json, read_json};
use crate::state::AppState;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Credentials {
    username: String,
    password: String,
}

/// Verified instead when the user does not exist, so both answers take as long.
static DECOY: LazyLock<String> = LazyLock::new(|| {
    let salt = SaltString::encode_b64(b"stampede-decoy-salt").expect("valid salt");
    argon2::Argon2::default()
        .hash_password(b"decoy", &salt)
        .expect("hashing a constant works")
        .to_string()
});

/// Longest username accepted.
const MAX_USERNAME: usize = 128;

pub async fn login(state: &AppState, req: Request) -> Result<Response, ApiError> {
    // The client's address as the edge saw it (it overwrites the header); a caller on
    // the core's own, internal port without it counts as one address.
    let address = req
        .headers()
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().chars().take(64).collect::<String>())
        .unwrap_or_else(|| "direct".to_owned());
    let creds: Credentials = read_json(req, 4096).await?;
    if creds.username.is_empty() || creds.username.chars().count() > MAX_USERNAME {
        return Err(ApiError::Invalid(format!(
            "username: 1..={MAX_USERNAME} characters"
        )));
    }
    let mut conn = crate::infra::mysql::checkout(&state.api_mysql).await?;
    let row: Option<(u64, String, Option<String>)> = conn
        .exec_first(
            "SELECT id, username, password_hash FROM app_user WHERE username = ?",
            (&creds.username,),
        )
        .await?;
    drop(conn);
    // Failures count per account: MariaDB's collation matches 'User1' and 'user1 ' to
    // 'user1', so the stored name is the key, never the spelling tried. An unknown name
    // is folded the same simple way, so both kinds of answer look alike.
    let account = match &row {
        Some((_, stored, _)) => stored.clone(),
        None => creds.username.trim_end().to_lowercase(),
    };
    let (user_id, hash) = match row {
        Some((id, _, Some(hash))) => (Some(id), hash),
        // Unknown user, or one that signs in with issued tokens only.
        _ => (None, DECOY.clone()),
    };
    let mut redis = state.redis.clone();
    let guard = &state.login;
    let slot = match guard
        .admit(&mut redis, &state.keys, &account, &address)
        .await?
    {
        Ok(slot) => slot,
        Err(Held::Waiting(retry_after_s)) => return Err(ApiError::RateLimited { retry_after_s }),
        Err(busy @ Held::Busy) => return Err(ApiError::Unavailable(busy.to_string())),
    };
    let password = creds.password;
    let (matches, slot) = tokio::task::spawn_blocking(move || {
        // Held by the check itself: a request dropped meanwhile (the client hung up, the
        // deadline passed) does not free a slot while Argon2 still runs.
        let matches = PasswordHash::new(&hash)
            .map(|parsed| {
                argon2::Argon2::default()
                    .verify_password(password.as_bytes(), &parsed)
                    .is_ok()
            })
            .unwrap_or(false);
        (matches, slot)
    })
    .await
    .context("the password check panicked")?;
    // Kept until the outcome is recorded: the next attempt on this slot reads it.
    let _slot = slot;
    let Some(user_id) = user_id.filter(|_| matches) else {
        let now_ms = Utc::now().timestamp_millis();
        let wait = guard
            .failed(&mut redis, &state.keys, &account, &address, now_ms)
            .await?;
        tracing::info!(
            username_len = creds.username.len(),
            wait_ms = wait.as_millis() as u64,
            "failed login"
        );
        return Err(ApiError::Unauthorized("wrong username or password".into()));
    };
    guard
        .succeeded(&mut redis, &state.keys, &account, &address)
        .await?;
    let mut expires =
        Utc::now() + TimeDelta::seconds(state.config.settings.admission.token_ttl_s as i64);
    // After a sign-out, a token that outlives it: one expiring at or before the user's
    // revocation would be void from birth (read from Redis, not this core's copy).
    if let Some(until) = Revoked::until(&state.redis, &state.keys, user_id).await?
        && expires.timestamp() <= until
    {
        expires = chrono::DateTime::from_timestamp(until + 1, 0).unwrap_or(expires);
    }
    let token = state.tokens.sign(user_id, expires.timestamp());
    Ok(json(
        StatusCode::OK,
        &json!({"token": token, "user_id": user_id, "expires_at": expires}),
    ))
}

/// `POST /api/logout`: every token of the caller issued until now is void, on every
/// core and edge within a moment (`auth::revoked`); a new login makes a new one.
pub async fn logout(state: &AppState, user_id: u64) -> Result<Response, ApiError> {
    let until = crate::auth::revoked::sign_out(state, user_id).await?;
    tracing::info!(user_id, "signed out: tokens void");
    Ok(json(
        StatusCode::OK,
        &json!({"user_id": user_id, "signed_out": true,
            "void_until": chrono::DateTime::from_timestamp(until, 0)}),
    ))
}
