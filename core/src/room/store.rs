//! The waiting room's Redis side (docs/waiting-room.md): the scripts that join, draw,
//! release and claim passes, and the reads the core answers from. Every key is in the
//! event's own slot (`{ev:<id>}`), whatever buckets its stock has.

use std::sync::LazyLock;

use anyhow::Context;

use super::config::{Rate, RoomConfig};
use super::status::{Place, Room, Step};
use crate::catalog::EventRecord;
use crate::domain::EventId;
use crate::infra::redis::Redis;
use crate::keys::Keys;
use crate::script_codes::ScriptCode;

static JOIN: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(include_str!("../../../lua/redis/room_join.lua")));
static DRAW: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(include_str!("../../../lua/redis/room_draw.lua")));
static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    crate::infra::redis::script(include_str!("../../../lua/redis/room_release.lua"))
});
static PAUSE: LazyLock<redis::Script> = LazyLock::new(|| {
    crate::infra::redis::script(include_str!("../../../lua/redis/room_pause.lua"))
});
static PASS: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(include_str!("../../../lua/redis/room_pass.lua")));

/// What `room_join.lua` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    Placed = 1,
    Early = 2,
    NotYet = 3,
    Ended = 4,
    Off = 5,
}

impl ScriptCode for Joined {
    const SCRIPT: &'static str = "room_join.lua";
    const ALL: &'static [Joined] = &[
        Joined::Placed,
        Joined::Early,
        Joined::NotYet,
        Joined::Ended,
        Joined::Off,
    ];

    fn code(self) -> i64 {
        self as i64
    }
}

/// What `room_draw.lua` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Draw {
    TooSoon = 0,
    Closed = 1,
    Drawn = 2,
    Off = 3,
}

impl ScriptCode for Draw {
    const SCRIPT: &'static str = "room_draw.lua";
    const ALL: &'static [Draw] = &[Draw::TooSoon, Draw::Closed, Draw::Drawn, Draw::Off];

    fn code(self) -> i64 {
        self as i64
    }
}

/// What `room_pass.lua` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassUse {
    Taken = 0,
    Claimed = 1,
    Same = 2,
    InFlight = 3,
    Expired = 4,
}

impl ScriptCode for PassUse {
    const SCRIPT: &'static str = "room_pass.lua";
    const ALL: &'static [PassUse] = &[
        PassUse::Taken,
        PassUse::Claimed,
        PassUse::Same,
        PassUse::InFlight,
        PassUse::Expired,
    ];

    fn code(self) -> i64 {
        self as i64
    }
}

/// How long a pass's claim may stay pending before it counts as used (a core that
/// stopped between the claim and its settlement): longer than any purchase takes.
pub const CLAIM_PENDING_MS: i64 = 30_000;

/// What `room_pause.lua` did: for a resume, the release steps it moved and by how long
/// (none for a pause, or a resume with nothing paused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resumed {
    pub steps: u64,
    pub by_ms: i64,
}

/// What one release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// The last position released so far.
    pub served: u64,
    /// Positions released by this call.
    pub now: u64,
    /// Passes out (released less than a pass's lifetime ago, not used).
    pub out: u64,
    /// Passes whose time ran out unused.
    pub expired: u64,
    /// Positions still waiting for their turn.
    pub waiting: u64,
}

/// The room's figures for the stats and the dashboard.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Figures {
    /// Everyone who ever joined.
    pub joined: u64,
    pub drawn: bool,
    /// Positions released so far.
    pub served: u64,
    /// Still waiting for their turn (with a position).
    pub waiting: u64,
    /// Passes out: released less than a pass's lifetime ago and not used.
    pub passes_out: u64,
    pub passes_used: u64,
    pub passes_expired: u64,
    /// Positions released per second now.
    pub rate_now: f64,
    /// How accurate the waiting estimates were: positions whose estimate was checked
    /// against their turn's real time (`room::gate`), and the mean error, seconds
    /// (positive: later than estimated).
    pub eta_checked: u64,
    pub eta_mean_error_s: Option<f64>,
    pub eta_mean_abs_error_s: Option<f64>,
}

#[derive(Clone)]
pub struct RoomStore {
    pub redis: Redis,
    pub keys: Keys,
}

fn rate_text(rate: Rate) -> String {
    match rate {
        Rate::Fixed(n) => n.to_string(),
        Rate::Auto => "auto".into(),
    }
}

