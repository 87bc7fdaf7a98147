//! The Redis key layout, in one place. Every key of an event carries the hash tag
//! `{ev:<id>}`, so all keys one admission touches live in one Redis Cluster slot.

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

    fn event_key(&self, event_id: u64, suffix: &str) -> String {
        format!("{}{{ev:{event_id}}}:{suffix}", self.prefix)
    }

    /// Hash: what the hot path needs to know about the event (window, status, limits).
    pub fn event_meta(&self, event_id: u64) -> String {
        self.event_key(event_id, "meta")
    }

    /// Hash: category id → units still available.
    pub fn stock(&self, event_id: u64) -> String {
        self.event_key(event_id, "stock")
    }

    /// Hash: category id → 1 once the category is sold out.
    pub fn sold_out(&self, event_id: u64) -> String {
        self.event_key(event_id, "soldout")
    }

    /// Hash: `row:col` → seat state, one per seated category.
    pub fn seats(&self, event_id: u64, category_id: u64) -> String {
        self.event_key(event_id, &format!("seats:{category_id}"))
    }

    /// Hash: row → free seats in that row, so seat picking need not read every seat.
    pub fn row_free(&self, event_id: u64, category_id: u64) -> String {
        self.event_key(event_id, &format!("rowfree:{category_id}"))
    }

    /// Hash: user id → units the user holds in this event (reserved, unpaid or paid).
    pub fn held(&self, event_id: u64) -> String {
        self.event_key(event_id, "held")
    }

    /// Hash: `<user id>:<Idempotency-Key>` → `<request id>|<fingerprint>|<seats>`.
    pub fn idempotency(&self, event_id: u64) -> String {
        self.event_key(event_id, "idem")
    }

    /// Hash: user id → the user's latest purchase: `QUEUED:<request id>`,
    /// `CREATED:<order no>` or `FAILED:<reason>`.
    pub fn purchase_status(&self, event_id: u64) -> String {
        self.event_key(event_id, "status")
    }

    /// Stream: admitted reservations, read by the order workers.
    pub fn order_stream(&self, event_id: u64) -> String {
        self.event_key(event_id, "orders")
    }

    /// Set: order numbers whose units were given back after a cancellation.
    pub fn restocked(&self, event_id: u64) -> String {
        self.event_key(event_id, "restocked")
    }

    /// String: the preload lock, holding its owner's token.
    pub fn preload_lock(&self, event_id: u64) -> String {
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
    pub fn login_failures(&self, username: &str, address: &str) -> String {
        format!(
            "{}login:fail:{}:{}",
            self.prefix,
            hex(username),
            hex(address)
        )
    }

    /// Counter: one account's failed logins from every address, in the failure window.
    pub fn login_failures_all(&self, username: &str) -> String {
        format!("{}login:fail:{}", self.prefix, hex(username))
    }

    /// Hash: event id → `status:sale_start_ms:sale_end_ms`, read by the edge's refresh
    /// timer. Not on the admission path, so it needs no hash tag.
    pub fn sales_index(&self) -> String {
        format!("{}sales", self.prefix)
    }
}

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Seat states as stored in the seat hashes.
pub mod seat_state {
    pub const FREE: &str = "F";
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
    }
}
