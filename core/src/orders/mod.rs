//! Order creation (DESIGN.md "Order creation"): a 202 is a promise, and this keeps it.
//!
//! Workers read the events' reservation streams through one consumer group, in batches,
//! and take over entries a dead worker left pending. Per batch, one RocketMQ
//! transactional message on `stock-sync`; its local transaction creates the batch's
//! orders and stock_log rows in MySQL. Committed → the purchases become CREATED in Redis
//! and the entries are dropped, and one delayed `order-timeout` message goes out for the
//! batch. If the broker cannot take the half message, the orders are created all the
//! same and stock_log (the outbox) waits for the sweeper. If MySQL is down, the entries
//! stay in the stream and the worker retries with backoff.

pub mod mq;
pub mod persist;
pub mod redis;
pub mod reservation;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::redis::aio::ConnectionManager;
use mysql_async::Pool;
use tokio::sync::{OnceCell, watch};

use crate::app::stopped;
use crate::catalog::{EventCache, EventRecord};
use crate::config::OrderSettings;
use crate::keys::Keys;
use mq::{BatchMessage, LocalTx, Mq};
use persist::PersistError;
use reservation::{Batch, Reservation};

/// Everything the workers, the sweeper and the listeners share.
pub struct Pipeline {
    pub redis: ConnectionManager,
    pub mysql: Pool,
    pub keys: Keys,
    /// The same cache the admission path reads.
    pub events: Arc<EventCache>,
    pub shards: u32,
    pub settings: OrderSettings,
    /// Names this instance's consumers in the group.
    pub instance: String,
    /// Set once the RocketMQ clients have started; until then, outbox mode.
    pub mq: OnceCell<Arc<Mq>>,
    /// Why order creation is stuck, if it is (for readiness and stats).
    pub blocked: Mutex<Option<String>>,
    pub orders_created: prometheus::IntCounter,
    pub released: prometheus::IntCounter,
}

