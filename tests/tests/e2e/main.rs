//! End-to-end tests against the real stack: one binary, one module per area.

mod admin_events;
mod admin_users;
mod backstage;
mod bench;
mod buckets;
mod cluster;
mod connections;
mod docs;
mod door;
mod edge;
mod edge_sale;
mod guards;
mod health;
mod lifecycle;
mod login;
mod payment;
mod pipeline;
mod purchase;
mod reconcile;
mod recovery;
mod redis_faults;
mod trains;
mod upgrade;
mod waiting_room;
