//! Units moving between an event's pool and its buckets, for events of several buckets
//! (docs/scaling.md "Refill without oversell, without stranded units"). A move is two
//! scripts in two slots: `move_out.lua` takes units out of one place and records the
//! move there; `move_in.lua` credits them where they go once per move id; then the
//! record is deleted. A record older than [`STALE_MOVE`] is replayed by the sweeper, so
//! a core that dies between the steps loses no unit and counts none twice.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;

use crate::admission::replicated::Record;
use crate::domain::{CategoryId, EventId};
use crate::infra::redis::Redis;
use crate::keys::{Bucket, Keys};
use crate::lock::Lock;
use crate::script_codes::ScriptCode;

static MOVE_OUT: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(include_str!("../../lua/redis/move_out.lua")));
static MOVE_IN: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(include_str!("../../lua/redis/move_in.lua")));
static SET_SOLD_OUT: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(include_str!("../../lua/redis/set_sold_out.lua")));

/// A move record older than this is the trace of a core that stopped between the two
/// steps: the sweeper finishes it.
pub const STALE_MOVE: Duration = Duration::from_secs(5);

/// A call of move_out.lua older than this (a retry, by Redis's clock) takes nothing, so
/// it can never take units again under a record the sweeper has finished.
const LATEST_CALL: Duration = Duration::from_millis(2_500);

/// How long one drain may hold its category's lock, before the replica barrier's waits
/// ([`Mover::drain_lock_ttl`]).
const DRAIN_LOCK_TTL: Duration = Duration::from_secs(2);

/// How long a purchase whose bucket ran dry waits for units before SALE_BUSY.
const REFILL_WAIT: Duration = Duration::from_secs(2);

/// How often a refill waiting for another core's drain looks at the pool again.
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// `move_out.lua`'s answer: (units taken, the keys' generation they were taken from);
/// from the pool, -1 flagged sold out, -2 empty; -3 the place is not loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MovedOut(pub i64, pub u64);

/// `move_in.lua`'s answers, one to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credited {
    Now = 1,
    Before = 0,
    Stale = -1,
    NotYet = -2,
}

impl ScriptCode for Credited {
    const SCRIPT: &'static str = "move_in.lua";
    const ALL: &'static [Credited] = &[
        Credited::Now,
        Credited::Before,
        Credited::Stale,
        Credited::NotYet,
    ];

    fn code(self) -> i64 {
        self as i64
    }
}

/// `set_sold_out.lua`'s answers, one to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flagged {
    Set = 1,
    Left = 0,
}

impl ScriptCode for Flagged {
    const SCRIPT: &'static str = "set_sold_out.lua";
    const ALL: &'static [Flagged] = &[Flagged::Set, Flagged::Left];

    fn code(self) -> i64 {
        self as i64
    }
}

/// Where units of an event of several buckets are: its pool or one of its buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Pool(EventId),
    Bucket(Bucket),
}

impl Place {
    fn stock(self, keys: &Keys) -> String {
        match self {
            Place::Pool(e) => keys.pool(e),
            Place::Bucket(b) => keys.stock(b),
        }
    }

    fn moves(self, keys: &Keys) -> String {
        match self {
            Place::Pool(e) => keys.pool_moves(e),
            Place::Bucket(b) => keys.moves(b),
        }
    }

    fn credited(self, keys: &Keys) -> String {
        match self {
            Place::Pool(e) => keys.pool_credited(e),
            Place::Bucket(b) => keys.credited(b),
        }
    }

    /// The bucket whose hash slot the place's keys are in (the pool: the event's own).
    fn slot(self) -> Bucket {
        match self {
            Place::Pool(e) => Bucket::only(e),
            Place::Bucket(b) => b,
        }
    }

    /// The metadata that says the place is loaded, and its generation.
    fn meta(self, keys: &Keys) -> String {
        match self {
            Place::Pool(e) => keys.event_meta(e),
            Place::Bucket(b) => keys.meta(b),
        }
    }

    /// How a move record names its destination.
    fn name(self) -> String {
        match self {
            Place::Pool(_) => "pool".to_owned(),
            Place::Bucket(b) => b.index.to_string(),
        }
    }

    fn parse(event: EventId, count: u16, name: &str) -> Option<Place> {
        if name == "pool" {
            return Some(Place::Pool(event));
        }
        let index: u16 = name.parse().ok()?;
        (index < count).then_some(Place::Bucket(Bucket {
            event,
            index,
            count,
        }))
    }

