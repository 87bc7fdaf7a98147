//! Reconciliation (DESIGN.md "Consistency", invariant 2): per ticket category, Redis
//! stock + queued reservations + unpaid + paid units must equal the category's total, and
//! MySQL's remain must equal total − unpaid − paid once stock sync has caught up.
//!
//! A pass measures both gaps and exports them, rebuilds an event's keys when Redis lost
//! them, gives back cancelled orders whose units never reached Redis, and heals what is
//! left only when it is sure: a drift is acted on when a second measurement `confirm`
//! later agrees with the first and no reservation is queued. While a sale runs, Redis is
//! only ever lowered (rather undersell than oversell); a positive gap is raised once the
//! sale is not running. Every heal runs under the event's preload lock.

mod books;
mod heal;
pub mod report;
mod retire;
mod status;
mod unchanged;

pub use books::{Balance, CategoryBalance, SegmentBalance, units_by_status};

use std::collections::HashMap;
use std::time::Duration;

use crate::domain::EventId;
use crate::infra::redis::Redis;
use anyhow::Context;
use mysql_async::Pool;
use serde::Serialize;

use crate::buckets::Mover;
use crate::catalog::{self, EventRecord, EventStatus};
use crate::config::{Resolved, Settings};
use crate::infra::Down;
use crate::keys::{Bucket, Keys};
use crate::lock::Lock;
use crate::metrics::Metrics;
use crate::order_tables::OrderStatus;
use crate::preload::{PreloadError, Preloader};
use crate::shutdown::Shutdown;
use crate::telemetry::Throttle;

/// Longest backlog counted per category (XRANGE is work for Redis; stats are polled).
const MAX_COUNTED_BACKLOG: usize = 10_000;

/// How long a heal waits for the preload lock before leaving the event for the next pass.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// What a pass found and did.
#[derive(Debug, Serialize)]
pub struct Report {
    pub event_id: u64,
    /// Each change made, in words; empty when nothing needed healing.
    pub actions: Vec<String>,
    /// The books after the pass.
    pub balance: Balance,
}

/// What Redis holds of an event's books.
#[derive(Debug, Default)]
struct RedisBooks {
    stock: HashMap<u64, i64>,
    loaded: bool,
    backlog: u64,
    queued: HashMap<u64, i64>,
    /// A train's classes: seats taken and seats queued per segment.
    segments: HashMap<u64, (Vec<i64>, Vec<i64>)>,
    /// Units moving between an event's buckets, or in seat locks pending.
    in_flight: bool,
}

#[derive(Clone)]
pub struct Reconciler {
    pub redis: Redis,
    pub mysql: Pool,
    pub keys: Keys,
    pub shards: u32,
    pub preloader: Preloader,
    pub confirm: Duration,
    /// `reconcile.retire_after_s` (retire.rs).
    pub retire_after: Duration,
    /// `reconcile.purge_after_s` (retire.rs); zero: never.
    pub purge_after: Duration,
    /// `stampede_conservation_gap{event,category}` and `stampede_remain_gap{…}`.
    pub gap_gauge: prometheus::IntGaugeVec,
    pub remain_gauge: prometheus::IntGaugeVec,
    /// `stampede_redis_rewinds_total`.
    pub rewinds: prometheus::IntCounter,
    /// `redis.wait_replicas` > 0: the heal's drains wait for each move's replicas, as
    /// the buyers' refills do (crate::buckets::Mover).
    pub replicas: Option<std::sync::Arc<crate::admission::replicated::ReplicaBarrier>>,
    /// `stampede_oversold_units{event,category}`.
    pub oversold_gauge: prometheus::IntGaugeVec,
    /// (event, category) pairs oversold already alarmed: one alarm each, not one a pass.
    pub alarmed: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<(u64, u64)>>>,
    /// Sales on whose last periodic pass balanced, to skip while nothing changed.
    unchanged: std::sync::Arc<unchanged::Unchanged>,
    /// `stampede_reconcile_passes_total{pass}`.
    passes: prometheus::IntCounterVec,
}

/// The events a periodic round passes over ([`Reconciler::events`]), and which of them
/// MySQL had published, within their window or opening soon, as the round began.
struct Listed {
    ids: Vec<u64>,
    published: std::collections::HashSet<u64>,
}

