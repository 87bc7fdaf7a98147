//! Admission (DESIGN.md "Admission"): `POST /api/events/{id}/orders`. The request goes
//! through the validation chain against the cached event, then one Lua script in Redis
//! decides and records everything atomically. No lock is taken on this path.

pub mod replicated;
pub mod reserve;
pub mod seat_lock;
pub mod status;
pub mod throttle;
pub mod validate;

use std::sync::Arc;

use crate::infra::redis::Redis;
use chrono::{DateTime, Utc};

use crate::catalog::{EventCache, EventRecord, EventStatus};
use crate::domain::{EventId, UserId};
use crate::ids::OrderIds;
use crate::keys::Keys;
use crate::preload::Preloader;
use reserve::Reserved;
use throttle::Throttle;
use validate::OrderBody;

/// Why a purchase was not admitted. Each is an answer for the buyer, not a failure;
/// their HTTP mapping is in `public::answers`.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    Invalid(String),
    #[error("no event {0} on sale")]
    NoSuchEvent(u64),
    #[error("the sale is not open")]
    NotOpen,
    #[error("sold out")]
    SoldOut,
    #[error("the per-user limit for this event is reached")]
    LimitReached,
    #[error("a chosen seat is taken")]
    SeatTaken,
    #[error("this Idempotency-Key was used for a different purchase")]
    KeyReused,
    #[error("too many purchases; retry in {retry_after_s} s")]
    RateLimited { retry_after_s: u64 },
    #[error("the sale is busy creating orders; try again in a moment")]
    Busy,
    /// Published, but its keys are not in Redis (lost, being rebuilt from MySQL).
    #[error("the sale is being reloaded; try again in a moment")]
    Loading,
    /// Another request of this purchase holds it (its seats being locked): that one may
    /// be admitted.
    #[error("another request of this purchase is being decided; try again in a moment")]
    InFlight,
}

/// What a buyer asked for, after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Purchase {
    pub event_id: u64,
    pub category_id: u64,
    pub user_id: u64,
    pub quantity: u32,
    pub seats: Seats,
    /// The buyer's Redis bucket of the event (the event's only one for most events).
    pub bucket: crate::keys::Bucket,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seats {
    /// An unseated category.
    None,
    /// The best free seats, `cols` per row (adjacent in one row when possible).
    Best { cols: u32 },
    /// These seats, `(row, col)`.
    Chosen { cols: u32, seats: Vec<(u32, u32)> },
    /// A train class's seats on one journey only: these `(carriage, seat)`, or the best
    /// when empty (docs/trains.md).
    Journey {
        journey: crate::trains::Journey,
        seats: Vec<(u32, u32)>,
    },
}

impl Seats {
    /// The seat mode, columns per row and chosen seats `"row:col"` as the scripts that
    /// choose seats take them (`reserve.lua`, `seat_lock.lua`).
    pub fn script_args(&self) -> (String, u32, Vec<String>) {
        let named = |seats: &[(u32, u32)]| seats.iter().map(|(r, c)| format!("{r}:{c}")).collect();
        match self {
            Seats::Journey { journey, seats } => {
                (format!("segments:{}", journey.encode()), 0, named(seats))
            }
            Seats::None => ("none".into(), 0, Vec::new()),
            Seats::Best { cols } => ("auto".into(), *cols, Vec::new()),
            Seats::Chosen { cols, seats } => ("pick".into(), *cols, named(seats)),
        }
    }
}

/// What admission reads and writes.
pub struct Admission {
    pub redis: Redis,
    pub keys: Keys,
    /// The same cache the order workers read.
    pub events: Arc<EventCache>,
    /// The core's own rate limits, behind the edge's.
    pub limits: Throttle,
    /// Mints order numbers with this instance's leased worker id.
    pub order_ids: Arc<OrderIds>,
    /// Woken when an event's keys are found missing, to rebuild them.
    pub preloader: Preloader,
    /// `orders.max_stream_depth`: past it, admission pauses (SALE_BUSY).
    pub max_stream_depth: u64,
    /// `redis.wait_replicas` > 0: a 202 waits for the replicas to have it (and a seat
    /// lock or a move in another slot, for theirs to have that first).
    pub replicas: Option<Arc<replicated::ReplicaBarrier>>,
    /// One refill at a time per bucket and category (events of several buckets).
    pub refills: crate::buckets::RefillGates,
    /// `stampede_bucket_refills_total`, by outcome.
    pub refill_outcomes: prometheus::IntCounterVec,
    /// Woken for the stream of each purchase that reaches the script: this core's order
    /// workers read it within `orders::IDLE_AWAKE` however long it had been empty.
    pub streams: Arc<crate::orders::IdleStreams>,
}

