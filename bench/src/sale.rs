//! `stampede-bench sale`: an event, N buyers with tokens, a burst at the sale's open
//! through the edge, the wait until everything is settled, and the audit.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::Mutex;

use crate::audit::{self, Audit};
pub use crate::cli::SaleArgs;
use crate::fault::{FaultReport, inject};
use crate::load::{Conn, Request};
use crate::nodes::{self, NodeUse};
use crate::payrace::{self, PayRace};
use crate::record::{Latency, Recorder, error_code};
use crate::room::{self, RoomReport};
use crate::stack::{Stack, event_body};
use crate::train::{self, TrainReport};

/// What one submission is.
#[derive(Clone)]
struct Attempt {
    buyer: usize,
    key: String,
    body: bytes::Bytes,
    retries: u32,
    not_before: Option<Instant>,
    /// A follow-up a browser would make after a 202 (the repeat of a repeater).
    follow_up: bool,
    /// The buyer's first submission (not a bot's extra, a retry or a repeat).
    first: bool,
}

#[derive(Debug, Serialize)]
pub struct SaleReport {
    pub event_id: u64,
    pub buyers: u64,
    pub units: u64,
    pub connections: usize,
    pub requests: u64,
    pub burst_s: f64,
    pub requests_per_s: f64,
    pub admitted: u64,
    pub admitted_per_s: f64,
    pub orders: u64,
    pub orders_persisted_per_s: f64,
    /// From the open until every buyer had an answer to their first submission (retries
    /// after 429, repeats and bots' extras not waited for): the burst, answered.
    pub first_answers_s: f64,
    /// From the last answer of the burst to nothing queued and nothing unsynced.
    pub settle_s: f64,
    /// Of which: until every reservation was an order in MySQL (the rest is stock sync
    /// through RocketMQ).
    pub created_s: f64,
    pub answers: std::collections::BTreeMap<String, u64>,
    pub latency: std::collections::BTreeMap<String, Latency>,
    pub errors: u64,
    pub audit: Audit,
    /// The fault injected, if one was.
    pub fault: Option<FaultReport>,
    /// The payments raced against their orders' timeout, if asked (--pay-race).
    pub pay_race: Option<PayRace>,
    /// Each Redis node's EVALSHA calls and CPU over the sale (one node, or a cluster's six).
    pub redis_nodes: Vec<NodeUse>,
    /// Redis CPU (every node) per admitted purchase, µs, from the open until settled.
    pub redis_cpu_us_per_admission: f64,
    /// CPU µs per order in MySQL, per part (every process of each kind on this machine,
    /// as `compare` counts them, the bench client too), from just before the open until
    /// settled.
    pub cpu_us_per_order: std::collections::BTreeMap<String, f64>,
    /// (most − fewest) ÷ mean of the masters' EVALSHA calls; null with one master.
    pub masters_spread: Option<f64>,
    /// The Redis buckets the event's stock was split over (--buckets).
    pub buckets: u16,
    /// A train's seat-segments and what 12306's counters would have sold (--train).
    pub train: Option<TrainReport>,
    /// The waiting room's figures and checks (--waiting-room).
    pub waiting_room: Option<RoomReport>,
    /// [bucket start s, admitted, rejected] per 100 ms (in the JSON too: where a burst's
    /// time went, admissions against refusals, without reading the SVG).
    pub timeline: Vec<(f64, u64, u64)>,
}

