//! RocketMQ for the order pipeline: a transaction producer for `stock-sync` (its local
//! transaction creates the batch's orders), a plain producer for delayed
//! `order-timeout` messages and the outbox sweeper, and the `stock-sync` consumer.
//!
//! The client owns its runtime and calls listeners synchronously. Every MySQL call a
//! listener needs runs as a task on the core's runtime while the listener's thread waits
//! for its answer, so a listener never polls a MySQL connection on a foreign runtime.
//! Transactional sends run on a small runtime of their own, so a listener waiting there
//! never blocks a thread the core's tasks need.

use std::any::Any;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use cheetah_string::CheetahString;
use rocketmq_client_rust::{
    ClientConfig, ClientRuntime, ClientRuntimeConfig, ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus, DefaultMQProducer, DefaultMQPushConsumer, LocalTransactionState,
    MQPushConsumer, MessageListenerConcurrently, ProducerTopicAdmin, TopicCreateRequest,
    TransactionListener, TransactionMQProducer,
};
use rocketmq_model::common::message::MessageTrait;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};
use serde::{Deserialize, Serialize};
use tokio::runtime::Handle;

use super::persist::PersistError;

/// What a `stock-sync` or `order-timeout` message carries: the batch it is about.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchMessage {
    pub batch_id: String,
    pub event_id: u64,
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

/// Runs `fut` on the core's runtime and waits for it from this (foreign) thread.
fn wait_on<F>(core: &Handle, fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    core.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv()
        .expect("the core's runtime answers every task it is given")
}

/// A boxed future answered on the core's runtime.
pub type BoxFuture<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send>>;
/// `batch_id` → did its local transaction commit? (the check-back's question)
pub type CheckFn = Arc<dyn Fn(String) -> BoxFuture<anyhow::Result<bool>> + Send + Sync>;

/// A batch's local transaction, handed to the listener through the send's argument.
pub struct LocalTx {
    /// Creates the batch's orders; run once, by the listener.
    run: Mutex<Option<BoxFuture<Result<(), PersistError>>>>,
    /// What it answered; None if the listener never ran (the half message failed).
    pub outcome: Mutex<Option<Result<(), PersistError>>>,
}

impl LocalTx {
    pub fn new(
        run: impl Future<Output = Result<(), PersistError>> + Send + 'static,
    ) -> Arc<LocalTx> {
        Arc::new(LocalTx {
            run: Mutex::new(Some(Box::pin(run))),
            outcome: Mutex::new(None),
        })
    }

    pub fn take_outcome(&self) -> Option<Result<(), PersistError>> {
        self.outcome.lock().expect("not poisoned").take()
    }
}

/// Answers the broker: the local transaction's outcome, and check-backs from stock_log.
struct OrdersTxListener {
    core: Handle,
    /// Asked on the core's runtime.
    check: CheckFn,
    grace: Duration,
    inject_unknown: bool,
    checkbacks: prometheus::IntCounterVec,
}

impl TransactionListener for OrdersTxListener {
    fn execute_local_transaction(
        &self,
        _msg: &dyn MessageTrait,
        arg: Option<&(dyn Any + Send + Sync)>,
    ) -> LocalTransactionState {
        let Some(job) = arg.and_then(|a| a.downcast_ref::<Arc<LocalTx>>()) else {
            tracing::error!("transactional send without its local transaction; rolling back");
            return LocalTransactionState::RollbackMessage;
        };
        let Some(run) = job.run.lock().expect("not poisoned").take() else {
            return LocalTransactionState::Unknown;
        };
        let outcome = wait_on(&self.core, run);
        let state = match &outcome {
            Ok(()) if self.inject_unknown => LocalTransactionState::Unknown,
            Ok(()) => LocalTransactionState::CommitMessage,
            Err(PersistError::Unknown(_)) => LocalTransactionState::Unknown,
            Err(
                PersistError::Rejected(_) | PersistError::NotCommitted(_) | PersistError::Stale(_),
            ) => LocalTransactionState::RollbackMessage,
        };
        *job.outcome.lock().expect("not poisoned") = Some(outcome);
        state
    }

    fn check_local_transaction(&self, msg: &MessageExt) -> LocalTransactionState {
        let Some(batch) = msg
            .get_body()
            .and_then(|b| serde_json::from_slice::<BatchMessage>(b).ok())
        else {
            tracing::error!("check-back for a message that is not a batch; rolling back");
            return LocalTransactionState::RollbackMessage;
        };
        let age_ms = chrono::Utc::now().timestamp_millis() - msg.born_timestamp();
        let state = match wait_on(&self.core, (self.check)(batch.batch_id.clone())) {
            Ok(true) => LocalTransactionState::CommitMessage,
            Ok(false) if age_ms > self.grace.as_millis() as i64 => {
                LocalTransactionState::RollbackMessage
            }
            Ok(false) => LocalTransactionState::Unknown,
            Err(e) => {
                tracing::warn!(
                    batch = batch.batch_id,
                    error = format!("{e:#}"),
                    "check-back could not read stock_log"
                );
                LocalTransactionState::Unknown
            }
        };
        let answer = match state {
            LocalTransactionState::CommitMessage => "commit",
            LocalTransactionState::RollbackMessage => "rollback",
            LocalTransactionState::Unknown => "unknown",
        };
        self.checkbacks.with_label_values(&[answer]).inc();
        tracing::info!(
            batch = batch.batch_id,
            answer,
            "answered a transaction check-back"
        );
        state
    }
}