/// The reservations queued in a stream's entries under the keys' current generation
/// (`epoch`); an entry that does not read as one is not counted.
fn queued(
    entries: &redis::streams::StreamRangeReply,
    epoch: u64,
) -> impl Iterator<Item = crate::orders::reservation::Reservation> + '_ {
    entries
        .ids
        .iter()
        .filter_map(|e| crate::orders::reservation::Reservation::from_entry(e).ok())
        .filter(move |r| r.epoch >= epoch)
}

/// A published sale opening more than `margin` from `now`: no purchase of it can have
/// been admitted (each core checks the window by its own clock, and a core's clock may
/// run ahead of this one's).
fn not_yet_open(
    event: &EventRecord,
    now: chrono::DateTime<chrono::Utc>,
    margin: chrono::TimeDelta,
) -> bool {
    event.status == EventStatus::Published && now + margin < event.sale_start
}

/// How far ahead of its open a sale is measured as any other: a minute, and at least
/// three passes, so that a rewind is fenced and a low stock raised before the open.
fn open_margin(interval: Duration) -> chrono::TimeDelta {
    let passes = chrono::TimeDelta::from_std(interval * 3).unwrap_or(chrono::TimeDelta::MAX);
    passes.max(chrono::TimeDelta::seconds(60))
}

/// How long the reconciler waits for Redis's identity.
const IDENTITY_TIMEOUT: Duration = Duration::from_secs(2);

/// While Redis's identity stays unread (an ACL user without INFO reads none ever), the
/// warning is logged again this often, not twice a round.
const IDENTITY_WARN_EVERY: Duration = Duration::from_secs(600);

/// Logs what reading Redis's identity gave: a warning when it first fails and again
/// every [`IDENTITY_WARN_EVERY`] while it does (`warned`), a note when it is read again.
/// Whether it warned.
fn report_identity(read: anyhow::Result<()>, warned: &Throttle, now: std::time::Instant) -> bool {
    match read {
        Err(e) => {
            let due = warned.due_at(now);
            if due {
                // Down, or INFO refused (an ACL user without @dangerous, a proxy, a
                // managed Redis that renames it): nothing is skipped while unread.
                tracing::warn!(
                    error = format!("{e:#}"),
                    again_after_s = warned.every().as_secs(),
                    "Redis's identity (INFO) unread: every sale passed in full"
                );
            }
            due
        }
        Ok(()) => {
            if warned.recovered() {
                tracing::info!("Redis's identity read again: unchanged sales may be skipped");
            }
            false
        }
    }
}

impl Reconciler {
    /// Shares the preloader's connections; exports into `metrics`.
    pub fn new(
        preloader: Preloader,
        settings: &Settings,
        metrics: &Metrics,
        replicas: Option<std::sync::Arc<crate::admission::replicated::ReplicaBarrier>>,
    ) -> Reconciler {
        Reconciler {
            replicas,
            redis: preloader.redis.clone(),
            mysql: preloader.mysql.clone(),
            keys: preloader.keys.clone(),
            shards: settings.mysql.order_shards,
            confirm: Duration::from_millis(settings.reconcile.confirm_ms),
            retire_after: Duration::from_secs(settings.reconcile.retire_after_s),
            purge_after: Duration::from_secs(settings.reconcile.purge_after_s),
            gap_gauge: metrics.conservation_gap.clone(),
            remain_gauge: metrics.remain_gap.clone(),
            rewinds: metrics.redis_rewinds.clone(),
            oversold_gauge: metrics.oversold_units.clone(),
            alarmed: Default::default(),
            unchanged: Default::default(),
            passes: metrics.reconcile_passes.clone(),
            preloader,
        }
    }

    /// This reconciler on MySQL pool `mysql` (its preloader too), sharing the rest: its
    /// alarms, gauges and skipped sales among them.
    pub fn on(&self, mysql: Pool) -> Reconciler {
        Reconciler {
            preloader: self.preloader.on(mysql.clone()),
            mysql,
            ..self.clone()
        }
    }

    /// For `stampede reconcile`: connects to Redis and MySQL as the core would.
    pub async fn connect(config: &Resolved) -> anyhow::Result<Reconciler> {
        let s = &config.settings;
        let timeout = Duration::from_secs(s.startup.connect_timeout_s);
        let redis = crate::infra::redis::connect(&s.redis, timeout).await?;
        let mysql = crate::infra::mysql::connect(config.mysql_opts.clone(), timeout).await?;
        let keys = Keys::new(&s.redis.key_prefix);
        let metrics = Metrics::new();
        let call_timeout = crate::infra::mysql::CallTimeout::new(
            Duration::from_millis(s.mysql.call_timeout_ms),
            &metrics,
        );
        let preloader = Preloader::new(redis, mysql, keys, s, call_timeout);
        let replicas = crate::admission::replicated::ReplicaBarrier::from_settings(&s.redis);
        Ok(Reconciler::new(preloader, s, &metrics, replicas))
    }

