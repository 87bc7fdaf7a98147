//! Purchases: `POST /api/events/{id}/orders` and the status a buyer polls.

use http::StatusCode;
use serde_json::json;

use super::answers;
use crate::domain::{EventId, OrderNo, UserId};
use crate::http::{ApiError, Request, Response, json, read_body, read_json};
use crate::lifecycle::{Canceller, OrderView};
use crate::order_tables::OrderStatus;
use crate::state::AppState;

/// The header a purchase carries its queue pass in (docs/waiting-room.md).
const QUEUE_PASS: &str = "queue-pass";

/// Longest Idempotency-Key accepted.
const MAX_KEY_LEN: usize = 64;

pub async fn create(
    state: &AppState,
    event_id: u64,
    user_id: u64,
    req: Request,
) -> Result<Response, ApiError> {
    let outcome = purchase(state, event_id, user_id, req).await;
    match &outcome {
        Ok(_) => state.metrics.purchases_queued.inc(),
        Err(e) => state
            .metrics
            .purchase_answers
            .with_label_values(&[e.code()])
            .inc(),
    }
    outcome
}

/// The request's Idempotency-Key, if it is one the core takes: 1..=64 visible ASCII
/// characters.
fn idempotency_key(req: &Request) -> Option<String> {
    req.headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| {
            !k.is_empty() && k.len() <= MAX_KEY_LEN && k.bytes().all(|b| b.is_ascii_graphic())
        })
        .map(str::to_owned)
}

async fn purchase(
    state: &AppState,
    event_id: u64,
    user_id: u64,
    req: Request,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&req).ok_or_else(|| {
        ApiError::Invalid(format!(
            "header Idempotency-Key is required: 1..={MAX_KEY_LEN} visible ASCII characters"
        ))
    })?;
    let queue_pass = req
        .headers()
        .get(QUEUE_PASS)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = read_json(req, state.config.settings.server.max_body_bytes).await?;
    // Read once for the waiting room and the admission, which judge the sale window at
    // one moment.
    let event = state.events.get(event_id).await?;
    let now = chrono::Utc::now();
    // An event with a waiting room (or the hidden path) admits purchases with a pass.
    let claim = match &event {
        Some(event) => {
            state
                .room
                .claim(event, user_id, &key, queue_pass.as_deref(), now)
                .await?
        }
        None => None,
    };
    let admitted = state
        .admission
        .admit(EventId(event_id), event, UserId(user_id), &key, body, now)
        .await;
    if let Some(claim) = claim {
        // Not admitted (refused, or Redis never got the purchase): the pass is good for
        // another try. Admitted, or not known: spent (the same request with the same
        // Idempotency-Key then goes on as that purchase: room_pass.lua's SAME).
        let not_admitted = admitted.as_ref().is_err_and(|e| e.nothing_admitted());
        state.room.settle(claim, !not_admitted).await;
    }
    let r = admitted.map_err(|e| answers::purchase_failed(event_id, e))?;
    Ok(json(
        StatusCode::ACCEPTED,
        &Queued {
            request_id: r.request_id.to_string(),
            seats: &r.seats,
            status: "QUEUED",
        },
    ))
}

/// A purchase's 202 (docs/openapi.yaml `Queued`), serialized straight from this
/// struct rather than through a `serde_json::Value` map; fields in the order the
/// answer always had.
#[derive(serde::Serialize)]
struct Queued<'a> {
    request_id: String,
    seats: &'a [String],
    status: &'static str,
}

