//! The API boundary's one error type: every failure a handler can return, with its
//! HTTP status and the `{"error":{"code","message"}}` body in one place.

use http::StatusCode;

use super::{Response, json};
use crate::infra::Down;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Input that fails validation; nothing was changed.
    #[error("{0}")]
    Invalid(String),
    /// Missing, malformed, forged or expired credentials (message says which).
    #[error("{0}")]
    Unauthorized(String),
    /// Not allowed now (code, message), e.g. NOT_OPEN outside the sale window.
    #[error("{1}")]
    Forbidden(&'static str, String),
    #[error("{0}")]
    NotFound(String),
    /// The path exists, not with this method; the methods it takes (the `Allow` header).
    #[error("this endpoint takes {0}")]
    MethodNotAllowed(&'static str),
    /// A business outcome that conflicts with the current state (code, message).
    #[error("{1}")]
    Conflict(&'static str, String),
    #[error("request body larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// The client did not send its body in time.
    #[error("the request body did not arrive in time")]
    RequestTimeout,
    #[error("too many requests; retry in {retry_after_s} s")]
    RateLimited { retry_after_s: u64 },
    /// A dependency is down or busy; the client may retry.
    #[error("{0}")]
    Unavailable(String),
    /// The order workers are behind: admission pauses rather than promise too much.
    /// Nothing was admitted (the edge is told so: [`NOTHING_ADMITTED`]).
    #[error("{0}")]
    Busy(String),
    /// Another request of the same purchase (its Idempotency-Key, its pass) is being
    /// decided: SALE_BUSY to the buyer, but that one may be admitted.
    #[error("{0}")]
    Pending(String),
    /// A purchase was sent to Redis and no answer came: it may have been admitted. The
    /// same Idempotency-Key answers what happened, sent again or as a header on
    /// `status_url`.
    #[error("{message}")]
    OutcomeUnknown { message: String, status_url: String },
    #[error(transparent)]
    Unexpected(anyhow::Error),
}

/// Set on the 503 SALE_BUSY that certainly admitted nothing (the backlog full, the sale
/// being reloaded), unlike OUTCOME_UNKNOWN, UNAVAILABLE (the request timeout's may cut a
/// handler off after Redis admitted the purchase) and a twin request's SALE_BUSY (the
/// other may be admitted): the edge remembers a purchase's key after any other 5xx
/// (lua/edge/stampede/access.lua `purchase_answered`).
pub const NOTHING_ADMITTED: &str = "x-stampede-admitted";

impl From<anyhow::Error> for ApiError {
    /// A part down or too slow is 503 naming it, never a 500.
    fn from(e: anyhow::Error) -> Self {
        match Down::of(&e) {
            Some(part) => {
                tracing::warn!(
                    part = part.name(),
                    error = format!("{e:#}"),
                    "answering 503: a part is unavailable"
                );
                ApiError::Unavailable(format!(
                    "{} is unavailable or too slow; try again in a moment",
                    part.name()
                ))
            }
            None => ApiError::Unexpected(e),
        }
    }
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Invalid(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(..) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict(..) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_)
            | ApiError::Busy(_)
            | ApiError::Pending(_)
            | ApiError::OutcomeUnknown { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Unexpected(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Invalid(_) => "INVALID",
            ApiError::Unauthorized(_) => "UNAUTHORIZED",
            ApiError::Forbidden(code, _) => code,
            ApiError::NotFound(_) => "NOT_FOUND",
            ApiError::MethodNotAllowed(_) => "METHOD_NOT_ALLOWED",
            ApiError::Conflict(code, _) => code,
            ApiError::PayloadTooLarge(_) => "PAYLOAD_TOO_LARGE",
            ApiError::RequestTimeout => "REQUEST_TIMEOUT",
            ApiError::RateLimited { .. } => "RATE_LIMITED",
            ApiError::Unavailable(_) => "UNAVAILABLE",
            ApiError::Busy(_) | ApiError::Pending(_) => "SALE_BUSY",
            ApiError::OutcomeUnknown { .. } => "OUTCOME_UNKNOWN",
            ApiError::Unexpected(_) => "INTERNAL",
        }
    }

    pub fn into_response(self) -> Response {
        let message = match &self {
            // Details of an unexpected failure go to the log, not to the client.
            ApiError::Unexpected(e) => {
                tracing::error!(error = format!("{e:#}"), "request failed");
                "internal error".to_owned()
            }
            other => other.to_string(),
        };
        let mut error = serde_json::json!({"code": self.code(), "message": message});
        if let ApiError::OutcomeUnknown { status_url, .. } = &self {
            error["status_url"] = status_url.as_str().into();
        }
        let mut resp = json(self.status(), &serde_json::json!({ "error": error }));
        match self {
            ApiError::RateLimited { retry_after_s } => {
                resp.headers_mut()
                    .insert(http::header::RETRY_AFTER, retry_after_s.into());
            }
            // A dependency down or busy: worth another try in a moment.
            ApiError::Unavailable(_)
            | ApiError::Busy(_)
            | ApiError::Pending(_)
            | ApiError::OutcomeUnknown { .. } => {
                resp.headers_mut().insert(
                    http::header::RETRY_AFTER,
                    http::HeaderValue::from_static("1"),
                );
                if matches!(self, ApiError::Busy(_)) {
                    // For the edge (which hides it): a 5xx that admitted nothing, so a
                    // purchase's Idempotency-Key need not be let past its checks again.
                    // Not UNAVAILABLE: the request timeout's 503 may cut a handler off
                    // after Redis admitted the purchase (review).
                    resp.headers_mut()
                        .insert(NOTHING_ADMITTED, http::HeaderValue::from_static("none"));
                }
            }
            ApiError::MethodNotAllowed(allow) => {
                resp.headers_mut()
                    .insert(http::header::ALLOW, http::HeaderValue::from_static(allow));
            }
            _ => {}
        }
        resp
    }
}

impl From<mysql_async::Error> for ApiError {
    fn from(e: mysql_async::Error) -> Self {
        anyhow::Error::new(e).context("MySQL call failed").into()
    }
}

impl From<redis::RedisError> for ApiError {
    fn from(e: redis::RedisError) -> Self {
        anyhow::Error::new(e).context("Redis call failed").into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn errors_answer_with_the_documented_shape() {
        let resp = ApiError::Conflict("SOLD_OUT", "no units left".into()).into_response();
        assert_eq!(resp.status(), StatusCode::CONFLICT);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "SOLD_OUT");
        assert_eq!(v["error"]["message"], "no units left");
    }

    #[test]
    fn unexpected_errors_hide_their_cause() {
        let e = ApiError::Unexpected(anyhow::anyhow!("password=hunter2"));
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(e.code(), "INTERNAL");
    }
}
