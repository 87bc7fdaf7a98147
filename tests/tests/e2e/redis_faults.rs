//! Redis as a process that fails: restarted from an older AOF mid-sale, killed and
//! down for seconds, and hung while a buyer buys. Each runs a Redis of its own.

use stampede_core::keys::Bucket;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;
use stampede_core::order_tables::OrderStatus;
use stampede_e2e::{
    Buyer, OwnRedis, TestApp, eventually, ordered_units, scalar, small_sale, spawn_app_with,
};

use crate::guards::{buy_one_each, drained};

/// The review's case, end to end: Redis restarted from an AOF cut back to an earlier
/// point of the sale. Admissions go on from the old state; the first reissued number
/// fences the event, the rebuild puts Redis right, and nothing breaks an invariant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_from_an_older_aof_oversells_nothing() {
    let _heavy = stampede_e2e::heavy().await;
    let redis_server = OwnRedis::start();
    let app = spawn_app_with(|s| {
        s.orders.enabled = true;
        redis_server.use_in(s);
        s.reconcile.interval_s = 0;
    })
    .await;
    let (event, categories) = app.create_event(small_sale(30, 2, 5, 2)).await;
    app.publish(event).await;
    let (ga, seated) = (categories[0], categories[1]);
    let early = app.buyers(10).await;
    assert_eq!(buy_one_each(&app, event, ga, &early).await, vec![202; 10]);
    assert!(drained(&app, event).await);
    // The AOF as it is now (everysec: wait for the fsync), kept aside.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let aside = redis_server.aof_dir().with_extension("aside");
    copy_dir(&redis_server.aof_dir(), &aside);
    let later = app.buyers(15).await;
    assert_eq!(buy_one_each(&app, event, ga, &later).await, vec![202; 15]);
    for (i, b) in later.iter().take(5).enumerate() {
        let body = json!({"category_id": seated, "seat_ids": [format!("1:{}", i + 1)]});
        assert_eq!(app.buy(event, b, "seat", body).await.0, 202);
    }
    assert!(drained(&app, event).await);
    assert_eq!(ordered_units(&app.mysql, event).await, (30, 30));
    redis_server.kill9();
    std::fs::remove_dir_all(redis_server.aof_dir()).unwrap();
    std::fs::rename(&aside, redis_server.aof_dir()).unwrap();
    redis_server.restart();

    // MySQL: 25 of the 30 GA units and 5 of the 10 seats in orders. Redis, from the
    // older AOF, believes 20 GA units and every seat are free. Where in this loop the
    // fence and the rebuild land depends on timing: purchases before them are admitted
    // from the old state (and must all fail), those during them are answered 503, and
    // those after are admitted from MySQL's books (the 5 units truly left).
    let newcomers = app.buyers(25).await;
    let answers = buy_one_each(&app, event, ga, &newcomers).await;
    for (i, b) in newcomers.iter().take(5).enumerate() {
        let body = json!({"category_id": seated, "seat_ids": [format!("1:{}", i + 1)]});
        app.buy(event, b, "seat", body).await;
    }
    // Settled: rebuilt (epoch 2 or more), nothing queued, and Redis's GA stock is what
    // MySQL's live orders leave of the 30.
    let books = || async {
        let ga_units = live_units(&app, ga).await;
        let epoch = scalar(
            &app.mysql,
            &format!("SELECT redis_epoch FROM event WHERE id = {event}"),
        )
        .await;
        // The test's own connection died with the old Redis: a new one each time.
        let Ok(mut redis) = redis_server.connection().await else {
            return (ga_units, epoch, None, None);
        };
        let queued: Option<u64> = redis
            .xlen(app.keys().order_stream(Bucket::only(event)))
            .await
            .ok();
        let stock: Option<i64> = redis
            .hget(app.keys().stock(Bucket::only(event)), ga)
            .await
            .ok();
        (ga_units, epoch, queued, stock)
    };
    let settled = eventually(Duration::from_secs(60), || async {
        let (ga_units, epoch, queued, stock) = books().await;
        epoch >= 2 && queued == Some(0) && stock == Some(30 - ga_units)
    })
    .await;
    let (ga_units, epoch, queued, stock) = books().await;
    assert!(
        settled,
        "not settled: epoch {epoch}, {queued:?} queued, stock {stock:?} against {ga_units} GA \
         units in live orders; answers {answers:?}"
    );
    // The 25 units MySQL had, plus at most the 5 left.
    let after_rebuild = usize::try_from(ga_units - 25)
        .unwrap_or_else(|_| panic!("{ga_units} GA units in live orders, fewer than before"));
    assert!(after_rebuild <= 5, "{ga_units} GA units in live orders");
    // Nothing the rewound Redis admitted became an order: it numbered its admissions
    // from its old count (10, at most 30 after 20 more); the rebuild resumed at MySQL's
    // largest (30). So every live GA order numbered 30 or less is one of the 25 from
    // before the restart, and each new one is numbered above.
    let numbered = |cmp: &str| {
        format!(
            "SELECT COUNT(*) FROM ({}) o JOIN stock_log s ON s.order_no = o.order_no \
             WHERE s.event_id = {event} AND s.seq {cmp} 30",
            stampede_e2e::over_shards(&format!(
                "SELECT order_no FROM {{orders}} WHERE category_id = {ga} AND status IN {}",
                OrderStatus::LIVE_SQL
            ))
        )
    };
    assert_eq!(scalar(&app.mysql, &numbered("<=")).await, 25);
    assert_eq!(
        scalar(&app.mysql, &numbered(">")).await,
        after_rebuild as i64,
        "the new GA orders were all admitted after the rebuild"
    );
    // No answer but admitted, sold out (the rewound or the rebuilt stock ran out) or
    // unavailable while fenced.
    assert!(
        answers.iter().all(|a| [202, 409, 503].contains(a)),
        "{answers:?}"
    );
    let admitted = answers.iter().filter(|a| **a == 202).count();
    assert!(
        admitted >= after_rebuild,
        "{after_rebuild} new GA orders from {admitted} admissions; answers {answers:?}"
    );
    let seats_twice = scalar(
        &app.mysql,
        &format!(
            "SELECT COUNT(*) FROM (SELECT row_no, col_no FROM ({}) s GROUP BY row_no, col_no HAVING COUNT(*) > 1) t",
            stampede_e2e::over_shards(&format!(
                "SELECT i.row_no, i.col_no FROM {{items}} i JOIN {{orders}} o ON o.order_no = i.order_no \
                 WHERE o.event_id = {event} AND o.status IN {} AND i.row_no IS NOT NULL",
                OrderStatus::LIVE_SQL
            ))
        ),
    )
    .await;
    assert_eq!(seats_twice, 0, "no seat in two live orders");
    let over_limit = scalar(
        &app.mysql,
        &format!("SELECT COUNT(*) FROM user_hold WHERE event_id = {event} AND units > 2"),
    )
    .await;
    assert_eq!(over_limit, 0);
    // Every 202 is terminal: CREATED, or FAILED with a reason (a reservation the
    // rebuild dropped says so).
    for (b, _) in newcomers.iter().zip(&answers).filter(|(_, a)| **a == 202) {
        let status = app.purchase_status(event, b).await;
        let word = status["status"].as_str().unwrap_or_default();
        assert!(["CREATED", "FAILED"].contains(&word), "{status}");
    }
    // The sale goes on from MySQL's books: the units left, then sold out.
    let left = 30 - ga_units as usize;
    let last = app.buyers(left as u64 + 1).await;
    let answers = buy_one_each(&app, event, ga, &last).await;
    let mut expected = vec![202; left];
    expected.push(409);
    assert_eq!(answers, expected);
    let done = eventually(Duration::from_secs(30), || async {
        live_units(&app, ga).await == 30
    })
    .await;
    assert!(
        done,
        "{} GA units in live orders",
        live_units(&app, ga).await
    );
    assert_eq!(
        ordered_units(&app.mysql, event).await,
        (35, 35),
        "30 GA units and the 5 seats sold before the restart, in one order each"
    );
    app.stop().await;
}

