//! `sale --waiting-room` (docs/waiting-room.md): every buyer joins the event's waiting
//! room through the edge before the open (with a proof of work if asked), polls its place
//! after it every --poll-s and buys once with its pass when its turn comes; then the sale's
//! audit, and the room's own checks and figures:
//!
//! - the lottery recomputed here from the revealed seed (its commitment, every position a
//!   buyer was told, admissions in line order);
//! - how long after the last unit sold the buyers still waiting read `sold_out`;
//! - the edge's CPU per poll it answers itself against per sold-out rejection;
//! - SALE_BUSY answers, and the client's CPU per proof of work (a bot's price per place).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::audit;
use crate::cpu;
use crate::load::{Answer, Conn, Request};
use crate::nodes;
use crate::record::{Recorder, error_code};
use crate::sale::{SaleArgs, SaleReport};
use crate::stack::{Stack, event_body};

/// The targets of docs/waiting-room.md's bench.
const SOLD_OUT_READ_TARGET_MS: f64 = 1_000.0;
const POLL_VS_REJECT_TARGET: f64 = 1.2;
/// Each edge worker adopts the leader's snapshot on its own 0.2 s timer, and answers from
/// it until it is 5 refreshes + 1 s old (state.lua), so two workers may tell the room's
/// progress that far apart: a poll answered waiting within this after someone behind
/// read your_turn is counted (and its lag reported), not a violation.
const EDGE_SKEW_US: u64 = 2_000_000;
/// Tokens the sold-out burst rotates over at least: the edge's per-buyer limit on
/// purchases (5 a second) would otherwise answer part of it RATE_LIMITED.
const REJECT_TOKENS: usize = 5_000;
/// Most tries of one purchase: retried after 429 / 503 or no answer while its pass is good.
const MAX_TRIES: u32 = 100;
/// Alternating bursts of each kind in the edge's CPU measurement.
const CPU_ROUNDS: u32 = 2;

/// The waiting room's part of the sale's report.
#[derive(Debug, Serialize)]
pub struct RoomReport {
    pub admit_per_s: String,
    pub challenge_bits: u8,
    pub pass_ttl_s: u32,
    pub poll_s: f64,
    /// From creating the event to the sale's open (the joins' planned time).
    pub open_in_s: f64,
    /// Joins answered 200: before the open (no position until the draw) and after it.
    pub joined_early: u64,
    pub joined_late: u64,
    /// Buyers with no place (their join refused, or not answered).
    pub not_joined: u64,
    /// From the first join sent to the last answered.
    pub joins_s: f64,
    pub joins_per_s: f64,
    pub join_answers: BTreeMap<String, u64>,
    /// With --challenge-bits: the client's CPU per proof, ms (what a bot pays per place),
    /// and the wall time of all the proofs.
    pub proof_cpu_ms: Option<f64>,
    pub proofs_s: Option<f64>,
    pub polls: u64,
    /// Polls per second from the open to the last poll: --buyers ÷ --poll-s if the
    /// client and the stack keep up, fewer if not (every buyer's cadence stretches).
    pub polls_per_s: f64,
    /// Polls answered by the edge from its snapshot (X-Queue-Source: edge).
    pub polls_from_edge: u64,
    /// Polls answered 200, by state; other answers by status and code.
    pub poll_states: BTreeMap<String, u64>,
    pub poll_answers: BTreeMap<String, u64>,
    pub poll_p99_ms: f64,
    /// Buyers whose turn came (your_turn read), whose pass expired unused, who bought.
    pub turns: u64,
    pub expired: u64,
    pub admitted: u64,
    /// Buyers whose turn came and whose purchase with the pass was refused SOLD_OUT: a
    /// pass released beyond the stock, which docs/waiting-room.md rules out ("nobody
    /// further gets a turn" while the units left are spoken for).
    pub turns_refused_sold_out: u64,
    /// Buyers still not done when the run's time was up.
    pub unfinished: u64,
    /// Purchases answered 503 SALE_BUSY (with auto, the target is 0).
    pub sale_busy: u64,
    /// From the last unit sold (the last 202's request) to the last buyer still waiting
    /// reading sold_out: includes up to one --poll-s of the buyer's own wait.
    pub sold_out_read_max_ms: Option<f64>,
    /// The system's part of it: the last poll sent after the last unit sold that was
    /// still answered waiting or your_turn, after that moment (0 if none).
    pub sold_out_stale_max_ms: Option<f64>,
    /// Buyers still waiting at the sold-out moment who read sold_out, and who did not.
    pub sold_out_readers: u64,
    pub sold_out_unread: u64,
    pub lottery: Lottery,
    pub edge_cpu: Option<EdgeCpu>,
    /// Edge (nginx) CPU per poll it answered ÷ per sold-out rejection.
    pub edge_cpu_poll_vs_reject: Option<f64>,
    /// The room's figures at the end (GET /admin/events/{id}/waiting-room).
    pub figures: Value,
    /// Each target and whether it was met (not part of the audit: the run fails only on
    /// the audit, the lottery's checks included).
    pub targets: Vec<(String, bool)>,
}

/// What the fairness record said and what was recomputed from it.
#[derive(Debug, Default, Serialize)]
pub struct Lottery {
    pub drawn: bool,
    pub commitment: String,
    pub seed: Option<String>,
    /// sha256(seed) = the commitment published before the draw.
    pub commitment_ok: bool,
    /// Users in `joined` (who joined before the open).
    pub joined: u64,
    /// Buyers whose every reported position was checked against the recomputed order.
    pub positions_checked: u64,
    /// Positions reported that differ from the recomputed order (or a late joiner's
    /// outside N+1 … N+late).
    pub positions_wrong: u64,
    /// Buyers in line before the last one admitted who were not admitted themselves,
    /// each explained by its pass: expired unused, or its purchase given up (429 / 503
    /// retries spent, transport errors) so the pass was left to expire.
    pub holes_explained: u64,
    /// Polls answered waiting after someone behind had read your_turn, within the edge
    /// workers' snapshot skew (EDGE_SKEW_US); beyond it they are violations.
    pub turn_inversions_within_skew: u64,
    /// The longest of them: how much later than someone behind a buyer still read waiting.
    pub turn_inversion_max_ms: f64,
}

