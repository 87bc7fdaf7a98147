//! `stampede-bench soak`: a steady stream of purchases through the edge for minutes, a
//! third of the orders cancelled by their buyer, a third paid by the provider's signed
//! callback, the rest left to time out; every interval the core's resident memory and
//! the 202 latency, so that a leak or a slow drift shows as a line that climbs. Flat is
//! the goal; the audit closes the run.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use mysql_async::prelude::*;
use serde::Serialize;
use tokio::sync::mpsc;

use stampede_core::domain::event::MAX_UNITS_PER_CATEGORY;
use stampede_core::lifecycle::pay;
use stampede_core::order_tables::{OrderStatus, count_shards, over_shards};

use crate::audit::{self, Audit};
use crate::load::{Answer, Conn, Request};
use crate::record::{Latency, Recorder};
use crate::report::{self, Axis, Chart, Line};
use crate::stack::{Stack, event_body};

/// RSS may grow this much over the first sample after the warm-up and still be flat.
const FLAT_WITHIN: f64 = 0.10;
/// The warm-up is the first minute, or the first 20 % of a shorter run.
const WARMUP_MAX: Duration = Duration::from_secs(60);
const WARMUP_SHARE: f64 = 0.2;
/// A purchase sent later than this after its slot: the client fell behind.
const LATE: Duration = Duration::from_secs(1);
/// Any one request: a hung stack ends the soak rather than hanging it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often admitted purchases are looked up in MySQL, and how old one must be first.
const FOLLOW_TICK: Duration = Duration::from_millis(500);
const FOLLOW_MIN_AGE: Duration = Duration::from_millis(300);
/// How long a 202's order may take to appear in MySQL before it is counted as missing.
const ORDER_WAIT: Duration = Duration::from_secs(30);
/// The sale opens this long after the event is made (users and tokens are made meanwhile).
const OPEN_IN: Duration = Duration::from_secs(3);
/// The core's bound on an event's per-user limit (its event validation).
const PER_USER_BOUND: u64 = 1_000;

/// The options of `soak`.
#[derive(Debug, Clone, Args)]
pub struct SoakArgs {
    /// Minutes of steady load (fractions allowed: 0.5 is 30 s).
    #[arg(long, default_value_t = 10.0, value_parser = parse_minutes)]
    pub minutes: f64,
    /// Purchases per second, open loop: each sent at its slot whatever the answers.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=5_000))]
    pub rate: u64,
    /// Seconds between samples of the core's memory and the latency.
    #[arg(long, default_value_t = 10.0, value_parser = parse_interval)]
    pub interval_s: f64,
    /// Buyers the purchases rotate over (at least --rate: the edge lets a user buy 5
    /// times a second, and each buyer then buys at most once a second).
    #[arg(long, default_value_t = 2_000)]
    pub buyers: u64,
    /// Connections the purchases go over, each from a loopback address of its own (half
    /// as many more carry the cancellations and payments).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub connections: u64,
    /// The event's payment window, seconds: short, so that the timeout path runs
    /// during the soak too.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub pay_timeout_s: u32,
    /// How long to wait, after the stream, for the timeouts and for everything to settle.
    #[arg(long, default_value_t = 300)]
    pub settle_timeout_s: u64,
    /// Draw the core's RSS and the 202 p99 over time into this SVG.
    #[arg(long, default_value = "target/bench/soak.svg")]
    pub plot: PathBuf,
    /// Also write the report here.
    #[arg(long, default_value = "target/bench/soak.json")]
    pub out: PathBuf,
}

fn parse_minutes(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(m) if (0.05..=1440.0).contains(&m) => Ok(m),
        _ => Err("minutes within 0.05 … 1440".into()),
    }
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (1.0..=600.0).contains(&x) => Ok(x),
        _ => Err("seconds within 1 … 600".into()),
    }
}

/// What the options come to: how many purchases, and an event they never exhaust.
#[derive(Debug)]
struct Plan {
    duration: Duration,
    purchases: u64,
    /// 1.2 × the purchases: it never sells out, even before a unit comes back.
    units: u64,
    /// More than any buyer ever buys, so the limit never answers for the core.
    per_user_limit: u32,
    warmup: Duration,
}

impl Plan {
    fn of(a: &SoakArgs) -> anyhow::Result<Plan> {
        anyhow::ensure!(
            a.buyers >= a.rate,
            "--buyers ({}) must be at least --rate ({}): the edge lets a user buy 5 times a \
             second, and each buyer then buys at most once a second",
            a.buyers,
            a.rate
        );
        let duration = Duration::from_secs_f64(a.minutes * 60.0);
        let purchases = (a.rate as f64 * duration.as_secs_f64()).ceil() as u64;
        let units = (purchases as f64 * 1.2).ceil() as u64;
        anyhow::ensure!(
            units <= u64::from(MAX_UNITS_PER_CATEGORY),
            "{units} units is more than an event's category holds: fewer --minutes or --rate"
        );
        let per_user_limit = purchases.div_ceil(a.buyers) + 1;
        anyhow::ensure!(
            per_user_limit <= PER_USER_BOUND,
            "each buyer would buy {per_user_limit} times, over the event's per-user limit's \
             bound ({PER_USER_BOUND}): more --buyers"
        );
        Ok(Plan {
            duration,
            purchases,
            units,
            per_user_limit: per_user_limit as u32,
            warmup: WARMUP_MAX.min(duration.mul_f64(WARMUP_SHARE)),
        })
    }
}

