//! Wiring: connect to the dependencies, apply the schema, bind the listeners, start
//! each flow's workers, consumers and sweepers, run until told to stop, then drain.
//! Nothing below this module imports it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use secrecy::ExposeSecret;
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinHandle;

use crate::admission::Admission;
use crate::admission::replicated::ReplicaBarrier;
use crate::admission::throttle::Throttle;
use crate::auth::keyring;
use crate::auth::login::LoginGuard;
use crate::auth::token::TokenSigner;
use crate::catalog::EventCache;
use crate::config::Resolved;
use crate::http::server;
use crate::ids::{self, OrderIds};
use crate::infra;
use crate::keys::Keys;
use crate::lifecycle::{self, Lifecycle};
use crate::lock::Lock;
use crate::messaging::{self, Mq, MqSettings, Names};
use crate::metrics::Metrics;
use crate::orders::Pipeline;
use crate::orders::tx::OrdersTxListener;
use crate::preload::Preloader;
use crate::reconcile::Reconciler;
use crate::shutdown::Stopper;
use crate::state::AppState;
use crate::stock_sync;

/// Connections the kernel may queue for each listener before the core accepts them.
const LISTEN_BACKLOG: u32 = 4096;

/// How long start-up waits for the broker before going on without it (not ready).
const BROKER_WAIT: Duration = Duration::from_secs(10);

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

/// Faults only a test can inject (`App::inject`); no configuration reaches them.
#[derive(Debug, Default, Clone, Copy)]
pub struct TestFaults {
    /// After committing a batch's orders, answer the broker UNKNOWN, so that its
    /// check-back must settle every transaction.
    pub checkback_only: bool,
}

/// A built core: connected, migrated, listening.
pub struct App {
    state: Arc<AppState>,
    worker_lease: Lock,
    public: TcpListener,
    admin: TcpListener,
    stopper: Stopper,
    faults: TestFaults,
}

/// Binds with a deep accept queue (the kernel caps it at somaxconn) rather than
/// tokio's default of 1024: a sale opens with a burst of connections.
fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, BuildError> {
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
}