/// The edge's CPU over a burst of polls it answered against a burst of purchases it
/// refused SOLD_OUT, the same client and connections.
#[derive(Debug, Serialize)]
pub struct EdgeCpu {
    pub seconds_each: u64,
    pub poll_answers: BTreeMap<String, u64>,
    pub polls_from_edge: u64,
    pub poll_nginx_us: f64,
    pub reject_answers: BTreeMap<String, u64>,
    pub rejects_sold_out: u64,
    pub reject_nginx_us: f64,
    /// CPU per part over each burst.
    pub poll_usage: cpu::Usage,
    pub reject_usage: cpu::Usage,
}

/// One buyer's run. Times are µs after the open.
#[derive(Debug, Default)]
struct Buyer {
    user: u64,
    /// Some(true): joined before the open; Some(false): after it.
    early: Option<bool>,
    nonce: Option<String>,
    /// Every distinct position it was told.
    positions: Vec<u64>,
    pass: Option<String>,
    pass_expires_ms: Option<i64>,
    polls: u64,
    tries: u32,
    first_turn: Option<u64>,
    /// The last poll sent that was answered waiting with a position.
    last_waiting_sent: Option<u64>,
    /// The last poll sent that was answered waiting or your_turn.
    last_live_sent: Option<u64>,
    sold_out_read: Option<u64>,
    expired: bool,
    /// The last purchase's answer: "202", "409 SOLD_OUT", …
    bought: Option<String>,
    /// (request id, when its request was sent).
    admitted: Option<(u64, u64)>,
    done: bool,
}

/// The user id in a user token, `<kid>.<user>.<expires>.<sig>`.
fn user_of(token: &str) -> anyhow::Result<u64> {
    token
        .split('.')
        .nth(1)
        .and_then(|u| u.parse().ok())
        .with_context(|| format!("no user id in token {token:.20}…"))
}

/// Leading zero bits of a digest.
fn zero_bits(digest: &[u8]) -> u32 {
    let mut n = 0;
    for b in digest {
        if *b != 0 {
            return n + b.leading_zeros();
        }
        n += 8;
    }
    n
}

/// A proof for the room's challenge (docs/waiting-room.md): a nonce such that SHA-256 of
/// `<challenge>:<user>:<event>:<nonce>` starts with `bits` zero bits; None after 64 ×
/// 2^bits tries (a chance of e^-64).
fn solve(challenge: &str, user: u64, event: u64, bits: u8) -> Option<String> {
    let prefix = Sha256::new_with_prefix(format!("{challenge}:{user}:{event}:").as_bytes());
    (0..64u64 << bits).map(|n| format!("{n:x}")).find(|nonce| {
        let mut h = prefix.clone();
        h.update(nonce.as_bytes());
        zero_bits(&h.finalize()) >= u32::from(bits)
    })
}

/// The line the fairness record describes, recomputed: `joined` ordered by the lowercase
/// hex SHA-256 of "<seed>:<user id>", ascending.
fn line_order(seed: &str, joined: &[u64]) -> Vec<u64> {
    let mut keyed: Vec<(String, u64)> = joined
        .iter()
        .map(|u| {
            (
                hex::encode(Sha256::digest(format!("{seed}:{u}").as_bytes())),
                *u,
            )
        })
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, u)| u).collect()
}

fn us_since(t0: Instant, t: Instant) -> u64 {
    t.saturating_duration_since(t0).as_micros() as u64
}

fn lock(b: &Mutex<Buyer>) -> std::sync::MutexGuard<'_, Buyer> {
    b.lock().unwrap_or_else(|e| e.into_inner())
}

