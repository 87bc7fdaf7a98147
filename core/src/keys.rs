//! The Redis key layout, in one place. Every key of an event carries the hash tag
//! `{ev:<id>}`, so all keys one admission touches live in one Redis Cluster slot.
//! The edge reads the few keys it needs through `lua/edge/stampede/keys.lua`, which is
//! generated from this file (a test checks that it is up to date), and the seat states
//! the scripts write are [`SeatState`]'s.

use crate::domain::{CategoryId, EventId, OrderNo, UserId};

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

    fn event_key(&self, event_id: impl Into<EventId>, suffix: &str) -> String {
        format!("{}{{ev:{}}}:{suffix}", self.prefix, event_id.into())
    }

    /// Hash: what the hot path needs to know about the event (window, status, limits).
    pub fn event_meta(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "meta")
    }

    /// Hash: category id → units still available.
    pub fn stock(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "stock")
    }

    /// Hash: category id → 1 once the category is sold out.
    pub fn sold_out(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "soldout")
    }

    /// Hash: `row:col` → seat state, one per seated category.
    pub fn seats(
        &self,
        event_id: impl Into<EventId>,
        category_id: impl Into<CategoryId>,
    ) -> String {
        self.event_key(event_id, &format!("seats:{}", category_id.into()))
    }

    /// Hash: row → free seats in that row, so seat picking need not read every seat.
    pub fn row_free(
        &self,
        event_id: impl Into<EventId>,
        category_id: impl Into<CategoryId>,
    ) -> String {
        self.event_key(event_id, &format!("rowfree:{}", category_id.into()))
    }

    /// Hash: user id → units the user holds in this event (reserved, unpaid or paid).
    pub fn held(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "held")
    }

    /// Hash: `<user id>:<Idempotency-Key>` ([`idempotency_field`]) →
    /// `<request id>|<fingerprint>|<seats>` ([`idempotency_request`]), as reserve.lua
    /// writes them.
    pub fn idempotency(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "idem")
    }

    /// Hash: user id → the user's latest purchase: `QUEUED:<request id>`,
    /// `CREATED:<order no>`, `PAID:<order no>`, `CANCELLED:<order no>` or
    /// `FAILED:<reason>` (parsed by `admission::status::PurchaseStatus`).
    pub fn purchase_status(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "status")
    }

    /// Stream: admitted reservations, read by the order workers.
    pub fn order_stream(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "orders")
    }

    /// Set: order numbers whose units were given back after a cancellation.
    pub fn restocked(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "restocked")
    }

    /// Counter: written by each round of the replica barrier (`redis.wait_replicas`),
    /// so the round's WAIT covers every admission the event's master answered before.
    pub fn replication_barrier(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "replicated")
    }

    /// String: the preload lock, holding its owner's token.
    pub fn preload_lock(&self, event_id: impl Into<EventId>) -> String {
        self.event_key(event_id, "preload-lock")
    }

    /// String: the lease of order-id worker `id`, holding its owner's token.
    pub fn worker_lease(&self, id: u64) -> String {
        format!("{}worker:{id}", self.prefix)
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

    /// Hash: event id → `status:sale_start_ms:sale_end_ms`, read by the edge's refresh
    /// timer. Not on the admission path, so it needs no hash tag.
    pub fn sales_index(&self) -> String {
        format!("{}sales", self.prefix)
    }
}

/// The field of one buyer's Idempotency-Key in [`Keys::idempotency`].
pub fn idempotency_field(user: UserId, key: &str) -> String {
    format!("{user}:{key}")
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
    Locked(OrderNo),
    Sold(OrderNo),
}

impl SeatState {
    pub const FREE: &str = "F";
    pub const LOCKED: &str = "L:";
    pub const SOLD: &str = "S:";

    pub fn encode(self) -> String {
        match self {
            SeatState::Free => SeatState::FREE.to_owned(),
            SeatState::Locked(o) => format!("{}{o}", SeatState::LOCKED),
            SeatState::Sold(o) => format!("{}{o}", SeatState::SOLD),
        }
    }

    pub fn parse(text: &str) -> Option<SeatState> {
        if text == SeatState::FREE {
            return Some(SeatState::Free);
        }
        let number = |rest: &str| rest.parse().ok().map(OrderNo);
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
            SeatState::Locked(_) => SeatState::TAKEN,
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
         return {{\n  sales = \"{}\",\n  edge_limits = \"{}\",\n  sold_out = \"{}\",\n  meta = \"{}\",\n}}\n",
        k.sales_index(),
        k.edge_limits(),
        event(k.sold_out(ID)),
        event(k.event_meta(ID)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_keys_share_one_hash_tag() {
        let k = Keys::new("t:");
        for key in [
            k.event_meta(7),
            k.stock(7),
            k.sold_out(7),
            k.seats(7, 3),
            k.row_free(7, 3),
        ] {
            assert!(key.starts_with("t:{ev:7}:"), "{key}");
        }
        // One account's two failure counters share a slot, whatever the address.
        assert_eq!(
            k.login_failures("ann", "127.0.0.1"),
            "t:login:fail:{616e6e}:3132372e302e302e31"
        );
        assert_eq!(k.login_failures_all("ann"), "t:login:fail:{616e6e}");
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
                &[SeatState::FREE, SeatState::LOCKED][..],
            ),
            (
                "release.lua",
                include_str!("../../lua/redis/release.lua"),
                &[SeatState::FREE, SeatState::LOCKED][..],
            ),
            (
                "restock.lua",
                include_str!("../../lua/redis/restock.lua"),
                &[SeatState::FREE, SeatState::LOCKED][..],
            ),
            (
                "sold.lua",
                include_str!("../../lua/redis/sold.lua"),
                &[SeatState::LOCKED, SeatState::SOLD][..],
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
            for other in ["'L'", "'S'", "'F:'"] {
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
