//! The schema's upgrade path: a database an older core migrated, holding orders, is
//! brought to the current schema by the core's own migrations without losing,
//! renumbering or duplicating a row — and a migration cut short can be run again.

use mysql_async::prelude::*;
use rand::Rng;
use stampede_core::infra::mysql::{MIGRATIONS, migrate, migrations};
use stampede_e2e::{Stack, create_database, drop_database, scalar, test_shards};

/// The first migration an older core did not have: it re-keys stock_log and the items.
const FIRST_NEW: &str = "stock_log_by_order";

#[tokio::test]
async fn a_database_with_orders_from_before_the_rekeying_upgrades_in_place() {
    let stack = Stack::from_env();
    let tag: u64 = rand::thread_rng().gen_range(0..u64::from(u32::MAX));
    let database = format!("stampede_t_{tag}");
    let server = mysql_async::Pool::new(stack.mysql_url("stampede").as_str());
    create_database(&server, &database).await;
    let db = mysql_async::Pool::new(stack.mysql_url(&database).as_str());
    let shards = test_shards();

    // The schema as the core before V20 left it.
    let all = migrations(shards).unwrap();
    let older = all.iter().position(|m| m.name() == FIRST_NEW).unwrap();
    refinery::Runner::new(&all[..older])
        .set_migration_table_name("schema_history")
        .run_async(&mut db.clone())
        .await
        .unwrap();
    let mut conn = db.get_conn().await.unwrap();
    // Order 1000 with two items, 1001 with one (ids 1, 2, 3); its stock_log rows: one
    // unsynced an hour old, one synced, and an expired reservation's; then a batch with
    // one order cancelled before its sync, one the guards refused whole, and one over two
    // categories (a train order of three segment-units in the second).
    conn.query_drop(
        "INSERT INTO order_item_0 (order_no, category_id, row_no, col_no, price_cents) VALUES \
         (1000, 7, 1, 1, 500), (1000, 7, 1, 2, 500), (1001, 7, NULL, NULL, 500)",
    )
    .await
    .unwrap();
    conn.query_drop(
        "INSERT INTO stock_log (order_no, event_id, category_id, quantity, batch_id, status, \
         synced, seq, created_at) VALUES \
         (1000, 3, 7, 2, 'b-old', 'COMMITTED', 0, 1, UTC_TIMESTAMP(3) - INTERVAL 1 HOUR), \
         (1001, 3, 7, 1, 'b-synced', 'COMMITTED', 1, 2, UTC_TIMESTAMP(3)), \
         (1002, 3, 7, 0, 'expired', 'EXPIRED', 1, NULL, UTC_TIMESTAMP(3)), \
         (1003, 3, 7, 1, 'b-part', 'COMMITTED', 0, 3, UTC_TIMESTAMP(3)), \
         (1004, 3, 7, 2, 'b-part', 'CANCELLED', 1, 4, UTC_TIMESTAMP(3)), \
         (1005, 3, 8, 0, 'b-refused', 'REFUSED', 1, NULL, UTC_TIMESTAMP(3)), \
         (1006, 3, 7, 1, 'b-two', 'COMMITTED', 0, 5, UTC_TIMESTAMP(3)), \
         (1007, 3, 8, 3, 'b-two', 'COMMITTED', 0, 6, UTC_TIMESTAMP(3))",
    )
    .await
    .unwrap();
    drop(conn);

    // Up to V22 first, which is then run again as if cut short (INSERT IGNORE: its
    // batches once); the core's start-up applies the rest.
    let v22 = all.iter().position(|m| m.name() == "stock_batch").unwrap();
    refinery::Runner::new(&all[..=v22])
        .set_migration_table_name("schema_history")
        .run_async(&mut db.clone())
        .await
        .unwrap();
    let sql = all[v22].sql().unwrap().to_owned();
    db.get_conn().await.unwrap().query_drop(sql).await.unwrap();
    migrate(&db, shards).await.unwrap();

    let mut conn = db.get_conn().await.unwrap();
    let items: Vec<(u64, u64, Option<u16>)> = conn
        .query("SELECT order_no, line, col_no FROM order_item_0 ORDER BY order_no, line")
        .await
        .unwrap();
    assert_eq!(
        items,
        vec![(1000, 1, Some(1)), (1000, 2, Some(2)), (1001, 3, None)],
        "every item kept, its old id its line"
    );
    let logs: Vec<(u64, String)> = conn
        .query("SELECT order_no, status FROM stock_log ORDER BY order_no")
        .await
        .unwrap();
    assert_eq!(
        logs,
        vec![
            (1000, "COMMITTED".into()),
            (1001, "COMMITTED".into()),
            (1002, "EXPIRED".into()),
            (1003, "COMMITTED".into()),
            (1004, "CANCELLED".into()),
            (1005, "REFUSED".into()),
            (1006, "COMMITTED".into()),
            (1007, "COMMITTED".into())
        ]
    );
    // A REFUSED row from before V25 does not say why: its reason stays unknown (NULL),
    // and so does every other row's.
    let reasons = scalar(
        &db,
        "SELECT COUNT(*) FROM stock_log WHERE reason IS NOT NULL",
    )
    .await;
    assert_eq!(reasons, 0);
    // What was synced is now said per batch (V22, V23): an unsynced batch keeps the units
    // of its live orders to subtract (not those of the order cancelled before the sync,
    // never to be subtracted), a synced one is synced, one refused whole is synced with
    // nothing; the expiry names no batch.
    let batches: Vec<(String, u64, u64, u32, u32, u8)> = conn
        .query(
            "SELECT batch_id, category_id, event_id, units, orders, synced FROM stock_batch \
             ORDER BY batch_id, category_id",
        )
        .await
        .unwrap();
    assert_eq!(
        batches,
        vec![
            ("b-old".into(), 7, 3, 2, 1, 0),
            ("b-part".into(), 7, 3, 1, 1, 0),
            ("b-refused".into(), 8, 3, 0, 0, 1),
            ("b-synced".into(), 7, 3, 1, 1, 1),
            ("b-two".into(), 7, 3, 1, 1, 0),
            ("b-two".into(), 8, 3, 3, 1, 0)
        ]
    );
    let mut unsynced = stampede_core::catalog::unsynced_units(&db, 3)
        .await
        .unwrap();
    unsynced.sort_unstable();
    assert_eq!(unsynced, vec![(7, 4), (8, 3)]);
    // A new order numbers its items from 0: no clash with the old ids.
    conn.query_drop(
        "INSERT INTO order_item_0 (order_no, line, category_id, price_cents) VALUES \
         (1003, 0, 7, 500), (1003, 1, 7, 500)",
    )
    .await
    .unwrap();
    // The order number still takes stock_log's one slot: the expiry's INSERT IGNORE
    // changes nothing, a second row for an order is refused.
    conn.query_drop(
        "INSERT IGNORE INTO stock_log (order_no, event_id, category_id, quantity, batch_id, \
         status) VALUES (1002, 3, 7, 0, 'expired', 'EXPIRED')",
    )
    .await
    .unwrap();
    assert_eq!(conn.affected_rows(), 0);
    let twice = conn
        .query_drop(
            "INSERT INTO stock_log (order_no, event_id, category_id, quantity, batch_id, status) \
             VALUES (1000, 3, 7, 2, 'b-again', 'COMMITTED')",
        )
        .await;
    assert!(
        matches!(&twice, Err(mysql_async::Error::Server(e)) if e.code == 1062),
        "{twice:?}"
    );
    drop(conn);
    // The outbox still finds the unsynced batch, by its age.
    let stale = stampede_core::stock_sync::outbox::stale_batches(&db, 60, 10)
        .await
        .unwrap();
    assert_eq!(stale, vec![("b-old".to_owned(), 3)]);

    // A run cut short is run again: each re-keying migration, and those dropping the
    // flag and the batch index, once more by hand, changes nothing; and the core's
    // start-up finds nothing left to apply. (V22 is run again only when cut short
    // itself, before V23.)
    for name in [
        "V20__stock_log_by_order",
        "V21__order_rows_by_order",
        "V23__stock_log_unflagged",
        "V24__stock_log_batch_index",
        "V25__stock_log_reason",
    ] {
        let sql = all
            .iter()
            .find(|m| format!("V{}__{}", m.version(), m.name()) == name)
            .and_then(|m| m.sql())
            .unwrap()
            .to_owned();
        assert!(MIGRATIONS.iter().any(|(n, _)| *n == name));
        db.get_conn().await.unwrap().query_drop(sql).await.unwrap();
    }
    migrate(&db, shards).await.unwrap();
    assert_eq!(
        scalar(&db, "SELECT COUNT(*) FROM order_item_0").await,
        5,
        "the items as before the re-run"
    );
    assert_eq!(scalar(&db, "SELECT COUNT(*) FROM stock_log").await, 8);
    assert_eq!(scalar(&db, "SELECT COUNT(*) FROM stock_batch").await, 6);
    db.disconnect().await.ok();
    drop_database(&server, &database).await;
}