/// Wakes this core's order workers for a stream when dropped
/// ([`crate::orders::IdleStreams::woken`]).
struct WakeStream<'a>(&'a crate::orders::IdleStreams, crate::keys::Bucket);

impl Drop for WakeStream<'_> {
    fn drop(&mut self) {
        self.0.woken(self.1, std::time::Instant::now());
    }
}

impl Admission {
    /// Admits one purchase of `event_id` at `now`, which is `event` as the caller read
    /// it from [`Admission::events`] (None: not there): the governor, the validation
    /// chain, then the one script. `now` is the request's one moment: the waiting room's
    /// check of the same request judged the sale window by it too.
    pub async fn admit(
        &self,
        event_id: EventId,
        event: Option<Arc<EventRecord>>,
        user_id: UserId,
        idempotency_key: &str,
        body: OrderBody,
        now: DateTime<Utc>,
    ) -> Result<Reserved, AdmissionError> {
        let (event_id, user_id) = (event_id.0, user_id.0);
        debug_assert!(event.as_ref().is_none_or(|e| e.id == event_id));
        self.limits.check(UserId(user_id))?;
        let event = event.ok_or(Refusal::NoSuchEvent(event_id))?;
        let (purchase, window_closed) =
            match validate::validate(&body, &event, UserId(user_id), now) {
                Err(Refusal::NotOpen) if event.status != EventStatus::Draft => (
                    validate::validate_for_replay(&body, &event, UserId(user_id), now)?,
                    true,
                ),
                other => (other?, false),
            };
        let Some(request_id) = self.order_ids.next(UserId(user_id)) else {
            // The worker-id lease could not be renewed (Redis away): minting now could
            // share an id with the instance that takes it over.
            tracing::warn!("order-number lease not renewed in time; admission paused");
            return Err(Refusal::Busy.into());
        };
        let seats_elsewhere = matches!(purchase.seats, Seats::Best { .. } | Seats::Chosen { .. })
            && !purchase.bucket.holds_seats();
        // Whatever comes of it — admitted, refused, an error, or this request dropped
        // with the script's answer unread — the purchase may be in its stream now.
        let _wake = WakeStream(&self.streams, purchase.bucket);
        let outcome = if window_closed {
            // The core's record of the event says the sale is not open: a repeated key
            // is answered as the first time, anything else is NOT_OPEN whatever the
            // status in Redis's metadata (written there from an older record, it
            // admitted purchases of a closed sale). Seats are not touched.
            self.replay(&purchase, request_id, idempotency_key)
                .await?
                .unwrap_or(Err(Refusal::NotOpen))
        } else if seats_elsewhere {
            self.reserve_seats_elsewhere(
                &purchase,
                request_id,
                idempotency_key,
                event.per_user_limit,
            )
            .await?
        } else {
            self.reserve_refilling(&purchase, request_id, idempotency_key)
                .await?
        };
        let reserved = match outcome {
            // Not a repeat of an admitted key: the answer the window gives.
            Err(_) if window_closed => return Err(Refusal::NotOpen.into()),
            Err(Refusal::Loading) => {
                self.preloader.wake();
                return Err(Refusal::Loading.into());
            }
            other => other?,
        };
        if let Some(replicas) = &self.replicas {
            let record = replicated::Record::admission(
                &self.keys,
                purchase.bucket,
                UserId(user_id),
                idempotency_key,
                reserved.request_id,
            );
            // Admitted, and not known to be kept: never a 202, never an error that
            // reads as "not admitted".
            if let Err(why) = replicas.kept(purchase.bucket, record).await {
                if let replicated::NotKept::Failed(e) = &why {
                    tracing::warn!(error = format!("{e:#}"), "replica barrier failed");
                }
                return Err(AdmissionError::Unconfirmed);
            }
        }
        // This request's seats in another slot: kept only once the admission is known
        // to stay (a lost one leaves them pending; the sweeper frees them).
        if seats_elsewhere && reserved.request_id == request_id {
            self.confirm_seats(&purchase, &reserved).await;
        }
        Ok(reserved)
    }
}

