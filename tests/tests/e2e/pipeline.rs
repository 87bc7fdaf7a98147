//! The order pipeline with the real broker and MariaDB: reservations become orders
//! through RocketMQ transactional messages, stock_log and the stock-sync consumer.

use stampede_core::infra::mysql::{ServerIdentity, SessionEnd, end_session};
use stampede_core::keys::Bucket;
use std::collections::HashMap;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use redis::AsyncCommands;
use serde_json::json;
use stampede_e2e::{
    TestApp, TestFaults, eventually, ordered_units, scalar, small_sale, spawn_app_with,
    spawn_faulty_app, unsynced_orders,
};

/// Fires one purchase of `quantity` per buyer, 256 at a time; answers by status.
pub(crate) async fn burst(
    app: &TestApp,
    event: u64,
    category: u64,
    buyers: &[stampede_e2e::Buyer],
) -> HashMap<u16, u64> {
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(256));
    let mut tasks = tokio::task::JoinSet::new();
    for b in buyers {
        let (http, url, token, gate) = (
            app.http.clone(),
            app.public_url.clone(),
            b.token.clone(),
            gate.clone(),
        );
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let body = json!({"category_id": category, "quantity": 1});
            stampede_e2e::purchase(&http, &url, event, &token, "k", body)
                .await
                .0
        });
    }
    let mut answers = HashMap::new();
    while let Some(status) = tasks.join_next().await {
        *answers.entry(status.unwrap()).or_default() += 1;
    }
    answers
}