impl RoomStore {
    /// Writes the room's settings where the scripts and the edge read them (its state —
    /// who joined, the draw, the releases — is left as it is).
    pub async fn publish(&self, event: &EventRecord, room: &RoomConfig) -> anyhow::Result<()> {
        let key = self.keys.room(event.id);
        let start_ms = event.sale_start.timestamp_millis();
        let opens_ms = start_ms - i64::from(room.opens_before_s) * 1000;
        redis::pipe()
            .hset_multiple(
                &key,
                &[
                    ("enabled", u8::from(room.enabled).to_string()),
                    (
                        "require_pass",
                        u8::from(room.require_pass_at_open).to_string(),
                    ),
                    ("opens_ms", opens_ms.to_string()),
                    ("start_ms", start_ms.to_string()),
                    ("end_ms", event.sale_end.timestamp_millis().to_string()),
                    ("ttl_ms", (i64::from(room.pass_ttl_s) * 1000).to_string()),
                    ("bits", room.challenge_bits.to_string()),
                    ("rate", rate_text(room.admit_per_s)),
                    ("commitment", room.commitment.clone()),
                ],
            )
            .ignore()
            .cmd("HSETNX")
            .arg(&key)
            .arg("gen")
            .arg(format!("{:016x}", rand::random::<u64>()))
            .ignore()
            .query_async::<()>(&mut self.redis.clone())
            .await
            .context("Failed to write the waiting room's settings")
    }

    /// A buyer joins: the script's code and its number (position, arrival, opening time).
    pub async fn join(&self, event: EventId, user: u64) -> anyhow::Result<(Joined, i64)> {
        let (code, n): (i64, Option<i64>) = JOIN
            .key(self.keys.room(event))
            .key(self.keys.room_early(event))
            .key(self.keys.room_positions(event))
            .arg(user)
            .invoke_async(&mut self.redis.clone())
            .await
            .context("room_join.lua failed")
            .map(|v: Vec<i64>| (v[0], v.get(1).copied()))?;
        Ok((Joined::from_code(code)?, n.unwrap_or(0)))
    }

    /// The hidden path's next pass id (`h<n>`), or None when every one of the event's
    /// `categories` is flagged sold out (read in the same round trip: a pass then would
    /// read `your_turn` for a purchase that can only be refused SOLD_OUT).
    pub async fn next_hidden_id(
        &self,
        event: EventId,
        categories: usize,
    ) -> anyhow::Result<Option<String>> {
        let (n, flags): (u64, Vec<String>) = redis::pipe()
            .cmd("HINCRBY")
            .arg(self.keys.room(event))
            .arg("hidden")
            .arg(1)
            .hkeys(self.keys.sold_out(event))
            .query_async(&mut self.redis.clone())
            .await
            .context("Failed to count the hidden path's passes")?;
        Ok((!all_sold(&flags, categories)).then(|| format!("h{n}")))
    }

    /// The draw's first step (`room_draw.lua`).
    pub async fn draw_begin(&self, event: EventId) -> anyhow::Result<(Draw, i64)> {
        let v: Vec<i64> = DRAW
            .key(self.keys.room(event))
            .key(self.keys.room_early(event))
            .invoke_async(&mut self.redis.clone())
            .await
            .context("room_draw.lua failed")?;
        Ok((Draw::from_code(v[0])?, v[1]))
    }

    /// Everyone who joined before the open (user ids, arrival order).
    pub async fn early(&self, event: EventId) -> anyhow::Result<Vec<u64>> {
        redis::cmd("ZRANGE")
            .arg(self.keys.room_early(event))
            .arg(0)
            .arg(-1)
            .query_async(&mut self.redis.clone())
            .await
            .context("Failed to read who joined before the open")
    }

    /// Writes the draw: positions 1..N in `order`, then the room drawn with its seed
    /// revealed. Run again after a failure, it writes the same.
    pub async fn write_draw(
        &self,
        event: EventId,
        order: &[u64],
        seed: &str,
    ) -> anyhow::Result<()> {
        let mut redis = self.redis.clone();
        let key = self.keys.room_positions(event);
        for (i, chunk) in order.chunks(5_000).enumerate() {
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(&key);
            for (j, user) in chunk.iter().enumerate() {
                cmd.arg(i * 5_000 + j + 1).arg(user);
            }
            cmd.query_async::<()>(&mut redis)
                .await
                .context("Failed to write the draw's positions")?;
        }
        redis::cmd("HSET")
            .arg(self.keys.room(event))
            .arg("seed")
            .arg(seed)
            .arg("drawn")
            .arg(1)
            .query_async::<()>(&mut redis)
            .await
            .context("Failed to mark the room drawn")
    }