impl App {
    pub async fn build(config: Resolved) -> Result<App, BuildError> {
        let s = &config.settings;
        let timeout = Duration::from_secs(s.startup.connect_timeout_s);
        let redis = infra::redis::connect(&s.redis, timeout)
            .await
            .map_err(BuildError::Dependency)?;
        let replicas = ReplicaBarrier::from_settings(&s.redis);
        let mysql = infra::mysql::connect(config.mysql_opts.clone(), timeout)
            .await
            .map_err(BuildError::Dependency)?;
        infra::mysql::require_mariadb(&mysql)
            .await
            .map_err(BuildError::Dependency)?;
        infra::mysql::migrate(&mysql, s.mysql.order_shards)
            .await
            .map_err(BuildError::Dependency)?;
        let api_mysql = infra::mysql::connect(config.mysql_api_opts.clone(), timeout)
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
        let public = bind("public API", config.public_addr)?;
        let admin = bind("admin API", config.admin_addr)?;
        let keys = Keys::new(&s.redis.key_prefix);
        let lease = Duration::from_secs(s.ids.worker_lease_s);
        let worker_lease = ids::lease_worker_id(&mut redis.clone(), &keys, lease)
            .await
            .map_err(BuildError::Dependency)?;
        let order_ids = Arc::new(OrderIds::new(ids::leased_id(&worker_lease), lease));
        tracing::info!(
            worker_id = order_ids.worker(),
            "leased an order-number worker id"
        );
        let metrics = Metrics::new();
        let call_timeout = infra::mysql::CallTimeout::new(
            Duration::from_millis(s.mysql.call_timeout_ms),
            &metrics,
        );
        let events = Arc::new(EventCache::new(
            mysql.clone(),
            Duration::from_millis(s.admission.event_cache_ttl_ms),
            call_timeout.clone(),
            metrics.event_reads.clone(),
        ));
        let preloader = Preloader::new(
            redis.clone(),
            mysql.clone(),
            keys.clone(),
            s,
            call_timeout.clone(),
        );
        let reconciler = Reconciler::new(preloader.clone(), s, &metrics, replicas.clone());
        // The requests' copies (a purchase status read from MySQL, the admin's preloads,
        // stats and reconciles) on the API's pool; the scheduler, the passes and the
        // pipeline on the pipeline's.
        let (api_preloader, api_reconciler) = (
            preloader.on(api_mysql.clone()),
            reconciler.on(api_mysql.clone()),
        );
        let idle_streams = Arc::new(crate::orders::IdleStreams::default());
        let pipeline = s.orders.enabled.then(|| {
            Arc::new(Pipeline {
                redis: redis.clone(),
                mysql: mysql.clone(),
                keys: keys.clone(),
                events: events.clone(),
                preloader: preloader.clone(),
                shards: s.mysql.order_shards,
                call_timeout: call_timeout.clone(),
                settings: s.orders.clone(),
                instance: format!("core{}", order_ids.worker()),
                mq: Default::default(),
                blocked: Default::default(),
                orders_created: metrics.orders_created.clone(),
                released: metrics.reservations_released.clone(),
                refused: metrics.reservations_refused.clone(),
                rewinds: metrics.redis_rewinds.clone(),
                taken_over: metrics.reservations_taken_over.clone(),
                idle: idle_streams.clone(),
                reading: Default::default(),
                claims: Default::default(),
            })
        });
        let admission = Admission {
            redis: redis.clone(),
            keys: keys.clone(),
            events: events.clone(),
            limits: Throttle::new(&s.admission),
            order_ids,
            preloader: api_preloader.clone(),
            max_stream_depth: s.orders.max_stream_depth,
            replicas,
            refills: Default::default(),
            refill_outcomes: metrics.bucket_refills.clone(),
            streams: idle_streams,
        };
        let lifecycle = Lifecycle {
            mysql: api_mysql.clone(),
            redis: redis.clone(),
            keys: keys.clone(),
            shards: s.mysql.order_shards,
            call_timeout: call_timeout.clone(),
        };
        let tokens = TokenSigner::from_text(config.token_secret.expose_secret())
            .expect("the keyring was checked when the configuration was resolved");
        let room = crate::room::WaitingRoom::new(crate::room::store(&redis, &keys), tokens.clone());
        let state = Arc::new(AppState {
            tokens,
            revoked: Arc::default(),
            room,
            login: LoginGuard::new(&s.login),
            mysql_probe: crate::health::MysqlProbe::new(config.mysql_api_opts.clone()),
            rocketmq_probe: crate::health::Probe::new(()),
            config,
            redis,
            mysql,
            api_mysql,
            keys,
            preloader: api_preloader,
            reconciler: api_reconciler,
            metrics,
            events,
            admission,
            lifecycle,
            pipeline,
            seat_maps: crate::public::SeatMaps::new(),
            availability: crate::public::Availability::new(),
        });
        Ok(App {
            state,
            worker_lease,
            public,
            admin,
            stopper: Stopper::new(),
            faults: TestFaults::default(),
        })
    }

    /// For tests only: run with these faults.
    #[doc(hidden)]
    pub fn inject(mut self, faults: TestFaults) -> App {
        self.faults = faults;
        self
    }

    pub fn public_port(&self) -> u16 {
        self.public.local_addr().expect("bound").port()
    }