    /// Measures the event's books without changing anything.
    pub async fn measure(&self, event: &EventRecord) -> anyhow::Result<Balance> {
        let e = event.id;
        // Redis first, one atomic read per bucket; then MySQL. An order committed between
        // the two reads and not yet settled counts twice (a negative gap for a moment),
        // which is why nothing is healed while reservations are queued.
        let (read, redis_unavailable) = match self.read_redis(event).await {
            Ok(read) => (read, None),
            Err(e) if Down::of(&e).is_some() => (
                RedisBooks::default(),
                Some(format!("Redis is unavailable: {e:#}")),
            ),
            Err(e) => return Err(e),
        };
        let RedisBooks {
            stock,
            loaded,
            backlog,
            queued,
            segments,
            in_flight,
        } = read;
        let counted = redis_unavailable.is_none() && backlog <= MAX_COUNTED_BACKLOG as u64;
        let held = units_by_status(&self.mysql, self.shards, e, event.is_train()).await?;
        let in_orders = if event.is_train() {
            let classes: Vec<u64> = event.categories.iter().map(|c| c.id).collect();
            books::seat_segments_in_orders(&self.mysql, &classes).await?
        } else {
            HashMap::new()
        };
        let unsynced: HashMap<u64, i64> = catalog::unsynced_units(&self.mysql, e)
            .await?
            .into_iter()
            .collect();
        let fresh = catalog::load(&self.mysql, e)
            .await?
            .with_context(|| format!("no event {e}"))?;
        let categories = fresh
            .categories
            .iter()
            .map(|c| {
                let count = |status| held.get(&(c.id, status)).copied().unwrap_or(0);
                let (unpaid, paid) = (count(OrderStatus::Unpaid), count(OrderStatus::Paid));
                let redis_available = if loaded {
                    stock.get(&c.id).copied()
                } else {
                    None
                };
                let queued = counted.then(|| queued.get(&c.id).copied().unwrap_or(0));
                let unsynced = unsynced.get(&c.id).copied().unwrap_or(0);
                let total = i64::from(c.total);
                CategoryBalance {
                    category_id: c.id,
                    name: c.name.clone(),
                    total,
                    redis_available,
                    queued,
                    unpaid,
                    paid,
                    gap: queued.map(|q| total - (redis_available.unwrap_or(0) + q + unpaid + paid)),
                    db_remain: c.remain,
                    unsynced,
                    remain_gap: c.remain - (total - unpaid - paid + unsynced),
                    oversold: (unpaid + paid - total).max(0),
                    segments: segments.get(&c.id).filter(|_| counted && loaded).map(
                        |(taken, queued)| {
                            let held = |k| in_orders.get(&(c.id, k)).copied().unwrap_or(0);
                            SegmentBalance::of(taken, queued, held)
                        },
                    ),
                }
            })
            .collect();
        let balance = Balance {
            event_id: e,
            loaded,
            queued_reservations: backlog,
            categories,
            redis_unavailable,
            in_flight,
        };
        self.export(&balance);
        Ok(balance)
    }

