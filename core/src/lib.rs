//! Stampede's core: the admin API, preload, and (in later work) admission, the order
//! pipeline and the order lifecycle. `main.rs` only wires; everything lives here.
#![forbid(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod app;
pub mod auth;
pub mod catalog;
pub mod config;
pub mod domain;
pub mod health;
pub mod http;
pub mod ids;
pub mod infra;
pub mod keys;
pub mod lifecycle;
pub mod lock;
pub mod metrics;
pub mod orders;
pub mod preload;
pub mod public;
pub mod reconcile;
pub mod stock_sync;
pub mod telemetry;

pub use app::{App, BuildError, Stopper};
pub use config::Settings;
