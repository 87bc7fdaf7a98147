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
    /// Reservations admitted and not yet written to MySQL.
    queued: u64,
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
    let count = |cid: u64, status: &str| held.get(&(cid, status.to_owned())).copied().unwrap_or(0);
    let categories: Vec<CategoryStats> = event
        .categories
        .iter()
        .map(|c| CategoryStats {
            category_id: c.id,
            name: c.name.clone(),
            total: c.total,
            redis_available: stock.get(&c.id).copied(),
            // No order pipeline yet: nothing is admitted, so nothing is queued.
            queued: 0,
            unpaid: count(c.id, "UNPAID"),
            paid: count(c.id, "PAID"),
            db_remain: c.remain,
        })
        .collect();
    Ok(json(
        StatusCode::OK,
        &json!({"event_id": id, "status": event.status, "categories": categories}),
    ))
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
