//! Events and their ticket categories in MySQL: written by the admin API, read by the
//! preloader and the stats.

use anyhow::Context;
use chrono::{DateTime, NaiveDateTime, Utc};
use mysql_async::prelude::*;
use mysql_async::{Pool, TxOpts};
use serde::Serialize;

use crate::domain::event::{NewEvent, Stock};
use crate::infra::mysql::CallTimeout;

/// Events as the hot path reads them: from MySQL at most once per `ttl` per event, with
/// concurrent misses coalesced, so a cold cache in a stampede costs one query, not one
/// per buyer. Missing events are cached too (as None), and an id above the largest MySQL
/// has is not read at all, so bogus ids cannot hammer MySQL.
pub struct EventCache {
    pool: Pool,
    /// A read that takes longer fails (every caller waiting on it told so), and the
    /// next caller reads again.
    call_timeout: CallTimeout,
    events: moka::future::Cache<u64, Cached>,
    /// Counts [`EventCache::forget`]s. A record is kept with the count as it was before
    /// its read began, and one older than its event's last forget is read again: a read
    /// in flight when an admin's change forgot its event may have found MySQL before the
    /// change, and the cache inserts what it found after the forget all the same.
    forgets: std::sync::atomic::AtomicU64,
    /// Each forgotten event's count at its last forget, kept past the life of any record
    /// read before it: a read may last the MySQL call timeout, then its record lives the
    /// ttl (looked at only when a forget came since a record's read began).
    forgotten: moka::future::Cache<u64, u64>,
    /// What never changes once an event is created, kept 10 minutes ([`shape`]).
    shapes: moka::future::Cache<u64, Shape>,
    listing: moka::future::Cache<(), std::sync::Arc<Vec<EventRecord>>>,
    /// The largest event id MySQL had when last asked, and when: an id above it is no
    /// event, told without a query (review: every made-up id was one read of MySQL, on
    /// the pool order creation uses, at whatever rate the edge let a token ask).
    highest: std::sync::atomic::AtomicU64,
    /// When `highest` was last read; held while it is read again (one read at a time).
    highest_read: tokio::sync::Mutex<Option<std::time::Instant>>,
    reads: prometheus::IntCounter,
}

/// What never changes once an event is created: the Redis buckets its stock is split
/// over, and whether a category of it is seated (categories and seat maps are written
/// with the event, and never after).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub buckets: u16,
    pub seated: bool,
}

/// An event as read, and the count of forgets before its read began.
#[derive(Clone)]
struct Cached {
    forgets_before: u64,
    event: Option<std::sync::Arc<EventRecord>>,
}

/// How many reads one ask makes while each finds its event forgotten since it began
/// (admin changes in a row): the last is this ask's answer, and the next ask reads again.
const FORGOTTEN_REREADS: usize = 3;

/// How often an id above the largest known sends MySQL a look for a newer largest: an
/// event created on another core is seen at most this late.
const HIGHEST_FRESH: std::time::Duration = std::time::Duration::from_millis(100);

impl EventCache {
    pub fn new(
        pool: Pool,
        ttl: std::time::Duration,
        call_timeout: CallTimeout,
        reads: prometheus::IntCounter,
    ) -> EventCache {
        let forgets_kept = ttl + call_timeout.limit + std::time::Duration::from_secs(1);
        EventCache {
            pool,
            call_timeout,
            highest: std::sync::atomic::AtomicU64::new(0),
            forgets: std::sync::atomic::AtomicU64::new(0),
            forgotten: moka::future::Cache::builder()
                .time_to_live(forgets_kept)
                .build(),
            highest_read: tokio::sync::Mutex::new(None),
            reads,
            events: moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(ttl)
                .build(),
            // Kept 10 minutes, not for good: a database restored under a running core
            // may bring an id back with another shape.
            shapes: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(std::time::Duration::from_secs(600))
                .build(),
            listing: moka::future::Cache::builder()
                .max_capacity(1)
                .time_to_live(ttl)
                .build(),
        }
    }

