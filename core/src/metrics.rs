//! Prometheus metrics, rendered on the admin API's `/metrics`.

use prometheus::{Encoder, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

pub struct Metrics {
    registry: Registry,
    /// Answers per listener and status class, to see errors at a glance.
    pub http_responses: IntCounterVec,
    /// 1 when the last readiness check reached the dependency.
    pub dependency_up: IntGaugeVec,
    /// Preloads by outcome (ok, busy, error).
    pub preloads: IntCounterVec,
    pub users_created: IntCounter,
    /// Reads of one event from MySQL (the event cache's misses), and of the largest id.
    pub event_reads: IntCounter,
    /// Transaction check-backs answered, by answer (commit, rollback, unknown).
    pub checkbacks: IntCounterVec,
    /// Orders the pipeline created, and reservations it released as FAILED.
    pub orders_created: IntCounter,
    pub reservations_released: IntCounter,
    /// Reservations MySQL turned away (Redis admitted more than there was), and times
    /// Redis was found gone back in time.
    pub reservations_refused: IntCounter,
    pub redis_rewinds: IntCounter,
    /// The reconciler's periodic passes over a sale, by what was done: `full`, or
    /// `unchanged` (skipped: a sale on whose books Redis shows as they balanced).
    pub reconcile_passes: IntCounterVec,
    /// Reads of the signed-out tokens that found a change, by what they read: the
    /// changes from the log, or the whole hash.
    pub revoked_reads: IntCounterVec,
    /// Reservations a worker took over from another consumer that had left them idle
    /// for `orders.claim_idle_ms` (a worker or core that stopped, or hung).
    pub reservations_taken_over: IntCounter,
    /// MySQL calls given up after `mysql.call_timeout_ms` (`infra::mysql::CallTimeout`).
    pub mysql_calls_cut: IntCounter,
    /// Sessions of cut-off calls the core tried to end (`infra::mysql::end_session`), by
    /// outcome.
    pub mysql_sessions_ended: IntCounterVec,
    /// Purchases the core answered, by answer (QUEUED or the error code).
    pub purchase_answers: IntCounterVec,
    /// `purchase_answers` of QUEUED, looked up once (the answer of every admission).
    pub purchases_queued: IntCounter,
    /// Each time a purchase found its bucket dry (events of several buckets), what came
    /// of it (docs/scaling.md "Refill without oversell"): `moved` once per refill that
    /// brought units, then the purchase's last turn ends in any label, or in none when
    /// its bucket then admitted it.
    pub bucket_refills: IntCounterVec,
    /// Per event and category: total − (Redis stock + queued + unpaid + paid).
    pub conservation_gap: IntGaugeVec,
    /// Per event and category: MySQL remain − (total − unpaid − paid + unsynced).
    pub remain_gap: IntGaugeVec,
    /// Per event and category: units in live orders beyond the total (alarm when > 0).
    pub oversold_units: IntGaugeVec,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let http_responses = IntCounterVec::new(
            Opts::new(
                "stampede_http_responses_total",
                "HTTP responses by listener and status",
            ),
            &["listener", "status"],
        )
        .expect("valid metric");
        let dependency_up = IntGaugeVec::new(
            Opts::new(
                "stampede_dependency_up",
                "1 if the dependency answered the last readiness check",
            ),
            &["dependency"],
        )
        .expect("valid metric");
        let preloads = IntCounterVec::new(
            Opts::new(
                "stampede_preloads_total",
                "Event preloads into Redis by outcome",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let users_created = IntCounter::new(
            "stampede_users_created_total",
            "Users created through the admin API",
        )
        .expect("valid metric");
        let event_reads = IntCounter::new(
            "stampede_event_reads_total",
            "Reads of an event (or of the largest event id) from MySQL: the event cache's misses",
        )
        .expect("valid metric");
        let checkbacks = IntCounterVec::new(
            Opts::new(
                "stampede_checkbacks_total",
                "RocketMQ transaction check-backs answered, by answer",
            ),
            &["answer"],
        )
        .expect("valid metric");
        let orders_created = IntCounter::new(
            "stampede_orders_created_total",
            "Orders created in MySQL, counted at a commit this core saw succeed (one whose answer was lost is not counted)",
        )
        .expect("valid metric");
        let reservations_released = IntCounter::new(
            "stampede_reservations_released_total",
            "Reservations released as FAILED",
        )
        .expect("valid metric");
        let reservations_refused = IntCounter::new(
            "stampede_reservations_refused_total",
            "Reservations Redis admitted that MySQL's guards turned away",
        )
        .expect("valid metric");
        let redis_rewinds = IntCounter::new(
            "stampede_redis_rewinds_total",
            "Times an event's Redis state was found behind MySQL and fenced for a rebuild",
        )
        .expect("valid metric");
        let reconcile_passes = IntCounterVec::new(
            Opts::new(
                "stampede_reconcile_passes_total",
                "The reconciler's periodic passes over a sale: made (full), or skipped as nothing of a sale on changed since its books balanced (unchanged)",
            ),
            &["pass"],
        )
        .expect("valid metric");
        let revoked_reads = IntCounterVec::new(
            Opts::new(
                "stampede_revoked_reads_total",
                "Reads of the signed-out tokens that found a change: the changes since the last (changes), the whole hash (whole), the whole hash after the minute's prune (prune)",
            ),
            &["read"],
        )
        .expect("valid metric");
        let reservations_taken_over = IntCounter::new(
            "stampede_reservations_taken_over_total",
            "Reservations a worker took over from a consumer that left them idle past orders.claim_idle_ms",
        )
        .expect("valid metric");
        let mysql_calls_cut = IntCounter::new(
            "stampede_mysql_calls_cut_total",
            "MySQL calls given up (their connections closed) after mysql.call_timeout_ms",
        )
        .expect("valid metric");
        let mysql_sessions_ended = IntCounterVec::new(
            Opts::new(
                "stampede_mysql_sessions_ended_total",
                "Sessions of cut-off MySQL calls the core tried to end, by outcome: killed, \
                 restarted (the server restarted since the call began: nothing killed), \
                 other_server (the address leads to another server now: nothing killed), gone \
                 (ended already), failed, unanswered (other_server, failed and unanswered \
                 end after wait_timeout)",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let purchase_answers = IntCounterVec::new(
            Opts::new(
                "stampede_purchase_answers_total",
                "Purchases the core answered, by answer: QUEUED or the error code",
            ),
            &["answer"],
        )
        .expect("valid metric");
        let bucket_refills = IntCounterVec::new(
            Opts::new(
                "stampede_bucket_refills_total",
                "Each time a purchase found its bucket dry, the outcome: moved (units came, \
                 the bucket is tried again), sold_out (the whole event had fewer), flagged \
                 (the pool or a drain found the category flagged), busy (no units within \
                 the wait, or others took the units each time), moving (too few in the \
                 event's places with units of the category between them: SALE_BUSY), \
                 failed (a move failed, or a bucket took no part in a drain: SALE_BUSY, \
                 nothing reserved), remembered (answered SOLD_OUT from this \
                 core's memo of the flag, the pool not asked)",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let conservation_gap = IntGaugeVec::new(
            Opts::new(
                "stampede_conservation_gap",
                "Units per category missing from Redis stock + queued + unpaid + paid (0 once settled)",
            ),
            &["event", "category"],
        )
        .expect("valid metric");
        let remain_gap = IntGaugeVec::new(
            Opts::new(
                "stampede_remain_gap",
                "MySQL remain minus what the orders say it should be, per category",
            ),
            &["event", "category"],
        )
        .expect("valid metric");
        let oversold_units = IntGaugeVec::new(
            Opts::new(
                "stampede_oversold_units",
                "Units in live orders beyond the category's total (needs a person when > 0)",
            ),
            &["event", "category"],
        )
        .expect("valid metric");
        for m in [
            Box::new(http_responses.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(dependency_up.clone()),
            Box::new(preloads.clone()),
            Box::new(users_created.clone()),
            Box::new(event_reads.clone()),
            Box::new(checkbacks.clone()),
            Box::new(orders_created.clone()),
            Box::new(reservations_released.clone()),
            Box::new(reservations_refused.clone()),
            Box::new(redis_rewinds.clone()),
            Box::new(revoked_reads.clone()),
            Box::new(reconcile_passes.clone()),
            Box::new(reservations_taken_over.clone()),
            Box::new(mysql_calls_cut.clone()),
            Box::new(mysql_sessions_ended.clone()),
            Box::new(purchase_answers.clone()),
            Box::new(bucket_refills.clone()),
            Box::new(conservation_gap.clone()),
            Box::new(remain_gap.clone()),
            Box::new(oversold_units.clone()),
        ] {
            registry.register(m).expect("metric registered once");
        }
        Metrics {
            registry,
            http_responses,
            dependency_up,
            preloads,
            users_created,
            event_reads,
            checkbacks,
            orders_created,
            reservations_released,
            reservations_refused,
            redis_rewinds,
            revoked_reads,
            reconcile_passes,
            reservations_taken_over,
            mysql_calls_cut,
            mysql_sessions_ended,
            purchases_queued: purchase_answers.with_label_values(&["QUEUED"]),
            purchase_answers,
            bucket_refills,
            conservation_gap,
            remain_gap,
            oversold_units,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("encoding into memory cannot fail");
        String::from_utf8(buf).expect("the text format is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
