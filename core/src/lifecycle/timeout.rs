//! Orders left unpaid past their deadline are cancelled: by the `order-timeout`
//! consumer (one delayed message per batch), and by the overdue sweep, which catches
//! the orders whose message was lost.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use mysql_async::prelude::*;

use super::{Cancelled, Canceller, Lifecycle};
use crate::domain::OrderNo;
use crate::messaging::listener::Later;
use crate::messaging::{BatchMessage, Names, Subscription};
use crate::order_tables::{self, OrderStatus};
use crate::shutdown::Shutdown;

/// How long past its deadline an UNPAID order waits for its message before the sweep
/// cancels it.
const OVERDUE_S: u64 = 30;

/// Orders of one order-timeout message cancelled at once.
const CANCELLING_AT_ONCE: usize = 8;

/// Batches whose orders are being expired at once, past which a delivered message is
/// handed back to the broker for later.
const EXPIRING_AT_ONCE: usize = 64;

/// The `order-timeout` consumer. A message is acknowledged once its batch is handed to
/// a task of the core's runtime, not when the batch is done: a message a little early
/// waits for its orders' deadlines (seconds), and waiting in the listener would hold one
/// of the RocketMQ client's threads for that long — enough early messages at once and
/// the client has none left for anything else. A batch the task fails to finish (an
/// error, a core stopped) is cancelled by the overdue sweep ([`OVERDUE_S`] past the
/// deadline); more than [`EXPIRING_AT_ONCE`] at once go back to the broker. One message
/// per delivery: the listener can only hand a delivery back whole, and a delivery of
/// several handed back for its last message would have its first ones expired again
/// (changing nothing, but in a cancellation wave, when MySQL is busiest).
pub fn consumer(lifecycle: Lifecycle, names: &Names) -> Subscription {
    let lifecycle = Arc::new(lifecycle);
    let expiring = Arc::new(tokio::sync::Semaphore::new(EXPIRING_AT_ONCE));
    Subscription {
        topic: names.order_timeout.clone(),
        group: names.timeout_group.clone(),
        batch_max: 1,
        what: "order timeout",
        apply: Arc::new(move |message: BatchMessage| {
            let (lifecycle, expiring) = (lifecycle.clone(), expiring.clone());
            Box::pin(async move {
                let permit = expiring.try_acquire_owned().map_err(|_| {
                    anyhow::Error::new(Later(format!(
                        "{EXPIRING_AT_ONCE} batches are expiring already"
                    )))
                })?;
                tokio::spawn(async move {
                    let _permit = permit;
                    let batch = message.batch_id.clone();
                    match lifecycle.expire_batch(&message).await {
                        Ok(n) => tracing::debug!(batch, cancelled = n, "order timeout applied"),
                        Err(e) => tracing::warn!(
                            batch,
                            error = format!("{e:#}"),
                            "order timeout failed; the overdue sweep cancels what is left"
                        ),
                    }
                });
                Ok(())
            })
        }),
    }
}

impl Lifecycle {
    /// The `order-timeout` consumer's work: cancel the batch's orders (the message names
    /// them) still unpaid at their deadline. A message a little early waits for the
    /// deadline (delays are precise to about half a second).
    pub async fn expire_batch(&self, message: &BatchMessage) -> anyhow::Result<usize> {
        if message.orders.is_empty() {
            tracing::info!(
                batch = message.batch_id,
                "an order-timeout message without its orders (from an older core): \
                 the overdue sweep cancels them"
            );
        }
        // A batch names up to `orders.batch_size` orders: a few at once, each to its end
        // (none dropped halfway when another fails).
        let expiries: Vec<_> = message.orders.iter().map(|&no| self.expire(no)).collect();
        let outcomes: Vec<anyhow::Result<bool>> = futures_util::stream::iter(expiries)
            .buffer_unordered(CANCELLING_AT_ONCE)
            .collect()
            .await;
        let mut cancelled = 0;
        for outcome in outcomes {
            cancelled += usize::from(outcome?);
        }
        Ok(cancelled)
    }

    /// Cancels one order of an order-timeout message if it is still unpaid at its
    /// deadline, waiting for the deadline when the message came early; whether it did.
    async fn expire(&self, order_no: u64) -> anyhow::Result<bool> {
        for _ in 0..10 {
            let cancel = self.cancel(OrderNo(order_no), Canceller::Deadline);
            match self
                .call_timeout
                .try_within("an order timeout", cancel)
                .await?
            {
                Cancelled::NotDue(o) => {
                    let wait = (o.pay_deadline - chrono::Utc::now())
                        .to_std()
                        .unwrap_or_default();
                    tokio::time::sleep(wait.min(Duration::from_secs(2))).await;
                }
                Cancelled::Now { .. } => return Ok(true),
                Cancelled::NotUnpaid(_) | Cancelled::NotFound => return Ok(false),
            }
        }
        Ok(false)
    }

    /// UNPAID orders past their deadline by `overdue_s`, over every shard.
    pub async fn overdue(&self, overdue_s: u64, limit: u32) -> anyhow::Result<Vec<OrderNo>> {
        let union = order_tables::over_shards(
            self.shards,
            "(SELECT order_no FROM {orders} WHERE status = ? \
             AND pay_deadline < UTC_TIMESTAMP(3) - INTERVAL ? SECOND LIMIT ?)",
        );
        let params = [OrderStatus::Unpaid.into(), overdue_s.into(), limit.into()];
        let found: Vec<u64> = crate::infra::mysql::checkout(&self.mysql)
            .await?
            .exec(
                format!("SELECT order_no FROM ({union}) o LIMIT {limit}"),
                order_tables::per_shard(self.shards, &params),
            )
            .await?;
        Ok(found.into_iter().map(OrderNo).collect())
    }

    /// One pass of the sweep: cancels orders well past their deadline.
    async fn cancel_overdue(&self) {
        let find = self.overdue(OVERDUE_S, 200);
        let orders = match self
            .call_timeout
            .try_within("the overdue sweep", find)
            .await
        {
            Ok(orders) => orders,
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "overdue-order sweep failed");
                return;
            }
        };
        for order_no in orders {
            tracing::warn!(
                %order_no,
                "cancelling an order whose timeout message never came"
            );
            let cancel = self.cancel(order_no, Canceller::Deadline);
            let cancelled = self
                .call_timeout
                .try_within("an overdue cancellation", cancel);
            if let Err(e) = cancelled.await {
                tracing::warn!(
                    %order_no,
                    error = format!("{e:#}"),
                    "overdue cancellation failed"
                );
            }
        }
    }
}

/// The overdue sweep, every 2 s until `stop`.
pub async fn run_overdue_sweep(lifecycle: Lifecycle, mut stop: Shutdown) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = tick.tick() => lifecycle.cancel_overdue().await,
            _ = stop.wait() => return,
        }
    }
}