/// What became of an admitted purchase: decided by its number, a third each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Cancel,
    Pay,
    TimeOut,
}

impl Fate {
    fn of(n: u64) -> Fate {
        match n % 3 {
            0 => Fate::Cancel,
            1 => Fate::Pay,
            _ => Fate::TimeOut,
        }
    }
}

/// A 202 to cancel or pay once its order is in MySQL.
struct FollowUp {
    order_no: u64,
    buyer: usize,
    fate: Fate,
    admitted_at: Instant,
}

/// A cancellation by the buyer, or the provider's payment of the order's amount.
enum Action {
    Cancel { order_no: u64, buyer: usize },
    Pay { order_no: u64, amount_cents: u64 },
}

/// What was heard since the last sample; swapped for an empty one at each.
struct Heard {
    purchases: Recorder,
    cancels: Recorder,
    payments: Recorder,
}

impl Heard {
    fn new() -> Heard {
        let now = Instant::now();
        Heard {
            purchases: Recorder::new(now),
            cancels: Recorder::new(now),
            payments: Recorder::new(now),
        }
    }

    fn merge(&mut self, other: Heard) {
        self.purchases.merge(other.purchases);
        self.cancels.merge(other.cancels);
        self.payments.merge(other.payments);
    }

    /// Answers 5xx, of every kind of request.
    fn server_errors(&self) -> u64 {
        [&self.purchases, &self.cancels, &self.payments]
            .iter()
            .map(|r| r.count("5"))
            .sum()
    }

    fn transport_errors(&self) -> u64 {
        self.purchases.errors + self.cancels.errors + self.payments.errors
    }
}

/// Counts over the whole soak.
#[derive(Default)]
struct Tally {
    /// Cancellations answered 200.
    cancelled: AtomicU64,
    /// Payments answered PAID.
    paid: AtomicU64,
    /// Purchases sent more than [`LATE`] after their slot.
    late: AtomicU64,
    /// 202s whose order was not in MySQL within [`ORDER_WAIT`].
    never_created: AtomicU64,
}

/// What the soak's tasks share.
struct Ctx {
    event: u64,
    /// The one purchase body: a unit of the event's one category.
    body: Bytes,
    tokens: Vec<String>,
    first_user: u64,
    rate: u64,
    purchases: u64,
    started: Instant,
    /// No purchase is sent after this (the stream's end plus a grace).
    give_up: Instant,
    /// The number of the next purchase to send, over all connections.
    next: AtomicU64,
    heard: Mutex<Heard>,
    to_follow: Mutex<Vec<FollowUp>>,
    /// (user id, request id) of every 202, for the audit.
    admitted: Mutex<Vec<(u64, u64)>>,
    /// Set when the stream is over: the follow-ups drain, then end.
    stop: AtomicBool,
    tally: Tally,
}

impl Ctx {
    fn heard(&self) -> MutexGuard<'_, Heard> {
        self.heard.lock().expect("not poisoned")
    }

    /// Purchase `n` of buyer `buyer` was admitted: kept for the audit, and for its
    /// cancellation or payment.
    fn admitted(&self, n: u64, buyer: usize, answer: &Answer) {
        let Some(order_no) = answer.json()["request_id"]
            .as_str()
            .and_then(|s| s.parse::<u64>().ok())
        else {
            return;
        };
        self.admitted
            .lock()
            .expect("not poisoned")
            .push((self.first_user + buyer as u64, order_no));
        let fate = Fate::of(n);
        if fate != Fate::TimeOut {
            self.to_follow.lock().expect("not poisoned").push(FollowUp {
                order_no,
                buyer,
                fate,
                admitted_at: Instant::now(),
            });
        }
    }
}

/// One sample: the interval that ended at `t_s`.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the stream started, at the end of the interval.
    pub t_s: f64,
    /// VmRSS summed over `core_pids`, MB; null when no core was running (a restart).
    pub rss_mb: Option<f64>,
    pub core_pids: Vec<u32>,
    /// Purchases answered in the interval, by kind ("202", "409 SOLD_OUT", …).
    pub answers: BTreeMap<String, u64>,
    pub p50_202_ms: Option<f64>,
    pub p99_202_ms: Option<f64>,
    pub cancels: BTreeMap<String, u64>,
    pub payments: BTreeMap<String, u64>,
    pub server_errors: u64,
    pub transport_errors: u64,
    /// Orders cancelled by their buyer and paid, since the start.
    pub cancelled_so_far: u64,
    pub paid_so_far: u64,
}

impl Sample {
    fn line(&self) -> String {
        let ms = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.1}"));
        format!(
            "  t {:>6.0} s  RSS {:>7} MB  202 p50 {} p99 {} ms  purchases {:?}  cancels {} payments {}  \
             so far cancelled {} paid {}  5xx {}  no answer {}",
            self.t_s,
            ms(self.rss_mb),
            ms(self.p50_202_ms),
            ms(self.p99_202_ms),
            self.answers,
            self.cancels.values().sum::<u64>(),
            self.payments.values().sum::<u64>(),
            self.cancelled_so_far,
            self.paid_so_far,
            self.server_errors,
            self.transport_errors
        )
    }
}