    /// What Redis holds of the event: units available (for an event of several
    /// buckets: the pool, every bucket and the units moving between them), whether its
    /// keys are there, and the reservations queued per category (only those of the keys'
    /// current generation: older ones were counted free by the rebuild).
    async fn read_redis(&self, event: &EventRecord) -> anyhow::Result<RedisBooks> {
        type BucketHalf = (
            HashMap<u64, i64>,
            Option<u64>,
            u32,
            u64,
            redis::streams::StreamRangeReply,
        );
        let mut redis = self.redis.clone();
        let mut books = RedisBooks {
            loaded: true,
            ..RedisBooks::default()
        };
        for b in Bucket::all(event.id, event.buckets) {
            let (stock, epoch, present, backlog, entries): BucketHalf = redis::pipe()
                .atomic()
                .hgetall(self.keys.stock(b))
                .hget(self.keys.meta(b), "epoch")
                .exists(&[self.keys.meta(b), self.keys.stock(b)])
                .xlen(self.keys.order_stream(b))
                .xrange_count(self.keys.order_stream(b), "-", "+", MAX_COUNTED_BACKLOG)
                .query_async(&mut redis)
                .await
                .context("Failed to read the event's keys")?;
            books.loaded &= present == 2;
            books.backlog += backlog;
            for (c, units) in stock {
                *books.stock.entry(c).or_default() += units;
            }
            for r in queued(&entries, epoch.unwrap_or(0)) {
                // A train ticket's units are its seat-segments.
                *books.queued.entry(r.category_id.0).or_default() += i64::from(r.units());
            }
        }
        if event.is_train() {
            books.segments = self.read_segments(event).await?;
        }
        if event.buckets > 1 {
            let (pool, present): (HashMap<u64, i64>, u32) = redis::pipe()
                .hgetall(self.keys.pool(event.id))
                .exists(&[self.keys.event_meta(event.id), self.keys.pool(event.id)])
                .query_async(&mut redis)
                .await
                .context("Failed to read the event's pool")?;
            books.loaded &= present == 2;
            let under_way = self.under_way(event).await?;
            books.in_flight = !under_way.is_empty();
            for (c, units) in pool.into_iter().chain(under_way) {
                *books.stock.entry(c).or_default() += units;
            }
        }
        Ok(books)
    }

    /// An event of several buckets: (category, units) moving between its places, then
    /// in its seat locks pending.
    async fn under_way(&self, event: &EventRecord) -> anyhow::Result<Vec<(u64, i64)>> {
        let mover = Mover {
            redis: self.redis.clone(),
            keys: self.keys.clone(),
            replicas: None,
        };
        let mut units = mover.moving(EventId(event.id), event.buckets).await?;
        units.extend(
            crate::admission::seat_lock::pending_units(
                &mut self.redis.clone(),
                &self.keys,
                EventId(event.id),
            )
            .await?,
        );
        Ok(units)
    }

    /// A train's classes: seats taken per segment in Redis, and seats per segment in the
    /// reservations queued (of the keys' current generation), in one atomic read.
    async fn read_segments(
        &self,
        event: &EventRecord,
    ) -> anyhow::Result<HashMap<u64, (Vec<i64>, Vec<i64>)>> {
        let b = Bucket::only(event.id);
        let segments = event.segments();
        let mut pipe = redis::pipe();
        pipe.atomic().hget(self.keys.meta(b), "epoch").xrange_count(
            self.keys.order_stream(b),
            "-",
            "+",
            MAX_COUNTED_BACKLOG,
        );
        for c in &event.categories {
            pipe.hvals(self.keys.segments(b, c.id));
        }
        let mut redis = self.redis.clone();
        let (head, seats): (Vec<redis::Value>, Vec<Vec<String>>) = {
            let mut all: Vec<redis::Value> = pipe
                .query_async(&mut redis)
                .await
                .context("Failed to read the train's seats")?;
            let seats = all
                .split_off(2)
                .into_iter()
                .map(|v| redis::from_redis_value(&v))
                .collect::<Result<_, _>>()?;
            (all, seats)
        };
        let epoch: Option<u64> = redis::from_redis_value(&head[0])?;
        let entries: redis::streams::StreamRangeReply = redis::from_redis_value(&head[1])?;
        let mut books: HashMap<u64, (Vec<i64>, Vec<i64>)> = HashMap::new();
        for (c, seats) in event.categories.iter().zip(seats) {
            let mut taken = vec![0; segments];
            for seat in seats {
                for (k, state) in seat.bytes().take(segments).enumerate() {
                    taken[k] += i64::from(state == b'1');
                }
            }
            books.insert(c.id, (taken, vec![0; segments]));
        }
        for r in queued(&entries, epoch.unwrap_or(0)) {
            if let Some(j) = r.journey
                && let Some((_, queued)) = books.get_mut(&r.category_id.0)
            {
                for k in j.segments().filter(|&k| k < segments) {
                    queued[k] += i64::from(r.quantity);
                }
            }
        }
        Ok(books)
    }

    fn export(&self, b: &Balance) {
        let event = b.event_id.to_string();
        for c in &b.categories {
            let labels = [event.as_str(), &c.category_id.to_string()];
            if let Some(gap) = c.gap {
                self.gap_gauge.with_label_values(&labels).set(gap);
            }
            self.remain_gauge
                .with_label_values(&labels)
                .set(c.remain_gap);
        }
    }