/// Units of `category` in live orders, over every shard.
async fn live_units(app: &TestApp, category: u64) -> i64 {
    stampede_e2e::live_units(&app.mysql, &format!("category_id = {category}")).await
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// A core of its own on `redis_server` (settings adjusted by `adjust`) with one published
/// sale (10 GA units, per-user limit 2), two buyers, and the first one's 202 for a GA unit
/// under the Idempotency-Key "k": the app, the event, its categories, the GA body, the
/// buyers.
async fn a_sale_bought_once(
    redis_server: &OwnRedis,
    adjust: impl FnOnce(&mut stampede_core::Settings),
) -> (TestApp, u64, Vec<u64>, serde_json::Value, Vec<Buyer>) {
    let app = spawn_app_with(|s| {
        s.orders.enabled = true;
        redis_server.use_in(s);
        adjust(s);
    })
    .await;
    let (event, categories) = app.create_event(small_sale(10, 1, 2, 2)).await;
    app.publish(event).await;
    let body = json!({"category_id": categories[0], "quantity": 1});
    let buyers = app.buyers(2).await;
    assert_eq!(app.buy(event, &buyers[0], "k", body.clone()).await.0, 202);
    (app, event, categories, body, buyers)
}

/// What the core's readiness says of Redis: "up", or "down: <why>".
async fn redis_readiness(app: &TestApp) -> String {
    let (_, ready) = app.get("/readyz").await;
    ready["dependencies"]["redis"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// After the fault: the second buyer's purchase is admitted (retried while the core
/// still recovers), and both purchases become orders.
async fn the_second_buyer_is_admitted_and_both_ordered(
    app: &TestApp,
    event: u64,
    body: &serde_json::Value,
    buyers: &[Buyer],
) {
    let bought = eventually(Duration::from_secs(10), || async {
        app.buy(event, &buyers[1], "k", body.clone()).await.0 == 202
    })
    .await;
    assert!(
        bought,
        "{:?}",
        app.buy(event, &buyers[1], "k", body.clone()).await
    );
    let both = eventually(Duration::from_secs(20), || async {
        ordered_units(&app.mysql, event).await == (2, 2)
    })
    .await;
    assert!(both, "{:?}", ordered_units(&app.mysql, event).await);
}

/// Redis killed and down for a few seconds, then back: the core uses it again within
/// seconds. The reconnection used to pause 60–120 s after its first two tries failed
/// (the redis crate's backoff), so a Redis down longer than those tries was left unused
/// for a minute or two after it came back (chaos `redis-kill`'s slow settles).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_back_after_seconds_down_is_used_again_within_seconds() {
    let redis_server = OwnRedis::start();
    let (app, event, _, body, buyers) = a_sale_bought_once(&redis_server, |_| {}).await;
    // The AOF holds the purchase (everysec: wait for the fsync).
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    redis_server.kill9();
    // Down for longer than a reconnection's two tries (the first pause is 1–2 s).
    let down = redis_readiness(&app).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    redis_server.restart();
    let restarted = tokio::time::Instant::now();
    // The reconnection in progress may pause 2 s more before its next try.
    let back = eventually(Duration::from_secs(8), || async {
        redis_readiness(&app).await == "up"
    })
    .await;

    assert!(down.starts_with("down"), "{down}");
    assert!(
        back,
        "the core still finds Redis down {:?} after it came back: {}",
        restarted.elapsed(),
        redis_readiness(&app).await
    );
    the_second_buyer_is_admitted_and_both_ordered(&app, event, &body, &buyers).await;
    app.stop().await;
}

/// Redis restarted and still loading its data: a purchase meanwhile is refused by Redis
/// without running (a LOADING answer), so the buyer hears 503 UNAVAILABLE — nothing
/// happened, retry — not OUTCOME_UNKNOWN; once loaded, the same purchase is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_while_redis_loads_its_data_is_unavailable_not_unknown() {
    let redis_server = OwnRedis::start();
    let (app, event, _, body, buyers) = a_sale_bought_once(&redis_server, |_| {}).await;
    // Data that takes seconds to load at 200 µs a key, apart from the sale's keys.
    let mut own = redis_server.connection().await.unwrap();
    let filler = "for i = 1, 20000 do redis.call('SET', 'filler:' .. i, i) end";
    let () = redis::cmd("EVAL")
        .arg(filler)
        .arg(0)
        .query_async(&mut own)
        .await
        .unwrap();
    // The AOF holds it all (everysec: wait for the fsync).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    redis_server.kill9();
    // 20 000 keys at 300 µs each: a load of about 6 s, sped up below once the purchase
    // is answered. (Slower keys would leave the core's call unanswered past its 2 s
    // timeout: Redis serves clients between batches of keys while it loads.)
    redis_server.restart_loading_slowly(300);
    // The core's connection died with the old Redis: readiness reconnects, and reads
    // Redis's LOADING answer.
    let reconnected = eventually(Duration::from_secs(8), || async {
        redis_readiness(&app)
            .await
            .to_lowercase()
            .contains("loading")
    })
    .await;
    assert!(reconnected, "{}", redis_readiness(&app).await);

    let (status, answer) = app.buy(event, &buyers[1], "k", body.clone()).await;
    assert!(redis_server.loading(), "the load ended before the answer");
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "UNAVAILABLE", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("Redis"),
        "{answer}"
    );
    // The rest of the load at full speed (CONFIG is served while loading).
    let mut cli = std::process::Command::new("redis-cli");
    cli.args(["-p", &redis_server.port.to_string()]);
    let sped_up = cli
        .args(["CONFIG", "SET", "key-load-delay", "0"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&sped_up.stdout).contains("OK"));
    let loaded = eventually(Duration::from_secs(30), || async {
        !redis_server.loading()
    })
    .await;
    assert!(loaded, "still loading");
    // Nothing of the refused purchase is in Redis: no record of its key, one reservation
    // (the first buyer's) ever queued.
    let mut own = redis_server.connection().await.unwrap();
    let recorded: bool = own
        .hexists(
            app.keys().idempotency(Bucket::only(event)),
            format!("{}:k", buyers[1].user_id),
        )
        .await
        .unwrap();
    assert!(!recorded, "the refused purchase left its key in Redis");
    the_second_buyer_is_admitted_and_both_ordered(&app, event, &body, &buyers).await;
    app.stop().await;
}