/// The core's memory over the samples after the warm-up (allocator arenas, caches and
/// connection pools fill during it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RssVerdict {
    /// The first sample at or after the warm-up: the baseline.
    pub rss_first_mb: f64,
    pub rss_last_mb: f64,
    /// The highest sample at or after the warm-up.
    pub rss_max_mb: f64,
    /// max ÷ first − 1.
    pub rss_growth: f64,
    /// Samples whose core was another process than the sample before's: it restarted.
    pub core_restarts: u32,
    /// max ≤ first × 1.10; null with fewer than two samples after the warm-up, or when
    /// the core restarted during the soak (its memory started over).
    pub rss_flat: Option<bool>,
}

fn rss_verdict(samples: &[Sample], warmup_s: f64) -> RssVerdict {
    let after: Vec<f64> = samples
        .iter()
        .filter(|s| s.t_s >= warmup_s - 1e-9)
        .filter_map(|s| s.rss_mb)
        .collect();
    let first = after.first().copied().unwrap_or(0.0);
    let max = after.iter().copied().fold(first, f64::max);
    let running: Vec<&Vec<u32>> = samples
        .iter()
        .map(|s| &s.core_pids)
        .filter(|p| !p.is_empty())
        .collect();
    let core_restarts = running.windows(2).filter(|w| w[0] != w[1]).count() as u32;
    RssVerdict {
        rss_first_mb: first,
        rss_last_mb: after.last().copied().unwrap_or(0.0),
        rss_max_mb: max,
        rss_growth: if first > 0.0 { max / first - 1.0 } else { 0.0 },
        core_restarts,
        rss_flat: (after.len() >= 2 && core_restarts == 0)
            .then_some(max <= first * (1.0 + FLAT_WITHIN)),
    }
}

#[derive(Debug, Serialize)]
pub struct SoakReport {
    pub event_id: u64,
    pub minutes: f64,
    pub rate: u64,
    pub buyers: u64,
    pub units: u64,
    pub per_user_limit: u32,
    pub pay_timeout_s: u32,
    pub interval_s: f64,
    pub warmup_s: f64,
    /// Which processes were measured as the core.
    pub cores: Cores,
    /// RSS just before the stream started.
    pub rss_start_mb: f64,
    #[serde(flatten)]
    pub rss: RssVerdict,
    pub samples: Vec<Sample>,
    pub purchases_sent: u64,
    /// Sent more than 1 s after their slot: the client fell behind, the load was not
    /// open loop then.
    pub purchases_late: u64,
    /// Purchases over the whole soak, by kind, and their latency.
    pub answers: BTreeMap<String, u64>,
    pub latency: BTreeMap<String, Latency>,
    pub cancel_answers: BTreeMap<String, u64>,
    pub payment_answers: BTreeMap<String, u64>,
    /// 5xx answers of any request. They do not fail the run (the exit code is the
    /// audit's): they are reported here and per interval.
    pub server_errors: u64,
    pub transport_errors: u64,
    pub cancelled_by_buyer: u64,
    pub paid: u64,
    /// Orders cancelled at the end of their payment window (CANCELLED in MySQL, less
    /// those cancelled by their buyer).
    pub timed_out: u64,
    /// 202s whose order did not appear in MySQL within 30 s, so neither cancelled nor paid.
    pub never_created: u64,
    /// The event's orders by status at the end.
    pub orders: BTreeMap<String, u64>,
    pub audit: Audit,
}

