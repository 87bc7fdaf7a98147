//! What buyers see of events: the list, one event with availability, a seat map, a
//! train's availability by journey.

use std::collections::HashMap;

use chrono::Utc;
use http::StatusCode;
use serde_json::json;

use bytes::Bytes;

use crate::catalog::{EventRecord, EventStatus, SeatGrid};
use crate::domain::{CategoryId, EventId};
use crate::http::{ApiError, Request, Response, json, json_bytes, query_numbers};
use crate::keys::{Bucket, SeatState};
use crate::state::AppState;
use crate::trains::{self, Journey};

pub async fn list(state: &AppState) -> Result<Response, ApiError> {
    let events = state.events.on_sale().await?;
    let now = Utc::now();
    Ok(json(
        StatusCode::OK,
        &json!({"server_time": now, "server_time_ms": now.timestamp_millis(), "events": *events}),
    ))
}

pub(super) async fn visible(
    state: &AppState,
    id: u64,
) -> Result<std::sync::Arc<EventRecord>, ApiError> {
    state
        .events
        .get_public(id)
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
        replicas: None,
    };
    let available = state
        .availability
        .0
        .try_get_with(event.id, async {
            let left = mover.available(EventId(event.id), event.buckets).await?;
            Ok::<_, ApiError>(std::sync::Arc::new(left))
        })
        .await
        .map_err(shared)?;
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

/// A train's journey from a query's `from` and `to`, or why not.
fn journey_of(
    event: &EventRecord,
    q: &std::collections::HashMap<&'static str, u64>,
) -> Result<Journey, ApiError> {
    let (Some(&from), Some(&to)) = (q.get("from"), q.get("to")) else {
        return Err(ApiError::Invalid(
            "give ?from=<station>&to=<station> (indexes along the route)".into(),
        ));
    };
    let station = |n: u64| u16::try_from(n).unwrap_or(u16::MAX);
    Journey::new(station(from), station(to), event.stations.len()).map_err(ApiError::Invalid)
}

/// `GET /api/events/{id}/availability?from=&to=`: per class of a train, the seats free
/// on every segment of the journey, counted from the seats themselves in one round trip
/// (`train_available.lua`); the edge keeps the answer until a class's seats change.
pub async fn availability(state: &AppState, id: u64, req: &Request) -> Result<Response, ApiError> {
    let event = visible(state, id).await?;
    let q = query_numbers(req.uri().query(), &["from", "to"])?;
    if !event.is_train() {
        return Err(ApiError::Invalid(format!(
            "event {id} is not a train: its availability is on GET /api/events/{id}"
        )));
    }
    let journey = journey_of(&event, &q)?;
    let classes: Vec<CategoryId> = event.categories.iter().map(|c| CategoryId(c.id)).collect();
    let mut redis = state.redis.clone();
    let counts = trains::available(
        &mut redis,
        &state.keys,
        EventId(event.id),
        &classes,
        journey,
    )
    .await?;
    let span = u64::from(journey.span());
    let classes: Vec<_> = event
        .categories
        .iter()
        .zip(&counts)
        .map(|(c, n)| {
            let seats = c.seats.map_or(0, |g| u64::from(g.rows) * u64::from(g.cols));
            json!({
                "id": c.id, "name": c.name, "seats": seats, "free": n.free,
                "sold_out": n.free == 0, "price_cents": c.price_cents.saturating_mul(span),
            })
        })
        .collect();
    Ok(json(
        StatusCode::OK,
        &json!({"event_id": event.id, "from": journey.from, "to": journey.to, "classes": classes}),
    ))
}

/// Seat maps as last answered, kept [`SEAT_MAP_TTL`]: a map is one HGETALL of the whole
/// seat hash (up to 100 000 seats, a megabyte or two of answer) on the Redis that admits
/// the purchases, and every viewer's app asks for it every 2 s — so did anyone with a
/// token, as often as the edge let them (review). Concurrent asks for one map make one
/// read; the answer is kept as its bytes. Up to [`SEAT_MAPS_MAX_BYTES`] of them.
/// A train's class has a map per journey (2 016 on a route of 64 stations), all made
/// from one read of the class's segments, kept as read, per class, as long: asking
/// every journey in turn cost a read of the whole class each (review).
#[derive(Clone)]
pub struct SeatMaps {
    maps: moka::future::Cache<SeatMapKey, Bytes>,
    segments: moka::future::Cache<(u64, u64), std::sync::Arc<HashMap<String, String>>>,
}

/// Event, category, and a train's journey (from, to; 0, 0 for a concert's map).
type SeatMapKey = (u64, u64, u16, u16);

/// How long a seat map is answered again before it is read anew: a quarter of the buyer
/// app's poll, so a viewer sees a change within one poll.
pub const SEAT_MAP_TTL: std::time::Duration = std::time::Duration::from_millis(250);
const SEAT_MAPS_MAX_BYTES: u64 = 64 << 20;

