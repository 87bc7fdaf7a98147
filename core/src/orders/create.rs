//! One batch's creation: its transactional message and local transaction, then settle
//! in Redis; and what happens to reservations that will not become orders (too late,
//! from before a rebuild of the event's keys, refused by MySQL).

use std::sync::Arc;
use std::time::Duration;

use super::Pipeline;
use super::guards::Declined;
use super::persist::{self, Created, PersistError};
use super::redis::{self, Dropped};
use super::reservation::{Batch, Reservation};
use super::tx::LocalTx;
use crate::catalog::EventRecord;
use crate::domain::OrderNo;
use crate::keys::Bucket;
use crate::messaging::BatchMessage;

/// A pass of [`Pipeline::create_one_by_one`] stops after its first this many orders were
/// neither created nor refused for their rows (a server refusing everything); once one
/// was, it goes through the batch (a cause that touches only some orders).
const ONE_BY_ONE_GIVE_UP: usize = 5;

/// The overdue reservations [`Pipeline::expire_overdue`] kept.
pub(super) struct OverdueKept {
    /// Every reservation kept is overdue (and there is one).
    pub all: bool,
    /// How many of them have their orders created (to be settled).
    pub created: usize,
}

/// What a buyer whose reservation a rebuild of the event's keys dropped is told.
const STALE_REASON: &str = "the sale was reloaded and this purchase not kept; try again";