pub async fn run(stack: &Stack, a: &SaleArgs) -> anyhow::Result<SaleReport> {
    anyhow::ensure!(a.poll_s > 0.0, "--poll-s must be positive");
    let (_, tokens) = stack.buyers(a.buyers).await?;
    let users: Vec<u64> = tokens
        .iter()
        .map(|t| user_of(t))
        .collect::<Result<_, _>>()?;
    let tokens = Arc::new(tokens);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());

    // The open: after the proofs (timed here on a few) and the joins are expected done.
    let proof_s = if a.challenge_bits > 0 {
        let t = Instant::now();
        let n = a.buyers.min(64);
        for u in 0..n {
            solve("calibration", u, 0, a.challenge_bits);
        }
        t.elapsed().as_secs_f64() / n as f64 * a.buyers as f64 / threads as f64
    } else {
        0.0
    };
    let joins_s = a.buyers as f64 / a.joins_per_s.max(1) as f64;
    let open_in = Duration::from_secs_f64(a.open_in_s as f64 + 3.0 + 1.5 * (proof_s + joins_s));
    let mut body = event_body(
        "stampede-bench waiting room",
        a.units,
        1,
        None,
        a.per_user_limit,
        open_in,
    );
    body["pay_timeout_s"] = a.pay_timeout_s.into();
    body["buckets"] = a.buckets.into();
    let created = Instant::now();
    let opens_at = created + open_in;
    let (event, categories) = stack.event(&body).await?;
    let admit: Value = if a.admit_per_s == "auto" {
        "auto".into()
    } else {
        a.admit_per_s.parse::<u32>()?.into()
    };
    let mut put = Request::post(
        format!("/admin/events/{event}/waiting-room"),
        &json!({
            "enabled": true, "admit_per_s": admit, "challenge_bits": a.challenge_bits,
            "pass_ttl_s": a.pass_ttl_s, "opens_before_s": (open_in.as_secs() + 600).min(86_400),
        }),
    );
    put.method = http::Method::PUT;
    let room = stack.admin(put, &[200]).await?;
    let commitment = room["waiting_room"]["commitment"]
        .as_str()
        .context("the room's commitment")?
        .to_owned();
    eprintln!(
        "event {event}: {} units, a waiting room ({} per s, {} bits, passes {} s); {} buyers join over {} connections, the sale opens in {:.1} s",
        a.units,
        a.admit_per_s,
        a.challenge_bits,
        a.pass_ttl_s,
        a.buyers,
        a.connections,
        open_in.as_secs_f64()
    );

    // The room as the edge and the core see it, within a few seconds.
    let fairness_path = format!("/api/events/{event}/queue/fairness");
    let mut before = Value::Null;
    for _ in 0..50 {
        let ans =
            crate::load::call(stack.edge, &Request::get(&fairness_path).bearer(&tokens[0])).await?;
        if ans.status == 200 {
            before = ans.json();
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::ensure!(
        before["commitment"] == commitment.as_str(),
        "the fairness record never showed the room's commitment: {before}"
    );

    let buyers: Arc<Vec<Mutex<Buyer>>> = Arc::new(
        users
            .iter()
            .map(|u| {
                Mutex::new(Buyer {
                    user: *u,
                    ..Buyer::default()
                })
            })
            .collect(),
    );

    // Proofs, all up front (as a bot farm would): the client's CPU per proof.
    let (mut proof_cpu_ms, mut proofs_s, mut challenge) = (None, None, None);
    if a.challenge_bits > 0 {
        let path = format!("/api/events/{event}/queue/challenge");
        let c = crate::load::call(stack.edge, &Request::get(path).bearer(&tokens[0])).await?;
        anyhow::ensure!(
            c.status == 200,
            "challenge: {}",
            String::from_utf8_lossy(&c.body)
        );
        let text = c.json()["challenge"]
            .as_str()
            .context("challenge")?
            .to_owned();
        let (cpu0, t0) = (cpu::own_s(), Instant::now());
        let bits = a.challenge_bits;
        let nonces = {
            let (text, users) = (text.clone(), users.clone());
            tokio::task::spawn_blocking(move || {
                let chunk = users.len().div_ceil(threads).max(1);
                std::thread::scope(|s| {
                    let parts: Vec<_> = users
                        .chunks(chunk)
                        .map(|us| {
                            let text = &text;
                            s.spawn(move || {
                                us.iter()
                                    .map(|u| solve(text, *u, event, bits))
                                    .collect::<Vec<_>>()
                            })
                        })
                        .collect();
                    parts
                        .into_iter()
                        .flat_map(|p| p.join().expect("a solver thread"))
                        .collect::<Vec<_>>()
                })
            })
            .await?
        };
        proofs_s = Some(t0.elapsed().as_secs_f64());
        proof_cpu_ms = Some((cpu::own_s() - cpu0) * 1e3 / a.buyers as f64);
        for (b, n) in buyers.iter().zip(nonces) {
            lock(b).nonce = n;
        }
        challenge = Some(text);
    }

    // The joins, before the open.
    let joins = join_all(stack, a, event, &tokens, &buyers, challenge.as_deref()).await?;
    let (mut joined_early, mut joined_late) = (0, 0);
    for b in buyers.iter() {
        match lock(b).early {
            Some(true) => joined_early += 1,
            Some(false) => joined_late += 1,
            None => {}
        }
    }
    if joined_late > 0 {
        eprintln!(
            "{joined_late} joins came after the open (raise --joins-per-s' estimate or --open-in-s)"
        );
    }

    // The open: every buyer polls, and buys when its turn comes.
    let redis_before = nodes::snapshot(stack).await?;
    let cpu_before = crate::cpu::snapshot();
    tokio::time::sleep_until(opens_at.into()).await;
    let started = Instant::now();
    let run = poll_and_buy(stack, a, event, categories[0], &tokens, &buyers, started).await?;
    let last = run.buys.last_answer.unwrap_or(started);
    let all_done = run
        .polls
        .last_answer
        .max(run.buys.last_answer)
        .unwrap_or(started);
    let burst_s = (last - started).as_secs_f64().max(1e-3);
    let (created_at, settled_at) = stack
        .wait_settled(event, Duration::from_secs(a.settle_timeout_s))
        .await?;
    let redis_nodes = nodes::between(&redis_before, &nodes::snapshot(stack).await?);
    let cpu_after = crate::cpu::snapshot();

    let mut admitted: Vec<(u64, u64)> = buyers
        .iter()
        .filter_map(|b| {
            let b = lock(b);
            b.admitted.map(|(rid, _)| (b.user, rid))
        })
        .collect();
    admitted.sort_unstable_by_key(|(_, rid)| *rid);
    let mut audit = audit::run(stack, event, a.per_user_limit, &admitted).await?;

    // The lottery, recomputed from the record published after the draw.
    let fair = crate::load::call(stack.edge, &Request::get(&fairness_path).bearer(&tokens[0]))
        .await?
        .json();
    let lottery = check_lottery(&fair, &commitment, &buyers, &mut audit);

    // Sold out, as the buyers still waiting read it.
    let sold_out = SoldOut::of(&buyers);

    let figures = stack
        .admin(
            Request::get(format!("/admin/events/{event}/waiting-room")),
            &[200],
        )
        .await?["figures"]
        .clone();

    // The edge's CPU: polls it answers against purchases it refuses, the sale over.
    let edge_cpu = if sold_out.t0.is_some() {
        Some(edge_cpu(stack, a, event, categories[0], &tokens).await?)
    } else {
        None
    };
    let poll_vs_reject = edge_cpu
        .as_ref()
        .filter(|c| c.reject_nginx_us > 0.0 && c.polls_from_edge > 0 && c.rejects_sold_out > 0)
        .map(|c| c.poll_nginx_us / c.reject_nginx_us);

    let sale_busy = run.buys.count("503 SALE_BUSY");
    let mut targets = vec![(
        format!(
            "sold_out_stale_max_ms ≤ {SOLD_OUT_READ_TARGET_MS} (sold_out_read_max_ms less the buyers' own poll wait)"
        ),
        sold_out
            .stale_ms
            .is_some_and(|ms| ms <= SOLD_OUT_READ_TARGET_MS),
    )];
    targets.push((
        format!("edge_cpu_poll_vs_reject ≤ {POLL_VS_REJECT_TARGET}"),
        poll_vs_reject.is_some_and(|r| r <= POLL_VS_REJECT_TARGET),
    ));
    if a.admit_per_s == "auto" {
        targets.push(("no SALE_BUSY with auto".into(), sale_busy == 0));
    }
    targets.push((
        "no turn beyond the stock (a pass refused SOLD_OUT)".into(),
        !buyers
            .iter()
            .any(|b| lock(b).bought.as_deref() == Some("409 SOLD_OUT")),
    ));

    let count = |f: &dyn Fn(&Buyer) -> bool| buyers.iter().filter(|b| f(&lock(b))).count() as u64;
    let polls = run.polls.total();
    let poll_p99_ms = run.polls.latencies().get("200").map_or(0.0, |l| l.p99_ms);
    let report = RoomReport {
        admit_per_s: a.admit_per_s.clone(),
        challenge_bits: a.challenge_bits,
        pass_ttl_s: a.pass_ttl_s,
        poll_s: a.poll_s,
        open_in_s: open_in.as_secs_f64(),
        joined_early,
        joined_late,
        not_joined: a.buyers - joined_early - joined_late,
        joins_s: joins.seconds,
        joins_per_s: (joined_early + joined_late) as f64 / joins.seconds.max(1e-3),
        join_answers: joins.answers,
        proof_cpu_ms,
        proofs_s,
        polls,
        polls_per_s: polls as f64
            / run
                .polls
                .last_answer
                .map_or(1e-3, |t| (t - started).as_secs_f64().max(1e-3)),
        polls_from_edge: run.polls_from_edge,
        poll_states: run.states,
        poll_answers: run.polls.counts(),
        poll_p99_ms,
        turns: count(&|b| b.first_turn.is_some()),
        turns_refused_sold_out: count(&|b| b.bought.as_deref() == Some("409 SOLD_OUT")),
        expired: count(&|b| b.expired),
        admitted: admitted.len() as u64,
        unfinished: count(&|b| !b.done),
        sale_busy,
        sold_out_read_max_ms: sold_out.read_ms,
        sold_out_stale_max_ms: sold_out.stale_ms,
        sold_out_readers: sold_out.readers,
        sold_out_unread: sold_out.unread,
        lottery,
        edge_cpu_poll_vs_reject: poll_vs_reject,
        edge_cpu,
        figures,
        targets,
    };
    let persisted_window = (settled_at - started).as_secs_f64().max(1e-3);
    let buys = run.buys;
    let cpu_us_per_order =
        crate::cpu::between(&cpu_before, &cpu_after, audit.orders).us_per_request;
    Ok(SaleReport {
        cpu_us_per_order,
        event_id: event,
        buyers: a.buyers,
        units: a.units,
        connections: a.connections,
        requests: buys.total(),
        burst_s,
        requests_per_s: buys.total() as f64 / burst_s,
        admitted: admitted.len() as u64,
        admitted_per_s: admitted.len() as f64 / burst_s,
        orders: audit.orders,
        orders_persisted_per_s: audit.orders as f64 / persisted_window,
        // Every buyer done (bought, or read sold_out, closed or expired).
        first_answers_s: (all_done - started).as_secs_f64(),
        settle_s: (settled_at - last).as_secs_f64(),
        created_s: (created_at.max(last) - last).as_secs_f64(),
        answers: buys.counts(),
        latency: buys.latencies(),
        errors: buys.errors + run.polls.errors,
        timeline: buys.timeline(),
        audit,
        fault: None,
        pay_race: None,
        redis_cpu_us_per_admission: redis_nodes.iter().map(|n| n.cpu_s).sum::<f64>() * 1e6
            / admitted.len().max(1) as f64,
        masters_spread: nodes::spread(&redis_nodes),
        buckets: a.buckets,
        train: None,
        waiting_room: Some(report),
        redis_nodes,
    })
}

struct Joins {
    seconds: f64,
    answers: BTreeMap<String, u64>,
}

/// Every buyer joins once (retried after 429 / 503 up to --max-retries), over
/// --connections, as fast as they go.
async fn join_all(
    stack: &Stack,
    a: &SaleArgs,
    event: u64,
    tokens: &Arc<Vec<String>>,
    buyers: &Arc<Vec<Mutex<Buyer>>>,
    challenge: Option<&str>,
) -> anyhow::Result<Joins> {
    let next = Arc::new(AtomicUsize::new(0));
    let bar = ProgressBar::new(a.buyers);
    bar.set_style(
        ProgressStyle::with_template("{spinner} joins {bar:40} {pos}/{len}  {per_sec}  {elapsed}")
            .expect("valid template"),
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs(a.max_seconds);
    let path = format!("/api/events/{event}/queue");
    let mut tasks = Vec::new();
    for c in 0..a.connections {
        let (next, tokens, buyers, bar) =
            (next.clone(), tokens.clone(), buyers.clone(), bar.clone());
        let (path, challenge, edge) = (
            path.clone(),
            challenge.map(str::to_owned),
            stack.edge_for(c),
        );
        let max_retries = a.max_retries;
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::new(edge, c);
            let mut rec = Recorder::new(started);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= buyers.len() || Instant::now() >= deadline {
                    return rec;
                }
                let body = match (&challenge, lock(&buyers[i]).nonce.clone()) {
                    (Some(c), Some(n)) => json!({"challenge": c, "nonce": n}),
                    _ => json!({}),
                };
                let req = Request::post(&path, &body).bearer(&tokens[i]);
                for retry in 0..=max_retries {
                    let Ok(ans) = conn.send(&req).await else {
                        rec.errors += 1;
                        continue;
                    };
                    rec.record(&ans);
                    if ans.status == 200 {
                        let place = ans.json();
                        let mut b = lock(&buyers[i]);
                        match place["position"].as_u64() {
                            Some(p) => {
                                b.early = Some(false);
                                b.positions.push(p);
                            }
                            None => b.early = Some(true),
                        }
                        break;
                    }
                    if !matches!(ans.status, 429 | 503) || retry == max_retries {
                        break;
                    }
                    let wait = ans.retry_after_s.unwrap_or(1).clamp(1, 5);
                    tokio::time::sleep(Duration::from_secs(wait)).await;
                }
                bar.inc(1);
            }
        }));
    }
    let mut rec = Recorder::new(started);
    for t in tasks {
        rec.merge(t.await?);
    }
    bar.finish_and_clear();
    let seconds = (rec.last_answer.unwrap_or(started) - started)
        .as_secs_f64()
        .max(1e-3);
    let mut answers = rec.counts();
    if rec.errors > 0 {
        answers.insert("transport errors".into(), rec.errors);
    }
    Ok(Joins { seconds, answers })
}

