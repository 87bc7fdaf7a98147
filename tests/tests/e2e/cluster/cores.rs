//! Two cores and two edges on one sale: one core killed mid-sale, both edges alike.

use stampede_core::ids;
use stampede_core::keys::Bucket;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use redis::AsyncCommands;
use serde_json::json;
use stampede_e2e::{Buyer, Stack, eventually, heavy, small_sale};

use super::cluster_port;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_two_cores_killed_mid_sale_and_the_other_settles_its_reservations() {
    let _heavy = heavy().await;
    let stack = Stack::from_env();
    cluster_port(&stack);
    let (mut settings, database, _prefix) = stampede_e2e::test_settings(&stack).await;
    settings.orders.enabled = true;
    let mut doomed = stampede_e2e::CoreProcess::spawn(&settings).await;
    let survivor = stampede_e2e::CoreProcess::spawn(&settings).await;
    let admin = stampede_e2e::AdminClient::of(&survivor.admin_url, &settings);
    const UNITS: i64 = 3_000;
    let (event, categories) = admin.create_event(small_sale(UNITS as u32, 1, 1, 1)).await;
    admin.publish(event).await;
    let ga = categories[0];
    let buyers = admin.buyers(4_000).await;
    // Until the kill, the cores' batches wait on this table lock (MariaDB's metadata
    // lock), each core's workers holding the batch they read: the doomed core dies with
    // reservations in hand, for the survivor to take over.
    let mysql = mysql_async::Pool::new(stack.mysql_url(&database).as_str());
    let mut lock = mysql.get_conn().await.unwrap();
    lock.query_drop("LOCK TABLES stock_batch WRITE")
        .await
        .unwrap();

    // Buyers alternate between the cores; one whose core is gone asks the other with
    // the same Idempotency-Key (what the edge's upstream does).
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let urls = [doomed.public_url.clone(), survivor.public_url.clone()];
    let gate = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, b) in buyers.into_iter().enumerate() {
        let (http, urls, gate) = (http.clone(), urls.clone(), gate.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            for core in [i % 2, 1] {
                let body = json!({"category_id": ga, "quantity": 1});
                match stampede_e2e::try_purchase(&http, &urls[core], event, &b.token, "k", body)
                    .await
                {
                    Some((202, body)) => {
                        let request = body["request_id"].as_str()?.parse::<u64>().ok()?;
                        return Some((core, request));
                    }
                    // No answer (the core died under it), or unavailable: the other core.
                    None | Some((502 | 503, _)) => continue,
                    Some(_) => return None,
                }
            }
            None
        });
    }
    let redis = stack.redis().await;
    let keys = stampede_core::keys::Keys::new(&settings.redis.key_prefix);
    let midway = eventually(Duration::from_secs(30), || {
        let (mut redis, key) = (redis.clone(), keys.stock(Bucket::only(event)));
        async move { redis.hget::<_, _, i64>(&key, ga).await.unwrap_or(UNITS) <= UNITS * 2 / 3 }
    })
    .await;
    assert!(midway, "the sale did not get going");
    // Killed once both cores' workers hold a batch (a core's consumers are
    // "core<worker id>-<n>").
    let stream = keys.order_stream(Bucket::only(event));
    let both_busy = eventually(Duration::from_secs(30), || {
        let (mut redis, stream) = (redis.clone(), stream.clone());
        async move {
            let holding: std::collections::HashSet<String> =
                pending_by_consumer(&mut redis, &stream)
                    .await
                    .into_iter()
                    .filter(|(_, held)| *held > 0)
                    .filter_map(|(name, _)| Some(name.rsplit_once('-')?.0.to_owned()))
                    .collect();
            holding.len() == 2
        }
    })
    .await;
    assert!(both_busy, "the two cores never held reservations at once");
    doomed.signal("-KILL").await;
    // What every consumer held unacknowledged once the doomed core was gone (a moment
    // after its death, so Redis has run whatever it had sent).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let held_at_kill = pending_by_consumer(&mut redis.clone(), &stream).await;
    lock.query_drop("UNLOCK TABLES").await.unwrap();
    drop(lock);
    let mut answered = Vec::new();
    while let Some(done) = tasks.join_next().await {
        answered.extend(done.unwrap());
    }
    let promised: Vec<u64> = answered.iter().map(|&(_, request)| request).collect();
    assert!(!promised.is_empty());
    // The doomed core's consumers are named for the worker id in the order numbers it
    // minted ("core<worker id>-<n>").
    let doomed_consumers = answered
        .iter()
        .find(|&&(core, _)| core == 0)
        .map(|&(_, request)| format!("core{}-", ids::worker_of(request)))
        .expect("the doomed core admitted purchases before the kill");

    let settled = eventually(Duration::from_secs(90), || {
        let (mut redis, mysql, keys) = (redis.clone(), mysql.clone(), keys.clone());
        async move {
            crate::recovery::conserved(&mut redis, &mysql, &keys, event, ga, UNITS)
                .await
                .0
        }
    })
    .await;
    let (_, books) =
        crate::recovery::conserved(&mut redis.clone(), &mysql, &keys, event, ga, UNITS).await;
    assert!(settled, "not settled after the kill: {books}");
    let orders = stampede_e2e::order_numbers(&mysql, event).await;
    let missing = promised.iter().filter(|n| !orders.contains(n)).count();
    assert_eq!(
        missing,
        0,
        "{missing} of {} admitted purchases never became orders",
        promised.len()
    );
    let doomed_held: u64 = held_at_kill
        .iter()
        .filter(|(name, _)| name.starts_with(&doomed_consumers))
        .map(|(_, n)| n)
        .sum();
    let taken_over = stampede_e2e::AdminClient::of(&survivor.admin_url, &settings)
        .counter("stampede_reservations_taken_over_total")
        .await
        .expect("the core counts takeovers");
    assert!(
        doomed_held > 0,
        "the killed core held nothing: {held_at_kill:?}"
    );
    assert!(
        taken_over >= doomed_held,
        "the killed core ({doomed_consumers}*) held {doomed_held} entries, the survivor took \
         over {taken_over} (held at the kill: {held_at_kill:?})"
    );
    eprintln!(
        "{} admitted through two cores, one killed: {books}; the killed core held \
         {doomed_held} reservations unfinished, the survivor took over {taken_over}",
        promised.len()
    );
    let mut survivor = survivor;
    survivor.signal("-TERM").await;
    stampede_e2e::drop_database(&mysql, &database).await;
}

