//! An edge rate limit's settings, as `PUT /admin/limits` takes them and the edge
//! applies them (seed 002's four algorithms).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// At most `limit` requests per `window_s` window, counted from the window's start.
    FixedWindow,
    /// At most `limit` in any `window_s`, estimated from this and the previous window.
    SlidingWindow,
    /// Tokens refill at `rate` per second up to `burst`; a request takes one.
    TokenBucket,
    /// Requests drain at `rate` per second; at most `burst` may wait in excess.
    LeakyBucket,
}

/// One limit's settings. Window algorithms use `limit` and `window_s`, buckets `rate`
/// and `burst`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSpec {
    pub algo: Algorithm,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<f64>,
}

impl LimitSpec {
    /// Checks that the fields the algorithm uses are there and positive, and no others.
    pub fn validate(&self, name: &str) -> Result<(), String> {
        if name.is_empty()
            || name.len() > 64
            || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(format!(
                "limit name {name:?} must be 1..=64 of [A-Za-z0-9_]"
            ));
        }
        let (needed, unused) = match self.algo {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => (
                [("limit", self.limit), ("window_s", self.window_s)],
                [("rate", self.rate), ("burst", self.burst)],
            ),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => (
                [("rate", self.rate), ("burst", self.burst)],
                [("limit", self.limit), ("window_s", self.window_s)],
            ),
        };
        for (field, value) in needed {
            // A count (a window's `limit`, a bucket's `burst`) under 1 lets no request
            // through at all — every route of the limit 429, the payment callback's too
            // (review): at least 1. A rate or a window only positive.
            let count = matches!(field, "limit" | "burst");
            match value {
                Some(v) if v.is_finite() && (if count { v >= 1.0 } else { v > 0.0 }) => {}
                Some(v) if count => {
                    return Err(format!("{name}.{field} must be at least 1, got {v}"));
                }
                Some(v) => return Err(format!("{name}.{field} must be positive, got {v}")),
                None => return Err(format!("{name}.{field} is required for {:?}", self.algo)),
            }
        }
        if let Some((field, _)) = unused.iter().find(|(_, v)| v.is_some()) {
            return Err(format!("{name}.{field} does not apply to {:?}", self.algo));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: serde_json::Value) -> LimitSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_count_under_one_would_refuse_everything_and_is_refused() {
        for bad in [
            serde_json::json!({"algo": "fixed_window", "limit": 0.5, "window_s": 1}),
            serde_json::json!({"algo": "sliding_window", "limit": 0.99, "window_s": 1}),
            serde_json::json!({"algo": "token_bucket", "rate": 5, "burst": 0.9}),
            serde_json::json!({"algo": "leaky_bucket", "rate": 5, "burst": 0.1}),
        ] {
            let e = spec(bad.clone()).validate("api_ip").unwrap_err();
            assert!(e.contains("at least 1"), "{bad}: {e}");
        }
        assert!(
            spec(serde_json::json!({"algo": "token_bucket", "rate": 0.5, "burst": 1}))
                .validate("api_ip")
                .is_ok(),
            "a slow rate with a burst of one lets a request through"
        );
        // Any positive rate or window, as the schema says (exclusiveMinimum 0): the
        // fuzzer sent a subnormal window, which a bound at the smallest normal refused.
        assert!(
            spec(serde_json::json!({"algo": "sliding_window", "limit": 5, "window_s": 2.2250738585e-313}))
                .validate("api_ip")
                .is_ok()
        );
    }

    #[test]
    fn each_algorithm_needs_its_own_fields() {
        assert!(
            spec(serde_json::json!({"algo": "token_bucket", "rate": 5, "burst": 10}))
                .validate("ip")
                .is_ok()
        );
        assert!(
            spec(serde_json::json!({"algo": "sliding_window", "limit": 5, "window_s": 1}))
                .validate("u")
                .is_ok()
        );
        let e = spec(serde_json::json!({"algo": "token_bucket", "rate": 5}))
            .validate("ip")
            .unwrap_err();
        assert!(e.contains("burst is required"), "{e}");
        let e =
            spec(serde_json::json!({"algo": "fixed_window", "limit": 5, "window_s": 1, "rate": 3}))
                .validate("ip")
                .unwrap_err();
        assert!(e.contains("does not apply"), "{e}");
        let e = spec(serde_json::json!({"algo": "leaky_bucket", "rate": -1, "burst": 1}))
            .validate("ip")
            .unwrap_err();
        assert!(e.contains("positive"), "{e}");
        let e = spec(serde_json::json!({"algo": "leaky_bucket", "rate": 1, "burst": 1}))
            .validate("bad name")
            .unwrap_err();
        assert!(e.contains("limit name"), "{e}");
    }
}
