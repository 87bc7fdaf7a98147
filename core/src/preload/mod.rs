//! Preload (seeds 001, 002, 003): everything the hot path needs goes into Redis before
//! the sale opens — stock per category, seat hashes, the event's metadata and sale window.
//! When the keys are there, only the metadata is written, so preloading during a sale
//! never hands out units twice. When they are missing — a first preload, or Redis lost
//! them mid-sale — they are rebuilt from MySQL under a fence (see `snapshot`): stock from
//! the live orders, the buyers' holdings and statuses, the seat maps. Guarded by a
//! per-event lock, so two core instances never load one event at once.

pub(crate) mod snapshot;

use crate::script_codes::ScriptCode;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use mysql_async::Pool;
use mysql_async::prelude::Queryable;
use tokio::sync::Notify;

use crate::catalog::{self, EventRecord, EventStatus};
use crate::domain::{EventId, UserId};
use crate::infra::mysql::CallTimeout;
use crate::infra::redis::Redis;
use crate::keys::{Bucket, Keys, SeatState};
use crate::lock::Lock;
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

static SALE_STATUS: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    crate::infra::redis::script(include_str!("../../../lua/redis/sale_status.lua"))
});

/// `sale_status.lua`'s answers, one to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusWritten {
    Written = 1,
    NotLoaded = 0,
}

impl ScriptCode for StatusWritten {
    const SCRIPT: &'static str = "sale_status.lua";
    const ALL: &'static [StatusWritten] = &[StatusWritten::Written, StatusWritten::NotLoaded];

    fn code(self) -> i64 {
        self as i64
    }
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
    /// Bounds the scheduler's (and the reconciler's) MySQL work, so a connection gone
    /// half-open stops neither for longer than a few calls' worth.
    pub call_timeout: CallTimeout,
}

/// How many times a preload writes the sale's status again while admins keep changing it
/// ([`Preloader::status_since`]).
const STATUS_REREADS: usize = 5;

impl Preloader {
    pub fn new(
        redis: Redis,
        mysql: Pool,
        keys: Keys,
        settings: &crate::config::Settings,
        call_timeout: CallTimeout,
    ) -> Preloader {
        Preloader {
            redis,
            mysql,
            keys,
            shards: settings.mysql.order_shards,
            lock_ttl: Duration::from_millis(settings.preload.lock_ttl_ms),
            wake: Default::default(),
            call_timeout,
        }
    }