/// Redis refusing the core's reconnection (its password changed under the core, then
/// changed back): the redis crate gives up for good on a reconnection that AUTH
/// refused; the core connects anew once Redis takes its password again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_refused_the_reconnection_is_used_again_once_it_accepts() {
    let redis_server = OwnRedis::start();
    let mut own = redis_server.connection().await.unwrap();
    let password = |secret: &str| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg("requirepass").arg(secret);
        cmd
    };
    // This connection stays authenticated whatever the password becomes.
    password("first-secret").exec_async(&mut own).await.unwrap();
    let (app, event, _, body, buyers) = a_sale_bought_once(&redis_server, |s| {
        s.redis.url = format!("redis://:first-secret@127.0.0.1:{}/", redis_server.port);
    })
    .await;

    password("second-secret")
        .exec_async(&mut own)
        .await
        .unwrap();
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .exec_async(&mut own)
        .await
        .unwrap();
    let refused = eventually(Duration::from_secs(10), || async {
        redis_readiness(&app).await.starts_with("down")
    })
    .await;
    // Long enough for the crate's reconnection (two tries, 1–2 s apart) to give up.
    tokio::time::sleep(Duration::from_secs(4)).await;
    password("first-secret").exec_async(&mut own).await.unwrap();
    let back = eventually(Duration::from_secs(10), || async {
        redis_readiness(&app).await == "up"
    })
    .await;

    let now = redis_readiness(&app).await;
    assert!(refused, "the reconnection was not refused: {now}");
    assert!(back, "still down with the password back: {now}");
    the_second_buyer_is_admitted_and_both_ordered(&app, event, &body, &buyers).await;
    app.stop().await;
}

