//! `GET /admin/events/{id}/stats`: per category, what Redis and MySQL each say, and the
//! gaps between them; `POST /admin/events/{id}/reconcile` heals them.

use http::StatusCode;
use serde_json::json;

use crate::catalog;
use crate::domain::EventId;
use crate::http::{ApiError, Response, json};
use crate::state::AppState;

pub async fn event_stats(state: &AppState, id: u64) -> Result<Response, ApiError> {
    let event = catalog::load(&state.api_mysql, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no event {id}")))?;
    let balance = state.reconciler.measure(&event).await?;
    let (unsynced, sync_lag_s) = crate::stock_sync::lag(&state.api_mysql, EventId(id)).await?;
    let refunds_pending = crate::lifecycle::pay::refunds_pending(
        &state.api_mysql,
        state.config.settings.mysql.order_shards,
        EventId(id),
    )
    .await?;
    let pipeline = match &state.pipeline {
        None => "disabled".to_owned(),
        Some(p) => p.blocked_reason().unwrap_or_else(|| "running".to_owned()),
    };
    let waiting_room = match &event.room {
        Some(room) if room.pass_required() => Some(json!({
            "settings": room,
            "figures": state.room.store.figures(EventId(id)).await?,
        })),
        _ => None,
    };
    Ok(json(
        StatusCode::OK,
        &json!({
            "waiting_room": waiting_room,
            "event_id": id, "status": event.status, "loaded": balance.loaded,
            "categories": balance.categories,
            "queued_reservations": balance.queued_reservations, "unsynced_stock_log": unsynced,
            "sync_lag_s": sync_lag_s, "pipeline": pipeline, "refunds_pending": refunds_pending,
            "redis_unavailable": balance.redis_unavailable,
        }),
    ))
}

/// `POST /admin/events/{id}/reconcile`: one healing pass over the event, now.
pub async fn reconcile(state: &AppState, id: u64) -> Result<Response, ApiError> {
    let report = state
        .reconciler
        .reconcile(id, true)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no event {id}")))?;
    Ok(json(StatusCode::OK, &report))
}
