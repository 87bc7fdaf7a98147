//! The Redis key layout, in one place. Every key of an event carries the hash tag
//! `{ev:<id>}`, so all keys one admission touches live in one Redis Cluster slot.
//! The edge reads the few keys it needs through `lua/edge/stampede/keys.lua`, which is
//! generated from this file (a test checks that it is up to date), and the seat states
//! the scripts write are [`SeatState`]'s.

use crate::domain::{CategoryId, EventId, OrderNo, UserId};

// The suffixes of a bucket's keys that reserve.lua takes ([`Keys::admission`]).
const META: &str = "meta";
const STOCK: &str = "stock";
const DRY: &str = "soldout";
const HELD: &str = "held";
const IDEMPOTENCY: &str = "idem";
const STATUS: &str = "status";
const ORDERS: &str = "orders";

/// Builds keys under the configured prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_owned(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `<prefix>{<tag>}:<suffix>`, in one allocation: reserve.lua's keys are built for
    /// every admission.
    fn tagged(&self, tag: &str, suffix: &str) -> String {
        let mut key = String::with_capacity(self.prefix.len() + tag.len() + suffix.len() + 3);
        key.push_str(&self.prefix);
        key.push('{');
        key.push_str(tag);
        key.push_str("}:");
        key.push_str(suffix);
        key
    }

    /// The bucket's keys reserve.lua takes (KEYS[1..7]), from one hash tag: computing a
    /// bucket's tag formats it (and, for an event of several buckets, searches for its
    /// slot range), so once, not once per key.
    pub fn admission(&self, b: Bucket) -> [String; 7] {
        let tag = b.tag();
        [META, STOCK, DRY, HELD, IDEMPOTENCY, STATUS, ORDERS]
            .map(|suffix| self.tagged(&tag, suffix))
    }

    fn event_key(&self, event_id: impl Into<EventId>, suffix: &str) -> String {
        self.tagged(&format!("ev:{}", event_id.into()), suffix)
    }

    /// Hash: the event's settings (window, status, limits, key generation) as the edge
    /// and the core read them. For an event of one bucket it is also that bucket's
    /// [`Keys::meta`].
    pub fn event_meta(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "meta")
    }

    /// Hash: category id → 1 once the category is sold out: the edge's flag. For an
    /// event of one bucket it is that bucket's [`Keys::dry`]; with more, the core sets it
    /// only after the pool and every bucket were found empty (`admission::buckets`).
    pub fn sold_out(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "soldout")
    }

    /// Stream: the `<user>:<event>:<Idempotency-Key>` of purchases an edge let through
    /// whose answer was, or may have been, a 202, each entry one edge's batch (its id in
    /// the field `edge`), written and read by the edges only, so that a retry through
    /// any edge reaches the core (`lua/edge/stampede/admitted.lua`). Entries older than
    /// the edge's `passed_ttl_s` are trimmed at each write; the key expires that long
    /// after its last.
    pub fn passed_keys(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "passed")
    }

    /// Hash: category id → units not yet dealt to any bucket (events of several
    /// buckets only).
    pub fn pool(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "pool")
    }

    /// Hash: move id → `<to>|<category>|<units>|<ms>`, units taken out of the pool and
    /// not yet known to be credited where they go.
    pub fn pool_moves(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "moves")
    }

    /// Set: the move ids the pool has been credited with (each once).
    pub fn pool_credited(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "credited")
    }

    /// String: the lock of one drain of a category's buckets into the pool.
    pub fn drain_lock(
        &self,
        event_id: impl Into<EventId>,
        category_id: impl Into<CategoryId>,
    ) -> String {
        self.event_key(event_id, &format!("drain:{}", category_id.into()))
    }

    /// Hash: the bucket's copy of what reserve.lua reads (status, window, limit,
    /// generation, `buckets`) and its admission counter `seq`.
    pub fn meta(&self, b: Bucket) -> String {
        self.tagged(&b.tag(), META)
    }

    /// Hash: category id → units available in the bucket.
    pub fn stock(&self, b: Bucket) -> String {
        self.tagged(&b.tag(), STOCK)
    }

    /// Hash: category id → 1 once the bucket's stock of it reached 0.
    pub fn dry(&self, b: Bucket) -> String {
        self.tagged(&b.tag(), DRY)
    }

    /// Hash: move id → `<to>|<category>|<units>|<ms>`, units taken out of the bucket
    /// and not yet known to be credited to the pool.
    pub fn moves(&self, b: Bucket) -> String {
        self.tagged(&b.tag(), "moves")
    }

    /// Set: the move ids the bucket has been credited with (each once).
    pub fn credited(&self, b: Bucket) -> String {
        self.tagged(&b.tag(), "credited")
    }

    /// Hash: `row:col` → seat state, one per seated category. A category's seats live in
    /// one slot whatever bucket asks: the bucket's own for an event of one bucket, the
    /// event's (`{ev:<id>}`, with the pool) for more ([`Bucket::seat_home`]).
    pub fn seats(&self, b: Bucket, category_id: impl Into<CategoryId>) -> String {
        self.tagged(
            &b.seat_home().tag(),
            &format!("seats:{}", category_id.into()),
        )
    }

    /// Hash: row → free seats in that row, so seat picking need not read every seat.
    pub fn row_free(&self, b: Bucket, category_id: impl Into<CategoryId>) -> String {
        self.tagged(
            &b.seat_home().tag(),
            &format!("rowfree:{}", category_id.into()),
        )
    }

    /// Hash: `<carriage>:<seat>` → one character per route segment, `1` taken, `0`
    /// free: a train class's seats (`lua/redis/lib/segments.lua`).
    pub fn segments(&self, b: Bucket, category_id: impl Into<CategoryId>) -> String {
        self.tagged(
            &b.seat_home().tag(),
            &format!("segs:{}", category_id.into()),
        )
    }

    /// Hash: category id → changes to a train class's seats so far (a cache of its
    /// availability is exact while this has not moved).
    pub fn segment_versions(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "segver")
    }

    /// Sorted set: request id → Redis time (ms) until which its seats are pending
    /// (`P:<request id>`), taken by `seat_lock.lua` for a purchase whose bucket is not
    /// the seats' slot (events of several buckets); confirmed or freed by the core, or
    /// by the sweeper once the time has passed.
    pub fn seat_locks(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "seatlocks")
    }

    /// Hash: request id → `<category>|<user>|<Redis ms locked>|<seats>|<Idempotency-Key>`
    /// of each pending lock in [`Keys::seat_locks`]: what the sweeper needs to tell whether
    /// the purchase was admitted.
    pub fn seat_lock_records(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "seatlocks:rec")
    }

    /// Hash: user id → units the user holds in this event (reserved, unpaid or paid).
    /// A buyer's units are all in their own bucket.
    pub fn held(&self, b: Bucket) -> String {
        self.tagged(&b.tag(), HELD)
    }

    /// Hash: `<user id>:<Idempotency-Key>` ([`idempotency_field`]) →
    /// `<request id>|<fingerprint>|<seats>` ([`idempotency_request`]), as reserve.lua
    /// writes them.
    pub fn idempotency(&self, b: Bucket) -> String {
        self.tagged(&b.tag(), IDEMPOTENCY)
    }

    /// Hash: user id → the user's latest purchase: `QUEUED:<request id>`,
    /// `CREATED:<order no>`, `PAID:<order no>`, `CANCELLED:<order no>` or
    /// `FAILED:<request id>:<reason>` (parsed by `admission::status::PurchaseStatus`);
    /// and [`replaced_purchase`] → the status of a purchase a newer one replaced as its
    /// buyer's latest while it was queued or failed (QUEUED, dropped once it is an order;
    /// or FAILED, kept with the sale's keys: one per failed purchase so replaced).
    pub fn purchase_status(&self, b: Bucket) -> String {
        self.tagged(&b.tag(), STATUS)
    }

    /// Stream: admitted reservations, read by the order workers; one per bucket.
    pub fn order_stream(&self, b: Bucket) -> String {
        self.tagged(&b.tag(), ORDERS)
    }

    /// Set: order numbers whose units were given back after a cancellation.
    pub fn restocked(&self, b: Bucket) -> String {
        self.tagged(&b.tag(), "restocked")
    }

    /// Counter: written by each round of the replica barrier (`redis.wait_replicas`),
    /// so the round's WAIT covers every admission the bucket's master answered before.
    pub fn replication_barrier(&self, b: Bucket) -> String {
        self.tagged(&b.tag(), "replicated")
    }

    /// String: the preload lock, holding its owner's token.
    pub fn preload_lock(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "preload-lock")
    }

    /// String: the lease of order-id worker `id`, holding its owner's token.
    pub fn worker_lease(&self, id: u64) -> String {
        format!("{}worker:{id}", self.prefix)
    }

    /// Hash: user id → Unix s: that user's tokens expiring at or before it are void
    /// (signed out: `auth::revoked`), read by every core and every edge.
    pub fn revoked_tokens(&self) -> String {
        format!("{}auth:revoked", self.prefix)
    }

    /// Hash: edge limit name → JSON settings, overriding nginx.conf's defaults.
    pub fn edge_limits(&self) -> String {
        format!("{}edge:limits", self.prefix)
    }

    /// Hash `n` (failed logins in a row), `last_ms` (the last one's time): one account's
    /// failed logins from one client address (both hex, so any text makes a plain key).
    /// Tagged by the account, like [`Keys::login_failures_all`], so both are read and
    /// written in one round trip on a Redis Cluster too.
    pub fn login_failures(&self, username: &str, address: &str) -> String {
        format!(
            "{}login:fail:{{{}}}:{}",
            self.prefix,
            hex(username),
            hex(address)
        )
    }

    /// Counter: one account's failed logins from every address, in the failure window.
    pub fn login_failures_all(&self, username: &str) -> String {
        format!("{}login:fail:{{{}}}", self.prefix, hex(username))
    }

    /// Hash: the waiting room's settings (`enabled`, `require_pass`, `opens_ms`,
    /// `start_ms`, `end_ms`, `ttl_ms`, `bits`, `rate`, `commitment`, `gen`) and state
    /// (`joined`, `late`, `early_closed`, `drawn`, `seed` once drawn, `served`, `used`,
    /// `rate_now`, `paused_ms` while the sale is closed), docs/waiting-room.md. Every room
    /// key is in the event's own slot.
    pub fn room(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "room")
    }

    /// Sorted set: user → arrival number, for those who joined before the open.
    pub fn room_early(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "room:early")
    }

    /// Sorted set: user → position in line (after the draw, or joined after the open).
    pub fn room_positions(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "room:pos")
    }

    /// Sorted set: the releases `<from>:<upto>:<ms>` scored by ms.
    pub fn room_steps(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "room:steps")
    }

    /// Hash: pass id → `<user>:<Idempotency-Key>` of the purchase it admitted.
    pub fn room_used(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "room:used")
    }

    /// Sorted set: positions whose pass admitted a purchase.
    pub fn room_used_positions(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "room:usedpos")
    }

    /// String: the lock of the core instance that runs the room's gate.
    pub fn room_gate(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "room:gate")
    }

    /// Hash: event id → `status:sale_start_ms:sale_end_ms`, read by the edge's refresh
    /// timer. Not on the admission path, so it needs no hash tag.
    pub fn sales_index(&self) -> String {
        format!("{}sales", self.prefix)
    }

    /// Every metadata hash of an event: each bucket's, then, for several buckets, the
    /// event's own (the seats' slot; with one bucket it is that bucket's).
    pub fn metas(&self, event: EventId, buckets: u16) -> Vec<String> {
        let mut metas: Vec<String> = Bucket::all(event, buckets).map(|b| self.meta(b)).collect();
        if buckets > 1 {
            metas.push(self.event_meta(event));
        }
        metas
    }

    /// Hash: event id → ms (by the retiring core's clock) when its sale was retired,
    /// until its buyers' records are purged (`reconcile.purge_after_s`). No hash tag.
    pub fn retired_sales(&self) -> String {
        format!("{}retired", self.prefix)
    }

    /// What a purge of a retired sale deletes: per bucket its buyers' records (the
    /// Idempotency-Key records, units held, purchase statuses, the given-back set), its
    /// stream, the moves' records, the replica barrier and its metadata, so the event
    /// reads as not loaded (a reopen or a reconcile rebuilds it all from MySQL); for an
    /// event of several buckets also the event's metadata and the pool's moves and seat
    /// locks; the waiting room's positions, steps and used passes; and the edges'
    /// stream of keys let through. The stock, the seat maps and the sold-out flags stay
    /// (small, and the seat maps still show what was sold); the room's settings, seed
    /// and early joiners too (its fairness stays verifiable). In groups of one hash tag
    /// each, so one UNLINK takes a group even on a cluster: the event's own keys, then
    /// each bucket's.
    pub fn purged_when_retired(&self, event: EventId, buckets: u16) -> Vec<Vec<String>> {
        let mut own = vec![
            self.room_positions(event),
            self.room_steps(event),
            self.room_used(event),
            self.room_used_positions(event),
            self.passed_keys(event),
        ];
        if buckets > 1 {
            own.extend([
                self.event_meta(event),
                self.pool_moves(event),
                self.pool_credited(event),
                self.seat_locks(event),
                self.seat_lock_records(event),
                // The replica barrier's counter of the event's own slot (seat locks,
                // moves out of the pool).
                self.replication_barrier(Bucket::only(event)),
            ]);
        }
        let mut groups = vec![own];
        for b in Bucket::all(event, buckets) {
            groups.push(vec![
                self.idempotency(b),
                self.held(b),
                self.purchase_status(b),
                self.restocked(b),
                self.order_stream(b),
                self.moves(b),
                self.credited(b),
                self.replication_barrier(b),
                self.meta(b),
            ]);
        }
        groups
    }
}

