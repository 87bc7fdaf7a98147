//! The gate (docs/waiting-room.md "Release"): for each event whose room is on, one core
//! instance at a time (a lock with an owner token, renewed every tick) draws the line at
//! the open and then lets buyers in, every [`TICK`]:
//!
//! - at the open: closes early joins (`room_draw.lua`), orders who joined before it by
//!   the committed seed (`lottery`), writes their positions and reveals the seed;
//! - then releases up to rate × elapsed positions, never more than the stock left can
//!   serve beyond the passes still out (`room_release.lua`).
//!
//! With `admit_per_s: "auto"` the rate follows the order stream's backlog, the signal
//! behind SALE_BUSY: halved when the backlog passes half of `orders.max_stream_depth`,
//! raised by a tenth (and one) while it stays under a fifth, within [`AUTO_MIN`] and
//! [`AUTO_MAX`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::{self, Rate};
use super::lottery;
use super::store::{Draw, RoomStore};
use crate::buckets::Mover;
use crate::catalog::EventCache;
use crate::domain::EventId;
use crate::infra::mysql::CallTimeout;
use crate::keys::Bucket;
use crate::lock::{Lock, Owned};
use crate::shutdown::Shutdown;

/// How often the gate releases.
pub const TICK: Duration = Duration::from_millis(200);
/// How long a gate's lock lasts without renewal (renewed every tick; longer than a
/// draw of a few hundred thousand joiners takes, so no second instance starts one).
const LOCK_TTL: Duration = Duration::from_secs(10);
/// The automatic rate's bounds and start, positions per second.
pub const AUTO_MIN: f64 = 5.0;
pub const AUTO_MAX: f64 = 20_000.0;
const AUTO_START: f64 = 50.0;

pub struct Gate {
    pub store: RoomStore,
    pub mysql: mysql_async::Pool,
    /// Bounds the list of rooms' read, so a MySQL that stops answering stops no gate.
    pub call_timeout: CallTimeout,
    pub events: Arc<EventCache>,
    pub max_stream_depth: u64,
}

/// What the gate keeps per event between ticks.
struct Held {
    lock: Lock,
    last: Instant,
    /// Fractions of a position owed by earlier ticks.
    carry: f64,
    auto_rate: f64,
    /// Estimates being checked: a position, and when the estimate a buyer there read
    /// (`room::status`: ahead ÷ the rate in force) said its turn would come.
    estimates: std::collections::VecDeque<(u64, Instant)>,
    last_estimate: Instant,
}

/// How often the gate takes an estimate to check, and how far ahead it looks.
const ESTIMATE_EVERY: Duration = Duration::from_secs(5);
const ESTIMATE_AHEAD_S: f64 = 30.0;