/// Redis hung (SIGSTOP) while a buyer presses buy: the answer is true — not a 500 — and
/// once Redis wakes the buyer learns what became of the purchase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_redis_never_answered_is_outcome_unknown_and_then_known() {
    let _heavy = stampede_e2e::heavy().await;
    let redis_server = OwnRedis::start();
    // The first buyer's 202: Redis knows the script by its hash from here on (a hung
    // EVALSHA of a script it has never seen would just fail, with nothing admitted:
    // also the truth).
    let (app, event, categories, body, buyers) = a_sale_bought_once(&redis_server, |_| {}).await;
    let buyer = &buyers[1];

    redis_server.hang(true);
    let (status, answer) = app.buy(event, buyer, "k", body.clone()).await;
    let seats = app
        .http
        .get(format!(
            "{}/api/events/{event}/seats?category={}",
            app.public_url, categories[1]
        ))
        .bearer_auth(&buyer.token)
        .send()
        .await
        .unwrap();
    let (seats_status, seats_body) = (seats.status().as_u16(), seats.text().await.unwrap());
    let (stats_status, stats) = app.get(&format!("/admin/events/{event}/stats")).await;
    redis_server.hang(false);

    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "OUTCOME_UNKNOWN", "{answer}");
    assert_eq!(
        answer["error"]["status_url"],
        format!("/api/events/{event}/orders/status")
    );
    assert_eq!(seats_status, 503, "{seats_body}");
    assert!(seats_body.contains("Redis is unavailable"), "{seats_body}");
    assert_eq!(stats_status, 200, "{stats}");
    assert!(stats["redis_unavailable"].is_string(), "{stats}");
    assert!(
        stats["categories"][0]["redis_available"].is_null(),
        "{stats}"
    );
    // Redis ran the script once it woke: the purchase was admitted after all.
    let known = eventually(Duration::from_secs(20), || async {
        app.purchase_status(event, buyer).await["status"] == "CREATED"
    })
    .await;
    assert!(known, "{}", app.purchase_status(event, buyer).await);
    let (again, first) = app.buy(event, buyer, "k", body).await;
    assert_eq!(again, 202, "the same key answers the first answer: {first}");
    let both = eventually(Duration::from_secs(20), || async {
        ordered_units(&app.mysql, event).await == (2, 2)
    })
    .await;
    assert!(both, "{:?}", ordered_units(&app.mysql, event).await);
    app.stop().await;
}