/// One of an event's Redis buckets: the hash tag its buyers' keys live under
/// (docs/scaling.md "Key layout"). An event of one bucket keeps every key under
/// `{ev:<id>}`; with B > 1, bucket k's tag `ev:<id>:b<k>.<n>` is the first n whose slot
/// falls in the k-th of B equal slot ranges, so on a cluster whose masters own equal
/// slot ranges the buckets are dealt over the masters evenly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bucket {
    pub event: EventId,
    pub index: u16,
    pub count: u16,
}

/// Redis Cluster's slot count.
const SLOTS: u32 = 16_384;

impl Bucket {
    /// The bucket of an event that has one.
    pub fn only(event: impl Into<EventId>) -> Bucket {
        Bucket {
            event: event.into(),
            index: 0,
            count: 1,
        }
    }

    /// The buyer's bucket: a multiplicative hash of the whole id (not its low bits,
    /// which carry the order-shard gene), so buckets and order shards are independent.
    pub fn of_buyer(event: impl Into<EventId>, count: u16, user: UserId) -> Bucket {
        let count = count.max(1);
        let mixed = (user.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % u64::from(count);
        Bucket {
            event: event.into(),
            index: mixed as u16,
            count,
        }
    }

    /// Every bucket of an event of `count`.
    pub fn all(event: impl Into<EventId>, count: u16) -> impl Iterator<Item = Bucket> {
        let event = event.into();
        let count = count.max(1);
        (0..count).map(move |index| Bucket {
            event,
            index,
            count,
        })
    }

    /// Where the event's seats are: this bucket for an event of one bucket, else the
    /// event's own slot (that of [`Keys::pool`]).
    pub fn seat_home(self) -> Bucket {
        Bucket::only(self.event)
    }

    /// True when this bucket's keys and its event's seats share a slot (one bucket), so
    /// one script can take units and seats together.
    pub fn holds_seats(self) -> bool {
        self.count <= 1
    }

    /// The hash tag, without braces.
    pub fn tag(self) -> String {
        if self.count <= 1 {
            return format!("ev:{}", self.event);
        }
        let (index, count) = (u32::from(self.index), u32::from(self.count));
        (0u32..)
            .map(|n| format!("ev:{}:b{}.{n}", self.event, self.index))
            .find(|tag| u32::from(slot(tag.as_bytes())) * count / SLOTS == index)
            .expect("some suffix lands in every slot range")
    }
}

/// The Redis Cluster slot of a hash tag: CRC16 (XMODEM) mod 16384.
pub fn slot(tag: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in tag {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS as u16
}

/// The field of one buyer's Idempotency-Key in [`Keys::idempotency`].
pub fn idempotency_field(user: UserId, key: &str) -> String {
    format!("{user}:{key}")
}

/// The field of a replaced purchase's own status in [`Keys::purchase_status`]: its
/// buyer's and its number (never a user id: it starts with a letter).
pub fn replaced_purchase(user: UserId, request: OrderNo) -> String {
    format!("r:{user}:{request}")
}

/// The request id an Idempotency-Key record names (the admission it answered first).
pub fn idempotency_request(record: &str) -> Option<OrderNo> {
    record.split('|').next()?.parse().ok().map(OrderNo)
}

fn hex(text: &str) -> String {
    hex::encode(text)
}

/// A seat's state in its category's seat hash, as every script writes it: `F` free,
/// `L:<order no>` locked by a reservation or an unpaid order, `S:<order no>` sold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeatState {
    Free,
    /// Taken for a purchase whose bucket is in another slot, until it is admitted
    /// (then locked) or not (then free again): `seat_lock.lua`.
    Pending(OrderNo),
    Locked(OrderNo),
    Sold(OrderNo),
}

impl SeatState {
    pub const FREE: &str = "F";
    pub const PENDING: &str = "P:";
    pub const LOCKED: &str = "L:";
    pub const SOLD: &str = "S:";

