//! The public API (reached through the edge). The purchase endpoints arrive with the
//! hot-path work; for now it answers the health probes.

use http::Method;

use crate::app::AppState;
use crate::health;
use crate::http::{ApiError, Request, Response, segments};

pub async fn route(state: &AppState, req: Request) -> Response {
    let path = req.uri().path().to_owned();
    match (req.method(), segments(&path).as_slice()) {
        (&Method::GET, ["healthz"]) => health::healthz(),
        (&Method::GET, ["readyz"]) => health::readyz(state).await,
        _ => ApiError::NotFound(format!("no such endpoint: {path}")).into_response(),
    }
}
