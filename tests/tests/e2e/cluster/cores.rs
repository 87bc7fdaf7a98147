//! Two cores and two edges on one sale: one core killed mid-sale, both edges alike.

use stampede_core::keys::Bucket;
use std::sync::Arc;
use std::time::Duration;

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
            for url in [&urls[i % 2], &urls[1]] {
                let body = json!({"category_id": ga, "quantity": 1});
                match stampede_e2e::try_purchase(&http, url, event, &b.token, "k", body).await {
                    Some((202, body)) => return body["request_id"].as_str()?.parse::<u64>().ok(),
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
    doomed.signal("-KILL").await;
    let mut promised = Vec::new();
    while let Some(done) = tasks.join_next().await {
        promised.extend(done.unwrap());
    }
    assert!(!promised.is_empty());

    let mysql = mysql_async::Pool::new(stack.mysql_url(&database).as_str());
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
    eprintln!(
        "{} admitted through two cores, one killed: {books}",
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