    /// Every place of an event of `count` buckets: the pool first.
    pub fn all(event: EventId, count: u16) -> impl Iterator<Item = Place> {
        std::iter::once(Place::Pool(event)).chain(Bucket::all(event, count).map(Place::Bucket))
    }
}

/// A recorded move: `<to>|<category>|<units>|<ms>|<epoch>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub id: String,
    pub to: Place,
    pub category: u64,
    pub units: i64,
    pub at_ms: i64,
    /// The generation of the keys the units were taken from.
    pub epoch: u64,
}

impl Move {
    fn parse(event: EventId, count: u16, id: String, record: &str) -> Option<Move> {
        let mut parts = record.split('|');
        let to = Place::parse(event, count, parts.next()?)?;
        let category = parts.next()?.parse().ok()?;
        let units = parts.next()?.parse().ok()?;
        let at_ms = parts.next()?.parse().ok()?;
        let epoch = parts.next()?.parse().ok()?;
        Some(Move {
            id,
            to,
            category,
            units,
            at_ms,
            epoch,
        })
    }
}

/// What a purchase whose bucket had too few units gets from [`Mover::refill`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refill {
    /// Units moved into the bucket: try the purchase again.
    Retry,
    /// Fewer units are left in the whole event than asked for.
    SoldOut,
    /// No unit is left anywhere: the category is flagged sold out for the edge.
    Flagged,
    /// No units came within the wait (drains of others under way): SALE_BUSY.
    Busy,
    /// The whole event had fewer units than asked for in its places, but units of the
    /// category were moving between them: SALE_BUSY, not SOLD_OUT.
    Moving,
}

/// What a drain under the lock found ([`Mover::drain_and_judge`]).
enum Drained {
    /// At least the quantity asked for: the pool has it now.
    Enough,
    /// Fewer, and units of the category are moving between places.
    Moving,
    /// None anywhere, nothing moving: the category is flagged sold out for the edge.
    Flagged,
    /// Fewer, nothing moving: the pool holds what the whole event has.
    Short,
}

/// One refill at a time per (bucket, category) in this process: the purchases that
/// find their bucket dry together wait for the first one's refill and then try their
/// bucket again, instead of each moving a share of the pool (which would empty the pool
/// into one bucket and send the others' buyers to drains).
/// And the categories this process found flagged sold out in the last
/// [`FLAGGED_MEMO`]: a purchase whose bucket is dry is answered SOLD_OUT at once, as the
/// edge answers every one within its refresh, instead of asking the pool again.
#[derive(Default)]
pub struct RefillGates {
    gates: std::sync::Mutex<HashMap<(Bucket, u64), Gate>>,
    flagged: std::sync::Mutex<HashMap<(EventId, u64), tokio::time::Instant>>,
}

/// A refill's turn: held while one refill of a bucket's category runs.
pub type Gate = Arc<tokio::sync::Mutex<()>>;

/// How long a flag this process saw stands for it (about the edge's refresh).
pub const FLAGGED_MEMO: Duration = Duration::from_millis(250);

/// Past this many entries, a map of [`RefillGates`] drops what no one holds (gates) or
/// what has lapsed (flags) before it grows: a core that ran many sales keeps those of
/// the sales running, not one entry for every bucket it ever refilled.
const GATES_KEPT: usize = 1024;

impl RefillGates {
    pub fn gate(&self, bucket: Bucket, category: CategoryId) -> Gate {
        let mut gates = self.gates.lock().expect("refill gates");
        if gates.len() >= GATES_KEPT {
            // Held or waited for: another clone exists. Any other is made again on demand.
            gates.retain(|_, gate| Arc::strong_count(gate) > 1);
        }
        gates.entry((bucket, category.0)).or_default().clone()
    }

    /// Remembers that the category was flagged sold out just now.
    pub fn saw_flag(&self, event: EventId, category: CategoryId) {
        let mut flagged = self.flagged.lock().expect("refill flags");
        if flagged.len() >= GATES_KEPT {
            flagged.retain(|_, at| at.elapsed() < FLAGGED_MEMO);
        }
        flagged.insert((event, category.0), tokio::time::Instant::now());
    }