struct Run {
    polls: Recorder,
    polls_from_edge: u64,
    states: BTreeMap<String, u64>,
    buys: Recorder,
}

/// After the open: each buyer polls every --poll-s (the first poll at a random moment of
/// the first period), buys once with its pass on your_turn (the same purchase retried
/// after 429 / 503 or no answer while the pass is good), and stops on a 202, sold_out,
/// closed, expired or a refused purchase. Bounded: --max-seconds, polls per buyer,
/// MAX_TRIES.
async fn poll_and_buy(
    stack: &Stack,
    a: &SaleArgs,
    event: u64,
    category: u64,
    tokens: &Arc<Vec<String>>,
    buyers: &Arc<Vec<Mutex<Buyer>>>,
    started: Instant,
) -> anyhow::Result<Run> {
    let period = Duration::from_secs_f64(a.poll_s);
    let max_polls = (a.max_seconds as f64 / a.poll_s).ceil() as u64 + 10;
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
    let due: BinaryHeap<Reverse<(Instant, usize)>> = (0..buyers.len())
        .filter(|i| lock(&buyers[*i]).early.is_some())
        .map(|i| Reverse((started + period.mul_f64(rng.gen_range(0.0..1.0)), i)))
        .collect();
    let pending = Arc::new(AtomicUsize::new(due.len()));
    for b in buyers.iter() {
        let mut b = lock(b);
        b.done = b.early.is_none();
    }
    let due = Arc::new(Mutex::new(due));
    let deadline = started + Duration::from_secs(a.max_seconds);
    let bar = ProgressBar::new(pending.load(Ordering::SeqCst) as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} room {bar:40} {pos}/{len} buyers done  {msg}  {elapsed}",
        )
        .expect("valid template"),
    );
    let polled = Arc::new(AtomicU64::new(0));
    let queue_path = format!("/api/events/{event}/queue");
    let order_path = format!("/api/events/{event}/orders");
    let order = bytes::Bytes::from(json!({"category_id": category, "quantity": 1}).to_string());
    let mut tasks = Vec::new();
    for c in 0..a.connections {
        let (due, pending, tokens, buyers) =
            (due.clone(), pending.clone(), tokens.clone(), buyers.clone());
        let (bar, polled, edge) = (bar.clone(), polled.clone(), stack.edge_for(c));
        let (queue_path, order_path, order) =
            (queue_path.clone(), order_path.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::new(edge, c);
            let mut run = Run {
                polls: Recorder::new(started),
                polls_from_edge: 0,
                states: BTreeMap::new(),
                buys: Recorder::new(started),
            };
            loop {
                if Instant::now() >= deadline || pending.load(Ordering::SeqCst) == 0 {
                    return run;
                }
                let next = due.lock().unwrap_or_else(|e| e.into_inner()).pop();
                let Some(Reverse((at, i))) = next else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                if at > Instant::now() {
                    tokio::time::sleep_until(at.min(deadline).into()).await;
                }
                if Instant::now() >= deadline {
                    return run;
                }
                let pass = lock(&buyers[i]).pass.clone();
                let sent = us_since(started, Instant::now());
                let (again, done) = match pass {
                    Some(pass) => {
                        let req = Request {
                            method: http::Method::POST,
                            path: order_path.clone(),
                            bearer: Some(tokens[i].clone()),
                            idempotency_key: Some(format!("w{i}")),
                            headers: vec![("queue-pass", pass)],
                            body: order.clone(),
                        };
                        let ans = conn.send(&req).await.ok();
                        match &ans {
                            Some(ans) => run.buys.record(ans),
                            None => run.buys.errors += 1,
                        }
                        bought(&mut lock(&buyers[i]), ans.as_ref(), sent)
                    }
                    None => {
                        let req = Request::get(&queue_path).bearer(&tokens[i]);
                        polled.fetch_add(1, Ordering::Relaxed);
                        match conn.send(&req).await {
                            Ok(ans) => {
                                run.polls.record(&ans);
                                run.polls_from_edge += u64::from(ans.from_edge);
                                let received = us_since(started, Instant::now());
                                let mut b = lock(&buyers[i]);
                                let (again, state) =
                                    polled_place(&mut b, &ans, sent, received, period);
                                if let Some(state) = state {
                                    *run.states.entry(state).or_default() += 1;
                                }
                                b.polls += 1;
                                if again.is_some() && b.polls >= max_polls {
                                    (None, true)
                                } else {
                                    (again, again.is_none())
                                }
                            }
                            Err(_) => {
                                run.polls.errors += 1;
                                let mut b = lock(&buyers[i]);
                                b.polls += 1;
                                let stop = b.polls >= max_polls;
                                (if stop { None } else { Some(period) }, stop)
                            }
                        }
                    }
                };
                if let Some(wait) = again {
                    due.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Reverse((Instant::now() + wait, i)));
                }
                if done {
                    lock(&buyers[i]).done = true;
                    pending.fetch_sub(1, Ordering::SeqCst);
                    bar.inc(1);
                    bar.set_message(format!("{} polls", polled.load(Ordering::Relaxed)));
                }
            }
        }));
    }
    let mut all = Run {
        polls: Recorder::new(started),
        polls_from_edge: 0,
        states: BTreeMap::new(),
        buys: Recorder::new(started),
    };
    for t in tasks {
        let run = t.await?;
        all.polls.merge(run.polls);
        all.buys.merge(run.buys);
        all.polls_from_edge += run.polls_from_edge;
        for (s, n) in run.states {
            *all.states.entry(s).or_default() += n;
        }
    }
    bar.finish_and_clear();
    Ok(all)
}