impl Pipeline {
    /// Drops the reservations numbered in `stale` (taken under an older generation of the
    /// event's keys, whose rebuild counted their units as free) once the rebuild is in
    /// Redis, and returns the others, with the stale ones too while it is not yet.
    pub(super) async fn drop_stale(
        &self,
        bucket: Bucket,
        reservations: Vec<Reservation>,
        stale: &[OrderNo],
    ) -> (Vec<Reservation>, Dropped) {
        let (dropped, mut keep): (Vec<_>, Vec<_>) = reservations
            .into_iter()
            .partition(|r| stale.contains(&r.order_no));
        if dropped.is_empty() {
            return (keep, Dropped::Dropped);
        }
        let outcome = redis::drop_stale(
            &mut self.redis.clone(),
            &self.keys,
            bucket,
            &dropped,
            STALE_REASON,
        )
        .await;
        match outcome {
            Ok(Dropped::Dropped) => {
                tracing::warn!(
                    event_id = %bucket.event,
                    dropped = dropped.len(),
                    "dropped reservations taken before the event's keys were rebuilt from MySQL"
                );
                (keep, Dropped::Dropped)
            }
            Ok(Dropped::NotYet) => {
                keep.extend(dropped);
                (keep, Dropped::NotYet)
            }
            Err(e) => {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "cannot drop stale entries; will retry"
                );
                keep.extend(dropped);
                (keep, Dropped::NotYet)
            }
        }
    }

    /// Releases the reservations past `orders.deadline_s` whose orders do not exist, so
    /// that none is created silently late; returns the others, and what became of the
    /// overdue ones among them. Needs MySQL to decide: while it is down, overdue
    /// reservations wait with the rest.
    pub(super) async fn expire_overdue(
        &self,
        bucket: Bucket,
        reservations: Vec<Reservation>,
    ) -> (Vec<Reservation>, OverdueKept) {
        let cutoff =
            chrono::Utc::now().timestamp_millis() - (self.settings.deadline_s * 1000) as i64;
        let (overdue, mut keep): (Vec<_>, Vec<_>) = reservations
            .into_iter()
            .partition(|r| r.admitted_ms < cutoff);
        let reason = format!("not persisted within {} s", self.settings.deadline_s);
        let on_time = keep.len();
        let mut left = overdue.into_iter();
        let mut created = 0;
        for r in left.by_ref() {
            // As a batch's: read just before the expiry's transaction reads what MySQL
            // has left (a refusal found there caps the stock with it).
            let restocks = self.restocks(bucket).await;
            let expiry = persist::expire(&self.mysql, self.shards, bucket.event, &r);
            match self.call_timeout.within("an expiry", expiry).await {
                Ok(Ok(persist::Expiry::Created)) => {
                    created += 1;
                    keep.push(r);
                }
                Ok(Ok(persist::Expiry::Stale)) => {
                    let order_no = r.order_no;
                    keep.extend(self.drop_stale(bucket, vec![r], &[order_no]).await.0);
                }
                Ok(Ok(persist::Expiry::Refused(why, room))) => {
                    let cap = room
                        .zip(restocks)
                        .map(|(units, restocks)| redis::Cap { units, restocks });
                    if !self.refuse(bucket, &r, why, cap).await {
                        keep.push(r);
                    }
                }
                Ok(Ok(persist::Expiry::Expired)) => {
                    // Expired in MySQL already; a retry releases it (release is idempotent).
                    if !self.release(bucket, &r, &reason).await {
                        keep.push(r);
                    }
                }
                Ok(Err(_)) => keep.push(r),
                Err(_) => {
                    // MySQL hangs: the rest would wait a call timeout each. This one
                    // goes last, so the next pass starts with the others.
                    keep.extend(left);
                    keep.push(r);
                    break;
                }
            }
        }
        let kept = OverdueKept {
            all: on_time == 0 && !keep.is_empty(),
            created,
        };
        (keep, kept)
    }

    /// Gives the reservation back in Redis with `reason`; false if Redis did not answer.
    async fn release(&self, bucket: Bucket, r: &Reservation, reason: &str) -> bool {
        match redis::release(&mut self.redis.clone(), &self.keys, bucket, r, reason).await {
            Ok(_) => {
                self.released.inc();
                tracing::warn!(order_no = %r.order_no, reason, "reservation released");
                true
            }
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "release failed; will retry");
                false
            }
        }
    }

    /// One batch: its transactional message and local transaction, then settle in Redis.
    /// `first_delivery`: see [`Batch::first_delivery`].
    pub(super) async fn create(
        &self,
        event: &Arc<EventRecord>,
        bucket: Bucket,
        reservations: &[Reservation],
        first_delivery: bool,
    ) -> Result<(), PersistError> {
        let event_id = bucket.event;
        let first = reservations[0].order_no;
        let batch = Arc::new(Batch {
            event_id,
            batch_id: format!("{first}-{}", rand::random::<u32>()),
            reservations: reservations.to_vec(),
            first_delivery,
        });
        let message = BatchMessage {
            batch_id: batch.batch_id.clone(),
            event_id: event.id,
            orders: Vec::new(),
        };
        // Read before the transaction reads what MySQL has left: a sold-out refusal's cap
        // applies only if no unit came into the bucket since (a cancelled order given
        // back, a move credited: not in the cap). Unread, no refusal caps.
        let restocks = self.restocks(bucket).await;
        let local = {
            let (pool, shards, event, batch, limit) = (
                self.mysql.clone(),
                self.shards,
                event.clone(),
                batch.clone(),
                self.call_timeout.clone(),
            );
            move || {
                let (pool, event, batch, limit) =
                    (pool.clone(), event.clone(), batch.clone(), limit.clone());
                async move { persist::create_orders(&pool, shards, &event, &batch, &limit).await }
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
        let created = outcome?;
        let turned_away = |r: &Reservation| {
            created.expired.contains(&r.order_no)
                || created.declined.iter().any(|(no, _)| *no == r.order_no)
        };
        let (refused, made): (Vec<Reservation>, Vec<Reservation>) =
            reservations.iter().cloned().partition(turned_away);
        self.turn_away(bucket, &created, &refused, restocks).await;
        // Counted when committed, once: a replay (a settle in Redis that failed) finds
        // its orders there and inserts none.
        self.orders_created.inc_by(created.inserted as u64);
        if made.is_empty() {
            return Ok(());
        }
        let mut redis = self.redis.clone();
        let settle = redis::settle(&mut redis, &self.keys, bucket, &made).await;
        if let Some(e) = &settle.failed {
            // The orders exist; the entries not settled stay pending and a replay settles
            // them (and sends their order-timeout message). Those settled before the
            // failure get theirs now: a replay never reads them again.
            tracing::warn!(
                error = format!("{e:#}"),
                settled = settle.settled,
                of = made.len(),
                "orders created but not all settled in Redis; will replay the rest"
            );
        }
        let made = &made[..settle.settled];
        if made.is_empty() {
            return Ok(());
        }
        if let Some(mq) = mq {
            let delay = Duration::from_secs(u64::from(event.pay_timeout_s));
            let timeout = BatchMessage {
                orders: made.iter().map(|r| r.order_no.0).collect(),
                ..message
            };
            if let Err(e) = mq.publish_timeout(&timeout, delay).await {
                tracing::warn!(
                    batch = batch.batch_id,
                    error = format!("{e:#}"),
                    "order-timeout message not sent; the lifecycle sweeper covers it"
                );
            }
        }
        Ok(())
    }

    /// [`redis::restocks`] for a refusal's cap, read before a transaction reads what
    /// MySQL has left; None (no refusal then lowers the stock) when Redis did not answer.
    async fn restocks(&self, bucket: Bucket) -> Option<u64> {
        redis::restocks(&mut self.redis.clone(), &self.keys, bucket)
            .await
            .inspect_err(|e| {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "units given into the bucket not counted; a refusal now will not lower the stock"
                );
            })
            .ok()
    }

    /// The reservations of a committed batch that did not become orders: those MySQL turned
    /// away are refused in Redis (FAILED, no units given back, the stock capped at what
    /// MySQL has left when sold out — refused by this attempt or an earlier one — unless
    /// units came into the bucket after `restocks` was read), those expired before are
    /// given back. A failure here leaves the entry pending; the replay decides the same
    /// way.
    async fn turn_away(
        &self,
        bucket: Bucket,
        created: &Created,
        refused: &[Reservation],
        restocks: Option<u64>,
    ) {
        for r in refused {
            match created.declined.iter().find(|(no, _)| *no == r.order_no) {
                Some(&(_, why)) => {
                    self.refused.inc();
                    let cap = (why == Declined::SoldOut)
                        .then(|| created.room.get(&r.category_id.0).copied())
                        .flatten()
                        .zip(restocks)
                        .map(|(units, restocks)| redis::Cap { units, restocks });
                    self.refuse(bucket, r, why, cap).await;
                }
                None => {
                    let reason = format!("not persisted within {} s", self.settings.deadline_s);
                    self.release(bucket, r, &reason).await;
                }
            }
        }
    }

    /// Refuses a reservation MySQL turned away in Redis (refuse.lua); false when Redis
    /// did not take it (the entry stays pending, and a replay decides the same way).
    /// Over the limit, or refused before for a reason not known, the buyer's share in
    /// Redis stays (it may have been behind on what they hold).
    async fn refuse(
        &self,
        bucket: Bucket,
        r: &Reservation,
        why: Declined,
        cap: Option<redis::Cap>,
    ) -> bool {
        let keep_share = matches!(why, Declined::OverLimit | Declined::Before);
        let refused = redis::refuse(
            &mut self.redis.clone(),
            &self.keys,
            bucket,
            r,
            why.reason(),
            cap,
            keep_share,
        )
        .await;
        if let Err(e) = &refused {
            tracing::warn!(order_no = %r.order_no, error = format!("{e:#}"), "refusal not recorded in Redis; will replay");
        }
        refused.is_ok()
    }

    /// Redis went back in time: fences the event for a rebuild from MySQL (whose new
    /// epoch makes the reservations queued meanwhile stale).
    pub(super) async fn fence(&self, bucket: Bucket, seq: u64) {
        tracing::error!(
            event_id = %bucket.event,
            seq,
            "ALARM: Redis handed out an admission number an order has already: it went back in time; fencing the event for a rebuild from MySQL"
        );
        self.rewinds.inc();
        if let Err(e) = self.preloader.fence(bucket.event, bucket.count).await {
            tracing::warn!(event_id = %bucket.event, error = format!("{e:#}"), "cannot fence the event; will retry");
        }
    }

    /// After MySQL refused a batch: each order alone; the ones refused for their rows are
    /// released. `event`: the event's record, or None if MySQL does not have the event
    /// (then every order is refused). Returns the reservations still to retry (MySQL
    /// unavailable, or refusing for reasons of its own): a pass whose first
    /// [`ONE_BY_ONE_GIVE_UP`] orders were neither created nor refused stops, the rest
    /// returned untried (first, so the next pass goes on from there), so that a server
    /// refusing everything costs a few transactions, not a batch's worth.
    pub(super) async fn create_one_by_one(
        &self,
        bucket: Bucket,
        event: Option<&Arc<EventRecord>>,
        reservations: Vec<Reservation>,
    ) -> Vec<Reservation> {
        let mut retry = Vec::new();
        let (mut unsettled_in_a_row, mut decided_any) = (0, false);
        let mut left = reservations.into_iter();
        for r in left.by_ref() {
            let outcome = match event {
                Some(event) => {
                    self.create(event, bucket, std::slice::from_ref(&r), false)
                        .await
                }
                None => Err(PersistError::Rejected(format!(
                    "event {} is not in MySQL",
                    bucket.event
                ))),
            };
            let decided = matches!(outcome, Ok(()) | Err(PersistError::Rejected(_)));
            match outcome {
                Ok(()) => {}
                Err(PersistError::Stale(stale)) => {
                    retry.extend(self.drop_stale(bucket, vec![r], &stale).await.0);
                }
                Err(PersistError::Rewound(seq)) => {
                    self.fence(bucket, seq).await;
                    retry.push(r);
                }
                Err(PersistError::Rejected(why)) => {
                    tracing::error!(
                        order_no = %r.order_no,
                        why,
                        "order refused by MySQL; releasing its reservation"
                    );
                    if !self
                        .release(bucket, &r, "the order could not be created")
                        .await
                    {
                        retry.push(r);
                    }
                }
                Err(_) => retry.push(r),
            }
            decided_any |= decided;
            unsettled_in_a_row = if decided { 0 } else { unsettled_in_a_row + 1 };
            if !decided_any && unsettled_in_a_row >= ONE_BY_ONE_GIVE_UP {
                break;
            }
        }
        // The untried first: the next pass starts where this one stopped.
        let mut rest: Vec<Reservation> = left.collect();
        rest.extend(retry);
        rest
    }
}
