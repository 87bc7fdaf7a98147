//! Creating, reading, publishing, closing and reopening events.

use http::StatusCode;
use serde_json::json;

use crate::catalog::{self, EventRecord, EventStatus};
use crate::domain::event::{EventRequest, NewEvent};
use crate::http::{ApiError, Request, Response, json, read_json};
use crate::preload::{PreloadError, PreloadReport};
use crate::state::AppState;

/// `POST /admin/events` → 201 with the event id and category ids.
pub async fn create(state: &AppState, req: Request, limit: usize) -> Result<Response, ApiError> {
    let request: EventRequest = read_json(req, limit).await?;
    let event = NewEvent::try_from(request).map_err(ApiError::Invalid)?;
    let id = catalog::insert(&state.api_mysql, &event).await?;
    state.events.created(id);
    let created = load(state, id).await?;
    tracing::info!(
        event_id = id,
        title = created.title,
        categories = created.categories.len(),
        "event created"
    );
    let categories: Vec<_> = created
        .categories
        .iter()
        .map(|c| json!({"id": c.id, "name": c.name}))
        .collect();
    Ok(json(
        StatusCode::CREATED,
        &json!({"event_id": id, "categories": categories}),
    ))
}

pub async fn list(state: &AppState) -> Result<Response, ApiError> {
    let events = catalog::list(&state.api_mysql, 1_000).await?;
    Ok(json(StatusCode::OK, &json!({"events": events})))
}

pub async fn get(state: &AppState, id: u64) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &load(state, id).await?))
}

/// DRAFT or PUBLISHED → PUBLISHED, and the hot path's keys preloaded (idempotent).
pub async fn publish(state: &AppState, id: u64) -> Result<Response, ApiError> {
    let event = move_to(
        state,
        id,
        &[EventStatus::Draft, EventStatus::Published],
        EventStatus::Published,
    )
    .await?;
    let report = preload(state, &event).await?;
    Ok(json(
        StatusCode::OK,
        &json!({"event_id": id, "status": event.status, "preload": report}),
    ))
}

/// PUBLISHED → CLOSED: the sale stops at once, wherever the window stands.
pub async fn close(state: &AppState, id: u64) -> Result<Response, ApiError> {
    let event = move_to(
        state,
        id,
        &[EventStatus::Published, EventStatus::Closed],
        EventStatus::Closed,
    )
    .await?;
    // A waiting room's turns stop their clocks with it (Preloader::room_clock).
    state.preloader.set_sale_status(&event).await?;
    tracing::info!(event_id = id, "sale closed");
    Ok(json(
        StatusCode::OK,
        &json!({"event_id": id, "status": event.status}),
    ))
}

/// CLOSED → PUBLISHED: the sale goes on within its window.
pub async fn reopen(state: &AppState, id: u64) -> Result<Response, ApiError> {
    let event = move_to(
        state,
        id,
        &[EventStatus::Closed, EventStatus::Published],
        EventStatus::Published,
    )
    .await?;
    if state.preloader.is_loaded(&event).await? {
        state.preloader.set_sale_status(&event).await?;
    } else {
        preload(state, &event).await?;
    }
    tracing::info!(event_id = id, "sale reopened");
    Ok(json(
        StatusCode::OK,
        &json!({"event_id": id, "status": event.status}),
    ))
}

/// `GET /admin/events/{id}/waiting-room`: the settings (the defaults, off, if never set)
/// and the room's figures.
pub async fn waiting_room(state: &AppState, id: u64) -> Result<Response, ApiError> {
    let event = load(state, id).await?;
    let room = event
        .room
        .clone()
        .unwrap_or_else(crate::room::config::defaults);
    let figures = state.room.store.figures(crate::domain::EventId(id)).await?;
    Ok(json(
        StatusCode::OK,
        &json!({"event_id": id, "waiting_room": room, "figures": figures}),
    ))
}

/// `PUT /admin/events/{id}/waiting-room`: changes the fields given (the rest keep their
/// setting); the lottery's seed is drawn the first time and never changes.
pub async fn set_waiting_room(
    state: &AppState,
    id: u64,
    req: Request,
    limit: usize,
) -> Result<Response, ApiError> {
    let request = crate::room::config::RoomRequest::from_json(read_json(req, limit).await?)
        .map_err(ApiError::Invalid)?;
    let event = load(state, id).await?;
    if event.status == EventStatus::Closed {
        return Err(ApiError::Conflict(
            "INVALID_STATE",
            format!("event {id} is closed: its waiting room cannot change"),
        ));
    }
    let current = event
        .room
        .clone()
        .unwrap_or_else(crate::room::config::defaults);
    let wanted = request.apply(&current).map_err(ApiError::Invalid)?;
    if wanted.pass_ttl_s != current.pass_ttl_s
        && state
            .room
            .store
            .figures(crate::domain::EventId(id))
            .await?
            .drawn
    {
        // Passes out were signed with the old lifetime, and the release counts them by it.
        return Err(ApiError::Conflict(
            "INVALID_STATE",
            format!("event {id}'s line is drawn: its pass_ttl_s cannot change any more"),
        ));
    }
    let saved = crate::room::config::save(&state.api_mysql, id, &wanted).await?;
    if let Err(e) = state.room.store.publish(&event, &saved).await {
        // Not half-applied: MySQL back to the room as it was, so the answer (5xx, nothing
        // changed) is true, and no room the edge never heard of later asks buyers for
        // passes nobody can get (review).
        if let Err(undo) = crate::room::config::save(&state.api_mysql, id, &current).await {
            tracing::error!(
                event_id = id,
                error = format!("{undo:#}"),
                "waiting room saved in MySQL but not in Redis, and not undone: set it again"
            );
        }
        state.events.forget(id).await;
        return Err(e.into());
    }
    state.events.forget(id).await;
    tracing::info!(event_id = id, room = ?saved, "waiting room set");
    Ok(json(
        StatusCode::OK,
        &json!({"event_id": id, "waiting_room": saved}),
    ))
}

/// Preloads the event, counting the outcome.
async fn preload(state: &AppState, event: &EventRecord) -> Result<PreloadReport, ApiError> {
    let result = state.preloader.preload(event).await;
    let outcome = match &result {
        Ok(_) => "ok",
        Err(PreloadError::Busy(_)) => "busy",
        Err(PreloadError::Unexpected(_)) => "error",
    };
    state.metrics.preloads.with_label_values(&[outcome]).inc();
    Ok(result?)
}

async fn load(state: &AppState, id: u64) -> Result<EventRecord, ApiError> {
    catalog::load(&state.api_mysql, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no event {id}")))
}

/// Applies a status change allowed only from `from`; 409 INVALID_STATE otherwise.
async fn move_to(
    state: &AppState,
    id: u64,
    from: &[EventStatus],
    to: EventStatus,
) -> Result<EventRecord, ApiError> {
    let current = load(state, id).await?;
    if !catalog::transition(&state.api_mysql, id, from, to).await? {
        return Err(crate::public::answers::invalid_transition(
            id,
            current.status,
            to,
        ));
    }
    // This instance's purchases see the new status at once (admission refuses a fresh
    // purchase of a sale its cached record says is closed); other cores' within their
    // cache's ttl.
    state.events.forget(id).await;
    Ok(EventRecord {
        status: to,
        ..current
    })
}