impl Admission {
    /// A seated purchase in an event of several buckets (docs/scaling.md "Seated
    /// categories"): a look at the buyer's bucket (a repeated key, the limit), the seats
    /// pending in their slot, then reserve.lua on the buyer's bucket; seats this request
    /// does not get are freed here, and `admit` confirms the ones it gets. A failure
    /// between the steps leaves a pending lock the sweeper settles.
    async fn reserve_seats_elsewhere(
        &self,
        purchase: &Purchase,
        request_id: crate::domain::OrderNo,
        idempotency_key: &str,
        per_user_limit: u32,
    ) -> anyhow::Result<Result<Reserved, Refusal>> {
        let mut redis = self.redis.clone();
        let (event, category) = (
            purchase.bucket.event,
            crate::domain::CategoryId(purchase.category_id),
        );
        let user = UserId(purchase.user_id);
        // A buyer at their limit never holds seats, even for a moment.
        let (seen, held): (bool, Option<u32>) = redis::pipe()
            .hexists(
                self.keys.idempotency(purchase.bucket),
                crate::keys::idempotency_field(user, idempotency_key),
            )
            .hget(self.keys.held(purchase.bucket), user)
            .query_async(&mut redis)
            .await?;
        if seen {
            return self.replayed(purchase, request_id, idempotency_key).await;
        }
        if held.unwrap_or(0) + purchase.quantity > per_user_limit {
            return Ok(Err(Refusal::LimitReached));
        }
        let now = || Utc::now().timestamp_millis();
        let waiting_until = std::time::Instant::now() + IN_FLIGHT_WAIT;
        let locked = loop {
            let lock = seat_lock::lock(
                &mut redis,
                &self.keys,
                purchase,
                request_id,
                idempotency_key,
                now(),
            )
            .await?;
            match lock {
                seat_lock::Lock::Locked(locked) => break locked,
                // A repeated key answers what it answered the first time, even when its
                // seats are taken now (by that very purchase).
                seat_lock::Lock::Refused(refusal) => {
                    return Ok(
                        match self.replay(purchase, request_id, idempotency_key).await? {
                            Some(first) => first,
                            None => Err(refusal),
                        },
                    );
                }
                seat_lock::Lock::InFlight if std::time::Instant::now() < waiting_until => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    if let Some(first) = self.replay(purchase, request_id, idempotency_key).await? {
                        return Ok(first);
                    }
                }
                seat_lock::Lock::InFlight => return Ok(Err(Refusal::InFlight)),
            }
        };
        if !self.seat_lock_kept(purchase, request_id).await {
            let seats = locked.seats.join(",");
            let freed =
                seat_lock::free(&mut redis, &self.keys, event, category, request_id, &seats).await;
            if let Err(e) = freed {
                // No bucket recorded the request: the sweeper frees the lock when due.
                tracing::warn!(
                    error = format!("{e:#}"),
                    "a seat lock not kept was not freed"
                );
            }
            return Ok(Err(Refusal::Busy));
        }
        let outcome = reserve::reserve(
            &mut redis,
            &self.keys,
            purchase,
            request_id,
            idempotency_key,
            now(),
            self.max_stream_depth,
            Some(&locked),
        )
        .await?
        .into_result();
        // Admitted now, or by an earlier run of this very call (a retried script whose
        // answer was lost): the seats are this request's. Anything else gives them back.
        let ours = matches!(&outcome, Ok(r) if r.request_id == request_id);
        if !ours {
            let seats = locked.seats.join(",");
            seat_lock::free(&mut redis, &self.keys, event, category, request_id, &seats).await?;
        }
        Ok(outcome)
    }

    /// With `redis.wait_replicas`, whether the replicas of the seats' slot have the
    /// request's lock before the buyer's bucket admits on it: a lock its master lost in a
    /// failover after the admission would leave the seats free for a second buyer while
    /// the first holds a 202 for them. False when the round did not find the lock or
    /// failed (nothing admitted yet: the buyer is told SALE_BUSY); a round that timed out
    /// goes on on the master's word, as an admission's does.
    async fn seat_lock_kept(
        &self,
        purchase: &Purchase,
        request_id: crate::domain::OrderNo,
    ) -> bool {
        let Some(replicas) = &self.replicas else {
            return true;
        };
        let event = purchase.bucket.event;
        let record = replicated::Record::seat_lock(&self.keys, event, request_id);
        let kept = replicas.kept(purchase.bucket.seat_home(), record).await;
        if let Err(why) = &kept {
            tracing::warn!(
                event_id = event.0,
                request_id = request_id.0,
                %why,
                "a seat lock not known to be kept by its replicas; nothing admitted"
            );
        }
        kept.is_ok()
    }

    /// Keeps the seats an admitted request locked; on trouble the sweeper does it (the
    /// bucket recorded the admission), so the buyer's 202 stands either way.
    async fn confirm_seats(&self, purchase: &Purchase, reserved: &Reserved) {
        let mut redis = self.redis.clone();
        let event = purchase.bucket.event;
        let confirmed = seat_lock::confirm(
            &mut redis,
            &self.keys,
            event,
            crate::domain::CategoryId(purchase.category_id),
            reserved.request_id,
            &reserved.seats.join(","),
        )
        .await;
        match confirmed {
            Ok(seat_lock::Confirmed(held)) if held == reserved.seats.len() => {}
            // Only a rebuild of the event's keys between the steps does this; MySQL's
            // seat guard decides who has the seat.
            Ok(seat_lock::Confirmed(held)) => tracing::warn!(
                event_id = event.0,
                request_id = reserved.request_id.0,
                held,
                "a pending seat lock was gone when its purchase was admitted"
            ),
            Err(e) => tracing::warn!(
                event_id = event.0,
                request_id = reserved.request_id.0,
                error = format!("{e:#}"),
                "seats not confirmed; the sweeper keeps them once their lock is due"
            ),
        }
    }

    /// What reserve.lua answers a repeat of a key known to be used.
    async fn replayed(
        &self,
        purchase: &Purchase,
        request_id: crate::domain::OrderNo,
        idempotency_key: &str,
    ) -> anyhow::Result<Result<Reserved, Refusal>> {
        // The script answers from the key's record before anything else.
        let outcome = reserve::reserve(
            &mut self.redis.clone(),
            &self.keys,
            purchase,
            request_id,
            idempotency_key,
            Utc::now().timestamp_millis(),
            self.max_stream_depth,
            None,
        )
        .await?;
        Ok(outcome.into_result())
    }

    /// What reserve.lua answers a repeat of `idempotency_key`, if the key was used in
    /// this event before (None when it was not).
    async fn replay(
        &self,
        purchase: &Purchase,
        request_id: crate::domain::OrderNo,
        idempotency_key: &str,
    ) -> anyhow::Result<Option<Result<Reserved, Refusal>>> {
        let seen: bool = redis::cmd("HEXISTS")
            .arg(self.keys.idempotency(purchase.bucket))
            .arg(crate::keys::idempotency_field(
                UserId(purchase.user_id),
                idempotency_key,
            ))
            .query_async(&mut self.redis.clone())
            .await?;
        if !seen {
            return Ok(None);
        }
        Ok(Some(
            self.replayed(purchase, request_id, idempotency_key).await?,
        ))
    }

    /// reserve.lua, and for an event of several buckets the refill of a bucket that ran
    /// dry (docs/scaling.md): at most [`REFILLS`] refills, then SALE_BUSY.
    async fn reserve_refilling(
        &self,
        purchase: &Purchase,
        request_id: crate::domain::OrderNo,
        idempotency_key: &str,
    ) -> anyhow::Result<Result<Reserved, Refusal>> {
        let mut redis = self.redis.clone();
        let category = crate::domain::CategoryId(purchase.category_id);
        for _ in 0..=REFILLS {
            let mut reserve = async || {
                reserve::reserve(
                    &mut redis,
                    &self.keys,
                    purchase,
                    request_id,
                    idempotency_key,
                    Utc::now().timestamp_millis(),
                    self.max_stream_depth,
                    None,
                )
                .await
            };
            let outcome = reserve().await?;
            let reserve::Outcome::Refill = outcome else {
                return Ok(outcome.into_result());
            };
            let event = purchase.bucket.event;
            if self.refills.flagged_recently(event, category) {
                return Ok(Err(self.refilled("remembered", Refusal::SoldOut)));
            }
            // Whoever refilled the bucket while this one waited may have brought enough.
            let gate = self.refills.gate(purchase.bucket, category);
            let _refilling = gate.lock().await;
            let outcome = reserve().await?;
            let reserve::Outcome::Refill = outcome else {
                return Ok(outcome.into_result());
            };
            // The refill this one waited for may have found the category flagged: at a
            // sale's end every purchase queued here would otherwise ask the pool in
            // turn, each a script on the event's master to learn what this core knows.
            if self.refills.flagged_recently(event, category) {
                return Ok(Err(self.refilled("remembered", Refusal::SoldOut)));
            }
            let mover = crate::buckets::Mover {
                redis: self.redis.clone(),
                keys: self.keys.clone(),
                replicas: self.replicas.clone(),
            };
            let refill = match mover
                .refill(purchase.bucket, category, purchase.quantity)
                .await
            {
                Ok(refill) => refill,
                // Nothing is reserved for this purchase (its bucket answered REFILL), so
                // a move that failed (a failover, a call timed out) is SALE_BUSY, which
                // certainly admitted nothing: not 500, and not OUTCOME_UNKNOWN.
                Err(e) => {
                    tracing::error!(
                        event_id = %event,
                        error = format!("{e:#}"),
                        "a dry bucket's refill failed; nothing reserved, answering SALE_BUSY"
                    );
                    return Ok(Err(self.refilled("failed", Refusal::Busy)));
                }
            };
            match refill {
                crate::buckets::Refill::Retry => {
                    self.refill_outcomes.with_label_values(&["moved"]).inc();
                }
                crate::buckets::Refill::SoldOut => {
                    return Ok(Err(self.refilled("sold_out", Refusal::SoldOut)));
                }
                crate::buckets::Refill::Flagged => {
                    self.refills.saw_flag(event, category);
                    return Ok(Err(self.refilled("flagged", Refusal::SoldOut)));
                }
                crate::buckets::Refill::Busy => {
                    return Ok(Err(self.refilled("busy", Refusal::Busy)));
                }
                crate::buckets::Refill::Moving => {
                    return Ok(Err(self.refilled("moving", Refusal::Busy)));
                }
            }
        }
        Ok(Err(self.refilled("busy", Refusal::Busy)))
    }

    /// Counts a dry bucket's `outcome` and gives back the refusal it ends in.
    fn refilled(&self, outcome: &str, refusal: Refusal) -> Refusal {
        self.refill_outcomes.with_label_values(&[outcome]).inc();
        refusal
    }
}

