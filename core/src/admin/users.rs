//! Bulk users for sales and load tests: `POST /admin/users {"count", "password"?}`; and
//! `POST /admin/users/{id}/revoke-tokens`, which signs a user out everywhere.
//! Ids are taken as one contiguous range under a MySQL named lock, usernames are
//! `user<id>`, and every batch goes in one transaction: all or nothing.

use std::time::Instant;

use anyhow::Context;
use argon2::password_hash::{PasswordHasher, SaltString, rand_core::OsRng};
use http::StatusCode;
use mysql_async::TxOpts;
use mysql_async::prelude::*;
use serde::Deserialize;
use serde_json::json;

use crate::http::{ApiError, Request, Response, json, read_json};
use crate::state::AppState;

/// Users per call: 100 000 take about a second here, well inside the request deadline;
/// more are made in several calls (as stampede-bench does).
pub const MAX_USERS_PER_CALL: u64 = 100_000;
const ROWS_PER_INSERT: u64 = 5_000;
const LOCK_NAME: &str = "stampede.users.create";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateUsers {
    count: i64,
    /// One password for all of them (hashed once); None: they sign in with tokens only.
    password: Option<String>,
}

pub async fn create(state: &AppState, req: Request, limit: usize) -> Result<Response, ApiError> {
    let body: CreateUsers = read_json(req, limit).await?;
    let count = u64::try_from(body.count)
        .ok()
        .filter(|n| (1..=MAX_USERS_PER_CALL).contains(n))
        .ok_or_else(|| {
            ApiError::Invalid(format!("count must be within 1..={MAX_USERS_PER_CALL}"))
        })?;
    let hash = match body.password {
        Some(pw) if pw.len() < 8 => {
            return Err(ApiError::Invalid(
                "password must be at least 8 characters".into(),
            ));
        }
        Some(pw) => Some(hash_password(pw).await?),
        None => None,
    };
    let started = Instant::now();
    let first = insert_range(state, count, hash).await?;
    state.metrics.users_created.inc_by(count);
    tracing::info!(
        first,
        count,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "users created"
    );
    Ok(json(
        StatusCode::CREATED,
        &json!({"first_user_id": first, "last_user_id": first + count - 1, "count": count}),
    ))
}

/// Hashes off the async threads: argon2 is deliberately slow.
async fn hash_password(password: String) -> anyhow::Result<String> {
    tokio::task::spawn_blocking(move || {
        let salt = SaltString::generate(&mut OsRng);
        argon2::Argon2::default()
            .hash_password(password.as_bytes(), &salt)
            .map(|h| h.to_string())
            .map_err(|e| anyhow::anyhow!("hashing the password failed: {e}"))
    })
    .await
    .context("the hashing task panicked")?
}

async fn insert_range(state: &AppState, count: u64, hash: Option<String>) -> anyhow::Result<u64> {
    let mut conn = crate::infra::mysql::checkout(&state.api_mysql)
        .await
        .context("Failed to get a MySQL connection")?;
    // Reset when it goes back to the pool: the named lock and @pw must not outlive this
    // use, even when the request is dropped halfway.
    conn.reset_connection(true);
    let locked: Option<i64> = conn
        .exec_first("SELECT GET_LOCK(?, 30)", (LOCK_NAME,))
        .await?;
    anyhow::ensure!(
        locked == Some(1),
        "another user creation holds the lock for over 30 s"
    );
    let result = async {
        conn.exec_drop("SET @pw = ?", (hash,)).await?;
        let mut tx = conn.start_transaction(TxOpts::default()).await?;
        let max: Option<u64> = tx
            .query_first("SELECT COALESCE(MAX(id), 0) FROM app_user")
            .await?;
        let first = max.unwrap_or(0) + 1;
        let mut next = first;
        let end = first + count;
        while next < end {
            let upto = (next + ROWS_PER_INSERT).min(end);
            // Integers only in this text; the password hash travels in @pw.
            let rows: Vec<String> = (next..upto)
                .map(|id| format!("({id},'user{id}',@pw)"))
                .collect();
            tx.query_drop(format!(
                "INSERT INTO app_user (id, username, password_hash) VALUES {}",
                rows.join(",")
            ))
            .await
            .context("Failed to insert users")?;
            tracing::debug!(done = upto - first, of = count, "creating users");
            next = upto;
        }
        tx.commit().await?;
        anyhow::Ok(first)
    }
    .await;
    conn.exec_drop("DO RELEASE_LOCK(?)", (LOCK_NAME,)).await?;
    result
}

/// `POST /admin/users/{id}/revoke-tokens`: every token of the user issued until now is
/// void, on every core and edge within a moment (`auth::revoked`), as the user's own
/// `POST /api/logout` does; 404 for a user that does not exist.
pub async fn revoke_tokens(state: &AppState, user_id: u64) -> Result<Response, ApiError> {
    let mut conn = crate::infra::mysql::checkout(&state.api_mysql).await?;
    let exists: Option<u64> = conn
        .exec_first("SELECT id FROM app_user WHERE id = ?", (user_id,))
        .await?;
    drop(conn);
    if exists.is_none() {
        return Err(ApiError::NotFound(format!("no user {user_id}")));
    }
    let until = crate::auth::revoked::sign_out(state, user_id).await?;
    tracing::info!(user_id, "an operator revoked the user's tokens");
    Ok(json(
        StatusCode::OK,
        &json!({"user_id": user_id, "void_until": chrono::DateTime::from_timestamp(until, 0)}),
    ))
}
