//! Wiring: connect to the dependencies, apply the schema, bind the listeners, run
//! until told to stop, then drain.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use mysql_async::Pool;
use redis::aio::ConnectionManager;
use secrecy::ExposeSecret;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;

use crate::admission::throttle::Throttle;
use crate::auth::login::LoginGuard;
use crate::auth::token::TokenSigner;
use crate::catalog::EventCache;
use crate::config::Resolved;
use crate::http::server::{self, Handler};
use crate::http::{Request, Response};
use crate::ids::{self, OrderIds};
use crate::infra;
use crate::keys::Keys;
use crate::lock::Lock;
use crate::metrics::Metrics;
use crate::orders::{Pipeline, mq};
use crate::preload::Preloader;
use crate::reconcile::Reconciler;

/// Connections the kernel may queue for each listener before the core accepts them.
const LISTEN_BACKLOG: u32 = 4096;

/// How long start-up waits for the broker before going on without it (not ready).
const BROKER_WAIT: Duration = Duration::from_secs(10);

/// What every handler shares.
pub struct AppState {
    pub config: Resolved,
    pub redis: ConnectionManager,
    pub mysql: Pool,
    pub keys: Keys,
    pub tokens: TokenSigner,
    /// Failed logins per account, and the bound on password checks at once.
    pub login: LoginGuard,
    pub preloader: Preloader,
    /// Compares Redis with MySQL and heals drift (periodic job and admin endpoint).
    pub reconciler: Reconciler,
    pub metrics: Metrics,
    /// Events as the hot path reads them (moka, short TTL).
    pub events: Arc<EventCache>,
    /// The core's own rate limits, behind the edge's.
    pub limits: Throttle,
    /// Mints order numbers with this instance's leased worker id.
    pub order_ids: Arc<OrderIds>,
    /// The order pipeline, when `orders.enabled`.
    pub pipeline: Option<Arc<Pipeline>>,
}

/// Why the core could not start; the binary maps it to an exit code.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{0:#}")]
    Dependency(anyhow::Error),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A built core: connected, migrated, listening.
pub struct App {
    state: Arc<AppState>,
    worker_lease: Lock,
    public: TcpListener,
    admin: TcpListener,
    stop: watch::Sender<bool>,
}

/// Tells a running [`App`] to stop; cheap to clone.
#[derive(Clone)]
pub struct Stopper(watch::Sender<bool>);

impl Stopper {
    pub fn stop(&self) {
        let _ = self.0.send(true);
    }
}

/// Resolves once the stop signal is given (or its sender is gone).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    // wait_for's guard is not Send; drop it here, before the caller awaits anything else.
    let _ = stop.wait_for(|stopped| *stopped).await.map(|_| ());
}