    /// For a buyer's ask by id (the event's page, its seat map, a queue, a status): an id
    /// above the largest MySQL had at the last look (at most [`HIGHEST_FRESH`] old) is
    /// no event, told without a read. Never for the order pipeline, which must not take
    /// an event another core created a moment ago for a missing one (review: it would
    /// release the event's admitted reservations).
    pub async fn get_public(
        &self,
        event_id: u64,
    ) -> anyhow::Result<Option<std::sync::Arc<EventRecord>>> {
        if let Some(hit) = self.cached(event_id).await {
            return Ok(hit);
        }
        // Not cached as missing: an event created since is found at the next look.
        if !self.may_exist(event_id).await? {
            return Ok(None);
        }
        self.get(event_id).await
    }

    pub async fn get(&self, event_id: u64) -> anyhow::Result<Option<std::sync::Arc<EventRecord>>> {
        use std::sync::atomic::Ordering::Acquire;
        if let Some(hit) = self.cached(event_id).await {
            return Ok(hit);
        }
        let mut tries = 0;
        loop {
            tries += 1;
            let read = self
                .events
                .try_get_with(event_id, async {
                    let forgets_before = self.forgets.load(Acquire);
                    self.reads.inc();
                    let read = load(&self.pool, event_id);
                    let event = self
                        .call_timeout
                        .try_within("an event's read", read)
                        .await?;
                    anyhow::Ok(Cached {
                        forgets_before,
                        event: event.map(std::sync::Arc::new),
                    })
                })
                .await
                .map_err(|e| anyhow::Error::new(Shared(e)))?;
            // A read already in flight when the event was forgotten (the asker may have
            // made the change itself: close, then buy) is not kept: read again.
            if tries == FORGOTTEN_REREADS || !self.outdated(event_id, &read).await {
                return Ok(read.event);
            }
            self.drop_outdated(event_id, &read).await;
        }
    }

    /// The cached record, unless its event was forgotten after its read began.
    async fn cached(&self, event_id: u64) -> Option<Option<std::sync::Arc<EventRecord>>> {
        let hit = self.events.get(&event_id).await?;
        if self.outdated(event_id, &hit).await {
            self.drop_outdated(event_id, &hit).await;
            return None;
        }
        Some(hit.event)
    }

    /// Whether the event was forgotten after the read of `record` began: one atomic
    /// load while no forget at all came since (the purchase path's every ask).
    async fn outdated(&self, event_id: u64, record: &Cached) -> bool {
        let forgets = self.forgets.load(std::sync::atomic::Ordering::Acquire);
        record.forgets_before < forgets
            && self
                .forgotten
                .get(&event_id)
                .await
                .is_some_and(|at| at > record.forgets_before)
    }

    /// Drops `record` from the cache if it is still the one there: buyers holding the
    /// outdated record do not drop one read again and inserted before this looks (one
    /// inserted while it looks may be dropped: one more read).
    async fn drop_outdated(&self, event_id: u64, record: &Cached) {
        use moka::ops::compute::Op;
        let stale = record.forgets_before;
        self.events
            .entry(event_id)
            .and_compute_with(|entry| {
                std::future::ready(match entry {
                    Some(e) if e.value().forgets_before == stale => Op::Remove,
                    _ => Op::Nop,
                })
            })
            .await;
    }

    /// The event's [`Shape`], for the loops that walk every listed sale each second (the
    /// order workers, the bucket sweeper): read once per event every 10 minutes, not once
    /// per `ttl`. Through the ttl, 213 listed sales (200 published a day ahead) cost an
    /// idle MariaDB about 190 event reads a second, three queries each. A missing event
    /// is not kept: one another core created a moment ago is found at the next ask.
    pub async fn shape(&self, event_id: u64) -> anyhow::Result<Option<Shape>> {
        if let Some(shape) = self.shapes.get(&event_id).await {
            return Ok(Some(shape));
        }
        let Some(event) = self.get(event_id).await? else {
            return Ok(None);
        };
        let shape = Shape {
            buckets: event.buckets,
            seated: event.categories.iter().any(|c| c.seats.is_some()),
        };
        self.shapes.insert(event_id, shape).await;
        Ok(Some(shape))
    }

