//! Trains' seats by route segment (docs/trains.md), against the real scripts in the test
//! stack's Redis: `reserve.lua` taking a journey's segments, `restock.lua` giving a
//! cancelled ticket's back, `train_available.lua` counting from the seats. The event's
//! keys are written by hand here (the admin API for trains comes with the rest of the
//! issue); the core under test is the scripts.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::AsyncCommands;
use stampede_core::admission::{Purchase, Refusal, Seats, reserve};
use stampede_core::domain::{CategoryId, EventId, OrderNo, UserId};
use stampede_core::keys::Bucket;
use stampede_core::lifecycle::restock::{GiveBack, restock};
use stampede_core::trains::{self, Journey};
use stampede_e2e::{TestApp, spawn_app_with};

const CLASS: u64 = 7;

/// A train event's keys as a preload would write them: open, a generous limit, one
/// class of `carriages` × `seats` seats all free on `stations - 1` segments.
async fn train(app: &TestApp, event: u64, stations: usize, carriages: u32, seats: u32) {
    let (keys, b) = (app.keys(), Bucket::only(event));
    let mut r = app.redis.clone();
    let () = r
        .hset_multiple(
            keys.meta(b),
            &[
                ("status", "open".to_owned()),
                ("sale_start_ms", "0".to_owned()),
                ("sale_end_ms", "99999999999999".to_owned()),
                ("per_user_limit", "1000000".to_owned()),
                ("epoch", "1".to_owned()),
            ],
        )
        .await
        .unwrap();
    let free = trains::free_seat(stations);
    let fields: Vec<(String, String)> = (1..=carriages)
        .flat_map(|c| (1..=seats).map(move |s| format!("{c}:{s}")))
        .map(|name| (name, free.clone()))
        .collect();
    let () = r
        .hset_multiple(keys.segments(b, CLASS), &fields)
        .await
        .unwrap();
    // The class's stock: its free seat-segments.
    let units = fields.len() * (stations - 1);
    let () = r.hset(keys.stock(b), CLASS, units).await.unwrap();
}

/// The class's free seat-segments as Redis counts them.
async fn stock(app: &TestApp, event: u64) -> usize {
    app.redis
        .clone()
        .hget(app.keys().stock(Bucket::only(event)), CLASS)
        .await
        .unwrap()
}