    pub fn encode(self) -> String {
        match self {
            SeatState::Free => SeatState::FREE.to_owned(),
            SeatState::Pending(o) => format!("{}{o}", SeatState::PENDING),
            SeatState::Locked(o) => format!("{}{o}", SeatState::LOCKED),
            SeatState::Sold(o) => format!("{}{o}", SeatState::SOLD),
        }
    }

    pub fn parse(text: &str) -> Option<SeatState> {
        if text == SeatState::FREE {
            return Some(SeatState::Free);
        }
        let number = |rest: &str| rest.parse().ok().map(OrderNo);
        if let Some(rest) = text.strip_prefix(SeatState::PENDING) {
            return number(rest).map(SeatState::Pending);
        }
        if let Some(rest) = text.strip_prefix(SeatState::LOCKED) {
            return number(rest).map(SeatState::Locked);
        }
        number(text.strip_prefix(SeatState::SOLD)?).map(SeatState::Sold)
    }

    /// The letter the public seat map shows for a seat someone holds but has not paid
    /// for (and for a seat whose state cannot be read: it is not for sale).
    pub const TAKEN: char = 'L';

    /// The letter the public seat map shows: `F`, `L` or `S`.
    pub fn letter(self) -> char {
        match self {
            SeatState::Free => 'F',
            SeatState::Pending(_) | SeatState::Locked(_) => SeatState::TAKEN,
            SeatState::Sold(_) => 'S',
        }
    }
}

/// `lua/edge/stampede/keys.lua`: the keys the edge reads, as this file lays them out.
/// `%s` stands for the event id; the edge puts its configured prefix in front.
pub fn edge_layout() -> String {
    const ID: u64 = 0xE0E0;
    let k = Keys::new("");
    let event = |key: String| key.replace(&ID.to_string(), "%s");
    format!(
        "-- Generated from core/src/keys.rs (keys::edge_layout); do not edit. After a change\n\
         -- there, `STAMPEDE_WRITE_EDGE_LAYOUT=1 cargo test -p stampede-core keys` rewrites it.\n\
         return {{\n  sales = \"{}\",\n  edge_limits = \"{}\",\n  sold_out = \"{}\",\n  meta = \"{}\",\n  segment_versions = \"{}\",\n  room = \"{}\",\n  room_early = \"{}\",\n  room_positions = \"{}\",\n  room_steps = \"{}\",\n  idempotency = \"{}\",\n  passed = \"{}\",\n  revoked_tokens = \"{}\",\n}}\n",
        k.sales_index(),
        k.edge_limits(),
        event(k.sold_out(ID)),
        event(k.event_meta(ID)),
        event(k.segment_versions(ID)),
        event(k.room(ID)),
        event(k.room_early(ID)),
        event(k.room_positions(ID)),
        event(k.room_steps(ID)),
        k.tagged("%s", IDEMPOTENCY),
        event(k.passed_keys(ID)),
        k.revoked_tokens(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_keys_share_one_hash_tag() {
        let k = Keys::new("t:");
        let one = Bucket::only(7);
        for key in [
            k.event_meta(7),
            k.stock(one),
            k.sold_out(7),
            k.seats(one, 3),
            k.row_free(one, 3),
            k.held(one),
            k.order_stream(one),
        ] {
            assert!(key.starts_with("t:{ev:7}:"), "{key}");
        }
        // One bucket is the layout of every event before buckets.
        assert_eq!(k.meta(one), k.event_meta(7));
        assert_eq!(k.dry(one), k.sold_out(7));
        // One account's two failure counters share a slot, whatever the address.
        assert_eq!(
            k.login_failures("ann", "127.0.0.1"),
            "t:login:fail:{616e6e}:3132372e302e302e31"
        );
        assert_eq!(k.login_failures_all("ann"), "t:login:fail:{616e6e}");
    }

    #[test]
    fn each_group_a_purge_deletes_is_one_hash_tag() {
        let k = Keys::new("t:");
        let tag = |key: &str| key[key.find('{').unwrap()..=key.find('}').unwrap()].to_owned();
        let groups = k.purged_when_retired(EventId(7), 3);
        assert_eq!(groups.len(), 4);
        for group in &groups {
            assert!(
                group.iter().all(|key| tag(key) == tag(&group[0])),
                "{group:?}"
            );
        }
        assert_eq!(tag(&groups[0][0]), "{ev:7}");
    }

    #[test]
    fn the_admission_keys_are_the_buckets_own() {
        let k = Keys::new("t:");
        for b in [Bucket::only(7), Bucket::of_buyer(7, 3, UserId(11))] {
            assert_eq!(
                k.admission(b),
                [
                    k.meta(b),
                    k.stock(b),
                    k.dry(b),
                    k.held(b),
                    k.idempotency(b),
                    k.purchase_status(b),
                    k.order_stream(b),
                ]
            );
        }
    }

    #[test]
    fn slots_are_redis_clusters() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
    }

    #[test]
    fn buckets_fall_in_their_own_slot_range_and_buyers_spread() {
        for count in [2u16, 3, 4, 16] {
            for b in Bucket::all(99, count) {
                let tag = b.tag();
                assert!(tag.starts_with(&format!("ev:99:b{}.", b.index)), "{tag}");
                let range = u32::from(slot(tag.as_bytes())) * u32::from(count) / SLOTS;
                assert_eq!(range, u32::from(b.index), "{tag}");
            }
        }
        let mut per_bucket = [0u32; 3];
        for user in 1..=30_000u64 {
            let b = Bucket::of_buyer(5, 3, UserId(user));
            per_bucket[usize::from(b.index)] += 1;
            assert_eq!(b, Bucket::of_buyer(5, 3, UserId(user)));
        }
        for n in per_bucket {
            assert!((9_000..=11_000).contains(&n), "{per_bucket:?}");
        }
        // Users of one order shard (same low 6 bits) still spread over the buckets.
        let mut seen = std::collections::HashSet::new();
        for user in (0..64u64).map(|i| (i << 6) | 5) {
            seen.insert(Bucket::of_buyer(5, 3, UserId(user)).index);
        }
        assert_eq!(seen.len(), 3);
    }

    /// reserve.lua writes the Idempotency-Key field and record these two read.
    #[test]
    fn idempotency_records_are_reserve_luas() {
        let script = include_str!("../../lua/redis/reserve.lua");
        assert!(script.contains("local idem_field = user .. ':' .. key"));
        assert!(script.contains("rid .. '|' .. fingerprint .. '|' .. seat_list"));
        assert_eq!(idempotency_field(UserId(7), "k-1"), "7:k-1");
        assert_eq!(idempotency_request("42|3:1:none:|"), Some(OrderNo(42)));
        assert_eq!(idempotency_request("x|y"), None);
    }

    #[test]
    fn seat_states_round_trip() {
        for s in [
            SeatState::Free,
            SeatState::Pending(OrderNo(12)),
            SeatState::Locked(OrderNo(12)),
            SeatState::Sold(OrderNo(12)),
        ] {
            assert_eq!(SeatState::parse(&s.encode()), Some(s));
        }
        assert_eq!(SeatState::Locked(OrderNo(9)).encode(), "L:9");
        for bad in ["", "X", "L:", "S:x", "F:1"] {
            assert_eq!(SeatState::parse(bad), None, "{bad}");
        }
    }

    /// The scripts write the seat states this file defines, and no others.
    #[test]
    fn the_scripts_write_these_seat_states() {
        let quoted = |s: &str| format!("'{s}'");
        for (name, script, states) in [
            (
                "reserve.lua",
                include_str!("../../lua/redis/reserve.lua"),
                &[SeatState::LOCKED][..],
            ),
            (
                "lib/seat_pick.lua",
                include_str!("../../lua/redis/lib/seat_pick.lua"),
                &[SeatState::FREE][..],
            ),
            (
                "release.lua",
                include_str!("../../lua/redis/release.lua"),
                &[SeatState::LOCKED][..],
            ),
            (
                "restock.lua",
                include_str!("../../lua/redis/restock.lua"),
                &[SeatState::LOCKED][..],
            ),
            (
                // seats_give_back, for release.lua and restock.lua
                "lib/segments.lua",
                include_str!("../../lua/redis/lib/segments.lua"),
                &[SeatState::FREE][..],
            ),
            (
                "sold.lua",
                include_str!("../../lua/redis/sold.lua"),
                &[SeatState::LOCKED, SeatState::SOLD][..],
            ),
            (
                "seat_lock.lua",
                include_str!("../../lua/redis/seat_lock.lua"),
                &[SeatState::PENDING][..],
            ),
            (
                "seat_confirm.lua",
                include_str!("../../lua/redis/seat_confirm.lua"),
                &[SeatState::PENDING, SeatState::LOCKED][..],
            ),
            (
                "seat_free.lua",
                include_str!("../../lua/redis/seat_free.lua"),
                &[SeatState::FREE, SeatState::PENDING, SeatState::LOCKED][..],
            ),
        ] {
            let code: String = script
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n");
            for state in states {
                assert!(code.contains(&quoted(state)), "{name} writes {state}");
            }
            for other in ["'L'", "'S'", "'P'", "'F:'"] {
                assert!(!code.contains(other), "{name} has {other}");
            }
        }
    }

    #[test]
    fn the_edge_reads_the_layout_of_this_file() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lua/edge/stampede/keys.lua");
        let expected = edge_layout();
        if std::env::var_os("STAMPEDE_WRITE_EDGE_LAYOUT").is_some() {
            std::fs::write(&path, &expected).unwrap();
        }
        let actual = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            actual, expected,
            "lua/edge/stampede/keys.lua is out of date: STAMPEDE_WRITE_EDGE_LAYOUT=1 cargo test -p stampede-core keys"
        );
        assert!(
            expected.contains("sold_out = \"{ev:%s}:soldout\""),
            "{expected}"
        );
    }
}
