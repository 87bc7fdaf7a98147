//! What the HTTP handlers share: the configuration, the connections, and the flows'
//! entry points. Built by `app`; read by `public`, `admin` and `health`. The flows
//! themselves take only what they use.

use std::sync::Arc;

use crate::infra::redis::Redis;
use mysql_async::Pool;

use crate::admission::Admission;
use crate::auth::login::LoginGuard;
use crate::auth::token::TokenSigner;
use crate::catalog::EventCache;
use crate::config::Resolved;
use crate::http::Response;
use crate::keys::Keys;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::orders::Pipeline;
use crate::preload::Preloader;
use crate::reconcile::Reconciler;

pub struct AppState {
    pub config: Resolved,
    pub redis: Redis,
    /// The pool of the order pipeline, the listeners and the sweeps (`mysql.pool_max`).
    pub mysql: Pool,
    /// The API requests' own pool (`mysql.api_pool_max`): requests waiting on MySQL
    /// never hold a connection order creation needs.
    pub api_mysql: Pool,
    /// /readyz's own connection to MariaDB (`health::MysqlProbe`).
    pub mysql_probe: crate::health::MysqlProbe,
    /// /readyz's check of RocketMQ, one at a time (`health::Probe`).
    pub rocketmq_probe: crate::health::Probe<()>,
    pub keys: Keys,
    pub tokens: TokenSigner,
    /// Signed-out tokens (`auth::revoked`), as last read from Redis.
    pub revoked: Arc<crate::auth::revoked::Revoked>,
    /// Failed logins per account, and the bound on password checks at once.
    pub login: LoginGuard,
    /// The requests' preloader (admission's status reads, the admin's preloads), on
    /// `api_mysql`; the scheduler runs a copy on `mysql`.
    pub preloader: Preloader,
    /// Compares Redis with MySQL and heals drift: the admin endpoints', on `api_mysql`;
    /// the periodic job runs a copy on `mysql`.
    pub reconciler: Reconciler,
    pub metrics: Metrics,
    /// Events as the hot path reads them (moka, short TTL).
    pub events: Arc<EventCache>,
    /// The purchase path.
    pub admission: Admission,
    /// Orders after creation, as buyers and the provider's callback ask: view, cancel,
    /// pay (on `api_mysql`; the timeouts run on a copy of it on `mysql`).
    pub lifecycle: Lifecycle,
    /// The waiting rooms' joins, passes and fairness (docs/waiting-room.md).
    pub room: crate::room::WaitingRoom,
    /// The order pipeline, when `orders.enabled`.
    pub pipeline: Option<Arc<Pipeline>>,
    /// Seat maps as answered, for a moment (`public::events::SeatMaps`).
    pub seat_maps: crate::public::SeatMaps,
    /// Each event's units left as answered, for a moment (`public::events::Availability`).
    pub availability: crate::public::Availability,
}

impl AppState {
    /// Counts an answer of the `face` API (public, admin) by status, and returns it.
    pub fn counted(&self, face: &str, resp: Response) -> Response {
        self.metrics
            .http_responses
            .with_label_values(&[face, resp.status().as_str()])
            .inc();
        resp
    }
}