    pub fn admin_port(&self) -> u16 {
        self.admin.local_addr().expect("bound").port()
    }

    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// Serves both APIs and runs the background jobs until [`Stopper::stop`].
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let App {
            state,
            worker_lease,
            public,
            admin,
            stopper,
            faults,
        } = self;
        let s = &state.config.settings;
        let mut tasks: Vec<(&'static str, JoinHandle<()>)> = Vec::new();
        let p = &s.preload;
        tasks.push((
            "the preload scheduler",
            tokio::spawn(state.preloader.on(state.mysql.clone()).run_scheduler(
                Duration::from_secs(p.interval_s),
                Duration::from_secs(p.window_s),
                stopper.subscribe(),
            )),
        ));
        if s.reconcile.interval_s > 0 {
            tasks.push((
                "the reconciler",
                tokio::spawn(state.reconciler.on(state.mysql.clone()).run(
                    Duration::from_secs(s.reconcile.interval_s),
                    p.window_s,
                    stopper.subscribe(),
                )),
            ));
        }
        tasks.push((
            "the bucket sweeper",
            tokio::spawn(crate::buckets::run_sweeper(
                crate::buckets::Mover {
                    redis: state.redis.clone(),
                    keys: state.keys.clone(),
                    // A move it finishes after a failover credits again what the
                    // failover lost: that credit waits for the replicas as any other.
                    replicas: state.admission.replicas.clone(),
                },
                state.admission.events.clone(),
                stopper.subscribe(),
            )),
        ));
        tasks.push((
            "the waiting rooms' gate",
            tokio::spawn(
                crate::room::gate::Gate {
                    store: crate::room::store(&state.redis, &state.keys),
                    mysql: state.mysql.clone(),
                    call_timeout: state.preloader.call_timeout.clone(),
                    events: state.events.clone(),
                    max_stream_depth: s.orders.max_stream_depth,
                }
                .run(stopper.subscribe()),
            ),
        ));
        tasks.push((
            "the worker lease",
            tokio::spawn(ids::keep_lease(
                worker_lease,
                state.admission.order_ids.clone(),
                state.redis.clone(),
                state.keys.clone(),
                Duration::from_secs(s.ids.worker_lease_s),
                stopper.subscribe(),
            )),
        ));
        // Read once before serving: a core that served first would take signed-out
        // tokens until its first read.
        if let Err(e) = state
            .revoked
            .refresh(
                &state.redis,
                &state.keys,
                chrono::Utc::now().timestamp(),
                false,
            )
            .await
        {
            tracing::warn!(
                error = format!("{e:#}"),
                "could not read the revoked tokens before serving; retrying every 250 ms"
            );
        }
        tasks.push((
            "the revoked tokens",
            tokio::spawn({
                let (revoked, stop) = (state.revoked.clone(), stopper.subscribe());
                let (redis, keys) = (state.redis.clone(), state.keys.clone());
                let reads = state.metrics.revoked_reads.clone();
                async move { revoked.run(redis, keys, reads, stop).await }
            }),
        ));
        tasks.push((
            "the throttle cleaner",
            tokio::spawn({
                let (state, stop) = (state.clone(), stopper.subscribe());
                async move { state.admission.limits.forget_idle_until(stop).await }
            }),
        ));
        if let Some(pipeline) = &state.pipeline {
            tasks.extend(start_flows(&state, pipeline, &stopper, faults));
        }
        if let Some(path) = state.config.keyring_file().map(ToOwned::to_owned) {
            let (state, stop) = (state.clone(), stopper.subscribe());
            tasks.push((
                "the keyring watcher",
                tokio::spawn(async move { keyring::watch(&state.tokens, &path, stop).await }),
            ));
        }
        let srv = &s.server;
        let limits = server::Limits {
            max_connections: srv.max_connections,
            read_timeout: Duration::from_millis(srv.read_timeout_ms),
            request_timeout: Duration::from_millis(srv.request_timeout_ms),
        };
        let grace = state.config.shutdown_grace();
        tracing::info!(
            public = %public.local_addr()?, admin = %admin.local_addr()?, "stampede core serving"
        );
        tokio::join!(
            server::serve(
                "public",
                public,
                Arc::new(crate::public::Service(state.clone())),
                stopper.subscribe(),
                grace,
                limits,
            ),
            server::serve(
                "admin",
                admin,
                Arc::new(crate::admin::Service(state.clone())),
                stopper.subscribe(),
                grace,
                limits,
            ),
        );
        // A task stuck on a part that does not answer (a MySQL connection gone
        // half-open under a call no timeout bounds) is cut off after the grace: for the
        // pipeline, the same as a crash at that point, which every flow survives.
        let deadline = tokio::time::Instant::now() + grace;
        for (what, mut task) in tasks {
            match tokio::time::timeout_at(deadline, &mut task).await {
                Ok(ended) => ended.with_context(|| format!("{what} panicked"))?,
                Err(_) => {
                    tracing::warn!(
                        what,
                        "did not stop within server.shutdown_grace_s (waiting on a part that does not answer); cut off"
                    );
                    task.abort();
                }
            }
        }
        if let Some(mq) = state.pipeline.as_ref().and_then(|p| p.mq.get()) {
            mq.shutdown().await;
        }
        // Waits for every connection to come back, which one held by a cut-off task
        // never does.
        let pools = async {
            let (workers, api, ()) = tokio::join!(
                state.mysql.clone().disconnect(),
                state.api_mysql.clone().disconnect(),
                state.mysql_probe.close()
            );
            workers.and(api)
        };
        match tokio::time::timeout(grace, pools).await {
            Ok(closed) => closed.context("Failed to close the MySQL pools")?,
            Err(_) => tracing::warn!(
                "the MySQL pools did not close within server.shutdown_grace_s; leaving their connections"
            ),
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// Order creation's workers, the RocketMQ clients with each flow's consumer, stock
/// sync's outbox and the lifecycle's overdue sweep.
fn start_flows(
    state: &Arc<AppState>,
    pipeline: &Arc<Pipeline>,
    stopper: &Stopper,
    faults: TestFaults,
) -> Vec<(&'static str, JoinHandle<()>)> {
    let s = &state.config.settings;
    let mysql = state.mysql.clone();
    // The timeouts' cancellations run on the pipeline's pool, not the API's.
    let lifecycle = Lifecycle {
        mysql: mysql.clone(),
        ..state.lifecycle.clone()
    };
    let settings = MqSettings {
        namesrv: s.rocketmq.namesrv_addr.clone(),
        names: Names::new(&s.rocketmq.namespace),
        send_threads: s.orders.workers + 1,
        call_timeout: pipeline.call_timeout.clone(),
    };
    let settings = Arc::new(settings);
    let start = {
        let (lifecycle, checkbacks) = (lifecycle.clone(), state.metrics.checkbacks.clone());
        let grace = Duration::from_secs(s.orders.checkback_grace_s);
        move || {
            let tx = OrdersTxListener::new(
                mysql.clone(),
                settings.call_timeout.clone(),
                grace,
                faults.checkback_only,
                checkbacks.clone(),
            );
            let consumers = vec![
                stock_sync::consumer(mysql.clone(), &settings.names),
                lifecycle::timeout::consumer(lifecycle.clone(), &settings.names),
            ];
            let settings = settings.clone();
            async move { Mq::start(&settings, tx, consumers).await }
        }
    };
    let mut tasks = vec![
        (
            "the RocketMQ starter",
            tokio::spawn({
                let (cell, stop) = (pipeline.mq.clone(), stopper.subscribe());
                async move { messaging::start_until_stopped(cell, start, stop).await }
            }),
        ),
        (
            "the outbox sweeper",
            tokio::spawn(stock_sync::outbox::run(
                state.mysql.clone(),
                pipeline.call_timeout.clone(),
                pipeline.mq.clone(),
                s.orders.sweep_after_s,
                stopper.subscribe(),
            )),
        ),
        (
            "the overdue sweep",
            tokio::spawn(lifecycle::timeout::run_overdue_sweep(
                lifecycle,
                stopper.subscribe(),
            )),
        ),
    ];
    for i in 0..s.orders.workers {
        tasks.push((
            "an order worker",
            tokio::spawn(pipeline.clone().run_worker(i, stopper.subscribe())),
        ));
    }
    tasks
}