/// A poll's answer taken in: (when to come again, if at all; the state read).
fn polled_place(
    b: &mut Buyer,
    ans: &Answer,
    sent: u64,
    received: u64,
    period: Duration,
) -> (Option<Duration>, Option<String>) {
    if ans.status != 200 {
        return (Some(period), None);
    }
    let place = ans.json();
    if let Some(p) = place["position"].as_u64()
        && !b.positions.contains(&p)
    {
        b.positions.push(p);
    }
    let state = place["state"].as_str().unwrap_or("?").to_owned();
    let again = match state.as_str() {
        "waiting" => {
            if place["position"].is_u64() {
                b.last_waiting_sent = Some(sent);
            }
            b.last_live_sent = Some(sent);
            Some(period)
        }
        "your_turn" => {
            b.last_live_sent = Some(sent);
            b.first_turn.get_or_insert(received);
            b.pass = place["pass"].as_str().map(str::to_owned);
            b.pass_expires_ms = place["pass_expires_ms"].as_i64();
            // Buy now (no pass in the answer: poll again).
            Some(if b.pass.is_some() {
                Duration::ZERO
            } else {
                period
            })
        }
        "sold_out" => {
            b.sold_out_read.get_or_insert(received);
            None
        }
        "expired" => {
            b.expired = true;
            None
        }
        _ => None,
    };
    (again, Some(state))
}

