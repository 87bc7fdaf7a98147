//! Preload (seeds 001, 003): everything the hot path needs goes into Redis before the
//! sale opens — stock per category, seat hashes, the event's metadata and sale window.
//! Idempotent: stock and seats are written only where absent, so preloading during a
//! sale never hands out units twice. Guarded by a per-event lock, so two core
//! instances never load one event at once.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use mysql_async::Pool;
use redis::aio::ConnectionManager;
use tokio::sync::watch;

use crate::catalog::{self, EventRecord, EventStatus};
use crate::keys::{Keys, seat_state};
use crate::lock::Lock;

/// Fields per HSET when loading a seat hash.
const SEAT_FIELDS_PER_HSET: usize = 10_000;

/// How long a publish waits for another instance's preload of the same event.
const LOCK_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum PreloadError {
    #[error("another core instance is preloading event {0}; try again")]
    Busy(u64),
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

/// What a preload wrote.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct PreloadReport {
    /// Categories whose stock was absent and has been written.
    pub stock_written: u32,
    /// Seat hashes written (seated categories that had none).
    pub seat_maps_written: u32,
}

#[derive(Clone)]
pub struct Preloader {
    pub redis: ConnectionManager,
    pub mysql: Pool,
    pub keys: Keys,
    pub lock_ttl: Duration,
}

impl Preloader {
    /// Writes the event's hot-path keys where they are missing, and its metadata always.
    pub async fn preload(&self, event: &EventRecord) -> Result<PreloadReport, PreloadError> {
        let mut redis = self.redis.clone();
        let lock = Lock::acquire(
            &mut redis,
            self.keys.preload_lock(event.id),
            self.lock_ttl,
            LOCK_WAIT,
        )
        .await
        .context("Failed to take the preload lock")?
        .ok_or(PreloadError::Busy(event.id))?;
        let result = self.preload_locked(&mut redis, event).await;
        lock.release(&mut redis).await?;
        let report = result?;
        tracing::info!(event_id = event.id, ?report, "preloaded");
        Ok(report)
    }

    async fn preload_locked(
        &self,
        redis: &mut ConnectionManager,
        event: &EventRecord,
    ) -> anyhow::Result<PreloadReport> {
        let unsynced: HashMap<u64, i64> = catalog::unsynced_units(&self.mysql, event.id)
            .await?
            .into_iter()
            .collect();
        let stock_key = self.keys.stock(event.id);
        let mut pipe = redis::pipe();
        pipe.atomic();
        self.write_meta(&mut pipe, event);
        for c in &event.categories {
            // MySQL's remain lags by the orders not yet synced; never load more than is left.
            let available = (c.remain - unsynced.get(&c.id).copied().unwrap_or(0)).max(0);
            pipe.hset_nx(&stock_key, c.id, available);
        }
        let written: Vec<i64> = pipe
            .query_async(redis)
            .await
            .context("Failed to write event keys")?;
        let mut report = PreloadReport {
            // The replies end with one HSETNX result per category.
            stock_written: written
                .iter()
                .rev()
                .take(event.categories.len())
                .filter(|n| **n == 1)
                .count() as u32,
            seat_maps_written: 0,
        };
        for c in event.categories.iter().filter(|c| c.seats.is_some()) {
            let seats_key = self.keys.seats(event.id, c.id);
            let exists: bool = redis::cmd("EXISTS")
                .arg(&seats_key)
                .query_async(redis)
                .await?;
            if exists {
                continue;
            }
            let seats = catalog::seats(&self.mysql, c.id).await?;
            let mut free_per_row: HashMap<u32, u32> = HashMap::new();
            let mut pipe = redis::pipe();
            pipe.atomic();
            for chunk in seats.chunks(SEAT_FIELDS_PER_HSET) {
                let fields: Vec<(String, &str)> = chunk
                    .iter()
                    .map(|(row, col, status)| {
                        let state = if status == "FREE" {
                            *free_per_row.entry(*row).or_default() += 1;
                            seat_state::FREE
                        } else {
                            // Held or sold seats keep the order that has them (issue of the
                            // order pipeline); until then MySQL only has FREE seats.
                            status.as_str()
                        };
                        (format!("{row}:{col}"), state)
                    })
                    .collect();
                pipe.hset_multiple(&seats_key, &fields).ignore();
            }
            let row_free: Vec<(u32, u32)> = free_per_row.into_iter().collect();
            if !row_free.is_empty() {
                pipe.hset_multiple(self.keys.row_free(event.id, c.id), &row_free)
                    .ignore();
            }
            pipe.query_async::<()>(redis)
                .await
                .context("Failed to write a seat map")?;
            report.seat_maps_written += 1;
        }
        Ok(report)
    }

