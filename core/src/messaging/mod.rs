//! RocketMQ for the flows (DESIGN.md "Order creation", "Stock sync", "Timeout, cancel,
//! pay"): one client runtime, a transaction producer for `stock-sync` (order creation
//! brings its listener), a plain producer for delayed `order-timeout` messages and the
//! outbox, and one push consumer per [`Subscription`] a flow brings. This module knows
//! topics and clients, not what the messages mean.
//!
//! Transactional sends run on a small runtime of their own, so a listener waiting there
//! (see `listener`) never blocks a thread the core's tasks need.

pub mod listener;

use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cheetah_string::CheetahString;
use rocketmq_client_rust::{
    ClientConfig, ClientRuntime, ClientRuntimeConfig, DefaultMQProducer, DefaultMQPushConsumer,
    MQPushConsumer, ProducerTopicAdmin, TopicCreateRequest, TransactionListener,
    TransactionMQProducer,
};
use rocketmq_model::common::message::message_single::Message;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};
use serde::{Deserialize, Serialize};
use tokio::runtime::Handle;
use tokio::sync::OnceCell;

use crate::shutdown::Shutdown;
use listener::BatchListener;
pub use listener::{BoxFuture, Subscription, wait_on};

/// What a `stock-sync` or `order-timeout` message carries: the batch it is about.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchMessage {
    pub batch_id: String,
    pub event_id: u64,
    /// `order-timeout` only: the batch's orders, to be cancelled if still unpaid at their
    /// deadline (MySQL keeps no index of orders by batch). Absent from `stock-sync`
    /// messages, and from timeouts sent by a core before 2026-11-24 (the overdue sweep
    /// cancels those orders).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub orders: Vec<u64>,
}

/// Topic and group names under the configured namespace.
#[derive(Debug, Clone)]
pub struct Names {
    pub stock_sync: String,
    pub order_timeout: String,
    pub tx_group: String,
    pub producer_group: String,
    pub sync_group: String,
    pub timeout_group: String,
}

impl Names {
    pub fn new(namespace: &str) -> Names {
        Names {
            stock_sync: format!("{namespace}stock-sync"),
            order_timeout: format!("{namespace}order-timeout"),
            tx_group: format!("{namespace}stampede-orders-tx"),
            producer_group: format!("{namespace}stampede-orders"),
            sync_group: format!("{namespace}stampede-stock-sync"),
            timeout_group: format!("{namespace}stampede-order-timeout"),
        }
    }
}

/// The started clients, once they have started: shared by the flows that send.
pub type MqCell = Arc<OnceCell<Arc<Mq>>>;

pub struct MqSettings {
    pub namesrv: String,
    pub names: Names,
    /// Threads of the transactional-send runtime (one per order worker, and one).
    pub send_threads: usize,
    /// Bounds each message a consumer applies (`mysql.call_timeout_ms`).
    pub call_timeout: crate::infra::mysql::CallTimeout,
}

/// The started clients.
pub struct Mq {
    pub names: Names,
    owner: Option<RuntimeOwner>,
    client: Arc<ClientRuntime>,
    telemetry: Option<rocketmq_observability::TelemetryRuntimeGuard>,
    /// Sends take `&self` and run concurrently; only shutdown takes the write lock.
    tx_producer: tokio::sync::RwLock<TransactionMQProducer>,
    producer: tokio::sync::RwLock<DefaultMQProducer>,
    consumers: Vec<tokio::sync::Mutex<DefaultMQPushConsumer>>,
    /// Where transactional sends run (see the module's comment).
    sends: Option<tokio::runtime::Runtime>,
}

