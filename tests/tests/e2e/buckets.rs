//! One event's stock over several Redis buckets (docs/scaling.md "One hot event over
//! several shards"): every unit sold once whichever bucket its buyer is in, SOLD_OUT and
//! the edge's flag only once every bucket and the pool are empty, a cancelled unit back
//! on sale for buyers of every bucket, the books and a rebuild from MySQL per bucket, and
//! a move a stopped core left finished by the sweeper.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::{Value, json};
use stampede_core::buckets::Mover;
use stampede_core::domain::{CategoryId, EventId, UserId};
use stampede_core::keys::{Bucket, slot};
use stampede_e2e::{Buyer, TestApp, eventually, over_shards, purchase, spawn_app_with};

use crate::lifecycle::{call, created};

const BUCKETS: u16 = 3;

pub(crate) fn bucketed_sale(units: u32, per_user_limit: u32, buckets: u16) -> Value {
    json!({
        "title": "Bucketed sale", "venue": "Loopback",
        "show_time": "2031-06-01T20:00:00Z",
        "sale_start": "2020-01-01T00:00:00Z", "sale_end": "2031-06-01T12:00:00Z",
        "per_user_limit": per_user_limit, "pay_timeout_s": 900, "buckets": buckets,
        "categories": [{"name": "GA", "price_cents": 5000, "quantity": units}],
    })
}

/// A published event of [`BUCKETS`] buckets: its id and its one category's.
async fn open_bucketed_sale(app: &TestApp, units: u32, per_user_limit: u32) -> (u64, u64) {
    let (event, categories) = app
        .create_event(bucketed_sale(units, per_user_limit, BUCKETS))
        .await;
    app.publish(event).await;
    (event, categories[0])
}

fn mover(app: &TestApp) -> Mover {
    Mover {
        redis: app.redis.clone(),
        keys: app.keys(),
        replicas: None,
    }
}

/// Units of the category in Redis: the pool and every bucket.
async fn available(app: &TestApp, event: u64, category: u64) -> i64 {
    mover(app)
        .available(EventId(event), BUCKETS)
        .await
        .unwrap()
        .get(&category)
        .copied()
        .unwrap_or(0)
}

async fn flagged(app: &TestApp, event: u64, category: u64) -> bool {
    let flag: Option<i64> = app
        .redis
        .clone()
        .hget(app.keys().sold_out(event), category)
        .await
        .unwrap();
    flag == Some(1)
}

async fn live_units(app: &TestApp, event: u64) -> i64 {
    stampede_e2e::live_units(&app.mysql, &format!("event_id = {event}")).await
}