    /// Whether an event of this id may exist: not above the largest id MySQL has, read
    /// again when asked past it, at most every [`HIGHEST_FRESH`] (one read at a time).
    async fn may_exist(&self, event_id: u64) -> anyhow::Result<bool> {
        use std::sync::atomic::Ordering::Relaxed;
        if event_id <= self.highest.load(Relaxed) {
            return Ok(true);
        }
        let mut read_at = self.highest_read.lock().await;
        if event_id <= self.highest.load(Relaxed) {
            return Ok(true); // read meanwhile
        }
        if read_at.is_some_and(|at| at.elapsed() < HIGHEST_FRESH) {
            return Ok(false);
        }
        // Counted as a try whatever comes of it: a failing read is not retried by each
        // waiter in turn, but after HIGHEST_FRESH.
        *read_at = Some(std::time::Instant::now());
        self.reads.inc();
        let pool = self.pool.clone();
        let read = async move {
            let mut conn = crate::infra::mysql::checkout(&pool).await?;
            let max: Option<u64> = conn
                .query_first("SELECT COALESCE(MAX(id), 0) FROM event")
                .await?;
            anyhow::Ok(max.unwrap_or(0))
        };
        let max = self
            .call_timeout
            .try_within("the largest event id", read)
            .await?;
        self.highest.fetch_max(max, Relaxed);
        Ok(event_id <= max)
    }

    /// An event this instance has just created: its id is no longer above the largest.
    pub fn created(&self, event_id: u64) {
        self.highest
            .fetch_max(event_id, std::sync::atomic::Ordering::Relaxed);
    }

    /// Drops the event from this instance's cache (others see a change within the ttl),
    /// and a read of it in flight with it; the listing is read again too.
    pub async fn forget(&self, event_id: u64) {
        let at = 1 + self
            .forgets
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        // The largest count: two forgets of one event may insert in either order.
        self.forgotten
            .entry(event_id)
            .and_upsert_with(|last| std::future::ready(last.map_or(at, |e| at.max(*e.value()))))
            .await;
        self.events.invalidate(&event_id).await;
        self.listing.invalidate(&()).await;
    }

    /// Events buyers may see (published or closed), newest first, without categories.
    pub async fn on_sale(&self) -> anyhow::Result<std::sync::Arc<Vec<EventRecord>>> {
        self.listing
            .try_get_with((), async {
                let read = list(&self.pool, 1_000);
                let all = self
                    .call_timeout
                    .try_within("the events' list", read)
                    .await?;
                anyhow::Ok(std::sync::Arc::new(
                    all.into_iter()
                        .filter(|e| e.status != EventStatus::Draft)
                        .collect(),
                ))
            })
            .await
            .map_err(|e| anyhow::Error::new(Shared(e)))
    }
}

/// A failed read, shared by every caller that waited on it, its causes kept: MySQL
/// down or too slow is still found in them (`infra::Down`: a 503, not a 500).
#[derive(Debug)]
struct Shared(std::sync::Arc<anyhow::Error>);

impl std::fmt::Display for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The causes follow as the chain.
        f.write_str("the event cache's read failed")
    }
}

impl std::error::Error for Shared {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let inner: &(dyn std::error::Error + Send + Sync + 'static) = &**self.0;
        Some(inner)
    }
}

/// Seats inserted per statement when an event is created.
const SEAT_ROWS_PER_INSERT: usize = 5_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum EventStatus {
    Draft,
    Published,
    Closed,
}