/// The provider's callback applied in MySQL while Redis does not answer: the order is
/// PAID, and the provider hears 503 (not 200), so it delivers again. The buyer's status
/// reads CREATED ("pay before the deadline") until then; the repeat, with Redis back,
/// marks it PAID. Answered 200, nothing would ever have marked it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_redis_did_not_take_is_delivered_again_until_it_does() {
    let _heavy = stampede_e2e::heavy().await;
    let redis_server = OwnRedis::start();
    let (app, event, _, _, buyers) = a_sale_bought_once(&redis_server, |_| {}).await;
    let buyer = &buyers[0];
    let order_no = crate::lifecycle::created(&app, event, buyer).await;
    let secret = crate::payment::provider_secret(&app);
    let paid_in_mysql = format!(
        "SELECT COUNT(*) FROM {} WHERE order_no = {order_no} AND status = 'PAID'",
        stampede_e2e::orders_table_of(order_no)
    );

    redis_server.hang(true);
    let (status, answer) = crate::payment::callback(&app, &secret, "txn", order_no, 5_000).await;
    redis_server.hang(false);
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (503, Some("UNAVAILABLE")),
        "{answer}"
    );
    assert_eq!(
        scalar(&app.mysql, &paid_in_mysql).await,
        1,
        "the payment was applied in MySQL"
    );
    assert_eq!(
        app.purchase_status(event, buyer).await,
        json!({"status": "CREATED", "order_no": order_no.to_string()})
    );
    // The provider delivers again: the same transaction, now marked.
    let (status, answer) = crate::payment::callback(&app, &secret, "txn", order_no, 5_000).await;
    assert_eq!(
        (status, &answer["result"], &answer["recorded"]),
        (200, &json!("DUPLICATE"), &json!("PAID")),
        "{answer}"
    );
    assert_eq!(
        app.purchase_status(event, buyer).await,
        json!({"status": "PAID", "order_no": order_no.to_string()})
    );
    app.stop().await;
}

/// Setting a waiting room while Redis does not answer is refused whole: MySQL keeps the
/// room as it was (it kept the new one, which the next rebuild then put in force with no
/// edge or core ever having announced it: buyers asked for passes nobody could get).
#[tokio::test]
async fn a_waiting_room_redis_never_heard_of_is_not_kept_in_mysql() {
    let redis_server = OwnRedis::start();
    let (app, event, _, _, _) = a_sale_bought_once(&redis_server, |_| {}).await;
    redis_server.hang(true);
    let (status, answer) = app
        .admin_api
        .call(
            reqwest::Method::PUT,
            &format!("/admin/events/{event}/waiting-room"),
            Some(json!({"enabled": true})),
        )
        .await;
    redis_server.hang(false);
    assert_eq!(status, 503, "{answer}");
    let enabled = scalar(
        &app.mysql,
        &format!("SELECT COUNT(*) FROM waiting_room WHERE event_id = {event} AND enabled = 1"),
    )
    .await;
    assert_eq!(enabled, 0, "the room Redis never heard of is in MySQL");
    app.stop().await;
}

