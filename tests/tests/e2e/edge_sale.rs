//! A sale through the shared edge: sold out at the edge, live rate limits, a seat rush.

use stampede_core::keys::Bucket;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::json;
use stampede_core::keys::SeatState;
use stampede_e2e::{Stack, eventually, purchase, raw_request, small_sale, stack_app};

use crate::edge::{core_answers, open_sale};

#[tokio::test]
async fn sold_out_is_answered_at_the_edge_without_a_redis_command() {
    let (app, _edge) = stack_app().await;
    let (event, categories) = open_sale(&app, small_sale(1, 1, 1, 2)).await;
    let (ga, seated) = (categories[0], categories[1]);
    let buyers = app.admin.buyers(3).await;
    let crowd = app.admin.buyers(200).await;
    assert_eq!(
        app.buy(
            event,
            &buyers[0],
            "a",
            json!({"category_id": ga, "quantity": 1})
        )
        .await
        .0,
        202
    );
    assert_eq!(
        app.buy(
            event,
            &buyers[1],
            "b",
            json!({"category_id": seated, "quantity": 1})
        )
        .await
        .0,
        202
    );
    // Every category is sold out now; the edge learns it from its refresh. A 409 proves
    // that only if the core did not answer it: its count of public 409s stays put.
    let core_409s = || core_answers(&app, 409);
    let learned = eventually(Duration::from_secs(10), || async {
        let before = core_409s().await;
        let (status, body) = app
            .buy(
                event,
                &buyers[2],
                "c",
                json!({"category_id": ga, "quantity": 1}),
            )
            .await;
        status == 409 && body["error"]["code"] == "SOLD_OUT" && core_409s().await == before
    })
    .await;
    assert!(learned, "the edge never answered SOLD_OUT itself");

    // Watch every command on the event's meta key while 200 more buyers try.
    let meta = format!("{}\"", app.keys().event_meta(event));
    let ((), seen) = monitored(move |line| line.contains(&meta), async {
        // Each a different buyer: one buyer trying 200 times would meet the rate
        // limits first.
        for (i, buyer) in crowd.iter().enumerate() {
            let (status, body) = app
                .buy(
                    event,
                    buyer,
                    &format!("k{i}"),
                    json!({"category_id": ga, "quantity": 1}),
                )
                .await;
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (409, Some("SOLD_OUT"))
            );
        }
    })
    .await;
    let scripts: Vec<&String> = seen
        .iter()
        // The admission script is the one script given the event's meta key (the order
        // pipeline's settle and release scripts are not).
        .filter(|l| l.contains("\"EVALSHA\"") || l.contains("\"EVAL\""))
        .collect();
    assert!(
        scripts.is_empty(),
        "sold-out requests reached Redis: {scripts:?}"
    );
    // `monitored` watched from MONITOR's OK to a marker sent after the last buyer.
}

/// Runs `during` while Redis's MONITOR is read, and returns what it returned and the lines
/// `keep` kept. MONITOR is read as it goes: a pipe left unread until the end fills in a
/// fraction of a second on a stack with many sales listed, and then holds only the first
/// commands of the window.
async fn monitored<T>(
    keep: impl Fn(&str) -> bool + Send + 'static,
    during: impl std::future::Future<Output = T>,
) -> (T, Vec<String>) {
    use tokio::io::AsyncBufReadExt;
    let stack = Stack::from_env();
    let mut monitor = tokio::process::Command::new("redis-cli")
        .args(["-p", &stack.redis_port.to_string(), "monitor"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("redis-cli");
    let mut lines = tokio::io::BufReader::new(monitor.stdout.take().expect("piped")).lines();
    // Its "OK": watching from here.
    let ok = lines.next_line().await.expect("MONITOR's answer");
    assert_eq!(ok.as_deref(), Some("OK"));
    // Read until a marker sent after `during` comes by: every command before it is in.
    let marker = format!("end-of-watch-{}", rand_key());
    let watching = marker.clone();
    let reader = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains(&watching) {
                return Some(kept);
            }
            if keep(&line) {
                kept.push(line);
            }
        }
        None
    });
    let out = during.await;
    redis::cmd("ECHO")
        .arg(&marker)
        .query_async::<String>(&mut stack.redis().await)
        .await
        .expect("ECHO");
    let kept = tokio::time::timeout(Duration::from_secs(30), reader)
        .await
        .expect("MONITOR showed the marker")
        .unwrap()
        .expect("MONITOR ended before the marker");
    monitor.start_kill().unwrap();
    (out, kept)
}

