//! SQL over the tests' databases: the order shards, units ordered, one number.

use mysql_async::prelude::*;

/// The order shards of the tests' cores: the configuration's default.
pub fn test_shards() -> u32 {
    stampede_core::Settings::defaults().mysql.order_shards
}

/// `select` over every order shard of the tests' cores, as one UNION ALL; `{orders}` and
/// `{items}` in it stand for the shard's tables (the core's own builder).
pub fn over_shards(select: &str) -> String {
    stampede_core::order_tables::over_shards(test_shards(), select)
}

/// The orders table (the shard) holding `order_no` in the tests' databases.
pub fn orders_table_of(order_no: u64) -> String {
    use stampede_core::order_tables::{orders, shard_of};
    orders(shard_of(order_no, test_shards()))
}

/// Sets `assignment` (`status = 'PAID'`) on one order by hand; it must be there.
pub async fn update_order(mysql: &mysql_async::Pool, order_no: u64, assignment: &str) {
    let mut conn = mysql.get_conn().await.unwrap();
    conn.exec_drop(
        format!(
            "UPDATE {} SET {assignment} WHERE order_no = ?",
            orders_table_of(order_no)
        ),
        (order_no,),
    )
    .await
    .unwrap();
    assert_eq!(conn.affected_rows(), 1, "order {order_no}");
}

/// Units in live orders (UNPAID or PAID) over every order shard, of the orders `filter`
/// picks (an SQL condition on the orders table: `event_id = 3`, `category_id = 7`).
pub async fn live_units(mysql: &mysql_async::Pool, filter: &str) -> i64 {
    let union = over_shards(&format!(
        "SELECT quantity FROM {{orders}} WHERE {filter} AND status IN {}",
        stampede_core::order_tables::OrderStatus::LIVE_SQL
    ));
    scalar(
        mysql,
        &format!("SELECT CAST(COALESCE(SUM(quantity), 0) AS SIGNED) FROM ({union}) o"),
    )
    .await
}

/// Units in orders of `event_id` over every order shard, and in how many orders.
pub async fn ordered_units(mysql: &mysql_async::Pool, event_id: u64) -> (u64, u64) {
    let union = over_shards(&format!(
        "SELECT quantity FROM {{orders}} WHERE event_id = {event_id}"
    ));
    let mut conn = mysql.get_conn().await.unwrap();
    let row: Option<(Option<u64>, u64)> = conn
        .query_first(format!(
            "SELECT CAST(SUM(quantity) AS UNSIGNED), COUNT(*) FROM ({union}) o"
        ))
        .await
        .unwrap();
    row.map(|(units, orders)| (units.unwrap_or(0), orders))
        .unwrap_or((0, 0))
}

/// One number from a database.
pub async fn scalar(mysql: &mysql_async::Pool, sql: &str) -> i64 {
    let mut conn = mysql.get_conn().await.unwrap();
    conn.query_first::<Option<i64>, _>(sql)
        .await
        .unwrap()
        .flatten()
        .unwrap_or(0)
}

/// Orders of `event` whose stock sync has not subtracted from `remain` yet (their
/// batch's stock_batch row unsynced). Its own SQL, not the core's `stock_sync::lag`:
/// the tests compare this count with the stats, which report `lag`'s.
pub async fn unsynced_orders(mysql: &mysql_async::Pool, event: u64) -> i64 {
    scalar(
        mysql,
        &format!(
            "SELECT CAST(COALESCE(SUM(orders), 0) AS SIGNED) FROM stock_batch \
             WHERE synced = 0 AND event_id = {event}"
        ),
    )
    .await
}

/// The order numbers of an event's orders, whatever their status, over every shard.
pub async fn order_numbers(
    mysql: &mysql_async::Pool,
    event: u64,
) -> std::collections::HashSet<u64> {
    let union = over_shards(&format!(
        "SELECT order_no FROM {{orders}} WHERE event_id = {event}"
    ));
    mysql
        .get_conn()
        .await
        .unwrap()
        .query::<u64, _>(format!("SELECT order_no FROM ({union}) o"))
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Creates a test's own database (the test stack's account may create those named
/// `stampede…`; the tests use `stampede_t_<random>`).
pub async fn create_database(mysql: &mysql_async::Pool, database: &str) {
    database_statement(mysql, &format!("CREATE DATABASE `{database}`")).await;
}

/// Drops a test's own database (a core process's, when the test is done with it).
pub async fn drop_database(mysql: &mysql_async::Pool, database: &str) {
    database_statement(mysql, &format!("DROP DATABASE `{database}`")).await;
}

async fn database_statement(mysql: &mysql_async::Pool, sql: &str) {
    mysql
        .get_conn()
        .await
        .expect("the test stack's MariaDB answers")
        .query_drop(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}