pub async fn run(stack: &Stack, a: &SaleArgs) -> anyhow::Result<SaleReport> {
    anyhow::ensure!(
        a.buyers > 0 && a.connections > 0,
        "--buyers and --connections must be at least 1"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&a.repeat_share)
            && (0.0..=1.0).contains(&a.bot_share)
            && (0.0..=1.0).contains(&a.seat_share),
        "shares are between 0 and 1"
    );
    if a.waiting_room {
        return room::run(stack, a).await;
    }
    let mut body = match a.train {
        Some(t) => t.event_body(a.per_user_limit, Duration::from_secs(a.open_in_s)),
        None => event_body(
            "stampede-bench sale",
            a.units,
            a.categories.max(1),
            a.seats,
            a.per_user_limit,
            Duration::from_secs(a.open_in_s),
        ),
    };
    let units = match a.train {
        Some(t) => u64::from(t.seats * t.segments()),
        None => a.units + a.seats.map_or(0, |(r, c)| u64::from(r * c)),
    };
    body["pay_timeout_s"] = a.pay_timeout_s.into();
    body["buckets"] = a.buckets.into();
    let opens_at = Instant::now() + Duration::from_secs(a.open_in_s);
    let (event, categories) = stack.event(&body).await?;
    eprintln!(
        "event {event}: {units} units, {} buyers over {} connections",
        a.buyers, a.connections
    );
    // Buyer i is user first + i (the users are created in one consecutive range; each
    // token names its user: "<kid>.<user>.<expiry>.<signature>").
    let (first_user, tokens) = stack.buyers(a.buyers).await?;
    anyhow::ensure!(
        tokens.iter().enumerate().all(|(i, t)| {
            t.split('.').nth(1).and_then(|u| u.parse::<u64>().ok()) == Some(first_user + i as u64)
        }),
        "the buyers' user ids are not one consecutive range"
    );
    let tokens = Arc::new(tokens);

    // Who does what, decided up front from the seed.
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
    let unseated: Vec<u64> = categories[..a.categories.max(1) as usize].to_vec();
    let seated = a
        .seats
        .map(|_| *categories.last().expect("a seated category"));
    let mut queue = VecDeque::new();
    let mut repeaters = vec![false; a.buyers as usize];
    // A train's buyer keeps one journey over all their submissions.
    let mut journeys = Vec::new();
    for (b, repeats) in repeaters.iter_mut().enumerate() {
        let bot = rng.gen_bool(a.bot_share);
        *repeats = !bot && rng.gen_bool(a.repeat_share);
        let journey = a.train.map(|t| t.journey(&mut rng));
        journeys.extend(journey);
        let order = |rng: &mut rand::rngs::StdRng| -> serde_json::Value {
            if let Some(j) = journey {
                return serde_json::json!({"category_id": categories[0], "quantity": 1, "from": j.from, "to": j.to});
            }
            match (seated, a.seats) {
                (Some(cid), Some((rows, cols))) if rng.gen_bool(a.seat_share) => {
                    let seat = format!("{}:{}", rng.gen_range(1..=rows), rng.gen_range(1..=cols));
                    serde_json::json!({"category_id": cid, "seat_ids": [seat]})
                }
                _ => {
                    serde_json::json!({"category_id": unseated[rng.gen_range(0..unseated.len())], "quantity": 1})
                }
            }
        };
        let tries = if bot { a.bot_attempts.max(1) } else { 1 };
        for t in 0..tries {
            queue.push_back(Attempt {
                buyer: b,
                key: format!("b{b}-{t}"),
                body: bytes::Bytes::from(order(&mut rng).to_string()),
                retries: 0,
                not_before: None,
                follow_up: false,
                first: t == 0,
            });
        }
    }
    let repeaters = Arc::new(repeaters);
    let total_attempts = queue.len();
    let pending = Arc::new(AtomicUsize::new(total_attempts));
    let queue = Arc::new(Mutex::new(queue));
    let admitted_ids = Arc::new(std::sync::Mutex::new(Vec::<(u64, u64)>::new()));
    // A train's decisions: (µs after the open, buyer, admitted) of each 202 and SOLD_OUT.
    let decisions = Arc::new(std::sync::Mutex::new(Vec::<(u64, usize, bool)>::new()));
    let is_train = a.train.is_some();

    let redis_before = nodes::snapshot(stack).await?;
    let cpu_before = crate::cpu::snapshot();
    tokio::time::sleep_until(opens_at.into()).await;
    let started = Instant::now();
    let fault = a.fault.clone().map(|command| {
        tokio::spawn(inject(
            command,
            started,
            Duration::from_millis(a.fault_after_ms),
        ))
    });
    let deadline = started + Duration::from_secs(a.max_seconds);
    let bar = ProgressBar::new(total_attempts as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} burst {bar:40} {pos}/{len} answers  {per_sec}  {elapsed}",
        )
        .expect("valid template"),
    );
    let answered = Arc::new(AtomicU64::new(0));
    // The pace: submission n (over all connections) not before n / rate s after the open.
    let sent = Arc::new(AtomicU64::new(0));
    let rate = a.rate;
    // When the last buyer had the answer to their first submission, µs after the open.
    let first_answered = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..a.connections {
        let (queue, pending, tokens, repeaters, ids) = (
            queue.clone(),
            pending.clone(),
            tokens.clone(),
            repeaters.clone(),
            admitted_ids.clone(),
        );
        let (bar, answered, edge) = (bar.clone(), answered.clone(), stack.edge_for(c));
        let (first_answered, decisions) = (first_answered.clone(), decisions.clone());
        let sent = sent.clone();
        let max_retries = a.max_retries;
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::new(edge, c);
            let mut rec = Recorder::new(started);
            loop {
                if Instant::now() >= deadline || pending.load(Ordering::SeqCst) == 0 {
                    return rec;
                }
                let next = queue.lock().await.pop_front();
                let Some(attempt) = next else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                if let Some(t) = attempt.not_before
                    && t > Instant::now()
                {
                    tokio::time::sleep_until(t.into()).await;
                }
                if rate > 0 {
                    let n = sent.fetch_add(1, Ordering::Relaxed);
                    let slot = started + Duration::from_secs_f64(n as f64 / rate as f64);
                    tokio::time::sleep_until(slot.min(deadline).into()).await;
                }
                let req = Request {
                    method: http::Method::POST,
                    path: format!("/api/events/{event}/orders"),
                    bearer: Some(tokens[attempt.buyer].clone()),
                    idempotency_key: Some(attempt.key.clone()),
                    headers: Vec::new(),
                    body: attempt.body.clone(),
                };
                let answer = match conn.send(&req).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        rec.errors += 1;
                        pending.fetch_sub(1, Ordering::SeqCst);
                        continue;
                    }
                };
                rec.record(&answer);
                let at = started.elapsed().as_micros() as u64;
                if attempt.first {
                    first_answered.fetch_max(at, Ordering::Relaxed);
                }
                let sold_out = answer.status == 409 && error_code(&answer.body) == Some("SOLD_OUT");
                if is_train && (answer.status == 202 || sold_out) {
                    decisions
                        .lock()
                        .expect("not poisoned")
                        .push((at, attempt.buyer, !sold_out));
                }
                answered.fetch_add(1, Ordering::Relaxed);
                bar.inc(1);
                let mut follow = Vec::new();
                match answer.status {
                    202 => {
                        // A replay answers the first request id again: deduplicated below.
                        if let Some(rid) = answer.json()["request_id"]
                            .as_str()
                            .and_then(|s| s.parse().ok())
                        {
                            ids.lock()
                                .expect("not poisoned")
                                .push((first_user + attempt.buyer as u64, rid));
                        }
                        if repeaters[attempt.buyer] && !attempt.follow_up {
                            for key in [attempt.key.clone(), format!("{}-again", attempt.key)] {
                                follow.push(Attempt {
                                    key,
                                    follow_up: true,
                                    first: false,
                                    retries: 0,
                                    not_before: None,
                                    ..attempt.clone()
                                });
                            }
                        }
                    }
                    429 | 503 if attempt.retries < max_retries => {
                        let wait =
                            Duration::from_secs(answer.retry_after_s.unwrap_or(1).clamp(1, 5));
                        follow.push(Attempt {
                            first: false,
                            retries: attempt.retries + 1,
                            not_before: Some(Instant::now() + wait),
                            ..attempt.clone()
                        });
                    }
                    _ => {}
                }
                if !follow.is_empty() {
                    bar.inc_length(follow.len() as u64);
                    pending.fetch_add(follow.len(), Ordering::SeqCst);
                    let mut q = queue.lock().await;
                    q.extend(follow);
                }
                pending.fetch_sub(1, Ordering::SeqCst);
            }
        }));
    }
    let mut rec = Recorder::new(started);
    for t in tasks {
        rec.merge(t.await?);
    }
    bar.finish_and_clear();
    let last = rec.last_answer.unwrap_or(started);
    let burst_s = (last - started).as_secs_f64().max(1e-3);

    let fault = match fault {
        Some(task) => Some(task.await?),
        None => None,
    };
    let (created_at, settled_at) = stack
        .wait_settled(event, Duration::from_secs(a.settle_timeout_s))
        .await?;
    let redis_nodes = nodes::between(&redis_before, &nodes::snapshot(stack).await?);
    let cpu_after = crate::cpu::snapshot();
    let settle_s = (settled_at - last).as_secs_f64();
    let created_s = (created_at.max(last) - last).as_secs_f64();
    let mut admitted = admitted_ids.lock().expect("not poisoned").clone();
    admitted.sort_unstable_by_key(|(_, rid)| *rid);
    admitted.dedup_by_key(|(_, rid)| *rid);
    let pay_race = if a.pay_race > 0 {
        let within = Duration::from_secs(a.pay_timeout_s + a.settle_timeout_s);
        Some(payrace::run(stack, event, a.pay_race, a.seed, within).await?)
    } else {
        None
    };
    let mut audit = audit::run(stack, event, a.per_user_limit, &admitted).await?;
    if let Some(race) = &pay_race {
        audit.add("paid or cancelled, never both", race.violations.clone());
    }
    let persisted_window = (settled_at - started).as_secs_f64().max(1e-3);
    let train = a.train.map(|t| {
        let decisions = std::mem::take(&mut *decisions.lock().expect("not poisoned"));
        train::report(t, &journeys, decisions, &audit)
    });
    let cpu_us_per_order =
        crate::cpu::between(&cpu_before, &cpu_after, audit.orders).us_per_request;
    Ok(SaleReport {
        cpu_us_per_order,
        event_id: event,
        buyers: a.buyers,
        units,
        connections: a.connections,
        requests: rec.total(),
        burst_s,
        requests_per_s: rec.total() as f64 / burst_s,
        admitted: admitted.len() as u64,
        admitted_per_s: admitted.len() as f64 / burst_s,
        orders: audit.orders,
        orders_persisted_per_s: audit.orders as f64 / persisted_window,
        settle_s,
        created_s,
        first_answers_s: first_answered.load(Ordering::Relaxed) as f64 / 1e6,
        answers: rec.counts(),
        latency: rec.latencies(),
        errors: rec.errors,
        timeline: rec.timeline(),
        audit,
        fault,
        pay_race,
        redis_cpu_us_per_admission: redis_nodes.iter().map(|n| n.cpu_s).sum::<f64>() * 1e6
            / admitted.len().max(1) as f64,
        masters_spread: nodes::spread(&redis_nodes),
        buckets: a.buckets,
        train,
        waiting_room: None,
        redis_nodes,
    })
}
