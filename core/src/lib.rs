//! Stampede's core. The flows of DESIGN.md, each in its folder: `preload`, `admission`,
//! `orders` (creation), `stock_sync`, `lifecycle`, `reconcile`; the HTTP faces `public`
//! and `admin` over `http`; the parts they share below them (`domain`, `keys`,
//! `order_tables`, `messaging`, `infra`, `shutdown`, …); `app` wires it all and
//! `main.rs` runs it.
#![forbid(unsafe_code)]
// The reconciler's pass (admin::stats::reconcile) awaits a heal, a drain, a move and its
// replica barrier round, one future inside the next: a clean build computing its layout
// went past the default depth of 128 (by 2) once the barrier's verdict became a future
// of its own. An incremental build had not noticed.
#![recursion_limit = "256"]

pub mod admin;
pub mod admission;
pub mod app;
pub mod auth;
pub mod buckets;
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
pub mod messaging;
pub mod metrics;
pub mod order_tables;
pub mod orders;
pub mod preload;
pub mod public;
pub mod reconcile;
pub mod room;
pub mod script_codes;
pub mod shutdown;
pub mod state;
pub mod stock_sync;
pub mod telemetry;
pub mod trains;

pub use app::{App, BuildError, TestFaults};
pub use config::Settings;
pub use shutdown::Stopper;