/// Every buyer tries once for one unit (retried while 503), all at once; (202s,
/// SOLD_OUTs).
pub(crate) async fn stampede(
    app: &TestApp,
    event: u64,
    category: u64,
    buyers: &[Buyer],
) -> (Vec<u64>, u32) {
    let mut tasks = tokio::task::JoinSet::new();
    for b in buyers {
        let (http, base, user, token) = (
            app.http.clone(),
            app.public_url.clone(),
            b.user_id,
            b.token.clone(),
        );
        tasks.spawn(async move {
            let body = json!({"category_id": category, "quantity": 1});
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let (status, answer) =
                    purchase(&http, &base, event, &token, "k1", body.clone()).await;
                if status != 503 || Instant::now() > deadline {
                    return (user, status, answer);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }
    let (mut admitted, mut sold_out) = (Vec::new(), 0);
    while let Some(answer) = tasks.join_next().await {
        let (user, status, body) = answer.unwrap();
        match status {
            202 => admitted.push(user),
            409 if body["error"]["code"] == "SOLD_OUT" => sold_out += 1,
            _ => panic!("user {user}: {status} {body}"),
        }
    }
    (admitted, sold_out)
}

/// The reconciler's report once every gap is 0.
async fn balanced(app: &TestApp, event: u64) -> Value {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, report) = app
            .post(&format!("/admin/events/{event}/reconcile"), json!({}))
            .await;
        assert_eq!(status, 200, "{report}");
        let cs = report["balance"]["categories"].as_array().unwrap();
        if cs.iter().all(|c| c["gap"] == 0 && c["oversold"] == 0) {
            return report;
        }
        assert!(Instant::now() < until, "books not balanced: {report:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucketed_event_sells_every_unit_once_and_says_sold_out_only_when_all_are_empty() {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(bucketed_sale(40, 2, BUCKETS)).await;
    let ga = categories[0];
    let (_, shown) = app.get(&format!("/admin/events/{event}")).await;
    assert_eq!(shown["buckets"], 3, "{shown}");
    app.publish(event).await;

    // The layout: a third of the slot space per bucket, the units dealt over the
    // buckets and the pool, nothing flagged.
    let mut r = app.redis.clone();
    let mut dealt = 0;
    for b in Bucket::all(event, BUCKETS) {
        let third = u32::from(slot(b.tag().as_bytes())) * 3 / 16_384;
        assert_eq!(third, u32::from(b.index), "{}", b.tag());
        let units: i64 = r.hget(app.keys().stock(b), ga).await.unwrap();
        assert_eq!(units, 4, "ceil(40 / 12) to each bucket");
        dealt += units;
    }
    let pool: i64 = r.hget(app.keys().pool(event), ga).await.unwrap();
    assert_eq!(pool + dealt, 40);
    assert_eq!(available(&app, event, ga).await, 40);
    assert!(!flagged(&app, event, ga).await);

    // 60 buyers for 40 units, from every bucket at once.
    let buyers = app.buyers(60).await;
    let in_bucket: HashMap<u64, Bucket> = buyers
        .iter()
        .map(|b| {
            (
                b.user_id,
                Bucket::of_buyer(event, BUCKETS, UserId(b.user_id)),
            )
        })
        .collect();
    assert_eq!(
        in_bucket
            .values()
            .map(|b| b.index)
            .collect::<HashSet<_>>()
            .len(),
        3
    );
    let (admitted, sold_out) = stampede(&app, event, ga, &buyers).await;
    assert_eq!(
        (admitted.len(), sold_out),
        (40, 20),
        "every unit once, then SOLD_OUT"
    );
    assert_eq!(available(&app, event, ga).await, 0);
    assert!(
        flagged(&app, event, ga).await,
        "the edge's flag once all are empty"
    );

    // A repeated key answers as before, and each buyer's status is in their bucket.
    let first = &buyers[0];
    let again = app
        .buy(
            event,
            first,
            "k1",
            json!({"category_id": ga, "quantity": 1}),
        )
        .await;
    let was_admitted = admitted.contains(&first.user_id);
    assert_eq!(again.0, if was_admitted { 202 } else { 409 }, "{}", again.1);
    for b in &buyers[..10] {
        let bucket = in_bucket[&b.user_id];
        let status: Option<String> = r
            .hget(app.keys().purchase_status(bucket), b.user_id)
            .await
            .unwrap();
        assert_eq!(
            status.is_some(),
            admitted.contains(&b.user_id),
            "{status:?}"
        );
    }

    // Every 202 becomes an order; the admission numbers are distinct and each is its
    // buyer's bucket's (≡ bucket index mod 3).
    let owner = buyers
        .iter()
        .find(|b| admitted.contains(&b.user_id))
        .unwrap();
    let order_no = created(&app, event, owner).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            live_units(&app, event).await == 40
        })
        .await,
        "40 orders"
    );
    let seqs = over_shards(&format!(
        "SELECT user_id, seq FROM {{orders}} o JOIN stock_log l USING (order_no) \
         WHERE o.event_id = {event}"
    ));
    let rows: Vec<(u64, u64)> =
        mysql_async::prelude::Queryable::query(&mut app.mysql.get_conn().await.unwrap(), seqs)
            .await
            .unwrap();
    assert_eq!(rows.len(), 40);
    assert_eq!(rows.iter().map(|r| r.1).collect::<HashSet<_>>().len(), 40);
    for (user, seq) in &rows {
        assert_eq!(
            seq % 3,
            u64::from(in_bucket[user].index),
            "user {user} seq {seq}"
        );
    }
    balanced(&app, event).await;

    // A cancelled unit goes back into its buyer's bucket; the sweeper clears the flag
    // and a buyer of another bucket gets it.
    let (status, body) = call(
        &app,
        reqwest::Method::POST,
        &format!("/api/orders/{order_no}/cancel"),
        owner,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let owner_bucket = in_bucket[&owner.user_id];
    let back: i64 = r.hget(app.keys().stock(owner_bucket), ga).await.unwrap();
    assert_eq!(back, 1);
    assert!(
        eventually(Duration::from_secs(5), || async {
            !flagged(&app, event, ga).await
        })
        .await,
        "the flag cleared within the sweeper's second"
    );
    // A core that saw the flag answers a dry bucket SOLD_OUT for FLAGGED_MEMO more
    // (docs/scaling.md: a unit given back reaches other buckets within the sweeper's
    // second plus that); this one saw it at the sell-out and at the repeated key above.
    tokio::time::sleep(stampede_core::buckets::FLAGGED_MEMO).await;
    let late = app.buyers(6).await;
    let other = late
        .iter()
        .find(|b| Bucket::of_buyer(event, BUCKETS, UserId(b.user_id)) != owner_bucket)
        .expect("a buyer of another bucket");
    let (status, body) = app
        .buy(
            event,
            other,
            "late",
            json!({"category_id": ga, "quantity": 1}),
        )
        .await;
    assert_eq!(
        status, 202,
        "the unit given back reached another bucket: {body}"
    );
    let (status, body) = app
        .buy(
            event,
            late.iter().find(|b| b.user_id != other.user_id).unwrap(),
            "late",
            json!({"category_id": ga, "quantity": 1}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("SOLD_OUT")),
        "{body}"
    );
    assert!(flagged(&app, event, ga).await);
    assert!(
        eventually(Duration::from_secs(20), || async {
            live_units(&app, event).await == 40
        })
        .await
    );
    balanced(&app, event).await;

    // One bucket goes back in time (its shard's replica took over without the last
    // admissions): its counter is below its orders' numbers in MySQL; the reconciler
    // fences the event and rebuilds every bucket, the counter from MySQL's.
    let rewound = Bucket {
        event: EventId(event),
        index: 2,
        count: BUCKETS,
    };
    let mysql_max = rows
        .iter()
        .filter(|(user, _)| in_bucket[user] == rewound)
        .map(|r| r.1)
        .max()
        .unwrap();
    // (An expired reservation's stock_log row has no number: the check reads past it.)
    mysql_async::prelude::Queryable::exec_drop(
        &mut app.mysql.get_conn().await.unwrap(),
        "INSERT INTO stock_log (order_no, event_id, category_id, quantity, batch_id, status, seq) \
         VALUES (?, ?, ?, 1, 'expired-in-test', 'EXPIRED', NULL)",
        (u64::MAX - event, event, ga),
    )
    .await
    .unwrap();
    let () = r.hset(app.keys().meta(rewound), "seq", 2).await.unwrap();
    let report = balanced(&app, event).await;
    let actions = report["actions"].to_string();
    assert!(
        actions.contains("behind") && actions.contains("bucket 2") && actions.contains("rebuilt"),
        "{report:#}"
    );
    let seq: u64 = r.hget(app.keys().meta(rewound), "seq").await.unwrap();
    assert!(
        seq >= mysql_max && seq % 3 == 2,
        "seq {seq}, MySQL's {mysql_max}"
    );
    assert_eq!(available(&app, event, ga).await, 0);

    // Redis loses the event's keys: the reconciler rebuilds every bucket from MySQL,
    // each buyer's holding in their own bucket.
    let mut gone: Vec<String> = vec![app.keys().event_meta(event), app.keys().pool(event)];
    for b in Bucket::all(event, BUCKETS) {
        gone.extend([app.keys().meta(b), app.keys().stock(b), app.keys().held(b)]);
    }
    let () = redis::cmd("DEL")
        .arg(&gone)
        .query_async(&mut r)
        .await
        .unwrap();
    let report = balanced(&app, event).await;
    // Rebuilt by this pass, or a moment before it by the preload scheduler (every
    // second in the tests; under load it can come first): either way from MySQL.
    let metas: Vec<String> = std::iter::once(app.keys().event_meta(event))
        .chain(Bucket::all(event, BUCKETS).map(|b| app.keys().meta(b)))
        .collect();
    let rebuilt: usize = redis::cmd("EXISTS")
        .arg(&metas)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(rebuilt, metas.len(), "{report:#}");
    assert_eq!(available(&app, event, ga).await, 0);
    let holder = admitted
        .iter()
        .find(|u| **u != owner.user_id)
        .copied()
        .unwrap();
    let held: Option<i64> = r
        .hget(app.keys().held(in_bucket[&holder]), holder)
        .await
        .unwrap();
    assert_eq!(held, Some(1));
    // The per-user limit still holds across the event after the rebuild.
    let limited = buyers.iter().find(|b| b.user_id == holder).unwrap();
    let (status, body) = app
        .buy(
            event,
            limited,
            "more",
            json!({"category_id": ga, "quantity": 2}),
        )
        .await;
    // Their bucket is dry: the limit is told before any refill is tried.
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("LIMIT_REACHED")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_a_stopped_core_left_is_finished_by_the_sweeper_and_one_of_an_older_generation_is_void()
 {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, ga) = open_bucketed_sale(&app, 30, 4).await;
    let mut r = app.redis.clone();
    let target = Bucket {
        event: EventId(event),
        index: 1,
        count: BUCKETS,
    };
    let before: i64 = r.hget(app.keys().stock(target), ga).await.unwrap();
    // What a core that died between move_out.lua and move_in.lua leaves: 5 units out
    // of the pool, recorded, credited nowhere. Recorded just now, so the sweeper leaves
    // both records alone for STALE_MOVE and the pass below sees them.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let epoch: u64 = r.hget(app.keys().event_meta(event), "epoch").await.unwrap();
    let () = redis::pipe()
        .hincr(app.keys().pool(event), ga, -5)
        .hset(
            app.keys().pool_moves(event),
            "dead-core-move",
            format!("1|{ga}|5|{now_ms}|{epoch}"),
        )
        // And one from before a rebuild of the keys (an older generation, whose units
        // the rebuild counted afresh): void, never credited.
        .hset(
            app.keys().pool_moves(event),
            "older-generation-move",
            format!("2|{ga}|3|{now_ms}|{}", epoch - 1),
        )
        .query_async(&mut r)
        .await
        .unwrap();
    // While both wait, the books count the live move's 5 units as moving and the void
    // move's 3 not at all: a pass finds nothing to heal (counting the void 3 made it
    // "lower" the stock by 3, draining every bucket for it).
    let (status, report) = app
        .post(&format!("/admin/events/{event}/reconcile"), json!({}))
        .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["actions"], json!([]), "{report:#}");
    let cs = report["balance"]["categories"].as_array().unwrap();
    assert!(
        cs.iter().all(|c| c["gap"] == 0 && c["oversold"] == 0),
        "{report:#}"
    );
    let stock_now = || async {
        let now: i64 = app
            .redis
            .clone()
            .hget(app.keys().stock(target), ga)
            .await
            .unwrap();
        now
    };
    assert_eq!(
        stock_now().await,
        before,
        "nothing credited before the sweeper's turn"
    );
    // Credited once by the sweeper.
    let credited = eventually(
        stampede_core::buckets::STALE_MOVE + Duration::from_secs(10),
        || async { stock_now().await == before + 5 },
    )
    .await;
    if !credited {
        let moves: HashMap<String, String> = r.hgetall(app.keys().pool_moves(event)).await.unwrap();
        let epoch_now: Option<u64> = r.hget(app.keys().event_meta(event), "epoch").await.unwrap();
        panic!(
            "the sweeper did not credit the move: bucket 1 holds {} (was {before}), \
             records left {moves:?}, epoch {epoch_now:?} (was {epoch})",
            stock_now().await
        );
    }
    // The records go, the finished move's once the credit is in (a call of its own
    // after it: on a cluster the pool's moves and the bucket's stock are in two slots).
    for (id, why) in [
        ("dead-core-move", "the finished move's record is gone"),
        ("older-generation-move", "the void move's record is gone"),
    ] {
        let gone = eventually(Duration::from_secs(5), || async {
            let record: Option<String> = app
                .redis
                .clone()
                .hget(app.keys().pool_moves(event), id)
                .await
                .unwrap();
            record.is_none()
        })
        .await;
        assert!(gone, "{why}");
    }
    assert!(
        r.sismember::<_, _, bool>(app.keys().credited(target), "dead-core-move")
            .await
            .unwrap()
    );
    let other = Bucket { index: 2, ..target };
    assert!(
        !r.sismember::<_, _, bool>(app.keys().credited(other), "older-generation-move")
            .await
            .unwrap()
    );
    assert_eq!(available(&app, event, ga).await, 30, "no unit lost or made");
    balanced(&app, event).await;
}