impl EventStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            EventStatus::Draft => "DRAFT",
            EventStatus::Published => "PUBLISHED",
            EventStatus::Closed => "CLOSED",
        }
    }

    fn parse(s: &str) -> anyhow::Result<EventStatus> {
        Ok(match s {
            "DRAFT" => EventStatus::Draft,
            "PUBLISHED" => EventStatus::Published,
            "CLOSED" => EventStatus::Closed,
            other => anyhow::bail!("unknown event status {other:?} in the database"),
        })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct EventRecord {
    pub id: u64,
    pub title: String,
    pub venue: String,
    pub show_time: DateTime<Utc>,
    pub sale_start: DateTime<Utc>,
    pub sale_end: DateTime<Utc>,
    pub per_user_limit: u32,
    pub pay_timeout_s: u32,
    /// Redis buckets the stock is split over (docs/scaling.md); 1 for most events.
    pub buckets: u16,
    pub status: EventStatus,
    /// "sale", or "train" (docs/trains.md).
    pub kind: String,
    /// A train's stations in route order; empty for any other event (and in listings).
    pub stations: Vec<String>,
    pub categories: Vec<CategoryRecord>,
    /// The waiting room as set (docs/waiting-room.md); None if never set. Read by
    /// [`load`] only (listings leave it out).
    #[serde(rename = "waiting_room")]
    pub room: Option<crate::room::config::RoomConfig>,
}

impl EventRecord {
    /// True for a train (its categories are seat classes sold by route segment).
    pub fn is_train(&self) -> bool {
        self.kind == "train"
    }

    /// True while the sale admits purchases at `now`: published, and within its window.
    /// Every check of the window goes through here, with one `now` per request.
    pub fn on_sale_at(&self, now: DateTime<Utc>) -> bool {
        self.status == EventStatus::Published && self.sale_start <= now && now < self.sale_end
    }

    /// A train's segments (stations − 1); 0 for any other event.
    pub fn segments(&self) -> usize {
        self.stations.len().saturating_sub(1)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CategoryRecord {
    pub id: u64,
    pub name: String,
    pub price_cents: u64,
    pub total: u32,
    /// MySQL's count of unsold units; lags Redis during a sale.
    pub remain: i64,
    pub seats: Option<SeatGrid>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct SeatGrid {
    pub rows: u32,
    pub cols: u32,
}

/// Inserts the event, its categories and seats in one transaction; returns its id.
pub async fn insert(pool: &Pool, e: &NewEvent) -> anyhow::Result<u64> {
    let mut conn = crate::infra::mysql::checkout(pool)
        .await
        .context("Failed to get a MySQL connection")?;
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    tx.exec_drop(
        "INSERT INTO event (title, venue, show_time, sale_start, sale_end, per_user_limit, pay_timeout_s, buckets, kind) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            &e.title,
            &e.venue,
            e.show_time.naive_utc(),
            e.sale_start.naive_utc(),
            e.sale_end.naive_utc(),
            e.per_user_limit,
            e.pay_timeout_s,
            e.buckets,
            if e.stations.is_empty() { "sale" } else { "train" },
        ),
    )
    .await
    .context("Failed to insert the event")?;
    let event_id = tx.last_insert_id().context("no id for the new event")?;
    for (idx, name) in e.stations.iter().enumerate() {
        tx.exec_drop(
            "INSERT INTO event_station (event_id, idx, name) VALUES (?, ?, ?)",
            (event_id, idx, name),
        )
        .await
        .context("Failed to insert a station")?;
    }
    for c in &e.categories {
        let (rows, cols) = match c.stock {
            Stock::Units(_) => (None, None),
            Stock::Seats { rows, cols } => (Some(rows), Some(cols)),
        };
        let total = e.units(c);
        tx.exec_drop(
            "INSERT INTO ticket_category (event_id, name, price_cents, total, remain, seat_rows, seat_cols) \
             VALUES (?, ?, ?, ?, ?, ?, ?)",
            (event_id, &c.name, c.price_cents, total, total, rows, cols),
        )
        .await
        .context("Failed to insert a ticket category")?;
        let category_id = tx.last_insert_id().context("no id for the new category")?;
        // A train's seats have no `seat` rows: their segments are in `seat_segment`.
        if let (Stock::Seats { rows, cols }, true) = (c.stock, e.stations.is_empty()) {
            let seats: Vec<(u32, u32)> = (1..=rows)
                .flat_map(|r| (1..=cols).map(move |c| (r, c)))
                .collect();
            for chunk in seats.chunks(SEAT_ROWS_PER_INSERT) {
                // Only integers go into this text, so building it is safe and spares a
                // prepared statement with thousands of placeholders.
                let values: Vec<String> = chunk
                    .iter()
                    .map(|(r, c)| format!("({category_id},{r},{c},{event_id})"))
                    .collect();
                tx.query_drop(format!(
                    "INSERT INTO seat (category_id, row_no, col_no, event_id) VALUES {}",
                    values.join(",")
                ))
                .await
                .context("Failed to insert seats")?;
            }
        }
    }
    tx.commit()
        .await
        .context("Failed to commit the new event")?;
    Ok(event_id)
}

type EventRow = (
    u64,
    String,
    String,
    NaiveDateTime,
    NaiveDateTime,
    NaiveDateTime,
    u32,
    u32,
    u16,
    String,
    String,
);

const EVENT_COLUMNS: &str = "id, title, venue, show_time, sale_start, sale_end, per_user_limit, pay_timeout_s, buckets, status, kind";

/// The event's status alone (one query, where [`load`] makes three).
pub async fn status_of(pool: &Pool, event_id: u64) -> anyhow::Result<Option<EventStatus>> {
    let mut conn = crate::infra::mysql::checkout(pool)
        .await
        .context("Failed to get a MySQL connection")?;
    let status: Option<String> = conn
        .exec_first("SELECT status FROM event WHERE id = ?", (event_id,))
        .await
        .context("Failed to read the event's status")?;
    status.as_deref().map(EventStatus::parse).transpose()
}

/// The event with its categories, or None.
pub async fn load(pool: &Pool, event_id: u64) -> anyhow::Result<Option<EventRecord>> {
    let mut conn = crate::infra::mysql::checkout(pool)
        .await
        .context("Failed to get a MySQL connection")?;
    let row: Option<EventRow> = conn
        .exec_first(
            format!("SELECT {EVENT_COLUMNS} FROM event WHERE id = ?"),
            (event_id,),
        )
        .await
        .context("Failed to read the event")?;
    let Some(row) = row else { return Ok(None) };
    let mut event = event_from_row(row)?;
    if event.is_train() {
        event.stations = conn
            .exec(
                "SELECT name FROM event_station WHERE event_id = ? ORDER BY idx",
                (event_id,),
            )
            .await
            .context("Failed to read the stations")?;
    }
    event.categories = conn
        .exec_map(
            "SELECT id, name, price_cents, total, remain, seat_rows, seat_cols \
             FROM ticket_category WHERE event_id = ? ORDER BY id",
            (event_id,),
            |(id, name, price_cents, total, remain, rows, cols): (
                u64,
                String,
                u64,
                u32,
                i64,
                Option<u32>,
                Option<u32>,
            )| CategoryRecord {
                id,
                name,
                price_cents,
                total,
                remain,
                seats: rows.zip(cols).map(|(rows, cols)| SeatGrid { rows, cols }),
            },
        )
        .await
        .context("Failed to read the ticket categories")?;
    event.room = crate::room::config::load(&mut conn, event_id).await?;
    Ok(Some(event))
}

/// Every event, newest first, without categories.
pub async fn list(pool: &Pool, limit: u32) -> anyhow::Result<Vec<EventRecord>> {
    let mut conn = crate::infra::mysql::checkout(pool)
        .await
        .context("Failed to get a MySQL connection")?;
    let rows: Vec<EventRow> = conn
        .exec(
            format!("SELECT {EVENT_COLUMNS} FROM event ORDER BY id DESC LIMIT ?"),
            (limit,),
        )
        .await
        .context("Failed to list events")?;
    rows.into_iter().map(event_from_row).collect()
}

fn event_from_row(
    (
        id,
        title,
        venue,
        show_time,
        sale_start,
        sale_end,
        per_user_limit,
        pay_timeout_s,
        buckets,
        status,
        kind,
    ): EventRow,
) -> anyhow::Result<EventRecord> {
    Ok(EventRecord {
        id,
        title,
        venue,
        show_time: show_time.and_utc(),
        sale_start: sale_start.and_utc(),
        sale_end: sale_end.and_utc(),
        per_user_limit,
        pay_timeout_s,
        buckets: buckets.max(1),
        status: EventStatus::parse(&status)?,
        kind,
        stations: Vec::new(),
        categories: Vec::new(),
        room: None,
    })
}

/// Moves the event to `to` if it is in one of `from`; false when it was not.
pub async fn transition(
    pool: &Pool,
    event_id: u64,
    from: &[EventStatus],
    to: EventStatus,
) -> anyhow::Result<bool> {
    let allowed: Vec<String> = from.iter().map(|s| format!("'{}'", s.as_str())).collect();
    let mut conn = crate::infra::mysql::checkout(pool)
        .await
        .context("Failed to get a MySQL connection")?;
    conn.exec_drop(
        format!(
            "UPDATE event SET status = ? WHERE id = ? AND status IN ({})",
            allowed.join(",")
        ),
        (to.as_str(), event_id),
    )
    .await
    .context("Failed to change the event status")?;
    // affected_rows counts changed rows only, so an event already in `to` reads 0.
    let now: Option<String> = conn
        .exec_first("SELECT status FROM event WHERE id = ?", (event_id,))
        .await?;
    Ok(now.as_deref() == Some(to.as_str()))
}

/// Published events whose sale opens within `window_s` and has not ended.
pub async fn published_opening_within(pool: &Pool, window_s: u64) -> anyhow::Result<Vec<u64>> {
    let mut conn = crate::infra::mysql::checkout(pool)
        .await
        .context("Failed to get a MySQL connection")?;
    conn.exec(
        "SELECT id FROM event WHERE status = 'PUBLISHED' \
         AND sale_start <= UTC_TIMESTAMP(3) + INTERVAL ? SECOND AND sale_end > UTC_TIMESTAMP(3)",
        (window_s,),
    )
    .await
    .context("Failed to find events opening soon")
}

/// Units per category created but not yet subtracted from `remain` (their stock_batch
/// rows not synced).
pub async fn unsynced_units(pool: &Pool, event_id: u64) -> anyhow::Result<Vec<(u64, i64)>> {
    let mut conn = crate::infra::mysql::checkout(pool)
        .await
        .context("Failed to get a MySQL connection")?;
    conn.exec(
        "SELECT category_id, CAST(SUM(units) AS SIGNED) FROM stock_batch \
         WHERE synced = 0 AND event_id = ? GROUP BY category_id",
        (event_id,),
    )
    .await
    .context("Failed to read the unsynced stock_batch rows")
}

/// Seats of a category as (row, col, status).
pub async fn seats(pool: &Pool, category_id: u64) -> anyhow::Result<Vec<(u32, u32, String)>> {
    let mut conn = crate::infra::mysql::checkout(pool)
        .await
        .context("Failed to get a MySQL connection")?;
    conn.exec(
        "SELECT row_no, col_no, status FROM seat WHERE category_id = ? ORDER BY row_no, col_no",
        (category_id,),
    )
    .await
    .context("Failed to read seats")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infra::Down;
    use crate::infra::mysql::TimedOut;

    #[test]
    fn a_shared_read_failure_still_says_mysql_is_down() {
        let cut = anyhow::Error::new(TimedOut(std::time::Duration::from_secs(1)))
            .context("Failed to read the event");
        let shared = anyhow::Error::new(Shared(std::sync::Arc::new(cut)));
        assert_eq!(Down::of(&shared), Some(Down::MySql));
        assert_eq!(
            format!("{shared:#}"),
            "the event cache's read failed: Failed to read the event: no answer from MySQL \
             within 1000 ms (mysql.call_timeout_ms)"
        );
        let other = anyhow::Error::new(Shared(std::sync::Arc::new(anyhow::anyhow!("bad row"))));
        assert_eq!(Down::of(&other), None);
    }

    /// The read itself is MySQL's (e2e); here the records are put in as a read would.
    #[tokio::test]
    async fn a_record_read_before_a_forget_is_not_served_after_it() {
        let metrics = crate::metrics::Metrics::new();
        let cache = EventCache::new(
            Pool::from_url("mysql://127.0.0.1:9/none").unwrap(),
            std::time::Duration::from_secs(60),
            CallTimeout::new(std::time::Duration::from_secs(1), &metrics),
            metrics.event_reads.clone(),
        );
        let record = |forgets_before| Cached {
            forgets_before,
            event: Some(std::sync::Arc::new(
                crate::admission::validate::tests::event(),
            )),
        };
        cache.events.insert(7, record(0)).await;
        assert!(
            cache.cached(7).await.is_some(),
            "no forget came after its read"
        );
        // Another event's forget leaves it be.
        cache.forget(8).await;
        assert!(cache.cached(7).await.is_some(), "another event forgotten");
        // A record whose read began before its own event's forget (put back by a read
        // in flight at the forget, as moka does) is not served, and is dropped.
        cache.forget(7).await;
        cache.events.insert(7, record(1)).await;
        assert!(cache.cached(7).await.is_none(), "read before the forget");
        assert!(cache.events.get(&7).await.is_none(), "and dropped");
        // A read that began after it is served, until the next forget.
        cache.events.insert(7, record(2)).await;
        assert_eq!(cache.cached(7).await.unwrap().unwrap().id, 7);
        cache.forget(7).await;
        assert!(cache.cached(7).await.is_none());
        // A holder of an outdated record does not drop a newer one.
        cache.events.insert(7, record(3)).await;
        cache.drop_outdated(7, &record(2)).await;
        assert!(cache.cached(7).await.is_some());
        assert_eq!(metrics.event_reads.get(), 0, "nothing read from MySQL here");
    }

    /// An ask that joins a read begun before a forget does not take what it found: it
    /// reads again (here from a MySQL that is not there, so the ask fails rather than
    /// answer with the record from before).
    #[tokio::test]
    async fn an_ask_after_a_forget_does_not_take_a_read_begun_before_it() {
        let metrics = crate::metrics::Metrics::new();
        let cache = std::sync::Arc::new(EventCache::new(
            Pool::from_url("mysql://127.0.0.1:9/none").unwrap(),
            std::time::Duration::from_secs(60),
            CallTimeout::new(std::time::Duration::from_secs(1), &metrics),
            metrics.event_reads.clone(),
        ));
        let (began, mut begun) = tokio::sync::mpsc::channel::<()>(1);
        let in_flight = {
            let cache = cache.clone();
            tokio::spawn(async move {
                cache
                    .events
                    .try_get_with(7, async move {
                        began.send(()).await.unwrap();
                        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                        anyhow::Ok(Cached {
                            forgets_before: 0,
                            event: Some(std::sync::Arc::new(
                                crate::admission::validate::tests::event(),
                            )),
                        })
                    })
                    .await
                    .map(|c| c.forgets_before)
            })
        };
        begun.recv().await.unwrap();
        cache.forget(7).await; // the admin's change, while the read is in flight
        let asked = cache.get(7).await;
        assert!(
            asked.is_err(),
            "took the record read before the forget: {asked:?}"
        );
        assert_eq!(metrics.event_reads.get(), 1, "read again once");
        assert_eq!(in_flight.await.unwrap().unwrap(), 0);
    }
}