    /// The sale closed (`pause`) or reopened (`resume`): the turns alive at the close
    /// keep the time they had left (`room_pause.lua`).
    pub async fn pause(&self, event: EventId, resume: bool) -> anyhow::Result<Resumed> {
        let v: Vec<i64> = PAUSE
            .key(self.keys.room(event))
            .key(self.keys.room_steps(event))
            .arg(if resume { "resume" } else { "pause" })
            .invoke_async(&mut self.redis.clone())
            .await
            .context("room_pause.lua failed")?;
        Ok(Resumed {
            steps: v[0].max(0) as u64,
            by_ms: v[1],
        })
    }

    /// One release (`room_release.lua`).
    pub async fn release(
        &self,
        event: EventId,
        budget: u64,
        units: i64,
        ttl_ms: i64,
        rate: f64,
        done_seq: u64,
    ) -> anyhow::Result<Released> {
        let v: Vec<u64> = RELEASE
            .key(self.keys.room(event))
            .key(self.keys.room_steps(event))
            .key(self.keys.room_used_positions(event))
            .key(self.keys.room_positions(event))
            .arg(budget)
            .arg(units.max(0))
            .arg(ttl_ms)
            .arg(format!("{rate:.3}"))
            .arg((ttl_ms / 120).max(1_000))
            .arg(done_seq)
            .invoke_async(&mut self.redis.clone())
            .await
            .context("room_release.lua failed")?;
        Ok(Released {
            served: v[0],
            now: v[1],
            out: v[2],
            expired: v[3],
            waiting: v[4],
        })
    }

    /// `room_pass.lua`: `op` is `use` (with the pass's expiry), `done` or `give`, for the
    /// purchase `owner` (`<user>:<Idempotency-Key>`) and this request's `nonce`.
    pub async fn pass(
        &self,
        event: EventId,
        op: &str,
        id: &str,
        owner: &str,
        nonce: &str,
        expires_ms: i64,
    ) -> anyhow::Result<PassUse> {
        let code: i64 = PASS
            .key(self.keys.room(event))
            .key(self.keys.room_used(event))
            .key(self.keys.room_used_positions(event))
            .arg(op)
            .arg(id)
            .arg(owner)
            .arg(nonce)
            .arg(expires_ms)
            .arg(CLAIM_PENDING_MS)
            .invoke_async(&mut self.redis.clone())
            .await
            .context("room_pass.lua failed")?;
        PassUse::from_code(code)
    }

    /// The room and a buyer's place as Redis has them now (None: not in line), in one
    /// round trip: the releases of the last `ttl_ms` (the pass lifetime, fixed once the
    /// line is drawn) and the sold-out flags of an event of `categories` categories. The
    /// sale's window (closed) is the caller's to fill in.
    pub async fn read(
        &self,
        event: EventId,
        user: u64,
        ttl_ms: i64,
        categories: usize,
    ) -> anyhow::Result<(Room, Option<Place>)> {
        let now_ms = chrono::Utc::now().timestamp_millis();
        type Fields = (Option<u64>, Option<f64>);
        let (fields, position, arrival, steps, flags): (
            Fields,
            Option<u64>,
            Option<u64>,
            Vec<String>,
            Vec<String>,
        ) = redis::pipe()
            .hget(self.keys.room(event), &["served", "rate_now"])
            .zscore(self.keys.room_positions(event), user)
            .zscore(self.keys.room_early(event), user)
            .cmd("ZRANGEBYSCORE")
            .arg(self.keys.room_steps(event))
            .arg(format!("({}", now_ms - ttl_ms - 5_000))
            .arg("+inf")
            .hkeys(self.keys.sold_out(event))
            .query_async(&mut self.redis.clone())
            .await
            .context("Failed to read the waiting room")?;
        let (served, rate) = fields;
        let place = match (position, arrival) {
            (Some(p), _) => Some(Place::At(p)),
            (None, Some(_)) => Some(Place::Undrawn),
            (None, None) => None,
        };
        let room = Room {
            served: served.unwrap_or(0),
            rate: rate.unwrap_or(0.0),
            ttl_ms,
            steps: steps.iter().filter_map(|s| Step::parse(s)).collect(),
            sold_out: all_sold(&flags, categories),
            ..Room::default()
        };
        Ok((room, place))
    }