    /// An oversold category (more units in live orders than it has) raises one alarm
    /// when first seen — log and gauge, the stats show `oversold` — and another only
    /// once it was gone and came back.
    fn alarm_once(&self, b: &Balance) {
        let mut alarmed = self.alarmed.lock().expect("not poisoned");
        for c in &b.categories {
            let key = (b.event_id, c.category_id);
            self.oversold_gauge
                .with_label_values(&[&b.event_id.to_string(), &c.category_id.to_string()])
                .set(c.oversold);
            if c.oversold > 0 && alarmed.insert(key) {
                tracing::error!(
                    event_id = b.event_id,
                    category_id = c.category_id,
                    oversold = c.oversold,
                    "ALARM: more units in live orders than the category has; no pass can heal this, it needs a person"
                );
            } else if c.oversold == 0 {
                alarmed.remove(&key);
            }
        }
    }

    /// One pass over one event: measure, and heal when `heal`.
    pub async fn reconcile(&self, event_id: u64, heal: bool) -> anyhow::Result<Option<Report>> {
        let Some(event) = catalog::load(&self.mysql, event_id).await? else {
            return Ok(None);
        };
        self.pass(&event, heal).await.map(Some)
    }

    /// [`Reconciler::reconcile`] of an event already loaded.
    async fn pass(&self, event: &EventRecord, heal: bool) -> anyhow::Result<Report> {
        let event_id = event.id;
        let mut actions = Vec::new();
        let mut loaded = self.preloader.is_loaded(event).await?;
        if heal
            && loaded
            && let Some(why) = self
                .preloader
                .behind(EventId(event_id), event.buckets)
                .await?
        {
            tracing::error!(
                event_id,
                why,
                "ALARM: the event's Redis state is behind MySQL (it went back in time); fencing it for a rebuild"
            );
            self.rewinds.inc();
            self.preloader
                .fence(EventId(event_id), event.buckets)
                .await?;
            actions.push(format!("Redis was behind MySQL ({why}): fenced"));
            loaded = false;
        }
        if heal && !loaded && event.status != EventStatus::Draft {
            match self.preloader.preload(event).await {
                Ok(r) => {
                    loaded = true;
                    if r.epoch > 0 {
                        actions.push(format!(
                            "rebuilt the event's Redis keys from MySQL (generation {})",
                            r.epoch
                        ));
                    }
                }
                Err(e) => actions.push(format!("could not rebuild the event's keys yet: {e}")),
            }
        }
        if heal
            && loaded
            && let Some(action) = self.mend_status(event).await?
        {
            actions.push(action);
        }
        let mut measured = None;
        if heal && loaded {
            let mut redis = self.redis.clone();
            let lock = Lock::acquire(
                &mut redis,
                self.keys.preload_lock(event_id),
                self.preloader.lock_ttl,
                LOCK_WAIT,
            )
            .await
            .context("Failed to take the preload lock")?;
            if let Some(lock) = lock {
                // Looked at again under the lock: a purge (retire.rs) may have removed
                // the keys meanwhile, and a heal on them would give back every
                // cancelled order again (the given-back sets are gone).
                let heal = async {
                    match self.preloader.is_loaded(event).await {
                        Ok(true) => self.heal_locked(event, &mut actions).await,
                        Ok(false) => Ok(None),
                        Err(e) => Err(e),
                    }
                };
                let healed = lock
                    .renewed_while(&self.redis, self.preloader.lock_ttl, "a heal", heal)
                    .await;
                lock.release(&mut redis).await?;
                measured = healed?;
            }
        }
        // A heal that changed nothing after its measurement hands it over: one
        // measurement a pass, not two, for every listed sale whose books balance.
        let balance = match measured {
            Some(balance) => balance,
            None => self.measure(event).await?,
        };
        for action in &actions {
            tracing::warn!(event_id, action, "reconciler healed a drift");
        }
        self.alarm_once(&balance);
        if !balance.settled() && balance.queued_reservations == 0 {
            tracing::info!(event_id, books = ?balance.categories, "books not balanced");
        }
        Ok(Report {
            event_id,
            actions,
            balance,
        })
    }

    /// The events a periodic pass looks at: those with a sale in Redis, and the
    /// published ones opening soon or open (whose keys Redis may have lost).
    pub async fn events(&self, window_s: u64) -> anyhow::Result<Vec<u64>> {
        Ok(self.listed(window_s).await?.ids)
    }