/// How long a seated purchase waits for another request with its Idempotency-Key that
/// holds a pending lock (normally a few ms) before answering SALE_BUSY.
const IN_FLIGHT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Refills one purchase may cause before it is answered SALE_BUSY (others' purchases
/// took the units moved in for it each time).
const REFILLS: usize = 4;

/// A refusal for the buyer, or an infrastructure failure.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
    /// Admitted by a Redis master that failed over before its replicas had it: the
    /// reservation may be gone (a repeat with the same Idempotency-Key tells).
    #[error("the admission was not confirmed by the replicas")]
    Unconfirmed,
}

impl From<redis::RedisError> for AdmissionError {
    fn from(e: redis::RedisError) -> Self {
        AdmissionError::Unexpected(anyhow::Error::new(e).context("Redis call failed"))
    }
}

impl AdmissionError {
    /// Whether this failure proves the purchase was not admitted: a refusal, or a Redis
    /// that never got the command (a refused connection, Redis still loading) — every
    /// step after reserve.lua's admission fails as `Unconfirmed` instead. The purchase's
    /// waiting-room pass is then given back, as its answer (UNAVAILABLE) says nothing
    /// was admitted.
    pub fn nothing_admitted(&self) -> bool {
        match self {
            AdmissionError::Refused(_) => true,
            AdmissionError::Unexpected(e) => {
                crate::infra::Down::of(e) == Some(crate::infra::Down::Redis { maybe_sent: false })
            }
            AdmissionError::Unconfirmed => false,
        }
    }
}

#[cfg(test)]
mod error_tests {
    use super::{AdmissionError, Refusal};

    fn redis_io(kind: std::io::ErrorKind) -> AdmissionError {
        redis::RedisError::from(std::io::Error::new(kind, "test")).into()
    }

    #[test]
    fn only_a_refusal_or_a_command_never_sent_proves_nothing_was_admitted() {
        assert!(AdmissionError::Refused(Refusal::SoldOut).nothing_admitted());
        assert!(redis_io(std::io::ErrorKind::ConnectionRefused).nothing_admitted());
        // Sent, then no answer: it may have run.
        assert!(!redis_io(std::io::ErrorKind::TimedOut).nothing_admitted());
        assert!(!redis_io(std::io::ErrorKind::ConnectionReset).nothing_admitted());
        assert!(!AdmissionError::Unconfirmed.nothing_admitted());
        assert!(!AdmissionError::Unexpected(anyhow::anyhow!("a bug")).nothing_admitted());
    }
}
