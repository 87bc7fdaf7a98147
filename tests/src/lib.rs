//! The end-to-end harness. `make test` starts a disposable stack (Redis, MariaDB, the
//! RocketMQ name server and broker, a core and the edge) under `.stack-test/` on its own
//! ports; every test then builds its own core in-process on free ports, with its own
//! MariaDB database and Redis key prefix, so tests run in parallel without sharing state.
//!
//! One module per concern; everything a test uses is re-exported here, so tests name it
//! `stampede_e2e::…`.

mod admin;
mod app;
mod buyers;
mod fixtures;
mod http;
mod own_stack;
mod process;
mod relay;
mod sql;
mod stack;
mod stack_app;
mod wait;

pub use admin::AdminClient;
pub use app::{TestApp, spawn_app, spawn_app_on, spawn_app_with, spawn_faulty_app, test_settings};
pub use buyers::{Buyer, purchase, try_purchase};
pub use fixtures::{concert, small_sale};
pub use http::{RawAnswer, raw_request};
pub use own_stack::{OwnBroker, OwnEdge, OwnMariadb, OwnRedis, free_port};
pub use process::{CoreProcess, core_binary, core_env, paysim_binary};
pub use relay::StallingRelay;
pub use sql::{
    create_database, drop_database, live_units, order_numbers, ordered_units, orders_table_of,
    over_shards, scalar, test_shards, unsynced_orders, update_order,
};
pub use stack::{Stack, connect_redis, root};
pub use stack_app::{StackApp, StoppedCore, stack_app};
pub use stampede_core::TestFaults;
pub use wait::{edge_workers_catch_up, eventually, heavy};

pub use stampede_core::Settings as CoreSettings;