impl Gate {
    pub async fn run(self, mut stop: Shutdown) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut held: HashMap<u64, Held> = HashMap::new();
        let mut rooms: Vec<u64> = Vec::new();
        let mut listed = Instant::now() - Duration::from_secs(10);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait() => return,
            }
            if listed.elapsed() >= Duration::from_secs(1) {
                let list = config::active(&self.mysql);
                match self
                    .call_timeout
                    .try_within("the waiting rooms' list", list)
                    .await
                {
                    Ok(ids) => {
                        rooms = ids;
                        listed = Instant::now();
                    }
                    Err(e) => tracing::warn!(
                        error = format!("{e:#}"),
                        "waiting rooms not listed; will retry"
                    ),
                }
                held.retain(|id, _| rooms.contains(id));
            }
            // Every room at once: one room's slow tick (a large draw) delays no other.
            let gate = &self;
            let ticks = rooms.iter().map(|&id| {
                let h = held.remove(&id);
                async move { (id, gate.tick(id, h).await) }
            });
            for (id, (h, outcome)) in futures_util::future::join_all(ticks).await {
                if let Some(h) = h {
                    held.insert(id, h);
                }
                if let Err(e) = outcome {
                    tracing::warn!(
                        event_id = id,
                        error = format!("{e:#}"),
                        "waiting room gate failed; will retry"
                    );
                }
            }
        }
    }

    /// Keeps or takes the event's gate: its state while this instance holds it.
    async fn own(&self, id: u64, held: Option<Held>) -> anyhow::Result<Option<Held>> {
        let mut redis = self.store.redis.clone();
        if let Some(h) = held {
            if h.lock.renew(&mut redis, LOCK_TTL).await? == Owned::Yes {
                return Ok(Some(h));
            }
            tracing::info!(
                event_id = id,
                "waiting room gate taken over by another instance"
            );
        }
        let Some(lock) =
            Lock::try_acquire(&mut redis, self.store.keys.room_gate(id), LOCK_TTL).await?
        else {
            return Ok(None);
        };
        tracing::info!(event_id = id, "running the waiting room's gate");
        Ok(Some(Held {
            lock,
            last: Instant::now(),
            carry: 0.0,
            auto_rate: AUTO_START,
            estimates: Default::default(),
            last_estimate: Instant::now(),
        }))
    }

    /// One tick of one room: what this instance holds of it after, and how it went.
    async fn tick(&self, id: u64, held: Option<Held>) -> (Option<Held>, anyhow::Result<()>) {
        let room = match self.events.get(id).await {
            Ok(Some(event)) => event,
            Ok(None) => return (held, Ok(())),
            Err(e) => return (held, Err(e)),
        };
        if !room.room.as_ref().is_some_and(|r| r.enabled) {
            return (held, Ok(()));
        }
        let mut h = match self.own(id, held).await {
            Ok(Some(h)) => h,
            Ok(None) => return (None, Ok(())),
            Err(e) => return (None, Err(e)),
        };
        let outcome = self.release(&room, &mut h).await;
        (Some(h), outcome)
    }

    async fn release(
        &self,
        event: &crate::catalog::EventRecord,
        h: &mut Held,
    ) -> anyhow::Result<()> {
        let room = event.room.as_ref().expect("checked by tick");
        let event_id = EventId(event.id);
        match self.store.draw_begin(event_id).await? {
            (Draw::TooSoon | Draw::Off, _) => return Ok(()),
            (Draw::Closed, joined) => self.draw(event_id, joined).await?,
            (Draw::Drawn, _) => {}
        }
        let rate = match room.admit_per_s {
            Rate::Fixed(n) => f64::from(n),
            Rate::Auto => {
                h.auto_rate = self.auto_rate(event, h.auto_rate).await?;
                h.auto_rate
            }
        };
        let elapsed = h.last.elapsed().as_secs_f64().min(1.0);
        h.last = Instant::now();
        h.carry = (h.carry + rate * elapsed).min(rate.max(1.0));
        let budget = h.carry.floor();
        let mover = Mover {
            redis: self.store.redis.clone(),
            keys: self.store.keys.clone(),
            replicas: None,
        };
        // Passes used from here on are told apart from the units read (room_release.lua).
        let done_seq = self.store.done_seq(event_id).await?;
        let units: i64 = mover
            .available(event_id, event.buckets)
            .await?
            .values()
            .sum();
        let released = self
            .store
            .release(
                event_id,
                budget as u64,
                units,
                i64::from(room.pass_ttl_s) * 1000,
                rate,
                done_seq,
            )
            .await?;
        h.carry -= released.now as f64;
        if released.now < budget as u64 {
            // Nobody waiting, or the stock is spoken for: no credit piles up meanwhile.
            h.carry = h.carry.min(1.0);
        }
        // Held back by the stock (everything left is held by passes out): buyers read
        // no estimate then, so none is taken.
        let held_back = released.now < budget as u64 && released.waiting > 0;
        self.check_estimates(event_id, h, &released, if held_back { 0.0 } else { rate })
            .await
    }

    /// How accurate the buyers' estimates are: every [`ESTIMATE_EVERY`], the position
    /// about [`ESTIMATE_AHEAD_S`] ahead and the turn its estimate promises (what a buyer
    /// there reads now); once it is served, the error goes to the room's figures.
    async fn check_estimates(
        &self,
        event: EventId,
        h: &mut Held,
        released: &super::store::Released,
        rate: f64,
    ) -> anyhow::Result<()> {
        while let Some(&(position, due)) = h.estimates.front() {
            if released.served < position {
                break;
            }
            h.estimates.pop_front();
            let now = Instant::now();
            let error_ms = if now >= due {
                (now - due).as_millis() as i64
            } else {
                -((due - now).as_millis() as i64)
            };
            self.store.record_estimate(event, error_ms).await?;
        }
        if h.last_estimate.elapsed() >= ESTIMATE_EVERY && rate > 0.0 && released.waiting > 0 {
            h.last_estimate = Instant::now();
            let ahead = ((rate * ESTIMATE_AHEAD_S).ceil() as u64).clamp(1, released.waiting);
            let due = Instant::now() + Duration::from_secs_f64(ahead as f64 / rate);
            h.estimates.push_back((released.served + ahead, due));
        }
        Ok(())
    }

    /// The draw at the open: the joiners ordered by the committed seed.
    async fn draw(&self, event: EventId, joined: i64) -> anyhow::Result<()> {
        let seed = config::seed(&self.mysql, event.0);
        let seed = (self
            .call_timeout
            .try_within("a waiting room's seed", seed)
            .await?)
            .ok_or_else(|| anyhow::anyhow!("the waiting room of event {event} has no seed"))?;
        let early = self.store.early(event).await?;
        let order = lottery::order(&seed, early);
        self.store.write_draw(event, &order, &seed).await?;
        tracing::info!(
            event_id = event.0,
            joined,
            drawn = order.len(),
            "waiting room drawn at the open"
        );
        Ok(())
    }

    /// The next automatic rate, from the order streams' backlog.
    async fn auto_rate(
        &self,
        event: &crate::catalog::EventRecord,
        rate: f64,
    ) -> anyhow::Result<f64> {
        let mut redis = self.store.redis.clone();
        let mut deepest = 0u64;
        // One call per bucket: on a cluster each is in a slot of its own.
        for b in Bucket::all(event.id, event.buckets) {
            let depth: u64 = redis::cmd("XLEN")
                .arg(self.store.keys.order_stream(b))
                .query_async(&mut redis)
                .await?;
            deepest = deepest.max(depth);
        }
        let depth = deepest as f64;
        let max = self.max_stream_depth as f64;
        let next = if depth > max * 0.5 {
            rate * 0.5
        } else if depth < max * 0.2 {
            rate * 1.1 + 1.0
        } else {
            rate
        };
        Ok(next.clamp(AUTO_MIN, AUTO_MAX))
    }
}