    /// This preloader on MySQL pool `mysql` (the API's requests have a pool of their
    /// own, app.rs), sharing the rest: its scheduler's wake-up among them.
    pub fn on(&self, mysql: Pool) -> Preloader {
        Preloader {
            mysql,
            ..self.clone()
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
        // A rebuild of a large event may outlast the lock's time-to-live; the epoch
        // fence keeps the books right should it be lost all the same.
        let work = async {
            let report = self.preload_locked(&mut redis, event).await?;
            self.status_since(event).await?;
            anyhow::Ok(report)
        };
        let result = lock
            .renewed_while(&self.redis, self.lock_ttl, "a preload", work)
            .await;
        lock.release(&mut redis).await?;
        let report = result?;
        tracing::info!(event_id = event.id, ?report, "preloaded");
        Ok(report)
    }

    /// The metadata a preload just wrote carries the sale status of the caller's record,
    /// read before the lock. An admin's close or reopen since (it takes no lock: MySQL
    /// first, then Redis) would be undone by it, and a closed sale admit again (the
    /// other cores' records refuse it; Redis would say open all the same): MySQL's
    /// status, read after each write, is written again until a read finds what was
    /// written last. An admin's change whose MySQL write comes after that read writes
    /// Redis after it too; one that came between a read and the write it led to is seen
    /// by the next read (two changes racing one preload: a close then a reopen).
    pub(crate) async fn status_since(&self, event: &EventRecord) -> anyhow::Result<()> {
        let mut written = event.status;
        for _ in 0..STATUS_REREADS {
            // The status alone, until it differs; then the record, to write it.
            let status = catalog::status_of(&self.mysql, event.id).await?;
            if status.is_none_or(|s| s == written) {
                return Ok(());
            }
            let Some(now) = catalog::load(&self.mysql, event.id).await? else {
                return Ok(());
            };
            if now.status == written {
                return Ok(()); // changed back meanwhile
            }
            tracing::info!(
                event_id = event.id,
                was = ?written,
                now = ?now.status,
                "the sale's status changed during a preload; written again"
            );
            self.set_sale_status(&now).await?;
            written = now.status;
        }
        anyhow::bail!(
            "event {}'s status kept changing while a preload wrote it; the next pass writes it",
            event.id
        )
    }

    async fn preload_locked(
        &self,
        redis: &mut Redis,
        event: &EventRecord,
    ) -> anyhow::Result<PreloadReport> {
        // Every way below writes the sale's status.
        self.room_clock(event).await?;
        if self.keys_present(redis, event).await? {
            // Loaded already (a publish after a close): the stock is Redis's to keep.
            self.write_all_meta(redis, event).await?;
            self.write_sales_index(redis, event).await?;
            return Ok(PreloadReport::default());
        }
        let snap = snapshot::fence_and_read(
            &self.mysql,
            self.shards,
            EventId(event.id),
            event.buckets,
            event.is_train(),
        )
        .await?;
        let e = event.id;
        let count = event.buckets;
        let mut report = PreloadReport {
            epoch: snap.epoch,
            ..PreloadReport::default()
        };
        // Per category: what is free (total − live orders), dealt over the buckets.
        let mut available: Vec<(u64, i64)> = Vec::new();
        for c in &event.categories {
            let live = snap.live_units.get(&c.id).copied().unwrap_or(0);
            let free = i64::from(c.total) - live;
            if free < 0 {
                tracing::error!(
                    event_id = e,
                    category_id = c.id,
                    live,
                    total = c.total,
                    "MySQL holds more units in orders than the category has"
                );
            }
            available.push((c.id, free.max(0)));
            report.stock_written += 1;
        }
        let mut dealt = deal(&available, count);
        // A seated category's units stay with its seats, in the event's own slot
        // (docs/scaling.md "Seated categories").
        for (i, c) in event.categories.iter().enumerate() {
            if count > 1 && c.seats.is_some() {
                for bucket in dealt.iter_mut() {
                    bucket[i] = 0;
                }
            }
        }
        if count > 1 {
            // Nothing of the old generation moves or admits while the new one is written:
            // every bucket's metadata goes first (scripts then answer "not loaded").
            for b in Bucket::all(e, count) {
                redis::cmd("DEL")
                    .arg(self.keys.meta(b))
                    .query_async::<()>(redis)
                    .await
                    .context("Failed to fence a bucket")?;
            }
            // Then the event's own slot: a bucket that runs dry refills from the pool,
            // so the pool is there before any bucket opens.
            let mut pipe = redis::pipe();
            pipe.atomic();
            pipe.del(&[
                self.keys.event_meta(e),
                self.keys.pool(e),
                self.keys.sold_out(e),
                self.keys.pool_moves(e),
                self.keys.pool_credited(e),
                self.keys.seat_locks(e),
                self.keys.seat_lock_records(e),
            ])
            .ignore();
            for (i, &(category, free)) in available.iter().enumerate() {
                let in_buckets: i64 = dealt.iter().map(|d| d[i]).sum();
                pipe.hset(self.keys.pool(e), category, free - in_buckets)
                    .ignore();
                if free == 0 {
                    pipe.hset(self.keys.sold_out(e), category, 1).ignore();
                }
            }
            self.write_seat_maps(&mut pipe, event, Bucket::only(e), &snap, &mut report)
                .await?;
            pipe.query_async::<()>(redis)
                .await
                .context("Failed to write the event's pool")?;
        }
        for b in Bucket::all(e, count) {
            let mut pipe = redis::pipe();
            pipe.atomic();
            pipe.del(&[
                self.keys.stock(b),
                self.keys.dry(b),
                self.keys.held(b),
                self.keys.purchase_status(b),
                self.keys.restocked(b),
                self.keys.moves(b),
                self.keys.credited(b),
            ])
            .ignore();
            for (i, &(category, _)) in available.iter().enumerate() {
                let units = dealt[usize::from(b.index)][i];
                pipe.hset(self.keys.stock(b), category, units).ignore();
                if units == 0 {
                    pipe.hset(self.keys.dry(b), category, 1).ignore();
                }
            }
            let mine = |user: &u64| Bucket::of_buyer(e, count, UserId(*user)) == b;
            let held: Vec<(&u64, &i64)> = snap.held.iter().filter(|(u, _)| mine(u)).collect();
            for chunk in held.chunks(FIELDS_PER_HSET) {
                pipe.hset_multiple(self.keys.held(b), chunk).ignore();
            }
            let status: Vec<(&u64, &String)> =
                snap.status.iter().filter(|(u, _)| mine(u)).collect();
            for chunk in status.chunks(FIELDS_PER_HSET) {
                pipe.hset_multiple(self.keys.purchase_status(b), chunk)
                    .ignore();
            }
            let given_back: Vec<u64> = snap
                .given_back
                .iter()
                .filter(|(_, u)| mine(u))
                .map(|(order, _)| *order)
                .collect();
            for chunk in given_back.chunks(FIELDS_PER_HSET) {
                pipe.sadd(self.keys.restocked(b), chunk).ignore();
            }
            if count == 1 {
                self.write_seat_maps(&mut pipe, event, b, &snap, &mut report)
                    .await?;
            }
            // The metadata last: admission answers "not loaded" until all of it is there.
            let seq = snap.seq.get(usize::from(b.index)).copied().unwrap_or(0);
            pipe.hset(self.keys.meta(b), "seq", seq).ignore();
            if count > 1 {
                pipe.hset(self.keys.meta(b), "epoch", snap.epoch).ignore();
                self.write_bucket_meta(&mut pipe, event, b);
            } else {
                self.write_meta(&mut pipe, event, Some(snap.epoch));
            }
            pipe.query_async::<()>(redis)
                .await
                .context("Failed to write the event's keys")?;
        }
        if count > 1 {
            let mut pipe = redis::pipe();
            self.write_meta(&mut pipe, event, Some(snap.epoch));
            pipe.query_async::<()>(redis)
                .await
                .context("Failed to write the event's metadata")?;
        }
        self.write_sales_index(redis, event).await?;
        Ok(report)
    }

    /// The seat hashes of a seated event, from MySQL's seats and owners (in the seats'
    /// slot, [`Bucket::seat_home`]).
    async fn write_seat_maps(
        &self,
        pipe: &mut redis::Pipeline,
        event: &EventRecord,
        b: Bucket,
        snap: &snapshot::Snapshot,
        report: &mut PreloadReport,
    ) -> anyhow::Result<()> {
        if event.is_train() {
            self.write_segments(pipe, event, b, snap, report);
            return Ok(());
        }
        for c in event.categories.iter().filter(|c| c.seats.is_some()) {
            let (seats_key, row_free_key) = (self.keys.seats(b, c.id), self.keys.row_free(b, c.id));
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
        Ok(())
    }

    /// A train's classes (docs/trains.md): every seat's segments, taken where a live
    /// order's journey uses them. The classes' versions move, so no cached availability
    /// outlives the rebuild.
    fn write_segments(
        &self,
        pipe: &mut redis::Pipeline,
        event: &EventRecord,
        b: Bucket,
        snap: &snapshot::Snapshot,
        report: &mut PreloadReport,
    ) {
        let free = crate::trains::free_seat(event.stations.len());
        for c in &event.categories {
            let Some(grid) = c.seats else { continue };
            let mut seats: HashMap<(u32, u32), Vec<u8>> = HashMap::new();
            for &(_, row, col, journey) in snap.journeys.iter().filter(|j| j.0 == c.id) {
                let taken = seats
                    .entry((row, col))
                    .or_insert_with(|| free.clone().into_bytes());
                for k in journey.segments() {
                    if let Some(s) = taken.get_mut(k) {
                        *s = b'1';
                    }
                }
            }
            let key = self.keys.segments(b, c.id);
            pipe.del(&key).ignore();
            let all: Vec<(String, String)> = (1..=grid.rows)
                .flat_map(|r| (1..=grid.cols).map(move |s| (r, s)))
                .map(|(r, s)| {
                    let state = seats
                        .get(&(r, s))
                        .map_or_else(|| free.clone(), |t| String::from_utf8_lossy(t).into_owned());
                    (format!("{r}:{s}"), state)
                })
                .collect();
            for chunk in all.chunks(FIELDS_PER_HSET) {
                pipe.hset_multiple(&key, chunk).ignore();
            }
            pipe.hincr(self.keys.segment_versions(event.id), c.id, 1)
                .ignore();
            report.seat_maps_written += 1;
        }
    }

    /// True when the event's metadata and stock are in Redis (for an event of several
    /// buckets: its metadata, its pool and every bucket's metadata).
    async fn keys_present(&self, redis: &mut Redis, event: &EventRecord) -> anyhow::Result<bool> {
        self.keys_present_for(redis, event.id, event.buckets).await
    }

    /// [`Self::keys_present`] for event `e` of `count` buckets.
    async fn keys_present_for(
        &self,
        redis: &mut Redis,
        e: u64,
        count: u16,
    ) -> anyhow::Result<bool> {
        if count <= 1 {
            let present: u32 = redis::cmd("EXISTS")
                .arg(self.keys.event_meta(e))
                .arg(self.keys.stock(Bucket::only(e)))
                .query_async(redis)
                .await?;
            return Ok(present == 2);
        }
        let present: u32 = redis::cmd("EXISTS")
            .arg(self.keys.event_meta(e))
            .arg(self.keys.pool(e))
            .query_async(redis)
            .await?;
        if present != 2 {
            return Ok(false);
        }
        for b in Bucket::all(e, count) {
            let present: u32 = redis::cmd("EXISTS")
                .arg(self.keys.meta(b))
                .arg(self.keys.stock(b))
                .query_async(redis)
                .await?;
            if present != 2 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A bucket's copy of what reserve.lua reads (events of several buckets).
    fn write_bucket_meta(&self, pipe: &mut redis::Pipeline, event: &EventRecord, b: Bucket) {
        pipe.hset_multiple(
            self.keys.meta(b),
            &[
                ("status", sale_status(event.status).to_owned()),
                (
                    "sale_start_ms",
                    event.sale_start.timestamp_millis().to_string(),
                ),
                ("sale_end_ms", event.sale_end.timestamp_millis().to_string()),
                ("per_user_limit", event.per_user_limit.to_string()),
                ("buckets", b.count.to_string()),
            ],
        )
        .ignore();
        closed_since(pipe, self.keys.meta(b), event);
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
                // The edge finds the buckets' keys by their count (stampede/admitted.lua).
                ("buckets", event.buckets.to_string()),
            ],
        )
        .ignore();
        closed_since(pipe, self.keys.event_meta(event.id), event);
    }

    /// The event's entry in the sales index the edge reads: written after the event's
    /// own keys, in a call of its own (on a Redis Cluster the index is in another slot),
    /// so an edge never opens a sale whose keys are not there yet.
    async fn write_sales_index(
        &self,
        redis: &mut Redis,
        event: &EventRecord,
    ) -> anyhow::Result<()> {
        // The waiting room's settings first: no edge sees the sale without its room.
        if let Some(room) = &event.room {
            crate::room::store(redis, &self.keys)
                .publish(event, room)
                .await?;
        }
        redis::cmd("HSET")
            .arg(self.keys.sales_index())
            .arg(event.id)
            .arg(sales_entry(event))
            .query_async::<()>(redis)
            .await
            .context("Failed to write the sales index")
    }

    /// The event's metadata, and each bucket's copy of it (events of several buckets),
    /// one slot at a time: the buckets' first, so the edge opens no sale before them.
    async fn write_all_meta(&self, redis: &mut Redis, event: &EventRecord) -> anyhow::Result<()> {
        if event.buckets > 1 {
            for b in Bucket::all(event.id, event.buckets) {
                let mut pipe = redis::pipe();
                self.write_bucket_meta(&mut pipe, event, b);
                pipe.query_async::<()>(redis)
                    .await
                    .context("Failed to write a bucket's metadata")?;
            }
        }
        let mut pipe = redis::pipe();
        self.write_meta(&mut pipe, event, None);
        pipe.query_async::<()>(redis)
            .await
            .context("Failed to write the event's metadata")
    }

    /// After a close or reopen: the new status where the hot path and the edge read it
    /// (the hot path's first: a close takes effect in the core before the edge hears).
    pub async fn set_sale_status(&self, event: &EventRecord) -> anyhow::Result<()> {
        self.room_clock(event).await?;
        let mut redis = self.redis.clone();
        for meta in self.keys.metas(EventId(event.id), event.buckets) {
            let code: i64 = SALE_STATUS
                .key(meta)
                .arg(sale_status(event.status))
                .arg(event.buckets)
                .invoke_async(&mut redis)
                .await
                .context("Failed to write the sale status")?;
            // A bucket not loaded is rebuilt whole by the next preload or pass.
            StatusWritten::from_code(code)?;
        }
        self.write_sales_index(&mut redis, event).await
    }

    /// A waiting room's turns run only while the sale is open in Redis: stopped before a
    /// status other than PUBLISHED is written, moved by the time stopped before PUBLISHED
    /// is (`room_pause.lua`; docs/waiting-room.md "Closing and reopening"). Run before the
    /// status it follows, so no snapshot sees the sale open with its turns not yet moved,
    /// and a failure leaves the status unwritten (written again by a retry or the next
    /// preload, which runs this again).
    async fn room_clock(&self, event: &EventRecord) -> anyhow::Result<()> {
        if !event.room.as_ref().is_some_and(|r| r.enabled) {
            return Ok(());
        }
        let store = crate::room::store::RoomStore {
            redis: self.redis.clone(),
            keys: self.keys.clone(),
        };
        let open = event.status == EventStatus::Published;
        let moved = store.pause(EventId(event.id), open).await?;
        if moved.steps > 0 {
            tracing::info!(
                event_id = event.id,
                steps = moved.steps,
                by_ms = moved.by_ms,
                "waiting room turns the close interrupted moved by the time it was closed"
            );
        }
        Ok(())
    }

    /// Redis went back in time for this event: removes its metadata (every bucket's),
    /// so admission answers SALE_BUSY (not loaded) until the next pass rebuilds every
    /// key from MySQL, as after a FLUSHALL; and asks for that pass now.
    pub async fn fence(&self, event_id: EventId, buckets: u16) -> anyhow::Result<()> {
        let mut redis = self.redis.clone();
        for b in Bucket::all(event_id, buckets) {
            redis::cmd("DEL")
                .arg(self.keys.meta(b))
                .query_async::<()>(&mut redis)
                .await
                .context("Failed to fence the event")?;
        }
        redis::cmd("DEL")
            .arg(self.keys.event_meta(event_id))
            .query_async::<()>(&mut redis)
            .await
            .context("Failed to fence the event")?;
        self.wake();
        Ok(())
    }

    /// Why the event's Redis state is behind MySQL, if it is: a bucket's admission
    /// counter below the largest number an order of the bucket has (Redis restarted from
    /// an older copy, or a replica that lagged took over), or its keys of an older
    /// generation than MySQL's (a rebuild that lost its lock wrote after a newer one).
    pub async fn behind(&self, event_id: EventId, buckets: u16) -> anyhow::Result<Option<String>> {
        let mut conn = crate::infra::mysql::checkout(&self.mysql).await?;
        let mysql_seq = snapshot::max_seq_per_bucket(&mut *conn, event_id, buckets).await?;
        let mysql_epoch: Option<u64> = conn
            .exec_first("SELECT redis_epoch FROM event WHERE id = ?", (event_id,))
            .await?;
        let mysql_epoch = mysql_epoch.unwrap_or(0);
        let mut redis = self.redis.clone();
        for b in Bucket::all(event_id, buckets) {
            let (redis_seq, redis_epoch): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
                .arg(self.keys.meta(b))
                .arg("seq")
                .arg("epoch")
                .query_async(&mut redis)
                .await?;
            let (redis_seq, redis_epoch) = (redis_seq.unwrap_or(0), redis_epoch.unwrap_or(0));
            let mysql_seq = mysql_seq.get(usize::from(b.index)).copied().unwrap_or(0);
            let which = if buckets > 1 {
                format!(" in bucket {}", b.index)
            } else {
                String::new()
            };
            if redis_seq < mysql_seq {
                return Ok(Some(format!(
                    "admission number {redis_seq} < MySQL's {mysql_seq}{which}"
                )));
            }
            if redis_epoch < mysql_epoch {
                return Ok(Some(format!(
                    "keys of generation {redis_epoch} < MySQL's {mysql_epoch}{which}"
                )));
            }
        }
        Ok(None)
    }

    /// True when the event's metadata and stock are in Redis.
    pub async fn is_loaded(&self, event: &EventRecord) -> anyhow::Result<bool> {
        self.keys_present(&mut self.redis.clone(), event).await
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
        let due = catalog::published_opening_within(&self.mysql, window.as_secs());
        let per_event = self.call_timeout.for_pass();
        for id in self.call_timeout.try_within("the events due", due).await? {
            // One event's failure holds back none of the others.
            let preload = self.preload_if_missing(id);
            if let Err(e) = per_event.try_within("a scheduled preload", preload).await {
                tracing::warn!(
                    event_id = id,
                    error = format!("{e:#}"),
                    "scheduled preload failed; will retry"
                );
            }
        }
        Ok(())
    }

    async fn preload_if_missing(&self, id: u64) -> anyhow::Result<()> {
        // Redis first: a sale whose keys are there (the bucket count its metadata keeps,
        // never changed after creation) costs MySQL nothing. Each pass read every open
        // or soon-open event from MySQL (three queries) to find its keys present: with
        // 620 listed sales, about 370 queries a second of an idle MariaDB per core.
        let mut redis = self.redis.clone();
        let buckets: Option<String> = redis::cmd("HGET")
            .arg(self.keys.event_meta(id))
            .arg("buckets")
            .query_async(&mut redis)
            .await?;
        // A count that does not parse is MySQL's to say.
        if let Some(count) = buckets
            .and_then(|b| b.parse::<u16>().ok())
            .filter(|&c| c >= 1)
            && self.keys_present_for(&mut redis, id, count).await?
        {
            return Ok(());
        }
        let Some(event) = catalog::load(&self.mysql, id).await? else {
            return Ok(());
        };
        if self.is_loaded(&event).await? {
            return Ok(());
        }
        match self.preload(&event).await {
            Ok(_) | Err(PreloadError::Busy(_)) => Ok(()),
            Err(PreloadError::Unexpected(e)) => Err(e),
        }
    }
}

/// Each bucket's share of each category's free units: all of them for one bucket; with
/// B > 1, ceil(free / 4B) each (the rest stays in the pool, for the buckets that sell
/// faster). `dealt[bucket][category index]`.
fn deal(available: &[(u64, i64)], buckets: u16) -> Vec<Vec<i64>> {
    let count = i64::from(buckets.max(1));
    let mut dealt = vec![vec![0; available.len()]; count as usize];
    for (i, &(_, free)) in available.iter().enumerate() {
        let share = if count == 1 {
            free
        } else {
            (free + 4 * count - 1) / (4 * count)
        };
        let mut left = free;
        for bucket in dealt.iter_mut() {
            bucket[i] = share.min(left);
            left -= bucket[i];
        }
    }
    dealt
}

/// With a status written by a publish or a rebuild, the close's time a retirement reads
/// (sale_status.lua writes it on a close): kept if there, else now by this core's clock,
/// for a closed sale; gone for an open one.
fn closed_since(pipe: &mut redis::Pipeline, meta: String, event: &EventRecord) {
    if event.status == EventStatus::Closed {
        pipe.hset_nx(meta, "closed_ms", chrono::Utc::now().timestamp_millis())
            .ignore();
    } else {
        pipe.hdel(meta, "closed_ms").ignore();
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
pub(crate) fn sales_entry(event: &EventRecord) -> String {
    format!(
        "{}:{}:{}",
        sale_status(event.status),
        event.sale_start.timestamp_millis(),
        event.sale_end.timestamp_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::deal;

    #[test]
    fn every_code_of_the_status_script_maps_to_one_variant() {
        crate::script_codes::assert_mirrored::<super::StatusWritten>(include_str!(
            "../../../lua/redis/sale_status.lua"
        ));
    }

    #[test]
    fn one_bucket_gets_everything_and_more_share_a_quarter() {
        assert_eq!(deal(&[(1, 10), (2, 0)], 1), vec![vec![10, 0]]);
        let d = deal(&[(1, 10_000), (2, 5)], 3);
        assert_eq!(d, vec![vec![834, 1], vec![834, 1], vec![834, 1]]);
        let d = deal(&[(1, 2)], 4);
        assert_eq!(d, vec![vec![1], vec![1], vec![0], vec![0]]);
    }
}