/// One purchase of `n` seats on `j` (the best, or `chosen`): the request id and seats,
/// or the refusal.
async fn buy(
    app: &TestApp,
    event: u64,
    user: u64,
    request: u64,
    j: Journey,
    n: u32,
    chosen: &[(u32, u32)],
) -> Result<Vec<String>, Refusal> {
    let p = Purchase {
        event_id: event,
        category_id: CLASS,
        user_id: user,
        quantity: n,
        seats: Seats::Journey {
            journey: j,
            seats: chosen.to_vec(),
        },
        bucket: Bucket::only(event),
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let outcome = reserve::reserve(
        &mut app.redis.clone(),
        &app.keys(),
        &p,
        OrderNo(request),
        &format!("k{request}"),
        now,
        1_000_000,
        None,
    )
    .await
    .unwrap()
    .into_result()?;
    assert_eq!(outcome.request_id, OrderNo(request));
    Ok(outcome.seats)
}

/// Gives a ticket's seats back on its journey, as a cancellation does.
async fn cancel(app: &TestApp, event: u64, user: u64, request: u64, j: Journey, seats: &[String]) {
    restock(
        &mut app.redis.clone(),
        &app.keys(),
        GiveBack {
            order_no: OrderNo(request),
            user_id: UserId(user),
            bucket: Bucket::only(event),
            category_id: CategoryId(CLASS),
            quantity: seats.len() as u32,
            seats,
            journey: Some(j),
        },
    )
    .await
    .unwrap();
}

async fn occupancy(app: &TestApp, event: u64) -> HashMap<String, String> {
    app.redis
        .clone()
        .hgetall(app.keys().segments(Bucket::only(event), CLASS))
        .await
        .unwrap()
}

async fn available(app: &TestApp, event: u64, j: Journey) -> u64 {
    trains::available(
        &mut app.redis.clone(),
        &app.keys(),
        EventId(event),
        &[CategoryId(CLASS)],
        j,
    )
    .await
    .unwrap()[0]
        .free
}

fn j(from: u16, to: u16) -> Journey {
    Journey { from, to }
}

/// Stations A B C D (0 … 3): the journeys of the issue, on three seats of one carriage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journeys_share_a_seat_only_on_segments_they_do_not_both_use() {
    let app = spawn_app_with(|_| {}).await;
    let event = 1;
    train(&app, event, 4, 1, 3).await;
    let (a, b, c, d) = (0, 1, 2, 3);

    // A→D takes its seat on every segment.
    let ad = buy(&app, event, 1, 101, j(a, d), 1, &[]).await.unwrap();
    assert_eq!(occupancy(&app, event).await[&ad[0]], "111");
    assert_eq!(available(&app, event, j(a, d)).await, 2);

    // A→B, then C→D: the second fills the seat the first started, not an empty one.
    let ab = buy(&app, event, 2, 102, j(a, b), 1, &[]).await.unwrap();
    let cd = buy(&app, event, 3, 103, j(c, d), 1, &[]).await.unwrap();
    assert_eq!(ab, cd, "A→B and C→D share one seat");
    assert_eq!(occupancy(&app, event).await[&ab[0]], "101");
    assert_eq!(
        available(&app, event, j(a, d)).await,
        1,
        "one seat still free A→D"
    );

    // B→C on the A→D seat is refused; B→C unchosen fills the shared seat's gap.
    assert_eq!(
        buy(
            &app,
            event,
            4,
            104,
            j(b, c),
            1,
            &[(1, ad[0][2..].parse().unwrap())]
        )
        .await,
        Err(Refusal::SeatTaken)
    );
    let bc = buy(&app, event, 4, 105, j(b, c), 1, &[]).await.unwrap();
    assert_eq!(bc, ab, "the gap between A→B and C→D is filled first");
    assert_eq!(occupancy(&app, event).await[&bc[0]], "111");

    // A→C on the last free seat; its cancellation frees exactly A→B and B→C.
    let ac = buy(&app, event, 5, 106, j(a, c), 1, &[]).await.unwrap();
    assert_eq!(occupancy(&app, event).await[&ac[0]], "110");
    assert_eq!(
        buy(&app, event, 6, 107, j(a, b), 1, &[]).await,
        Err(Refusal::SoldOut)
    );
    let flag: Option<i64> = app
        .redis
        .clone()
        .hget(app.keys().dry(Bucket::only(event)), format!("{CLASS}:0:1"))
        .await
        .unwrap();
    assert_eq!(flag, Some(1), "no seat A→B: flagged for the edge");
    assert_eq!(available(&app, event, j(c, d)).await, 1);
    cancel(&app, event, 5, 106, j(a, c), &ac).await;
    assert_eq!(occupancy(&app, event).await[&ac[0]], "000");
    let flag: Option<i64> = app
        .redis
        .clone()
        .hget(app.keys().dry(Bucket::only(event)), format!("{CLASS}:0:1"))
        .await
        .unwrap();
    assert_eq!(flag, None, "the flag goes with the seats given back");
    assert_eq!(
        stock(&app, event).await,
        3,
        "three seat-segments free again"
    );
    // Again: nothing more is freed (the order's give-back runs once).
    cancel(&app, event, 5, 106, j(a, c), &ac).await;
    let again = buy(&app, event, 7, 108, j(a, c), 1, &[]).await.unwrap();
    assert_eq!(again, ac);

    // A group of two sits together when two neighbours are free on the journey.
    train(&app, 2, 4, 2, 4).await;
    buy(&app, 2, 1, 201, j(a, d), 1, &[(1, 2)]).await.unwrap();
    let pair = buy(&app, 2, 2, 202, j(a, d), 2, &[]).await.unwrap();
    assert_eq!(pair, vec!["1:3", "1:4"]);
}

