//! Order creation (DESIGN.md "Order creation"): a 202 is a promise, and this keeps it.
//!
//! Workers (`worker`) read the events' reservation streams through one consumer group,
//! in batches, and take over entries a dead worker left pending. Per batch (`create`),
//! one RocketMQ transactional message on `stock-sync` (`tx`); its local transaction
//! creates the batch's orders, stock_log and stock_batch rows in MySQL (`persist`).
//! Committed → the purchases become CREATED in Redis and the entries are dropped
//! (`redis`), and one delayed `order-timeout` message, naming the batch's orders, goes
//! out. If the broker cannot take the
//! half message, the orders are created all the same and stock_batch (the outbox) waits
//! for stock sync's sweeper. If MySQL is down, the entries stay in the stream and the
//! worker retries with backoff. What happens to an order after that belongs to
//! `stock_sync` and `lifecycle`.

mod create;
pub mod guards;
pub mod persist;
pub mod redis;
pub mod reservation;
pub mod tx;
mod worker;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::infra::redis::Redis;
use mysql_async::Pool;

use crate::catalog::EventCache;
use crate::config::OrderSettings;
use crate::keys::{Bucket, Keys};
use crate::messaging::MqCell;
use crate::preload::Preloader;

/// Everything the workers share.
pub struct Pipeline {
    pub redis: Redis,
    pub mysql: Pool,
    pub keys: Keys,
    /// The same cache the admission path reads.
    pub events: Arc<EventCache>,
    /// Fences an event whose Redis state went back in time, for a rebuild.
    pub preloader: Preloader,
    pub shards: u32,
    pub settings: OrderSettings,
    /// Names this instance's consumers in the group.
    pub instance: String,
    /// The RocketMQ clients once started; until then, outbox mode.
    pub mq: MqCell,
    /// Why order creation is stuck, if it is (for readiness and stats).
    pub blocked: Mutex<Option<String>>,
    pub orders_created: prometheus::IntCounter,
    pub released: prometheus::IntCounter,
    pub refused: prometheus::IntCounter,
    /// Times Redis was found gone back in time (and the event fenced).
    pub rewinds: prometheus::IntCounter,
    /// Streams found empty, with when this core's workers read each again and the wait
    /// after that (`worker::IDLE_MAX` at most): an idle stream costs Redis a few reads a
    /// second per core whatever the workers, events and buckets; a busy one is read at
    /// once.
    pub idle: Mutex<HashMap<Bucket, (std::time::Instant, std::time::Duration)>>,
    /// One batch of new reservations per bucket at a time in this core.
    pub reading: Turns,
}

impl Pipeline {
    pub fn blocked_reason(&self) -> Option<String> {
        self.blocked.lock().expect("not poisoned").clone()
    }

    fn set_blocked(&self, reason: Option<String>) {
        *self.blocked.lock().expect("not poisoned") = reason;
    }
}

/// Buckets whose new reservations one of this core's workers is reading and creating
/// now. The others leave such a bucket alone until that batch is done, so what comes in
/// meanwhile waits for the next read and goes into one larger batch (one MySQL
/// transaction, one transactional message, one settle and one order-timeout message per
/// batch), while other buckets and events are served in parallel.
#[derive(Default)]
pub struct Turns(Mutex<std::collections::HashSet<Bucket>>);

impl Turns {
    /// The turn at `bucket`, if no one holds it; given back when the turn is dropped.
    pub fn take(&self, bucket: Bucket) -> Option<Turn<'_>> {
        // Made only when taken: a turn dropped here would give back another's.
        let taken = self.0.lock().expect("not poisoned").insert(bucket);
        taken.then(|| Turn {
            turns: self,
            bucket,
        })
    }
}

/// A worker's turn at one bucket's new reservations.
pub struct Turn<'a> {
    turns: &'a Turns,
    bucket: Bucket,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.turns
            .0
            .lock()
            .expect("not poisoned")
            .remove(&self.bucket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::EventId;

    #[test]
    fn one_turn_per_bucket_until_it_is_given_back() {
        let turns = Turns::default();
        let (a, b) = (Bucket::only(EventId(1)), Bucket::only(EventId(2)));
        let first = turns.take(a).expect("a free bucket");
        assert!(
            turns.take(a).is_none(),
            "a second worker at the same bucket"
        );
        assert!(
            turns.take(a).is_none(),
            "a refused turn gives back nobody's"
        );
        let other = turns.take(b).expect("another bucket is served meanwhile");
        drop(first);
        assert!(turns.take(a).is_some(), "given back when dropped");
        drop(other);
    }
}
