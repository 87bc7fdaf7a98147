//! One order worker's loop: find the events with a sale, read or take over their
//! stream entries, and hand each batch to `create`, retrying until it is done.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::BackoffBuilder;

use super::Pipeline;
use super::persist::PersistError;
use super::redis::{self, Dropped};
use super::reservation::Reservation;
use crate::domain::EventId;
use crate::infra::backoff;
use crate::keys::Bucket;
use crate::shutdown::Shutdown;

/// The longest a worker waits between retries of a batch MySQL (or Redis) did not take,
/// before the jitter (up to as much again): a worker notices the part is back within
/// 2 s (was 5 s: chaos `redis-kill` settled up to 5 s after the core's connection was
/// back). One attempt per worker every 1–2 s is nothing to a MySQL that is down (and
/// every third one refused for the server's own reasons, a few single-order attempts:
/// `create_one_by_one` stops when its first handful are neither created nor refused).
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A batch MySQL refuses this many times in a row for reasons of its own (not the
/// rows') is tried order by order: the cause may touch only some of its orders.
const SPLIT_AFTER_REFUSALS: u32 = 3;

impl Pipeline {
    /// Every bucket of every event that has a sale (open or not: a closed sale may
    /// still hold work); each bucket has its stream.
    async fn events_with_sales(&self) -> anyhow::Result<Vec<Bucket>> {
        let ids: Vec<u64> = ::redis::cmd("HKEYS")
            .arg(self.keys.sales_index())
            .query_async(&mut self.redis.clone())
            .await?;
        let mut buckets = Vec::new();
        for id in ids {
            let count = match self.events.shape(id).await? {
                Some(shape) => shape.buckets,
                None => 1,
            };
            buckets.extend(Bucket::all(EventId(id), count));
        }
        Ok(buckets)
    }

    /// One worker: until `stop`, reads batches from every event's stream and creates them.
    pub async fn run_worker(self: Arc<Self>, index: usize, mut stop: Shutdown) {
        let consumer = format!("{}-{index}", self.instance);
        let mut redis = self.redis.clone();
        let mut grouped: HashSet<Bucket> = HashSet::new();
        let mut events: Vec<Bucket> = Vec::new();
        let mut events_read = Instant::now() - Duration::from_secs(60);
        let claim_idle = Duration::from_millis(self.settings.claim_idle_ms);
        // This consumer's own unacknowledged entries are read first at start and after
        // any Redis error (Redis restarted: its AOF brings them back as pending).
        let mut own_pending = true;
        loop {
            if stop.requested() {
                return;
            }
            // Kept for a later pass when this one cannot look (no sales listed yet).
            let check_own = !events.is_empty() && std::mem::take(&mut own_pending);
            if events_read.elapsed() > Duration::from_secs(1) {
                match self.events_with_sales().await {
                    Ok(ids) => {
                        // A retired sale's streams are read no more: forget them.
                        let listed: HashSet<Bucket> = ids.iter().copied().collect();
                        grouped.retain(|b| listed.contains(b));
                        self.idle.keep(&listed);
                        self.claims.keep(&listed);
                        events = ids;
                    }
                    Err(e) => tracing::warn!(
                        error = format!("{e:#}"),
                        "order worker cannot list the sales"
                    ),
                }
                events_read = Instant::now();
            }
            let mut busy = false;
            for &bucket in &events {
                if !grouped.contains(&bucket) {
                    match redis::ensure_group(&mut redis, &self.keys, bucket).await {
                        Ok(()) => {
                            grouped.insert(bucket);
                        }
                        Err(e) => {
                            tracing::warn!(event_id = %bucket.event, error = %e, "cannot create the consumer group");
                            own_pending = true;
                            continue;
                        }
                    }
                }
                let mut entries = Vec::new();
                // Read with `>`: never delivered before (see `Batch::first_delivery`).
                let mut first_delivery = false;
                if check_own {
                    match redis::read(
                        &mut redis,
                        &self.keys,
                        bucket,
                        &consumer,
                        self.settings.batch_size,
                        redis::Entries::OwnPending,
                    )
                    .await
                    {
                        Ok(found) if !found.is_empty() => {
                            tracing::warn!(
                                event_id = %bucket.event,
                                entries = found.len(),
                                "resuming reservations this worker had not finished"
                            );
                            // A full batch may not be all: look again next pass.
                            own_pending |= found.len() >= self.settings.batch_size;
                            entries = found;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            own_pending = true;
                            if e.code() != Some("NOGROUP") {
                                tracing::warn!(event_id = %bucket.event, error = %e, "reading this worker's pending entries failed");
                            }
                        }
                    }
                }
                if entries.is_empty() && self.claims.due(bucket, claim_idle / 2, Instant::now()) {
                    match redis::claim_stale(
                        &mut redis,
                        &self.keys,
                        bucket,
                        &consumer,
                        claim_idle,
                        self.settings.batch_size,
                    )
                    .await
                    {
                        Ok(found) if !found.entries.is_empty() => {
                            if found.entries.len() >= self.settings.batch_size {
                                self.claims.again(bucket);
                            }
                            if found.others > 0 {
                                tracing::warn!(
                                    event_id = %bucket.event,
                                    entries = found.others,
                                    "took over reservations a stopped worker left"
                                );
                                self.taken_over.inc_by(found.others);
                            }
                            let own = found.entries.len() as u64 - found.others;
                            if own > 0 {
                                tracing::warn!(
                                    event_id = %bucket.event,
                                    entries = own,
                                    "resuming reservations this worker had left idle"
                                );
                            }
                            entries = found.entries;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(event_id = %bucket.event, error = %e, "claiming idle entries failed");
                            own_pending = true;
                        }
                    }
                }
                // `batches_per_stream` batches of new reservations per bucket at a time
                // in this core (held until the batch is created, or TURN_LAPSE).
                let turn = if entries.is_empty() && self.idle.due(bucket, Instant::now()) {
                    let at_once = self.settings.batches_per_stream;
                    self.reading.take(bucket, at_once, Instant::now())
                } else {
                    None
                };
                if turn.is_some() {
                    let started = Instant::now();
                    match redis::read(
                        &mut redis,
                        &self.keys,
                        bucket,
                        &consumer,
                        self.settings.batch_size,
                        redis::Entries::New,
                    )
                    .await
                    {
                        Ok(found) => {
                            self.idle
                                .read(bucket, !found.is_empty(), started, Instant::now());
                            first_delivery = true;
                            entries = found;
                        }
                        Err(e) if e.code() == Some("NOGROUP") => {
                            // The stream vanished (Redis lost its data): make it again.
                            grouped.remove(&bucket);
                            own_pending = true;
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(event_id = %bucket.event, error = %e, "XREADGROUP failed");
                            own_pending = true;
                            continue;
                        }
                    }
                }
                if entries.is_empty() {
                    continue;
                }
                busy = true;
                self.process(bucket, &consumer, &entries, first_delivery, &mut stop)
                    .await;
            }
            if !busy {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                    _ = stop.wait() => return,
                }
            }
        }
    }

    /// Creates one batch (`create_batch`), keeping its entries `consumer`'s meanwhile:
    /// every third of `orders.claim_idle_ms` their idle time is reset, so only a worker
    /// that stopped, or whose core hangs, leaves them to be taken over — not one whose
    /// batch takes long (MySQL slow or down, orders created one by one). Not once every
    /// entry of the batch is older than `orders.deadline_s`: a batch stuck that long (a
    /// MySQL call that never returns) is left to be taken over, and the worker that
    /// takes it gives back what is overdue (`expire_overdue`) rather than create any.
    async fn process(
        &self,
        bucket: Bucket,
        consumer: &str,
        entries: &[::redis::streams::StreamId],
        first_delivery: bool,
        stop: &mut Shutdown,
    ) {
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        let every = Duration::from_millis(self.settings.claim_idle_ms) / 3;
        // An entry id is "<ms>-<seq>": the newest entry's time of admission (Redis's clock).
        let newest_ms = ids
            .iter()
            .filter_map(|id| id.split_once('-')?.0.parse::<i64>().ok())
            .max();
        let deadline_ms = (self.settings.deadline_s * 1000) as i64;
        // One pass every third of claim_idle_ms, each within that third, each going on
        // from the run the last one stopped at (a pass cut short by a slow Redis leaves
        // no run never kept).
        let runs = redis::keep_claimed_runs(&ids);
        let keep_claimed = async {
            let mut redis = self.redis.clone();
            let mut next = 0;
            loop {
                tokio::time::sleep(every).await;
                let now_ms = chrono::Utc::now().timestamp_millis();
                if newest_ms.is_some_and(|t| now_ms - t > deadline_ms) {
                    tracing::warn!(event_id = %bucket.event, entries = ids.len(), "a batch past orders.deadline_s is still being created; its entries are no longer kept claimed");
                    break;
                }
                let pass_ends = tokio::time::Instant::now() + every;
                let (mut kept, mut done) = (0, 0);
                while done < runs.len() {
                    let run = &runs[next];
                    let call = redis::keep_claimed(&mut redis, &self.keys, bucket, consumer, run);
                    match tokio::time::timeout_at(pass_ends, call).await {
                        Ok(Ok(redis::Kept(n))) => {
                            kept += n;
                            done += 1;
                            next = (next + 1) % runs.len();
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(event_id = %bucket.event, error = %e, "cannot keep a batch's reservations claimed");
                            break;
                        }
                        Err(_) => {
                            tracing::warn!(event_id = %bucket.event, "keeping a batch's reservations claimed timed out");
                            break;
                        }
                    }
                }
                if done == runs.len() && kept == 0 {
                    break; // none left of this consumer's
                }
            }
            // Nothing more to keep: the batch goes on without it.
            std::future::pending::<()>().await;
        };
        tokio::select! {
            biased;
            () = self.create_batch(bucket, entries, first_delivery, stop) => {}
            () = keep_claimed => {}
        }
    }

    /// Creates one batch, retrying with backoff until it is done or the core stops (the
    /// entries then stay pending and another worker takes them over). `first_delivery`:
    /// the entries were read with `>` (see `Batch::first_delivery`); true for the first
    /// attempt only.
    async fn create_batch(
        &self,
        bucket: Bucket,
        entries: &[::redis::streams::StreamId],
        mut first_delivery: bool,
        stop: &mut Shutdown,
    ) {
        let mut redis = self.redis.clone();
        let mut reservations = Vec::with_capacity(entries.len());
        for entry in entries {
            match Reservation::from_entry(entry) {
                Ok(r) => reservations.push(r),
                Err(e) => {
                    // Never written by our script: nothing to create or give back.
                    tracing::error!(
                        event_id = %bucket.event,
                        entry = entry.id,
                        error = format!("{e:#}"),
                        "dropping a malformed reservation"
                    );
                    let _ = redis::drop_entries(&mut redis, &self.keys, bucket, &[&entry.id]).await;
                }
            }
        }
        // With jitter: the workers of a core (and of other cores) do not retry in step.
        let mut backoff = backoff(Duration::from_millis(100), MAX_BACKOFF)
            .with_jitter()
            .build();
        let mut delay = backoff.next().unwrap_or(MAX_BACKOFF);
        let mut refused_in_a_row = 0;
        // When every reservation left was past orders.deadline_s and still here: MySQL
        // neither created them nor could tell they have no order (down, or refusing
        // for reasons of its own). After claim_idle_ms more they are left pending, for
        // a worker to take over later, so that they do not hold this worker — and, taken
        // over one after another, every worker — from every other sale meanwhile.
        let mut all_overdue_since: Option<Instant> = None;
        let claim_idle = Duration::from_millis(self.settings.claim_idle_ms);
        while !reservations.is_empty() {
            let overdue;
            (reservations, overdue) = self.expire_overdue(bucket, reservations).await;
            if reservations.is_empty() {
                return;
            }
            if overdue.all {
                // (Not while any has its order created: it is to be settled, which the
                // attempts below do, order by order if the batch keeps being refused.)
                let since = *all_overdue_since.get_or_insert_with(Instant::now);
                if since.elapsed() > claim_idle && overdue.created == 0 {
                    tracing::warn!(
                        event_id = %bucket.event,
                        reservations = reservations.len(),
                        "reservations past orders.deadline_s that MySQL can neither create nor release; left pending for later"
                    );
                    return;
                }
            }
            let event = self.events.get(bucket.event.0).await;
            let outcome = match &event {
                Ok(Some(event)) => {
                    self.create(
                        event,
                        bucket,
                        &reservations,
                        std::mem::take(&mut first_delivery),
                    )
                    .await
                }
                Ok(None) => Err(PersistError::Rejected(format!(
                    "event {} is not in MySQL",
                    bucket.event
                ))),
                Err(e) => Err(PersistError::NotCommitted(format!("{e:#}"))),
            };
            let event = event.ok().flatten();
            match outcome {
                Ok(()) => {
                    self.set_blocked(None);
                    return;
                }
                Err(PersistError::Stale(stale)) => {
                    let dropped;
                    (reservations, dropped) = self.drop_stale(bucket, reservations, &stale).await;
                    if dropped == Dropped::Dropped {
                        continue;
                    }
                    // The rebuild is not in Redis yet: wait for it below.
                }
                Err(PersistError::Rewound(seq)) => {
                    // The rebuild makes these stale; the next attempt drops them.
                    self.fence(bucket, seq).await;
                }
                Err(PersistError::Rejected(why)) => {
                    tracing::warn!(
                        event_id = %bucket.event,
                        why,
                        "MySQL refused a batch; creating its orders one by one"
                    );
                    reservations = self
                        .create_one_by_one(bucket, event.as_ref(), reservations)
                        .await;
                    if reservations.is_empty() {
                        return;
                    }
                }
                Err(PersistError::ServerRefused(why))
                    if reservations.len() > 1 && refused_in_a_row + 1 >= SPLIT_AFTER_REFUSALS =>
                {
                    // The same cause may not touch every order (one shard's table): those
                    // it does not are created, the others stay for the next attempts.
                    // Order by order, nothing is released for a refusal of the server's.
                    refused_in_a_row = 0;
                    self.set_blocked(Some(format!("order creation waits for MySQL: {why}")));
                    tracing::warn!(
                        event_id = %bucket.event,
                        why,
                        "MySQL refused a batch for reasons of its own again; creating its orders one by one"
                    );
                    reservations = self
                        .create_one_by_one(bucket, event.as_ref(), reservations)
                        .await;
                    if reservations.is_empty() {
                        self.set_blocked(None);
                        return;
                    }
                }
                Err(e) => {
                    if matches!(e, PersistError::ServerRefused(_)) {
                        refused_in_a_row += 1;
                    } else {
                        refused_in_a_row = 0;
                    }
                    self.set_blocked(Some(format!("order creation waits for MySQL: {e}")));
                    tracing::warn!(event_id = %bucket.event, error = %e, retry_in_ms = delay.as_millis() as u64, "batch not created; retrying");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.wait() => return,
            }
            delay = backoff.next().unwrap_or(MAX_BACKOFF);
        }
    }
}