#[tokio::test]
async fn two_edges_give_the_same_answers() {
    let stack = Stack::from_env();
    cluster_port(&stack);
    let edge2 = stack
        .edge2_port
        .expect("the cluster stack has a second edge");
    let (app, _edge) = stampede_e2e::stack_app().await;
    let edges = [app.edge_url.clone(), format!("http://127.0.0.1:{edge2}")];
    let (event, categories) = crate::edge::open_sale(&app, small_sale(1, 1, 1, 1)).await;
    let (not_yet, _) = app
        .admin
        .create_event(json!({
            "title": "Not yet", "venue": "Loopback", "show_time": "2031-06-01T20:00:00Z",
            "sale_start": "2031-01-01T00:00:00Z", "sale_end": "2031-06-01T12:00:00Z",
            "per_user_limit": 1, "pay_timeout_s": 900,
            "categories": [{"name": "GA", "price_cents": 100, "quantity": 5}],
        }))
        .await;
    app.admin.publish(not_yet).await;
    let buyers = app.admin.buyers(3).await;
    let ga = json!({"category_id": categories[0], "quantity": 1});
    assert_eq!(app.buy(event, &buyers[0], "a", ga.clone()).await.0, 202);

    // What each edge answers, once both have refreshed (sold out is the edge's own).
    let answers = |edge: String, buyer: Buyer| {
        let http = app.http.clone();
        let ga = ga.clone();
        async move {
            let mut seen = Vec::new();
            for (event, key, token) in [
                (event, "b", buyer.token.as_str()),
                (not_yet, "c", buyer.token.as_str()),
                (event, "d", "not-a-token"),
            ] {
                let r = http
                    .post(format!("{edge}/api/events/{event}/orders"))
                    .bearer_auth(token)
                    .header("Idempotency-Key", key)
                    .json(&ga)
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let body: serde_json::Value = r.json().await.unwrap_or_default();
                seen.push((status, body["error"]["code"].clone()));
            }
            let mut detail: serde_json::Value = http
                .get(format!("{edge}/api/events/{event}"))
                .bearer_auth(&buyer.token)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            // The clock is each answer's own.
            for field in ["server_time", "server_time_ms"] {
                detail.as_object_mut().unwrap().remove(field);
            }
            (seen, detail)
        }
    };
    // Both edges refresh every 0.2 s; after a second both know the category is gone.
    // One round each (a buyer asking again and again would meet the per-user limit).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let one = answers(edges[0].clone(), buyers[1].clone()).await;
    let two = answers(edges[1].clone(), buyers[2].clone()).await;
    assert_eq!(one, two, "the two edges disagree");
    assert_eq!(
        one.0.iter().map(|a| a.0).collect::<Vec<_>>(),
        vec![409, 403, 401],
        "{one:?}"
    );
    assert_eq!(one.0[0].1, "SOLD_OUT");
}

/// A buyer admitted through one edge whose answer was lost, retrying through the other
/// after the sale sold out, hears their 202 and order number again, not SOLD_OUT: the
/// second edge never let the key through, and knows it from the sale's records in Redis
/// or from the first edge's stream of keys (lua/edge/stampede/admitted.lua).
#[tokio::test]
async fn a_purchase_admitted_through_one_edge_is_answered_again_by_the_other_after_the_sell_out() {
    retried_through_the_other_edge(false).await;
}