#[tokio::test]
async fn rate_limits_answer_429_and_a_changed_limit_applies_within_a_second() {
    let (app, _edge) = stack_app().await;
    let (event, categories) = open_sale(&app, small_sale(1000, 1, 1, 100)).await;
    let crowd = app.admin.buyers(40).await;
    let limits = |body: serde_json::Value| {
        app.admin
            .call(reqwest::Method::PUT, "/admin/limits", Some(body))
    };
    let (status, body) = limits(json!({"orders_ip": {"algo": "token_bucket", "rate": 0}})).await;
    assert_eq!(status, 400, "an unusable limit is refused: {body}");

    // One purchase per client address per minute. Each probe comes from a new buyer,
    // so no per-user limit can trip: the first 429 is the override's.
    let changed = Instant::now();
    let (status, body) =
        limits(json!({"orders_ip": {"algo": "fixed_window", "limit": 1, "window_s": 60}})).await;
    assert_eq!(status, 200, "{body}");
    let body_of = json!({"category_id": categories[0], "quantity": 1});
    let mut took = None;
    for buyer in &crowd[..30] {
        let resp = app
            .http
            .post(format!("{}/api/events/{event}/orders", app.edge_url))
            .bearer_auth(&buyer.token)
            .header("Idempotency-Key", "probe")
            .json(&body_of)
            .send()
            .await
            .unwrap();
        if resp.status() == 429 {
            let retry: u64 = resp.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!((1..=60).contains(&retry), "Retry-After {retry}");
            let body: serde_json::Value = resp.json().await.unwrap();
            assert_eq!(body["error"]["code"], "RATE_LIMITED");
            took = Some(changed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = took.expect("the new limit never applied within 3 s");
    // One request passes the new window before the next is refused: allow its 100 ms.
    assert!(
        took <= Duration::from_millis(1_100),
        "the changed limit applied after {took:?}"
    );

    // Back to nginx.conf's default: the next buyer gets through again.
    let (status, _) = limits(json!({"orders_ip": null})).await;
    assert_eq!(status, 200);
    let restored = eventually(Duration::from_secs(3), || async {
        let buyer = &crowd[30 + (rand_key() % 10) as usize];
        let (status, _) = app
            .buy(
                event,
                buyer,
                &format!("after{}", rand_key()),
                body_of.clone(),
            )
            .await;
        status == 202
    })
    .await;
    assert!(restored, "the default limit did not come back");
}

fn rand_key() -> u64 {
    rand::random::<u64>()
}

#[tokio::test]
async fn two_thousand_concurrent_buyers_take_exactly_the_hundred_seats() {
    let _heavy = stampede_e2e::heavy().await;
    let (app, _edge) = stack_app().await;
    let (event, categories) = open_sale(&app, small_sale(1, 10, 10, 2)).await;
    let seated = categories[1];
    let buyers = app.admin.buyers(2000).await;
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(256));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, b) in buyers.into_iter().enumerate() {
        let (http, url, gate) = (app.http.clone(), app.edge_url.clone(), gate.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let q = 1 + (i % 2) as u64;
            let body = json!({"category_id": seated, "quantity": q});
            let (status, answer) =
                stampede_e2e::purchase(&http, &url, event, &b.token, "k", body).await;
            (b.user_id, q, status, answer)
        });
    }
    let mut units = 0;
    let mut seats_taken = HashSet::new();
    let mut admitted = 0u64;
    while let Some(done) = tasks.join_next().await {
        let (_, q, status, answer) = done.unwrap();
        match status {
            202 => {
                admitted += 1;
                units += q;
                let seats = answer["seats"].as_array().unwrap();
                assert_eq!(seats.len() as u64, q);
                for s in seats {
                    assert!(
                        seats_taken.insert(s.as_str().unwrap().to_owned()),
                        "seat {s} held twice"
                    );
                }
            }
            409 => assert_eq!(answer["error"]["code"], "SOLD_OUT", "{answer}"),
            other => panic!("unexpected {other}: {answer}"),
        }
    }
    assert_eq!(units, 100);
    assert_eq!(seats_taken.len(), 100);
    let mut r = app.redis.clone();
    let stock: i64 = r
        .hget(app.keys().stock(Bucket::only(event)), seated)
        .await
        .unwrap();
    assert_eq!(stock, 0);
    let seat_map: HashMap<String, String> = r
        .hgetall(app.keys().seats(Bucket::only(event), seated))
        .await
        .unwrap();
    assert!(
        seat_map
            .values()
            .all(|s| matches!(SeatState::parse(s), Some(SeatState::Locked(_)))),
        "every seat locked"
    );
    let held: HashMap<u64, u64> = r
        .hgetall(app.keys().held(Bucket::only(event)))
        .await
        .unwrap();
    assert!(
        held.values().all(|n| *n <= 2),
        "nobody over the per-user limit"
    );
    assert_eq!(held.values().sum::<u64>(), 100);
    // The stack's core runs the order pipeline: every admitted purchase becomes an order.
    let settled = eventually(Duration::from_secs(30), || async {
        let (units, orders) = stampede_e2e::ordered_units(&app.mysql, event).await;
        let backlog: u64 = app
            .redis
            .clone()
            .xlen(app.keys().order_stream(Bucket::only(event)))
            .await
            .unwrap();
        let remain = stampede_e2e::scalar(
            &app.mysql,
            &format!("SELECT remain FROM ticket_category WHERE id = {seated}"),
        )
        .await;
        units == 100 && orders == admitted && backlog == 0 && remain == 0
    })
    .await;
    assert!(
        settled,
        "the 100 units did not all become orders, synced, within 30 s"
    );
}