impl App {
    pub async fn build(config: Resolved) -> Result<App, BuildError> {
        let s = &config.settings;
        let timeout = Duration::from_secs(s.startup.connect_timeout_s);
        let redis = infra::redis::connect(&s.redis.url, timeout)
            .await
            .map_err(BuildError::Dependency)?;
        let mysql = infra::mysql::connect(config.mysql_opts.clone(), timeout)
            .await
            .map_err(BuildError::Dependency)?;
        infra::mysql::migrate(&mysql, s.mysql.order_shards)
            .await
            .map_err(BuildError::Dependency)?;
        let namesrv = s.rocketmq.namesrv_addr.clone();
        if let Err(e) =
            infra::retry_until("RocketMQ", &namesrv, BROKER_WAIT.min(timeout), || async {
                infra::rocketmq::probe(&namesrv, Duration::from_secs(1))
                    .await
                    .map(drop)
            })
            .await
        {
            tracing::warn!(
                error = format!("{e:#}"),
                "starting without RocketMQ; /readyz says 503 until it answers"
            );
        }
        let bind = |what, addr: SocketAddr| async move {
            // A sale opens with a burst of connections: a deep accept queue (the kernel
            // caps it at somaxconn) rather than tokio's default of 1024.
            let listen = || {
                let socket = if addr.is_ipv4() {
                    TcpSocket::new_v4()?
                } else {
                    TcpSocket::new_v6()?
                };
                socket.set_reuseaddr(true)?;
                socket.bind(addr)?;
                socket.listen(LISTEN_BACKLOG)
            };
            listen().map_err(|source| BuildError::Bind { what, addr, source })
        };
        let public = bind("public API", config.public_addr).await?;
        let admin = bind("admin API", config.admin_addr).await?;
        let keys = Keys::new(&s.redis.key_prefix);
        let lease = Duration::from_secs(s.ids.worker_lease_s);
        let worker_lease = ids::lease_worker_id(&mut redis.clone(), &keys, lease)
            .await
            .map_err(BuildError::Dependency)?;
        let order_ids = Arc::new(OrderIds::new(ids::leased_id(&worker_lease)));
        tracing::info!(
            worker_id = order_ids.worker(),
            "leased an order-number worker id"
        );
        let events = Arc::new(EventCache::new(
            mysql.clone(),
            Duration::from_millis(s.admission.event_cache_ttl_ms),
        ));
        let limits = Throttle::new(&s.admission);
        let metrics = Metrics::new();
        let pipeline = s.orders.enabled.then(|| {
            Arc::new(Pipeline {
                redis: redis.clone(),
                mysql: mysql.clone(),
                keys: keys.clone(),
                events: events.clone(),
                shards: s.mysql.order_shards,
                settings: s.orders.clone(),
                instance: format!("core{}", order_ids.worker()),
                mq: Default::default(),
                blocked: Default::default(),
                orders_created: metrics.orders_created.clone(),
                released: metrics.reservations_released.clone(),
            })
        });
        let preloader = Preloader::new(redis.clone(), mysql.clone(), keys.clone(), s);
        let reconciler = Reconciler::new(preloader.clone(), s, &metrics);
        let state = Arc::new(AppState {
            tokens: TokenSigner::from_text(config.token_secret.expose_secret())
                .expect("the keyring was checked when the configuration was resolved"),
            login: LoginGuard::new(&s.login),
            config,
            redis,
            mysql,
            keys,
            preloader,
            reconciler,
            metrics,
            events,
            limits,
            order_ids,
            pipeline,
        });
        let (stop, _) = watch::channel(false);
        Ok(App {
            state,
            worker_lease,
            public,
            admin,
            stop,
        })
    }

    pub fn public_port(&self) -> u16 {
        self.public.local_addr().expect("bound").port()
    }

    pub fn admin_port(&self) -> u16 {
        self.admin.local_addr().expect("bound").port()
    }

    pub fn stopper(&self) -> Stopper {
        Stopper(self.stop.clone())
    }