/// Stream drained, every order synced, and `remain` as in Redis.
async fn settled(app: &TestApp, event: u64, category: u64, units: u64) -> bool {
    let (ordered, _) = ordered_units(&app.mysql, event).await;
    let backlog: u64 = app.stream_len(event).await;
    let unsynced = unsynced_orders(&app.mysql, event).await;
    let remain = scalar(
        &app.mysql,
        &format!("SELECT remain FROM ticket_category WHERE id = {category}"),
    )
    .await;
    ordered == units && backlog == 0 && unsynced == 0 && remain == 5_000 - units as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_buyers_for_five_thousand_units_end_as_five_thousand_ordered_units() {
    let _heavy = stampede_e2e::heavy().await;
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(small_sale(5_000, 1, 1, 2)).await;
    app.publish(event).await;
    let ga = categories[0];
    let buyers = app.buyers(20_000).await;
    let answers = burst(&app, event, ga, &buyers).await;
    assert_eq!(answers.get(&202), Some(&5_000), "{answers:?}");
    assert_eq!(answers.get(&409), Some(&15_000), "{answers:?}");

    let done = eventually(Duration::from_secs(60), || settled(&app, event, ga, 5_000)).await;
    let (units, orders) = ordered_units(&app.mysql, event).await;
    assert!(
        done,
        "not settled within 60 s: {units} units in {orders} orders"
    );
    assert_eq!(orders, 5_000);
    let statuses: HashMap<u64, String> = app
        .redis
        .clone()
        .hgetall(app.keys().purchase_status(Bucket::only(event)))
        .await
        .unwrap();
    assert_eq!(statuses.len(), 5_000, "only admitted buyers have a status");
    assert!(
        statuses.values().all(|s| s.starts_with("CREATED:")),
        "every admitted buyer's status is CREATED"
    );
    let (_, stats) = app.get(&format!("/admin/events/{event}/stats")).await;
    let c = &stats["categories"][0];
    assert_eq!(
        (
            c["redis_available"].as_i64(),
            c["queued"].as_u64(),
            c["unpaid"].as_u64(),
            c["db_remain"].as_i64()
        ),
        (Some(0), Some(0), Some(5_000), Some(0)),
        "{stats}"
    );
    assert_eq!(
        (
            stats["unsynced_stock_log"].as_u64(),
            stats["pipeline"].as_str()
        ),
        (Some(0), Some("running"))
    );
    let distinct = scalar(
        &app.mysql,
        &format!("SELECT COUNT(DISTINCT order_no) FROM stock_log WHERE event_id = {event}"),
    )
    .await;
    assert_eq!(distinct, 5_000, "one stock_log row per order");
    let items = scalar(
        &app.mysql,
        &format!(
            "SELECT COUNT(*) FROM ({}) i",
            stampede_e2e::over_shards(&format!(
                "SELECT i.line FROM {{items}} i JOIN {{orders}} o USING (order_no) \
                 WHERE o.event_id = {event}"
            ))
        ),
    )
    .await;
    assert_eq!(items, 0, "an unseated order is its row alone");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_left_unknown_is_resolved_by_the_broker_check_back() {
    // The listener answers UNKNOW after committing, and the sweeper is out of the way:
    // only the broker's check-back can deliver the stock-sync messages.
    let app = spawn_faulty_app(
        |s| {
            s.orders.enabled = true;
            s.orders.sweep_after_s = 3_600;
        },
        TestFaults {
            checkback_only: true,
        },
    )
    .await;
    let (event, categories) = app.create_event(small_sale(5_000, 1, 1, 2)).await;
    app.publish(event).await;
    let buyers = app.buyers(20).await;
    let answers = burst(&app, event, categories[0], &buyers).await;
    assert_eq!(answers.get(&202), Some(&20));
    let created = eventually(Duration::from_secs(20), || async {
        ordered_units(&app.mysql, event).await.0 == 20
    })
    .await;
    assert!(created, "orders not created");
    assert_eq!(
        unsynced_orders(&app.mysql, event).await,
        20,
        "nothing may sync before the check-back"
    );
    // Cancelled before its batch synced: the batch will subtract one unit fewer.
    let order_no = crate::lifecycle::created(&app, event, &buyers[0]).await;
    let (status, cancelled) = crate::lifecycle::call(
        &app,
        reqwest::Method::POST,
        &format!("/api/orders/{order_no}/cancel"),
        &buyers[0],
    )
    .await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(unsynced_orders(&app.mysql, event).await, 19);
    let remain = || async {
        scalar(
            &app.mysql,
            &format!(
                "SELECT remain FROM ticket_category WHERE id = {}",
                categories[0]
            ),
        )
        .await
    };
    assert_eq!(remain().await, 5_000, "nothing subtracted yet");
    let resolved = eventually(Duration::from_secs(60), || async {
        unsynced_orders(&app.mysql, event).await == 0 && app.stream_len(event).await == 0
    })
    .await;
    assert!(
        resolved,
        "the check-back did not commit the messages within 60 s"
    );
    assert_eq!(
        remain().await,
        5_000 - 19,
        "the cancelled unit never subtracted"
    );
    let (_, metrics) = app.get("/metrics").await;
    let metrics = metrics.as_str().unwrap().to_owned();
    assert!(
        metrics.contains("stampede_checkbacks_total{answer=\"commit\"}"),
        "{metrics}"
    );
    app.stop().await;
}

/// Purchases of 2 units each by `buyers` buyers, admitted by a core without a pipeline:
/// their reservations wait in the stream for [`Admitted::found_late`].
struct Admitted {
    settings: stampede_core::Settings,
    database: String,
    prefix: String,
    admitting: TestApp,
    event: u64,
    categories: Vec<u64>,
    buyers: Vec<stampede_e2e::Buyer>,
    /// Each buyer's request id, by user id.
    requests: HashMap<u64, String>,
}

async fn admitted_without_a_pipeline(buyers: u64) -> Admitted {
    let stack = stampede_e2e::Stack::from_env();
    let (settings, database, prefix) = stampede_e2e::test_settings(&stack).await;
    let admitting =
        stampede_e2e::spawn_app_on(settings.clone(), database.clone(), prefix.clone()).await;
    let (event, categories) = admitting.create_event(small_sale(10, 1, 1, 2)).await;
    admitting.publish(event).await;
    let buyers = admitting.buyers(buyers).await;
    let mut requests = HashMap::new();
    for b in &buyers {
        let body = json!({"category_id": categories[0], "quantity": 2});
        let request = admitted(&admitting, event, b, "k", &body).await;
        requests.insert(b.user_id, request);
    }
    Admitted {
        settings,
        database,
        prefix,
        admitting,
        event,
        categories,
        buyers,
        requests,
    }
}

/// The event's per-buyer held units in Redis (its one bucket).
async fn held_by_buyer(app: &TestApp, event: u64) -> HashMap<u64, i64> {
    app.redis
        .clone()
        .hgetall(app.keys().held(Bucket::only(event)))
        .await
        .unwrap()
}

impl Admitted {
    /// 1.5 s later, the admitting core gone, a core with a pipeline and a 1 s deadline.
    async fn found_late(self) -> TestApp {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        self.admitting.halt().await;
        let mut late = self.settings;
        late.orders.enabled = true;
        late.orders.deadline_s = 1;
        stampede_e2e::spawn_app_on(late, self.database, self.prefix).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_past_its_deadline_is_released_not_created_late() {
    let admitted = admitted_without_a_pipeline(3).await;
    let (event, categories) = (admitted.event, admitted.categories.clone());
    let requests = admitted.requests.clone();
    let app = admitted.found_late().await;
    let statuses_key = app.keys().purchase_status(Bucket::only(event));
    let released = eventually(Duration::from_secs(15), || async {
        let statuses: HashMap<u64, String> =
            app.redis.clone().hgetall(&statuses_key).await.unwrap();
        statuses.len() == 3
            && statuses.iter().all(|(user, s)| {
                *s == format!("FAILED:{}:not persisted within 1 s", requests[user])
            })
    })
    .await;
    assert!(released, "the overdue reservations were not released");
    let stock: i64 = app.stock(event, categories[0]).await;
    assert_eq!(stock, 10, "every unit is back on sale");
    let held = held_by_buyer(&app, event).await;
    assert!(held.is_empty(), "nobody holds units any more: {held:?}");
    assert_eq!(
        ordered_units(&app.mysql, event).await,
        (0, 0),
        "no order created late"
    );
    let expired = scalar(
        &app.mysql,
        &format!("SELECT COUNT(*) FROM stock_log WHERE event_id = {event} AND status = 'EXPIRED'"),
    )
    .await;
    assert_eq!(expired, 3);
    let backlog: u64 = app.stream_len(event).await;
    assert_eq!(backlog, 0);
    app.stop().await;
}

/// A purchase of `body` admitted now (202): its request id.
async fn admitted(
    app: &TestApp,
    event: u64,
    buyer: &stampede_e2e::Buyer,
    key: &str,
    body: &serde_json::Value,
) -> String {
    let (status, answer) = app.buy(event, buyer, key, body.clone()).await;
    assert_eq!(status, 202, "{answer}");
    answer["request_id"].as_str().unwrap().to_owned()
}

/// `GET …/orders/status?request_id=<n>` as `who`.
async fn asked(
    app: &TestApp,
    event: u64,
    who: &stampede_e2e::Buyer,
    n: &str,
) -> (u16, serde_json::Value) {
    app.purchase_status_asked(event, who, &format!("request_id={n}"), None)
        .await
}

/// One purchase is asked for by its number, whatever the buyer did after it: a first
/// purchase, replaced as the buyer's latest by a second while both waited for their
/// orders, reads QUEUED, then FAILED with its own number once it is given back past its
/// deadline — while the buyer's latest status is the second's order. An order replaced
/// by a newer purchase reads as its order says. Another buyer's number is 404; a
/// malformed ask is 400.
#[tokio::test]
async fn each_purchase_reads_its_own_status_by_its_number() {
    let stack = stampede_e2e::Stack::from_env();
    let (settings, database, prefix) = stampede_e2e::test_settings(&stack).await;
    let admitting =
        stampede_e2e::spawn_app_on(settings.clone(), database.clone(), prefix.clone()).await;
    let (event, categories) = admitting.create_event(small_sale(10, 1, 1, 4)).await;
    admitting.publish(event).await;
    let buyers = admitting.buyers(2).await;
    let (buyer, other) = (&buyers[0], &buyers[1]);
    let one = json!({"category_id": categories[0], "quantity": 1});
    let first = admitted(&admitting, event, buyer, "first", &one).await;
    // Past the deadline the next core keeps (6 s; the second has as long for
    // the restart and its order) before the second is admitted.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let second = admitted(&admitting, event, buyer, "second", &one).await;
    assert_eq!(
        asked(&admitting, event, buyer, &first).await,
        (200, json!({"status": "QUEUED", "request_id": first}))
    );
    assert_eq!(
        asked(&admitting, event, buyer, &second).await,
        (200, json!({"status": "QUEUED", "request_id": second}))
    );
    let (status, answer) = asked(&admitting, event, other, &first).await;
    assert_eq!(status, 404, "another buyer's purchase: {answer}");
    admitting.halt().await;

    let mut late = settings;
    late.orders.enabled = true;
    late.orders.deadline_s = 6;
    let app = stampede_e2e::spawn_app_on(late, database, prefix).await;
    let failed = json!({"status": "FAILED", "request_id": first,
        "reason": "not persisted within 6 s"});
    let created = |n: &str| json!({"status": "CREATED", "order_no": n});
    let decided = eventually(Duration::from_secs(20), || async {
        asked(&app, event, buyer, &first).await == (200, failed.clone())
            && asked(&app, event, buyer, &second).await == (200, created(&second))
    })
    .await;
    assert!(
        decided,
        "{:?} {:?}",
        asked(&app, event, buyer, &first).await,
        asked(&app, event, buyer, &second).await
    );
    assert_eq!(app.purchase_status(event, buyer).await, created(&second));
    let statuses = app.keys().purchase_status(Bucket::only(event));
    let kept: HashMap<String, String> = app.redis.clone().hgetall(&statuses).await.unwrap();
    assert_eq!(
        kept,
        HashMap::from([
            (buyer.user_id.to_string(), format!("CREATED:{second}")),
            (
                format!("r:{}:{first}", buyer.user_id),
                format!("FAILED:{first}:not persisted within 6 s")
            ),
        ]),
        "the buyer's latest, and the replaced purchase's own record"
    );

    // A third purchase replaces the second, an order by now: it reads from its order.
    let third = admitted(&app, event, buyer, "third", &one).await;
    let settled = eventually(Duration::from_secs(15), || async {
        asked(&app, event, buyer, &third).await == (200, created(&third))
    })
    .await;
    assert!(settled, "{:?}", asked(&app, event, buyer, &third).await);
    assert_eq!(
        asked(&app, event, buyer, &second).await,
        (200, created(&second))
    );
    assert_eq!(
        asked(&app, event, buyer, &first).await,
        (200, failed.clone())
    );
    assert_eq!(
        ordered_units(&app.mysql, event).await,
        (2, 2),
        "the second and the third"
    );
    // A record left behind an order (its settle lost, then a rebuild's drop of the stale
    // entry recorded it FAILED; or it was replaced while queued and paid before its
    // settle): the order says, never the record.
    let record = format!("r:{}:{second}", buyer.user_id);
    for left_behind in [
        format!("FAILED:{second}:the sale was reloaded"),
        format!("QUEUED:{second}"),
    ] {
        let () = app
            .redis
            .clone()
            .hset(&statuses, &record, &left_behind)
            .await
            .unwrap();
        assert_eq!(
            asked(&app, event, buyer, &second).await,
            (200, created(&second)),
            "{left_behind}"
        );
    }

    for hostile in [
        String::from("request_id="),
        String::from("request_id=01"),
        String::from("request_id=-1"),
        String::from("request_id=%31"),
        String::from("request_id=18446744073709551616"),
        format!("request_id={first}&request_id={first}"),
        format!("order_no={first}"),
        format!("request_id={first}&x=1"),
    ] {
        let (status, answer) = app
            .purchase_status_asked(event, buyer, &hostile, None)
            .await;
        assert_eq!(status, 400, "{hostile}: {answer}");
        assert_eq!(answer["error"]["code"], "INVALID", "{hostile}: {answer}");
    }
    for theirs_or_none in [&first, &second, &third, &"1".to_owned()] {
        let (status, answer) = asked(&app, event, other, theirs_or_none).await;
        assert_eq!(status, 404, "{theirs_or_none}: {answer}");
    }
    app.stop().await;
}

/// While MySQL is away, a purchase a later one replaced in its queue still reads QUEUED
/// (its record in Redis), as does the latest; a number Redis knows nothing of is 503 —
/// never a guess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_purchase_reads_queued_while_mysql_is_away() {
    let stack = stampede_e2e::Stack::from_env();
    let relay = stampede_e2e::StallingRelay::start(([127, 0, 0, 1], stack.mysql_port).into()).await;
    let app = spawn_app_with(|s| relay.carry_mysql_of(s, stack.mysql_port)).await;
    let (event, categories) = app.create_event(small_sale(10, 1, 1, 4)).await;
    app.publish(event).await;
    let buyer = &app.buyers(1).await[0];
    let one = json!({"category_id": categories[0], "quantity": 1});
    let first = admitted(&app, event, buyer, "first", &one).await;
    let second = admitted(&app, event, buyer, "second", &one).await;
    let queued = |n: &str| (200, json!({"status": "QUEUED", "request_id": n}));
    assert_eq!(asked(&app, event, buyer, &first).await, queued(&first));

    drop(relay); // every connection closed, and the port refuses new ones
    assert_eq!(asked(&app, event, buyer, &first).await, queued(&first));
    assert_eq!(asked(&app, event, buyer, &second).await, queued(&second));
    // A number with this buyer's low bits, minted (if ever) a second before the first:
    // only MySQL could say.
    let unknown = (first.parse::<u64>().unwrap() - (1_000 << 22)).to_string();
    let (status, answer) = asked(&app, event, buyer, &unknown).await;
    assert_eq!(status, 503, "{answer}");
    app.stop().await;
}

/// A reservation MySQL refused before (its REFUSED row committed, Redis never told: the
/// worker stopped) that is found past its deadline is refused, not released: releasing
/// gave back units MySQL never held (Redis showing more than MySQL). The row's reason
/// decides what the buyer reads and whether their share comes back, as the first
/// refusal would have; a row that keeps none (from before V25) is refused as "refused",
/// the share left as it is.
#[tokio::test]
async fn an_overdue_reservation_mysql_refused_before_is_refused_not_given_back() {
    let admitted = admitted_without_a_pipeline(3).await;
    let (event, categories) = (admitted.event, admitted.categories.clone());
    let (admitting, buyers) = (&admitted.admitting, admitted.buyers.clone());
    let requests = admitted.requests.clone();
    let mut conn = admitting.mysql.get_conn().await.unwrap();
    for (b, reason) in [(&buyers[0], None), (&buyers[2], Some("SOLD_OUT"))] {
        let status = admitting.purchase_status(event, b).await;
        let order_no: u64 = status["request_id"].as_str().unwrap().parse().unwrap();
        conn.exec_drop(
            "INSERT INTO stock_log (order_no, event_id, category_id, quantity, batch_id, status, \
             reason, seq) VALUES (?, ?, ?, 0, 'an-earlier-attempt', 'REFUSED', ?, NULL)",
            (order_no, event, categories[0], reason),
        )
        .await
        .unwrap();
    }
    drop(conn);
    let app = admitted.found_late().await;
    let statuses_key = app.keys().purchase_status(Bucket::only(event));
    let read = || async {
        let statuses: HashMap<u64, String> =
            app.redis.clone().hgetall(&statuses_key).await.unwrap();
        statuses
    };
    let decided = eventually(Duration::from_secs(15), || async {
        read().await.values().all(|s| s.starts_with("FAILED:"))
    })
    .await;
    let statuses = read().await;
    assert!(decided, "{statuses:?}");
    let status = |i: usize| statuses[&buyers[i].user_id].as_str();
    let failed = |i: usize, reason| format!("FAILED:{}:{reason}", requests[&buyers[i].user_id]);
    assert_eq!(
        (status(0), status(1), status(2)),
        (
            failed(0, "refused").as_str(),
            failed(1, "not persisted within 1 s").as_str(),
            failed(2, "sold out").as_str()
        )
    );
    let stock: i64 = app.stock(event, categories[0]).await;
    assert_eq!(
        stock, 6,
        "the expired reservation's 2 units back, the refused ones' not"
    );
    // Refused sold out, the buyer holds nothing: their share is back. Refused for a
    // reason not known, Redis may have been behind on what they hold: it stays.
    let held = held_by_buyer(&app, event).await;
    assert_eq!(held, HashMap::from([(buyers[0].user_id, 2)]));
    assert_eq!(ordered_units(&app.mysql, event).await, (0, 0));
    assert_eq!(app.stream_len(event).await, 0);
    app.stop().await;
}

#[tokio::test]
async fn admission_pauses_with_503_sale_busy_while_the_backlog_is_full() {
    let app = spawn_app_with(|s| s.orders.max_stream_depth = 3).await;
    let (event, categories) = app.create_event(small_sale(100, 1, 1, 2)).await;
    app.publish(event).await;
    let buyers = app.buyers(5).await;
    let one = json!({"category_id": categories[0], "quantity": 1});
    for b in &buyers[..3] {
        assert_eq!(app.buy(event, b, "k", one.clone()).await.0, 202);
    }
    let (status, body) = app.buy(event, &buyers[3], "k", one.clone()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("SALE_BUSY")),
        "{body}"
    );
    let stock: i64 = app.stock(event, categories[0]).await;
    assert_eq!(stock, 97, "the refused purchase took nothing");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_waits_on_mysql_stays_its_workers_and_is_created_once() {
    // A worker whose batch waits on MySQL longer than claim_idle_ms is alive: its entries
    // must not be taken over as a stopped worker's (another attempt at the same orders,
    // the created count doubled, a second order-timeout message).
    let app = spawn_app_with(|s| {
        s.orders.enabled = true;
        s.orders.claim_idle_ms = 1_000;
    })
    .await;
    let (event, categories) = app.create_event(small_sale(40, 1, 1, 2)).await;
    app.publish(event).await;
    let buyers = app.buyers(30).await;
    // The batch's transaction waits on this table lock (MariaDB's metadata lock, not
    // InnoDB's row locks, whose wait would time out first).
    let mut lock = app.mysql.get_conn().await.unwrap();
    lock.query_drop("LOCK TABLES stock_batch WRITE")
        .await
        .unwrap();
    let answers = burst(&app, event, categories[0], &buyers).await;
    assert_eq!(answers.get(&202), Some(&30), "{answers:?}");
    // Four times claim_idle_ms: without keeping the entries claimed, the core's other
    // workers took them over within about one and a half.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        ordered_units(&app.mysql, event).await,
        (0, 0),
        "the batch did not wait on the lock"
    );
    lock.query_drop("UNLOCK TABLES").await.unwrap();
    drop(lock);
    let done = eventually(Duration::from_secs(30), || async {
        ordered_units(&app.mysql, event).await == (30, 30) && app.stream_len(event).await == 0
    })
    .await;
    assert!(done, "{:?}", ordered_units(&app.mysql, event).await);
    let taken_over = app
        .admin_api
        .counter("stampede_reservations_taken_over_total")
        .await
        .expect("the core counts takeovers");
    assert_eq!(taken_over, 0, "a waiting worker's entries were taken over");
    let created = app
        .admin_api
        .counter("stampede_orders_created_total")
        .await
        .expect("the core counts the orders it creates");
    assert_eq!(created, 30, "each order created once");
    app.stop().await;
}

/// A new user who signs in with "right-password": their username.
async fn a_user(app: &TestApp) -> String {
    let first = app.admin_api.users_with_password(1, "right-password").await;
    format!("user{first}")
}

/// A login of `username` (password "right-password"): its answer's status.
fn login(app: &TestApp, username: &str) -> impl Future<Output = u16> + Send + 'static {
    let (http, url) = (app.http.clone(), app.public_url.clone());
    let body = json!({"username": username, "password": "right-password"});
    async move {
        http.post(format!("{url}/api/login"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }
}

/// Sessions of the app's database waiting on a table lock (`LOCK TABLES` by the test).
async fn waiting_on_a_lock(app: &TestApp) -> i64 {
    let sql = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = '{}' \
         AND STATE = 'Waiting for table metadata lock'",
        app.database
    );
    scalar(&app.mysql, &sql).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_waiting_on_mysql_hold_no_connection_order_creation_needs() {
    // A flood of logins on a slow table (here a locked one) waits for the API's own
    // connections: orders admitted meanwhile are still created, and the logins are
    // answered once the table is free. With one pool for both, the logins held every
    // connection and no order was created until the lock went.
    let app = spawn_app_with(|s| {
        s.orders.enabled = true;
        (s.mysql.pool_max, s.mysql.api_pool_max) = (4, 2);
        s.server.request_timeout_ms = 60_000;
        s.login.max_concurrent_checks = 8;
    })
    .await;
    let (event, categories) = app.create_event(small_sale(40, 1, 1, 2)).await;
    app.publish(event).await;
    let buyers = app.buyers(30).await;
    let username = a_user(&app).await;
    let mut lock = app.mysql.get_conn().await.unwrap();
    lock.query_drop("LOCK TABLES app_user WRITE").await.unwrap();
    let mut logins = tokio::task::JoinSet::new();
    for _ in 0..6 {
        logins.spawn(login(&app, &username));
    }
    let blocked = eventually(Duration::from_secs(10), || async {
        waiting_on_a_lock(&app).await >= 2
    })
    .await;
    assert!(blocked, "the logins did not reach the locked table");
    let answers = burst(&app, event, categories[0], &buyers).await;
    assert_eq!(answers.get(&202), Some(&30), "{answers:?}");
    let created = eventually(Duration::from_secs(30), || async {
        ordered_units(&app.mysql, event).await == (30, 30)
    })
    .await;
    assert!(
        created,
        "orders not created while logins waited on MySQL: {:?}",
        ordered_units(&app.mysql, event).await
    );
    assert_eq!(
        waiting_on_a_lock(&app).await,
        2,
        "the logins took more connections than mysql.api_pool_max"
    );
    assert!(
        logins.try_join_next().is_none(),
        "a login was answered while its table was locked"
    );
    lock.query_drop("UNLOCK TABLES").await.unwrap();
    drop(lock);
    let mut statuses = Vec::new();
    while let Some(status) = logins.join_next().await {
        statuses.push(status.unwrap());
    }
    assert_eq!(
        statuses, [200; 6],
        "every login answered once the table was free"
    );
    app.stop().await;
}

/// Logins cut off at the request timeout while their table is locked: waves of them
/// never keep more MariaDB sessions waiting than `mysql.api_pool_max`. (A cut-off
/// request's connection is closed, and MariaDB ends a session waiting on a table lock
/// once its client is gone; for what it does not notice, the next test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_cut_off_on_a_locked_table_hold_no_more_sessions_than_the_apis_pool() {
    let app = spawn_app_with(|s| {
        s.mysql.api_pool_max = 2;
        s.server.request_timeout_ms = 1_000;
        s.login.max_concurrent_checks = 32;
        s.login.check_wait_ms = 500;
    })
    .await;
    let username = a_user(&app).await;
    let login = || login(&app, &username);
    assert_eq!(login().await, 200);
    let mut lock = app.mysql.get_conn().await.unwrap();
    lock.query_drop("LOCK TABLES app_user WRITE").await.unwrap();
    // Three waves of eight, each cut off after a second; counted halfway through.
    let mut most = 0;
    for wave in 0..3 {
        let mut wave_of = tokio::task::JoinSet::new();
        for _ in 0..8 {
            wave_of.spawn(login());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        most = most.max(waiting_on_a_lock(&app).await);
        let answers = wave_of.join_all().await;
        assert!(
            answers.iter().all(|&a| a == 503),
            "wave {wave}: {answers:?}"
        );
    }
    assert!(
        (1..=2).contains(&most),
        "{most} sessions waited on the locked table for 24 cut-off logins"
    );
    lock.query_drop("UNLOCK TABLES").await.unwrap();
    drop(lock);
    let back = eventually(Duration::from_secs(10), || async { login().await == 200 }).await;
    assert!(back, "no login answered once the table was free");
    app.stop().await;
}

/// MariaDB does not notice a client leave while a statement waits on a row lock (nor
/// during a long scan): the session of an API request cut off there would wait on, up
/// to innodb_lock_wait_timeout (50 s), while the pool opened another in its place, and
/// cut-off requests piled sessions up toward max_connections. Each statement of the
/// API's sessions ends at the request's limit (max_statement_time), counted from the
/// request's start for a connection checked out late: waves of requests, or a stream
/// of them each given its connection late, keep no more sessions than the pool has
/// connections, none for long after the last answer (without the late bound, checked:
/// 10 at once during the stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_requests_cut_off_on_a_row_lock_leave_no_session_waiting_behind() {
    let app = spawn_app_with(|s| {
        s.mysql.api_pool_max = 2;
        s.server.request_timeout_ms = 1_000;
        s.login.check_wait_ms = 500;
    })
    .await;
    let (event, _) = app.create_event(small_sale(10, 1, 1, 2)).await;
    let sql = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = '{}' \
         AND INFO LIKE 'UPDATE event SET status%'",
        app.database
    );
    let updating = || scalar(&app.mysql, &sql);
    let publish = || {
        let admin = app.admin_api.clone();
        async move {
            admin
                .post(&format!("/admin/events/{event}/publish"), json!(null))
                .await
                .0
        }
    };
    let drained = || async {
        // Without the limit, they wait for innodb_lock_wait_timeout (50 s).
        let drained = eventually(Duration::from_secs(3), || async { updating().await == 0 }).await;
        assert!(
            drained,
            "{} sessions of cut-off publishes still wait on the row",
            updating().await
        );
    };
    let mut lock = app.mysql.get_conn().await.unwrap();
    lock.query_drop("BEGIN").await.unwrap();
    lock.exec_drop("SELECT id FROM event WHERE id = ? FOR UPDATE", (event,))
        .await
        .unwrap();
    // Three waves of four publishes, each cut off after a second.
    let mut seen_waiting = 0;
    for wave in 0..3 {
        let mut wave_of = tokio::task::JoinSet::new();
        for _ in 0..4 {
            wave_of.spawn(publish());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        seen_waiting = seen_waiting.max(updating().await);
        let answers = wave_of.join_all().await;
        assert!(
            answers.iter().all(|&a| a == 503),
            "wave {wave}: {answers:?}"
        );
    }
    assert!(
        seen_waiting >= 1,
        "no publish ever waited on the locked row"
    );
    drained().await;
    // A stream: one publish every 100 ms for 3 s. Each waits for the pool, so most
    // are given their connection late in their second.
    let mut stream = tokio::task::JoinSet::new();
    let mut most = 0;
    for _ in 0..30 {
        stream.spawn(publish());
        tokio::time::sleep(Duration::from_millis(100)).await;
        most = most.max(updating().await);
    }
    while !stream.is_empty() {
        most = most.max(updating().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
        while let Some(answer) = stream.try_join_next() {
            assert_eq!(answer.unwrap(), 503);
        }
    }
    eprintln!("at most {most} sessions waited on the row during the stream");
    assert!(
        most <= 4,
        "{most} sessions waited on the row at once, with a pool of 2"
    );
    drained().await;
    let status: String = lock
        .exec_first("SELECT status FROM event WHERE id = ?", (event,))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, "DRAFT", "nothing changed while the row was locked");
    lock.query_drop("ROLLBACK").await.unwrap();
    drop(lock);
    // (That the connections come back with their whole limit:
    // a_late_checkout_is_bounded_by_what_is_left_and_set_back_after.)
    let published = eventually(Duration::from_secs(10), || async { publish().await == 200 }).await;
    assert!(published, "not published once the row was free");
    app.stop().await;
}

/// A session's max_statement_time, in ms.
async fn session_limit(conn: &mut mysql_async::Conn) -> u64 {
    let s: Option<f64> = conn
        .query_first("SELECT @@max_statement_time")
        .await
        .unwrap();
    (s.unwrap() * 1_000.0).round() as u64
}

/// A connection of the API's pool a request checks out late has its statements bounded
/// by what is left of the request, and the session's own limit (the whole request's)
/// set back once it returns: the next user, a request early in its time, gets it whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_checkout_is_bounded_by_what_is_left_and_set_back_after() {
    use stampede_core::infra::mysql::{checkout, within_request};
    let stack = stampede_e2e::Stack::from_env();
    let (mut s, _, _) = stampede_e2e::test_settings(&stack).await;
    s.mysql.api_pool_max = 1;
    s.server.request_timeout_ms = 2_000;
    let api = mysql_async::Pool::new(s.resolve().unwrap().mysql_api_opts);
    let limit = Duration::from_secs(2);
    // Early in a request: the whole limit.
    let early = within_request(tokio::time::Instant::now() + limit, limit, async {
        session_limit(&mut checkout(&api).await.unwrap()).await
    })
    .await;
    assert_eq!(early, 2_000);
    // 1.5 s into a request: what is left, about half a second.
    let late = within_request(tokio::time::Instant::now() + limit, limit, async {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        session_limit(&mut checkout(&api).await.unwrap()).await
    })
    .await;
    assert!((300..=500).contains(&late), "{late} ms");
    // The pool's only connection again, outside any request: set back.
    let after = session_limit(&mut checkout(&api).await.unwrap()).await;
    assert_eq!(after, 2_000);
    api.disconnect().await.unwrap();
}

/// /readyz asks MariaDB on a connection of its own: with every connection of the
/// API's pool held by logins waiting on a locked table, MariaDB still answers, and so
/// does the check (through the pool it waited, and every core failed at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_while_every_connection_of_the_apis_pool_waits_on_a_slow_table() {
    let app = spawn_app_with(|s| {
        s.mysql.api_pool_max = 1;
        s.server.request_timeout_ms = 20_000;
        s.login.max_concurrent_checks = 8;
    })
    .await;
    let username = a_user(&app).await;
    let mut lock = app.mysql.get_conn().await.unwrap();
    lock.query_drop("LOCK TABLES app_user WRITE").await.unwrap();
    let mut logins = tokio::task::JoinSet::new();
    for _ in 0..3 {
        logins.spawn(login(&app, &username));
    }
    let held = eventually(Duration::from_secs(5), || async {
        waiting_on_a_lock(&app).await == 1
    })
    .await;
    assert!(held, "no login waited on the locked table");
    for base in [&app.admin_url, &app.public_url] {
        let (status, body) = crate::health::readyz(&app, base).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["dependencies"]["mysql"], "up", "{body}");
    }
    lock.query_drop("UNLOCK TABLES").await.unwrap();
    drop(lock);
    assert_eq!(logins.join_all().await, [200; 3]);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_are_still_created_when_the_cores_mysql_connections_go_half_open() {
    // The core's MySQL connections stop answering and stay open (a host gone, a
    // partition) while a batch's transaction is under way: TCP would hold each call for
    // many minutes, a hung server forever, and MariaDB keeps the cut-off session's
    // transaction and locks. New connections work (the database reachable again).
    let stack = stampede_e2e::Stack::from_env();
    let relay = stampede_e2e::StallingRelay::start(([127, 0, 0, 1], stack.mysql_port).into()).await;
    let app = spawn_app_with(|s| {
        s.orders.enabled = true;
        s.mysql.call_timeout_ms = 3_000;
        relay.carry_mysql_of(s, stack.mysql_port);
    })
    .await;
    let (event, categories) = app.create_event(small_sale(40, 1, 1, 2)).await;
    app.publish(event).await;
    let buyers = app.buyers(30).await;
    let ordered = |n: u64| {
        let app = &app;
        async move {
            eventually(Duration::from_secs(30), || async {
                ordered_units(&app.mysql, event).await == (n, n)
            })
            .await
        }
    };
    let answers = burst(&app, event, categories[0], &buyers[..10]).await;
    assert_eq!(answers.get(&202), Some(&10), "{answers:?}");
    assert!(
        ordered(10).await,
        "{:?}",
        ordered_units(&app.mysql, event).await
    );

    // The next batch's transaction waits on this lock (on a connection of the test's
    // own, not relayed), its orders and the category's row locked already.
    let mut lock = app.mysql.get_conn().await.unwrap();
    lock.query_drop("LOCK TABLES stock_batch WRITE")
        .await
        .unwrap();
    let answers = burst(&app, event, categories[0], &buyers[10..20]).await;
    assert_eq!(answers.get(&202), Some(&10), "{answers:?}");
    let waiting = eventually(Duration::from_secs(10), || async {
        scalar(
            &app.mysql,
            "SELECT COUNT(*) FROM information_schema.processlist \
             WHERE state LIKE 'Waiting for table%' AND info LIKE 'INSERT INTO stock_batch%'",
        )
        .await
            == 1
    })
    .await;
    assert!(waiting, "the batch never reached the locked table");
    let session = scalar(
        &app.mysql,
        "SELECT id FROM information_schema.processlist \
         WHERE state LIKE 'Waiting for table%' AND info LIKE 'INSERT INTO stock_batch%'",
    )
    .await;
    let cut = || async {
        app.admin_api
            .counter("stampede_mysql_calls_cut_total")
            .await
            .expect("the core counts the MySQL calls it gives up")
    };
    assert_eq!(
        cut().await,
        0,
        "the batch's attempt was cut before the stall"
    );
    // Every connection the core holds now goes half-open, the batch's among them; then
    // its statement goes through, and its session waits for a COMMIT that never comes,
    // its transaction open.
    relay.stall_open_connections();
    lock.query_drop("UNLOCK TABLES").await.unwrap();
    drop(lock);
    // The abandoned transaction holds the category's row (the batch's guards raised its
    // `committed` before the insert that waited).
    let mut probe = app.mysql.get_conn().await.unwrap();
    probe.query_drop("START TRANSACTION").await.unwrap();
    let held = probe
        .query_drop(format!(
            "SELECT remain FROM ticket_category WHERE id = {} FOR UPDATE NOWAIT",
            categories[0]
        ))
        .await;
    assert!(
        matches!(&held, Err(mysql_async::Error::Server(e)) if e.code == 1205),
        "the category's row is not locked by the abandoned session: {held:?}"
    );
    probe.query_drop("ROLLBACK").await.unwrap();
    drop(probe);
    // Cut off, the attempt's session is killed at once: MariaDB would keep it (and the
    // row) until its wait_timeout, 12 s of idling here, 9 s or more after the cut.
    assert!(
        eventually(Duration::from_secs(10), || async { cut().await >= 1 }).await,
        "the batch's attempt was never cut"
    );
    let gone = eventually(Duration::from_secs(2), || async {
        let alive =
            format!("SELECT COUNT(*) FROM information_schema.processlist WHERE id = {session}");
        scalar(&app.mysql, &alive).await == 0
    })
    .await;
    assert!(gone, "the cut-off session {session} is still there");
    assert!(
        app.admin_api
            .counter("stampede_mysql_sessions_ended_total{outcome=\"killed\"}")
            .await
            .is_some_and(|n| n >= 1),
        "the kill is not counted"
    );

    // A purchase may meet a dead connection reading its event: 503, and the buyer
    // presses again with the same key; never another answer.
    let mut queued = 0;
    for _ in 0..30 {
        let answers = burst(&app, event, categories[0], &buyers[20..]).await;
        assert!(
            answers.keys().all(|s| [202, 503].contains(s)),
            "{answers:?}"
        );
        queued = answers.get(&202).copied().unwrap_or(0);
        if queued == 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        queued, 10,
        "the purchases after the stall were not all queued"
    );
    // Without a bound on each call, the batch stays on its dead connection; without
    // MariaDB ending the abandoned session, the retries wait on its locks for hours.
    // (The orders counted once each: `ordered_units` reads them from MySQL.)
    let settled = eventually(Duration::from_secs(60), || async {
        ordered_units(&app.mysql, event).await == (30, 30)
            && app.stream_len(event).await == 0
            && unsynced_orders(&app.mysql, event).await == 0
    })
    .await;
    assert!(
        settled,
        "orders {:?}, backlog {}, unsynced {}",
        ordered_units(&app.mysql, event).await,
        app.stream_len(event).await,
        unsynced_orders(&app.mysql, event).await
    );
    assert!(cut().await >= 1, "no MySQL call was cut");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_calls_session_is_killed_only_on_the_server_that_numbered_it() {
    // A session id is the server's own count: on another server (the address moved, a
    // failover), or on this one after a restart, it may be another core's session,
    // which a KILL of the cut-off call's id would end.
    let stack = stampede_e2e::Stack::from_env();
    let server = mysql_async::Pool::new(stack.mysql_url("stampede").as_str());
    let observed = mysql_async::Pool::new(stack.mysql_url("stampede").as_str());
    let live = |id: u32| {
        let server = server.clone();
        async move {
            let sql =
                format!("SELECT COUNT(*) FROM information_schema.processlist WHERE id = {id}");
            scalar(&server, &sql).await == 1
        }
    };
    let uptime = scalar(
        &server,
        "SELECT CAST(variable_value AS SIGNED) FROM information_schema.global_status \
         WHERE variable_name = 'UPTIME'",
    )
    .await;
    let limit = Duration::from_secs(5);
    let call = || async {
        let mut conn = observed.get_conn().await.unwrap();
        let numbered_by = ServerIdentity::of(&mut conn).await.unwrap();
        let id = conn.id();
        (conn, numbered_by, id)
    };

    // A call that began before the server last started: its session went with the
    // restart, and the id is left alone.
    let (conn, numbered_by, id) = call().await;
    let before_start = std::time::Instant::now()
        .checked_sub(Duration::from_secs(uptime as u64 + 5))
        .expect("the machine was up before its MariaDB");
    let outcome = end_session(conn, &numbered_by, before_start, limit).await;
    assert!(matches!(outcome, SessionEnd::Restarted(_)), "{outcome:?}");
    assert!(
        live(id).await,
        "session {id} killed though the server restarted since"
    );

    // A call whose session another server numbered (its server_id, or its host name,
    // not this one's): the id here is someone else's, and is left alone.
    for elsewhere in [
        ServerIdentity {
            server_id: numbered_by.server_id + 1,
            ..numbered_by.clone()
        },
        ServerIdentity {
            hostname: format!("{}-replica", numbered_by.hostname),
            ..numbered_by.clone()
        },
    ] {
        let (conn, _, id) = call().await;
        let outcome = end_session(conn, &elsewhere, std::time::Instant::now(), limit).await;
        assert_eq!(outcome, SessionEnd::OtherServer(numbered_by.clone()));
        assert!(
            live(id).await,
            "session {id} killed on a server that did not number it"
        );
    }

    // A call that began while the server was up, on this server: its session is killed.
    let (conn, numbered_by, id) = call().await;
    let outcome = end_session(conn, &numbered_by, std::time::Instant::now(), limit).await;
    assert_eq!(outcome, SessionEnd::Killed);
    let gone = eventually(Duration::from_secs(2), || async { !live(id).await }).await;
    assert!(gone, "session {id} is still there");
    observed.disconnect().await.ok();
    server.disconnect().await.unwrap();
}

#[tokio::test]
async fn keeping_a_batch_claimed_never_takes_back_what_another_consumer_holds() {
    use stampede_core::orders::redis::{self as stream, Entries, Kept};
    let app = spawn_app_with(|_| {}).await;
    let (keys, bucket) = (app.keys(), Bucket::only(1));
    let mut r = app.redis.clone();
    stream::ensure_group(&mut r, &keys, bucket).await.unwrap();
    let name = keys.order_stream(bucket);
    for n in 0..4 {
        let _: String = r.xadd(&name, "*", &[("v1", n)]).await.unwrap();
    }
    let read = stream::read(&mut r, &keys, bucket, "a", 10, Entries::New)
        .await
        .unwrap();
    let ids: Vec<&str> = read.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), 4);
    // The second taken over by "b" (as XAUTOCLAIM would), the third settled.
    let _: redis::Value = redis::cmd("XCLAIM")
        .arg(&name)
        .arg(stream::GROUP)
        .arg("b")
        .arg(0)
        .arg(ids[1])
        .arg("JUSTID")
        .query_async(&mut r)
        .await
        .unwrap();
    let _: u64 = r.xack(&name, stream::GROUP, &[ids[2]]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Given in any order, "a" keeps the two it still holds, and only those.
    let given = [ids[2], ids[3], ids[1], ids[0]];
    let kept = stream::keep_claimed(&mut r, &keys, bucket, "a", &given)
        .await
        .unwrap();
    assert_eq!(kept, Kept(2));
    let pending: redis::streams::StreamPendingCountReply = r
        .xpending_count(&name, stream::GROUP, "-", "+", 10)
        .await
        .unwrap();
    let owners: Vec<(&str, &str, usize)> = pending
        .ids
        .iter()
        .map(|p| (p.id.as_str(), p.consumer.as_str(), p.last_delivered_ms))
        .collect();
    assert_eq!(owners.len(), 3, "{owners:?}");
    assert_eq!((owners[0].0, owners[0].1), (ids[0], "a"));
    assert_eq!((owners[2].0, owners[2].1), (ids[3], "a"));
    assert!(
        owners[0].2 < 200 && owners[2].2 < 200,
        "their idle time was reset: {owners:?}"
    );
    assert_eq!((owners[1].0, owners[1].1), (ids[1], "b"), "not taken back");
    assert!(
        owners[1].2 >= 200,
        "another's entry left as it was: {owners:?}"
    );
    // Nothing of the consumer's left: nothing kept.
    let none = stream::keep_claimed(&mut r, &keys, bucket, "c", &ids)
        .await
        .unwrap();
    assert_eq!(none, Kept(0));
    assert!(
        stream::keep_claimed(&mut r, &keys, bucket, "a", &["no-id"])
            .await
            .is_err(),
        "an id that is not a stream entry's is an error"
    );
    app.stop().await;
}

