//! The admin API (127.0.0.1:9091): events, publishing, stats, users, load-test tokens,
//! metrics. Every call but the health probes needs `Authorization: Bearer <admin token>`.

mod events;
mod limits;
mod stats;
mod tokens;
mod users;

use http::{Method, StatusCode};
use secrecy::ExposeSecret;

use crate::app::AppState;
use crate::auth::constant_time_eq;
use crate::health;
use crate::http::{ApiError, Request, Response, bearer, path_id, segments, text};

pub async fn route(state: &AppState, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let segs = segments(&path);
    match (&method, segs.as_slice()) {
        (&Method::GET, ["healthz"]) => return health::healthz(),
        (&Method::GET, ["readyz"]) => return health::readyz(state).await,
        _ => {}
    }
    let authorized = bearer(&req).is_some_and(|t| {
        constant_time_eq(
            t.as_bytes(),
            state.config.admin_token.expose_secret().as_bytes(),
        )
    });
    if !authorized {
        return ApiError::Unauthorized("missing or wrong admin token".into()).into_response();
    }
    let limit = state.config.settings.server.max_body_bytes;
    let outcome = match (&method, segs.as_slice()) {
        (&Method::GET, ["metrics"]) => Ok(text(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            state.metrics.render(),
        )),
        (&Method::POST, ["admin", "events"]) => events::create(state, req, limit).await,
        (&Method::GET, ["admin", "events"]) => events::list(state).await,
        (&Method::GET, ["admin", "events", id]) => match path_id(id) {
            Ok(id) => events::get(state, id).await,
            Err(e) => Err(e),
        },
        (&Method::POST, ["admin", "events", id, action]) => match path_id(id) {
            Ok(id) => match *action {
                "publish" => events::publish(state, id).await,
                "close" => events::close(state, id).await,
                "reopen" => events::reopen(state, id).await,
                "reconcile" => stats::reconcile(state, id).await,
                _ => Err(not_found(&path)),
            },
            Err(e) => Err(e),
        },
        (&Method::GET, ["admin", "events", id, "stats"]) => match path_id(id) {
            Ok(id) => stats::event_stats(state, id).await,
            Err(e) => Err(e),
        },
        (&Method::PUT, ["admin", "limits"]) => limits::put(state, req, limit).await,
        (&Method::GET, ["admin", "limits"]) => limits::get(state).await,
        (&Method::POST, ["admin", "users"]) => users::create(state, req, limit).await,
        (&Method::POST, ["admin", "tokens"]) => tokens::issue(state, req, limit).await,
        _ => Err(not_found(&path)),
    };
    outcome.unwrap_or_else(ApiError::into_response)
}

fn not_found(path: &str) -> ApiError {
    ApiError::NotFound(format!("no such endpoint: {path}"))
}
