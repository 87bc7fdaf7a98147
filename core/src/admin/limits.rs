//! Edge rate limits: `PUT /admin/limits {"<name>": settings | null}` stores overrides of
//! nginx.conf's defaults in Redis, where every edge worker picks them up within a
//! second, without a reload; null removes an override. `GET /admin/limits` lists them.

use std::collections::BTreeMap;

use http::StatusCode;
use serde_json::json;

use crate::domain::limit::LimitSpec;
use crate::http::{ApiError, Request, Response, json, read_json};
use crate::state::AppState;

pub async fn put(state: &AppState, req: Request, limit: usize) -> Result<Response, ApiError> {
    let changes: BTreeMap<String, Option<LimitSpec>> = read_json(req, limit).await?;
    if changes.is_empty() {
        return Err(ApiError::Invalid("give at least one limit".into()));
    }
    for (name, spec) in &changes {
        if let Some(spec) = spec {
            spec.validate(name).map_err(ApiError::Invalid)?;
        }
    }
    let key = state.keys.edge_limits();
    let mut pipe = redis::pipe();
    pipe.atomic();
    for (name, spec) in &changes {
        match spec {
            Some(spec) => pipe.hset(
                &key,
                name,
                serde_json::to_string(spec).map_err(anyhow::Error::from)?,
            ),
            None => pipe.hdel(&key, name),
        }
        .ignore();
    }
    pipe.query_async::<()>(&mut state.redis.clone()).await?;
    tracing::info!(changed = ?changes.keys().collect::<Vec<_>>(), "edge limits changed");
    get(state).await
}

pub async fn get(state: &AppState) -> Result<Response, ApiError> {
    let stored: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(state.keys.edge_limits())
        .query_async(&mut state.redis.clone())
        .await?;
    let limits: BTreeMap<String, serde_json::Value> = stored
        .into_iter()
        .map(|(name, spec)| {
            (
                name,
                serde_json::from_str(&spec).unwrap_or(serde_json::Value::String(spec)),
            )
        })
        .collect();
    Ok(json(StatusCode::OK, &json!({"limits": limits})))
}