/// The longest a worker waits between retries of a batch MySQL did not take.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl Pipeline {
    pub fn blocked_reason(&self) -> Option<String> {
        self.blocked.lock().expect("not poisoned").clone()
    }

    fn set_blocked(&self, reason: Option<String>) {
        *self.blocked.lock().expect("not poisoned") = reason;
    }

    /// Every event that has a sale (open or not: a closed sale may still hold work).
    async fn events_with_sales(&self) -> anyhow::Result<Vec<u64>> {
        let ids: Vec<u64> = ::redis::cmd("HKEYS")
            .arg(self.keys.sales_index())
            .query_async(&mut self.redis.clone())
            .await?;
        Ok(ids)
    }

    /// One worker: until `stop`, reads batches from every event's stream and creates them.
    pub async fn run_worker(self: Arc<Self>, index: usize, mut stop: watch::Receiver<bool>) {
        let consumer = format!("{}-{index}", self.instance);
        let mut redis = self.redis.clone();
        let mut grouped: HashSet<u64> = HashSet::new();
        let mut events: Vec<u64> = Vec::new();
        let mut events_read = Instant::now() - Duration::from_secs(60);
        let mut claimed = Instant::now();
        let claim_idle = Duration::from_millis(self.settings.claim_idle_ms);
        loop {
            if *stop.borrow() {
                return;
            }
            if events_read.elapsed() > Duration::from_secs(1) {
                match self.events_with_sales().await {
                    Ok(ids) => events = ids,
                    Err(e) => tracing::warn!(
                        error = format!("{e:#}"),
                        "order worker cannot list the sales"
                    ),
                }
                events_read = Instant::now();
            }
            let claim_now = claimed.elapsed() > claim_idle / 2;
            if claim_now {
                claimed = Instant::now();
            }
            let mut busy = false;
            for &event_id in &events {
                if !grouped.contains(&event_id) {
                    match redis::ensure_group(&mut redis, &self.keys, event_id).await {
                        Ok(()) => {
                            grouped.insert(event_id);
                        }
                        Err(e) => {
                            tracing::warn!(event_id, error = %e, "cannot create the consumer group");
                            continue;
                        }
                    }
                }
                let mut entries = Vec::new();
                if claim_now {
                    match redis::claim_stale(
                        &mut redis,
                        &self.keys,
                        event_id,
                        &consumer,
                        claim_idle,
                        self.settings.batch_size,
                    )
                    .await
                    {
                        Ok(found) if !found.is_empty() => {
                            tracing::warn!(
                                event_id,
                                entries = found.len(),
                                "took over reservations a stopped worker left"
                            );
                            entries = found;
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!(event_id, error = %e, "XAUTOCLAIM failed"),
                    }
                }
                if entries.is_empty() {
                    match redis::read_new(
                        &mut redis,
                        &self.keys,
                        event_id,
                        &consumer,
                        self.settings.batch_size,
                    )
                    .await
                    {
                        Ok(found) => entries = found,
                        Err(e) if e.code() == Some("NOGROUP") => {
                            // The stream vanished (Redis lost its data): make it again.
                            grouped.remove(&event_id);
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(event_id, error = %e, "XREADGROUP failed");
                            continue;
                        }
                    }
                }
                if entries.is_empty() {
                    continue;
                }
                busy = true;
                self.process(event_id, &entries, &mut stop).await;
            }
            if !busy {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                    _ = stopped(&mut stop) => return,
                }
            }
        }
    }

    /// Creates one batch, retrying with backoff until it is done or the core stops (the
    /// entries then stay pending and another worker takes them over).
    async fn process(
        &self,
        event_id: u64,
        entries: &[::redis::streams::StreamId],
        stop: &mut watch::Receiver<bool>,
    ) {
        let mut redis = self.redis.clone();
        let mut reservations = Vec::with_capacity(entries.len());
        for entry in entries {
            match Reservation::from_entry(entry) {
                Ok(r) => reservations.push(r),
                Err(e) => {
                    // Never written by our script: nothing to create or give back.
                    tracing::error!(
                        event_id,
                        entry = entry.id,
                        error = format!("{e:#}"),
                        "dropping a malformed reservation"
                    );
                    let _ =
                        redis::drop_entries(&mut redis, &self.keys, event_id, &[&entry.id]).await;
                }
            }
        }
        let mut backoff = Duration::from_millis(100);
        while !reservations.is_empty() {
            reservations = self.expire_overdue(event_id, reservations).await;
            if reservations.is_empty() {
                return;
            }
            let outcome = match self.events.get(event_id).await {
                Ok(Some(event)) => self.create(&event, &reservations).await,
                Ok(None) => Err(PersistError::Rejected(format!(
                    "event {event_id} is not in MySQL"
                ))),
                Err(e) => Err(PersistError::NotCommitted(format!("{e:#}"))),
            };
            match outcome {
                Ok(()) => {
                    self.set_blocked(None);
                    return;
                }
                Err(PersistError::Stale(stale)) => {
                    reservations = self.drop_stale(event_id, reservations, &stale).await;
                    continue;
                }
                Err(PersistError::Rejected(why)) => {
                    tracing::warn!(
                        event_id,
                        why,
                        "MySQL refused a batch; creating its orders one by one"
                    );
                    reservations = self.create_one_by_one(event_id, reservations).await;
                    if reservations.is_empty() {
                        return;
                    }
                }
                Err(e) => {
                    self.set_blocked(Some(format!("order creation waits for MySQL: {e}")));
                    tracing::warn!(event_id, error = %e, retry_in_ms = backoff.as_millis() as u64, "batch not created; retrying");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stopped(stop) => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Drops the reservations numbered in `stale` (taken under an older generation of the
    /// event's keys, whose rebuild counted their units as free) and returns the others.
    async fn drop_stale(
        &self,
        event_id: u64,
        reservations: Vec<Reservation>,
        stale: &[u64],
    ) -> Vec<Reservation> {
        let (dropped, keep): (Vec<_>, Vec<_>) = reservations
            .into_iter()
            .partition(|r| stale.contains(&r.order_no));
        if !dropped.is_empty() {
            let ids: Vec<&str> = dropped.iter().map(|r| r.entry_id.as_str()).collect();
            if let Err(e) =
                redis::drop_entries(&mut self.redis.clone(), &self.keys, event_id, &ids).await
            {
                tracing::warn!(error = format!("{e:#}"), "cannot drop stale entries");
            }
            tracing::warn!(
                event_id,
                dropped = dropped.len(),
                "dropped reservations taken before the event's keys were rebuilt from MySQL"
            );
        }
        keep
    }

    /// Releases the reservations past `orders.deadline_s` whose orders do not exist, so
    /// that none is created silently late; returns the others. Needs MySQL to decide:
    /// while it is down, overdue reservations wait with the rest.
    async fn expire_overdue(
        &self,
        event_id: u64,
        reservations: Vec<Reservation>,
    ) -> Vec<Reservation> {
        let cutoff =
            chrono::Utc::now().timestamp_millis() - (self.settings.deadline_s * 1000) as i64;
        let (overdue, mut keep): (Vec<_>, Vec<_>) = reservations
            .into_iter()
            .partition(|r| r.admitted_ms < cutoff);
        let mut redis = self.redis.clone();
        let reason = format!("not persisted within {} s", self.settings.deadline_s);
        for r in overdue {
            match persist::expire(&self.mysql, self.shards, event_id, &r).await {
                Ok(persist::Expiry::Created) => keep.push(r),
                Ok(persist::Expiry::Stale) => {
                    let order_no = r.order_no;
                    self.drop_stale(event_id, vec![r], &[order_no]).await;
                }
                Ok(persist::Expiry::Expired) => {
                    match redis::release(&mut redis, &self.keys, event_id, &r, &reason).await {
                        Ok(_) => {
                            self.released.inc();
                            tracing::warn!(
                                order_no = r.order_no,
                                reason,
                                "reservation expired and released"
                            );
                        }
                        // Expired in MySQL already; a retry releases it (release is idempotent).
                        Err(e) => {
                            tracing::warn!(error = format!("{e:#}"), "release failed; will retry");
                            keep.push(r);
                        }
                    }
                }
                Err(_) => keep.push(r),
            }
        }
        keep
    }

    /// One batch: its transactional message and local transaction, then settle in Redis.
    async fn create(
        &self,
        event: &Arc<EventRecord>,
        reservations: &[Reservation],
    ) -> Result<(), PersistError> {
        let first = reservations[0].order_no;
        let batch = Arc::new(Batch {
            event_id: event.id,
            batch_id: format!("{first}-{}", rand::random::<u32>()),
            reservations: reservations.to_vec(),
        });
        let message = BatchMessage {
            batch_id: batch.batch_id.clone(),
            event_id: event.id,
        };
        let local = {
            let (pool, shards, event, batch) = (
                self.mysql.clone(),
                self.shards,
                event.clone(),
                batch.clone(),
            );
            move || {
                let (pool, event, batch) = (pool.clone(), event.clone(), batch.clone());
                async move { persist::create_orders(&pool, shards, &event, &batch).await }
            }
        };
        let mq = self.mq.get().cloned();
        let outcome = match &mq {
            Some(mq) => {
                let job = LocalTx::new(local());
                match mq.send_in_transaction(message.clone(), job.clone()).await {
                    Ok(()) => job.take_outcome().unwrap_or_else(|| {
                        Err(PersistError::NotCommitted(
                            "no local transaction ran".into(),
                        ))
                    }),
                    Err(e) => match job.take_outcome() {
                        // The local transaction ran; the broker's check-back settles the message.
                        Some(outcome) => outcome,
                        None => {
                            tracing::warn!(
                                error = format!("{e:#}"),
                                batch = batch.batch_id,
                                "broker did not take the half message; creating orders through the outbox"
                            );
                            local().await
                        }
                    },
                }
            }
            None => local().await,
        };
        outcome?;
        self.orders_created.inc_by(reservations.len() as u64);
        let mut redis = self.redis.clone();
        if let Err(e) = redis::settle(&mut redis, &self.keys, event.id, reservations).await {
            // The orders exist; the entries stay pending and a replay settles them.
            tracing::warn!(
                error = format!("{e:#}"),
                "orders created but not settled in Redis; will replay"
            );
            return Ok(());
        }
        if let Some(mq) = mq {
            let delay = Duration::from_secs(u64::from(event.pay_timeout_s));
            if let Err(e) = mq.publish_timeout(&message, delay).await {
                tracing::warn!(
                    batch = batch.batch_id,
                    error = format!("{e:#}"),
                    "order-timeout message not sent; the lifecycle sweeper covers it"
                );
            }
        }
        Ok(())
    }

    /// After MySQL refused a batch: each order alone; the refused ones are released.
    /// Returns the reservations still to retry (MySQL unavailable meanwhile).
    async fn create_one_by_one(
        &self,
        event_id: u64,
        reservations: Vec<Reservation>,
    ) -> Vec<Reservation> {
        let mut retry = Vec::new();
        let event = match self.events.get(event_id).await {
            Ok(Some(event)) => Some(event),
            _ => None,
        };
        let mut redis = self.redis.clone();
        for r in reservations {
            let outcome = match &event {
                Some(event) => self.create(event, std::slice::from_ref(&r)).await,
                None => Err(PersistError::Rejected(format!(
                    "event {event_id} is not in MySQL"
                ))),
            };
            match outcome {
                Ok(()) => {}
                Err(PersistError::Stale(stale)) => {
                    retry.extend(self.drop_stale(event_id, vec![r], &stale).await);
                }
                Err(PersistError::Rejected(why)) => {
                    tracing::error!(
                        order_no = r.order_no,
                        why,
                        "order refused by MySQL; releasing its reservation"
                    );
                    match redis::release(
                        &mut redis,
                        &self.keys,
                        event_id,
                        &r,
                        "the order could not be created",
                    )
                    .await
                    {
                        Ok(_) => self.released.inc(),
                        Err(e) => {
                            tracing::warn!(error = format!("{e:#}"), "release failed; will retry");
                            retry.push(r);
                        }
                    }
                }
                Err(_) => retry.push(r),
            }
        }
        retry
    }

    /// Starts the RocketMQ clients, retrying every few seconds until they start or `stop`;
    /// until then the workers create orders through the outbox.
    pub async fn start_mq(
        self: Arc<Self>,
        settings: mq::MqSettings,
        mut stop: watch::Receiver<bool>,
    ) {
        let settings = Arc::new(settings);
        loop {
            let (pool, shards) = (self.mysql.clone(), self.shards);
            let check_pool = pool.clone();
            let s = mq::MqSettings {
                namesrv: settings.namesrv.clone(),
                names: settings.names.clone(),
                checkback_grace: settings.checkback_grace,
                inject_unknown: settings.inject_unknown,
                send_threads: settings.send_threads,
                checkbacks: settings.checkbacks.clone(),
            };
            let started = Mq::start(
                s,
                move |batch_id| {
                    let pool = check_pool.clone();
                    Box::pin(async move { persist::batch_committed(&pool, &batch_id).await })
                },
                {
                    let pool = pool.clone();
                    move |message: BatchMessage| {
                        let pool = pool.clone();
                        Box::pin(async move {
                            let synced =
                                crate::stock_sync::apply(&pool, shards, &message.batch_id).await?;
                            tracing::debug!(batch = message.batch_id, ?synced, "stock synced");
                            Ok(())
                        })
                    }
                },
                {
                    let (redis, keys) = (self.redis.clone(), self.keys.clone());
                    move |message: BatchMessage| {
                        let (pool, mut redis, keys) = (pool.clone(), redis.clone(), keys.clone());
                        Box::pin(async move {
                            let n = crate::lifecycle::expire_batch(
                                &pool,
                                &mut redis,
                                &keys,
                                shards,
                                &message.batch_id,
                            )
                            .await?;
                            tracing::debug!(
                                batch = message.batch_id,
                                cancelled = n,
                                "order timeout applied"
                            );
                            Ok(())
                        })
                    }
                },
            )
            .await;
            match started {
                Ok(mq) => {
                    let _ = self.mq.set(Arc::new(mq));
                    tracing::info!("RocketMQ clients started");
                    return;
                }
                Err(e) => tracing::warn!(
                    error = format!("{e:#}"),
                    "RocketMQ clients not started; orders go through the outbox meanwhile"
                ),
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = stopped(&mut stop) => return,
            }
        }
    }

    /// Cancels UNPAID orders well past their deadline: their timeout message was lost.
    async fn cancel_overdue(&self) {
        const OVERDUE_S: u64 = 30;
        let orders = match crate::lifecycle::overdue(&self.mysql, self.shards, OVERDUE_S, 200).await
        {
            Ok(orders) => orders,
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "overdue-order sweep failed");
                return;
            }
        };
        let mut redis = self.redis.clone();
        for order_no in orders {
            tracing::warn!(
                order_no,
                "cancelling an order whose timeout message never came"
            );
            if let Err(e) = crate::lifecycle::cancel(
                &self.mysql,
                &mut redis,
                &self.keys,
                self.shards,
                order_no,
                None,
                true,
            )
            .await
            {
                tracing::warn!(
                    order_no,
                    error = format!("{e:#}"),
                    "overdue cancellation failed"
                );
            }
        }
    }

    /// Until `stop`: re-publishes batches whose stock_log rows stay unsynced.
    pub async fn run_sweeper(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopped(&mut stop) => return,
            }
            self.cancel_overdue().await;
            let Some(mq) = self.mq.get() else { continue };
            match crate::stock_sync::stale_batches(&self.mysql, self.settings.sweep_after_s, 500)
                .await
            {
                Ok(batches) => {
                    for (batch_id, event_id) in batches {
                        let message = BatchMessage { batch_id, event_id };
                        if let Err(e) = mq.publish_sync(&message).await {
                            tracing::warn!(
                                error = format!("{e:#}"),
                                "outbox: broker still unavailable"
                            );
                            break;
                        }
                        tracing::info!(
                            batch = message.batch_id,
                            "outbox: re-published an unsynced batch"
                        );
                    }
                }
                Err(e) => tracing::warn!(error = format!("{e:#}"), "outbox sweep failed"),
            }
        }
    }
}