    /// True when the category was seen flagged within [`FLAGGED_MEMO`].
    pub fn flagged_recently(&self, event: EventId, category: CategoryId) -> bool {
        let flagged = self.flagged.lock().expect("refill flags");
        flagged
            .get(&(event, category.0))
            .is_some_and(|at| at.elapsed() < FLAGGED_MEMO)
    }
}

/// Moves units of one event between its pool and its buckets.
#[derive(Clone)]
pub struct Mover {
    pub redis: Redis,
    pub keys: Keys,
    /// `redis.wait_replicas` > 0: units taken out of a place are credited where they go
    /// only once the replicas of the place they left have the move, and a move's record
    /// is deleted only once the replicas of the place it went to have the credit. None
    /// where the mover only reads.
    pub replicas: Option<Arc<crate::admission::replicated::ReplicaBarrier>>,
}

impl Mover {
    /// Moves units of `category` from `from` to `to`: at least `at_least` (if there
    /// are), at least 1/`share` of what is there (1: everything). Returns the units
    /// moved; from the pool, -1 if the category is flagged sold out and -2 if the pool
    /// is empty.
    pub async fn transfer(
        &self,
        from: Place,
        to: Place,
        category: CategoryId,
        at_least: u32,
        share: u32,
    ) -> anyhow::Result<i64> {
        let mut redis = self.redis.clone();
        let id = format!("{:016x}", rand::random::<u64>());
        let (event, from_pool) = match from {
            Place::Pool(e) => (e, true),
            Place::Bucket(b) => (b.event, false),
        };
        let flags = match from {
            Place::Pool(e) => self.keys.sold_out(e),
            Place::Bucket(b) => self.keys.dry(b),
        };
        let MovedOut(n, epoch) = MOVE_OUT
            .key(from.stock(&self.keys))
            .key(from.moves(&self.keys))
            .key(flags)
            .key(from.meta(&self.keys))
            .arg(category)
            .arg(&id)
            .arg(to.name())
            .arg(Utc::now().timestamp_millis())
            .arg(at_least)
            .arg(share.max(1))
            .arg(if from_pool { "pool" } else { "bucket" })
            .arg(LATEST_CALL.as_millis() as u64)
            .invoke_async(&mut redis)
            .await
            .map(|(n, epoch): (i64, u64)| MovedOut(n, epoch))
            .with_context(|| format!("moving units of event {event} out"))?;
        if n <= 0 {
            return Ok(n);
        }
        self.confirm_taken_out(from, &id).await?;
        self.finish(from, to, category, n, &id, epoch).await?;
        Ok(n)
    }

    /// With `redis.wait_replicas`, that the replicas of the place a move left have its
    /// first step before the units are credited where they go: crediting a move its
    /// master then lost in a failover would count its units twice (back where they were,
    /// and where they went). An error when the round did not find the move's record (its
    /// units are back where they were) or failed (the record, if its master kept it, is
    /// finished by the sweeper once stale, read from whichever master has it then):
    /// never "nothing moved", which a drain would read as units nowhere and answer
    /// SOLD_OUT. A round that timed out goes on on the master's word, as an admission's
    /// does.
    async fn confirm_taken_out(&self, from: Place, id: &str) -> anyhow::Result<()> {
        let record = || Record::move_out(from.moves(&self.keys), id);
        self.confirm(from, record, || {
            format!(
                "move {id} out of {}; nothing credited (the sweeper finishes it if its master kept the record)",
                from.name()
            )
        })
        .await
    }

    /// With `redis.wait_replicas`, that the replicas of the place a move went to have
    /// its credit before its record is deleted: a credit its master then lost in a
    /// failover, with the record gone, would leave the units nowhere (never sold, and
    /// buyers told SOLD_OUT). An error keeps the record, and the sweeper credits the
    /// move again once stale (`move_in.lua` credits a move id once).
    async fn confirm_credited(&self, to: Place, id: &str) -> anyhow::Result<()> {
        let record = || Record::move_in(to.credited(&self.keys), id);
        self.confirm(to, record, || {
            format!(
                "move {id} into {}; its record kept (the sweeper credits it again once stale)",
                to.name()
            )
        })
        .await
    }

    /// A round of the replica barrier on `place`'s slot for `record` (none without
    /// `redis.wait_replicas`); an error says why it is not known to be kept, and `what`.
    async fn confirm(
        &self,
        place: Place,
        record: impl FnOnce() -> Record,
        what: impl FnOnce() -> String,
    ) -> anyhow::Result<()> {
        let Some(replicas) = &self.replicas else {
            return Ok(());
        };
        let kept = replicas.kept(place.slot(), record()).await;
        kept.map_err(|why| anyhow::anyhow!("{}: {why}", what()))
    }

