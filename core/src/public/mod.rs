//! The public API (behind the edge, under `/api/`). Every call but login and the health
//! probes carries a user token; the core verifies it itself, so its own port is no way
//! around the edge.

pub mod answers;
mod events;
mod login;
mod orders;
mod queue;

pub use events::{Availability, SeatMaps};

use std::sync::Arc;

use chrono::Utc;

use crate::domain::ids::canonical_id;
use crate::health;
use crate::http::{ApiError, Request, Response, allowed, bearer, segments};
use crate::state::AppState;

/// Every endpoint of the public port, each with its one spelling and its one method.
/// Matched by hand on the path's segments rather than with a router crate: the rule is
/// one spelling per path (canonical decimal ids, no empty, `.` or escaped segment, 405
/// with the exact `Allow`), which matchit or axum would not enforce for us — an `{id}`
/// would still need `canonical_id` — and the match is short and checked exhaustively.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Healthz,
    Readyz,
    Login,
    Logout,
    PaymentCallback,
    Events,
    Event(u64),
    Seats(u64),
    Availability(u64),
    Purchase(u64),
    PurchaseStatus(u64),
    Queue(u64),
    QueueChallenge(u64),
    QueueFairness(u64),
    Order(u64),
    Cancel(u64),
    Pay(u64),
}

impl Endpoint {
    /// The endpoint a path names, or `None` (404) for every other spelling.
    fn of(path: &str) -> Option<Endpoint> {
        use Endpoint::*;
        let id = canonical_id;
        Some(match segments(path)?.as_slice() {
            ["healthz"] => Healthz,
            ["readyz"] => Readyz,
            ["api", "login"] => Login,
            ["api", "logout"] => Logout,
            ["api", "payments", "callback"] => PaymentCallback,
            ["api", "events"] => Events,
            ["api", "events", e] => Event(id(e)?),
            ["api", "events", e, "seats"] => Seats(id(e)?),
            ["api", "events", e, "availability"] => Availability(id(e)?),
            ["api", "events", e, "orders"] => Purchase(id(e)?),
            ["api", "events", e, "orders", "status"] => PurchaseStatus(id(e)?),
            ["api", "events", e, "queue"] => Queue(id(e)?),
            ["api", "events", e, "queue", "challenge"] => QueueChallenge(id(e)?),
            ["api", "events", e, "queue", "fairness"] => QueueFairness(id(e)?),
            ["api", "orders", n] => Order(id(n)?),
            ["api", "orders", n, "cancel"] => Cancel(id(n)?),
            ["api", "orders", n, "pay"] => Pay(id(n)?),
            _ => return None,
        })
    }

    /// The method the endpoint takes, as an `Allow` header lists it.
    fn allow(self) -> &'static str {
        use Endpoint::*;
        match self {
            Healthz | Readyz | Events | Event(_) | Seats(_) | Availability(_)
            | PurchaseStatus(_) | QueueChallenge(_) | QueueFairness(_) | Order(_) => "GET",
            Queue(_) => "GET, POST",
            Login | Logout | PaymentCallback | Purchase(_) | Cancel(_) | Pay(_) => "POST",
        }
    }
}

/// The public API (behind the edge) as the server calls it.
pub struct Service(pub Arc<AppState>);

impl crate::http::server::Handler for Service {
    async fn handle(self: Arc<Self>, req: Request) -> Response {
        self.0.counted("public", route(&self.0, req).await)
    }
}

pub async fn route(state: &AppState, req: Request) -> Response {
    use Endpoint::*;
    let path = req.uri().path();
    let Some(endpoint) = Endpoint::of(path) else {
        return not_found(path).into_response();
    };
    if let Err(e) = allowed(endpoint.allow(), req.method()) {
        return e.into_response();
    }
    let outcome = match endpoint {
        Healthz => return health::healthz(),
        Readyz => return health::readyz(state).await,
        Login => login::login(state, req).await,
        PaymentCallback => orders::payment_callback(state, req).await,
        _ => match user(state, &req) {
            Ok(user_id) => match endpoint {
                Logout => login::logout(state, user_id).await,
                Events => events::list(state).await,
                Event(id) => events::one(state, id).await,
                Seats(id) => events::seats(state, id, &req).await,
                Availability(id) => events::availability(state, id, &req).await,
                Purchase(id) => orders::create(state, id, user_id, req).await,
                PurchaseStatus(id) => orders::status(state, id, user_id, &req).await,
                Queue(id) => queue::queue(state, id, user_id, req).await,
                QueueChallenge(id) => queue::challenge(state, id).await,
                QueueFairness(id) => queue::fairness(state, id).await,
                Order(no) => orders::order(state, no, user_id).await,
                Cancel(no) => orders::cancel(state, no, user_id).await,
                Pay(no) => orders::pay(state, no, user_id).await,
                Healthz | Readyz | Login | PaymentCallback => unreachable!("answered above"),
            },
            Err(e) => Err(e),
        },
    };
    outcome.unwrap_or_else(ApiError::into_response)
}

/// The user of a valid, unexpired bearer token that was not signed out.
fn user(state: &AppState, req: &Request) -> Result<u64, ApiError> {
    let token = bearer(req).ok_or_else(|| ApiError::Unauthorized("missing bearer token".into()))?;
    let (user, expires) = state
        .tokens
        .verify_expiring(token, Utc::now().timestamp())
        .map_err(|e| ApiError::Unauthorized(e.to_string()))?;
    if state.revoked.voids(user, expires) {
        return Err(ApiError::Unauthorized("token signed out".into()));
    }
    Ok(user)
}

fn not_found(path: &str) -> ApiError {
    ApiError::NotFound(format!("no such endpoint: {path}"))
}

#[cfg(test)]
mod tests {
    use super::Endpoint::{self, *};

    #[test]
    fn each_endpoint_has_one_spelling() {
        assert_eq!(Endpoint::of("/api/events/1/orders"), Some(Purchase(1)));
        assert_eq!(Endpoint::of("/api/login"), Some(Login));
        assert_eq!(Endpoint::of("/api/logout"), Some(Logout));
        for other in [
            "/api/events/1/orders/",
            "/api/events/+1/orders",
            "/api/events/01/orders",
            "/api//events/1/orders",
            "//api/events/1/orders",
            "/api/events/1//orders",
            "/api/events/%31/orders",
            "/api/events/1/orders/.",
            "/api/events/1/./orders",
            "/api/events/2/../1/orders",
            "/api/login/",
            "/api//login",
            "/api/Login",
            "/api/events/18446744073709551616/orders",
            "/api/payments/callback/",
        ] {
            assert_eq!(Endpoint::of(other), None, "{other}");
        }
    }
}
