//! The admin API (127.0.0.1:9091): events, publishing, stats, users, load-test tokens,
//! metrics. Every call but the health probes needs `Authorization: Bearer <admin token>`.

mod events;
mod limits;
mod stats;
mod tokens;
mod users;

use std::sync::Arc;

use http::{Method, StatusCode};
use secrecy::ExposeSecret;

use crate::domain::ids::canonical_id;
use crate::health;
use crate::http::{ApiError, Request, Response, allowed, bearer, segments, text};
use crate::state::AppState;

/// Every endpoint of the admin port, each with its one spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Healthz,
    Readyz,
    Metrics,
    Events,
    Event(u64),
    EventAction(u64, Action),
    EventStats(u64),
    WaitingRoom(u64),
    Limits,
    Users,
    RevokeTokens(u64),
    Tokens,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Publish,
    Close,
    Reopen,
    Reconcile,
}

impl Endpoint {
    /// The endpoint a path names, or `None` (404) for every other spelling.
    fn of(path: &str) -> Option<Endpoint> {
        use Endpoint::*;
        let id = canonical_id;
        Some(match segments(path)?.as_slice() {
            ["healthz"] => Healthz,
            ["readyz"] => Readyz,
            ["metrics"] => Metrics,
            ["admin", "events"] => Events,
            ["admin", "events", e] => Event(id(e)?),
            ["admin", "events", e, "stats"] => EventStats(id(e)?),
            ["admin", "events", e, "waiting-room"] => WaitingRoom(id(e)?),
            ["admin", "events", e, action] => {
                let action = match *action {
                    "publish" => Action::Publish,
                    "close" => Action::Close,
                    "reopen" => Action::Reopen,
                    "reconcile" => Action::Reconcile,
                    _ => return None,
                };
                EventAction(id(e)?, action)
            }
            ["admin", "limits"] => Limits,
            ["admin", "users"] => Users,
            ["admin", "users", u, "revoke-tokens"] => RevokeTokens(id(u)?),
            ["admin", "tokens"] => Tokens,
            _ => return None,
        })
    }

    /// The methods the endpoint takes, as an `Allow` header lists them.
    fn allow(self) -> &'static str {
        use Endpoint::*;
        match self {
            Healthz | Readyz | Metrics | Event(_) | EventStats(_) => "GET",
            Events => "GET, POST",
            Limits | WaitingRoom(_) => "GET, PUT",
            EventAction(..) | Users | RevokeTokens(_) | Tokens => "POST",
        }
    }
}

/// The admin API as the server calls it.
pub struct Service(pub Arc<AppState>);

impl crate::http::server::Handler for Service {
    async fn handle(self: Arc<Self>, req: Request) -> Response {
        self.0.counted("admin", route(&self.0, req).await)
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
    match endpoint {
        Healthz => return health::healthz(),
        Readyz => return health::readyz(state).await,
        _ => {}
    }
    let authorized = bearer(&req).is_some_and(|t| {
        use subtle::ConstantTimeEq;
        // Compares in time independent of where the two differ.
        bool::from(
            t.as_bytes()
                .ct_eq(state.config.admin_token.expose_secret().as_bytes()),
        )
    });
    if !authorized {
        return ApiError::Unauthorized("missing or wrong admin token".into()).into_response();
    }
    let limit = state.config.settings.server.max_body_bytes;
    let get = req.method() == Method::GET;
    let outcome = match endpoint {
        Metrics => Ok(text(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            state.metrics.render(),
        )),
        Events if get => events::list(state).await,
        Events => events::create(state, req, limit).await,
        Event(id) => events::get(state, id).await,
        EventAction(id, Action::Publish) => events::publish(state, id).await,
        EventAction(id, Action::Close) => events::close(state, id).await,
        EventAction(id, Action::Reopen) => events::reopen(state, id).await,
        EventAction(id, Action::Reconcile) => stats::reconcile(state, id).await,
        EventStats(id) => stats::event_stats(state, id).await,
        WaitingRoom(id) if get => events::waiting_room(state, id).await,
        WaitingRoom(id) => events::set_waiting_room(state, id, req, limit).await,
        Limits if get => limits::get(state).await,
        Limits => limits::put(state, req, limit).await,
        Users => users::create(state, req, limit).await,
        RevokeTokens(id) => users::revoke_tokens(state, id).await,
        Tokens => tokens::issue(state, req, limit).await,
        Healthz | Readyz => unreachable!("answered above"),
    };
    outcome.unwrap_or_else(ApiError::into_response)
}

fn not_found(path: &str) -> ApiError {
    ApiError::NotFound(format!("no such endpoint: {path}"))
}

#[cfg(test)]
mod tests {
    use super::Action;
    use super::Endpoint::{self, *};

    #[test]
    fn each_endpoint_has_one_spelling() {
        assert_eq!(
            Endpoint::of("/admin/events/3/publish"),
            Some(EventAction(3, Action::Publish))
        );
        assert_eq!(Endpoint::of("/admin/events/3/stats"), Some(EventStats(3)));
        for other in [
            "/admin/events/",
            "/admin//events",
            "/admin/events/+3",
            "/admin/events/03/publish",
            "/admin/events/3/publish/",
            "/admin/events/3/Publish",
            "/metrics/",
            "/admin/limits/",
        ] {
            assert_eq!(Endpoint::of(other), None, "{other}");
        }
    }
}