    /// The second step of a move, and the deletion of its record (kept when the
    /// destination is being rebuilt, or its credit is not known to be kept by the
    /// replicas: the sweeper finishes it later). True when the
    /// units are where they go (or void: the destination was rebuilt since).
    async fn finish(
        &self,
        from: Place,
        to: Place,
        category: CategoryId,
        units: i64,
        id: &str,
        epoch: u64,
    ) -> anyhow::Result<bool> {
        let mut redis = self.redis.clone();
        let code: i64 = MOVE_IN
            .key(to.stock(&self.keys))
            .key(to.credited(&self.keys))
            .key(to.meta(&self.keys))
            .arg(category)
            .arg(units)
            .arg(id)
            .arg(epoch)
            .invoke_async(&mut redis)
            .await
            .context("crediting moved units")?;
        match Credited::from_code(code)? {
            Credited::Now | Credited::Before => self.confirm_credited(to, id).await?,
            Credited::Stale => tracing::warn!(
                id,
                units,
                "a move from before a rebuild of the event's keys is void (the rebuild counted its units)"
            ),
            Credited::NotYet => return Ok(false),
        }
        redis::cmd("HDEL")
            .arg(from.moves(&self.keys))
            .arg(id)
            .query_async::<()>(&mut redis)
            .await
            .context("deleting a finished move")?;
        Ok(true)
    }

