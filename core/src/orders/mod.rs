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
}

impl Pipeline {
    pub fn blocked_reason(&self) -> Option<String> {
        self.blocked.lock().expect("not poisoned").clone()
    }

    fn set_blocked(&self, reason: Option<String>) {
        *self.blocked.lock().expect("not poisoned") = reason;
    }
}