impl Mq {
    /// Starts the producers, then a consumer per subscription; the subscriptions'
    /// functions and `tx`'s calls run on the core's runtime.
    pub async fn start(
        settings: &MqSettings,
        tx: impl TransactionListener + 'static,
        subscriptions: Vec<Subscription>,
    ) -> anyhow::Result<Mq> {
        let mut config = RuntimeConfig {
            thread_name: "rocketmq-client".into(),
            ..Default::default()
        };
        // Without these the consumer's listener lane fills under load and messages go to
        // retry (shared/notes/rocketmq.md).
        config.blocking_lane_policies.metadata_io.max_queue_depth = 100_000;
        config.blocking_lane_policies.metadata_io.queue_timeout = Duration::from_secs(120);
        let owner = RuntimeOwner::plan(config)
            .map_err(|e| anyhow::anyhow!("RocketMQ runtime config: {e}"))?
            .build()
            .map_err(|e| anyhow::anyhow!("RocketMQ runtime: {e}"))?;
        let telemetry = rocketmq_observability::TelemetryRuntimeGuard::noop();
        let client = ClientRuntime::try_new(
            owner.root_context().component("client"),
            ClientRuntimeConfig::default(),
            telemetry.handle(),
        )
        .map_err(|e| anyhow::anyhow!("RocketMQ client runtime: {e}"))?;
        let names = settings.names.clone();
        // Routes re-read every 10 s (the client's minimum) instead of 30, so a broker back
        // after an outage is found sooner.
        let config = || {
            let mut c = ClientConfig::default();
            c.set_poll_name_server_interval(10_000);
            c
        };
        let mut tx_producer = TransactionMQProducer::builder(client.clone())
            .client_config(config())
            .producer_group(names.tx_group.clone())
            .name_server_addr(settings.namesrv.clone())
            .topics(vec![names.stock_sync.clone()])
            .send_msg_timeout(3_000)
            .transaction_listener(tx)
            .build();
        tx_producer
            .start()
            .await
            .map_err(|e| anyhow::anyhow!("start the transaction producer: {e}"))?;
        let mut producer = DefaultMQProducer::builder(client.clone())
            .client_config(config())
            .producer_group(names.producer_group.clone())
            .name_server_addr(settings.namesrv.clone())
            .build();
        producer
            .start()
            .await
            .map_err(|e| anyhow::anyhow!("start the producer: {e}"))?;
        // Create the topics before subscribing, so the consumers find their routes at once.
        for topic in [&names.stock_sync, &names.order_timeout] {
            let request = TopicCreateRequest {
                key: "TBW102".into(),
                topic: topic.clone(),
                queue_count: 4,
                system_flag: None,
                attributes: Default::default(),
            };
            if let Err(e) = producer.create_topic_request(request).await {
                tracing::warn!(topic, error = %e, "could not create the topic; relying on auto-creation");
            }
        }
        let mut consumers = Vec::new();
        for sub in subscriptions {
            let mut consumer = DefaultMQPushConsumer::builder(client.clone())
                .client_config(config())
                .consumer_group(sub.group.clone())
                .name_server_addr(settings.namesrv.clone())
                .consume_message_batch_max_size(sub.batch_max)
                .build();
            consumer
                .subscribe(sub.topic.as_str(), "*")
                .await
                .map_err(|e| anyhow::anyhow!("subscribe to {}: {e}", sub.topic))?;
            consumer.register_message_listener_concurrently(BatchListener {
                core: Handle::current(),
                call_timeout: settings.call_timeout.clone(),
                apply: sub.apply,
                what: sub.what,
            });
            consumer
                .start()
                .await
                .map_err(|e| anyhow::anyhow!("start the {} consumer: {e}", sub.what))?;
            consumers.push(tokio::sync::Mutex::new(consumer));
        }
        let sends = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(settings.send_threads.max(2))
            .thread_name("stampede-tx-send")
            .enable_all()
            .build()
            .context("Failed to build the transactional-send runtime")?;
        Ok(Mq {
            names,
            owner: Some(owner),
            client,
            telemetry: Some(telemetry),
            tx_producer: tokio::sync::RwLock::new(tx_producer),
            producer: tokio::sync::RwLock::new(producer),
            consumers,
            sends: Some(sends),
        })
    }

    fn message(topic: &str, batch: &BatchMessage, delay: Option<Duration>) -> Message {
        let builder = Message::builder()
            .topic(topic)
            .key(CheetahString::from(batch.batch_id.clone()))
            .body(serde_json::to_vec(batch).expect("plain data"));
        match delay {
            Some(delay) => builder.delay_secs(delay.as_secs().max(1)),
            None => builder,
        }
        .build_unchecked()
    }

