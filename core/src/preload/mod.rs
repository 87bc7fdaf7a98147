//! Preload (seeds 001, 002, 003): everything the hot path needs goes into Redis before
//! the sale opens — stock per category, seat hashes, the event's metadata and sale window.
//! When the keys are there, only the metadata is written, so preloading during a sale
//! never hands out units twice. When they are missing — a first preload, or Redis lost
//! them mid-sale — they are rebuilt from MySQL under a fence (see `snapshot`): stock from
//! the live orders, the buyers' holdings and statuses, the seat maps. Guarded by a
//! per-event lock, so two core instances never load one event at once.

mod snapshot;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use mysql_async::Pool;
use mysql_async::prelude::Queryable;
use tokio::sync::Notify;

use crate::catalog::{self, EventRecord, EventStatus};
use crate::domain::EventId;
use crate::infra::redis::Redis;
use crate::keys::{Keys, SeatState};
use crate::lock::{Lock, Owned};
use crate::shutdown::Shutdown;

/// Fields per HSET (or members per SADD) when loading a hash.
const FIELDS_PER_HSET: usize = 10_000;

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
    /// The generation of the keys written (0: none written, they were there).
    pub epoch: u64,
}

#[derive(Clone)]
pub struct Preloader {
    pub redis: Redis,
    pub mysql: Pool,
    pub keys: Keys,
    pub shards: u32,
    pub lock_ttl: Duration,
    /// Wakes the scheduler early.
    pub wake: Arc<Notify>,
}

