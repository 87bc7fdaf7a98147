//! `GET /admin/events/{id}/stats`: per category, what Redis and MySQL each say.

use std::collections::HashMap;

use http::StatusCode;
use mysql_async::prelude::*;
use serde::Serialize;
use serde_json::json;

use crate::app::AppState;
use crate::catalog;
use crate::http::{ApiError, Response, json};

#[derive(Debug, Serialize)]
struct CategoryStats {
    category_id: u64,
    name: String,
    total: u32,
    /// Units Redis will still hand out; null before the event is preloaded.
    redis_available: Option<i64>,
    /// Units admitted and not yet written to MySQL (null when the backlog is too long to
    /// count by category; see `queued_reservations`).
    queued: Option<u64>,
    unpaid: u64,
    paid: u64,
    db_remain: i64,
}

pub async fn event_stats(state: &AppState, id: u64) -> Result<Response, ApiError> {
    let event = catalog::load(&state.mysql, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no event {id}")))?;
    let mut redis = state.redis.clone();
    let stock: HashMap<u64, i64> = redis::cmd("HGETALL")
        .arg(state.keys.stock(id))
        .query_async(&mut redis)
        .await?;
    let held = units_by_status(state, id).await?;
    let (queued_total, queued) = queued_units(state, id).await?;
    let (unsynced, sync_lag_s) = crate::stock_sync::lag(&state.mysql, id).await?;
    let refunds_pending = crate::lifecycle::pay::refunds_pending(
        &state.mysql,
        state.config.settings.mysql.order_shards,
        id,
    )
    .await?;
    let pipeline = match &state.pipeline {
        None => "disabled".to_owned(),
        Some(p) => p.blocked_reason().unwrap_or_else(|| "running".to_owned()),
    };
    let count = |cid: u64, status: &str| held.get(&(cid, status.to_owned())).copied().unwrap_or(0);
    let categories: Vec<CategoryStats> = event
        .categories
        .iter()
        .map(|c| CategoryStats {
            category_id: c.id,
            name: c.name.clone(),
            total: c.total,
            redis_available: stock.get(&c.id).copied(),
            queued: queued.as_ref().map(|q| q.get(&c.id).copied().unwrap_or(0)),
            unpaid: count(c.id, "UNPAID"),
            paid: count(c.id, "PAID"),
            db_remain: c.remain,
        })
        .collect();
    Ok(json(
        StatusCode::OK,
        &json!({
            "event_id": id, "status": event.status, "categories": categories,
            "queued_reservations": queued_total, "unsynced_stock_log": unsynced,
            "sync_lag_s": sync_lag_s, "pipeline": pipeline, "refunds_pending": refunds_pending,
        }),
    ))
}

/// Longest backlog counted per category for the stats; longer ones give only the total.
/// (XRANGE over the backlog is work for Redis; keep a polled stats call cheap.)
const MAX_COUNTED_BACKLOG: u64 = 10_000;

/// Reservations in the event's stream, and their units per category when countable.
async fn queued_units(
    state: &AppState,
    event_id: u64,
) -> anyhow::Result<(u64, Option<HashMap<u64, u64>>)> {
    let mut redis = state.redis.clone();
    let stream = state.keys.order_stream(event_id);
    let total: u64 = redis::cmd("XLEN")
        .arg(&stream)
        .query_async(&mut redis)
        .await?;
    if total > MAX_COUNTED_BACKLOG {
        return Ok((total, None));
    }
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(&stream)
        .arg("-")
        .arg("+")
        .query_async(&mut redis)
        .await?;
    let mut per_category = HashMap::new();
    for entry in entries.ids {
        if let (Some(c), Some(q)) = (entry.get::<u64>("c"), entry.get::<u64>("q")) {
            *per_category.entry(c).or_default() += q;
        }
    }
    Ok((total, Some(per_category)))
}

/// Units in orders per (category, status), over every order shard.
async fn units_by_status(
    state: &AppState,
    event_id: u64,
) -> anyhow::Result<HashMap<(u64, String), u64>> {
    let shards = state.config.settings.mysql.order_shards;
    let union: Vec<String> = (0..shards)
        .map(|n| {
            format!(
                "SELECT category_id, status, quantity FROM `order_{n}` WHERE event_id = {event_id}"
            )
        })
        .collect();
    let sql = format!(
        "SELECT category_id, status, CAST(SUM(quantity) AS UNSIGNED) FROM ({}) o GROUP BY category_id, status",
        union.join(" UNION ALL ")
    );
    let mut conn = state.mysql.get_conn().await?;
    let rows: Vec<(u64, String, u64)> = conn.query(sql).await?;
    Ok(rows.into_iter().map(|(c, s, n)| ((c, s), n)).collect())
}