/// The end of a sale: many purchases find their bucket dry at once and wait for its
/// refill in turn. Once the pool answered "flagged", the ones still waiting answer
/// SOLD_OUT from their core's memo of the flag, not each by asking the pool again (a
/// script on the event's master per purchase: at a 50 000-buyer sale's end, 246 of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purchases_queued_behind_a_refill_do_not_each_ask_the_pool_once_it_is_flagged() {
    let app = spawn_app_with(|_| {}).await;
    let (event, ga) = open_bucketed_sale(&app, 30, 1).await;
    let buyers = app.buyers(240).await;
    let (admitted, sold_out) = stampede(&app, event, ga, &buyers).await;
    assert_eq!((admitted.len(), sold_out), (30, 210));
    assert!(flagged(&app, event, ga).await);
    let refills = |outcome: &'static str| {
        let app = &app;
        async move {
            app.counter(&format!(
                "stampede_bucket_refills_total{{outcome=\"{outcome}\"}}"
            ))
            .await
            .unwrap_or(0)
        }
    };
    let (flagged_by_pool, remembered) = (refills("flagged").await, refills("remembered").await);
    // A refill per bucket may find the flag in each 250 ms its core remembers it (3 in
    // the runs here, on a slow machine a few more); every purchase asking the pool was
    // 210 (checked, the memo after the turn removed).
    assert!(
        remembered > 0,
        "flagged {flagged_by_pool}, remembered {remembered}"
    );
    assert!(
        flagged_by_pool <= 10 * u64::from(BUCKETS),
        "flagged {flagged_by_pool}, remembered {remembered}"
    );
}