    /// Serves both APIs and runs the background jobs until [`Stopper::stop`].
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let App {
            state,
            worker_lease,
            public,
            admin,
            stop,
        } = self;
        let grace = state.config.shutdown_grace();
        let p = &state.config.settings.preload;
        let scheduler = tokio::spawn(state.preloader.clone().run_scheduler(
            Duration::from_secs(p.interval_s),
            Duration::from_secs(p.window_s),
            stop.subscribe(),
        ));
        let r = &state.config.settings.reconcile;
        let reconciler = (r.interval_s > 0).then(|| {
            tokio::spawn(state.reconciler.clone().run(
                Duration::from_secs(r.interval_s),
                p.window_s,
                stop.subscribe(),
            ))
        });
        let lease = tokio::spawn(ids::keep_lease(
            worker_lease,
            state.order_ids.clone(),
            state.redis.clone(),
            state.keys.clone(),
            Duration::from_secs(state.config.settings.ids.worker_lease_s),
            stop.subscribe(),
        ));
        let forget = tokio::spawn({
            let (state, mut stop) = (state.clone(), stop.subscribe());
            async move {
                let mut tick = tokio::time::interval(Duration::from_secs(30));
                loop {
                    tokio::select! {
                        _ = tick.tick() => state.limits.forget_idle(),
                        _ = stopped(&mut stop) => return,
                    }
                }
            }
        });
        let mut pipeline_tasks = Vec::new();
        if let Some(pipeline) = &state.pipeline {
            let s = &state.config.settings;
            let settings = mq::MqSettings {
                namesrv: s.rocketmq.namesrv_addr.clone(),
                names: mq::Names::new(&s.rocketmq.namespace),
                checkback_grace: Duration::from_secs(s.orders.checkback_grace_s),
                inject_unknown: s.orders.inject_unknown,
                send_threads: s.orders.workers + 1,
                checkbacks: state.metrics.checkbacks.clone(),
            };
            pipeline_tasks.push(tokio::spawn(
                pipeline.clone().start_mq(settings, stop.subscribe()),
            ));
            pipeline_tasks.push(tokio::spawn(pipeline.clone().run_sweeper(stop.subscribe())));
            for i in 0..s.orders.workers {
                pipeline_tasks.push(tokio::spawn(
                    pipeline.clone().run_worker(i, stop.subscribe()),
                ));
            }
        }
        let keyring = state
            .config
            .settings
            .auth
            .token_secret_file
            .clone()
            .filter(|_| state.config.settings.auth.token_secret.is_none());
        let keyring =
            keyring.map(|path| tokio::spawn(watch_keyring(state.clone(), path, stop.subscribe())));
        let srv = &state.config.settings.server;
        let limits = server::Limits {
            max_connections: srv.max_connections,
            read_timeout: Duration::from_millis(srv.read_timeout_ms),
            request_timeout: Duration::from_millis(srv.request_timeout_ms),
        };
        tracing::info!(
            public = %public.local_addr()?, admin = %admin.local_addr()?, "stampede core serving"
        );
        tokio::join!(
            server::serve(
                "public",
                public,
                Arc::new(Public(state.clone())),
                stop.subscribe(),
                grace,
                limits,
            ),
            server::serve(
                "admin",
                admin,
                Arc::new(Admin(state.clone())),
                stop.subscribe(),
                grace,
                limits,
            ),
        );
        if let Some(keyring) = keyring {
            keyring.await.context("the keyring watcher panicked")?;
        }
        scheduler.await.context("the preload scheduler panicked")?;
        if let Some(reconciler) = reconciler {
            reconciler.await.context("the reconciler panicked")?;
        }
        lease.await.context("the worker lease task panicked")?;
        forget.await.context("the throttle cleaner panicked")?;
        for task in pipeline_tasks {
            task.await.context("an order pipeline task panicked")?;
        }
        if let Some(mq) = state.pipeline.as_ref().and_then(|p| p.mq.get()) {
            mq.shutdown().await;
        }
        state
            .mysql
            .clone()
            .disconnect()
            .await
            .context("Failed to close the MySQL pool")?;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Re-reads the token keyring file every second: `stampede rotate-token-secret` takes
/// effect without a restart, and tokens of the previous secret stay valid.
async fn watch_keyring(
    state: Arc<AppState>,
    path: std::path::PathBuf,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => match state.tokens.reload_from(&path) {
                Ok(Some(ids)) => {
                    failing = false;
                    tracing::info!(key_ids = ?ids, "token keyring reloaded: the first signs, all verify");
                }
                Ok(None) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(path = %path.display(), error = format!("{e:#}"), "token keyring not reloaded; keeping the keys in force");
                }
                Err(_) => {}
            },
            _ = stopped(&mut stop) => return,
        }
    }
}

/// The public API (behind the edge).
struct Public(Arc<AppState>);

impl Handler for Public {
    async fn handle(self: Arc<Self>, req: Request) -> Response {
        let resp = crate::public::route(&self.0, req).await;
        self.0
            .metrics
            .http_responses
            .with_label_values(&["public", resp.status().as_str()])
            .inc();
        resp
    }
}

/// The admin API.
struct Admin(Arc<AppState>);

impl Handler for Admin {
    async fn handle(self: Arc<Self>, req: Request) -> Response {
        let resp = crate::admin::route(&self.0, req).await;
        self.0
            .metrics
            .http_responses
            .with_label_values(&["admin", resp.status().as_str()])
            .inc();
        resp
    }
}