/// The same when only the category sold out, the sale selling on: the second edge knows
/// the keys from the first edge's stream only (the event's own slot on the cluster).
#[tokio::test]
async fn a_retry_through_the_other_edge_after_only_its_category_sold_out_hears_its_202() {
    retried_through_the_other_edge(true).await;
}

async fn retried_through_the_other_edge(partly: bool) {
    let stack = Stack::from_env();
    cluster_port(&stack);
    let edge2 = format!(
        "http://127.0.0.1:{}",
        stack
            .edge2_port
            .expect("the cluster stack has a second edge")
    );
    let (app, _edge) = stampede_e2e::stack_app().await;
    let (event, categories) = crate::edge::open_sale(
        &app,
        json!({
            "title": "Two edges", "venue": "Loopback", "show_time": "2031-06-01T20:00:00Z",
            "sale_start": "2020-01-01T00:00:00Z", "sale_end": "2031-06-01T12:00:00Z",
            "per_user_limit": 1, "pay_timeout_s": 900,
            "categories": if partly {
                json!([
                    {"name": "GA", "price_cents": 100, "quantity": 2},
                    {"name": "More", "price_cents": 100, "quantity": 5},
                ])
            } else {
                json!([{"name": "GA", "price_cents": 100, "quantity": 2}])
            },
        }),
    )
    .await;
    let buyers = app.admin.buyers(3).await;
    let ga = json!({"category_id": categories[0], "quantity": 1});
    let mut first = Vec::new();
    for b in &buyers[..2] {
        let (status, answer) = app.buy(event, b, "lost", ga.clone()).await;
        assert_eq!(status, 202, "{answer}");
        first.push(answer);
    }
    // SOLD_OUT from the second edge itself: neither core's count of 409s moved meanwhile
    // (the cores answer SOLD_OUT too, and their answer would let the retries through).
    let cores = [stack.admin_port, stack.admin_port + 2].map(|port| stampede_e2e::AdminClient {
        url: format!("http://127.0.0.1:{port}"),
        ..app.admin.clone()
    });
    let refusals = || async {
        let mut sum = 0;
        for core in &cores {
            sum += core
                .counter("stampede_http_responses_total{listener=\"public\",status=\"409\"}")
                .await
                .unwrap_or(0);
        }
        sum
    };
    let mut n = 0;
    let sold_out = eventually(Duration::from_secs(10), || {
        n += 1;
        let key = format!("late-{n}");
        let (http, edge2, ga, token) = (
            app.http.clone(),
            edge2.clone(),
            ga.clone(),
            buyers[2].token.clone(),
        );
        let refusals = &refusals;
        async move {
            let before = refusals().await;
            let (status, answer) =
                stampede_e2e::purchase(&http, &edge2, event, &token, &key, ga).await;
            status == 409 && answer["error"]["code"] == "SOLD_OUT" && refusals().await == before
        }
    })
    .await;
    assert!(sold_out, "the second edge never said SOLD_OUT itself");
    stampede_e2e::edge_workers_catch_up().await;
    for (b, first) in buyers[..2].iter().zip(&first) {
        // (A key from the stream is there a refresh or two after its first answer.)
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let (status, answer) = loop {
            let answer =
                stampede_e2e::purchase(&app.http, &edge2, event, &b.token, "lost", ga.clone())
                    .await;
            if answer.0 == 202 || std::time::Instant::now() > deadline {
                break answer;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(status, 202, "{answer}");
        assert!(first["request_id"].is_string(), "{first}");
        assert_eq!(answer["request_id"], first["request_id"], "{answer}");
    }
    // Another buyer's key is not theirs.
    let (status, answer) =
        stampede_e2e::purchase(&app.http, &edge2, event, &buyers[2].token, "lost", ga).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (409, &json!("SOLD_OUT")),
        "{answer}"
    );
}

/// Each consumer's unacknowledged entries in the stream (XPENDING's summary); none
/// before the workers have made the group.
async fn pending_by_consumer(
    redis: &mut stampede_core::infra::redis::Redis,
    stream: &str,
) -> std::collections::HashMap<String, u64> {
    let summary: redis::Value = match redis::cmd("XPENDING")
        .arg(stream)
        .arg(stampede_core::orders::redis::GROUP)
        .query_async(redis)
        .await
    {
        Err(e) if e.code() == Some("NOGROUP") => return Default::default(),
        answer => answer.unwrap(),
    };
    let redis::Value::Array(parts) = summary else {
        panic!("XPENDING answered {summary:?}");
    };
    let consumers: Option<Vec<(String, u64)>> =
        redis::from_redis_value(parts.get(3).unwrap_or(&redis::Value::Nil)).unwrap();
    consumers.unwrap_or_default().into_iter().collect()
}