/// A refill that fails (here the pool is not a hash; on a cluster, a failover of its
/// master) is SALE_BUSY with nothing reserved, not a 500: the buyer's bucket had
/// answered REFILL, so the purchase holds nothing, and the same key is admitted once
/// the units can move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refill_that_fails_is_sale_busy_with_nothing_reserved() {
    let app = spawn_app_with(|_| {}).await;
    // One unit dealt to each bucket, nine in the pool.
    let (event, ga) = open_bucketed_sale(&app, 12, 2).await;
    let buyers = app.buyers(12).await;
    let first = &buyers[0];
    let bucket = Bucket::of_buyer(event, BUCKETS, UserId(first.user_id));
    let body = json!({"category_id": ga, "quantity": 1});
    let (status, answer) = app.buy(event, first, "k1", body.clone()).await;
    assert_eq!(status, 202, "{answer}");
    let mut r = app.redis.clone();
    let dry: i64 = r.hget(app.keys().stock(bucket), ga).await.unwrap();
    assert_eq!(dry, 0, "the bucket's one unit is taken");

    let pool_key = app.keys().pool(event);
    let pool: HashMap<String, String> = r.hgetall(&pool_key).await.unwrap();
    let _: () = r.del(&pool_key).await.unwrap();
    let _: () = r.set(&pool_key, "not a hash").await.unwrap();
    let (status, answer) = app.buy(event, first, "k2", body.clone()).await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "SALE_BUSY", "{answer}");
    let held: Option<i64> = r
        .hget(app.keys().held(bucket), first.user_id)
        .await
        .unwrap();
    assert_eq!(held, Some(1), "nothing more held for the refused purchase");
    assert_eq!(
        app.counter("stampede_bucket_refills_total{outcome=\"failed\"}")
            .await,
        Some(1)
    );

    let _: () = r.del(&pool_key).await.unwrap();
    let pool: Vec<(String, String)> = pool.into_iter().collect();
    let _: () = r.hset_multiple(&pool_key, &pool).await.unwrap();
    let (status, answer) = app.buy(event, first, "k2", body).await;
    assert_eq!(status, 202, "the same key, once units can move: {answer}");
    let held: Option<i64> = r
        .hget(app.keys().held(bucket), first.user_id)
        .await
        .unwrap();
    assert_eq!(held, Some(2));
}