impl Preloader {
    pub fn new(
        redis: Redis,
        mysql: Pool,
        keys: Keys,
        settings: &crate::config::Settings,
    ) -> Preloader {
        Preloader {
            redis,
            mysql,
            keys,
            shards: settings.mysql.order_shards,
            lock_ttl: Duration::from_millis(settings.preload.lock_ttl_ms),
            wake: Default::default(),
        }
    }

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
        let result = {
            // A rebuild of a large event may outlast the lock's time-to-live: renewed
            // every third of it while the work runs, so no second rebuild starts beside it.
            let work = self.preload_locked(&mut redis, event);
            tokio::pin!(work);
            let mut renew_conn = self.redis.clone();
            let mut tick = tokio::time::interval(self.lock_ttl / 3);
            tick.tick().await;
            loop {
                tokio::select! {
                    done = &mut work => break done,
                    _ = tick.tick() => match lock.renew(&mut renew_conn, self.lock_ttl).await {
                        Ok(Owned::Yes) => {}
                        Ok(Owned::No) => tracing::error!(event_id = event.id, "the preload lock expired during a rebuild; the epoch fence keeps the books right"),
                        Err(e) => tracing::warn!(event_id = event.id, error = format!("{e:#}"), "could not renew the preload lock"),
                    },
                }
            }
        };
        lock.release(&mut redis).await?;
        let report = result?;
        tracing::info!(event_id = event.id, ?report, "preloaded");
        Ok(report)
    }

    async fn preload_locked(
        &self,
        redis: &mut Redis,
        event: &EventRecord,
    ) -> anyhow::Result<PreloadReport> {
        if self.keys_present(redis, event.id).await? {
            // Loaded already (a publish after a close): the stock is Redis's to keep.
            let mut pipe = redis::pipe();
            self.write_meta(&mut pipe, event, None);
            pipe.query_async::<()>(redis)
                .await
                .context("Failed to write the event's metadata")?;
            self.write_sales_index(redis, event).await?;
            return Ok(PreloadReport::default());
        }
        let snap = snapshot::fence_and_read(&self.mysql, self.shards, EventId(event.id)).await?;
        let e = event.id;
        let mut pipe = redis::pipe();
        pipe.atomic();
        let mut report = PreloadReport {
            epoch: snap.epoch,
            ..PreloadReport::default()
        };
        pipe.del(&[
            self.keys.stock(e),
            self.keys.sold_out(e),
            self.keys.held(e),
            self.keys.purchase_status(e),
            self.keys.restocked(e),
        ])
        .ignore();
        for c in &event.categories {
            let live = snap.live_units.get(&c.id).copied().unwrap_or(0);
            let available = i64::from(c.total) - live;
            if available < 0 {
                tracing::error!(
                    event_id = e,
                    category_id = c.id,
                    live,
                    total = c.total,
                    "MySQL holds more units in orders than the category has"
                );
            }
            let available = available.max(0);
            pipe.hset(self.keys.stock(e), c.id, available).ignore();
            if available == 0 {
                pipe.hset(self.keys.sold_out(e), c.id, 1).ignore();
            }
            report.stock_written += 1;
        }
        for chunk in snap.held.iter().collect::<Vec<_>>().chunks(FIELDS_PER_HSET) {
            pipe.hset_multiple(self.keys.held(e), chunk).ignore();
        }
        for chunk in snap
            .status
            .iter()
            .collect::<Vec<_>>()
            .chunks(FIELDS_PER_HSET)
        {
            pipe.hset_multiple(self.keys.purchase_status(e), chunk)
                .ignore();
        }
        for chunk in snap.given_back.chunks(FIELDS_PER_HSET) {
            pipe.sadd(self.keys.restocked(e), chunk).ignore();
        }
        for c in event.categories.iter().filter(|c| c.seats.is_some()) {
            let (seats_key, row_free_key) = (self.keys.seats(e, c.id), self.keys.row_free(e, c.id));
            pipe.del(&[&seats_key, &row_free_key]).ignore();
            let mut free_per_row: HashMap<u32, u32> = HashMap::new();
            let seats = catalog::seats(&self.mysql, c.id).await?;
            for chunk in seats.chunks(FIELDS_PER_HSET) {
                let fields: Vec<(String, &str)> = chunk
                    .iter()
                    .map(|(row, col, _)| {
                        let state = match snap.seat_owner.get(&(c.id, *row, *col)) {
                            Some(owner) => owner.as_str(),
                            None => {
                                *free_per_row.entry(*row).or_default() += 1;
                                SeatState::FREE
                            }
                        };
                        (format!("{row}:{col}"), state)
                    })
                    .collect();
                pipe.hset_multiple(&seats_key, &fields).ignore();
            }
            let row_free: Vec<(u32, u32)> = free_per_row.into_iter().collect();
            if !row_free.is_empty() {
                pipe.hset_multiple(&row_free_key, &row_free).ignore();
            }
            report.seat_maps_written += 1;
        }
        // The metadata last: admission answers "not loaded" until all of it is there.
        pipe.hset(self.keys.event_meta(e), "seq", snap.seq).ignore();
        self.write_meta(&mut pipe, event, Some(snap.epoch));
        pipe.query_async::<()>(redis)
            .await
            .context("Failed to write the event's keys")?;
        self.write_sales_index(redis, event).await?;
        Ok(report)
    }

    /// True when the event's metadata and stock are both in Redis.
    async fn keys_present(&self, redis: &mut Redis, event_id: u64) -> anyhow::Result<bool> {
        let present: u32 = redis::cmd("EXISTS")
            .arg(self.keys.event_meta(event_id))
            .arg(self.keys.stock(event_id))
            .query_async(redis)
            .await?;
        Ok(present == 2)
    }

    /// The event's metadata; `epoch` only when the keys are new.
    fn write_meta(&self, pipe: &mut redis::Pipeline, event: &EventRecord, epoch: Option<u64>) {
        let categories: Vec<String> = event.categories.iter().map(|c| c.id.to_string()).collect();
        if let Some(epoch) = epoch {
            pipe.hset(self.keys.event_meta(event.id), "epoch", epoch)
                .ignore();
        }
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
    }

    /// The event's entry in the sales index the edge reads: written after the event's
    /// own keys, in a call of its own (on a Redis Cluster the index is in another slot),
    /// so an edge never opens a sale whose keys are not there yet.
    async fn write_sales_index(
        &self,
        redis: &mut Redis,
        event: &EventRecord,
    ) -> anyhow::Result<()> {
        redis::cmd("HSET")
            .arg(self.keys.sales_index())
            .arg(event.id)
            .arg(sales_entry(event))
            .query_async::<()>(redis)
            .await
            .context("Failed to write the sales index")
    }

    /// After a close or reopen: the new status where the hot path and the edge read it
    /// (the hot path's first: a close takes effect in the core before the edge hears).
    pub async fn set_sale_status(&self, event: &EventRecord) -> anyhow::Result<()> {
        let mut redis = self.redis.clone();
        redis::cmd("HSET")
            .arg(self.keys.event_meta(event.id))
            .arg("status")
            .arg(sale_status(event.status))
            .query_async::<()>(&mut redis)
            .await
            .context("Failed to write the sale status")?;
        self.write_sales_index(&mut redis, event).await
    }

    /// Redis went back in time for this event: removes its metadata, so admission
    /// answers SALE_BUSY (not loaded) until the next pass rebuilds every key from MySQL,
    /// as after a FLUSHALL; and asks for that pass now.
    pub async fn fence(&self, event_id: EventId) -> anyhow::Result<()> {
        redis::cmd("DEL")
            .arg(self.keys.event_meta(event_id))
            .query_async::<()>(&mut self.redis.clone())
            .await
            .context("Failed to fence the event")?;
        self.wake();
        Ok(())
    }

    /// Why the event's Redis state is behind MySQL, if it is: its admission counter
    /// below the largest number an order has (Redis restarted from an older copy, or a
    /// replica that lagged took over), or its keys of an older generation than MySQL's
    /// (a rebuild that lost its lock wrote after a newer one).
    pub async fn behind(&self, event_id: EventId) -> anyhow::Result<Option<String>> {
        let (redis_seq, redis_epoch): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(self.keys.event_meta(event_id))
            .arg("seq")
            .arg("epoch")
            .query_async(&mut self.redis.clone())
            .await?;
        let mut conn = self.mysql.get_conn().await?;
        let mysql_seq = snapshot::max_seq(&mut conn, event_id).await?;
        let mysql_epoch: Option<u64> = conn
            .exec_first("SELECT redis_epoch FROM event WHERE id = ?", (event_id,))
            .await?;
        let (redis_seq, redis_epoch) = (redis_seq.unwrap_or(0), redis_epoch.unwrap_or(0));
        let mysql_epoch = mysql_epoch.unwrap_or(0);
        Ok(if redis_seq < mysql_seq {
            Some(format!(
                "admission number {redis_seq} < MySQL's {mysql_seq}"
            ))
        } else if redis_epoch < mysql_epoch {
            Some(format!(
                "keys of generation {redis_epoch} < MySQL's {mysql_epoch}"
            ))
        } else {
            None
        })
    }

    /// True when the event's metadata and stock are in Redis.
    pub async fn is_loaded(&self, event_id: EventId) -> anyhow::Result<bool> {
        self.keys_present(&mut self.redis.clone(), event_id.0).await
    }

    /// Asks the scheduler for a pass now (admission found an event's keys missing).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Every `interval`, preloads published events opening within `window` whose keys
    /// are missing (seed 001's time-slot preload), until `stop`.
    pub async fn run_scheduler(self, interval: Duration, window: Duration, mut stop: Shutdown) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.wake.notified() => {}
                _ = stop.wait() => return,
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
            if self.is_loaded(EventId(id)).await? {
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