impl SeatMaps {
    pub fn new() -> SeatMaps {
        SeatMaps {
            maps: moka::future::Cache::builder()
                .weigher(|_, body: &Bytes| u32::try_from(body.len()).unwrap_or(u32::MAX))
                .max_capacity(SEAT_MAPS_MAX_BYTES)
                .time_to_live(SEAT_MAP_TTL)
                .build(),
            segments: moka::future::Cache::builder()
                .weigher(|_, seats: &std::sync::Arc<HashMap<String, String>>| {
                    let bytes: usize = seats.iter().map(|(k, v)| k.len() + v.len() + 48).sum();
                    u32::try_from(bytes).unwrap_or(u32::MAX)
                })
                .max_capacity(SEAT_MAPS_MAX_BYTES)
                .time_to_live(SEAT_MAP_TTL)
                .build(),
        }
    }
}

impl Default for SeatMaps {
    fn default() -> SeatMaps {
        SeatMaps::new()
    }
}

/// What Redis says is left of each category of an event (its stock, or its pool's and
/// every bucket's: B + 1 reads on the Redis that admits the purchases), as last read,
/// kept [`SEAT_MAP_TTL`]: the buyer app asks for the event every 2 s per viewer, and
/// anyone with a token as often as the edge's per-address limit lets them (review).
/// Concurrent asks for one event make one read. The rest of the answer (the server's
/// clock above all) is made anew each time.
#[derive(Clone)]
pub struct Availability(moka::future::Cache<u64, std::sync::Arc<HashMap<u64, i64>>>);

impl Availability {
    pub fn new() -> Availability {
        Availability(
            moka::future::Cache::builder()
                .max_capacity(AVAILABILITY_KEPT)
                .time_to_live(SEAT_MAP_TTL)
                .build(),
        )
    }
}

impl Default for Availability {
    fn default() -> Availability {
        Availability::new()
    }
}

/// At most this many events' availability is kept.
const AVAILABILITY_KEPT: u64 = 10_000;

/// `GET /api/events/{id}/seats?category={cid}`: one string per row, a letter per seat:
/// `F` free, `L` locked (held by a purchase), `S` sold. A train's class needs the
/// journey too (`&from=&to=`): a seat is `F` when free on every segment of it, else `S`.
pub async fn seats(state: &AppState, id: u64, req: &Request) -> Result<Response, ApiError> {
    let event = visible(state, id).await?;
    let q = query_numbers(req.uri().query(), &["category", "from", "to"])?;
    let category_id = *q
        .get("category")
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
    let journey = if event.is_train() {
        Some(journey_of(&event, &q)?)
    } else if q.contains_key("from") || q.contains_key("to") {
        return Err(ApiError::Invalid(format!(
            "event {id} is not a train: its seat map takes no from or to"
        )));
    } else {
        None
    };
    let cached = (
        event.id,
        category_id,
        journey.map_or(0, |j| j.from),
        journey.map_or(0, |j| j.to),
    );
    let body = state
        .seat_maps
        .maps
        .try_get_with(cached, seat_map(state, &event, category_id, grid, journey))
        .await
        .map_err(shared)?;
    Ok(json_bytes(StatusCode::OK, body))
}

/// The error of a read that several asks waited for: its own when this was the only
/// one, else the same answer (503 for a part down, 500 otherwise).
fn shared(e: std::sync::Arc<ApiError>) -> ApiError {
    std::sync::Arc::try_unwrap(e).unwrap_or_else(|e| match &*e {
        ApiError::Unavailable(m) => ApiError::Unavailable(m.clone()),
        other => ApiError::Unexpected(anyhow::anyhow!("{other}")),
    })
}

/// One seat map read from Redis and written as its answer's bytes.
async fn seat_map(
    state: &AppState,
    event: &EventRecord,
    category_id: u64,
    grid: SeatGrid,
    journey: Option<Journey>,
) -> Result<Bytes, ApiError> {
    let read = |key: String| async move {
        let mut redis = state.redis.clone();
        redis::cmd("HGETALL")
            .arg(key)
            .query_async::<HashMap<String, String>>(&mut redis)
            .await
            .map(std::sync::Arc::new)
            .map_err(ApiError::from)
    };
    let states = match journey {
        Some(_) => state
            .seat_maps
            .segments
            .try_get_with(
                (event.id, category_id),
                read(state.keys.segments(Bucket::only(event.id), category_id)),
            )
            .await
            .map_err(shared)?,
        None => read(state.keys.seats(Bucket::only(event.id), category_id)).await?,
    };
    // A seat the scripts have not written (or could not) shows as taken.
    let letter = |s: Option<&String>| match journey {
        Some(j) => {
            let segs = s.map(|s| s.as_bytes().get(j.segments()));
            let free = segs.flatten().is_some_and(|b| b.iter().all(|&c| c == b'0'));
            if free { 'F' } else { 'S' }
        }
        None => s
            .and_then(|s| SeatState::parse(s))
            .map_or(SeatState::TAKEN, SeatState::letter),
    };
    let rows: Vec<String> = (1..=grid.rows)
        .map(|r| {
            (1..=grid.cols)
                .map(|c| letter(states.get(&format!("{r}:{c}"))))
                .collect()
        })
        .collect();
    let mut body = json!({"event_id": event.id, "category_id": category_id, "rows": grid.rows, "cols": grid.cols, "seats": rows});
    if let Some(j) = journey {
        body["from"] = j.from.into();
        body["to"] = j.to.into();
    }
    Ok(Bytes::from(
        serde_json::to_vec(&body).expect("serialising plain data cannot fail"),
    ))
}