/// HGETALL calls this Redis has answered so far.
async fn hgetall_calls(redis_server: &OwnRedis) -> u64 {
    let mut conn = redis_server.connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_hgetall:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// An event's page read in a loop by one token (as fast as the edge's per-address limit
/// lets it; every open buyer app asks every 2 s) costs the Redis that admits purchases
/// a read of what is left at most every 250 ms, not one (B + 1 with buckets) per page;
/// the page still says what is left, and its server clock is read each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_events_page_asked_in_a_loop_costs_redis_a_read_per_moment_not_per_page() {
    let redis_server = OwnRedis::start();
    let (app, event, categories, _, buyers) = a_sale_bought_once(&redis_server, |_| {}).await;
    let page = || async {
        let resp = app
            .http
            .get(format!("{}/api/events/{event}", app.public_url))
            .bearer_auth(&buyers[1].token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.json::<serde_json::Value>().await.unwrap()
    };
    let first = page().await;
    let ga = first["categories"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == categories[0])
        .unwrap()
        .clone();
    assert_eq!(ga["available"], 9, "{first}");
    let before = hgetall_calls(&redis_server).await;
    let started = std::time::Instant::now();
    let mut clocks = std::collections::HashSet::new();
    for _ in 0..100 {
        clocks.insert(page().await["server_time_ms"].as_i64().unwrap());
    }
    let reads = hgetall_calls(&redis_server).await - before;
    // Other readers of this Redis (the reconciler's pass) may add a few.
    let most = 4 + started.elapsed().as_millis() as u64 / 250;
    assert!(
        reads <= most,
        "100 pages made {reads} HGETALLs (at most {most})"
    );
    assert!(clocks.len() > 1, "the server's clock is read each time");
    app.stop().await;
}

/// A train's seat maps asked journey after journey (45 on a route of 10 stations, each
/// its own map) cost the Redis that admits purchases a read of the class's seats at most
/// every 250 ms, not one per journey; each map still says its journey's seats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trains_seat_maps_asked_journey_by_journey_read_the_class_once_a_moment() {
    let redis_server = OwnRedis::start();
    let app = spawn_app_with(|s| redis_server.use_in(s)).await;
    let stations: Vec<String> = (0..10).map(|i| format!("S{i}")).collect();
    let (event, classes) = app
        .create_event(json!({
            "title": "G10", "venue": "Line 10", "kind": "train", "stations": stations,
            "show_time": "2031-06-01T20:00:00Z",
            "sale_start": "2020-01-01T00:00:00Z", "sale_end": "2031-06-01T12:00:00Z",
            "per_user_limit": 2, "pay_timeout_s": 900,
            "categories": [{"name": "first", "price_cents": 1000, "seats": {"rows": 4, "cols": 4}}],
        }))
        .await;
    app.publish(event).await;
    let buyer = app.buyers(1).await.remove(0);
    let class = classes[0];
    let map = |from: u16, to: u16| {
        let (app, buyer) = (&app, &buyer);
        async move {
            let resp = app
                .http
                .get(format!(
                    "{}/api/events/{event}/seats?category={}&from={from}&to={to}",
                    app.public_url, class
                ))
                .bearer_auth(&buyer.token)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            resp.json::<serde_json::Value>().await.unwrap()
        }
    };
    map(0, 9).await;
    let before = hgetall_calls(&redis_server).await;
    let started = std::time::Instant::now();
    for from in 0..9u16 {
        for to in from + 1..10 {
            let m = map(from, to).await;
            assert_eq!(
                (m["from"].as_u64(), m["to"].as_u64()),
                (Some(from.into()), Some(to.into()))
            );
            assert_eq!(m["seats"], json!(["FFFF", "FFFF", "FFFF", "FFFF"]), "{m}");
        }
    }
    let reads = hgetall_calls(&redis_server).await - before;
    // Other readers of this Redis (the reconciler's pass) may add a few.
    let most = 4 + started.elapsed().as_millis() as u64 / 250;
    assert!(
        reads <= most,
        "45 journeys' seat maps made {reads} HGETALLs (at most {most})"
    );
    app.stop().await;
}