    fn write_meta(&self, pipe: &mut redis::Pipeline, event: &EventRecord) {
        let categories: Vec<String> = event.categories.iter().map(|c| c.id.to_string()).collect();
        pipe.hset_multiple(
            self.keys.event_meta(event.id),
            &[
                ("title", event.title.clone()),
                ("status", sale_status(event.status).to_owned()),
                (
                    "sale_start_ms",
                    event.sale_start.timestamp_millis().to_string(),
                ),
                ("sale_end_ms", event.sale_end.timestamp_millis().to_string()),
                ("per_user_limit", event.per_user_limit.to_string()),
                ("pay_timeout_s", event.pay_timeout_s.to_string()),
                ("categories", categories.join(",")),
            ],
        )
        .ignore();
        pipe.hset(self.keys.sales_index(), event.id, sales_entry(event))
            .ignore();
    }

    /// After a close or reopen: the new status where the hot path and the edge read it.
    pub async fn set_sale_status(&self, event: &EventRecord) -> anyhow::Result<()> {
        let mut redis = self.redis.clone();
        redis::pipe()
            .atomic()
            .hset(
                self.keys.event_meta(event.id),
                "status",
                sale_status(event.status),
            )
            .ignore()
            .hset(self.keys.sales_index(), event.id, sales_entry(event))
            .ignore()
            .query_async::<()>(&mut redis)
            .await
            .context("Failed to write the sale status")
    }

    /// True when the event's metadata is in Redis.
    pub async fn is_loaded(&self, event_id: u64) -> anyhow::Result<bool> {
        let mut redis = self.redis.clone();
        Ok(redis::cmd("EXISTS")
            .arg(self.keys.event_meta(event_id))
            .query_async(&mut redis)
            .await?)
    }

    /// Every `interval`, preloads published events opening within `window` whose keys
    /// are missing (seed 001's time-slot preload), until `stop`.
    pub async fn run_scheduler(
        self,
        interval: Duration,
        window: Duration,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = crate::app::stopped(&mut stop) => return,
            }
            if let Err(e) = self.preload_due(window).await {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "scheduled preload failed; will retry"
                );
            }
        }
    }

    async fn preload_due(&self, window: Duration) -> anyhow::Result<()> {
        for id in catalog::published_opening_within(&self.mysql, window.as_secs()).await? {
            if self.is_loaded(id).await? {
                continue;
            }
            if let Some(event) = catalog::load(&self.mysql, id).await? {
                match self.preload(&event).await {
                    Ok(_) | Err(PreloadError::Busy(_)) => {}
                    Err(PreloadError::Unexpected(e)) => return Err(e),
                }
            }
        }
        Ok(())
    }
}

/// What the hot path reads: `open` only for a published event.
fn sale_status(status: EventStatus) -> &'static str {
    match status {
        EventStatus::Published => "open",
        EventStatus::Draft | EventStatus::Closed => "closed",
    }
}

/// The edge's view of one event: `status:sale_start_ms:sale_end_ms`.
fn sales_entry(event: &EventRecord) -> String {
    format!(
        "{}:{}:{}",
        sale_status(event.status),
        event.sale_start.timestamp_millis(),
        event.sale_end.timestamp_millis()
    )
}
