//! The pay race (`stampede-bench sale --pay-race N`): after the sale has settled, N
//! unpaid orders are paid by the provider's signed callback, each sent at its payment
//! deadline (from 250 ms before to 2.5 s after: the timeout cancels from about 0.5 to 2 s
//! after it here, batch by batch), so that payment and the timeout's cancellation meet on the
//! same order. Then the wait until no order of the event is unpaid, and the check that
//! each raced order ended one way: paid (and its units never given back) or cancelled
//! (and the payment recorded for refund) — never both, never neither.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use stampede_core::lifecycle::pay;
use stampede_core::order_tables::{OrderStatus, count_shards, over_shards};

use crate::load::{Conn, Request};
use crate::stack::Stack;

/// What the raced payments were answered, and what the check found.
#[derive(Debug, Default, Serialize)]
pub struct PayRace {
    pub raced: u64,
    /// Callback answers: PAID, REFUND_PENDING, DUPLICATE, or the HTTP status of an error.
    pub answers: std::collections::BTreeMap<String, u64>,
    /// Of the raced orders, how they ended in MySQL.
    pub ended_paid: u64,
    pub ended_cancelled: u64,
    /// Orders that ended both ways or neither, in words.
    pub violations: Vec<String>,
}

/// One raced order: what the callback said, and the order as it ended.
struct Raced {
    order_no: u64,
    answer: String,
}