/// Thousands of random purchases (the best seats or chosen ones, groups) and
/// cancellations against a model of every seat's segments: no seat ever held twice on a
/// segment, SOLD_OUT only when the model has too few seats free, and availability for
/// every journey equal to a brute-force count over the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn availability_matches_a_brute_force_count_after_every_step() {
    let app = spawn_app_with(|_| {}).await;
    let (event, stations, carriages, per_carriage) = (3, 7usize, 2u32, 6u32);
    train(&app, event, stations, carriages, per_carriage).await;
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let segments = stations - 1;
    // seat name → segments taken; request → (user, journey, seats).
    let mut model: HashMap<String, Vec<bool>> = (1..=carriages)
        .flat_map(|c| (1..=per_carriage).map(move |s| format!("{c}:{s}")))
        .map(|name| (name, vec![false; segments]))
        .collect();
    let mut live: Vec<(u64, u64, Journey, Vec<String>)> = Vec::new();
    let free_in = |model: &HashMap<String, Vec<bool>>, jy: Journey| {
        model
            .values()
            .filter(|taken| jy.segments().all(|k| !taken[k]))
            .count() as u64
    };
    let (mut bought, mut refused, mut cancelled) = (0, 0, 0);
    for step in 0..3_000u64 {
        if !live.is_empty() && rng.gen_bool(0.3) {
            let (user, request, jy, seats) = live.swap_remove(rng.gen_range(0..live.len()));
            cancel(&app, event, user, request, jy, &seats).await;
            for s in &seats {
                for k in jy.segments() {
                    assert!(model.get_mut(s).unwrap()[k], "step {step}: {s} was held");
                    model.get_mut(s).unwrap()[k] = false;
                }
            }
            cancelled += 1;
        } else {
            let from = rng.gen_range(0..stations as u16 - 1);
            let to = rng.gen_range(from + 1..stations as u16);
            let jy = j(from, to);
            let n = rng.gen_range(1..=3u32);
            let chosen: Vec<(u32, u32)> = if rng.gen_bool(0.2) {
                let c = rng.gen_range(1..=carriages);
                let first = rng.gen_range(1..=per_carriage + 1 - n);
                (first..first + n).map(|s| (c, s)).collect()
            } else {
                Vec::new()
            };
            let user = rng.gen_range(1..=40u64);
            let request = 10_000 + step;
            let free_before = free_in(&model, jy);
            match buy(&app, event, user, request, jy, n, &chosen).await {
                Ok(seats) => {
                    assert_eq!(seats.len(), n as usize, "step {step}");
                    for s in &seats {
                        let taken = model.get_mut(s).unwrap();
                        for k in jy.segments() {
                            assert!(!taken[k], "step {step}: {s} sold twice on segment {k}");
                            taken[k] = true;
                        }
                    }
                    if !chosen.is_empty() {
                        let names: Vec<String> =
                            chosen.iter().map(|(c, s)| format!("{c}:{s}")).collect();
                        assert_eq!(seats, names, "step {step}");
                    }
                    live.push((user, request, jy, seats));
                    bought += 1;
                }
                Err(Refusal::SoldOut) => {
                    assert!(
                        free_before < u64::from(n),
                        "step {step}: SOLD_OUT with {free_before} free for {n}"
                    );
                    refused += 1;
                }
                Err(Refusal::SeatTaken) => {
                    assert!(!chosen.is_empty(), "step {step}: SEAT_TAKEN unchosen");
                    let any_taken = chosen.iter().any(|(c, s)| {
                        let taken = &model[&format!("{c}:{s}")];
                        jy.segments().any(|k| taken[k])
                    });
                    assert!(any_taken, "step {step}: SEAT_TAKEN for free seats");
                    refused += 1;
                }
                Err(other) => panic!("step {step}: {other:?}"),
            }
        }
        // Every journey's availability, counted by the script from the seats.
        if step % 10 == 0 {
            for from in 0..stations as u16 - 1 {
                for to in from + 1..stations as u16 {
                    assert_eq!(
                        available(&app, event, j(from, to)).await,
                        free_in(&model, j(from, to)),
                        "step {step}: {from}→{to}"
                    );
                }
            }
        } else {
            let jy = j(0, stations as u16 - 1);
            assert_eq!(
                available(&app, event, jy).await,
                free_in(&model, jy),
                "step {step}"
            );
        }
    }
    // Redis's seats are the model's, character for character, and its stock their
    // free seat-segments.
    let seen = occupancy(&app, event).await;
    let free: usize = model.values().flatten().filter(|t| !**t).count();
    assert_eq!(stock(&app, event).await, free);
    for (name, taken) in &model {
        let expected: String = taken.iter().map(|t| if *t { '1' } else { '0' }).collect();
        assert_eq!(seen[name], expected, "{name}");
    }
    println!("{bought} bought, {refused} refused, {cancelled} cancelled");
    assert!(
        bought > 500 && refused > 100 && cancelled > 300,
        "{bought} {refused} {cancelled}"
    );
}

