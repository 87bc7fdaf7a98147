//! MySQL as the last line of defence: whatever Redis admits, order creation's
//! transaction refuses oversell, a seat in two live orders and a buyer over the limit;
//! and a Redis found behind MySQL is fenced and rebuilt from it.

use stampede_core::keys::Bucket;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;
use stampede_core::keys::SeatState;
use stampede_e2e::{Buyer, TestApp, eventually, ordered_units, scalar, small_sale, spawn_app_with};

/// Buys one unit of `category` for each buyer, one key each; the statuses answered.
pub(crate) async fn buy_one_each(
    app: &TestApp,
    event: u64,
    category: u64,
    buyers: &[Buyer],
) -> Vec<u16> {
    let mut answers = Vec::new();
    for b in buyers {
        let body = json!({"category_id": category, "quantity": 1});
        answers.push(app.buy(event, b, "k1", body).await.0);
    }
    answers
}

/// Nothing queued any more for the event.
pub(crate) async fn drained(app: &TestApp, event: u64) -> bool {
    eventually(Duration::from_secs(30), || async {
        app.stream_len(event).await == 0
    })
    .await
}

/// `SELECT committed FROM ticket_category`.
async fn committed(app: &TestApp, category: u64) -> i64 {
    scalar(
        &app.mysql,
        &format!("SELECT committed FROM ticket_category WHERE id = {category}"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_refuses_units_redis_should_not_have_offered_and_redis_is_corrected_down() {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(small_sale(10, 1, 2, 2)).await;
    app.publish(event).await;
    let ga = categories[0];
    let first = app.buyers(10).await;
    assert_eq!(buy_one_each(&app, event, ga, &first).await, vec![202; 10]);
    assert!(drained(&app, event).await);
    assert_eq!(ordered_units(&app.mysql, event).await, (10, 10));
    // Redis loses what it sold (as if it had restarted from an old copy) and offers 6;
    // 5 are bought, so without the refusals' cap 1 would stay on offer.
    let mut redis = app.redis.clone();
    let _: () = redis
        .hset(app.keys().stock(Bucket::only(event)), ga, 6)
        .await
        .unwrap();
    let _: () = redis.hdel(app.keys().sold_out(event), ga).await.unwrap();
    let late = app.buyers(5).await;
    assert_eq!(buy_one_each(&app, event, ga, &late).await, vec![202; 5]);
    assert!(drained(&app, event).await);

    assert_eq!(
        ordered_units(&app.mysql, event).await,
        (10, 10),
        "MySQL took no more than the category has"
    );
    assert_eq!(committed(&app, ga).await, 10);
    for b in &late {
        let status = app.purchase_status(event, b).await;
        assert_eq!(status["status"], "FAILED", "{status}");
        assert_eq!(status["reason"], "sold out", "{status}");
        // They hold nothing: no share left behind to count against their limit.
        let held: Option<i64> = redis
            .hget(app.keys().held(Bucket::only(event)), b.user_id)
            .await
            .unwrap();
        assert_eq!(held, None, "buyer {} refused sold out", b.user_id);
    }
    let refused = scalar(
        &app.mysql,
        &format!(
            "SELECT COUNT(*) FROM stock_log WHERE event_id = {event} AND status = 'REFUSED' \
             AND reason = 'SOLD_OUT'"
        ),
    )
    .await;
    assert_eq!(refused, 5, "each refusal's row says why");
    assert_eq!(
        app.stock(event, ga).await,
        0,
        "corrected down to what MySQL has"
    );
    let flag: Option<u8> = redis.hget(app.keys().sold_out(event), ga).await.unwrap();
    assert_eq!(flag, Some(1));
    let answer = buy_one_each(&app, event, ga, &app.buyers(1).await).await;
    assert_eq!(answer, vec![409], "sold out at admission again");
    app.stop().await;
}

/// A core whose order workers are off, a sale of 10 GA units, and two buyers' GA
/// reservations read from the stream as a batch's: (app, event, GA, buyers, them).
async fn two_reserved() -> (
    TestApp,
    u64,
    u64,
    Vec<Buyer>,
    Vec<stampede_core::orders::reservation::Reservation>,
) {
    let app = spawn_app_with(|_| {}).await;
    let (event, categories) = app.create_event(small_sale(10, 1, 2, 2)).await;
    app.publish(event).await;
    let ga = categories[0];
    let buyers = app.buyers(2).await;
    assert_eq!(buy_one_each(&app, event, ga, &buyers).await, vec![202; 2]);
    let reservations = app.read_reservations(Bucket::only(event), "test", 2).await;
    assert_eq!(reservations.len(), 2);
    (app, event, ga, buyers, reservations)
}

/// A sold-out refusal lowers Redis's stock to what MySQL had left, but not over a unit
/// that came into the bucket after the batch read that — a cancelled order given back
/// into it, or (an event of several buckets) a move credited to it, which may carry a
/// unit given back into another bucket: that unit is not in the cap, and lowering the
/// stock to it would take it off sale for the rest of the sale (Redis's stock is raised
/// only once a sale is over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusals_cap_does_not_take_back_a_unit_that_came_in_since() {
    use stampede_core::orders::redis::{self as workers, Cap};
    for way_in in ["a cancellation given back", "a move credited"] {
        let (app, event, ga, buyers, reservations) = two_reserved().await;
        let bucket = Bucket::only(event);
        let (keys, mut redis) = (app.keys(), app.redis.clone());
        // What a batch reads before its transaction; MySQL then says nothing is left.
        let restocks = workers::restocks(&mut redis, &keys, bucket).await.unwrap();
        let cap = Some(Cap { units: 0, restocks });
        let refuse_capped = |r| {
            let (keys, mut redis) = (keys.clone(), app.redis.clone());
            async move {
                let refused = workers::refuse(&mut redis, &keys, bucket, r, "sold out", cap, false);
                assert_eq!(refused.await.unwrap(), workers::Refused::Refused);
            }
        };
        refuse_capped(&reservations[0]).await;
        assert_eq!(app.stock(event, ga).await, 0, "nothing came in: capped");
        // A unit comes into the bucket after the read.
        let mut came_in = redis::pipe();
        match way_in {
            "a move credited" => came_in.sadd(keys.credited(bucket), "move-1"),
            _ => came_in.sadd(keys.restocked(bucket), 990_001),
        };
        let _: () = came_in
            .hincr(keys.stock(bucket), ga, 1)
            .query_async(&mut redis)
            .await
            .unwrap();
        refuse_capped(&reservations[1]).await;
        assert_eq!(
            app.stock(event, ga).await,
            1,
            "{way_in} after the read: its unit stays on sale"
        );
        let status = app.purchase_status(event, &buyers[1]).await;
        assert_eq!(status["status"], "FAILED", "refused all the same: {status}");
        app.stop().await;
    }
}

/// A batch tried again after MySQL refused one of its reservations SOLD_OUT (the first
/// attempt committed, then its step in Redis failed): the later attempt finds the refusal
/// in stock_log and still says what MySQL has left of that category, the cap its refusal
/// in Redis lowers the stock to; so does the expiry of such a reservation once it is
/// overdue. (Without it, Redis stayed ahead of MySQL until another buyer was admitted
/// and refused.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sold_out_refusal_a_later_attempt_finds_still_says_what_mysql_has_left() {
    use stampede_core::orders::guards::Declined;
    use stampede_core::orders::persist;
    use stampede_core::orders::reservation::Batch;
    let (app, event, ga, _, reservations) = two_reserved().await;
    // MySQL has nothing left of GA (sold by a Redis that went back in time, say).
    let mut conn = app.mysql.get_conn().await.unwrap();
    use mysql_async::prelude::Queryable;
    conn.query_drop(format!(
        "UPDATE ticket_category SET committed = total WHERE id = {ga}"
    ))
    .await
    .unwrap();
    drop(conn);
    let record = stampede_core::catalog::load(&app.mysql, event)
        .await
        .unwrap()
        .unwrap();
    let limit = stampede_core::infra::mysql::CallTimeout::new(
        Duration::from_secs(15),
        &stampede_core::metrics::Metrics::new(),
    );
    let shards = app.settings.mysql.order_shards;
    let mut batch = Batch {
        event_id: event.into(),
        batch_id: "b-1".into(),
        reservations,
        first_delivery: true,
    };
    for attempt in ["first", "again"] {
        let created = persist::create_orders(&app.mysql, shards, &record, &batch, &limit)
            .await
            .unwrap();
        let refused: Vec<_> = batch
            .reservations
            .iter()
            .map(|r| (r.order_no, Declined::SoldOut))
            .collect();
        assert_eq!(created.declined, refused, "{attempt}");
        assert_eq!(created.room.get(&ga), Some(&0), "{attempt}: {created:?}");
        batch.batch_id = "b-2".into();
        batch.first_delivery = false;
    }
    // Past its deadline, the expiry finds the refusal too, and what MySQL has left.
    for r in &batch.reservations {
        let expiry = persist::expire(&app.mysql, shards, event.into(), r).await;
        assert_eq!(
            expiry.unwrap(),
            persist::Expiry::Refused(Declined::SoldOut, Some(0))
        );
    }
    assert_eq!(ordered_units(&app.mysql, event).await, (0, 0));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_refuses_a_seat_in_two_live_orders_and_a_buyer_over_the_limit() {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(small_sale(10, 1, 2, 1)).await;
    app.publish(event).await;
    let (ga, seated) = (categories[0], categories[1]);
    let buyers = app.buyers(2).await;
    let (owner, other) = (&buyers[0], &buyers[1]);
    let seat = json!({"category_id": seated, "seat_ids": ["1:1"]});
    assert_eq!(app.buy(event, owner, "seat", seat.clone()).await.0, 202);
    assert!(drained(&app, event).await);
    let status = app.purchase_status(event, owner).await;
    let order_no: u64 = status["order_no"].as_str().unwrap().parse().unwrap();
    let locked_for = scalar(
        &app.mysql,
        &format!(
            "SELECT order_no FROM seat WHERE category_id = {seated} AND row_no = 1 \
             AND col_no = 1 AND status = 'LOCKED'"
        ),
    )
    .await;
    assert_eq!(
        locked_for as u64, order_no,
        "locked by order creation itself"
    );
    // Redis forgets the seat's lock and the owner's share.
    let mut redis = app.redis.clone();
    let _: () = redis
        .hset(
            app.keys().seats(Bucket::only(event), seated),
            "1:1",
            SeatState::FREE,
        )
        .await
        .unwrap();
    let _: () = redis
        .hincr(app.keys().row_free(Bucket::only(event), seated), 1, 1)
        .await
        .unwrap();
    let _: () = redis
        .hdel(app.keys().held(Bucket::only(event)), owner.user_id)
        .await
        .unwrap();
    let (status, seat_queued) = app.buy(event, other, "seat", seat).await;
    assert_eq!(status, 202, "{seat_queued}");
    let more = json!({"category_id": ga, "quantity": 1});
    let (status, more_queued) = app.buy(event, owner, "more", more).await;
    assert_eq!(status, 202, "{more_queued}");
    assert!(drained(&app, event).await);

    let taken = app.purchase_status(event, other).await;
    assert_eq!(taken["status"], "FAILED", "{taken}");
    assert_eq!(taken["reason"], "a chosen seat is taken", "{taken}");
    let over = app.purchase_status(event, owner).await;
    assert_eq!(over["status"], "FAILED", "{over}");
    assert_eq!(over["reason"], "over the per-user limit", "{over}");
    // The refused seat's buyer holds nothing; over the limit, Redis was behind on what
    // the owner holds (1, in MySQL), and the refused share stands in for it.
    let held_key = app.keys().held(Bucket::only(event));
    let held: (Option<i64>, Option<i64>) = (
        redis.hget(&held_key, other.user_id).await.unwrap(),
        redis.hget(&held_key, owner.user_id).await.unwrap(),
    );
    assert_eq!(held, (None, Some(1)));
    // Each REFUSED row says why, by the reservation's order number.
    for (queued, reason) in [(&seat_queued, "SEAT_TAKEN"), (&more_queued, "OVER_LIMIT")] {
        let order_no: u64 = queued["request_id"].as_str().unwrap().parse().unwrap();
        let rows = scalar(
            &app.mysql,
            &format!(
                "SELECT COUNT(*) FROM stock_log WHERE order_no = {order_no} \
                 AND status = 'REFUSED' AND reason = '{reason}'"
            ),
        )
        .await;
        assert_eq!(rows, 1, "order {order_no} refused {reason}");
    }
    assert_eq!(
        ordered_units(&app.mysql, event).await,
        (1, 1),
        "only the first order"
    );
    let seat_now = scalar(
        &app.mysql,
        &format!(
            "SELECT order_no FROM seat WHERE category_id = {seated} AND row_no = 1 AND col_no = 1"
        ),
    )
    .await;
    assert_eq!(
        seat_now as u64, order_no,
        "the seat stays its first order's"
    );
    let held = scalar(
        &app.mysql,
        &format!(
            "SELECT units FROM user_hold WHERE event_id = {event} AND user_id = {}",
            owner.user_id
        ),
    )
    .await;
    assert_eq!(held, 1);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_behind_mysql_is_fenced_at_the_next_pass_and_rebuilt_exactly() {
    let app = spawn_app_with(|s| s.orders.enabled = true).await;
    let (event, categories) = app.create_event(small_sale(20, 1, 1, 2)).await;
    app.publish(event).await;
    let ga = categories[0];
    assert_eq!(
        buy_one_each(&app, event, ga, &app.buyers(6).await).await,
        vec![202; 6]
    );
    assert!(drained(&app, event).await);
    // Redis as it was after two admissions: its counter and stock behind MySQL's orders.
    let mut redis = app.redis.clone();
    let meta = app.keys().event_meta(event);
    let epoch: u64 = redis.hget(&meta, "epoch").await.unwrap();
    let _: () = redis.hset(&meta, "seq", 2).await.unwrap();
    let _: () = redis
        .hset(app.keys().stock(Bucket::only(event)), ga, 18)
        .await
        .unwrap();

    let (status, report) = app
        .post(&format!("/admin/events/{event}/reconcile"), json!({}))
        .await;
    assert_eq!(status, 200, "{report}");
    let actions = report["actions"].to_string();
    assert!(actions.contains("Redis was behind MySQL"), "{report}");
    assert!(actions.contains("rebuilt"), "{report}");
    assert_eq!(app.stock(event, ga).await, 14, "20 − the 6 units in orders");
    let rebuilt: u64 = redis.hget(&meta, "epoch").await.unwrap();
    assert!(rebuilt > epoch);
    let seq: u64 = redis.hget(&meta, "seq").await.unwrap();
    assert_eq!(seq, 6, "counts on from MySQL's largest admission number");
    assert_eq!(
        buy_one_each(&app, event, ga, &app.buyers(2).await).await,
        vec![202; 2]
    );
    assert!(drained(&app, event).await);
    assert_eq!(ordered_units(&app.mysql, event).await, (8, 8));
    app.stop().await;
}
