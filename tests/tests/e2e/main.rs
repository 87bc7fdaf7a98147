//! End-to-end tests against the real stack: one binary, one module per area.

mod admin_events;
mod admin_users;
mod bench;
mod docs;
mod door;
mod edge;
mod health;
mod lifecycle;
mod pipeline;
mod purchase;
mod reconcile;