/// A sale of 12 units over three buckets whose Redis state the test then sets by hand
/// (no preload or reconcile pass to write it back), a buyer, their bucket and another.
async fn hand_set_sale(app: &TestApp) -> (u64, u64, Buyer, Bucket, Bucket) {
    let (event, ga) = open_bucketed_sale(app, 12, 2).await;
    let buyer = app.buyers(1).await.remove(0);
    let theirs = Bucket::of_buyer(event, BUCKETS, UserId(buyer.user_id));
    let other = Bucket {
        index: (theirs.index + 1) % BUCKETS,
        ..theirs
    };
    (event, ga, buyer, theirs, other)
}

/// Every place of the category emptied, except `left` units in `keep` (if any).
async fn only_left(app: &TestApp, event: u64, ga: u64, keep: Option<Bucket>, left: i64) {
    let mut r = app.redis.clone();
    let _: () = r.hset(app.keys().pool(event), ga, 0).await.unwrap();
    for b in Bucket::all(EventId(event), BUCKETS) {
        let units = if Some(b) == keep { left } else { 0 };
        let _: () = r.hset(app.keys().stock(b), ga, units).await.unwrap();
    }
}

fn settings_for_hand_set(s: &mut stampede_core::Settings) {
    s.preload.interval_s = 3600;
    s.reconcile.interval_s = 0;
}

/// A drain that finds fewer units than asked for while units of the category are on
/// their way between two places (here a move a stopped core left: out of the pool, not
/// yet in a bucket) answers SALE_BUSY, not SOLD_OUT, and flags nothing: those units are
/// for sale once they land, and the same key is admitted then (after the sweeper
/// finishes the move).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_short_while_units_move_is_sale_busy_not_sold_out() {
    let app = spawn_app_with(settings_for_hand_set).await;
    let (event, ga, buyer, _, other) = hand_set_sale(&app).await;
    only_left(&app, event, ga, None, 0).await;
    let mut r = app.redis.clone();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let epoch: u64 = r.hget(app.keys().event_meta(event), "epoch").await.unwrap();
    let _: () = r
        .hset(
            app.keys().pool_moves(event),
            "stopped-core-move",
            format!("{}|{ga}|1|{now_ms}|{epoch}", other.index),
        )
        .await
        .unwrap();
    let body = json!({"category_id": ga, "quantity": 1});
    let (status, answer) = app.buy(event, &buyer, "k1", body.clone()).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (503, Some("SALE_BUSY")),
        "a unit is on its way: {answer}"
    );
    assert!(
        !flagged(&app, event, ga).await,
        "nothing flagged for the edge"
    );
    assert_eq!(
        app.counter("stampede_bucket_refills_total{outcome=\"moving\"}")
            .await,
        Some(1)
    );
    let landed = eventually(
        stampede_core::buckets::STALE_MOVE + Duration::from_secs(10),
        || async {
            let units: i64 = app
                .redis
                .clone()
                .hget(app.keys().stock(other), ga)
                .await
                .unwrap();
            units == 1
        },
    )
    .await;
    assert!(landed, "the sweeper finished the move");
    let (status, answer) = app.buy(event, &buyer, "k1", body).await;
    assert_eq!(
        status, 202,
        "the landed unit, to the buyer told SALE_BUSY: {answer}"
    );
    assert_eq!(available(&app, event, ga).await, 0);
}

