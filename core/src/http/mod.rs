//! Transport: request decoding, JSON answers, the error shape, the server loop. The
//! handlers are in `public/` and `admin/`, what each business outcome answers in
//! `public::answers`; this module never sees Redis or MySQL.

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
    json_bytes(status, Bytes::from(body))
}

/// A JSON answer already written (a cached one).
pub fn json_bytes(status: StatusCode, body: Bytes) -> Response {
    let mut resp = http::Response::new(Full::new(body));
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

/// Reads a body of at most `limit` bytes, by the request's [`server::BodyDeadline`].
pub async fn read_body(req: Request, limit: usize) -> Result<Bytes, ApiError> {
    let deadline = req.extensions().get::<server::BodyDeadline>().map(|d| d.0);
    let collect = Limited::new(req.into_body(), limit).collect();
    let collected = match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, collect)
            .await
            .map_err(|_| ApiError::RequestTimeout)?,
        None => collect.await,
    };
    Ok(collected
        .map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                ApiError::PayloadTooLarge(limit)
            } else {
                ApiError::Invalid(format!("could not read the request body: {e}"))
            }
        })?
        .to_bytes())
}

/// Reads a JSON body of at most `limit` bytes into `T`.
pub async fn read_json<T: DeserializeOwned>(req: Request, limit: usize) -> Result<T, ApiError> {
    let bytes = read_body(req, limit).await?;
    from_json(&bytes)
}

/// `T` from JSON text ([`crate::domain::json::parse`]); any fault is 400 INVALID.
pub fn from_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    crate::domain::json::parse(bytes)
        .map_err(|e| ApiError::Invalid(format!("invalid JSON body: {e}")))
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

/// The segments of a path in its one accepted spelling: `/admin/events/7` →
/// `["admin","events","7"]`, `/` → `[]`. Anything else — an empty segment (a doubled or
/// trailing slash), no leading slash — is `None`: every path has exactly one spelling,
/// so no other spelling can reach a handler by a way the edge does not check.
pub fn segments(path: &str) -> Option<Vec<&str>> {
    let rest = path.strip_prefix('/')?;
    if rest.is_empty() {
        return Some(Vec::new());
    }
    let segs: Vec<&str> = rest.split('/').collect();
    (!segs.iter().any(|s| s.is_empty())).then_some(segs)
}

/// A query's parameters as canonical decimal numbers (`?category=3&from=0`), each of
/// `names` at most once and in their order. Anything else — an unknown, repeated or
/// misplaced name, an empty piece (`&&`, a leading or trailing `&`), an empty, signed,
/// zero-padded or escaped value, a number past u64 — is a 400 naming it, so a query too
/// has one spelling (the edge keeps answers by the query as sent).
pub fn query_numbers(
    query: Option<&str>,
    names: &[&'static str],
) -> Result<std::collections::HashMap<&'static str, u64>, ApiError> {
    let mut found = std::collections::HashMap::new();
    let query = query.unwrap_or("");
    let mut next = 0; // names[..next] are behind us
    for pair in query.split('&').filter(|_| !query.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let Some(at) = names.iter().position(|n| *n == name) else {
            return Err(ApiError::Invalid(format!(
                "unknown query parameter {name:?}: this endpoint takes {}, in that order",
                names.join(", ")
            )));
        };
        let known = names[at];
        if at < next && !found.contains_key(known) {
            return Err(ApiError::Invalid(format!(
                "query parameters go in this order: {}",
                names.join(", ")
            )));
        }
        next = at + 1;
        let number = crate::domain::ids::canonical_id(value).ok_or_else(|| {
            ApiError::Invalid(format!("{known} must be a decimal number, not {value:?}"))
        })?;
        if found.insert(known, number).is_some() {
            return Err(ApiError::Invalid(format!("{known} is given twice")));
        }
    }
    Ok(found)
}

/// Whether `method` is one of an endpoint's `allow` ("GET", "GET, PUT"): else 405
/// naming them, the one answer both ports give.
pub fn allowed(allow: &'static str, method: &http::Method) -> Result<(), ApiError> {
    if allow.split(", ").any(|m| m == method.as_str()) {
        Ok(())
    } else {
        Err(ApiError::MethodNotAllowed(allow))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_has_one_spelling() {
        let q = query_numbers(Some("category=3&from=0&to=12"), &["category", "from", "to"])
            .expect("valid");
        assert_eq!((q["category"], q["from"], q["to"]), (3, 0, 12));
        assert!(query_numbers(None, &["from"]).expect("empty").is_empty());
        assert!(
            query_numbers(Some(""), &["from"])
                .expect("empty")
                .is_empty()
        );
        assert_eq!(
            query_numbers(Some("to=2"), &["from", "to"]).expect("valid")["to"],
            2
        );
        for hostile in [
            "from=1&from=2",
            "from=01",
            "from=+1",
            "from=-1",
            "from=",
            "from",
            "from=1.0",
            "from=%31",
            "From=1",
            "other=1",
            "&from=1",
            "from=1&",
            "from=1&&to=2",
            "to=2&from=1",
            "from=18446744073709551616",
        ] {
            assert!(
                query_numbers(Some(hostile), &["from", "to"]).is_err(),
                "{hostile}"
            );
        }
    }

    #[test]
    fn one_spelling_per_path() {
        assert_eq!(segments("/"), Some(vec![]));
        assert_eq!(segments("/api/events/7"), Some(vec!["api", "events", "7"]));
        for other in [
            "",
            "api/events",
            "//api/events",
            "/api//events",
            "/api/events/",
            "/api/events//",
            "/api/events/1/orders/",
        ] {
            assert_eq!(segments(other), None, "{other:?}");
        }
    }

    #[test]
    fn whole_floats_read_as_integers_and_nothing_else_changes() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct T {
            a: u64,
            b: i64,
            c: Vec<u32>,
            d: f64,
        }
        let t: T = from_json(br#"{"a": 2.0, "b": -3e0, "c": [1.0, 7], "d": 1.5}"#).unwrap();
        assert_eq!(
            t,
            T {
                a: 2,
                b: -3,
                c: vec![1, 7],
                d: 1.5
            }
        );
        for bad in [
            &br#"{"a": 2.5, "b": 0, "c": [], "d": 0}"#[..],
            br#"{"a": 1e20, "b": 0, "c": [], "d": 0}"#,
            br#"{"a": -1.0, "b": 0, "c": [], "d": 0}"#,
        ] {
            assert!(
                from_json::<T>(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