/// A sale on whose last pass balanced is skipped while Redis shows it unchanged; a Redis
/// restarted from a copy taken before the sale's last admissions shows it exactly so
/// (the last admissions before a crash are what a lagging replica or an older copy
/// lacks). The restart is another Redis process: the next pass is a full one, and its
/// rewind check fences and rebuilds the sale — not the sixth pass, 25 s later here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_from_an_older_copy_is_fenced_at_the_next_pass_of_an_idle_sale() {
    let _heavy = stampede_e2e::heavy().await;
    let redis_server = OwnRedis::start();
    let interval = Duration::from_secs(5);
    let app = spawn_app_with(|s| {
        s.orders.enabled = true;
        redis_server.use_in(s);
        s.reconcile.interval_s = interval.as_secs();
        s.reconcile.confirm_ms = 100;
    })
    .await;
    let (event, categories) = app.create_event(small_sale(20, 1, 1, 4)).await;
    app.publish(event).await;
    let ga = categories[0];
    let passes = |pass: &'static str| crate::reconcile::passes(&app, pass);
    let all_passes = || async { passes("full").await + passes("unchanged").await };
    // Up to three tries: on a slow machine a pass may come between the admissions and
    // the restart (it then sees them, and the try shows nothing).
    let mut shown = None;
    for attempt in 0..3 {
        let skipping = eventually(Duration::from_secs(40), || async {
            let skipped = passes("unchanged").await;
            tokio::time::sleep(interval + Duration::from_secs(1)).await;
            passes("unchanged").await > skipped
        })
        .await;
        assert!(skipping, "no pass over the idle sale was skipped");
        // The AOF of the idle sale (everysec: wait for the fsync), kept aside.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let aside = redis_server.aof_dir().with_extension("aside");
        let _ = std::fs::remove_dir_all(&aside);
        copy_dir(&redis_server.aof_dir(), &aside);
        let buyers = app.buyers(3).await;
        // Just after a full pass (the next five would be skipped), three admissions
        // become orders, and Redis restarts from the copy before the next pass.
        let full = passes("full").await;
        let passed = eventually(Duration::from_secs(40), || async {
            passes("full").await > full
        })
        .await;
        assert!(passed, "no full pass in 40 s");
        let before = all_passes().await;
        let units = live_units(&app, ga).await;
        assert_eq!(buy_one_each(&app, event, ga, &buyers).await, vec![202; 3]);
        assert!(drained(&app, event).await);
        assert_eq!(live_units(&app, ga).await, units + 3);
        if all_passes().await != before {
            eprintln!("try {attempt}: a pass came before the restart; again");
            continue;
        }
        redis_server.kill9();
        std::fs::remove_dir_all(redis_server.aof_dir()).unwrap();
        std::fs::rename(&aside, redis_server.aof_dir()).unwrap();
        redis_server.restart();
        shown = Some(std::time::Instant::now());
        break;
    }
    let restarted =
        shown.expect("three tries, each with a pass between the admissions and the restart");
    let epoch = || async {
        scalar(
            &app.mysql,
            &format!("SELECT redis_epoch FROM event WHERE id = {event}"),
        )
        .await
    };
    let rebuilt = eventually(2 * interval + Duration::from_secs(4), || async {
        epoch().await >= 2
    })
    .await;
    assert!(
        rebuilt,
        "not rebuilt {:?} after the restart; {} passes skipped",
        restarted.elapsed(),
        passes("unchanged").await
    );
    // Redis's stock is MySQL's after the rebuild.
    let left = 20 - live_units(&app, ga).await;
    let healed = eventually(Duration::from_secs(10), || async {
        let Ok(mut redis) = redis_server.connection().await else {
            return false;
        };
        redis
            .hget::<_, _, Option<i64>>(app.keys().stock(Bucket::only(event)), ga)
            .await
            .ok()
            .flatten()
            == Some(left)
    })
    .await;
    assert!(
        healed,
        "Redis's stock is not MySQL's {left} after the rebuild"
    );
    app.stop().await;
}

/// What Redis says of a sale's status: (its metadata's status, its sales-index entry's).
async fn redis_status(app: &TestApp, event: u64) -> (Option<String>, Option<String>) {
    let mut redis = app.redis.clone();
    let meta: Option<String> = redis
        .hget(app.keys().meta(Bucket::only(event)), "status")
        .await
        .unwrap();
    let listed: Option<String> = redis.hget(app.keys().sales_index(), event).await.unwrap();
    let listed = listed.map(|l| l.split(':').next().unwrap_or_default().to_owned());
    (meta, listed)
}