    /// Sends the batch's half message on `stock-sync`; the transaction listener gets
    /// `arg` to run the local transaction. Err means the broker did not take the half
    /// message (then the listener may not have run).
    pub async fn send_in_transaction<T: Any + Send + Sync + 'static>(
        self: &Arc<Self>,
        batch: BatchMessage,
        arg: T,
    ) -> anyhow::Result<()> {
        let mq = self.clone();
        self.sends
            .as_ref()
            .expect("present until dropped")
            .spawn(async move {
                let msg = Mq::message(&mq.names.stock_sync, &batch, None);
                let producer = mq.tx_producer.read().await;
                producer
                    .send_message_in_transaction(msg, Some(arg))
                    .await
                    .map(drop)
            })
            .await
            .context("the transactional send panicked")?
            .map_err(|e| anyhow::anyhow!("transactional send: {e}"))
    }

    /// A plain `stock-sync` message (the outbox's).
    pub async fn publish_sync(&self, batch: &BatchMessage) -> anyhow::Result<()> {
        self.publish(Mq::message(&self.names.stock_sync, batch, None))
            .await
    }

    /// The batch's `order-timeout` message, delivered `delay` from now.
    pub async fn publish_timeout(
        &self,
        batch: &BatchMessage,
        delay: Duration,
    ) -> anyhow::Result<()> {
        self.publish(Mq::message(&self.names.order_timeout, batch, Some(delay)))
            .await
    }

    async fn publish(&self, msg: Message) -> anyhow::Result<()> {
        self.producer
            .read()
            .await
            .send_with_timeout(msg, 3_000)
            .await
            .map_err(|e| anyhow::anyhow!("send: {e}"))?;
        Ok(())
    }

    /// Stops the consumers and the producers; the runtimes go when `Mq` is dropped.
    pub async fn shutdown(&self) {
        for consumer in &self.consumers {
            consumer.lock().await.shutdown().await;
        }
        self.tx_producer.write().await.shutdown().await;
        self.producer.write().await.shutdown().await;
        let _ = self.client.shutdown().await;
        if let Some(owner) = &self.owner {
            let _ = owner.shutdown_tasks().await;
        }
    }
}

impl Drop for Mq {
    fn drop(&mut self) {
        // Both own tokio runtimes, which may not be dropped inside async code.
        let (owner, sends, telemetry) =
            (self.owner.take(), self.sends.take(), self.telemetry.take());
        std::thread::spawn(move || {
            if let Some(owner) = owner {
                let _ = owner.shutdown_background();
            }
            if let Some(sends) = sends {
                sends.shutdown_background();
            }
            if let Some(t) = telemetry {
                let _ = t.shutdown();
            }
        });
    }
}

/// Starts the clients with `start`, retrying every few seconds until they start or the
/// core stops, and puts them in `cell`; until then the flows work without the broker
/// (order creation through the outbox, the sweepers in place of the consumers).
pub async fn start_until_stopped<F, Fut>(cell: MqCell, start: F, mut stop: Shutdown)
where
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<Mq>>,
{
    loop {
        match start().await {
            Ok(mq) => {
                let _ = cell.set(Arc::new(mq));
                tracing::info!("RocketMQ clients started");
                return;
            }
            Err(e) => tracing::warn!(
                error = format!("{e:#}"),
                "RocketMQ clients not started; orders go through the outbox meanwhile"
            ),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = stop.wait() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_names_its_orders_and_a_message_without_them_still_reads() {
        let timeout = BatchMessage {
            batch_id: "7-1".into(),
            event_id: 3,
            orders: vec![7, 9],
        };
        let json = serde_json::to_string(&timeout).unwrap();
        assert_eq!(json, r#"{"batch_id":"7-1","event_id":3,"orders":[7,9]}"#);
        let sync = BatchMessage {
            orders: Vec::new(),
            ..timeout
        };
        assert_eq!(
            serde_json::to_string(&sync).unwrap(),
            r#"{"batch_id":"7-1","event_id":3}"#,
            "a stock-sync message as before"
        );
        let older: BatchMessage =
            serde_json::from_str(r#"{"batch_id":"7-1","event_id":3}"#).unwrap();
        assert!(older.orders.is_empty());
    }
}