/// A bucket that takes no part in a drain (here not loaded: its metadata gone, as while
/// it is rebuilt) is not counted as empty: the buyer is told SALE_BUSY, and the edge's
/// flag is not set, while that bucket holds units; once it is loaded again the same key
/// gets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_that_takes_no_part_in_a_drain_is_not_counted_empty() {
    let app = spawn_app_with(settings_for_hand_set).await;
    let (event, ga, buyer, _, other) = hand_set_sale(&app).await;
    only_left(&app, event, ga, Some(other), 1).await;
    let mut r = app.redis.clone();
    let meta: Vec<(String, String)> = r.hgetall(app.keys().meta(other)).await.unwrap();
    assert!(!meta.is_empty());
    let _: () = r.del(app.keys().meta(other)).await.unwrap();
    let body = json!({"category_id": ga, "quantity": 1});
    let (status, answer) = app.buy(event, &buyer, "k1", body.clone()).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (503, Some("SALE_BUSY")),
        "bucket {} holds a unit: {answer}",
        other.index
    );
    assert!(
        !flagged(&app, event, ga).await,
        "nothing flagged for the edge"
    );
    let _: () = r
        .hset_multiple(app.keys().meta(other), &meta)
        .await
        .unwrap();
    let (status, answer) = app.buy(event, &buyer, "k1", body).await;
    assert_eq!(
        status, 202,
        "the same key, once the bucket is loaded: {answer}"
    );
    assert_eq!(available(&app, event, ga).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_are_refused_out_of_range() {
    let app = spawn_app_with(|_| {}).await;
    for (buckets, expected) in [
        (json!(0), "buckets"),
        (json!(17), "buckets"),
        (json!("3"), ""),
    ] {
        let mut body = bucketed_sale(10, 1, 1);
        body["buckets"] = buckets.clone();
        let (status, answer) = app.post("/admin/events", body).await;
        assert_eq!(status, 400, "{buckets}: {answer}");
        assert!(answer.to_string().contains(expected), "{answer}");
    }
    let count = app
        .count("SELECT COUNT(*) FROM event WHERE title = 'Bucketed sale'")
        .await;
    assert_eq!(count, 0, "nothing written for a refused event");
}

/// An event of three buckets with a seated category: seats (and their units) in the
/// event's own slot, the buyers' limits and statuses in their buckets.
pub(crate) fn seated_bucketed_sale(rows: u32, cols: u32) -> Value {
    let mut body = bucketed_sale(10, 2, BUCKETS);
    body["categories"].as_array_mut().unwrap().push(
        json!({"name": "Seated", "price_cents": 9000, "seats": {"rows": rows, "cols": cols}}),
    );
    body
}

/// The category's seat states in Redis, `row:col` → state.
async fn seat_states(app: &TestApp, event: u64, category: u64) -> HashMap<String, String> {
    app.redis
        .clone()
        .hgetall(app.keys().seats(Bucket::only(event), category))
        .await
        .unwrap()
}

/// Each buyer once, all at once, with their own body; (user, status, answer) each.
async fn all_at_once(
    app: &TestApp,
    event: u64,
    asks: Vec<(&Buyer, Value)>,
) -> Vec<(u64, u16, Value)> {
    let mut tasks = tokio::task::JoinSet::new();
    for (b, body) in asks {
        let (http, base, user, token) = (
            app.http.clone(),
            app.public_url.clone(),
            b.user_id,
            b.token.clone(),
        );
        tasks.spawn(async move {
            let (status, answer) = purchase(&http, &base, event, &token, "s1", body).await;
            (user, status, answer)
        });
    }
    tasks.join_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seated_category_over_buckets_sells_every_seat_once() {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(seated_bucketed_sale(3, 4)).await;
    let seated = categories[1];
    app.publish(event).await;
    let mut r = app.redis.clone();

    // The seats and all 12 of their units are in the event's slot; no bucket has any.
    let pool: i64 = r.hget(app.keys().pool(event), seated).await.unwrap();
    assert_eq!(pool, 12);
    for b in Bucket::all(event, BUCKETS) {
        let units: Option<i64> = r.hget(app.keys().stock(b), seated).await.unwrap();
        assert_eq!(units.unwrap_or(0), 0, "bucket {}", b.index);
    }
    let states = seat_states(&app, event, seated).await;
    assert_eq!(states.len(), 12);
    assert!(states.values().all(|s| s == "F"), "{states:?}");

    // One buyer sends one purchase six times at once (one Idempotency-Key): one
    // request, one seat, six identical 202s.
    let buyers = app.buyers(31).await;
    let (eager, buyers) = buyers.split_last().unwrap();
    let same = all_at_once(
        &app,
        event,
        (0..6)
            .map(|_| (eager, json!({"category_id": seated, "seat_ids": ["3:4"]})))
            .collect(),
    )
    .await;
    let ids: HashSet<String> = same
        .iter()
        .map(|(_, status, answer)| {
            assert_eq!(*status, 202, "{answer}");
            assert_eq!(answer["seats"], json!(["3:4"]));
            answer["request_id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 1, "{same:?}");
    // A second seat brings them to the limit of 2; a third is refused before any seat
    // is taken for them.
    let (status, second) = app
        .buy(
            event,
            eager,
            "s2",
            json!({"category_id": seated, "seat_ids": ["3:3"]}),
        )
        .await;
    assert_eq!(status, 202, "{second}");
    let (status, third) = app
        .buy(
            event,
            eager,
            "s3",
            json!({"category_id": seated, "seat_ids": ["3:2"]}),
        )
        .await;
    assert_eq!(
        (status, third["error"]["code"].as_str()),
        (409, Some("LIMIT_REACHED")),
        "{third}"
    );
    assert_eq!(seat_states(&app, event, seated).await["3:2"], "F");
    assert_eq!(available(&app, event, seated).await, 10);

    // Eight buyers of every bucket choose seat 1:1 at once: one gets it.
    let bucket_of = |b: &Buyer| Bucket::of_buyer(event, BUCKETS, UserId(b.user_id)).index;
    let mut racers: Vec<&Buyer> = (0..BUCKETS)
        .map(|k| buyers.iter().find(|b| bucket_of(b) == k).unwrap())
        .collect();
    for b in buyers {
        if racers.len() < 8 && !racers.iter().any(|r| r.user_id == b.user_id) {
            racers.push(b);
        }
    }
    let others: Vec<&Buyer> = buyers
        .iter()
        .filter(|b| !racers.iter().any(|r| r.user_id == b.user_id))
        .collect();
    let race = all_at_once(
        &app,
        event,
        racers
            .iter()
            .map(|b| (*b, json!({"category_id": seated, "seat_ids": ["1:1"]})))
            .collect(),
    )
    .await;
    let winners: Vec<&(u64, u16, Value)> = race.iter().filter(|a| a.1 == 202).collect();
    assert_eq!(winners.len(), 1, "{race:?}");
    for (user, status, answer) in &race {
        assert!(
            *status == 202 || answer["error"]["code"] == "SEAT_TAKEN",
            "user {user}: {status} {answer}"
        );
    }
    let (first_user, _, first) = winners[0].clone();
    assert_eq!(first["seats"], json!(["1:1"]));

    // The next twenty ask for the best seat: nine get one, eleven are told SOLD_OUT.
    let rush = all_at_once(
        &app,
        event,
        others[..20]
            .iter()
            .map(|b| (*b, json!({"category_id": seated, "quantity": 1})))
            .collect(),
    )
    .await;
    let admitted = rush.iter().filter(|a| a.1 == 202).count();
    let sold_out = rush
        .iter()
        .filter(|a| a.1 == 409 && a.2["error"]["code"] == "SOLD_OUT")
        .count();
    assert_eq!((admitted, sold_out), (9, 11), "{rush:?}");

    // Every seat held once, by a request that was admitted; nothing pending; the edge's
    // flag set; the buyer's status in their own bucket.
    let mut holders: HashMap<String, String> = HashMap::new();
    let eager_ones = [same[0].clone(), (eager.user_id, 202, second.clone())];
    for (_, status, answer) in race.iter().chain(&rush).chain(&eager_ones) {
        if *status == 202 {
            let rid = answer["request_id"].as_str().unwrap().to_owned();
            for seat in answer["seats"].as_array().unwrap() {
                let seat = seat.as_str().unwrap().to_owned();
                assert!(
                    holders.insert(seat.clone(), rid.clone()).is_none(),
                    "{seat} twice"
                );
            }
        }
    }
    assert_eq!(holders.len(), 12);
    let states = seat_states(&app, event, seated).await;
    for (seat, rid) in &holders {
        assert_eq!(states[seat], format!("L:{rid}"), "{seat}");
    }
    let pending: u64 = r.zcard(app.keys().seat_locks(event)).await.unwrap();
    assert_eq!(pending, 0, "no lock left pending");
    assert!(flagged(&app, event, seated).await, "the edge's flag");
    assert_eq!(available(&app, event, seated).await, 0);

    // A repeated key answers the same request and seats; the winner's order is created.
    let winner = buyers.iter().find(|b| b.user_id == first_user).unwrap();
    let again = purchase(
        &app.http,
        &app.public_url,
        event,
        &winner.token,
        "s1",
        json!({"category_id": seated, "seat_ids": ["1:1"]}),
    )
    .await;
    assert_eq!(
        (again.0, &again.1["request_id"]),
        (202, &first["request_id"])
    );
    let order_no = created(&app, event, winner).await;
    let live = eventually(Duration::from_secs(20), || async {
        live_units(&app, event).await == 12
    })
    .await;
    assert!(
        live,
        "12 seats in live orders: {}",
        live_units(&app, event).await
    );

    // The winner cancels: the seat and its unit are for sale again at once, flag down,
    // and a buyer of another bucket takes it.
    let (status, cancelled) = call(
        &app,
        reqwest::Method::POST,
        &format!("/api/orders/{order_no}/cancel"),
        winner,
    )
    .await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(seat_states(&app, event, seated).await["1:1"], "F");
    assert_eq!(available(&app, event, seated).await, 1);
    assert!(!flagged(&app, event, seated).await);
    let winner_bucket = Bucket::of_buyer(event, BUCKETS, UserId(first_user));
    let late = others
        .iter()
        .find(|b| Bucket::of_buyer(event, BUCKETS, UserId(b.user_id)) != winner_bucket)
        .expect("a buyer of another bucket");
    let (status, answer) = app
        .buy(
            event,
            late,
            "late",
            json!({"category_id": seated, "seat_ids": ["1:1"]}),
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    let late_order = created(&app, event, late).await;

    // Paid: the seat sold in the seats' slot, the status PAID in the buyer's bucket.
    let (status, _) = call(
        &app,
        reqwest::Method::POST,
        &format!("/api/orders/{late_order}/pay"),
        late,
    )
    .await;
    assert_eq!(status, 200);
    let secret = crate::payment::provider_secret(&app);
    let (status, paid) = crate::payment::callback(&app, &secret, "txn-s", late_order, 9000).await;
    assert_eq!(status, 200, "{paid}");
    assert_eq!(
        seat_states(&app, event, seated).await["1:1"],
        format!("S:{late_order}")
    );
    assert_eq!(app.purchase_status(event, late).await["status"], "PAID");
    balanced(&app, event).await;

    // Redis loses the event's keys: the rebuild from MySQL puts every seat back in the
    // event's slot as MySQL has it.
    let before = seat_states(&app, event, seated).await;
    let mut gone: Vec<String> = vec![
        app.keys().event_meta(event),
        app.keys().pool(event),
        app.keys().seats(Bucket::only(event), seated),
    ];
    for b in Bucket::all(event, BUCKETS) {
        gone.extend([app.keys().meta(b), app.keys().stock(b)]);
    }
    let () = redis::cmd("DEL")
        .arg(&gone)
        .query_async(&mut r)
        .await
        .unwrap();
    let rebuilt = eventually(Duration::from_secs(20), || async {
        seat_states(&app, event, seated).await == before
    })
    .await;
    assert!(rebuilt, "{:?}", seat_states(&app, event, seated).await);
    assert_eq!(available(&app, event, seated).await, 0);
}

/// A core that stopped between the steps of a seated purchase: a lock nobody confirmed
/// is freed once its time passed, a lock whose purchase was admitted is kept; and a
/// lock older than 10 s is not trusted by reserve.lua.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seat_locks_a_stopped_core_left_are_settled_by_the_sweeper() {
    use stampede_core::admission::{Purchase, Refusal, Seats, reserve, seat_lock};
    use stampede_core::domain::OrderNo;

    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(seated_bucketed_sale(2, 2)).await;
    let seated = categories[1];
    app.publish(event).await;
    let buyers = app.buyers(2).await;
    let (keys, mut r) = (app.keys(), app.redis.clone());
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    let purchase = |user: u64, seat: (u32, u32)| Purchase {
        event_id: event,
        category_id: seated,
        user_id: user,
        quantity: 1,
        seats: Seats::Chosen {
            cols: 2,
            seats: vec![seat],
        },
        bucket: Bucket::of_buyer(event, BUCKETS, UserId(user)),
    };

    // Locked, never reserved: the "stopped core" left it. Its time passes.
    let lost = purchase(buyers[0].user_id, (1, 1));
    let lock = |p: Purchase, rid: u64, key: &'static str| {
        let (mut r, keys) = (app.redis.clone(), app.keys());
        async move {
            match seat_lock::lock(&mut r, &keys, &p, OrderNo(rid), key, now())
                .await
                .unwrap()
            {
                seat_lock::Lock::Locked(l) => l,
                other => panic!("{other:?}"),
            }
        }
    };
    let locked = lock(lost.clone(), 9_001, "lost").await;
    assert_eq!(locked.seats, vec!["1:1"]);
    // The same request again (a retried call): the same seats, taken once.
    assert_eq!(lock(lost.clone(), 9_001, "lost").await, locked);
    // Another request with the same key while this one is pending: in flight.
    let other = seat_lock::lock(
        &mut r,
        &keys,
        &purchase(buyers[0].user_id, (1, 2)),
        OrderNo(9_004),
        "lost",
        now(),
    )
    .await
    .unwrap();
    assert_eq!(other, seat_lock::Lock::InFlight);
    assert_eq!(seat_states(&app, event, seated).await["1:1"], "P:9001");
    assert_eq!(available(&app, event, seated).await, 3);

    // Locked and reserved, never confirmed.
    let kept = purchase(buyers[1].user_id, (2, 2));
    let locked = lock(kept.clone(), 9_002, "kept").await;
    let outcome = reserve::reserve(
        &mut r,
        &keys,
        &kept,
        OrderNo(9_002),
        "kept",
        now(),
        1_000,
        Some(&locked),
    )
    .await
    .unwrap()
    .into_result();
    assert!(outcome.is_ok(), "{outcome:?}");

    // A lock the seats' master took more than 10 s ago is refused, SALE_BUSY.
    let stale = seat_lock::Locked {
        seats: vec!["1:2".into()],
        at_ms: now() - 11_000,
    };
    let outcome = reserve::reserve(
        &mut r,
        &keys,
        &purchase(buyers[0].user_id, (1, 2)),
        OrderNo(9_003),
        "stale",
        now(),
        1_000,
        Some(&stale),
    )
    .await
    .unwrap()
    .into_result();
    assert_eq!(outcome, Err(Refusal::Busy));

    // Both locks' time passes: the sweeper frees the first, keeps the second.
    let () = redis::cmd("ZADD")
        .arg(keys.seat_locks(event))
        .arg(0)
        .arg(9_001)
        .arg(0)
        .arg(9_002)
        .query_async(&mut r)
        .await
        .unwrap();
    let settled = eventually(Duration::from_secs(10), || async {
        let states = seat_states(&app, event, seated).await;
        states["1:1"] == "F" && states["2:2"] == "L:9002"
    })
    .await;
    assert!(settled, "{:?}", seat_states(&app, event, seated).await);
    assert_eq!(
        available(&app, event, seated).await,
        3,
        "the lost lock's unit is back"
    );
    let pending: u64 = r.zcard(keys.seat_locks(event)).await.unwrap();
    assert_eq!(pending, 0);

    // A purchase whose Idempotency-Key an earlier request holds a pending lock for
    // waits for that request, and answers what it got.
    let first = purchase(buyers[1].user_id, (1, 2));
    let locked = lock(first.clone(), 9_005, "twice").await;
    let body = json!({"category_id": seated, "seat_ids": ["1:2"]});
    let (answer, ()) = tokio::join!(app.buy(event, &buyers[1], "twice", body), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut r = app.redis.clone();
        let admitted = reserve::reserve(
            &mut r,
            &keys,
            &first,
            OrderNo(9_005),
            "twice",
            now(),
            1_000,
            Some(&locked),
        )
        .await
        .unwrap();
        assert!(admitted.into_result().is_ok());
        seat_lock::confirm(
            &mut r,
            &keys,
            EventId(event),
            CategoryId(seated),
            OrderNo(9_005),
            "1:2",
        )
        .await
        .unwrap();
    });
    assert_eq!(answer.0, 202, "{}", answer.1);
    assert_eq!(answer.1["request_id"], "9005");
    assert_eq!(seat_states(&app, event, seated).await["1:2"], "L:9005");
    assert_eq!(available(&app, event, seated).await, 2);
}