/// A purchase's answer (None: no answer) taken in: (when to try again, if at all; done).
fn bought(b: &mut Buyer, ans: Option<&Answer>, sent: u64) -> (Option<Duration>, bool) {
    b.tries += 1;
    let Some(ans) = ans else {
        b.bought = Some("transport error".into());
        return b.retry(Duration::from_secs(1));
    };
    b.bought = Some(match error_code(&ans.body) {
        Some(code) => format!("{} {code}", ans.status),
        None => ans.status.to_string(),
    });
    if ans.status == 202 {
        b.admitted = ans.json()["request_id"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .map(|rid| (rid, sent));
        return (None, true);
    }
    if matches!(ans.status, 429 | 503) {
        return b.retry(Duration::from_secs(
            ans.retry_after_s.unwrap_or(1).clamp(1, 5),
        ));
    }
    (None, true)
}

impl Buyer {
    /// The same purchase again after `wait` if its pass is still good then (at most
    /// MAX_TRIES in all), else done: the pass is left to expire.
    fn retry(&self, wait: Duration) -> (Option<Duration>, bool) {
        let until = chrono::Utc::now().timestamp_millis() + wait.as_millis() as i64;
        if self.tries < MAX_TRIES && self.pass_expires_ms.is_some_and(|e| until < e) {
            (Some(wait), false)
        } else {
            (None, true)
        }
    }
}

/// The lottery's checks, each added to the audit (a violation fails the run).
fn check_lottery(
    fair: &Value,
    commitment: &str,
    buyers: &[Mutex<Buyer>],
    audit: &mut audit::Audit,
) -> Lottery {
    let mut lottery = Lottery {
        drawn: fair["drawn"] == true,
        commitment: fair["commitment"].as_str().unwrap_or("").to_owned(),
        seed: fair["seed"].as_str().map(str::to_owned),
        ..Lottery::default()
    };
    let mut record = Vec::new();
    if !lottery.drawn || lottery.seed.is_none() {
        record.push(format!("no draw revealed after the open: {fair}"));
    }
    let seed = lottery.seed.clone().unwrap_or_default();
    lottery.commitment_ok = lottery.commitment == commitment
        && hex::encode(Sha256::digest(seed.as_bytes())) == commitment;
    if !lottery.commitment_ok {
        record.push(format!(
            "sha256(seed {seed:?}) is not the commitment {commitment} published before the draw"
        ));
    }
    let joined: Vec<u64> = fair["joined"]
        .as_array()
        .map(|j| j.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    lottery.joined = joined.len() as u64;
    let early: HashSet<u64> = buyers
        .iter()
        .map(|b| lock(b))
        .filter(|b| b.early == Some(true))
        .map(|b| b.user)
        .collect();
    let listed: HashSet<u64> = joined.iter().copied().collect();
    let missing = early.difference(&listed).count();
    let extra = listed.difference(&early).count();
    if missing > 0 || extra > 0 || listed.len() != joined.len() {
        record.push(format!(
            "joined lists {} users: {missing} who joined before the open are missing, {extra} are not ours (or repeated)",
            joined.len()
        ));
    }
    audit.add(
        "lottery: the seed committed and the joiners published",
        record,
    );

    // Every position a buyer was told is its place in the recomputed line (a late
    // joiner: behind all N, within N + late).
    let order = line_order(&seed, &joined);
    let place: HashMap<u64, u64> = order
        .iter()
        .enumerate()
        .map(|(i, u)| (*u, i as u64 + 1))
        .collect();
    let n = order.len() as u64;
    let late = buyers
        .iter()
        .filter(|b| lock(b).early == Some(false))
        .count() as u64;
    let mut wrong = Vec::new();
    let mut late_seen = HashSet::new();
    for b in buyers.iter().map(|b| lock(b)) {
        if b.positions.is_empty() {
            continue;
        }
        lottery.positions_checked += 1;
        let ok = match b.early {
            Some(true) => b.positions.iter().all(|p| place.get(&b.user) == Some(p)),
            _ => {
                b.positions.len() == 1
                    && (n + 1..=n + late).contains(&b.positions[0])
                    && late_seen.insert(b.positions[0])
            }
        };
        if !ok {
            lottery.positions_wrong += 1;
            wrong.push(format!(
                "user {} was told position(s) {:?}; the lottery's is {:?}",
                b.user,
                b.positions,
                place.get(&b.user)
            ));
        }
    }
    wrong.truncate(20);
    audit.add("lottery: every position told is the recomputed one", wrong);

    // In line order: nobody's turn before someone ahead still read waiting, and the
    // buyers admitted are the first in line whose turn came — anyone ahead of the last
    // one admitted and not admitted had their turn (a pass expired or a purchase failed).
    let mut by_position: Vec<(u64, std::sync::MutexGuard<'_, Buyer>)> = buyers
        .iter()
        .map(|b| lock(b))
        .filter_map(|b| {
            let p = match b.early {
                Some(true) => place.get(&b.user).copied(),
                _ => b.positions.first().copied(),
            }?;
            Some((p, b))
        })
        .collect();
    by_position.sort_unstable_by_key(|(p, _)| *p);
    let mut out_of_order = Vec::new();
    let mut ahead_waiting: Option<(u64, u64)> = None; // (latest waiting read sent, position)
    for (p, b) in &by_position {
        if let (Some(turn), Some((waiting, q))) = (b.first_turn, ahead_waiting)
            && waiting > turn
        {
            if waiting - turn <= EDGE_SKEW_US {
                lottery.turn_inversions_within_skew += 1;
                lottery.turn_inversion_max_ms = lottery
                    .turn_inversion_max_ms
                    .max((waiting - turn) as f64 / 1e3);
            } else {
                out_of_order.push(format!(
                    "position {p} read your_turn {turn} µs after the open, position {q} still read waiting at {waiting} µs"
                ));
            }
        }
        if let Some(w) = b.last_waiting_sent
            && ahead_waiting.is_none_or(|(t, _)| w > t)
        {
            ahead_waiting = Some((w, *p));
        }
    }
    let last_admitted = by_position
        .iter()
        .filter(|(_, b)| b.admitted.is_some())
        .map(|(p, _)| *p)
        .max()
        .unwrap_or(0);
    for (p, b) in by_position.iter().take_while(|(p, _)| *p < last_admitted) {
        if b.admitted.is_some() {
            continue;
        }
        match b.bought.as_deref() {
            _ if b.expired => lottery.holes_explained += 1,
            Some("409 SOLD_OUT") => out_of_order.push(format!(
                "position {p} (user {}) had its turn and was refused SOLD_OUT with its pass, position {last_admitted} was admitted",
                b.user
            )),
            _ if b.first_turn.is_some() => lottery.holes_explained += 1,
            _ => out_of_order.push(format!(
                "position {p} (user {}) never read your_turn (it read {}), position {last_admitted} was admitted",
                b.user,
                if b.sold_out_read.is_some() {
                    "sold_out"
                } else {
                    "waiting"
                }
            )),
        }
    }
    out_of_order.truncate(20);
    audit.add("lottery: turns and admissions in line order", out_of_order);
    lottery
}

/// The sold-out moment (the last 202's request) and how the buyers still waiting then
/// read it.
struct SoldOut {
    t0: Option<u64>,
    read_ms: Option<f64>,
    stale_ms: Option<f64>,
    readers: u64,
    unread: u64,
}

impl SoldOut {
    fn of(buyers: &[Mutex<Buyer>]) -> SoldOut {
        let any_read = buyers.iter().any(|b| lock(b).sold_out_read.is_some());
        let t0 = buyers
            .iter()
            .filter_map(|b| lock(b).admitted.map(|(_, sent)| sent))
            .max()
            .filter(|_| any_read);
        let Some(t0) = t0 else {
            return SoldOut {
                t0: None,
                read_ms: None,
                stale_ms: None,
                readers: 0,
                unread: 0,
            };
        };
        let (mut read, mut stale, mut readers, mut unread) = (0, 0, 0, 0);
        for b in buyers.iter().map(|b| lock(b)) {
            if b.early.is_none() || b.admitted.is_some() {
                continue;
            }
            if let Some(live) = b.last_live_sent {
                stale = stale.max(live.saturating_sub(t0));
            }
            match b.sold_out_read {
                Some(at) => {
                    readers += 1;
                    read = read.max(at.saturating_sub(t0));
                }
                // Still waiting at the sold-out moment and never told.
                None if !b.expired && b.first_turn.is_none() => unread += 1,
                None => {}
            }
        }
        SoldOut {
            t0: Some(t0),
            read_ms: Some(read as f64 / 1e3),
            stale_ms: Some(stale as f64 / 1e3),
            readers,
            unread,
        }
    }
}

/// Every connection sends `make(conn, n)` back to back for `duration`: the recorder and
/// the answers the edge marked as its own.
async fn burst<F>(
    stack: &Stack,
    connections: usize,
    duration: Duration,
    make: F,
) -> anyhow::Result<(Recorder, u64)>
where
    F: Fn(usize, u64) -> Request + Send + Sync + 'static,
{
    let make = Arc::new(make);
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for c in 0..connections {
        let (make, edge) = (make.clone(), stack.edge_for(c));
        tasks.push(tokio::spawn(async move {
            let (mut conn, mut rec, mut edge_n) = (Conn::new(edge, c), Recorder::new(started), 0);
            let mut n = 0;
            while Instant::now() < deadline {
                match conn.send(&make(c, n)).await {
                    Ok(a) => {
                        rec.record(&a);
                        edge_n += u64::from(a.from_edge);
                    }
                    Err(_) => {
                        rec.errors += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                n += 1;
            }
            (rec, edge_n)
        }));
    }
    let (mut all, mut edge_n) = (Recorder::new(started), 0);
    for t in tasks {
        let (rec, n) = t.await?;
        all.merge(rec);
        edge_n += n;
    }
    Ok((all, edge_n))
}

/// nginx's CPU per poll the edge answered against per purchase it refused SOLD_OUT: the
/// same connections and loop, the sale over (both answered from the edge's snapshot),
/// alternating bursts of each. Polls rotate over the buyers' tokens (the edge knows
/// them); purchases over at least REJECT_TOKENS users.
async fn edge_cpu(
    stack: &Stack,
    a: &SaleArgs,
    event: u64,
    category: u64,
    tokens: &Arc<Vec<String>>,
) -> anyhow::Result<EdgeCpu> {
    let d = Duration::from_secs(a.cpu_burst_s.max(1));
    let c = a.connections.min(64);
    let mut rejecting = tokens.to_vec();
    if rejecting.len() < REJECT_TOKENS {
        let (_, more) = stack
            .buyers((REJECT_TOKENS - rejecting.len()) as u64)
            .await?;
        rejecting.extend(more);
    }
    let rejecting = Arc::new(rejecting);
    let pick = |len: usize| move |c: usize, n: u64| (n as usize * 64 + c) % len;
    let body = bytes::Bytes::from(json!({"category_id": category, "quantity": 1}).to_string());
    let (mut polls, mut rejects) = (Recorder::new(Instant::now()), Recorder::new(Instant::now()));
    let mut polls_from_edge = 0;
    let (mut poll_cpu, mut reject_cpu) = (BTreeMap::new(), BTreeMap::new());
    let add = |to: &mut BTreeMap<String, f64>, u: cpu::Usage| {
        for (part, s) in u.cpu_s {
            *to.entry(part).or_default() += s;
        }
    };
    for round in 0..CPU_ROUNDS {
        let (t, path, at) = (
            tokens.clone(),
            format!("/api/events/{event}/queue"),
            pick(tokens.len()),
        );
        let t0 = cpu::snapshot();
        let (rec, from_edge) = burst(stack, c, d, move |c, n| {
            Request::get(path.clone()).bearer(&t[at(c, n)])
        })
        .await?;
        add(&mut poll_cpu, cpu::between(&t0, &cpu::snapshot(), 1));
        polls.merge(rec);
        polls_from_edge += from_edge;
        let (t, path, at, body) = (
            rejecting.clone(),
            format!("/api/events/{event}/orders"),
            pick(rejecting.len()),
            body.clone(),
        );
        let t0 = cpu::snapshot();
        let (rec, _) = burst(stack, c, d, move |c, n| Request {
            method: http::Method::POST,
            path: path.clone(),
            bearer: Some(t[at(c, n)].clone()),
            idempotency_key: Some(format!("cpu{round}-{c}-{n}")),
            headers: Vec::new(),
            body: body.clone(),
        })
        .await?;
        add(&mut reject_cpu, cpu::between(&t0, &cpu::snapshot(), 1));
        rejects.merge(rec);
    }
    let rejects_sold_out = rejects.count("409 SOLD_OUT");
    let usage = |cpu_s: BTreeMap<String, f64>, n: u64| cpu::Usage {
        us_per_request: cpu_s
            .iter()
            .map(|(p, s)| (p.clone(), s * 1e6 / n.max(1) as f64))
            .collect(),
        cpu_s,
        ..Default::default()
    };
    let (poll_usage, reject_usage) = (
        usage(poll_cpu, polls_from_edge),
        usage(reject_cpu, rejects_sold_out),
    );
    let nginx = |u: &cpu::Usage| u.us_per_request.get("nginx").copied().unwrap_or(0.0);
    Ok(EdgeCpu {
        seconds_each: d.as_secs() * u64::from(CPU_ROUNDS),
        poll_answers: polls.counts(),
        polls_from_edge,
        poll_nginx_us: nginx(&poll_usage),
        reject_answers: rejects.counts(),
        rejects_sold_out,
        reject_nginx_us: nginx(&reject_usage),
        poll_usage,
        reject_usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_has_its_zero_bits_for_its_user_only() {
        let nonce = solve("7.abc", 42, 9, 10).expect("a nonce");
        let d = Sha256::digest(format!("7.abc:42:9:{nonce}").as_bytes());
        assert!(zero_bits(&d) >= 10);
        assert!(nonce.bytes().all(|b| b.is_ascii_alphanumeric()) && nonce.len() <= 32);
        assert_eq!(zero_bits(&[0, 0x10, 0xff]), 11);
        assert_eq!(zero_bits(&[0x80]), 0);
    }

    #[test]
    fn the_line_is_the_joiners_by_their_hashed_ticket() {
        let order = line_order("aa", &[3, 1, 2, 10]);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [1, 2, 3, 10]);
        let key = |u: u64| hex::encode(Sha256::digest(format!("aa:{u}").as_bytes()));
        assert!(order.windows(2).all(|w| key(w[0]) < key(w[1])));
        // The core's own order agrees.
        assert_eq!(
            order,
            stampede_core::room::lottery::order("aa", vec![3, 1, 2, 10])
        );
        assert_eq!(user_of("k1.42.2000.sig").unwrap(), 42);
    }

    /// Buyers 1..=4 joined before the open, told the positions of `told` (user → p).
    fn drawn(told: &[(u64, u64)]) -> Vec<Mutex<Buyer>> {
        told.iter()
            .map(|(user, p)| {
                Mutex::new(Buyer {
                    user: *user,
                    early: Some(true),
                    positions: vec![*p],
                    ..Buyer::default()
                })
            })
            .collect()
    }

    #[test]
    fn the_lottery_is_checked_against_its_own_recomputation() {
        let seed = "5eed";
        let commitment = hex::encode(Sha256::digest(seed.as_bytes()));
        let fair =
            json!({"drawn": true, "commitment": commitment, "seed": seed, "joined": [1, 2, 3, 4]});
        let line = line_order(seed, &[1, 2, 3, 4]);
        let told: Vec<(u64, u64)> = line.iter().zip(1..).map(|(u, p)| (*u, p)).collect();
        let buyers = drawn(&told);
        // The first two bought; the third's turn came, its pass expired; the fourth waits.
        for (i, b) in buyers.iter().enumerate().take(3) {
            let mut b = lock(b);
            b.first_turn = Some(1_000 * i as u64);
            b.admitted = (i < 2).then_some((i as u64, 0));
            b.expired = i == 2;
        }
        let mut audit = audit::Audit::default();
        let l = check_lottery(&fair, &commitment, &buyers, &mut audit);
        assert!(audit.ok && l.commitment_ok, "{:?}", audit.violations);
        assert_eq!((l.positions_checked, l.positions_wrong), (4, 0));

        // Someone admitted behind a buyer whose turn never came; a position the lottery
        // does not give; a seed that is not the committed one.
        let mut swapped = told.clone();
        (swapped[0].1, swapped[1].1) = (told[1].1, told[0].1);
        let buyers = drawn(&swapped);
        lock(&buyers[2]).admitted = Some((9, 0));
        lock(&buyers[2]).first_turn = Some(5);
        let mut audit = audit::Audit::default();
        let l = check_lottery(&fair, &"0".repeat(64), &buyers, &mut audit);
        assert!(!l.commitment_ok && !audit.ok);
        assert_eq!(l.positions_wrong, 2);
        let failed: Vec<&str> = audit
            .checks
            .iter()
            .filter(|(_, held)| !held)
            .map(|(c, _)| c.as_str())
            .collect();
        assert_eq!(failed.len(), 3, "{failed:?}");
    }
}
