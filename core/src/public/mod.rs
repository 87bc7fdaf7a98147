//! The public API (behind the edge, under `/api/`). Every call but login and the health
//! probes carries a user token; the core verifies it itself, so its own port is no way
//! around the edge.

mod events;
mod login;
mod orders;

use chrono::Utc;
use http::Method;

use crate::app::AppState;
use crate::health;
use crate::http::{ApiError, Request, Response, bearer, path_id, segments};

pub async fn route(state: &AppState, req: Request) -> Response {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let segs = segments(&path);
    let outcome = match (&method, segs.as_slice()) {
        (&Method::GET, ["healthz"]) => return health::healthz(),
        (&Method::GET, ["readyz"]) => return health::readyz(state).await,
        (&Method::POST, ["api", "login"]) => login::login(state, req).await,
        (&Method::POST, ["api", "payments", "callback"]) => {
            orders::payment_callback(state, req).await
        }
        (_, ["api", ..]) => match user(state, &req) {
            Ok(user_id) => match (&method, &segs[1..]) {
                (&Method::GET, ["events"]) => events::list(state).await,
                (&Method::GET, ["events", id]) => events::one(state, path_id(id)).await,
                (&Method::GET, ["events", id, "seats"]) => {
                    events::seats(state, path_id(id), &req).await
                }
                (&Method::POST, ["events", id, "orders"]) => {
                    orders::create(state, path_id(id), user_id, req).await
                }
                (&Method::GET, ["orders", no]) => orders::order(state, path_id(no), user_id).await,
                (&Method::POST, ["orders", no, "cancel"]) => {
                    orders::cancel(state, path_id(no), user_id).await
                }
                (&Method::POST, ["orders", no, "pay"]) => {
                    orders::pay(state, path_id(no), user_id).await
                }
                (&Method::GET, ["events", id, "orders", "status"]) => {
                    orders::status(state, path_id(id), user_id).await
                }
                _ => Err(not_found(&path)),
            },
            Err(e) => Err(e),
        },
        _ => Err(not_found(&path)),
    };
    outcome.unwrap_or_else(ApiError::into_response)
}

/// The user of a valid, unexpired bearer token.
fn user(state: &AppState, req: &Request) -> Result<u64, ApiError> {
    let token = bearer(req).ok_or_else(|| ApiError::Unauthorized("missing bearer token".into()))?;
    state
        .tokens
        .verify(token, Utc::now().timestamp())
        .map_err(|e| ApiError::Unauthorized(e.to_string()))
}

fn not_found(path: &str) -> ApiError {
    ApiError::NotFound(format!("no such endpoint: {path}"))
}