/// A purchase the edge refuses from memory never meets the rate limits: one buyer
/// pressing "buy" ten times within a second on a sold-out sale hears SOLD_OUT ten times,
/// where the same ten presses on a sale still selling meet the per-user limit (5 a
/// second, nginx.conf's default) and some get 429.
#[tokio::test]
async fn a_sold_out_answer_comes_before_the_rate_limits() {
    let (app, _edge) = stack_app().await;
    let (event, categories) = open_sale(&app, small_sale(1, 1, 1, 2)).await;
    let (ga, seated) = (categories[0], categories[1]);
    let buyers = app.admin.buyers(4).await;
    for (buyer, category) in [(&buyers[0], ga), (&buyers[1], seated)] {
        let (status, body) = app
            .buy(
                event,
                buyer,
                "one",
                json!({"category_id": category, "quantity": 1}),
            )
            .await;
        assert_eq!(status, 202, "{body}");
    }
    let learned = eventually(Duration::from_secs(10), || async {
        let (status, body) = app
            .buy(
                event,
                &buyers[3],
                &format!("probe{}", rand_key()),
                json!({"category_id": ga, "quantity": 1}),
            )
            .await;
        status == 409 && body["error"]["code"] == "SOLD_OUT"
    })
    .await;
    assert!(learned, "the edge never answered SOLD_OUT");
    stampede_e2e::edge_workers_catch_up().await;
    // Ten presses at once (each its own key), so that they fall within the limit's window
    // whatever the machine's speed.
    let presses = |event: u64, category: u64| {
        let (http, url, token) = (
            app.http.clone(),
            app.edge_url.clone(),
            buyers[2].token.clone(),
        );
        async move {
            let mut set = tokio::task::JoinSet::new();
            for n in 0..10 {
                let (http, url, token) = (http.clone(), url.clone(), token.clone());
                set.spawn(async move {
                    let key = format!("press{n}-{}", rand_key());
                    let body = json!({"category_id": category, "quantity": 1});
                    let (status, body) = purchase(&http, &url, event, &token, &key, body).await;
                    format!("{status} {}", body["error"]["code"].as_str().unwrap_or(""))
                });
            }
            set.join_all().await
        }
    };
    let sold_out = presses(event, ga).await;
    assert!(
        sold_out.iter().all(|a| a == "409 SOLD_OUT"),
        "a sold-out sale answered {sold_out:?}"
    );

    // The control: the same presses on a sale with stock meet the per-user limit.
    let (open, open_categories) = open_sale(&app, small_sale(100, 1, 1, 100)).await;
    let selling = presses(open, open_categories[0]).await;
    assert!(
        selling.iter().any(|a| a == "429 RATE_LIMITED"),
        "ten presses within a second met no limit: {selling:?}"
    );
}