/// Races `count` of the event's unpaid orders against their timeout; waits (up to
/// `within`) until the event has no unpaid order left, then checks each raced order.
pub async fn run(
    stack: &Stack,
    event: u64,
    count: u64,
    seed: u64,
    within: Duration,
) -> anyhow::Result<PayRace> {
    let secret = stack.secret("provider.secret")?;
    let mut conn = stack.mysql.get_conn().await?;
    let shards = count_shards(&mut conn).await?;
    let orders = over_shards(
        shards,
        &format!(
            "SELECT order_no, amount_cents, \
             CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(3), pay_deadline) AS SIGNED) left_us \
             FROM {{orders}} WHERE event_id = {event} AND status = '{}'",
            OrderStatus::Unpaid
        ),
    );
    let unpaid: Vec<(u64, u64, i64)> = conn
        .query(format!("{orders} ORDER BY order_no LIMIT {count}"))
        .await?;
    anyhow::ensure!(
        !unpaid.is_empty(),
        "event {event} has no unpaid order to race"
    );
    let now = Instant::now();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut tasks = Vec::with_capacity(unpaid.len());
    for (i, (order_no, amount, left_us)) in unpaid.into_iter().enumerate() {
        let jitter_ms: i64 = rng.gen_range(-250..=2_500);
        let at = now + Duration::from_micros((left_us + jitter_ms * 1000).max(0) as u64);
        let body = serde_json::json!({
            "provider_txn_id": format!("race-{event}-{order_no}"),
            "order_no": order_no.to_string(),
            "amount_cents": amount,
        })
        .to_string();
        let signature = pay::sign(secret.as_bytes(), body.as_bytes());
        let edge = stack.edge_for(i);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let req = Request {
                method: http::Method::POST,
                path: "/api/payments/callback".into(),
                bearer: None,
                idempotency_key: None,
                headers: vec![(pay::SIGNATURE_HEADER, signature)],
                body: bytes::Bytes::from(body),
            };
            let answer = match Conn::new(edge, i).send(&req).await {
                Ok(a) if a.status == 200 => a.json()["result"]
                    .as_str()
                    .unwrap_or("no result")
                    .to_owned(),
                Ok(a) => format!("HTTP {}", a.status),
                Err(_) => "no answer".to_owned(),
            };
            Raced { order_no, answer }
        }));
    }
    let mut raced = Vec::with_capacity(tasks.len());
    for t in tasks {
        raced.push(t.await?);
    }

    // The timeout cancels what was not paid: wait until nothing of the event is unpaid
    // and every cancelled order's units are back in Redis (a cancellation commits in
    // MySQL first, then gives back).
    let until = Instant::now() + within;
    let count_of = |status: OrderStatus| {
        format!(
            "SELECT COUNT(*) FROM ({}) o",
            over_shards(
                shards,
                &format!(
                    "SELECT order_no FROM {{orders}} WHERE event_id = {event} AND status = '{status}'"
                ),
            )
        )
    };
    loop {
        let unpaid: u64 = conn
            .query_first(count_of(OrderStatus::Unpaid))
            .await?
            .unwrap_or(0);
        let cancelled: u64 = conn
            .query_first(count_of(OrderStatus::Cancelled))
            .await?
            .unwrap_or(0);
        let given_back = stack.restocked(event).await?.len() as u64;
        if unpaid == 0 && given_back >= cancelled {
            break;
        }
        anyhow::ensure!(
            Instant::now() < until,
            "{within:?} after the race, {unpaid} orders of event {event} are still unpaid and \
             {} cancelled ones not given back",
            cancelled.saturating_sub(given_back)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let restocked = stack.restocked(event).await?;
    check(&mut conn, shards, restocked, raced).await
}

async fn check(
    conn: &mut mysql_async::Conn,
    shards: u32,
    restocked: std::collections::HashSet<u64>,
    raced: Vec<Raced>,
) -> anyhow::Result<PayRace> {
    let mut report = PayRace {
        raced: raced.len() as u64,
        ..PayRace::default()
    };
    let list = raced
        .iter()
        .map(|r| r.order_no.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let statuses: HashMap<u64, String> = conn
        .query::<(u64, String), _>(over_shards(
            shards,
            &format!("SELECT order_no, status FROM {{orders}} WHERE order_no IN ({list})"),
        ))
        .await?
        .into_iter()
        .collect();
    let payments: HashMap<u64, String> = conn
        .query::<(u64, String), _>(format!(
            "SELECT order_no, status FROM payment WHERE order_no IN ({list})"
        ))
        .await?
        .into_iter()
        .collect();

    for r in raced {
        *report.answers.entry(r.answer.clone()).or_default() += 1;
        let status = statuses
            .get(&r.order_no)
            .and_then(|s| OrderStatus::parse(s).ok());
        let payment = payments.get(&r.order_no).map(String::as_str);
        let given_back = restocked.contains(&r.order_no);
        // An answer that is an error (or none) may go either way; what the order became
        // must still be one thing only.
        let wrong = match status {
            Some(OrderStatus::Paid) => {
                report.ended_paid += 1;
                (r.answer == "REFUND_PENDING" || payment != Some("APPLIED") || given_back).then(|| {
                    format!(
                        "paid, answered {}, payment {payment:?}, units given back: {given_back}",
                        r.answer
                    )
                })
            }
            Some(OrderStatus::Cancelled) => {
                report.ended_cancelled += 1;
                (r.answer == "PAID"
                    || payment == Some("APPLIED")
                    || (r.answer == "REFUND_PENDING" && payment != Some("REFUND_PENDING"))
                    || !given_back)
                    .then(|| {
                    format!(
                        "cancelled, answered {}, payment {payment:?}, units given back: {given_back}",
                        r.answer
                    )
                })
            }
            other => Some(format!("ended {other:?}, answered {}", r.answer)),
        };
        if let Some(w) = wrong {
            report.violations.push(format!("order {}: {w}", r.order_no));
        }
    }
    // A race that did not run proves nothing: no payment may fail under no fault, and
    // some must have been applied.
    for (answer, n) in &report.answers {
        if !["PAID", "REFUND_PENDING", "DUPLICATE"].contains(&answer.as_str()) {
            report
                .violations
                .push(format!("{n} payments answered {answer}"));
        }
    }
    if report.ended_paid == 0 {
        report
            .violations
            .push("no payment was applied: the race did not run".to_owned());
    }
    Ok(report)
}