    /// The buyer's bucket had fewer units of `category` than `quantity`: moves units
    /// into it from the pool; when the pool is empty, drains every bucket into the pool
    /// first (one drain per category at a time; whoever waits for it then takes from
    /// the pool). Sold out when a drain found fewer units than asked for in the whole
    /// event; the edge's flag only when it found none.
    pub async fn refill(
        &self,
        bucket: Bucket,
        category: CategoryId,
        quantity: u32,
    ) -> anyhow::Result<Refill> {
        let event = bucket.event;
        let pool = Place::Pool(event);
        let share = 2 * u32::from(bucket.count);
        let deadline = tokio::time::Instant::now() + REFILL_WAIT;
        loop {
            match self
                .transfer(pool, Place::Bucket(bucket), category, quantity, share)
                .await?
            {
                -1 => return Ok(Refill::Flagged),
                -3 => return Ok(Refill::Busy), // being rebuilt from MySQL
                n if n > 0 => return Ok(Refill::Retry),
                _ => {}
            }
            let mut redis = self.redis.clone();
            let key = self.keys.drain_lock(event, category);
            let ttl = self.drain_lock_ttl(bucket.count);
            if let Some(lock) = Lock::try_acquire(&mut redis, key, ttl).await? {
                // Renewed while it runs: a drain slowed by retries or replica rounds past
                // the lock's life would otherwise be joined by a second one, which finds
                // the buckets emptied by the first's moves under way.
                let drained = lock
                    .renewed_while(
                        &self.redis,
                        ttl,
                        "a drain",
                        self.drain_and_judge(event, bucket.count, category, quantity),
                    )
                    .await;
                lock.release(&mut redis).await?;
                match drained? {
                    Drained::Enough => continue,
                    Drained::Flagged => return Ok(Refill::Flagged),
                    Drained::Moving => return Ok(Refill::Moving),
                    Drained::Short => {}
                }
                // Every bucket had fewer than asked and gave all it had: the pool now
                // holds the whole event (with what an earlier drain left there).
                return Ok(
                    match self
                        .transfer(pool, Place::Bucket(bucket), category, quantity, share)
                        .await?
                    {
                        n if n >= i64::from(quantity) => Refill::Retry,
                        -1 => Refill::Flagged,
                        -3 => Refill::Busy,
                        _ => Refill::SoldOut,
                    },
                );
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(Refill::Busy);
            }
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }

    /// Under the category's drain lock: drains every bucket for `quantity`, then says
    /// whether that was enough; when it was not, whether units of the category are
    /// still between places (a move another purchase or a stopped core left under way,
    /// into the pool or out of it: SOLD_OUT now would turn a buyer away from units about
    /// to land), and when the drain found none, flags the category for the edge if the
    /// pool is still empty. Under the lock, no drain of another core starts moves out of
    /// the buckets between the look and the flag.
    async fn drain_and_judge(
        &self,
        event: EventId,
        count: u16,
        category: CategoryId,
        quantity: u32,
    ) -> anyhow::Result<Drained> {
        let found = self.drain(event, count, category, quantity, 2).await?;
        if found >= i64::from(quantity) {
            return Ok(Drained::Enough);
        }
        if self
            .moving(event, count)
            .await?
            .iter()
            .any(|&(c, _)| c == category.0)
        {
            return Ok(Drained::Moving);
        }
        if found == 0 && self.flag_if_empty(event, category).await? {
            return Ok(Drained::Flagged);
        }
        Ok(Drained::Short)
    }

    /// The drain lock's life: [`DRAIN_LOCK_TTL`], plus with `redis.wait_replicas` the
    /// most a drain of `count` buckets waits for rounds (each move waits on two slots,
    /// the one it left and the one it went to, and on each may wait for the round
    /// already running and then its own, a full `redis.wait_timeout_ms` each while a
    /// replica is down), so a slow drain is never joined by a second one.
    fn drain_lock_ttl(&self, count: u16) -> Duration {
        let waits = self.replicas.as_ref().map_or(Duration::ZERO, |r| {
            r.timeout() * 4 * u32::from(count.max(1))
        });
        DRAIN_LOCK_TTL + waits
    }

    /// For the reconciler: every bucket's units of `category` into the pool, under the
    /// category's drain lock; returns what the pool then holds, or None if buyers'
    /// drains kept the lock.
    pub async fn drain_to_pool(
        &self,
        event: EventId,
        count: u16,
        category: CategoryId,
    ) -> anyhow::Result<Option<i64>> {
        let mut redis = self.redis.clone();
        let key = self.keys.drain_lock(event, category);
        let ttl = self.drain_lock_ttl(count);
        let Some(lock) = Lock::acquire(&mut redis, key, ttl, REFILL_WAIT).await? else {
            return Ok(None);
        };
        let drained = lock
            .renewed_while(
                &self.redis,
                ttl,
                "a drain",
                self.drain(event, count, category, 0, 1),
            )
            .await;
        let pool: redis::RedisResult<Option<i64>> = redis::cmd("HGET")
            .arg(self.keys.pool(event))
            .arg(category)
            .query_async(&mut redis)
            .await;
        lock.release(&mut redis).await?;
        drained?;
        Ok(Some(pool?.unwrap_or(0)))
    }

    /// Moves units of `category` from every bucket into the pool: from each, at least
    /// `at_least` (or all it has, if fewer) and at least 1/`share` of what it has (1:
    /// everything). So a drain finds fewer than `at_least` units only when the whole
    /// event has fewer, and leaves the buckets still selling half of theirs. Returns how
    /// many it moved.
    async fn drain(
        &self,
        event: EventId,
        count: u16,
        category: CategoryId,
        at_least: u32,
        share: u32,
    ) -> anyhow::Result<i64> {
        let mut found = 0;
        for b in Bucket::all(event, count) {
            let moved = self
                .transfer(
                    Place::Bucket(b),
                    Place::Pool(event),
                    category,
                    at_least,
                    share,
                )
                .await?;
            // Not loaded (being rebuilt) or the call too late: what the bucket holds is
            // not known, and counting it as none could tell a buyer SOLD_OUT, and flag
            // the category for the edge, while it holds units.
            anyhow::ensure!(
                moved >= 0,
                "bucket {} of event {event} took no part in a drain (not loaded, or the call came too late)",
                b.index
            );
            found += moved;
        }
        Ok(found)
    }

    /// Sets the edge's sold-out flag if the pool is empty and nothing is moving out of
    /// it. True when set.
    pub async fn flag_if_empty(
        &self,
        event: EventId,
        category: CategoryId,
    ) -> anyhow::Result<bool> {
        let code: i64 = SET_SOLD_OUT
            .key(self.keys.pool(event))
            .key(self.keys.pool_moves(event))
            .key(self.keys.sold_out(event))
            .arg(category)
            .invoke_async(&mut self.redis.clone())
            .await
            .context("flagging a category sold out")?;
        Ok(Flagged::from_code(code)? == Flagged::Set)
    }

    /// Units were given back into a bucket: clears the edge's flag, so buyers of the
    /// other buckets find them (through a drain).
    pub async fn reopen(&self, event: EventId, category: CategoryId) -> anyhow::Result<()> {
        redis::cmd("HDEL")
            .arg(self.keys.sold_out(event))
            .arg(category)
            .query_async::<()>(&mut self.redis.clone())
            .await
            .context("clearing a sold-out flag")
    }

    /// Units available per category: the stock of an event of one bucket; the pool's
    /// and every bucket's for more (units moving between them are left out: a moment).
    pub async fn available(
        &self,
        event: EventId,
        count: u16,
    ) -> anyhow::Result<std::collections::HashMap<u64, i64>> {
        let mut redis = self.redis.clone();
        let mut places: Vec<String> = Bucket::all(event, count)
            .map(|b| self.keys.stock(b))
            .collect();
        if count > 1 {
            places.push(self.keys.pool(event));
        }
        let mut total = std::collections::HashMap::new();
        for key in places {
            let units: std::collections::HashMap<u64, i64> = redis::cmd("HGETALL")
                .arg(key)
                .query_async(&mut redis)
                .await?;
            for (c, n) in units {
                *total.entry(c).or_default() += n;
            }
        }
        Ok(total)
    }

    /// The moves recorded in every place of the event.
    pub async fn recorded(&self, event: EventId, count: u16) -> anyhow::Result<Vec<(Place, Move)>> {
        let mut redis = self.redis.clone();
        let mut all = Vec::new();
        for from in Place::all(event, count) {
            let records: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(from.moves(&self.keys))
                .query_async(&mut redis)
                .await?;
            for (id, record) in records {
                match Move::parse(event, count, id, &record) {
                    Some(m) => all.push((from, m)),
                    None => tracing::error!(%event, record, "unreadable move record"),
                }
            }
        }
        Ok(all)
    }

    /// Units recorded as moving and not yet credited where they go (the books count
    /// them apart from every place). A move of an older generation than its
    /// destination's keys is void (move_in.lua never credits it: the rebuild counted
    /// its units afresh), so it is not counted until the sweeper drops its record.
    pub async fn moving(&self, event: EventId, count: u16) -> anyhow::Result<Vec<(u64, i64)>> {
        let mut redis = self.redis.clone();
        let mut out = Vec::new();
        for (_, m) in self.recorded(event, count).await? {
            let (credited, epoch): (bool, Option<u64>) = redis::pipe()
                .sismember(m.to.credited(&self.keys), &m.id)
                .hget(m.to.meta(&self.keys), "epoch")
                .query_async(&mut redis)
                .await?;
            let void = epoch.is_some_and(|now| now != m.epoch);
            if !credited && !void {
                out.push((m.category, m.units));
            }
        }
        Ok(out)
    }

    /// One pass of the sweeper for an event of several buckets: finishes the moves a
    /// stopped core left ([`STALE_MOVE`]), and clears a sold-out flag while units are
    /// still somewhere (given back after the drain that set it), so the next buyer's
    /// drain finds them. Returns (moves finished, flags cleared).
    pub async fn sweep(&self, event: EventId, count: u16) -> anyhow::Result<(usize, usize)> {
        let now = Utc::now().timestamp_millis();
        let mut finished = 0;
        for (from, m) in self.recorded(event, count).await? {
            if now - m.at_ms >= STALE_MOVE.as_millis() as i64 {
                tracing::warn!(%event, id = m.id, units = m.units, "finishing a move a stopped core left");
                // One move that cannot be finished yet (its credit lost again, a round
                // failed) holds back neither the others nor the flags below.
                match self
                    .finish(from, m.to, CategoryId(m.category), m.units, &m.id, m.epoch)
                    .await
                {
                    Ok(done) => finished += usize::from(done),
                    Err(e) => tracing::warn!(
                        %event,
                        id = m.id,
                        error = format!("{e:#}"),
                        "a move left for the next sweep"
                    ),
                }
            }
        }
        let mut redis = self.redis.clone();
        let flagged: Vec<u64> = redis::cmd("HKEYS")
            .arg(self.keys.sold_out(event))
            .query_async(&mut redis)
            .await?;
        let mut cleared = 0;
        for category in flagged {
            let mut units: i64 = redis::cmd("HGET")
                .arg(self.keys.pool(event))
                .arg(category)
                .query_async::<Option<i64>>(&mut redis)
                .await?
                .unwrap_or(0);
            for b in Bucket::all(event, count) {
                units += redis::cmd("HGET")
                    .arg(self.keys.stock(b))
                    .arg(category)
                    .query_async::<Option<i64>>(&mut redis)
                    .await?
                    .unwrap_or(0);
            }
            if units > 0 {
                tracing::info!(%event, category, units, "units given back after the sold-out flag: reopened");
                self.reopen(event, CategoryId(category)).await?;
                cleared += 1;
            }
        }
        Ok((finished, cleared))
    }
}

/// Every second until `stop`: [`Mover::sweep`] for each event of several buckets with
/// a sale in Redis, and the seat locks due (`admission::seat_lock::settle_expired`). Safe in every core at once (each step is idempotent).
pub async fn run_sweeper(
    mover: Mover,
    events: std::sync::Arc<crate::catalog::EventCache>,
    mut stop: crate::shutdown::Shutdown,
) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait() => return,
        }
        if let Err(e) = sweep_all(&mover, &events).await {
            tracing::warn!(error = format!("{e:#}"), "bucket sweep failed; will retry");
        }
    }
}