/// A close whose Redis write fails (Redis down) answers 503 with MySQL already CLOSED:
/// Redis, back, still says open, so the edges let buyers on and a waiting room's turns
/// run. Nobody sends it again; a reconcile pass writes MySQL's status into Redis (the
/// periodic one too: it passes in full the sale whose write failed). A reopen likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_or_reopen_redis_never_heard_is_written_there_by_a_pass() {
    let _heavy = stampede_e2e::heavy().await;
    let redis_server = OwnRedis::start();
    // No periodic pass: Redis is read as the failure left it, then one pass is asked for.
    let (app, event, _, body, buyers) = a_sale_bought_once(&redis_server, |s| {
        s.reconcile.interval_s = 0;
    })
    .await;
    let closed_in_mysql = || async {
        scalar(
            &app.mysql,
            &format!("SELECT status = 'CLOSED' FROM event WHERE id = {event}"),
        )
        .await
    };
    let open = (Some("open".to_owned()), Some("open".to_owned()));
    let closed = (Some("closed".to_owned()), Some("closed".to_owned()));

    for (action, mysql_closed, before, after) in
        [("close", 1, &open, &closed), ("reopen", 0, &closed, &open)]
    {
        redis_server.kill9();
        let (status, answer) = app
            .admin_api
            .post(&format!("/admin/events/{event}/{action}"), json!({}))
            .await;
        redis_server.restart();
        assert_eq!(status, 503, "{action}: {answer}");
        assert_eq!(closed_in_mysql().await, mysql_closed, "{action} in MySQL");
        let left = eventually(Duration::from_secs(10), || async {
            app.redis.clone().ping::<String>().await.is_ok()
        })
        .await;
        assert!(left, "the core's Redis connection did not come back");
        assert_eq!(
            &redis_status(&app, event).await,
            before,
            "{action}: Redis has the write that failed"
        );
        let (status, report) = app
            .admin_api
            .post(&format!("/admin/events/{event}/reconcile"), json!({}))
            .await;
        assert_eq!(status, 200, "{report}");
        assert_eq!(
            &redis_status(&app, event).await,
            after,
            "{action}: the pass did not write MySQL's status: {report}"
        );
        assert!(
            report["actions"].to_string().contains("written again"),
            "{report}"
        );
    }
    // Open again everywhere: the second buyer buys.
    assert_eq!(app.buy(event, &buyers[1], "k", body).await.0, 202);
    app.stop().await;
}

/// The order-number lease's time left in Redis (ms), and its key (the only one: one core
/// uses this Redis).
async fn lease_left(redis_server: &OwnRedis) -> Option<(String, i64)> {
    let mut conn = redis_server.connection().await.ok()?;
    let keys: Vec<String> = conn.keys("*worker:*").await.ok()?;
    let key = keys.into_iter().next()?;
    let left: i64 = conn.pttl(&key).await.ok()?;
    Some((key, left))
}

/// A renewal of the order-number lease that fails (Redis down) is tried again within a
/// second, not a third of the lease later: a second outage a third later would otherwise
/// stop the core minting (two thirds past the last renewal, SALE_BUSY to every buyer)
/// with Redis back all along. The default lease, 30 s (a renewal every 10 s): Redis is
/// killed just after a renewal and back 11.5 s later; the lease is renewed within 5 s of
/// that (a retry a second, the connection back within 2 s). Without the retry, at the
/// next third, 20 s after the last: 13 s were left (checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_renewal_of_the_order_number_lease_is_tried_again_soon() {
    let _heavy = stampede_e2e::heavy().await;
    let redis_server = OwnRedis::start();
    let app = spawn_app_with(|s| {
        redis_server.use_in(s);
        s.reconcile.interval_s = 0;
    })
    .await;
    assert_eq!(app.settings.ids.worker_lease_s, 30);
    // A renewal: the time left jumps up.
    let mut last = lease_left(&redis_server).await.expect("the core's lease").1;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let now = lease_left(&redis_server).await.expect("the core's lease").1;
        if now > last {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no renewal of the lease seen"
        );
        last = now;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis_server.kill9();
    tokio::time::sleep(Duration::from_secs(11)).await; // the renewal at 10 s fails
    redis_server.restart();
    let again = eventually(Duration::from_secs(5), || async {
        lease_left(&redis_server)
            .await
            .is_some_and(|(_, left)| left > 24_000)
    })
    .await;
    assert!(
        again,
        "the lease was not renewed soon after Redis came back: {:?} ms left",
        lease_left(&redis_server).await
    );
    app.stop().await;
}
