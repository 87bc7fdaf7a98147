//! The client calls listeners synchronously on its own runtime. Every MySQL call a
//! listener needs runs as a task on the core's runtime while the listener's thread waits
//! for its answer, so a listener never polls a MySQL connection on a foreign runtime.

use std::future::Future;
use std::sync::Arc;

use rocketmq_client_rust::{
    ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, MessageListenerConcurrently,
};
use rocketmq_model::common::message::MessageTrait;
use rocketmq_model::common::message::message_ext::MessageExt;
use tokio::runtime::Handle;

use super::BatchMessage;
use crate::infra::mysql::CallTimeout;

/// A boxed future answered on the core's runtime.
pub type BoxFuture<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send>>;

/// Applies one delivered batch message; runs on the core's runtime.
pub type ApplyFn = Arc<dyn Fn(BatchMessage) -> BoxFuture<anyhow::Result<()>> + Send + Sync>;

/// Runs `fut` on the core's runtime and waits for it from this (foreign) thread.
pub fn wait_on<F>(core: &Handle, fut: F) -> F::Output
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

/// What an [`ApplyFn`] answers when it is too busy to take a message now (not a
/// failure): the message goes back to the broker for later, logged at debug level only.
#[derive(Debug, thiserror::Error)]
#[error("busy: {0}")]
pub struct Later(pub String);

/// The batch a message carries, if it carries one.
pub fn batch_of(msg: &MessageExt) -> Option<BatchMessage> {
    msg.get_body()
        .and_then(|b| serde_json::from_slice::<BatchMessage>(b).ok())
}

/// What a flow consumes: one topic, one group, one function per message.
pub struct Subscription {
    /// The topic's name under the namespace, e.g. `Names::stock_sync`.
    pub topic: String,
    pub group: String,
    /// Messages handed to the listener at once. A failure hands the whole delivery
    /// back (the client's context cannot acknowledge part of it): a flow whose apply
    /// answers [`Later`] often takes one at a time.
    pub batch_max: u32,
    /// For the logs.
    pub what: &'static str,
    pub apply: ApplyFn,
}

/// Applies each delivered batch message on the core's runtime; a failure asks the
/// broker to deliver it again later.
pub(super) struct BatchListener {
    pub core: Handle,
    /// A message whose MySQL work takes longer is given up and delivered again later.
    pub call_timeout: CallTimeout,
    pub apply: ApplyFn,
    pub what: &'static str,
}

impl MessageListenerConcurrently for BatchListener {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _context: &ConsumeConcurrentlyContext,
    ) -> rocketmq_client_rust::ClientResult<ConsumeConcurrentlyStatus> {
        for msg in msgs {
            let Some(batch) = batch_of(msg) else {
                tracing::error!(what = self.what, "message without a batch; skipped");
                continue;
            };
            let apply = {
                let (limit, apply) = (self.call_timeout.clone(), (self.apply)(batch.clone()));
                let what = self.what;
                async move { limit.try_within(what, apply).await }
            };
            if let Err(e) = wait_on(&self.core, apply) {
                if e.downcast_ref::<Later>().is_some() {
                    tracing::debug!(
                        what = self.what,
                        batch = batch.batch_id,
                        error = format!("{e:#}"),
                        "handed back; redelivery later"
                    );
                } else {
                    tracing::warn!(
                        what = self.what,
                        batch = batch.batch_id,
                        error = format!("{e:#}"),
                        "failed; redelivery later"
                    );
                }
                return Ok(ConsumeConcurrentlyStatus::ReconsumeLater);
            }
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}
