//! Validated domain types: input becomes one of these before any Redis or MySQL call.

pub mod event;
pub mod ids;
pub mod json;
pub mod limit;

pub use ids::{CategoryId, EventId, OrderNo, UserId};