/// How often the sweeper looks.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

async fn sweep_all(mover: &Mover, events: &crate::catalog::EventCache) -> anyhow::Result<()> {
    let ids: Vec<u64> = redis::cmd("HKEYS")
        .arg(mover.keys.sales_index())
        .query_async(&mut mover.redis.clone())
        .await?;
    for id in ids {
        let Some(event) = events.shape(id).await? else {
            continue;
        };
        if event.buckets <= 1 {
            continue;
        }
        // One event's or one job's trouble does not keep the others waiting.
        if let Err(e) = mover.sweep(EventId(id), event.buckets).await {
            tracing::warn!(
                event_id = id,
                error = format!("{e:#}"),
                "bucket sweep failed; will retry"
            );
        }
        if event.seated {
            let mut redis = mover.redis.clone();
            let settled = crate::admission::seat_lock::settle_expired(
                &mut redis,
                &mover.keys,
                EventId(id),
                event.buckets,
            )
            .await;
            if let Err(e) = settled {
                tracing::warn!(
                    event_id = id,
                    error = format!("{e:#}"),
                    "seat lock sweep failed; will retry"
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_of_the_scripts_maps_to_one_variant() {
        crate::script_codes::assert_mirrored::<Credited>(include_str!(
            "../../lua/redis/move_in.lua"
        ));
        crate::script_codes::assert_mirrored::<Flagged>(include_str!(
            "../../lua/redis/set_sold_out.lua"
        ));
    }

    #[test]
    fn refill_gates_keep_the_ones_held_and_drop_the_rest_past_their_bound() {
        let gates = RefillGates::default();
        let bucket = |i: u16| Bucket {
            event: EventId(u64::from(i)),
            index: 0,
            count: 2,
        };
        let held = gates.gate(bucket(0), CategoryId(1));
        for i in 1..GATES_KEPT as u16 {
            gates.gate(bucket(i), CategoryId(1));
        }
        assert_eq!(gates.gates.lock().unwrap().len(), GATES_KEPT);
        let again = gates.gate(bucket(GATES_KEPT as u16), CategoryId(1));
        // Only the held gate survived the prune, beside the new one.
        assert_eq!(gates.gates.lock().unwrap().len(), 2);
        assert!(Arc::ptr_eq(&held, &gates.gate(bucket(0), CategoryId(1))));
        drop(again);
    }

    #[test]
    fn move_records_parse_back() {
        let e = EventId(4);
        let m = Move::parse(e, 3, "ab".into(), "2|17|40|1700|4").unwrap();
        assert_eq!(
            m.to,
            Place::Bucket(Bucket {
                event: e,
                index: 2,
                count: 3
            })
        );
        assert_eq!((m.category, m.units, m.at_ms, m.epoch), (17, 40, 1700, 4));
        assert_eq!(
            Move::parse(e, 3, "x".into(), "pool|1|2|3|1").unwrap().to,
            Place::Pool(e)
        );
        for bad in ["3|1|2|3|1", "pool|1|2|3", "|1|2|3|1", "pool|x|2|3|1", ""] {
            assert_eq!(Move::parse(e, 3, "x".into(), bad), None, "{bad}");
        }
        assert_eq!(Place::all(e, 3).count(), 4);
    }
}