pub async fn run(stack: &Stack, a: &SoakArgs) -> anyhow::Result<SoakReport> {
    let plan = Plan::of(a)?;
    let cores = Cores::find(stack);
    anyhow::ensure!(
        !cores.pids(stack).is_empty(),
        "no core process (named stampede) on this machine: the soak measures its memory"
    );
    if cores == Cores::EveryStampede {
        eprintln!(
            "this stack's core (listening on {}) not found: measuring every process named \
             stampede",
            stack.admin
        );
    }
    let (event, category, opens_at) = open_event(stack, a, &plan).await?;
    let (first_user, tokens) = stack.buyers(a.buyers).await?;
    // The edge reads sale windows every 200 ms: a little after the open, it knows.
    tokio::time::sleep_until((opens_at + Duration::from_millis(300)).into()).await;
    let rss_start_mb = rss_mb(&cores.pids(stack));
    let started = Instant::now();
    let ctx = Arc::new(Ctx {
        event,
        body: Bytes::from(format!(r#"{{"category_id":{category},"quantity":1}}"#)),
        tokens,
        first_user,
        rate: a.rate,
        purchases: plan.purchases,
        started,
        give_up: started + plan.duration + Duration::from_secs(5),
        next: AtomicU64::new(0),
        heard: Mutex::new(Heard::new()),
        to_follow: Mutex::new(Vec::new()),
        admitted: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        tally: Tally::default(),
    });
    let (samples, heard) = stream(stack, &ctx, cores, a, &plan).await?;

    let within = Duration::from_secs(u64::from(a.pay_timeout_s) + a.settle_timeout_s);
    let orders = wait_no_unpaid(stack, event, within).await?;
    stack
        .wait_settled(event, Duration::from_secs(a.settle_timeout_s))
        .await?;
    let admitted = std::mem::take(&mut *ctx.admitted.lock().expect("not poisoned"));
    let audit = audit::run(stack, event, plan.per_user_limit, &admitted).await?;

    let cancelled_by_buyer = ctx.tally.cancelled.load(Ordering::SeqCst);
    let report = SoakReport {
        event_id: event,
        minutes: a.minutes,
        rate: a.rate,
        buyers: a.buyers,
        units: plan.units,
        per_user_limit: plan.per_user_limit,
        pay_timeout_s: a.pay_timeout_s,
        interval_s: a.interval_s,
        warmup_s: plan.warmup.as_secs_f64(),
        cores,
        rss_start_mb,
        rss: rss_verdict(&samples, plan.warmup.as_secs_f64()),
        samples,
        purchases_sent: heard.purchases.total() + heard.purchases.errors,
        purchases_late: ctx.tally.late.load(Ordering::SeqCst),
        answers: heard.purchases.counts(),
        latency: heard.purchases.latencies(),
        cancel_answers: heard.cancels.counts(),
        payment_answers: heard.payments.counts(),
        server_errors: heard.server_errors(),
        transport_errors: heard.transport_errors(),
        cancelled_by_buyer,
        paid: ctx.tally.paid.load(Ordering::SeqCst),
        timed_out: orders
            .get(OrderStatus::Cancelled.as_str())
            .copied()
            .unwrap_or(0)
            .saturating_sub(cancelled_by_buyer),
        never_created: ctx.tally.never_created.load(Ordering::SeqCst),
        orders,
        audit,
    };
    write(&report, a)?;
    Ok(report)
}

/// Makes and publishes the soak's event, selling from [`OPEN_IN`] from now for the
/// whole soak and an hour more: its id, its category and when it opens.
async fn open_event(
    stack: &Stack,
    a: &SoakArgs,
    plan: &Plan,
) -> anyhow::Result<(u64, u64, Instant)> {
    let opens_at = Instant::now() + OPEN_IN;
    let mut body = event_body(
        "stampede-bench soak",
        plan.units,
        1,
        None,
        plan.per_user_limit,
        OPEN_IN,
    );
    body["pay_timeout_s"] = a.pay_timeout_s.into();
    let sale_end = chrono::Utc::now()
        + chrono::Duration::from_std(OPEN_IN + plan.duration + Duration::from_secs(3600))?;
    body["sale_end"] = sale_end
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        .into();
    let (event, categories) = stack.event(&body).await?;
    eprintln!(
        "event {event}: {} purchases at {}/s over {:.1} min, {} buyers, per-user limit {}, \
         payment window {} s",
        plan.purchases, a.rate, a.minutes, a.buyers, plan.per_user_limit, a.pay_timeout_s
    );
    Ok((event, categories[0], opens_at))
}

/// The stream: the purchases over `connections`, their cancellations and payments over
/// half as many more, and a sample every interval; then the follow-ups drained. The
/// samples, and everything heard.
async fn stream(
    stack: &Stack,
    ctx: &Arc<Ctx>,
    cores: Cores,
    a: &SoakArgs,
    plan: &Plan,
) -> anyhow::Result<(Vec<Sample>, Heard)> {
    let connections = a.connections as usize;
    let buyers: Vec<_> = (0..connections)
        .map(|c| tokio::spawn(buy(ctx.clone(), stack.edge_for(c), c)))
        .collect();
    let (tx, rx) = mpsc::channel(4096);
    let follow = tokio::spawn(follow_up(ctx.clone(), stack.mysql.clone(), tx));
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let secret = Arc::new(stack.secret("provider.secret")?);
    let actors: Vec<_> = (connections..connections + connections.div_ceil(2))
        .map(|c| {
            let (ctx, rx, secret) = (ctx.clone(), rx.clone(), secret.clone());
            tokio::spawn(act(ctx, rx, secret, stack.edge_for(c), c))
        })
        .collect();

    let (samples, mut heard) = sample(stack, ctx, cores, plan.duration, a.interval_s).await;
    for t in buyers {
        t.await?;
    }
    ctx.stop.store(true, Ordering::SeqCst);
    follow.await??;
    for t in actors {
        t.await?;
    }
    heard.merge(std::mem::replace(&mut *ctx.heard(), Heard::new()));
    Ok((samples, heard))
}

/// Sends purchase n at its slot, n ÷ rate s after the start, until every purchase is
/// sent or the time is up; the 202s are kept for their follow-up.
async fn buy(ctx: Arc<Ctx>, edge: SocketAddr, c: usize) {
    let mut client = Client::new(edge, c);
    let path = format!("/api/events/{}/orders", ctx.event);
    loop {
        let n = ctx.next.fetch_add(1, Ordering::Relaxed);
        if n >= ctx.purchases {
            return;
        }
        let slot = ctx.started + Duration::from_secs_f64(n as f64 / ctx.rate as f64);
        tokio::time::sleep_until(slot.into()).await;
        let now = Instant::now();
        if now >= ctx.give_up {
            return;
        }
        if now - slot > LATE {
            ctx.tally.late.fetch_add(1, Ordering::Relaxed);
        }
        let buyer = (n % ctx.tokens.len() as u64) as usize;
        let req = Request {
            method: http::Method::POST,
            path: path.clone(),
            bearer: Some(ctx.tokens[buyer].clone()),
            idempotency_key: Some(format!("soak-{n}")),
            headers: Vec::new(),
            body: ctx.body.clone(),
        };
        match client.send(&req).await {
            Some(answer) => {
                ctx.heard().purchases.record(&answer);
                if answer.status == 202 {
                    ctx.admitted(n, buyer, &answer);
                }
            }
            None => ctx.heard().purchases.errors += 1,
        }
    }
}

/// A keep-alive connection to the edge, from a loopback address of its own, replaced
/// when a request takes longer than [`REQUEST_TIMEOUT`] (its answer may still come).
struct Client {
    edge: SocketAddr,
    index: usize,
    conn: Conn,
}

impl Client {
    fn new(edge: SocketAddr, index: usize) -> Client {
        Client {
            edge,
            index,
            conn: Conn::new(edge, index),
        }
    }

    /// The answer; `None` when there was none in time.
    async fn send(&mut self, req: &Request) -> Option<Answer> {
        match tokio::time::timeout(REQUEST_TIMEOUT, self.conn.send(req)).await {
            Ok(answer) => answer.ok(),
            Err(_) => {
                self.conn = Conn::new(self.edge, self.index);
                None
            }
        }
    }
}

/// Every [`FOLLOW_TICK`]: the 202s whose order is now in MySQL go to be cancelled or
/// paid (their amount read there); one not there after [`ORDER_WAIT`] is counted and
/// dropped. Ends once the stream is over and nothing waits (or [`ORDER_WAIT`] later).
async fn follow_up(
    ctx: Arc<Ctx>,
    mysql: mysql_async::Pool,
    actions: mpsc::Sender<Action>,
) -> anyhow::Result<()> {
    let mut conn = mysql.get_conn().await?;
    let shards = count_shards(&mut conn).await?;
    let mut waiting: Vec<FollowUp> = Vec::new();
    let mut stopped_at = None;
    loop {
        tokio::time::sleep(FOLLOW_TICK).await;
        waiting.append(&mut ctx.to_follow.lock().expect("not poisoned"));
        if ctx.stop.load(Ordering::SeqCst) {
            let since = *stopped_at.get_or_insert_with(Instant::now);
            if waiting.is_empty() {
                return Ok(());
            }
            if since.elapsed() > ORDER_WAIT {
                let left = waiting.len() as u64;
                ctx.tally.never_created.fetch_add(left, Ordering::SeqCst);
                return Ok(());
            }
        }
        let (due, mut young): (Vec<_>, Vec<_>) = waiting
            .into_iter()
            .partition(|f| f.admitted_at.elapsed() >= FOLLOW_MIN_AGE);
        let amounts = amounts(&mut conn, shards, &due).await?;
        for f in due {
            let action = match (amounts.get(&f.order_no), f.fate) {
                (Some(_), Fate::Cancel) => Action::Cancel {
                    order_no: f.order_no,
                    buyer: f.buyer,
                },
                // Fate::Pay: a purchase left to time out is never followed up.
                (Some(&amount_cents), _) => Action::Pay {
                    order_no: f.order_no,
                    amount_cents,
                },
                (None, _) if f.admitted_at.elapsed() < ORDER_WAIT => {
                    young.push(f);
                    continue;
                }
                (None, _) => {
                    ctx.tally.never_created.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
            };
            actions
                .send(action)
                .await
                .context("the cancellations and payments stopped")?;
        }
        waiting = young;
    }
}

/// The amount of each of these orders that is in MySQL.
async fn amounts(
    conn: &mut mysql_async::Conn,
    shards: u32,
    of: &[FollowUp],
) -> anyhow::Result<HashMap<u64, u64>> {
    let mut found = HashMap::new();
    for chunk in of.chunks(1_000) {
        let list = chunk
            .iter()
            .map(|f| f.order_no.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let rows: Vec<(u64, u64)> = conn
            .query(over_shards(
                shards,
                &format!(
                    "SELECT order_no, amount_cents FROM {{orders}} WHERE order_no IN ({list})"
                ),
            ))
            .await?;
        found.extend(rows);
    }
    Ok(found)
}

/// Cancels or pays what [`follow_up`] sends, through the edge, until it ends.
async fn act(
    ctx: Arc<Ctx>,
    actions: Arc<tokio::sync::Mutex<mpsc::Receiver<Action>>>,
    secret: Arc<String>,
    edge: SocketAddr,
    c: usize,
) {
    let mut client = Client::new(edge, c);
    loop {
        let Some(action) = actions.lock().await.recv().await else {
            return;
        };
        match action {
            Action::Cancel { order_no, buyer } => {
                let req = Request::post(
                    format!("/api/orders/{order_no}/cancel"),
                    &serde_json::json!({}),
                )
                .bearer(&ctx.tokens[buyer]);
                let answer = client.send(&req).await;
                if answer.as_ref().is_some_and(|a| a.status == 200) {
                    ctx.tally.cancelled.fetch_add(1, Ordering::SeqCst);
                }
                note(&mut ctx.heard().cancels, answer.as_ref());
            }
            Action::Pay {
                order_no,
                amount_cents,
            } => {
                let req = payment(ctx.event, order_no, amount_cents, &secret);
                let answer = client.send(&req).await;
                if answer
                    .as_ref()
                    .is_some_and(|a| a.status == 200 && a.json()["result"] == "PAID")
                {
                    ctx.tally.paid.fetch_add(1, Ordering::SeqCst);
                }
                note(&mut ctx.heard().payments, answer.as_ref());
            }
        }
    }
}

fn note(rec: &mut Recorder, answer: Option<&Answer>) {
    match answer {
        Some(a) => rec.record(a),
        None => rec.errors += 1,
    }
}

/// The provider's callback for the order's full amount, signed as the provider signs.
fn payment(event: u64, order_no: u64, amount_cents: u64, secret: &str) -> Request {
    let body = serde_json::json!({
        "provider_txn_id": format!("soak-{event}-{order_no}"),
        "order_no": order_no.to_string(),
        "amount_cents": amount_cents,
    })
    .to_string();
    Request {
        method: http::Method::POST,
        path: "/api/payments/callback".into(),
        bearer: None,
        idempotency_key: None,
        headers: vec![(
            pay::SIGNATURE_HEADER,
            pay::sign(secret.as_bytes(), body.as_bytes()),
        )],
        body: Bytes::from(body),
    }
}

/// Every `interval_s` until `duration` is over (the last interval takes up the rest, a
/// little longer or shorter): the core's RSS and what was heard, printed as a line each.
/// The samples, and all that was heard.
async fn sample(
    stack: &Stack,
    ctx: &Ctx,
    cores: Cores,
    duration: Duration,
    interval_s: f64,
) -> (Vec<Sample>, Heard) {
    let interval = Duration::from_secs_f64(interval_s);
    let count = (duration.as_secs_f64() / interval_s).round().max(1.0) as u32;
    let mut samples = Vec::with_capacity(count as usize);
    let mut all = Heard::new();
    for i in 1..=count {
        let at = ctx.started + if i == count { duration } else { interval * i };
        tokio::time::sleep_until(at.into()).await;
        let heard = std::mem::replace(&mut *ctx.heard(), Heard::new());
        let core_pids = cores.pids(stack);
        let latency = heard.purchases.latencies();
        let ok = latency.get("202");
        let s = Sample {
            t_s: (at - ctx.started).as_secs_f64(),
            rss_mb: (!core_pids.is_empty()).then(|| rss_mb(&core_pids)),
            core_pids,
            answers: heard.purchases.counts(),
            p50_202_ms: ok.map(|l| l.p50_ms),
            p99_202_ms: ok.map(|l| l.p99_ms),
            cancels: heard.cancels.counts(),
            payments: heard.payments.counts(),
            server_errors: heard.server_errors(),
            transport_errors: heard.transport_errors(),
            cancelled_so_far: ctx.tally.cancelled.load(Ordering::SeqCst),
            paid_so_far: ctx.tally.paid.load(Ordering::SeqCst),
        };
        eprintln!("{}", s.line());
        samples.push(s);
        all.merge(heard);
    }
    (samples, all)
}

/// Waits (up to `within`) until no order of the event is unpaid — the last ones time
/// out — and every cancelled order's units are back in Redis (a cancellation commits in
/// MySQL first, then gives back), so the audit sees a still stack. The orders by status.
async fn wait_no_unpaid(
    stack: &Stack,
    event: u64,
    within: Duration,
) -> anyhow::Result<BTreeMap<String, u64>> {
    let until = Instant::now() + within;
    let mut conn = stack.mysql.get_conn().await?;
    let shards = count_shards(&mut conn).await?;
    let by_status = format!(
        "SELECT status, COUNT(*) FROM ({}) o GROUP BY status",
        over_shards(
            shards,
            &format!("SELECT status FROM {{orders}} WHERE event_id = {event}")
        )
    );
    loop {
        let orders: BTreeMap<String, u64> =
            conn.query(by_status.as_str()).await?.into_iter().collect();
        let count = |s: OrderStatus| orders.get(s.as_str()).copied().unwrap_or(0);
        let cancelled = count(OrderStatus::Cancelled);
        // The restocked sets are read only once nothing is unpaid: they are large.
        if count(OrderStatus::Unpaid) == 0
            && stack.restocked(event).await?.len() as u64 >= cancelled
        {
            return Ok(orders);
        }
        anyhow::ensure!(
            Instant::now() < until,
            "{within:?} after the soak, event {event}'s orders are still {orders:?} (some \
             unpaid, or cancelled ones not given back)"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Which processes are measured as the core, decided once at the start: this stack's
/// cores when one is running then, else every process named `stampede`. Never switched
/// mid-soak: a core restarting is missing from a sample or two, not replaced by another
/// stack's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cores {
    ThisStack,
    EveryStampede,
}

impl Cores {
    fn find(stack: &Stack) -> Cores {
        if this_stacks_cores(stack).is_empty() {
            Cores::EveryStampede
        } else {
            Cores::ThisStack
        }
    }

    fn pids(self, stack: &Stack) -> Vec<u32> {
        match self {
            Cores::ThisStack => this_stacks_cores(stack),
            Cores::EveryStampede => named_stampede(),
        }
    }
}

fn named_stampede() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "stampede")
        })
        .collect()
}

/// The processes named `stampede` that are this stack's cores — listening on its admin
/// port, or named by a `pids/core*.pid` under its directory (a second core has an admin
/// port of its own) — so that another stack's core on this machine is not counted. A
/// pid file alone would not do: two `up`s racing leave the pid of the core that lost.
fn this_stacks_cores(stack: &Stack) -> Vec<u32> {
    let in_files = pid_files(&stack.dir);
    let sockets: Vec<u64> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(t).ok())
        .flat_map(|table| listeners(&table, stack.admin.port()))
        .collect();
    named_stampede()
        .into_iter()
        .filter(|pid| in_files.contains(pid) || holds_socket(*pid, &sockets))
        .collect()
}

/// The pids in `pids/core*.pid` under the stack's directory.
fn pid_files(dir: &Path) -> Vec<u32> {
    std::fs::read_dir(dir.join("pids"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("core") && name.ends_with(".pid")
        })
        .filter_map(|e| std::fs::read_to_string(e.path()).ok()?.trim().parse().ok())
        .collect()
}

/// The inodes of the sockets listening on `port` in a `/proc/net/tcp` table (a row:
/// `sl local rem st … uid timeout inode`, addresses as HEXIP:HEXPORT, LISTEN is 0A).
fn listeners(table: &str, port: u16) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|row| {
            let f: Vec<&str> = row.split_whitespace().collect();
            let local_port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            (local_port == port && *f.get(3)? == "0A").then(|| f.get(9)?.parse().ok())?
        })
        .collect()
}

