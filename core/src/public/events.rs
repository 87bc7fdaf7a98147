//! What buyers see of events: the list, one event with availability, a seat map.

use std::collections::HashMap;

use chrono::Utc;
use http::StatusCode;
use serde_json::json;

use crate::catalog::{EventRecord, EventStatus};
use crate::domain::EventId;
use crate::http::{ApiError, Request, Response, json};
use crate::keys::{Bucket, SeatState};
use crate::state::AppState;

pub async fn list(state: &AppState) -> Result<Response, ApiError> {
    let events = state.events.on_sale().await?;
    let now = Utc::now();
    Ok(json(
        StatusCode::OK,
        &json!({"server_time": now, "server_time_ms": now.timestamp_millis(), "events": *events}),
    ))
}

async fn visible(state: &AppState, id: u64) -> Result<std::sync::Arc<EventRecord>, ApiError> {
    state
        .events
        .get(id)
        .await?
        .filter(|e| e.status != EventStatus::Draft)
        .ok_or_else(|| ApiError::NotFound(format!("no event {id}")))
}

/// The event, its categories with what Redis says is left, and the server's clock.
pub async fn one(state: &AppState, id: u64) -> Result<Response, ApiError> {
    let event = visible(state, id).await?;
    let mover = crate::buckets::Mover {
        redis: state.redis.clone(),
        keys: state.keys.clone(),
    };
    let available = mover.available(EventId(event.id), event.buckets).await?;
    let categories: Vec<_> = event
        .categories
        .iter()
        .map(|c| {
            let left = available.get(&c.id).copied();
            json!({
                "id": c.id, "name": c.name, "price_cents": c.price_cents, "total": c.total,
                "seats": c.seats, "available": left, "sold_out": left == Some(0),
            })
        })
        .collect();
    let now = Utc::now();
    let mut body = serde_json::to_value(&*event).map_err(anyhow::Error::from)?;
    body["categories"] = categories.into();
    body["server_time"] = json!(now);
    body["server_time_ms"] = json!(now.timestamp_millis());
    Ok(json(StatusCode::OK, &body))
}

/// `GET /api/events/{id}/seats?category={cid}`: one string per row, a letter per seat:
/// `F` free, `L` locked (held by a purchase), `S` sold.
pub async fn seats(state: &AppState, id: u64, req: &Request) -> Result<Response, ApiError> {
    let event = visible(state, id).await?;
    let category_id: u64 = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("category=")))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| ApiError::Invalid("give ?category=<category id>".into()))?;
    let category = event
        .categories
        .iter()
        .find(|c| c.id == category_id)
        .ok_or_else(|| {
            ApiError::NotFound(format!("no category {category_id} in event {}", event.id))
        })?;
    let grid = category
        .seats
        .ok_or_else(|| ApiError::Invalid(format!("category {category_id} has no seats")))?;
    if event.is_train() {
        // A train seat is free or taken per segment; its map needs a journey.
        return Err(ApiError::Invalid(format!(
            "category {category_id} is a train class: no seat map without a journey yet"
        )));
    }
    let mut redis = state.redis.clone();
    let states: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(state.keys.seats(Bucket::only(event.id), category_id))
        .query_async(&mut redis)
        .await?;
    let rows: Vec<String> = (1..=grid.rows)
        .map(|r| {
            (1..=grid.cols)
                .map(|c| {
                    // A seat the script has not written (or could not) shows as taken.
                    states
                        .get(&format!("{r}:{c}"))
                        .and_then(|s| SeatState::parse(s))
                        .map_or(SeatState::TAKEN, SeatState::letter)
                })
                .collect()
        })
        .collect();
    Ok(json(
        StatusCode::OK,
        &json!({"event_id": event.id, "category_id": category_id, "rows": grid.rows, "cols": grid.cols, "seats": rows}),
    ))
}