/// A sale published ahead is answered NOT_OPEN from its entry in the sales index, which
/// the edge reads every tick; its flags and settings are read about once a second, a live
/// sale's every tick (each listed sale was read every tick: with sales published days
/// ahead, 20 keys a second each, per edge).
#[tokio::test]
async fn the_edge_reads_a_sale_published_ahead_about_once_a_second_and_a_live_one_every_tick() {
    let (app, _edge) = stack_app().await;
    let (live, _) = open_sale(&app, small_sale(5, 1, 1, 2)).await;
    let mut later = small_sale(5, 1, 1, 2);
    later["sale_start"] = json!("2031-01-01T00:00:00Z");
    let (ahead, categories) = app.admin.create_event(later).await;
    app.admin.publish(ahead).await;
    let buyer = app.admin.buyers(1).await.remove(0);
    let not_open = eventually(Duration::from_secs(3), || async {
        let body = json!({"category_id": categories[0], "quantity": 1});
        let (status, body) = app.buy(ahead, &buyer, "early", body).await;
        status == 403 && body["error"]["code"] == "NOT_OPEN"
    })
    .await;
    assert!(not_open, "a sale published ahead is not open");

    // Each sale's flags are one key of its own: count the edge's reads of each in 4 s.
    let ((), seen) = monitored(
        |line| line.to_ascii_lowercase().contains("\"hgetall\"") && line.contains(":soldout\""),
        tokio::time::sleep(Duration::from_secs(4)),
    )
    .await;
    let reads = |event: u64| {
        let key = format!("\"{}\"", app.keys().sold_out(event));
        seen.iter().filter(|l| l.contains(&key)).count()
    };
    let (live_reads, ahead_reads) = (reads(live), reads(ahead));
    // Every tick (200 ms) would be about 20 reads each; once a second about 4 for the
    // sale published ahead. A slow machine stretches the ticks (fewer live reads); a
    // leader that started before the last one's snapshot was out reads it once more.
    assert!(ahead_reads >= 1, "the sale published ahead is still read");
    assert!(
        ahead_reads <= 6 || 2 * ahead_reads <= live_reads,
        "in 4 s the sale published ahead's flags were read {ahead_reads} times, the live one's {live_reads}"
    );
    // Retired once over (a minute after the close): not left listed for later tests.
    for event in [live, ahead] {
        let (status, body) = app
            .admin
            .post(&format!("/admin/events/{event}/close"), json!({}))
            .await;
        assert_eq!(status, 200, "{body}");
    }
}