    /// The room's count of passes settled as used (`room_pass.lua`), read before the
    /// units left so the release can tell the purchases in between.
    pub async fn done_seq(&self, event: EventId) -> anyhow::Result<u64> {
        let n: Option<u64> = redis::cmd("HGET")
            .arg(self.keys.room(event))
            .arg("done_seq")
            .query_async(&mut self.redis.clone())
            .await
            .context("Failed to read the waiting room")?;
        Ok(n.unwrap_or(0))
    }

    /// Adds one checked estimate (`error_ms`: the turn's real time less the estimate).
    pub async fn record_estimate(&self, event: EventId, error_ms: i64) -> anyhow::Result<()> {
        let key = self.keys.room(event);
        redis::pipe()
            .hincr(&key, "eta_checked", 1)
            .ignore()
            .cmd("HINCRBYFLOAT")
            .arg(&key)
            .arg("eta_error_ms_sum")
            .arg(error_ms)
            .ignore()
            .cmd("HINCRBYFLOAT")
            .arg(&key)
            .arg("eta_abs_error_ms_sum")
            .arg(error_ms.abs())
            .ignore()
            .query_async::<()>(&mut self.redis.clone())
            .await
            .context("Failed to record an estimate's error")
    }

    /// The seed once drawn (published at the fairness endpoint).
    pub async fn revealed_seed(&self, event: EventId) -> anyhow::Result<Option<String>> {
        let (drawn, seed): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(self.keys.room(event))
            .arg("drawn")
            .arg("seed")
            .query_async(&mut self.redis.clone())
            .await
            .context("Failed to read the waiting room")?;
        Ok(seed.filter(|_| drawn.as_deref() == Some("1")))
    }

    pub async fn figures(&self, event: EventId) -> anyhow::Result<Figures> {
        type Fields = (
            Option<u64>,
            Option<String>,
            Option<u64>,
            Option<i64>,
            Option<f64>,
            Option<u64>,
            Option<u64>,
        );
        type Eta = (Option<u64>, Option<f64>, Option<f64>);
        let key = self.keys.room(event);
        let ((joined, drawn, served, used, rate_now, out, expired), (checked, sum, abs), placed): (
            Fields,
            Eta,
            u64,
        ) = redis::pipe()
            .hget(
                &key,
                &[
                    "joined", "drawn", "served", "used", "rate_now", "out", "expired",
                ],
            )
            .hget(
                &key,
                &["eta_checked", "eta_error_ms_sum", "eta_abs_error_ms_sum"],
            )
            .zcard(self.keys.room_positions(event))
            .query_async(&mut self.redis.clone())
            .await
            .context("Failed to read the waiting room")?;
        let served = served.unwrap_or(0);
        Ok(Figures {
            joined: joined.unwrap_or(0),
            drawn: drawn.as_deref() == Some("1"),
            served,
            waiting: placed.saturating_sub(served),
            passes_out: out.unwrap_or(0),
            passes_used: used.unwrap_or(0).max(0) as u64,
            passes_expired: expired.unwrap_or(0),
            rate_now: rate_now.unwrap_or(0.0),
            eta_checked: checked.unwrap_or(0),
            eta_mean_error_s: checked
                .filter(|n| *n > 0)
                .map(|n| sum.unwrap_or(0.0) / n as f64 / 1000.0),
            eta_mean_abs_error_s: checked
                .filter(|n| *n > 0)
                .map(|n| abs.unwrap_or(0.0) / n as f64 / 1000.0),
        })
    }
}

/// Whether the sold-out flags (the keys of the event's sold-out hash) cover all its
/// `categories`: a train's journey flags, "<class>:<from>:<to>", aside.
fn all_sold(flags: &[String], categories: usize) -> bool {
    categories > 0 && flags.iter().filter(|f| !f.contains(':')).count() >= categories
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script_codes::assert_mirrored;

    #[test]
    fn the_enums_mirror_their_scripts() {
        assert_mirrored::<Joined>(include_str!("../../../lua/redis/room_join.lua"));
        assert_mirrored::<Draw>(include_str!("../../../lua/redis/room_draw.lua"));
        assert_mirrored::<PassUse>(include_str!("../../../lua/redis/room_pass.lua"));
    }
}