/// Whether the process has one of these sockets open.
fn holds_socket(pid: u32, inodes: &[u64]) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|target| {
            target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
                .is_some_and(|inode: u64| inodes.contains(&inode))
        })
}

/// This stack's cores' resident memory, MB (`compare`'s `core_rss_mb`).
pub fn core_rss_mb(stack: &Stack) -> f64 {
    rss_mb(&this_stacks_cores(stack))
}

/// The processes' resident memory, MB (VmRSS summed).
fn rss_mb(pids: &[u32]) -> f64 {
    let kb: u64 = pids
        .iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter_map(|status| vm_rss_kb(&status))
        .sum();
    kb as f64 / 1024.0
}

/// The `VmRSS:   123456 kB` line of a `/proc/<pid>/status`.
fn vm_rss_kb(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The report as JSON at --out and its chart at --plot.
fn write(r: &SoakReport, a: &SoakArgs) -> anyhow::Result<()> {
    for path in [&a.out, &a.plot] {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(r)?)
        .with_context(|| format!("write {}", a.out.display()))?;
    let over_time = |pick: fn(&Sample) -> Option<f64>| -> Vec<(f64, f64)> {
        r.samples
            .iter()
            .filter_map(|s| Some((s.t_s, pick(s)?)))
            .collect()
    };
    report::plot(
        &a.plot,
        &Chart {
            caption: "the core's memory and the 202 p99 over the soak".into(),
            x_desc: "s since the soak started".into(),
            x_max: r.samples.last().map_or(1.0, |s| s.t_s),
            left: Axis {
                desc: "RSS, MB".into(),
                lines: vec![Line {
                    label: "core RSS (MB)".into(),
                    points: over_time(|s| s.rss_mb),
                }],
            },
            right: Some(Axis {
                desc: "202 p99, ms".into(),
                lines: vec![Line {
                    label: "202 p99 (ms)".into(),
                    points: over_time(|s| s.p99_202_ms),
                }],
            }),
        },
    )?;
    eprintln!("written: {} and {}", a.out.display(), a.plot.display());
    Ok(())
}

/// The soak as a table: a row per interval, then the verdict and the totals.
pub fn print(r: &SoakReport) {
    println!(
        "soak: event {}, {:.1} min at {} purchases/s over {} buyers (per-user limit {}, \
         payment window {} s), a sample every {} s",
        r.event_id, r.minutes, r.rate, r.buyers, r.per_user_limit, r.pay_timeout_s, r.interval_s
    );
    println!(
        "  {:>6} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>6}",
        "t s",
        "RSS MB",
        "p50 ms",
        "p99 ms",
        "answered",
        "202",
        "cancels",
        "payments",
        "paid",
        "5xx"
    );
    let ms = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.1}"));
    for s in &r.samples {
        println!(
            "  {:>6.0} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>6}",
            s.t_s,
            ms(s.rss_mb),
            ms(s.p50_202_ms),
            ms(s.p99_202_ms),
            s.answers.values().sum::<u64>(),
            s.answers.get("202").copied().unwrap_or(0),
            s.cancels.values().sum::<u64>(),
            s.payments.values().sum::<u64>(),
            s.paid_so_far,
            s.server_errors
        );
    }
    let v = &r.rss;
    let verdict = match v.rss_flat {
        Some(flat) => flat.to_string(),
        None if v.core_restarts > 0 => format!("unknown (the core restarted {}×)", v.core_restarts),
        None => "unknown (too few samples after the warm-up)".into(),
    };
    println!(
        "  core RSS ({}): {:.1} MB before; after the {:.0} s warm-up first {:.1}, max {:.1}, \
         last {:.1} MB ({:+.1} %): rss_flat {verdict} (max within {:.0} % of first)",
        match r.cores {
            Cores::ThisStack => "this stack's core",
            Cores::EveryStampede => "every process named stampede",
        },
        r.rss_start_mb,
        r.warmup_s,
        v.rss_first_mb,
        v.rss_max_mb,
        v.rss_last_mb,
        v.rss_growth * 100.0,
        FLAT_WITHIN * 100.0
    );
    if let Some(l) = r.latency.get("202") {
        println!(
            "  202 over the soak: {} answers, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            l.count, l.p50_ms, l.p99_ms, l.max_ms
        );
    }
    println!(
        "  purchases {} sent ({} late) {:?}; cancellations {:?}; payments {:?}",
        r.purchases_sent, r.purchases_late, r.answers, r.cancel_answers, r.payment_answers
    );
    println!(
        "  orders: {} cancelled by their buyer, {} paid, {} timed out, {} 202s never ordered; \
         at the end {:?}",
        r.cancelled_by_buyer, r.paid, r.timed_out, r.never_created, r.orders
    );
    println!(
        "  5xx {}, no answer {} (reported, not failing the run)",
        r.server_errors, r.transport_errors
    );
    report::print_audit(&r.audit);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(minutes: f64, rate: u64, buyers: u64) -> SoakArgs {
        SoakArgs {
            minutes,
            rate,
            interval_s: 10.0,
            buyers,
            connections: 32,
            pay_timeout_s: 60,
            settle_timeout_s: 300,
            plot: "soak.svg".into(),
            out: "soak.json".into(),
        }
    }

    fn at(t_s: f64, rss_mb: f64) -> Sample {
        Sample {
            t_s,
            rss_mb: Some(rss_mb),
            core_pids: vec![1],
            answers: BTreeMap::new(),
            p50_202_ms: None,
            p99_202_ms: None,
            cancels: BTreeMap::new(),
            payments: BTreeMap::new(),
            server_errors: 0,
            transport_errors: 0,
            cancelled_so_far: 0,
            paid_so_far: 0,
        }
    }

    #[test]
    fn ten_minutes_at_200_per_s_make_an_event_that_never_sells_out_nor_limits() {
        let p = Plan::of(&args(10.0, 200, 2_000)).unwrap();
        assert_eq!(p.purchases, 120_000);
        assert_eq!(p.units, 144_000);
        assert_eq!(p.per_user_limit, 61);
        assert_eq!(p.warmup, Duration::from_secs(60));
        // A short run warms up for its first fifth.
        let p = Plan::of(&args(0.5, 10, 100)).unwrap();
        assert_eq!((p.purchases, p.warmup), (300, Duration::from_secs(6)));
    }

    #[test]
    fn too_few_buyers_for_the_rate_or_the_limit_are_refused() {
        assert!(Plan::of(&args(1.0, 200, 100)).is_err());
        // 60 min × 200/s over 200 buyers: 3 600 purchases each, over the bound.
        assert!(Plan::of(&args(60.0, 200, 200)).is_err());
    }

    #[test]
    fn fates_are_a_third_each() {
        let fates: Vec<Fate> = (0..6).map(Fate::of).collect();
        for f in [Fate::Cancel, Fate::Pay, Fate::TimeOut] {
            assert_eq!(fates.iter().filter(|x| **x == f).count(), 2);
        }
    }

    #[test]
    fn rss_is_flat_when_the_highest_after_the_warm_up_is_within_ten_percent_of_the_first() {
        // The warm-up's climb does not count; the baseline is the sample at its end.
        let flat = [
            at(30.0, 20.0),
            at(60.0, 50.0),
            at(90.0, 54.0),
            at(120.0, 52.0),
        ];
        let v = rss_verdict(&flat, 60.0);
        assert_eq!(
            (v.rss_first_mb, v.rss_max_mb, v.rss_last_mb),
            (50.0, 54.0, 52.0)
        );
        assert_eq!(v.rss_flat, Some(true));
        let climbing = [at(60.0, 50.0), at(90.0, 53.0), at(120.0, 56.0)];
        let v = rss_verdict(&climbing, 60.0);
        assert_eq!(v.rss_flat, Some(false));
        assert!((v.rss_growth - 0.12).abs() < 1e-9);
        // One sample after the warm-up tells nothing.
        assert_eq!(
            rss_verdict(&[at(10.0, 5.0), at(60.0, 9.0)], 60.0).rss_flat,
            None
        );
    }

    #[test]
    fn a_core_restarted_mid_soak_leaves_no_verdict() {
        let mut samples = [
            at(60.0, 50.0),
            at(90.0, 51.0),
            at(120.0, 30.0),
            at(150.0, 31.0),
        ];
        samples[1].rss_mb = None;
        samples[1].core_pids.clear();
        assert_eq!(rss_verdict(&samples, 60.0).rss_flat, Some(true));
        samples[2].core_pids = vec![2];
        samples[3].core_pids = vec![2];
        let v = rss_verdict(&samples, 60.0);
        assert_eq!((v.core_restarts, v.rss_flat), (1, None));
    }

    #[test]
    fn listening_sockets_are_found_by_port_in_the_tcp_table() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:4A93 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 100 0 0 10 0
   1: 0100007F:4A93 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0 20 4 30 10 -1
   2: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1 0 100 0 0 10 0
";
        // 0x4A93 is 19091: its listener, not the connection accepted on it.
        assert_eq!(listeners(table, 19_091), vec![4242]);
        assert_eq!(listeners(table, 8080), vec![4444]);
        assert!(listeners(table, 9091).is_empty());
    }

    #[test]
    fn vm_rss_is_read_from_the_status_file() {
        let status = "Name:\tstampede\nVmPeak:\t  900000 kB\nVmRSS:\t   51234 kB\nThreads:\t9\n";
        assert_eq!(vm_rss_kb(status), Some(51_234));
        assert_eq!(vm_rss_kb("Name:\tkthreadd\n"), None);
    }
}