    /// [`Reconciler::events`], with which of them MySQL has published.
    async fn listed(&self, window_s: u64) -> anyhow::Result<Listed> {
        let mut ids: Vec<u64> = redis::cmd("HKEYS")
            .arg(self.keys.sales_index())
            .query_async(&mut self.redis.clone())
            .await?;
        let published = catalog::published_opening_within(&self.mysql, window_s).await?;
        ids.extend(&published);
        ids.sort_unstable();
        ids.dedup();
        Ok(Listed {
            ids,
            published: published.into_iter().collect(),
        })
    }

    /// A periodic pass over one event: heal, then retire the event if its sale is over
    /// and nothing is left to do (retire.rs).
    /// `published`: whether MySQL had the sale published when the round began.
    async fn pass_and_retire(
        &self,
        id: u64,
        published: bool,
        margin: chrono::TimeDelta,
    ) -> anyhow::Result<()> {
        // Taken before the pass: a change during it shows at the next.
        let now_ms = chrono::Utc::now().timestamp_millis();
        let before = match unchanged::fingerprint(&self.redis, &self.keys, id, now_ms).await {
            Ok(print) => print,
            Err(e) if Down::of(&e).is_some() => None,
            Err(e) => return Err(e),
        };
        // A fingerprint is read only for a sale Redis shows open: one MySQL no longer
        // has published is a close Redis never heard (its write failed, in any core),
        // which the full pass writes there (`mend_status`) and a skip would leave for
        // up to FULL_EVERY passes.
        if let Some(print) = &before
            && published
            && self.unchanged.skip(id, print)
        {
            self.passes.with_label_values(&["unchanged"]).inc();
            return Ok(());
        }
        self.unchanged.forget(id);
        let Some(event) = catalog::load(&self.mysql, id).await? else {
            return Ok(());
        };
        if not_yet_open(&event, chrono::Utc::now(), margin) {
            // Nothing can have been sold: no books to measure in MySQL (a published-ahead
            // sale cost every pass seven queries for nothing), only its keys to keep. Its
            // gauges go until it is measured again (a stats call may have set them).
            self.forget_gauges(&event);
            if !self.preloader.is_loaded(&event).await? {
                match self.preloader.preload(&event).await {
                    Ok(r) if r.epoch > 0 => tracing::warn!(
                        event_id = id,
                        epoch = r.epoch,
                        "rebuilt a sale's missing keys before its open"
                    ),
                    // Loaded meanwhile, or another core is loading it.
                    Ok(_) | Err(PreloadError::Busy(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            } else if let Some(action) = self.mend_status(&event).await? {
                // A reopen ahead of the open whose Redis write failed: the room's
                // early joiners would read "closed" until the open.
                tracing::warn!(event_id = id, action, "reconciler healed a drift");
            }
            return Ok(());
        }
        let report = self.pass(&event, true).await?;
        self.passes.with_label_values(&["full"]).inc();
        let b = &report.balance;
        if let Some(print) = before
            && report.actions.is_empty()
            && b.loaded
            && b.redis_unavailable.is_none()
            && b.queued_reservations == 0
            && !b.in_flight
            && b.settled()
        {
            self.unchanged.balanced(id, print);
        }
        if !self.retire_if_over(&event, &report).await? {
            self.list_if_selling(&event, &report).await?;
        }
        Ok(())
    }

    /// A published sale within its window, its keys loaded, missing from the sales
    /// index (a reopen that stopped between MySQL and Redis, or raced a retirement):
    /// its status and entry are written again, so edges and workers see it.
    async fn list_if_selling(&self, event: &EventRecord, report: &Report) -> anyhow::Result<()> {
        let now = chrono::Utc::now();
        if event.status != EventStatus::Published
            || now < event.sale_start
            || now >= event.sale_end
            || !report.balance.loaded
        {
            return Ok(());
        }
        let listed: bool = redis::cmd("HEXISTS")
            .arg(self.keys.sales_index())
            .arg(event.id)
            .query_async(&mut self.redis.clone())
            .await?;
        if !listed {
            tracing::warn!(
                event_id = event.id,
                "a sale on now was missing from the sales index; listed again"
            );
            self.preloader.set_sale_status(event).await?;
        }
        Ok(())
    }

    /// Which Redis the skipped sales' fingerprints are read from
    /// ([`unchanged::redis_identity`]); unread, every sale's next pass is full.
    async fn read_redis_identity(&self) -> anyhow::Result<()> {
        let identity =
            tokio::time::timeout(IDENTITY_TIMEOUT, unchanged::redis_identity(&self.redis))
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {IDENTITY_TIMEOUT:?}")));
        match identity {
            Ok(identity) => {
                self.unchanged.redis_is(Some(identity));
                Ok(())
            }
            Err(e) => {
                self.unchanged.redis_is(None);
                Err(e)
            }
        }
    }

    /// Every `interval`, a healing pass over [`Reconciler::events`], until `stop`.
    pub async fn run(self, interval: Duration, window_s: u64, mut stop: Shutdown) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let identity_warned = Throttle::new(IDENTITY_WARN_EVERY);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait() => return,
            }
            let limit = &self.preloader.call_timeout;
            let per_event = limit.for_pass();
            let margin = open_margin(interval);
            let listed = match limit
                .try_within("the events to reconcile", self.listed(window_s))
                .await
            {
                Ok(listed) => listed,
                Err(e) => {
                    tracing::warn!(error = format!("{e:#}"), "reconciler cannot list events");
                    continue;
                }
            };
            self.unchanged.keep(&listed.ids.iter().copied().collect());
            let read = self.read_redis_identity().await;
            report_identity(read, &identity_warned, std::time::Instant::now());
            for &id in &listed.ids {
                let pass = self.pass_and_retire(id, listed.published.contains(&id), margin);
                if let Err(e) = per_event.try_within("a reconcile pass", pass).await {
                    tracing::warn!(
                        event_id = id,
                        error = format!("{e:#}"),
                        "reconcile pass failed"
                    );
                }
            }
            // Again after the round: a Redis restarted during it may have let the
            // rest of the round skip sales on what it lost; their next pass is full.
            let read = self.read_redis_identity().await;
            report_identity(read, &identity_warned, std::time::Instant::now());
            if let Err(e) = self.purge_due().await {
                tracing::warn!(error = format!("{e:#}"), "purging retired sales failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unread_identity_warns_once_then_every_ten_minutes_and_again_after_a_read() {
        let t0 = std::time::Instant::now();
        let unread = || {
            Err(anyhow::anyhow!(
                "NOPERM this user has no permissions to run 'info'"
            ))
        };
        let warned = Throttle::new(IDENTITY_WARN_EVERY);
        assert!(report_identity(unread(), &warned, t0));
        // Twice a round, every round of a 10 s interval: silent for ten minutes.
        for s in (5..600).step_by(5) {
            assert!(!report_identity(
                unread(),
                &warned,
                t0 + Duration::from_secs(s)
            ));
        }
        assert!(report_identity(
            unread(),
            &warned,
            t0 + Duration::from_secs(600)
        ));
        assert!(!report_identity(
            Ok(()),
            &warned,
            t0 + Duration::from_secs(605)
        ));
        assert!(report_identity(
            unread(),
            &warned,
            t0 + Duration::from_secs(610)
        ));
    }

    #[test]
    fn only_a_published_sale_more_than_a_minute_from_its_open_is_not_yet_open() {
        let event = crate::admission::validate::tests::event(); // opens 2030-01-01 00:00
        let at = |s: &str| {
            chrono::DateTime::parse_from_rfc3339(s)
                .unwrap()
                .with_timezone(&chrono::Utc)
        };
        let minute = open_margin(Duration::from_secs(10));
        assert_eq!(minute, chrono::TimeDelta::seconds(60));
        assert!(not_yet_open(&event, at("2029-12-31T23:58:59Z"), minute));
        assert!(
            !not_yet_open(&event, at("2029-12-31T23:59:00Z"), minute),
            "within the margin"
        );
        assert!(
            !not_yet_open(&event, at("2030-01-01T06:00:00Z"), minute),
            "selling"
        );
        // Passes a minute apart: three of them before the open.
        let three = open_margin(Duration::from_secs(60));
        assert_eq!(three, chrono::TimeDelta::seconds(180));
        assert!(!not_yet_open(&event, at("2029-12-31T23:58:59Z"), three));
        for status in [EventStatus::Closed, EventStatus::Draft] {
            let other = EventRecord {
                status,
                ..event.clone()
            };
            assert!(
                !not_yet_open(&other, at("2029-01-01T00:00:00Z"), minute),
                "{status:?}"
            );
        }
    }
}