/// A sale with one category sold out and another selling: the edge refuses a purchase of
/// the sold-out one however its body spells the category as the core reads it (a number
/// with an exponent, a key with an escape), not only as plain digits; before, those
/// passed the edge's flag and spent the buyer's and the event's limits at the core.
#[tokio::test]
async fn the_edge_reads_the_category_as_the_core_does_whatever_the_spelling() {
    let (app, _edge) = stack_app().await;
    let (event, categories) = open_sale(&app, small_sale(1, 1, 2, 2)).await;
    let ga = categories[0];
    let buyers = app.admin.buyers(4).await;
    let body = |cid: u64| json!({"category_id": cid, "quantity": 1});
    assert_eq!(app.buy(event, &buyers[0], "a", body(ga)).await.0, 202);
    let learned = eventually(Duration::from_secs(10), || async {
        let before = core_answers(&app, 409).await;
        let (status, _) = app.buy(event, &buyers[1], "b", body(ga)).await;
        status == 409 && core_answers(&app, 409).await == before
    })
    .await;
    assert!(learned, "the edge never answered SOLD_OUT itself");
    let port = Stack::from_env().edge_port;
    let path = format!("/api/events/{event}/orders");
    let spellings = [
        format!(r#"{{"category_id":{ga}0e-1,"quantity":1}}"#),
        format!(r#"{{"\u0063ategory_id":{ga},"quantity":1}}"#),
        format!(r#"{{"category_id":{ga}.0,"quantity":1}}"#),
    ];
    let auth = format!("Bearer {}", buyers[2].token);
    for raw in &spellings {
        // Other tests' 409s may land on the core meanwhile: answered by the edge when one
        // try leaves the core's count as it was (never, when the core answers each).
        let tries = std::sync::atomic::AtomicU32::new(0);
        let by_edge = eventually(Duration::from_secs(5), || async {
            let key = format!(
                "spelled-{}",
                tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            let headers = [
                ("Authorization", auth.as_str()),
                ("Idempotency-Key", key.as_str()),
                ("Content-Type", "application/json"),
            ];
            let before = core_answers(&app, 409).await;
            let a = raw_request(port, "POST", &path, &headers, raw).await;
            assert_eq!(a.status, 409, "{raw}: {a:?}");
            assert_eq!(a.json()["error"]["code"], "SOLD_OUT", "{raw}: {a:?}");
            core_answers(&app, 409).await == before
        })
        .await;
        assert!(
            by_edge,
            "{raw}: answered by the core each time, not by the edge"
        );
    }
    // The category still selling goes on to the core, spelled either way.
    let seated = categories[1];
    let auth = format!("Bearer {}", buyers[3].token);
    let headers = [
        ("Authorization", auth.as_str()),
        ("Idempotency-Key", "seated"),
        ("Content-Type", "application/json"),
    ];
    let raw = format!(r#"{{"\u0063ategory_id":{seated},"quantity":1}}"#);
    let a = raw_request(port, "POST", &path, &headers, &raw).await;
    assert_eq!(a.status, 202, "{raw}: {a:?}");
}

/// Buyers admitted through another edge — here straight through the core, so this edge
/// never saw their keys — each with key `elsewhere-<i>`; their first answers.
async fn admitted_elsewhere(
    app: &stampede_e2e::StackApp,
    event: u64,
    buyers: &[stampede_e2e::Buyer],
    body: &serde_json::Value,
) -> Vec<serde_json::Value> {
    let core = format!("http://127.0.0.1:{}", Stack::from_env().core_port);
    let mut first = Vec::new();
    for (i, b) in buyers.iter().enumerate() {
        let (status, answer) = purchase(
            &app.http,
            &core,
            event,
            &b.token,
            &format!("elsewhere-{i}"),
            body.clone(),
        )
        .await;
        assert_eq!(status, 202, "{answer}");
        first.push(answer);
    }
    first
}

/// Whether each buyer's retry through the edge (same key, same body) is answered, within
/// ten seconds, with the 202 and the order number of its first answer.
async fn retries_answered_as_first(
    app: &stampede_e2e::StackApp,
    event: u64,
    buyers: &[stampede_e2e::Buyer],
    body: &serde_json::Value,
    first: &[serde_json::Value],
) {
    for (i, b) in buyers.iter().enumerate() {
        let key = format!("elsewhere-{i}");
        let deadline = Instant::now() + Duration::from_secs(10);
        let last = loop {
            let answer = app.buy(event, b, &key, body.clone()).await;
            if answer.0 == 202 || Instant::now() > deadline {
                break answer;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(last.0, 202, "buyer {i}'s retry through the edge: {last:?}");
        assert!(first[i]["request_id"].is_string(), "{}", first[i]);
        assert_eq!(last.1["request_id"], first[i]["request_id"], "buyer {i}");
    }
}

/// A purchase admitted through another edge (or this one before a restart), retried
/// through this edge after the sale sold out, hears its 202 again, not SOLD_OUT: once the
/// edge refuses the sale whole it knows every key the sale admitted (admitted.lua), here
/// among 5 000 others.
/// Nobody else gets past the flag with those keys: not the buyer with a new key, not
/// another buyer with theirs.
#[tokio::test]
async fn a_purchase_admitted_elsewhere_and_retried_after_the_sell_out_hears_its_202() {
    let (app, _edge) = stack_app().await;
    let (event, categories) = open_sale(&app, crate::buckets::bucketed_sale(2, 1, 1)).await;
    let body = json!({"category_id": categories[0], "quantity": 1});
    let buyers = app.admin.buyers(3).await;
    let first = admitted_elsewhere(&app, event, &buyers[..2], &body).await;
    // Five thousand other buyers' records, as a big sale leaves: the edge copies them in
    // pages, over more than one refresh, and must not miss these two among them.
    let idem = app.keys().idempotency(Bucket::only(event));
    let mut redis = app.redis.clone();
    for chunk in (0..5000u64).collect::<Vec<_>>().chunks(500) {
        let fields: Vec<(String, &str)> = chunk
            .iter()
            .map(|i| (format!("{}:filler", 900_000_000 + i), "0|filler|"))
            .collect();
        let _: () = redis.hset_multiple(&idem, &fields).await.unwrap();
    }
    assert!(
        crate::edge::the_edge_says_sold_out(
            &app,
            event,
            &buyers[2],
            &body,
            Duration::from_secs(10)
        )
        .await,
        "the edge never said SOLD_OUT"
    );
    retries_answered_as_first(&app, event, &buyers[..2], &body, &first).await;
    for (who, key) in [(&buyers[0], "a-new-key"), (&buyers[1], "elsewhere-0")] {
        let (status, answer) = app.buy(event, who, key, body.clone()).await;
        assert_eq!(status, 409, "{answer}");
        assert_eq!(answer["error"]["code"], "SOLD_OUT", "{answer}");
    }
}

/// In a sale still selling, a purchase admitted through one edge and retried through
/// another after its category sold out hears its 202 again, not SOLD_OUT: each edge
/// publishes the keys it had a 202 for to the sale's stream, and every edge copies the
/// stream of a sale with a category sold out (admitted.lua) — from its start for an
/// edge started after the first purchase was published, then as it grows for the next.
/// Nobody else gets past the flag.
#[tokio::test]
async fn a_purchase_retried_through_another_edge_after_its_category_sold_out_hears_its_202() {
    let (app, _edge) = stack_app().await;
    let stack = Stack::from_env();
    let (event, categories) = open_sale(
        &app,
        json!({
            "title": "Three stands", "venue": "Loopback", "show_time": "2031-06-01T20:00:00Z",
            "sale_start": "2020-01-01T00:00:00Z", "sale_end": "2031-06-01T12:00:00Z",
            "per_user_limit": 2, "pay_timeout_s": 900,
            "categories": [
                {"name": "C", "price_cents": 500, "quantity": 1},
                {"name": "A", "price_cents": 500, "quantity": 1},
                {"name": "B", "price_cents": 500, "quantity": 10},
            ],
        }),
    )
    .await;
    let of = |c: u64| json!({"category_id": c, "quantity": 1});
    let buyers = app.admin.buyers(3).await;
    // The first purchase, published before the second edge starts.
    let (status, first_c) = app.buy(event, &buyers[0], "c", of(categories[0])).await;
    assert_eq!(status, 202, "{first_c}");
    let stream = app.keys().passed_keys(event);
    let published = eventually(Duration::from_secs(10), || async {
        let n: u64 = app.redis.clone().xlen(&stream).await.unwrap();
        n > 0
    })
    .await;
    assert!(published, "the edge never published the admitted key");
    let second = stampede_e2e::OwnEdge::start(&stack, stack.redis_port);
    let through_second = |who: usize, key: &'static str, c: u64| {
        let (app, second, buyers) = (&app, &second, &buyers);
        async move {
            purchase(
                &app.http,
                &second.url(),
                event,
                &buyers[who].token,
                key,
                of(c),
            )
            .await
        }
    };
    // Until `who`'s retry of `key` through the second edge is answered 202 (or 10 s).
    let retried = |who: usize, key: &'static str, c: u64| {
        let through_second = &through_second;
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let answer = through_second(who, key, c).await;
                if answer.0 == 202 || Instant::now() > deadline {
                    break answer;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    for (n, (who, key, category)) in [(0, "c", categories[0]), (1, "a", categories[1])]
        .into_iter()
        .enumerate()
    {
        let first = if n == 0 {
            first_c.clone()
        } else {
            let (status, first) = app.buy(event, &buyers[who], key, of(category)).await;
            assert_eq!(status, 202, "{first}");
            first
        };
        // Every worker of the second edge refuses the category now (another buyer).
        let refused = crate::edge::the_edge_on_says_sold_out(
            &app,
            second.port,
            event,
            &buyers[2],
            &of(category),
            Duration::from_secs(10),
        )
        .await;
        assert!(
            refused,
            "the second edge never said SOLD_OUT for category {n}"
        );
        let (status, again) = retried(who, key, category).await;
        assert!(first["request_id"].is_string(), "{first}");
        assert_eq!(
            (status, &again["request_id"]),
            (202, &first["request_id"]),
            "the retry of category {n}'s purchase through the second edge: {again}"
        );
    }
    // Past the flag only with a key that was admitted: not another buyer with that
    // key, not the buyer with a new one.
    for (who, key) in [(2, "c"), (0, "c-again")] {
        let (status, a) = through_second(who, key, categories[0]).await;
        assert_eq!(
            (status, a["error"]["code"].as_str()),
            (409, Some("SOLD_OUT")),
            "{a}"
        );
    }
}

/// The same after a close, for a sale over sixteen buckets, the most an event may have
/// (the edge finds each bucket's records by the tags the core gives them, and their
/// count in the event's meta, which the close writes for an event loaded without it).
#[tokio::test]
async fn a_purchase_admitted_elsewhere_and_retried_after_the_close_hears_its_202() {
    let (app, _edge) = stack_app().await;
    let (event, categories) = open_sale(&app, crate::buckets::bucketed_sale(64, 1, 16)).await;
    let body = json!({"category_id": categories[0], "quantity": 1});
    let buyers = app.admin.buyers(7).await;
    let homes: HashSet<u16> = buyers[..6]
        .iter()
        .map(|b| Bucket::of_buyer(event, 16, stampede_core::domain::UserId(b.user_id)).index)
        .collect();
    assert!(homes.len() > 1, "six buyers in one bucket: {homes:?}");
    let first = admitted_elsewhere(&app, event, &buyers[..6], &body).await;
    // As an event loaded before the meta had its bucket count: the close writes it.
    let mut redis = app.redis.clone();
    let _: () = redis
        .hdel(app.keys().event_meta(event), "buckets")
        .await
        .unwrap();
    app.admin.close(event).await;
    let closed = eventually(Duration::from_secs(10), || async {
        app.buy(event, &buyers[6], "late", body.clone()).await.0 == 403
    })
    .await;
    assert!(closed, "the edge never said NOT_OPEN");
    stampede_e2e::edge_workers_catch_up().await;
    retries_answered_as_first(&app, event, &buyers[..6], &body, &first).await;
    let (status, answer) = app.buy(event, &buyers[0], "a-new-key", body.clone()).await;
    assert_eq!(status, 403, "{answer}");
    assert_eq!(answer["error"]["code"], "NOT_OPEN", "{answer}");
}

/// A purchase admitted through another edge and retried through this one just as the
/// sale's window ends hears its 202, never NOT_OPEN: the edge's workers refuse a sale past
/// its end by their own clock only once the snapshot they answer from says every bucket's
/// records were counted after the end with no copy under way (admitted.copied_since);
/// until then the core answers (a refresh or two). Sixty buyers admitted through the core, each retried once through
/// the edge (the per-user limit), one every 30 ms from 0.3 s before the end to 1.5 s
/// after it. New keys after that hear NOT_OPEN from the edge itself (the keys copied,
/// well before the 2 s the edge waits at most).
#[tokio::test]
async fn a_purchase_admitted_elsewhere_and_retried_as_the_window_ends_hears_its_202() {
    let (app, _edge) = stack_app().await;
    // Room for a slow machine to create, publish and admit the sixty before the end.
    let end = chrono::Utc::now() + chrono::Duration::seconds(12);
    let mut sale = crate::buckets::bucketed_sale(100, 1, 1);
    sale["sale_end"] = json!(end.to_rfc3339());
    let (event, categories) = open_sale(&app, sale).await;
    let body = json!({"category_id": categories[0], "quantity": 1});
    let buyers = app.admin.buyers(61).await;
    let first = admitted_elsewhere(&app, event, &buyers[..60], &body).await;
    let left = end - chrono::Utc::now();
    assert!(
        left > chrono::Duration::milliseconds(500),
        "the sixty were admitted too late: {left} before the end"
    );
    let mut heard = Vec::new();
    for (i, b) in buyers[..60].iter().enumerate() {
        let at = end + chrono::Duration::milliseconds(30 * i as i64 - 300);
        if let Ok(wait) = (at - chrono::Utc::now()).to_std() {
            tokio::time::sleep(wait).await;
        }
        let sent = (chrono::Utc::now() - end).num_milliseconds();
        let (status, answer) = app
            .buy(event, b, &format!("elsewhere-{i}"), body.clone())
            .await;
        let as_first = status == 202 && answer["request_id"] == first[i]["request_id"];
        heard.push((sent, status, as_first, answer));
    }
    let after_end = heard.iter().filter(|h| h.0 >= 0).count();
    assert!(after_end >= 40, "{after_end} retries sent after the end");
    let wrong: Vec<_> = heard.iter().filter(|h| !h.2).collect();
    assert!(
        wrong.is_empty(),
        "retries not answered with their first 202 (ms past the end, status, answer): {wrong:?}"
    );
    let core_refused = core_answers(&app, 403).await;
    for i in 0..4 {
        let (status, answer) = app
            .buy(event, &buyers[60], &format!("late-{i}"), body.clone())
            .await;
        assert_eq!(status, 403, "{answer}");
        assert_eq!(answer["error"]["code"], "NOT_OPEN", "{answer}");
    }
    let at = (chrono::Utc::now() - end).num_milliseconds();
    assert_eq!(
        core_answers(&app, 403).await,
        core_refused,
        "new keys {at} ms past the end reached the core"
    );
}
