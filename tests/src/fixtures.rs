//! The events the tests put on sale.

use serde_json::Value;

/// A concert with one unseated and one seated category, selling now.
pub fn concert() -> Value {
    serde_json::json!({
        "title": "Concert", "venue": "Arena",
        "show_time": "2031-06-01T20:00:00Z",
        "sale_start": "2020-01-01T00:00:00Z", "sale_end": "2031-06-01T12:00:00Z",
        "per_user_limit": 4, "pay_timeout_s": 900,
        "categories": [
            {"name": "GA", "price_cents": 5000, "quantity": 300},
            {"name": "Seated", "price_cents": 9000, "seats": {"rows": 10, "cols": 20}},
        ],
    })
}

/// A small event on sale now: `units` unseated units and a rows × cols seated block.
pub fn small_sale(units: u32, rows: u32, cols: u32, per_user_limit: u32) -> Value {
    serde_json::json!({
        "title": "Small sale", "venue": "Loopback",
        "show_time": "2031-06-01T20:00:00Z",
        "sale_start": "2020-01-01T00:00:00Z", "sale_end": "2031-06-01T12:00:00Z",
        "per_user_limit": per_user_limit, "pay_timeout_s": 900,
        "categories": [
            {"name": "GA", "price_cents": 5000, "quantity": units},
            {"name": "Seated", "price_cents": 9000, "seats": {"rows": rows, "cols": cols}},
        ],
    })
}