/// `GET /api/events/{id}/orders/status[?request_id=<n>]`: the caller's latest purchase
/// in the event, or the one numbered `n` (a 202's request id), or (with an
/// `Idempotency-Key` header instead) the one that key admitted.
pub async fn status(
    state: &AppState,
    event_id: u64,
    user_id: u64,
    req: &Request,
) -> Result<Response, ApiError> {
    let asked = crate::http::query_numbers(req.uri().query(), &["request_id"])?;
    // Sent, it must be one the core takes (none is the buyer's latest purchase).
    let key = if req.headers().contains_key("idempotency-key") {
        Some(idempotency_key(req).ok_or_else(|| {
            ApiError::Invalid(format!(
                "header Idempotency-Key must be 1..={MAX_KEY_LEN} visible ASCII characters"
            ))
        })?)
    } else {
        None
    };
    let (event, user) = (EventId(event_id), UserId(user_id));
    let asked = asked.get("request_id").map(|&n| OrderNo(n));
    let request = match key {
        None => asked,
        // Both: the purchase numbered so, if that key admitted it.
        Some(key) => match state.admission.admitted_with_key(event, user, &key).await? {
            Some(n) if asked.is_none_or(|a| a == n) => Some(n),
            _ => {
                return Err(ApiError::NotFound(format!(
                    "no purchase of yours admitted with this Idempotency-Key in event {event_id}{}; \
                     one still on its way is decided by sending it again with the same key",
                    asked.map_or(String::new(), |n| format!(" numbered {n}"))
                )));
            }
        },
    };
    let found = match request {
        Some(n) => state.admission.purchase_status(event, user, n).await?,
        None => state.admission.status_of(event, user).await?,
    };
    match (found, request) {
        (Some(s), _) => Ok(json(StatusCode::OK, &s)),
        (None, Some(n)) => Err(ApiError::NotFound(format!(
            "no purchase {n} of yours in event {event_id}"
        ))),
        (None, None) => Err(ApiError::NotFound(format!(
            "no purchase of yours in event {event_id}"
        ))),
    }
}

/// `GET /api/orders/{order_no}`: the caller's order with its seats; anyone else's is 404.
pub async fn order(state: &AppState, order_no: u64, user_id: u64) -> Result<Response, ApiError> {
    Ok(json(
        StatusCode::OK,
        &own_order(state, order_no, user_id).await?,
    ))
}

/// The caller's order; 404 for anyone else's, as for one that does not exist.
async fn own_order(state: &AppState, order_no: u64, user_id: u64) -> Result<OrderView, ApiError> {
    state
        .lifecycle
        .view(OrderNo(order_no), UserId(user_id))
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no order {order_no} of yours")))
}

/// `POST /api/orders/{order_no}/cancel` by its buyer, while UNPAID.
pub async fn cancel(state: &AppState, order_no: u64, user_id: u64) -> Result<Response, ApiError> {
    let order_no = OrderNo(order_no);
    let outcome = state
        .lifecycle
        .cancel(order_no, Canceller::Owner(UserId(user_id)))
        .await?;
    Ok(json(
        StatusCode::OK,
        &answers::cancelled(order_no, outcome)?,
    ))
}

/// `POST /api/orders/{order_no}/pay`: what the browser needs to pay the provider.
pub async fn pay(state: &AppState, order_no: u64, user_id: u64) -> Result<Response, ApiError> {
    let order = own_order(state, order_no, user_id).await?;
    if order.status != OrderStatus::Unpaid {
        return Err(answers::not_payable(&order));
    }
    // Past its window the order is being cancelled (the timeout's message or the overdue
    // sweep): a payment started now would most likely land on a cancelled order and wait
    // for a refund.
    if order.pay_deadline <= chrono::Utc::now() {
        return Err(answers::window_passed(&order));
    }
    Ok(json(
        StatusCode::OK,
        &json!({
            "order_no": order.order_no, "amount_cents": order.amount_cents, "pay_by": order.pay_deadline,
            "provider": {
                "reference": order.order_no, "callback": "/api/payments/callback",
                "page": state.config.settings.payments.provider_page_url,
            },
        }),
    ))
}

/// `POST /api/payments/callback`, from the provider: signed, not a user's call.
pub async fn payment_callback(state: &AppState, req: Request) -> Result<Response, ApiError> {
    use crate::lifecycle::pay;
    let Some(secret) = &state.config.provider_secret else {
        return Err(ApiError::Unavailable(
            "payments are not configured (payments.provider_secret)".into(),
        ));
    };
    let signature = req
        .headers()
        .get(pay::SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = read_body(req, 16 * 1024).await?;
    use secrecy::ExposeSecret;
    answers::paid(
        state
            .lifecycle
            .pay(
                secret.expose_secret().as_bytes(),
                &body,
                signature.as_deref(),
            )
            .await,
    )
}