#[tokio::test]
async fn claiming_idle_entries_counts_only_another_consumers_as_taken_over() {
    use stampede_core::orders::redis::{self as stream, Entries};
    let app = spawn_app_with(|_| {}).await;
    let (keys, bucket) = (app.keys(), Bucket::only(1));
    let mut r = app.redis.clone();
    stream::ensure_group(&mut r, &keys, bucket).await.unwrap();
    let name = keys.order_stream(bucket);
    for n in 0..5 {
        let _: String = r.xadd(&name, "*", &[("v1", n)]).await.unwrap();
    }
    // "a" (stopped) holds three, "b" two; one of "a"'s is deleted from the stream.
    let a = stream::read(&mut r, &keys, bucket, "a", 3, Entries::New)
        .await
        .unwrap();
    let b = stream::read(&mut r, &keys, bucket, "b", 2, Entries::New)
        .await
        .unwrap();
    assert_eq!((a.len(), b.len()), (3, 2));
    let _: u64 = r.xdel(&name, &[a[2].id.as_str()]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // One of "b"'s still in use (its idle time reset): not idle enough to take.
    let _: redis::Value = redis::cmd("XCLAIM")
        .arg(&name)
        .arg(stream::GROUP)
        .arg("b")
        .arg(0)
        .arg(b[1].id.as_str())
        .arg("JUSTID")
        .query_async(&mut r)
        .await
        .unwrap();
    let claimed = stream::claim_stale(&mut r, &keys, bucket, "b", Duration::from_millis(200), 10)
        .await
        .unwrap();
    let ids: Vec<&str> = claimed.entries.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(
        ids,
        [a[0].id.as_str(), a[1].id.as_str(), b[0].id.as_str()],
        "the idle entries still in the stream, oldest first"
    );
    assert_eq!(claimed.others, 2, "two of them were another consumer's");
    let pending: redis::streams::StreamPendingCountReply = r
        .xpending_count(&name, stream::GROUP, "-", "+", 10)
        .await
        .unwrap();
    let owners: Vec<(&str, &str)> = pending
        .ids
        .iter()
        .map(|p| (p.id.as_str(), p.consumer.as_str()))
        .collect();
    assert!(
        owners.iter().all(|(_, c)| *c == "b"),
        "every entry left is b's now: {owners:?}"
    );
    // Nothing idle left: nothing taken.
    let again = stream::claim_stale(&mut r, &keys, bucket, "c", Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!((again.entries.len(), again.others), (0, 0));
    app.stop().await;
}

/// A batch is read and settled in chunks (orders::redis: 256 entries a read, 128 a
/// settle) so that no call holds Redis for long: across the chunks' edges nothing is
/// read twice, left out or left unsettled, and a consumer's own pending entries are
/// read onwards, not from the start again.
#[tokio::test]
async fn a_batch_is_read_and_settled_in_chunks_with_nothing_twice_or_left_out() {
    use stampede_core::orders::redis::{self as stream, Entries};
    use stampede_core::orders::reservation::Reservation;
    let app = spawn_app_with(|_| {}).await;
    let (keys, bucket) = (app.keys(), Bucket::only(1));
    let mut r = app.redis.clone();
    stream::ensure_group(&mut r, &keys, bucket).await.unwrap();
    let (name, status) = (keys.order_stream(bucket), keys.purchase_status(bucket));
    // 700 reservations, each of its own buyer, QUEUED; one buyer has bought again since.
    const N: u64 = 700;
    queue_reservations(&mut r, &keys, bucket, N).await;
    let _: () = r.hset(&status, 500_300, "QUEUED:42").await.unwrap();
    let read = stream::read(&mut r, &keys, bucket, "a", 1_000, Entries::New)
        .await
        .unwrap();
    let mine = |entries: &[redis::streams::StreamId]| -> Vec<Reservation> {
        entries
            .iter()
            .map(|e| Reservation::from_entry(e).unwrap())
            .collect()
    };
    let reservations = mine(&read);
    let numbers: Vec<u64> = reservations.iter().map(|r| r.order_no.0).collect();
    assert_eq!(numbers, (9_000_000..9_000_000 + N).collect::<Vec<_>>());
    // At most `count`, whatever the chunk: 600 of them again as own pending, in order.
    let pending = stream::read(&mut r, &keys, bucket, "a", 600, Entries::OwnPending)
        .await
        .unwrap();
    let again: Vec<u64> = mine(&pending).iter().map(|r| r.order_no.0).collect();
    assert_eq!(again, numbers[..600]);
    let all = stream::read(&mut r, &keys, bucket, "a", 1_000, Entries::OwnPending)
        .await
        .unwrap();
    assert_eq!(all.len(), N as usize, "every own pending entry once");
    let fresh = stream::read(&mut r, &keys, bucket, "a", 1_000, Entries::New)
        .await
        .unwrap();
    assert!(fresh.is_empty(), "nothing new is left");
    // A run that fails (an id no stream entry has, in the second chunk) stops there: the
    // first chunk is settled, the rest stays pending for a replay.
    let mut with_bad = reservations[..200].to_vec();
    with_bad[150].entry_id = "no-id".into();
    let partly = stream::settle(&mut r, &keys, bucket, &with_bad).await;
    assert!(partly.failed.is_some(), "{partly:?}");
    assert_eq!((partly.settled, partly.acked), (128, 128));
    let len: u64 = r.xlen(&name).await.unwrap();
    assert_eq!(len, N - 128, "only the first chunk's entries are gone");
    let settled = stream::settle(&mut r, &keys, bucket, &reservations[128..]).await;
    assert!(settled.failed.is_none(), "{settled:?}");
    assert_eq!(
        (settled.settled, settled.acked),
        (N as usize - 128, N - 128)
    );
    let len: u64 = r.xlen(&name).await.unwrap();
    assert_eq!(len, 0, "every entry acknowledged and deleted");
    let statuses: HashMap<u64, String> = r.hgetall(&status).await.unwrap();
    let created = statuses
        .values()
        .filter(|s| s.starts_with("CREATED:"))
        .count();
    assert_eq!(created, N as usize - 1);
    assert_eq!(
        statuses[&500_300], "QUEUED:42",
        "a newer purchase is left as it is"
    );
    assert_eq!(
        statuses[&500_699], "CREATED:9000699",
        "the last chunk's last one"
    );
    app.stop().await;
}

/// `n` reservations in the bucket's stream, order numbers 9 000 000 on, each of its own
/// buyer (500 000 on), under epoch 1, with their buyers' statuses QUEUED.
async fn queue_reservations(
    r: &mut stampede_core::infra::redis::Redis,
    keys: &stampede_core::keys::Keys,
    bucket: Bucket,
    n: u64,
) {
    let (name, status) = (keys.order_stream(bucket), keys.purchase_status(bucket));
    for i in 0..n {
        let (order_no, user) = (9_000_000 + i, 500_000 + i);
        let v1 = format!("{order_no}|{user}|1|1||0|1|{}|", i + 1);
        let _: String = r.xadd(&name, "*", &[("v1", v1)]).await.unwrap();
        let _: () = r
            .hset(&status, user, format!("QUEUED:{order_no}"))
            .await
            .unwrap();
    }
}

/// Taking over a stopped worker's entries and keeping a batch claimed go 256 entries a
/// run, dropping stale reservations 128 (orders::redis): across the runs' edges every
/// entry is taken over once, kept once, dropped once, and none left out.
#[tokio::test]
async fn taking_over_keeping_and_dropping_a_batch_go_in_chunks_with_nothing_twice_or_left_out() {
    use stampede_core::orders::redis::{self as stream, Dropped, Entries, Kept};
    use stampede_core::orders::reservation::Reservation;
    let app = spawn_app_with(|_| {}).await;
    let (keys, bucket) = (app.keys(), Bucket::only(1));
    let mut r = app.redis.clone();
    stream::ensure_group(&mut r, &keys, bucket).await.unwrap();
    let (name, status) = (keys.order_stream(bucket), keys.purchase_status(bucket));
    const N: u64 = 700;
    queue_reservations(&mut r, &keys, bucket, N).await;
    // "a" reads them all and stops; "b" takes them over once idle, at most 600 a call.
    let read = stream::read(&mut r, &keys, bucket, "a", 1_000, Entries::New)
        .await
        .unwrap();
    assert_eq!(read.len(), N as usize);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let idle = Duration::from_secs(1);
    let first = stream::claim_stale(&mut r, &keys, bucket, "b", idle, 600)
        .await
        .unwrap();
    let rest = stream::claim_stale(&mut r, &keys, bucket, "b", idle, 1_000)
        .await
        .unwrap();
    let ids = |claimed: &[&stream::Claimed]| -> Vec<String> {
        claimed
            .iter()
            .flat_map(|c| c.entries.iter().map(|e| e.id.clone()))
            .collect()
    };
    let all: Vec<String> = read.iter().map(|e| e.id.clone()).collect();
    let taken = ids(&[&first, &rest]);
    assert_eq!((first.entries.len(), taken.len()), (600, all.len()));
    assert!(taken == all, "every entry taken over once, oldest first");
    assert_eq!((first.others, rest.others), (600, 100));
    // With no least idle time every entry stays idle enough after its run took it: the
    // runs go on through the pending list, so none is taken twice.
    let again = stream::claim_stale(&mut r, &keys, bucket, "c", Duration::ZERO, 1_000)
        .await
        .unwrap();
    assert_eq!((again.entries.len(), again.others), (N as usize, N));
    assert!(ids(&[&again]) == all, "each once, oldest first");
    // "c" keeps them all claimed, given in any order (in runs of one stretch of the
    // stream each); "b" keeps none of them.
    let mut given: Vec<&str> = all.iter().map(String::as_str).collect();
    given.reverse();
    given.swap(0, 699);
    let keep = async |consumer: &str| {
        let mut kept = 0;
        for run in stream::keep_claimed_runs(&given) {
            assert!(run.len() <= 256);
            kept += stream::keep_claimed(&mut r.clone(), &keys, bucket, consumer, &run)
                .await
                .unwrap()
                .0;
        }
        Kept(kept)
    };
    assert_eq!(keep("c").await, Kept(N));
    assert_eq!(keep("b").await, Kept(0));
    // A run's first and last entry with 698 of the consumer's others between them: the
    // script pages through them all.
    let ends = [all[0].as_str(), all[699].as_str()];
    let kept = stream::keep_claimed(&mut r, &keys, bucket, "c", &ends)
        .await
        .unwrap();
    assert_eq!(kept, Kept(2));
    let still_idle = stream::claim_stale(&mut r, &keys, bucket, "d", idle, 1_000)
        .await
        .unwrap();
    assert!(
        still_idle.entries.is_empty(),
        "every entry's idle time was reset"
    );
    // A rebuild of the keys (epoch 2) makes 300 of them stale: dropped, 128 a run; the
    // buyers whose status the rebuild did not write are told, and those it wrote an
    // earlier order for (that order would read as this purchase's outcome); other
    // statuses stay (below).
    let reservations: Vec<Reservation> = rest
        .entries
        .iter()
        .chain(&first.entries)
        .map(|e| Reservation::from_entry(e).unwrap())
        .collect();
    let (stale, left) = reservations.split_at(300);
    let not_yet = stream::drop_stale(&mut r, &keys, bucket, stale, "reloaded")
        .await
        .unwrap();
    assert_eq!(not_yet, Dropped::NotYet, "the rebuild is not in Redis yet");
    assert_eq!(r.xlen::<_, u64>(&name).await.unwrap(), N);
    let _: () = r.hset(keys.meta(bucket), "epoch", 2).await.unwrap();
    for gone in &stale[..150] {
        let _: () = r.hdel(&status, gone.user_id).await.unwrap();
    }
    // Earlier: one digit fewer, or one below (the script compares decimal strings, as
    // the core's numbers pass 2^53).
    let earlier = |r: &Reservation, i: usize| {
        if i.is_multiple_of(2) {
            format!("PAID:{}", r.order_no.0 / 10)
        } else {
            format!("CREATED:{}", r.order_no.0 - 1)
        }
    };
    for (i, older) in stale[150..225].iter().enumerate() {
        let _: () = r
            .hset(&status, older.user_id, earlier(older, i))
            .await
            .unwrap();
    }
    // A later purchase's; the reservation's own order (committed before the rebuild,
    // its entry never settled); a purchase queued since the rebuild numbered lower (by
    // a core whose clock is behind): each stays.
    let kept = |r: &Reservation, i: usize| match i % 3 {
        0 => format!("QUEUED:{}", r.order_no.0 + 1),
        1 => format!("PAID:{}", r.order_no.0),
        _ => format!("QUEUED:{}", r.order_no.0 - 1),
    };
    for (i, newer) in stale[225..].iter().enumerate() {
        let _: () = r
            .hset(&status, newer.user_id, kept(newer, i))
            .await
            .unwrap();
    }
    let dropped = stream::drop_stale(&mut r, &keys, bucket, stale, "reloaded")
        .await
        .unwrap();
    assert_eq!(dropped, Dropped::Dropped);
    let entries: redis::streams::StreamRangeReply = r.xrange_all(&name).await.unwrap();
    let remaining: Vec<u64> = entries
        .ids
        .iter()
        .map(|e| Reservation::from_entry(e).unwrap().order_no.0)
        .collect();
    let mut expected: Vec<u64> = left.iter().map(|r| r.order_no.0).collect();
    expected.sort_unstable();
    assert_eq!(remaining, expected, "exactly the stale ones are gone");
    let pending: redis::streams::StreamPendingReply =
        r.xpending(&name, stream::GROUP).await.unwrap();
    assert_eq!(pending.count(), left.len(), "and no longer pending");
    let statuses: HashMap<String, String> = r.hgetall(&status).await.unwrap();
    let failed = |r: &Reservation| format!("FAILED:{}:reloaded", r.order_no);
    for told in &stale[..225] {
        assert_eq!(
            statuses[&told.user_id.to_string()],
            failed(told),
            "a buyer left with no status or an earlier order's"
        );
    }
    // Under a later purchase, the dropped one keeps its own record; its own order
    // tells for itself.
    let mut records = 0;
    for (i, newer) in stale[225..].iter().enumerate() {
        assert_eq!(statuses[&newer.user_id.to_string()], kept(newer, i));
        let record = statuses.get(&format!("r:{}:{}", newer.user_id, newer.order_no));
        if i % 3 == 1 {
            assert_eq!(record, None);
        } else {
            assert_eq!(record, Some(&failed(newer)));
            records += 1;
        }
    }
    assert_eq!(statuses.len(), N as usize + records);
    app.stop().await;
}

/// A settle cut off between its runs (the core's Redis connection lost after the first
/// 128 of a batch were settled): the orders exist, the first run's buyers see CREATED,
/// the rest are settled by the replay — and every order gets its order-timeout message,
/// the first run's at once (a replay never reads their entries again), the rest's with
/// the replay. So every unpaid order is cancelled when its window closes and its unit
/// goes back on sale, none left for the overdue sweep 30 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_cut_between_its_runs_still_times_every_order_out() {
    const BUYERS: u64 = 200;
    // The core reaches Redis through a relay that can drop its connection at a chosen
    // request; a batch waits on MySQL for as long as the test holds a table.
    let stack = stampede_e2e::Stack::from_env();
    if stack.redis_cluster_port.is_some() {
        // A cluster's cores find its nodes through redis.nodes, past any one relay.
        eprintln!("single Redis only: skipped on the cluster stack");
        return;
    }
    let relay = stampede_e2e::StallingRelay::start(([127, 0, 0, 1], stack.redis_port).into()).await;
    let app = spawn_app_with(|s| {
        s.orders.enabled = true;
        s.mysql.call_timeout_ms = 30_000;
        s.redis.url = s.redis.url.replace(
            &format!(":{}", stack.redis_port),
            &format!(":{}", relay.port),
        );
        assert!(s.redis.url.contains(&relay.port.to_string()));
    })
    .await;
    let mut sale = small_sale(300, 1, 1, 1);
    sale["pay_timeout_s"] = json!(2);
    let (event, categories) = app.create_event(sale).await;
    app.publish(event).await;
    let buyers = app.buyers(BUYERS).await;
    // Batches are created with their order-timeout message once the broker's clients
    // are up (before, through the outbox, the sweep times them out).
    let broker_up = eventually(Duration::from_secs(20), || async {
        let ready: serde_json::Value = app
            .http
            .get(format!("{}/readyz", app.admin_url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ready["dependencies"]["rocketmq"] == "up"
    })
    .await;
    assert!(broker_up, "the core's broker clients never started");

    // Purchases while stock_batch is locked, so that batches wait: the first buyer's
    // alone in a batch, then the other 199, read together once the first batch has
    // had its turn (orders::TURN_LAPSE, 2 s) and settled in two runs, 128 and 71.
    let mut lock = app.mysql.get_conn().await.unwrap();
    lock.query_drop("LOCK TABLES stock_batch WRITE")
        .await
        .unwrap();
    let name = app.keys().order_stream(Bucket::only(event));
    let mut r = app.redis.clone();
    let read = |n: usize| {
        let (r, name) = (r.clone(), name.clone());
        async move {
            // (NOGROUP until the workers first look at the stream.)
            let pending: redis::RedisResult<redis::streams::StreamPendingReply> = r
                .clone()
                .xpending(&name, stampede_core::orders::redis::GROUP)
                .await;
            pending.is_ok_and(|p| p.count() == n)
        }
    };
    let first = burst(&app, event, categories[0], &buyers[..1]).await;
    assert_eq!(first.get(&202), Some(&1), "{first:?}");
    assert!(
        eventually(Duration::from_secs(10), || read(1)).await,
        "the first reservation was not read"
    );
    let answers = burst(&app, event, categories[0], &buyers[1..]).await;
    assert_eq!(answers.get(&202), Some(&(BUYERS - 1)), "{answers:?}");
    assert!(
        read(1).await,
        "a second batch was read before the last purchase: the test needs them in one"
    );
    assert!(
        eventually(Duration::from_secs(10), || read(BUYERS as usize)).await,
        "the reservations were not all read into batches"
    );
    // The newest reservation: in the last chunk of its batch, whose settle.lua run is
    // the only request to carry its order number from now on.
    let newest: redis::streams::StreamRangeReply =
        r.xrevrange_count(&name, "+", "-", 1).await.unwrap();
    let newest =
        stampede_core::orders::reservation::Reservation::from_entry(&newest.ids[0]).unwrap();
    relay.cut_when_sent(newest.order_no.0.to_string().as_bytes());
    lock.query_drop("UNLOCK TABLES").await.unwrap();
    drop(lock);

    let statuses_key = app.keys().purchase_status(Bucket::only(event));
    let statuses = || async {
        let all: HashMap<u64, String> = app.redis.clone().hgetall(&statuses_key).await.unwrap();
        let mut by_state: HashMap<String, usize> = HashMap::new();
        for s in all.values() {
            *by_state
                .entry(s.split(':').next().unwrap().to_owned())
                .or_default() += 1;
        }
        by_state
    };
    let created = eventually(Duration::from_secs(20), || async {
        ordered_units(&app.mysql, event).await == (BUYERS, BUYERS)
            && app.stream_len(event).await == 0
    })
    .await;
    assert!(
        created,
        "orders {:?}, backlog {}",
        ordered_units(&app.mysql, event).await,
        app.stream_len(event).await
    );
    assert!(
        relay.marker_sent() >= 2,
        "the cut settle was not replayed: its order number sent {} times",
        relay.marker_sent()
    );
    // Every order cancelled at the end of its 2 s window, by its message.
    let cancelled = eventually(Duration::from_secs(15), || async {
        statuses().await.get("CANCELLED") == Some(&(BUYERS as usize))
    })
    .await;
    assert!(
        cancelled,
        "not every unpaid order was cancelled on time: {:?}",
        statuses().await
    );
    let not_cancelled = scalar(
        &app.mysql,
        &format!(
            "SELECT COUNT(*) FROM ({}) o",
            stampede_e2e::over_shards(&format!(
                "SELECT order_no FROM {{orders}} WHERE event_id = {event} AND status <> 'CANCELLED'"
            ))
        ),
    )
    .await;
    assert_eq!(not_cancelled, 0, "orders in MySQL not cancelled");
    assert_eq!(
        app.stock(event, categories[0]).await,
        300,
        "units back on sale"
    );
    app.stop().await;
}

/// A batch MySQL refuses for the server's own reasons, not the rows' — here one order
/// shard's table gone (1146); likewise read-only, shutting down, too many connections,
/// access denied — is retried, and after a few refusals tried order by order: the orders
/// of the other shards are created, those of the missing table wait for it. A
/// reservation answered 202 is never released for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_for_the_servers_own_reasons_waits_and_is_created_later() {
    const BUYERS: u64 = 40;
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let shards = app.settings.mysql.order_shards;
    assert!(shards > 1);
    let (event, categories) = app.create_event(small_sale(100, 1, 1, 1)).await;
    app.publish(event).await;
    let buyers = app.buyers(BUYERS).await;
    let mut conn = app.mysql.get_conn().await.unwrap();
    conn.query_drop("RENAME TABLE order_1 TO order_1_away")
        .await
        .unwrap();
    let answers = burst(&app, event, categories[0], &buyers).await;
    assert_eq!(answers.get(&202), Some(&BUYERS), "{answers:?}");
    // Each purchase's state, and whether its order's shard is the missing one's.
    let states = || states_by_shard(&app, event, 1);
    let waiting = |states: &HashMap<(String, bool), usize>| {
        states.keys().all(|(state, in_missing)| {
            (state == "QUEUED" && *in_missing) || (state == "CREATED" && !*in_missing)
        })
    };
    let split = eventually(Duration::from_secs(15), || async {
        let states = states().await;
        states.values().sum::<usize>() == BUYERS as usize && waiting(&states) && states.len() == 2
    })
    .await;
    assert!(
        split,
        "not (the other shards' orders created, the missing one's waiting): {:?}",
        states().await
    );
    // And so they stay while the table is missing.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = states().await;
    assert!(waiting(&still), "{still:?}");
    conn.query_drop("RENAME TABLE order_1_away TO order_1")
        .await
        .unwrap();
    drop(conn);
    let created = eventually(Duration::from_secs(30), || async {
        ordered_units(&app.mysql, event).await == (BUYERS, BUYERS)
            && states().await.keys().all(|(state, _)| state == "CREATED")
    })
    .await;
    assert!(
        created,
        "orders {:?}, states {:?}",
        ordered_units(&app.mysql, event).await,
        states().await
    );
    let released = app
        .admin_api
        .counter("stampede_reservations_released_total")
        .await
        .unwrap_or(0);
    assert_eq!(released, 0, "reservations released");
    app.stop().await;
}

/// Reservations past orders.deadline_s that MySQL can neither create nor release (one
/// order shard's table gone, so neither the batch nor the expiry goes through) do not
/// hold the core's only worker: it leaves them pending after claim_idle_ms and serves
/// another sale meanwhile; once the table is back they are released as overdue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overdue_reservations_mysql_cannot_settle_do_not_hold_a_worker_from_other_sales() {
    const BUYERS: u64 = 30;
    let app = spawn_app_with(|s| {
        s.orders.enabled = true;
        s.orders.workers = 1;
        s.orders.deadline_s = 5;
        s.orders.claim_idle_ms = 1_000;
    })
    .await;
    let mut sales = Vec::new();
    for _ in 0..2 {
        let (event, categories) = app.create_event(small_sale(100, 1, 1, 1)).await;
        app.publish(event).await;
        sales.push((event, categories[0], app.buyers(BUYERS).await));
    }
    // Each purchase of `event`: its state, and whether its order is in the missing shard.
    let states = |event: u64| states_by_shard(&app, event, 1);
    let mut conn = app.mysql.get_conn().await.unwrap();
    conn.query_drop("RENAME TABLE order_1 TO order_1_away")
        .await
        .unwrap();
    let (a, a_category, a_buyers) = &sales[0];
    let answers = burst(&app, *a, *a_category, a_buyers).await;
    assert_eq!(answers.get(&202), Some(&BUYERS), "{answers:?}");
    // The first sale's orders in shard 1 are past their deadline and stuck; then
    // purchases of the second sale, which the only worker must still get to in time.
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    let (b, b_category, b_buyers) = &sales[1];
    let answers = burst(&app, *b, *b_category, b_buyers).await;
    assert_eq!(answers.get(&202), Some(&BUYERS), "{answers:?}");
    let served = eventually(Duration::from_secs(20), || async {
        let states = states(*b).await;
        states
            .get(&("CREATED".to_owned(), false))
            .copied()
            .unwrap_or(0)
            > 0
            && !states.contains_key(&("QUEUED".to_owned(), false))
    })
    .await;
    assert!(
        served,
        "the second sale's orders outside the missing shard were not created: {:?}",
        states(*b).await
    );
    // Meanwhile every order outside shard 1 was created, every one in it waits.
    let mut stuck = Vec::new();
    for (event, _, _) in &sales {
        let states = states(*event).await;
        let waiting = states
            .get(&("QUEUED".to_owned(), true))
            .copied()
            .unwrap_or(0);
        let created = states
            .get(&("CREATED".to_owned(), false))
            .copied()
            .unwrap_or(0);
        assert_eq!(
            waiting + created,
            BUYERS as usize,
            "event {event}: {states:?}"
        );
        assert!(
            waiting > 0,
            "event {event}: no order in shard 1 to test with"
        );
        stuck.push(waiting);
    }
    conn.query_drop("RENAME TABLE order_1_away TO order_1")
        .await
        .unwrap();
    drop(conn);
    // Back: those of shard 1 are created, or released if overdue by then (the first
    // sale's are); nothing is left waiting.
    let first_sale = sales[0].0;
    for ((event, _, _), waiting) in sales.iter().zip(stuck) {
        let done = eventually(Duration::from_secs(30), || async {
            let states = states(*event).await;
            let count = |state: &str, missing: bool| {
                states
                    .get(&(state.to_owned(), missing))
                    .copied()
                    .unwrap_or(0)
            };
            count("CREATED", false) == BUYERS as usize - waiting
                && count("CREATED", true) + count("FAILED", false) == waiting
                && (*event != first_sale || count("FAILED", false) == waiting)
        })
        .await;
        assert!(done, "event {event}: {:?}", states(*event).await);
    }
    app.stop().await;
}

/// The purchases of `event` by state ("QUEUED", "CREATED", "FAILED", ...) and by whether
/// their order is in order shard `shard` (false for a status naming no order: a FAILED
/// one, "<request id>:<reason>", is not parsed as one).
async fn states_by_shard(app: &TestApp, event: u64, shard: u32) -> HashMap<(String, bool), usize> {
    use stampede_core::domain::OrderNo;
    use stampede_core::order_tables::shard_of_order;
    let shards = app.settings.mysql.order_shards;
    let key = app.keys().purchase_status(Bucket::only(event));
    let all: HashMap<u64, String> = app.redis.clone().hgetall(&key).await.unwrap();
    let mut states = HashMap::new();
    for s in all.values() {
        let (state, rest) = s.split_once(':').unwrap();
        let in_shard = rest
            .parse()
            .is_ok_and(|n| shard_of_order(OrderNo(n), shards) == shard);
        *states.entry((state.to_owned(), in_shard)).or_default() += 1;
    }
    states
}

/// A reservation released after its keys were rebuilt from MySQL (a rewind or lost keys
/// fenced the event, a worker's release came late) gives nothing back: the rebuild
/// counted its unit and the buyer's share as free already (the reservation was never an
/// order), and giving them back again offered the unit twice. Released under the keys
/// that admitted it, it gives them back.
#[tokio::test]
async fn a_release_after_a_rebuild_gives_nothing_back_twice() {
    use stampede_core::orders::redis::{self as stream, Released};
    let app = spawn_app_with(|_| {}).await;
    let (event, categories) = app.create_event(small_sale(10, 2, 1, 1)).await;
    app.publish(event).await;
    let ga = json!({"category_id": categories[0], "quantity": 1});
    let buyers = app.buyers(2).await;
    for (b, key) in buyers.iter().zip(["a", "b"]) {
        assert_eq!(app.buy(event, b, key, ga.clone()).await.0, 202);
    }
    let (keys, bucket) = (app.keys(), Bucket::only(event));
    let mut r = app.redis.clone();
    let reservations = app.read_reservations(bucket, "w", 10).await;
    assert_eq!(reservations.len(), 2);
    let stock = keys.stock(bucket);
    let held = keys.held(bucket);
    let ga_id = categories[0];
    let units = async |r: &mut stampede_core::infra::redis::Redis| -> i64 {
        r.hget(&stock, ga_id).await.unwrap()
    };
    assert_eq!(units(&mut r).await, 8);

    // Under the keys that admitted it: the unit and the share go back.
    let first = &reservations[0];
    let released = stream::release(&mut r, &keys, bucket, first, "test")
        .await
        .unwrap();
    assert_eq!(released, Released::Released);
    assert_eq!(units(&mut r).await, 9);
    let share: Option<u32> = r.hget(&held, first.user_id).await.unwrap();
    assert_eq!(share, None);

    // The keys rebuilt from MySQL (a newer epoch; neither reservation an order there,
    // so all 10 units free, and the second buyer holding 1 — as if from an order of
    // theirs): the second reservation's late release changes nothing.
    let second = &reservations[1];
    let _: () = r
        .hset(keys.meta(bucket), "epoch", first.epoch + 1)
        .await
        .unwrap();
    let _: () = r.hset(&stock, ga_id, 10).await.unwrap();
    let _: () = r.hset(&held, second.user_id, 1).await.unwrap();
    let released = stream::release(&mut r, &keys, bucket, second, "test")
        .await
        .unwrap();
    assert_eq!(released, Released::Released);
    assert_eq!(
        units(&mut r).await,
        10,
        "the rebuild counted that unit already"
    );
    let share: Option<i64> = r.hget(&held, second.user_id).await.unwrap();
    assert_eq!(
        share,
        Some(1),
        "the share the rebuild wrote, not one below it"
    );
    let len: u64 = r.xlen(keys.order_stream(bucket)).await.unwrap();
    assert_eq!(len, 0, "both entries gone");
    app.stop().await;
}

/// The API's requests that read MySQL through the preloader or the reconciler — a
/// purchase status read from the orders (a sale over whose buyer's keys are gone), the
/// admin stats, `POST …/reconcile`, the preload on publish — and `/readyz` take the
/// API's connections: with the pipeline's one connection held by an order creation
/// waiting on a locked table, each answers. They took the pipeline's, and waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_through_the_preloader_and_the_reconciler_hold_no_connection_of_the_pipeline() {
    let app = spawn_app_with(|s| {
        s.orders.enabled = true;
        (s.mysql.pool_max, s.mysql.api_pool_max) = (1, 4);
        s.server.request_timeout_ms = 5_000;
        // Neither pass may rebuild the over sale's keys meanwhile.
        s.reconcile.interval_s = 0;
        // The events as read before the lock (the cache reads on the pipeline's pool:
        // a purchase's event read is the pipeline's).
        s.admission.event_cache_ttl_ms = 120_000;
    })
    .await;
    // A sale over, one order in it, its buyer's keys gone (as after a purge).
    let buyer = app.buyers(1).await.remove(0);
    // Room for a slow machine to create, publish and buy before the end.
    let end = chrono::Utc::now() + chrono::Duration::seconds(8);
    let mut sale = small_sale(5, 1, 1, 2);
    sale["sale_end"] = json!(end.to_rfc3339());
    let (over, over_categories) = app.create_event(sale).await;
    app.publish(over).await;
    let body = json!({"category_id": over_categories[0], "quantity": 1});
    assert_eq!(app.buy(over, &buyer, "k", body).await.0, 202);
    let created = eventually(Duration::from_secs(20), || async {
        ordered_units(&app.mysql, over).await == (1, 1)
    })
    .await;
    assert!(created, "the over sale's order was not created");
    // Past its end.
    let wait = (end - chrono::Utc::now()).to_std().unwrap_or_default() + Duration::from_secs(2);
    tokio::time::sleep(wait).await;
    let bucket = Bucket::only(over);
    let _: () = app
        .redis
        .clone()
        .del(&[app.keys().purchase_status(bucket), app.keys().meta(bucket)])
        .await
        .unwrap();
    let status = app.purchase_status(over, &buyer).await;
    assert_eq!(status["status"], "CREATED", "from the orders: {status}");

    // A sale on whose order creation waits on a locked table, holding the pipeline's
    // only connection.
    let (event, categories) = app.create_event(small_sale(10, 1, 1, 2)).await;
    app.publish(event).await;
    let mut lock = app.mysql.get_conn().await.unwrap();
    lock.query_drop("LOCK TABLES user_hold WRITE")
        .await
        .unwrap();
    let body = json!({"category_id": categories[0], "quantity": 1});
    assert_eq!(app.buy(event, &buyer, "k2", body).await.0, 202);
    let blocked = eventually(Duration::from_secs(10), || async {
        waiting_on_a_lock(&app).await >= 1
    })
    .await;
    assert!(blocked, "the order creation did not reach the locked table");

    let status = app.purchase_status(over, &buyer).await;
    assert_eq!(status["status"], "CREATED", "{status}");
    let (code, stats) = app
        .admin_api
        .get(&format!("/admin/events/{event}/stats"))
        .await;
    assert_eq!(code, 200, "stats: {stats}");
    let (code, report) = app
        .admin_api
        .post(&format!("/admin/events/{over}/reconcile"), json!({}))
        .await;
    assert_eq!(code, 200, "reconcile: {report}");
    let (third, _) = app.create_event(small_sale(3, 1, 1, 1)).await;
    app.publish(third).await;
    let ready = app
        .http
        .get(format!("{}/readyz", app.public_url))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(ready, 200);
    // All of it while the pipeline's connection waited.
    assert_eq!(waiting_on_a_lock(&app).await, 1, "the lock was let go");
    assert_eq!(ordered_units(&app.mysql, event).await, (0, 0));

    lock.query_drop("UNLOCK TABLES").await.unwrap();
    drop(lock);
    let created = eventually(Duration::from_secs(20), || async {
        ordered_units(&app.mysql, event).await == (1, 1)
    })
    .await;
    assert!(created, "the order was not created once the table was free");
    app.stop().await;
}
