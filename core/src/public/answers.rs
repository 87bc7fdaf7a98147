//! The HTTP answer of every business outcome, in one place: refusals of admission,
//! preload's, the lifecycle's cancellations, payments and callbacks, and the admin
//! API's status changes. `http` knows the error shape; this knows what each outcome
//! means for the client.

use http::StatusCode;
use serde_json::json;

use crate::admission::{AdmissionError, Refusal};
use crate::catalog::EventStatus;
use crate::domain::OrderNo;
use crate::http::{ApiError, Response, json};
use crate::infra::Down;
use crate::lifecycle::pay::{Applied, Refused};
use crate::lifecycle::{Cancelled, OrderView};
use crate::preload::PreloadError;

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        let message = r.to_string();
        match r {
            Refusal::Invalid(m) => ApiError::Invalid(m),
            Refusal::NoSuchEvent(_) => ApiError::NotFound(message),
            Refusal::NotOpen => ApiError::Forbidden("NOT_OPEN", message),
            Refusal::SoldOut => ApiError::Conflict("SOLD_OUT", message),
            Refusal::LimitReached => ApiError::Conflict("LIMIT_REACHED", message),
            Refusal::SeatTaken => ApiError::Conflict("SEAT_TAKEN", message),
            Refusal::KeyReused => ApiError::Conflict("DUPLICATE", message),
            Refusal::RateLimited { retry_after_s } => ApiError::RateLimited { retry_after_s },
            Refusal::Busy | Refusal::Loading => ApiError::Busy(message),
            Refusal::InFlight => ApiError::Pending(message),
        }
    }
}

impl From<AdmissionError> for ApiError {
    fn from(e: AdmissionError) -> Self {
        match e {
            AdmissionError::Refused(refusal) => refusal.into(),
            AdmissionError::Unexpected(e) => e.into(),
            unconfirmed @ AdmissionError::Unconfirmed => {
                ApiError::Unavailable(format!("Redis: {unconfirmed}"))
            }
        }
    }
}

impl From<PreloadError> for ApiError {
    fn from(e: PreloadError) -> Self {
        match e {
            busy @ PreloadError::Busy(_) => ApiError::Unavailable(busy.to_string()),
            PreloadError::Unexpected(e) => e.into(),
        }
    }
}

/// A purchase that was not admitted. When Redis may have run the script and did not
/// answer (a timeout, a connection dropped on the way back), the buyer is told exactly
/// that: OUTCOME_UNKNOWN with where to look, never an error that may be untrue.
pub fn purchase_failed(event_id: u64, e: AdmissionError) -> ApiError {
    match e {
        AdmissionError::Unexpected(e) if Down::of(&e) == Some(Down::Redis { maybe_sent: true }) => {
            tracing::warn!(
                event_id,
                error = format!("{e:#}"),
                "purchase outcome unknown: Redis did not answer"
            );
            outcome_unknown(event_id)
        }
        AdmissionError::Unconfirmed => {
            tracing::warn!(
                event_id,
                "purchase outcome unknown: its Redis master failed over before a replica had it"
            );
            outcome_unknown(event_id)
        }
        other => other.into(),
    }
}

fn outcome_unknown(event_id: u64) -> ApiError {
    ApiError::OutcomeUnknown {
        message: "the purchase was sent but not confirmed in time; the same request with \
                  the same Idempotency-Key tells what became of it, or, without sending it \
                  again, status_url asked with that Idempotency-Key header (without it, \
                  status_url shows your latest admitted purchase in this event)"
            .into(),
        status_url: format!("/api/events/{event_id}/orders/status"),
    }
}

/// Paying an order that is not UNPAID.
pub fn not_payable(order: &OrderView) -> ApiError {
    ApiError::Conflict(
        "NOT_PAYABLE",
        format!("order {} is {}", order.order_no, order.status),
    )
}

/// An unpaid order whose payment window has passed: it is being cancelled.
pub fn window_passed(order: &OrderView) -> ApiError {
    ApiError::Conflict(
        "NOT_PAYABLE",
        format!(
            "order {}'s payment window passed at {}; it is being cancelled",
            order.order_no,
            order
                .pay_deadline
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
    )
}

/// An event status change its current status does not allow (admin API).
pub fn invalid_transition(id: u64, current: EventStatus, to: EventStatus) -> ApiError {
    ApiError::Conflict(
        "INVALID_STATE",
        format!(
            "event {id} is {} and cannot become {}",
            current.as_str(),
            to.as_str()
        ),
    )
}

/// A buyer's cancellation: the order, or why not.
pub fn cancelled(order_no: OrderNo, outcome: Cancelled) -> Result<OrderView, ApiError> {
    match outcome {
        Cancelled::Now { order, .. } => Ok(order),
        Cancelled::NotUnpaid(order) => Err(ApiError::Conflict(
            "NOT_CANCELLABLE",
            format!(
                "order {order_no} is {} and cannot be cancelled",
                order.status
            ),
        )),
        Cancelled::NotFound | Cancelled::NotDue(_) => {
            Err(ApiError::NotFound(format!("no order {order_no} of yours")))
        }
    }
}

/// The provider's callback: what was applied, or why it was refused.
pub fn paid(outcome: Result<(Applied, OrderNo), Refused>) -> Result<Response, ApiError> {
    match outcome {
        Ok((applied, order_no)) => {
            let mut answer = json!({"result": applied.word(), "order_no": order_no.to_string()});
            if let crate::lifecycle::pay::Applied::Duplicate(recorded) = applied {
                answer["recorded"] = json!(recorded);
            }
            Ok(json(StatusCode::OK, &answer))
        }
        Err(Refused::BadSignature) => Err(ApiError::Unauthorized("bad payment signature".into())),
        Err(Refused::Invalid(m)) => Err(ApiError::Invalid(m)),
        Err(e @ Refused::NoSuchOrder(_)) => Err(ApiError::NotFound(e.to_string())),
        Err(e @ Refused::AmountMismatch { .. }) => {
            Err(ApiError::Conflict("AMOUNT_MISMATCH", e.to_string()))
        }
        Err(e @ Refused::NotMarked(_)) => Err(ApiError::Unavailable(e.to_string())),
        Err(Refused::Unexpected(e)) => Err(e.into()),
    }
}
