//! Transport: request decoding, JSON answers, the server loop. Handlers live with
//! their flow (`admin/`, later `admission/`); this module never sees Redis or MySQL.

mod error;
pub mod server;

use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use error::ApiError;

pub type Response = http::Response<Full<Bytes>>;
pub type Request = http::Request<hyper::body::Incoming>;

/// A JSON answer with the given status.
pub fn json<T: Serialize + ?Sized>(status: StatusCode, value: &T) -> Response {
    let body = serde_json::to_vec(value).expect("serialising plain data cannot fail");
    let mut resp = http::Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A plain-text answer (Prometheus exposition).
pub fn text(status: StatusCode, content_type: &'static str, body: String) -> Response {
    let mut resp = http::Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// Reads a JSON body of at most `limit` bytes into `T`.
pub async fn read_json<T: DeserializeOwned>(req: Request, limit: usize) -> Result<T, ApiError> {
    let bytes = Limited::new(req.into_body(), limit)
        .collect()
        .await
        .map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                ApiError::PayloadTooLarge(limit)
            } else {
                ApiError::Invalid(format!("could not read the request body: {e}"))
            }
        })?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| ApiError::Invalid(format!("invalid JSON body: {e}")))
}

/// The bearer token of `Authorization`, if any.
pub fn bearer(req: &Request) -> Option<&str> {
    req.headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// Path segments without empty ones: `/admin/events/7` → `["admin","events","7"]`.
pub fn segments(path: &str) -> Vec<&str> {
    path.split('/').filter(|s| !s.is_empty()).collect()
}

/// Parses a numeric id from a path segment, 404 when it is not one.
pub fn path_id(segment: &str) -> Result<u64, ApiError> {
    segment
        .parse()
        .map_err(|_| ApiError::NotFound(format!("no such resource: {segment}")))
}