/// Applies one `stock-sync` message; answered on the core's runtime.
type SyncFn = Arc<dyn Fn(BatchMessage) -> BoxFuture<anyhow::Result<()>> + Send + Sync>;

/// Applies each delivered batch message (stock sync, order timeout) on the core's runtime.
struct BatchListener {
    core: Handle,
    apply: SyncFn,
    /// For the logs.
    what: &'static str,
}

impl MessageListenerConcurrently for BatchListener {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _context: &ConsumeConcurrentlyContext,
    ) -> rocketmq_client_rust::ClientResult<ConsumeConcurrentlyStatus> {
        for msg in msgs {
            let Some(batch) = msg
                .get_body()
                .and_then(|b| serde_json::from_slice::<BatchMessage>(b).ok())
            else {
                tracing::error!(what = self.what, "message without a batch; skipped");
                continue;
            };
            if let Err(e) = wait_on(&self.core, (self.apply)(batch.clone())) {
                tracing::warn!(
                    what = self.what,
                    batch = batch.batch_id,
                    error = format!("{e:#}"),
                    "failed; redelivery later"
                );
                return Ok(ConsumeConcurrentlyStatus::ReconsumeLater);
            }
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
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
    consumer: tokio::sync::Mutex<DefaultMQPushConsumer>,
    timeout_consumer: tokio::sync::Mutex<DefaultMQPushConsumer>,
    /// Where transactional sends run (see the module's comment).
    sends: Option<tokio::runtime::Runtime>,
}

pub struct MqSettings {
    pub namesrv: String,
    pub names: Names,
    pub checkback_grace: Duration,
    pub inject_unknown: bool,
    pub send_threads: usize,
    pub checkbacks: prometheus::IntCounterVec,
}

impl Mq {
    /// Starts the producers and the consumer. `check` and `apply` run on the core's runtime.
    pub async fn start(
        settings: MqSettings,
        check: impl Fn(String) -> BoxFuture<anyhow::Result<bool>> + Send + Sync + 'static,
        apply: impl Fn(BatchMessage) -> BoxFuture<anyhow::Result<()>> + Send + Sync + 'static,
        expire: impl Fn(BatchMessage) -> BoxFuture<anyhow::Result<()>> + Send + Sync + 'static,
    ) -> anyhow::Result<Mq> {
        let core = Handle::current();
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
            .transaction_listener(OrdersTxListener {
                core: core.clone(),
                check: Arc::new(check),
                grace: settings.checkback_grace,
                inject_unknown: settings.inject_unknown,
                checkbacks: settings.checkbacks.clone(),
            })
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
        // Create the topics before subscribing, so the consumer finds their routes at once.
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
        let mut consumer = DefaultMQPushConsumer::builder(client.clone())
            .client_config(config())
            .consumer_group(names.sync_group.clone())
            .name_server_addr(settings.namesrv.clone())
            .consume_message_batch_max_size(32)
            .build();
        consumer
            .subscribe(names.stock_sync.as_str(), "*")
            .await
            .map_err(|e| anyhow::anyhow!("subscribe to {}: {e}", names.stock_sync))?;
        consumer.register_message_listener_concurrently(BatchListener {
            core,
            apply: Arc::new(apply),
            what: "stock sync",
        });
        consumer
            .start()
            .await
            .map_err(|e| anyhow::anyhow!("start the stock-sync consumer: {e}"))?;
        let mut timeout_consumer = DefaultMQPushConsumer::builder(client.clone())
            .client_config(config())
            .consumer_group(names.timeout_group.clone())
            .name_server_addr(settings.namesrv.clone())
            .consume_message_batch_max_size(8)
            .build();
        timeout_consumer
            .subscribe(names.order_timeout.as_str(), "*")
            .await
            .map_err(|e| anyhow::anyhow!("subscribe to {}: {e}", names.order_timeout))?;
        timeout_consumer.register_message_listener_concurrently(BatchListener {
            core: Handle::current(),
            apply: Arc::new(expire),
            what: "order timeout",
        });
        timeout_consumer
            .start()
            .await
            .map_err(|e| anyhow::anyhow!("start the order-timeout consumer: {e}"))?;
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
            consumer: tokio::sync::Mutex::new(consumer),
            timeout_consumer: tokio::sync::Mutex::new(timeout_consumer),
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

    /// Sends the batch's half message; the listener runs `job` as the local transaction.
    /// Err means the broker did not take the half message (then `job` may not have run).
    pub async fn send_in_transaction(
        self: &Arc<Self>,
        batch: BatchMessage,
        job: Arc<LocalTx>,
    ) -> anyhow::Result<()> {
        let mq = self.clone();
        self.sends
            .as_ref()
            .expect("present until dropped")
            .spawn(async move {
                let msg = Mq::message(&mq.names.stock_sync, &batch, None);
                let producer = mq.tx_producer.read().await;
                producer
                    .send_message_in_transaction(msg, Some(job))
                    .await
                    .map(drop)
            })
            .await
            .context("the transactional send panicked")?
            .map_err(|e| anyhow::anyhow!("transactional send: {e}"))
    }

    /// A plain `stock-sync` message (the outbox sweeper's).
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

    /// Stops the consumer and the producers; the runtimes go when `Mq` is dropped.
    pub async fn shutdown(&self) {
        self.consumer.lock().await.shutdown().await;
        self.timeout_consumer.lock().await.shutdown().await;
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
