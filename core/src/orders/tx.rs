//! The transactional half of order creation: a batch's `stock-sync` half message, whose
//! local transaction creates the batch's orders (`persist::create_orders`), and the
//! answers to the broker's check-backs, read from stock_batch.

use std::any::Any;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mysql_async::Pool;
use rocketmq_client_rust::{LocalTransactionState, TransactionListener};
use rocketmq_model::common::message::MessageTrait;
use rocketmq_model::common::message::message_ext::MessageExt;
use tokio::runtime::Handle;

use super::persist::{self, Created, PersistError};
use crate::infra::mysql::CallTimeout;
use crate::messaging::listener::batch_of;
use crate::messaging::{BoxFuture, wait_on};

/// A batch's local transaction, handed to the listener through the send's argument.
pub struct LocalTx {
    /// Creates the batch's orders; run once, by the listener.
    run: Mutex<Option<BoxFuture<Result<Created, PersistError>>>>,
    /// What it answered; None if the listener never ran (the half message failed).
    pub outcome: Mutex<Option<Result<Created, PersistError>>>,
}

impl LocalTx {
    pub fn new(
        run: impl Future<Output = Result<Created, PersistError>> + Send + 'static,
    ) -> Arc<LocalTx> {
        Arc::new(LocalTx {
            run: Mutex::new(Some(Box::pin(run))),
            outcome: Mutex::new(None),
        })
    }

    pub fn take_outcome(&self) -> Option<Result<Created, PersistError>> {
        self.outcome.lock().expect("not poisoned").take()
    }
}

/// Answers the broker: the local transaction's outcome, and check-backs from stock_batch.
pub struct OrdersTxListener {
    core: Handle,
    mysql: Pool,
    /// Bounds a check-back's read (a local transaction bounds itself: `create_orders`).
    call_timeout: CallTimeout,
    /// A half message older than this whose batch is not in stock_batch is rolled back.
    grace: Duration,
    /// Test-only fault: answer UNKNOWN for committed batches, so the check-back decides.
    checkback_only: bool,
    checkbacks: prometheus::IntCounterVec,
}

impl OrdersTxListener {
    /// On the core's runtime (call it from there).
    pub fn new(
        mysql: Pool,
        call_timeout: CallTimeout,
        grace: Duration,
        checkback_only: bool,
        checkbacks: prometheus::IntCounterVec,
    ) -> OrdersTxListener {
        OrdersTxListener {
            core: Handle::current(),
            mysql,
            call_timeout,
            grace,
            checkback_only,
            checkbacks,
        }
    }
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
            Ok(_) if self.checkback_only => LocalTransactionState::Unknown,
            Ok(_) => LocalTransactionState::CommitMessage,
            Err(PersistError::Unknown(_)) => LocalTransactionState::Unknown,
            Err(
                PersistError::Rejected(_)
                | PersistError::NotCommitted(_)
                | PersistError::ServerRefused(_)
                | PersistError::Stale(_)
                | PersistError::Rewound(_)
                | PersistError::Duplicate(_),
            ) => LocalTransactionState::RollbackMessage,
        };
        *job.outcome.lock().expect("not poisoned") = Some(outcome);
        state
    }

    fn check_local_transaction(&self, msg: &MessageExt) -> LocalTransactionState {
        let Some(batch) = batch_of(msg) else {
            tracing::error!("check-back for a message that is not a batch; rolling back");
            return LocalTransactionState::RollbackMessage;
        };
        let age_ms = chrono::Utc::now().timestamp_millis() - msg.born_timestamp();
        let (mysql, batch_id, limit) = (
            self.mysql.clone(),
            batch.batch_id.clone(),
            self.call_timeout.clone(),
        );
        let committed = async move {
            let read = persist::batch_committed(&mysql, &batch_id);
            limit.try_within("a check-back", read).await
        };
        let state = match wait_on(&self.core, committed) {
            Ok(true) => LocalTransactionState::CommitMessage,
            Ok(false) if age_ms > self.grace.as_millis() as i64 => {
                LocalTransactionState::RollbackMessage
            }
            Ok(false) => LocalTransactionState::Unknown,
            Err(e) => {
                tracing::warn!(
                    batch = batch.batch_id,
                    error = format!("{e:#}"),
                    "check-back could not read stock_batch"
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