/// A train through the APIs: created with its stations and a class, published, tickets
/// bought by journey, orders in MySQL with their segments, a cancellation giving back
/// exactly its segments, and bad journeys refused with nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_train_sells_journeys_through_the_api() {
    use serde_json::json;
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, classes) = app
        .create_event(json!({
            "title": "G1", "venue": "Line 1", "kind": "train",
            "stations": ["A", "B", "C", "D"],
            "show_time": "2031-06-01T20:00:00Z",
            "sale_start": "2020-01-01T00:00:00Z", "sale_end": "2031-06-01T12:00:00Z",
            "per_user_limit": 2, "pay_timeout_s": 900,
            "categories": [{"name": "first", "price_cents": 1000, "seats": {"rows": 1, "cols": 2}}],
        }))
        .await;
    let class = classes[0];
    let (_, shown) = app.get(&format!("/admin/events/{event}")).await;
    assert_eq!(shown["kind"], "train", "{shown}");
    assert_eq!(shown["stations"], json!(["A", "B", "C", "D"]));
    assert_eq!(shown["categories"][0]["total"], 6, "2 seats × 3 segments");
    app.publish(event).await;
    let buyers = app.buyers(5).await;
    let ticket =
        |from: u16, to: u16| json!({"category_id": class, "quantity": 1, "from": from, "to": to});

    // Hostile journeys: refused, nothing taken.
    for bad in [
        json!({"category_id": class, "quantity": 1}),
        json!({"category_id": class, "quantity": 1, "from": 2, "to": 2}),
        json!({"category_id": class, "quantity": 1, "from": 3, "to": 1}),
        json!({"category_id": class, "quantity": 1, "from": 0, "to": 4}),
        json!({"category_id": class, "quantity": 1, "from": -1, "to": 2}),
        json!({"category_id": class, "quantity": 1, "from": "A", "to": "B"}),
    ] {
        let (status, answer) = app.buy(event, &buyers[0], "bad", bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {answer}");
    }

    // A→D, then A→B and C→D on one seat, then B→C fills its gap: the train is full.
    let (status, ad) = app.buy(event, &buyers[0], "1", ticket(0, 3)).await;
    assert_eq!(status, 202, "{ad}");
    let (status, ab) = app.buy(event, &buyers[1], "1", ticket(0, 1)).await;
    assert_eq!(status, 202, "{ab}");
    let (status, cd) = app.buy(event, &buyers[2], "1", ticket(2, 3)).await;
    assert_eq!(status, 202, "{cd}");
    assert_eq!(ab["seats"], cd["seats"], "A→B and C→D share a seat");
    assert_ne!(ab["seats"], ad["seats"]);
    let (status, bc) = app.buy(event, &buyers[3], "1", ticket(1, 2)).await;
    assert_eq!(status, 202, "{bc}");
    assert_eq!(bc["seats"], ab["seats"]);
    let (status, none) = app.buy(event, &buyers[4], "1", ticket(0, 1)).await;
    assert_eq!(
        (status, none["error"]["code"].as_str()),
        (409, Some("SOLD_OUT")),
        "{none}"
    );

    // Orders in MySQL with their journeys and prices by segment; one row per seat and
    // segment in MySQL's guard, never two.
    let ad_order = crate::lifecycle::created(&app, event, &buyers[0]).await;
    for b in &buyers[1..4] {
        crate::lifecycle::created(&app, event, b).await;
    }
    let segments = app
        .count(&format!(
            "SELECT COUNT(*) FROM seat_segment WHERE category_id = {class}"
        ))
        .await;
    assert_eq!(segments, 6, "every seat-segment held once");
    let (_, order) = crate::lifecycle::call(
        &app,
        reqwest::Method::GET,
        &format!("/api/orders/{ad_order}"),
        &buyers[0],
    )
    .await;
    assert_eq!(order["journey"], json!({"from": 0, "to": 3}), "{order}");
    assert_eq!(order["amount_cents"], 3000, "3 segments × 1000");

    // The A→D ticket is cancelled: its seat is free on every segment again.
    let (status, _) = crate::lifecycle::call(
        &app,
        reqwest::Method::POST,
        &format!("/api/orders/{ad_order}/cancel"),
        &buyers[0],
    )
    .await;
    assert_eq!(status, 200);
    let seat = ad["seats"][0].as_str().unwrap().to_owned();
    let seats: HashMap<String, String> = app
        .redis
        .clone()
        .hgetall(app.keys().segments(Bucket::only(event), class))
        .await
        .unwrap();
    assert_eq!(seats[&seat], "000");
    let segments = app
        .count(&format!(
            "SELECT COUNT(*) FROM seat_segment WHERE category_id = {class}"
        ))
        .await;
    assert_eq!(segments, 3);
    let free = trains::available(
        &mut app.redis.clone(),
        &app.keys(),
        EventId(event),
        &[CategoryId(class)],
        j(0, 3),
    )
    .await
    .unwrap()[0]
        .free;
    assert_eq!(free, 1);
    let (status, again) = app.buy(event, &buyers[4], "2", ticket(1, 3)).await;
    assert_eq!(status, 202, "{again}");
    assert_eq!(again["seats"][0], seat.as_str());

    // The books balance in seat-segments: Redis, the orders and MySQL's counters agree.
    crate::lifecycle::created(&app, event, &buyers[4]).await;
    let balanced = stampede_e2e::eventually(std::time::Duration::from_secs(20), || async {
        let (_, report) = app
            .post(&format!("/admin/events/{event}/reconcile"), json!({}))
            .await;
        let c = &report["balance"]["categories"][0];
        c["gap"] == 0 && c["oversold"] == 0 && c["remain_gap"] == 0
    })
    .await;
    let (_, report) = app
        .post(&format!("/admin/events/{event}/reconcile"), json!({}))
        .await;
    assert!(balanced, "{report:#}");
    // And per segment: A→B, B→C, C→D on one seat, B→D on the other.
    // Per segment (redis_taken, in_orders, gap) of a reconcile report or the stats.
    let books = |report: &serde_json::Value| -> Vec<(i64, i64, i64)> {
        let books = if report["balance"].is_null() {
            report
        } else {
            &report["balance"]
        };
        books["categories"][0]["segments"]
            .as_array()
            .map(|s| {
                s.iter()
                    .map(|k| {
                        let n = |f: &str| k[f].as_i64().unwrap_or(i64::MIN);
                        (n("redis_taken"), n("in_orders"), n("gap"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        books(&report),
        [(1, 1, 0), (2, 2, 0), (2, 2, 0)],
        "{report:#}"
    );

    // The heal per seat. A segment an order holds that Redis offers (the string alone
    // changed): the books see a gap of -1 on that segment only, and the heal takes it
    // back at once, the class's counter recounted from the seats.
    let mut redis = app.redis.clone();
    let key = app.keys().segments(Bucket::only(event), class);
    let shared = ab["seats"][0].as_str().unwrap().to_owned();
    let _: () = redis.hset(&key, &shared, "101").await.unwrap();
    let (_, stats) = app.get(&format!("/admin/events/{event}/stats")).await;
    assert_eq!(
        books(&stats),
        [(1, 1, 0), (1, 2, -1), (2, 2, 0)],
        "{stats:#}"
    );
    assert_eq!(
        stats["categories"][0]["gap"], 0,
        "the counter agrees: {stats:#}"
    );
    // (A pass that sees the books move while it looks — stock sync — heals nothing.)
    let heal = || async {
        for _ in 0..20 {
            let (_, report) = app
                .post(&format!("/admin/events/{event}/reconcile"), json!({}))
                .await;
            if !report["actions"].as_array().is_none_or(|a| a.is_empty()) {
                return report;
            }
        }
        panic!("20 passes healed nothing");
    };
    let report = heal().await;
    let seats: HashMap<String, String> = redis.hgetall(&key).await.unwrap();
    assert_eq!(seats[&shared], "111", "{report:#}");
    assert_eq!(
        books(&report),
        [(1, 1, 0), (2, 2, 0), (2, 2, 0)],
        "{report:#}"
    );
    assert_eq!(report["balance"]["categories"][0]["gap"], 0, "{report:#}");

    // A segment taken in Redis that no order holds: kept while the sale runs (Redis
    // then offers less, never more), freed once it is closed.
    let _: () = redis.hset(&key, &seat, "111").await.unwrap();
    let _: i64 = redis
        .hincr(app.keys().stock(Bucket::only(event)), class, -1)
        .await
        .unwrap();
    let (_, report) = app
        .post(&format!("/admin/events/{event}/reconcile"), json!({}))
        .await;
    assert_eq!(
        books(&report),
        [(2, 1, 1), (2, 2, 0), (2, 2, 0)],
        "{report:#}"
    );
    app.close(event).await;
    let report = heal().await;
    let seats: HashMap<String, String> = redis.hgetall(&key).await.unwrap();
    assert_eq!(seats[&seat], "011", "{report:#}");
    assert_eq!(
        books(&report),
        [(1, 1, 0), (2, 2, 0), (2, 2, 0)],
        "{report:#}"
    );
    assert_eq!(report["balance"]["categories"][0]["gap"], 0, "{report:#}");
}

/// `GET {path}` through the stack's edge with a buyer's token: status, X-Cache, body.
async fn edge_get(
    app: &stampede_e2e::StackApp,
    path: &str,
    token: &str,
) -> (u16, String, serde_json::Value) {
    get_at(app, &app.edge_url, path, token).await
}

/// `GET {path}` through the edge at `base`, as [`edge_get`].
async fn get_at(
    app: &stampede_e2e::StackApp,
    base: &str,
    path: &str,
    token: &str,
) -> (u16, String, serde_json::Value) {
    let r = app
        .http
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .expect("the edge answers");
    let cache = r
        .headers()
        .get("x-cache")
        .map(|v| v.to_str().unwrap_or("").to_owned())
        .unwrap_or_default();
    (
        r.status().as_u16(),
        cache,
        r.json().await.unwrap_or_default(),
    )
}

/// A train `title` of three stations (A, B, C), on sale, one class of 2 × 2 seats.
pub(crate) fn small_train(title: &str) -> serde_json::Value {
    serde_json::json!({
        "title": title, "venue": "Line", "kind": "train", "stations": ["A", "B", "C"],
        "show_time": "2031-06-01T20:00:00Z",
        "sale_start": "2020-01-01T00:00:00Z", "sale_end": "2031-06-01T12:00:00Z",
        "per_user_limit": 2, "pay_timeout_s": 900,
        "categories": [{"name": "first", "price_cents": 1000, "seats": {"rows": 2, "cols": 2}}],
    })
}

/// Free seats of each class on a journey, from the edge's availability answer.
fn free_by_class(answer: &serde_json::Value) -> Vec<u64> {
    answer["classes"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| c["free"].as_u64().unwrap_or(u64::MAX))
                .collect()
        })
        .unwrap_or_default()
}

/// An edge that cannot read Redis (its snapshot stale) asks the core for a journey's
/// count at most once per recount interval, answering the last count (STALE)
/// meanwhile: it asked for a full count of every seat on every request (review).
#[tokio::test]
async fn an_edge_without_its_snapshot_keeps_recounting_a_journey_within_its_budget() {
    use crate::edge::open_sale;

    let (app, _edge) = stampede_e2e::stack_app().await;
    let (event, _) = open_sale(&app, small_train("G3")).await;
    let buyers = app.admin.buyers(2).await;
    let path = format!("/api/events/{event}/availability?from=0&to=2");
    let (status, _, counted) = edge_get(&app, &path, &buyers[0].token).await;
    assert_eq!(status, 200, "{counted}");
    assert_eq!(free_by_class(&counted), [4]);

    let edge = stampede_e2e::OwnEdge::without_redis(&stampede_e2e::Stack::from_env());
    // 80 asks from two buyers (within the per-token limit's burst), one after another.
    let (mut misses, mut stale) = (0, 0);
    let started = std::time::Instant::now();
    for i in 0..80 {
        let (status, cache, a) = get_at(&app, &edge.url(), &path, &buyers[i % 2].token).await;
        assert_eq!((status, &a), (200, &counted), "ask {i} ({cache})");
        match cache.as_str() {
            "MISS" => misses += 1,
            "STALE" => stale += 1,
            other => panic!("ask {i}: X-Cache {other}: no snapshot, no HIT"),
        }
    }
    // The first count, then one per avail_recount_s (0.2 s) at most.
    let allowed = 2 + (started.elapsed().as_secs_f64() / 0.2) as u32;
    assert!(
        misses <= allowed,
        "{misses} of 80 asks reached the core in {:?} (at most {allowed})",
        started.elapsed()
    );
    assert_eq!(misses + stale, 80);
    // A recount the core cannot make (here: no core) answers the last count, STALE.
    let core = stampede_e2e::StoppedCore::stop(stampede_e2e::Stack::from_env()).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (status, cache, a) = get_at(&app, &edge.url(), &path, &buyers[0].token).await;
    core.start().await;
    assert_eq!((status, cache.as_str(), &a), (200, "STALE", &counted));
}

/// A journey asked for the first time costs the core a count of every seat, and a long
/// train has thousands of journeys: first counts take from the train's budget of
/// `avail_recounts_per_s` (50) a second per edge like recounts, and past it the edge
/// answers 429 with Retry-After (each first count reached the core: review).
#[tokio::test]
async fn a_trains_first_counts_of_journeys_take_from_its_budget() {
    use crate::edge::open_sale;
    use serde_json::json;

    let (app, _edge) = stampede_e2e::stack_app().await;
    let stations: Vec<String> = (0..14).map(|i| format!("S{i}")).collect();
    let (event, _) = open_sale(
        &app,
        json!({
            "title": "G4", "venue": "Line 4", "kind": "train", "stations": stations,
            "show_time": "2031-06-01T20:00:00Z",
            "sale_start": "2020-01-01T00:00:00Z", "sale_end": "2031-06-01T12:00:00Z",
            "per_user_limit": 2, "pay_timeout_s": 900,
            "categories": [{"name": "first", "price_cents": 1000, "seats": {"rows": 1, "cols": 2}}],
        }),
    )
    .await;
    let buyers = app.admin.buyers(2).await;
    let journeys: Vec<(usize, usize)> = (0..14)
        .flat_map(|from| (from + 1..14).map(move |to| (from, to)))
        .collect();
    assert_eq!(journeys.len(), 91);
    let ask = |(from, to): (usize, usize), token: String| {
        let http = app.http.clone();
        let url = format!(
            "{}/api/events/{event}/availability?from={from}&to={to}",
            app.edge_url
        );
        async move {
            let r = http
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .expect("the edge answers");
            let header = |name: &str| {
                r.headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned()
            };
            let (cache, retry) = (header("x-cache"), header("retry-after"));
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap_or_default();
            (status, cache, retry, body)
        }
    };
    // Every journey at once, early in a second of the clock (the budget's second).
    let into_second = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_millis();
    tokio::time::sleep(std::time::Duration::from_millis(u64::from(
        1_020 - into_second,
    )))
    .await;
    let mut tasks = tokio::task::JoinSet::new();
    for (i, &j) in journeys.iter().enumerate() {
        let asked = ask(j, buyers[i % 2].token.clone());
        tasks.spawn(async move { (i, asked.await) });
    }
    let mut answers: Vec<_> = tasks.join_all().await;
    answers.sort_by_key(|(i, _)| *i);
    let answers: Vec<_> = answers.into_iter().map(|(_, a)| a).collect();
    let mut limited = Vec::new();
    let mut counted = 0;
    for (&j, (status, cache, retry, body)) in journeys.iter().zip(&answers) {
        match status {
            200 => {
                assert_eq!(
                    (cache.as_str(), free_by_class(body)),
                    ("MISS", vec![2]),
                    "{j:?}"
                );
                counted += 1;
            }
            429 => {
                assert_eq!(
                    (body["error"]["code"].as_str(), retry.as_str()),
                    (Some("RATE_LIMITED"), "1"),
                    "{j:?}: {body}"
                );
                limited.push(j);
            }
            other => panic!("{j:?}: {other} {body}"),
        }
    }
    assert!(
        counted <= 50,
        "{counted} of 91 first counts reached the core at once (the budget is 50 a second)"
    );
    assert_eq!(counted + limited.len(), 91);
    // A second later the rest are counted.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    for (i, &j) in limited.iter().enumerate() {
        let (status, _, _, body) = ask(j, buyers[i % 2].token.clone()).await;
        assert_eq!(
            (status, free_by_class(&body)),
            (200, vec![2]),
            "{j:?}: {body}"
        );
    }
}

#[tokio::test]
async fn a_trains_availability_seat_map_and_journey_flags_through_the_edge() {
    use crate::edge::{open_sale, the_edge_says_sold_out};
    use serde_json::json;
    use std::time::Duration;

    let (app, _edge) = stampede_e2e::stack_app().await;
    let (event, classes) = open_sale(
        &app,
        json!({
            "title": "G2", "venue": "Line 2", "kind": "train",
            "stations": ["A", "B", "C", "D"],
            "show_time": "2031-06-01T20:00:00Z",
            "sale_start": "2020-01-01T00:00:00Z", "sale_end": "2031-06-01T12:00:00Z",
            "per_user_limit": 2, "pay_timeout_s": 900,
            "categories": [
                {"name": "first", "price_cents": 1000, "seats": {"rows": 1, "cols": 2}},
                {"name": "second", "price_cents": 400, "seats": {"rows": 1, "cols": 1}},
            ],
        }),
    )
    .await;
    let (first, second) = (classes[0], classes[1]);
    let buyers = app.admin.buyers(6).await;
    let token = buyers[0].token.as_str();
    let avail = |f: u16, t: u16| format!("/api/events/{event}/availability?from={f}&to={t}");
    let map =
        |c: u64, f: u16, t: u16| format!("/api/events/{event}/seats?category={c}&from={f}&to={t}");

    // Counted by the core once, then answered by the edge while no seat changes.
    let (status, cache, ad) = edge_get(&app, &avail(0, 3), token).await;
    assert_eq!((status, cache.as_str()), (200, "MISS"), "{ad}");
    assert_eq!(ad["classes"][0]["id"], first);
    assert_eq!(ad["classes"][0]["seats"], 2);
    assert_eq!(ad["classes"][0]["price_cents"], 3000, "3 segments × 1000");
    assert_eq!(ad["classes"][1]["price_cents"], 1200);
    assert_eq!(free_by_class(&ad), [2, 1]);
    let (status, cache, again) = edge_get(&app, &avail(0, 3), buyers[1].token.as_str()).await;
    assert_eq!((status, cache.as_str()), (200, "HIT"), "{again}");
    assert_eq!(again, ad);

    // A→D in second, A→B on first's seat 1:1: the edge's answer follows the seats.
    let ticket =
        |c: u64, f: u16, t: u16| json!({"category_id": c, "quantity": 1, "from": f, "to": t});
    let (status, answer) = app.buy(event, &buyers[0], "ad", ticket(second, 0, 3)).await;
    assert_eq!(status, 202, "{answer}");
    let mut ab = ticket(first, 0, 1);
    ab["seat_ids"] = json!(["1:1"]);
    ab.as_object_mut().unwrap().remove("quantity");
    let (status, answer) = app.buy(event, &buyers[1], "ab", ab).await;
    assert_eq!(status, 202, "{answer}");
    let mut last = json!(null);
    let mut followed = false;
    for _ in 0..30 {
        let (_, _, a) = edge_get(&app, &avail(0, 3), token).await;
        followed = free_by_class(&a) == [1, 0] && a["classes"][1]["sold_out"] == true;
        last = a;
        if followed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        followed,
        "availability A→D never showed the two tickets: {last}"
    );
    let (_, _, ab) = edge_get(&app, &avail(0, 1), token).await;
    assert_eq!(free_by_class(&ab), [1, 0], "{ab}");
    let (_, _, bd) = edge_get(&app, &avail(1, 3), token).await;
    assert_eq!(free_by_class(&bd), [2, 0], "seat 1:1 is free after B: {bd}");

    // The seat map for a journey: F when free on every segment of it.
    for (f, t, row) in [(0, 1, "SF"), (1, 3, "FF"), (0, 3, "SF")] {
        let (status, _, m) = edge_get(&app, &map(first, f, t), token).await;
        assert_eq!(status, 200, "{m}");
        assert_eq!(m["seats"], json!([row]), "{f}→{t}: {m}");
        assert_eq!(
            (m["from"].as_u64(), m["to"].as_u64()),
            (Some(f.into()), Some(t.into()))
        );
    }
    let (_, _, m) = edge_get(&app, &map(second, 2, 3), token).await;
    assert_eq!(m["seats"], json!(["S"]), "{m}");

    // second's one seat is taken A→D: the whole class is sold out (its stock is 0).
    let (status, answer) = app
        .buy(event, &buyers[2], "second", ticket(second, 1, 2))
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (409, Some("SOLD_OUT")),
        "{answer}"
    );
    // first: B→C fills 1:1's gap after A→B, A→C takes 1:2: no first seat is free before
    // C, yet first still has C→D to sell. The core finds no seat for A→B once and flags
    // that journey; then the edge answers it itself (the core's count of 409s stays
    // put) while C→D still reaches the core and sells.
    let (status, answer) = app.buy(event, &buyers[3], "bc", ticket(first, 1, 2)).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["seats"], json!(["1:1"]), "B→C fills the gap of 1:1");
    let (status, answer) = app.buy(event, &buyers[4], "ac", ticket(first, 0, 2)).await;
    assert_eq!(status, 202, "{answer}");
    let (status, answer) = app
        .buy(event, &buyers[2], "ab-0", ticket(first, 0, 1))
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (409, Some("SOLD_OUT")),
        "{answer}"
    );
    let edge_says = the_edge_says_sold_out(
        &app,
        event,
        &buyers[2],
        &ticket(first, 0, 1),
        Duration::from_secs(5),
    )
    .await;
    assert!(
        edge_says,
        "the edge never answered the flagged journey itself"
    );
    // The flagged journey spelled as the core reads it (a fraction, an exponent, minus
    // zero): answered by the edge too, the core's count of 409s unchanged (before, the
    // edge read "10e-1" as station 10 and "-0" as nothing, and let them on).
    let port = stampede_e2e::Stack::from_env().edge_port;
    let path = format!("/api/events/{event}/orders");
    let auth = format!("Bearer {}", buyers[2].token);
    for (n, raw) in [
        format!(r#"{{"category_id":{first},"quantity":1,"from":0,"to":10e-1}}"#),
        format!(r#"{{"category_id":{first},"quantity":1,"from":-0,"to":1}}"#),
        format!(r#"{{"category_id":{first},"quantity":1,"from":0.0,"to":1}}"#),
    ]
    .iter()
    .enumerate()
    {
        let key = format!("spelled-{n}");
        let headers = [
            ("Authorization", auth.as_str()),
            ("Idempotency-Key", key.as_str()),
            ("Content-Type", "application/json"),
        ];
        let before = crate::edge::core_answers(&app, 409).await;
        let a = stampede_e2e::raw_request(port, "POST", &path, &headers, raw).await;
        assert_eq!(a.status, 409, "{raw}: {a:?}");
        assert_eq!(
            crate::edge::core_answers(&app, 409).await,
            before,
            "{raw}: answered by the core, not the edge"
        );
    }
    let (status, answer) = app.buy(event, &buyers[5], "cd", ticket(first, 2, 3)).await;
    assert_eq!(status, 202, "first still sells C→D: {answer}");

    // Hostile queries: 400 from the core through the edge, never cached, nothing else.
    for q in [
        "from=3&to=1",
        "from=1&to=1",
        "from=0&to=4",
        "from=01&to=2",
        "from=0",
        "to=2",
        "from=0&to=2&x=1",
        "from=0&from=1&to=2",
        "from=-1&to=2",
        "from=0&to=%32",
        "from=0&to=99999999999999999999",
        "",
        "to=2&from=0",
        "from=0&&to=2",
        "&from=0&to=2",
        "from=0&to=2&",
        "from=00&to=2",
    ] {
        let path = format!("/api/events/{event}/availability?{q}");
        let (status, _, a) = edge_get(&app, &path, token).await;
        assert_eq!(
            (status, a["error"]["code"].as_str()),
            (400, Some("INVALID")),
            "{q}: {a}"
        );
    }
    for q in [
        format!("category={first}"),
        format!("category={first}&from=2&to=2"),
    ] {
        let path = format!("/api/events/{event}/seats?{q}");
        let (status, _, a) = edge_get(&app, &path, token).await;
        assert_eq!(status, 400, "a train's seat map needs a journey: {q}: {a}");
    }
    let (concert, seated) = open_sale(&app, stampede_e2e::small_sale(5, 1, 2, 1)).await;
    let path = format!("/api/events/{concert}/availability?from=0&to=1");
    let (status, _, a) = edge_get(&app, &path, token).await;
    assert_eq!(status, 400, "not a train: {a}");
    let path = format!(
        "/api/events/{concert}/seats?category={}&from=0&to=1",
        seated[1]
    );
    let (status, _, a) = edge_get(&app, &path, token).await;
    assert_eq!(status, 400, "a concert's map takes no journey: {a}");
    let (status, _, a) = edge_get(
        &app,
        "/api/events/999999999/availability?from=0&to=1",
        token,
    )
    .await;
    assert_eq!(status, 404, "{a}");
    let (status, _, a) = edge_get(&app, &avail(0, 1), "not-a-token").await;
    assert_eq!(status, 401, "{a}");
    let r = app
        .http
        .post(format!("{}{}", app.edge_url, avail(0, 1)))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
    for spelling in [
        format!("/api/events/{event}/availability/?from=0&to=1"),
        format!("/api/events/{event}//availability?from=0&to=1"),
        format!("/api/events/0{event}/availability?from=0&to=1"),
        format!("/api/events/{event}/%61vailability?from=0&to=1"),
        format!("/_core/api/events/{event}/availability?from=0&to=1"),
    ] {
        let (status, _, a) = edge_get(&app, &spelling, token).await;
        assert_eq!(status, 404, "{spelling}: {a}");
    }
}
