//! The local transaction of a batch: its orders, their seats (items), one stock_log row
//! per order and one stock_batch row per category (what stock sync is to subtract), in
//! one MySQL transaction, after the guards (`guards`) have judged each reservation.
//! Idempotent on the order number (orders already there are locked and skipped,
//! reservations turned away before stay turned away), so a replayed batch inserts
//! nothing twice.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{TimeDelta, Utc};
use mysql_async::prelude::*;
use mysql_async::{Conn, IsolationLevel, Pool, TxOpts};

use super::guards::{self, Declined};
use super::reservation::{Batch, Reservation};
use crate::catalog::EventRecord;
use crate::domain::{EventId, OrderNo};
use crate::infra::mysql::{CallTimeout, ServerIdentity};
use crate::order_tables::{self, shard_of_order};

/// Why a batch did not commit.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// MySQL refused the data (a constraint, a bad value): retrying will not help.
    #[error("MySQL refused the batch: {0}")]
    Rejected(String),
    /// Certainly not committed (down, deadlock, timeout before COMMIT): retry later.
    #[error("not committed: {0}")]
    NotCommitted(String),
    /// The server refused a statement for reasons of its own, not the rows' (read-only,
    /// a table missing, access denied, shutting down, the disk full): not committed,
    /// retried. A batch refused so several times in a row is tried order by order, so
    /// that the orders the cause does not touch (another shard's table) are created.
    #[error("MySQL refused the batch for reasons of its own: {0}")]
    ServerRefused(String),
    /// The connection failed during COMMIT: it may or may not have committed.
    #[error("commit outcome unknown: {0}")]
    Unknown(String),
    /// These reservations were taken before the event's Redis keys were rebuilt, which
    /// counted their units as free: they must never become orders, nor be released.
    #[error("{} reservations predate the rebuild of the event's keys", .0.len())]
    Stale(Vec<OrderNo>),
    /// Redis handed out admission number `.0` again: its state went back in time. The
    /// event's keys must be rebuilt from MySQL; nothing of this batch may be created.
    #[error("Redis reissued admission number {0}: its state went back in time")]
    Rewound(u64),
    /// A unique key refused a row of an attempt that left the reads of earlier attempts
    /// to the keys: the attempt rolled back; the next one reads (never leaves
    /// `create_orders`).
    #[error("a row exists already: {0}")]
    Duplicate(String),
}

/// What a MySQL error means for a batch: refused for its rows, or not committed (and
/// worth another try).
pub(super) fn classify(e: mysql_async::Error) -> PersistError {
    match &e {
        mysql_async::Error::Server(s) if REFUSES_THE_DATA.contains(&s.code) => {
            PersistError::Rejected(e.to_string())
        }
        // Worth another try as it is: a deadlock or lock wait timeout; a duplicate key
        // (another attempt at the same orders committed first, or an expiry took an
        // order number's slot, or Redis handed an admission number out again: the next
        // attempt reads why); 4031, MySQL 8 closing a session idle past its
        // wait_timeout.
        mysql_async::Error::Server(s) if [1213, 1205, 1062, 4031].contains(&s.code) => {
            PersistError::NotCommitted(e.to_string())
        }
        // Every other error of the server's is its own, not the rows': read-only (a
        // virtual IP moved to a replica not yet promoted), shutting down, too many
        // connections, access denied, a table missing, the disk full, a statement
        // interrupted. Taken as refusing the rows, it would release reservations already
        // answered 202; retried, they become orders once the server takes them, or are
        // released at orders.deadline_s.
        mysql_async::Error::Server(_) => PersistError::ServerRefused(e.to_string()),
        _ => PersistError::NotCommitted(e.to_string()),
    }
}

/// Server errors about the rows themselves, which no retry changes: a value out of its
/// column's range or type, a NULL or missing value, a foreign key, a CHECK constraint
/// (MariaDB 4025, MySQL 3819).
const REFUSES_THE_DATA: &[u16] = &[
    1048, // column cannot be null
    1216, 1217, 1451, 1452, // foreign key
    1264, // out of range for the column
    1265, // data truncated
    1292, 1366, // incorrect value
    1364, // no default for a field
    1406, // too long for the column
    1690, // out of range in an expression (an UNSIGNED gone below 0)
    3819, 4025, // CHECK constraint
];

/// Commits; a connection lost during COMMIT leaves the outcome unknown.
async fn commit(tx: mysql_async::Transaction<'_>) -> Result<(), PersistError> {
    tx.commit().await.map_err(|e| match classify(e) {
        PersistError::NotCommitted(m) | PersistError::ServerRefused(m) => PersistError::Unknown(m),
        other => other,
    })
}

/// Takes the event row's shared lock (a rebuild of the event's keys takes it exclusively,
/// so it waits for this transaction and this transaction for it) and returns the
/// reservations admitted under an older generation of the keys.
async fn stale_reservations<'a>(
    tx: &mut mysql_async::Transaction<'_>,
    event_id: EventId,
    reservations: impl IntoIterator<Item = &'a Reservation>,
) -> Result<Vec<OrderNo>, PersistError> {
    let epoch: Option<u64> = tx
        .exec_first(
            "SELECT redis_epoch FROM event WHERE id = ? LOCK IN SHARE MODE",
            (event_id,),
        )
        .await
        .map_err(classify)?;
    let epoch = epoch.ok_or_else(|| PersistError::Rejected(format!("no event {event_id}")))?;
    Ok(reservations
        .into_iter()
        .filter(|r| r.epoch < epoch)
        .map(|r| r.order_no)
        .collect())
}

/// What a committed batch did with its reservations.
#[derive(Debug, Default)]
pub struct Created {
    /// Turned away by the guards (now or in an earlier attempt): never orders.
    pub declined: Vec<(OrderNo, Declined)>,
    /// Expired before (stock_log says so) and not created: to be given back.
    pub expired: Vec<OrderNo>,
    /// Per category, the units MySQL has left after the batch: Redis may offer no more.
    pub room: BTreeMap<u64, i64>,
    /// Orders this attempt inserted (not those an earlier attempt or delivery had).
    pub inserted: usize,
}

/// Creates the batch's orders not yet in MySQL, those the guards let through (see
/// `guards`); the others are recorded as REFUSED in stock_log, so no replay creates
/// them. Err when nothing committed.
///
/// READ COMMITTED: locking reads lock the rows they find and no gaps, so two batches
/// inserting new order numbers (which all land at the end of the key) never deadlock on
/// each other's gap locks. What a gap lock would guard is kept by unique keys (an order
/// number inserted twice fails with a duplicate key, and the next attempt sees it) and
/// by `guards`, which locks every row it judges by (a buyer's hold row that is not there
/// yet by the primary key its insert meets).
///
/// A batch on its first delivery (`Batch::first_delivery`) is first tried without the
/// reads that find earlier attempts (the orders that exist, stock_log's decisions and
/// reissued admission numbers): the unique keys on the order number, on stock_log's
/// order number and on its (event, admission number) refuse any row such a read would
/// have found, the attempt rolls back, and the batch is tried again with every read.
/// Five statements fewer per batch where nothing went wrong, which is every batch but
/// after a crash or a Redis gone back in time.
///
/// Each attempt is given up after `mysql.call_timeout_ms` (MySQL hung, its connection
/// half-open): Unknown, since the cut may have come after COMMIT was sent; its session
/// is killed (its transaction rolled back, unless COMMIT got there first), and the next
/// attempt reads what committed.
pub async fn create_orders(
    pool: &Pool,
    shards: u32,
    event: &EventRecord,
    batch: &Batch,
    limit: &CallTimeout,
) -> Result<Created, PersistError> {
    let bounded = |reads| async move {
        // The connection is held here, not in the attempt: a cut drops the attempt and
        // keeps the connection out of the pool until its session is ended (handed to
        // another task meanwhile, that task's session would be the one killed).
        // Which server the connection reached, read before the transaction: a session
        // is killed on that server only (infra::mysql::end_session).
        let mut held: Option<Conn> = None;
        let mut server: Option<ServerIdentity> = None;
        let began = std::time::Instant::now();
        let outcome = limit
            .within("a batch's transaction", async {
                let conn = held.insert(pool.get_conn().await.map_err(classify)?);
                server = Some(ServerIdentity::of(conn).await.map_err(classify)?);
                attempt(conn, shards, event, batch, reads).await
            })
            .await;
        match outcome {
            Ok(outcome) => outcome,
            Err(cut) => {
                // Its locks (the orders', the category's row) would hold every later
                // batch of the category until MariaDB's wait_timeout. Cut before its
                // server was known, the session had begun nothing.
                if let (Some(conn), Some(server)) = (held, &server) {
                    limit.end_session(conn, server, began).await;
                }
                Err(PersistError::Unknown(cut.to_string()))
            }
        }
    };
    if batch.first_delivery {
        match bounded(Reads::LeftToUniqueKeys).await {
            Err(PersistError::Duplicate(why)) => {
                tracing::warn!(
                    batch = batch.batch_id,
                    why,
                    "a fresh batch met a row that exists already; trying again with every check"
                );
            }
            outcome => return outcome,
        }
    }
    bounded(Reads::All).await
}

/// Whether an attempt reads what earlier attempts left (see [`create_orders`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reads {
    All,
    LeftToUniqueKeys,
}

async fn attempt(
    conn: &mut Conn,
    shards: u32,
    event: &EventRecord,
    batch: &Batch,
    reads: Reads,
) -> Result<Created, PersistError> {
    // An insert a unique key refuses: the reads it skipped would have found the row.
    let inserted = |e: mysql_async::Error| match &e {
        mysql_async::Error::Server(s) if s.code == 1062 && reads == Reads::LeftToUniqueKeys => {
            PersistError::Duplicate(s.message.clone())
        }
        _ => classify(e),
    };
    let mut tx = conn
        .start_transaction(
            TxOpts::default()
                .with_isolation_level(IsolationLevel::ReadCommitted)
                .clone(),
        )
        .await
        .map_err(classify)?;
    let stale = stale_reservations(&mut tx, batch.event_id, &batch.reservations).await?;
    if !stale.is_empty() {
        return Err(PersistError::Stale(stale));
    }
    let mut by_shard: BTreeMap<u32, Vec<&Reservation>> = BTreeMap::new();
    for r in &batch.reservations {
        by_shard
            .entry(shard_of_order(r.order_no, shards))
            .or_default()
            .push(r);
    }
    // The ones a previous attempt created, locked; the others are fresh.
    let mut existing: Vec<(u64, u64)> = Vec::new();
    for (shard, reservations) in by_shard.iter().filter(|_| reads == Reads::All) {
        let numbers: Vec<String> = reservations
            .iter()
            .map(|r| r.order_no.to_string())
            .collect();
        let found: Vec<(u64, u64)> = tx
            .query(format!(
                // By the primary key: (user_id, event_id) also covers these columns, and
                // a scan of it would lock the whole index.
                "SELECT order_no, user_id FROM {} FORCE INDEX (PRIMARY) WHERE order_no IN ({}) FOR UPDATE",
                order_tables::orders(*shard),
                numbers.join(",")
            ))
            .await
            .map_err(classify)?;
        existing.extend(found);
    }
    let mut created = Created::default();
    let mut fresh = Vec::new();
    for r in &batch.reservations {
        if guards::minted_twice(&existing, r) {
            tracing::error!(
                order_no = %r.order_no,
                user_id = %r.user_id,
                "ALARM: order number already belongs to another buyer's order; refusing"
            );
            created.declined.push((r.order_no, Declined::NumberTaken));
        } else if !existing.iter().any(|(no, _)| *no == r.order_no.0) {
            fresh.push(r);
        }
    }
    let history = match reads {
        Reads::All => guards::history(&mut tx, batch.event_id, &fresh).await?,
        Reads::LeftToUniqueKeys => guards::History::default(),
    };
    if let Some(seq) = history.reissued {
        // Redis handed this admission number out again: it went back in time.
        return Err(PersistError::Rewound(seq));
    }
    let before = history.decided;
    // Refused SOLD_OUT by an earlier attempt whose refusal in Redis did not run: its cap
    // (the room left, below) is measured again, or Redis would stay ahead of MySQL.
    let sold_out_before: Vec<u64> = fresh
        .iter()
        .filter(|r| before.get(&r.order_no.0) == Some(&guards::Decided::Refused(Declined::SoldOut)))
        .map(|r| r.category_id.0)
        .collect();
    fresh.retain(|r| match before.get(&r.order_no.0) {
        None => true,
        Some(guards::Decided::Expired) => {
            created.expired.push(r.order_no);
            false
        }
        Some(guards::Decided::Refused(why)) => {
            created.declined.push((r.order_no, *why));
            false
        }
    });
    let verdict = guards::judge(&mut tx, event, fresh, &sold_out_before).await?;
    guards::record(&mut tx, EventId(event.id), &verdict).await?;
    created.room = verdict.room;
    created.inserted = verdict.accepted.len();
    // Formatted once: every order of the batch has the same deadline.
    let deadline = (Utc::now() + TimeDelta::seconds(i64::from(event.pay_timeout_s)))
        .naive_utc()
        .format("%Y-%m-%d %H:%M:%S%.3f")
        .to_string();
    // Each statement's rows are written straight into its text (one string per
    // statement, not one per row then joined: a batch is up to `batch_size` rows).
    let mut logs = String::new();
    let mut accepted: BTreeMap<u32, Vec<&Reservation>> = BTreeMap::new();
    for r in &verdict.accepted {
        accepted
            .entry(shard_of_order(r.order_no, shards))
            .or_default()
            .push(r);
    }
    for (shard, fresh) in accepted {
        let mut orders = String::new();
        let mut items = String::new();
        for r in &fresh {
            let price = event
                .categories
                .iter()
                .find(|c| c.id == r.category_id.0)
                .map(|c| c.price_cents)
                .ok_or_else(|| {
                    PersistError::Rejected(format!(
                        "category {} is not in event {}",
                        r.category_id, event.id
                    ))
                })?;
            let _ = write!(
                row(&mut orders),
                "({},{},{},{},{},{},'{}','{deadline}')",
                r.order_no,
                r.user_id,
                batch.event_id,
                r.category_id,
                r.quantity,
                // A train class's price is per segment (docs/trains.md).
                price * u64::from(r.units()),
                r.order_no,
            );
            let seats = r.seats();
            let (from, to) = r
                .journey
                .map_or(("NULL".to_owned(), "NULL".to_owned()), |j| {
                    (j.from.to_string(), j.to.to_string())
                });
            let price = price * u64::from(r.journey.map_or(1, |j| j.span()));
            // An item is a seat, numbered from 0 in its order: (order_no, line) is their
            // key. An unseated order has none: its row says all there is (category,
            // quantity, amount), and every read of items is a read of seats.
            for (line, (row_no, col)) in seats.into_iter().enumerate() {
                let _ = write!(
                    row(&mut items),
                    "({},{line},{},{row_no},{col},{price},{from},{to})",
                    r.order_no,
                    r.category_id
                );
            }
            let _ = write!(
                row(&mut logs),
                "({},{},{},{},'{}','COMMITTED',NULL,",
                r.order_no,
                batch.event_id,
                r.category_id,
                r.units(),
                batch.batch_id,
            );
            let _ = match r.seq {
                Some(n) => write!(logs, "{n})"),
                None => write!(logs, "NULL)"),
            };
        }
        // Only numbers and our own ids go into this text.
        tx.query_drop(format!(
            "INSERT INTO {} (order_no, user_id, event_id, category_id, quantity, amount_cents, \
             request_id, pay_deadline) VALUES {orders}",
            order_tables::orders(shard),
        ))
        .await
        .map_err(inserted)?;
        if items.is_empty() {
            continue;
        }
        tx.query_drop(format!(
            "INSERT INTO {} (order_no, line, category_id, row_no, col_no, price_cents, \
             from_station, to_station) VALUES {items}",
            order_tables::items(shard),
        ))
        .await
        .map_err(classify)?;
    }
    for (r, why) in &verdict.declined {
        tracing::warn!(order_no = %r.order_no, why = why.reason(), "MySQL refused a reservation Redis admitted");
        // The reason is one of Declined's own codes, never the buyer's text.
        let _ = write!(
            row(&mut logs),
            "({},{},{},0,'{}','REFUSED',{},NULL)",
            r.order_no,
            batch.event_id,
            r.category_id,
            batch.batch_id,
            why.code().map_or("NULL".into(), |c| format!("'{c}'")),
        );
        created.declined.push((r.order_no, *why));
    }
    if !logs.is_empty() {
        tx.query_drop(format!(
            "INSERT INTO stock_log \
             (order_no, event_id, category_id, quantity, batch_id, status, reason, seq) \
             VALUES {logs}"
        ))
        .await
        .map_err(inserted)?;
        tx.query_drop(format!(
            "INSERT INTO stock_batch (batch_id, category_id, event_id, units, orders, synced) VALUES {}",
            stock_batch_rows(batch, &verdict.accepted, &verdict.declined)
        ))
        .await
        .map_err(inserted)?;
    }
    commit(tx).await?;
    Ok(created)
}

/// `rows`, ready for one more row of a multi-row VALUES list.
fn row(rows: &mut String) -> &mut String {
    if !rows.is_empty() {
        rows.push(',');
    }
    rows
}

/// The batch's stock_batch rows: per category of the reservations judged, the units and
/// orders the guards let through (none: nothing for stock sync to do, synced already —
/// the row is there for the check-back). A batch that judged nothing (every reservation
/// created, refused or expired by an earlier attempt) writes none: its check-back
/// answers rollback after the grace, and there is nothing to sync.
fn stock_batch_rows(
    batch: &Batch,
    accepted: &[&Reservation],
    declined: &[(&Reservation, Declined)],
) -> String {
    let mut per_category: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for (r, _) in declined {
        per_category.entry(r.category_id.0).or_default();
    }
    for r in accepted {
        let (units, orders) = per_category.entry(r.category_id.0).or_default();
        *units += u64::from(r.units());
        *orders += 1;
    }
    per_category
        .iter()
        .map(|(category, (units, orders))| {
            format!(
                "('{}',{category},{},{units},{orders},{})",
                batch.batch_id,
                batch.event_id,
                u8::from(*units == 0)
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// What became of a reservation past its deadline.
#[derive(Debug, PartialEq, Eq)]
pub enum Expiry {
    /// Its order exists after all (a slow attempt committed): settle it.
    Created,
    /// Recorded as expired; no attempt can create it any more: release it.
    Expired,
    /// Taken before the event's keys were rebuilt: drop it, never release it.
    Stale,
    /// MySQL turned it away before (a REFUSED row: the worker that committed it never
    /// told Redis), for the reason its row keeps: refuse it, giving no units back, as
    /// a replay of its batch would — for SOLD_OUT with the units its category has left
    /// (the cap, as [`Created::room`]).
    Refused(Declined, Option<i64>),
}

/// Expires a reservation unless its order exists. The EXPIRED stock_log row takes the
/// order number's unique slot, so an attempt still inserting the order collides on it
/// and rolls back; the existence check locks the order's gap, so an attempt that
/// committed first is seen. Either way exactly one of the two wins.
pub async fn expire(
    pool: &Pool,
    shards: u32,
    event_id: EventId,
    r: &Reservation,
) -> Result<Expiry, PersistError> {
    let mut conn = pool.get_conn().await.map_err(classify)?;
    // REPEATABLE READ whatever the server's default: the existence check below must lock
    // the order's gap (READ COMMITTED would let an attempt insert the order meanwhile).
    let mut tx = conn
        .start_transaction(
            TxOpts::default()
                .with_isolation_level(IsolationLevel::RepeatableRead)
                .clone(),
        )
        .await
        .map_err(classify)?;
    if !stale_reservations(&mut tx, event_id, [r]).await?.is_empty() {
        tx.commit().await.map_err(classify)?;
        return Ok(Expiry::Stale);
    }
    let exists: Option<u64> = tx
        .query_first(format!(
            "SELECT order_no FROM {} WHERE order_no = {} FOR UPDATE",
            order_tables::orders(shard_of_order(r.order_no, shards)),
            r.order_no
        ))
        .await
        .map_err(classify)?;
    if exists.is_some() {
        tx.commit().await.map_err(classify)?;
        return Ok(Expiry::Created);
    }
    tx.exec_drop(
        "INSERT IGNORE INTO stock_log (order_no, event_id, category_id, quantity, batch_id, status) \
         VALUES (?, ?, ?, 0, 'expired', 'EXPIRED')",
        (r.order_no, event_id, r.category_id),
    )
    .await
    .map_err(classify)?;
    if tx.affected_rows() == 0 {
        // A row of its own already: REFUSED by the guards (Redis had offered what MySQL
        // did not hold — releasing it would give back units that were never there, and
        // a seat another live order holds), or EXPIRED by an earlier pass. Read after
        // the insert, so the read locks that row, not a gap (a locking read of a missing
        // row first took a gap lock two expiries' inserts deadlocked on: review).
        let logged: Option<(String, Option<String>)> = tx
            .exec_first(
                "SELECT status, reason FROM stock_log WHERE order_no = ? FOR UPDATE",
                (r.order_no,),
            )
            .await
            .map_err(classify)?;
        if let Some((status, reason)) = logged
            && status == "REFUSED"
        {
            let why = Declined::from_code(reason.as_deref());
            // A plain read (no lock): a cancellation since gave its unit back into a
            // bucket, whose restocked count then differs and the cap is not applied.
            let room = match why {
                Declined::SoldOut => tx
                    .exec_first(
                        "SELECT CAST(total AS SIGNED) - CAST(committed AS SIGNED) \
                         FROM ticket_category WHERE id = ?",
                        (r.category_id,),
                    )
                    .await
                    .map_err(classify)?,
                _ => None,
            };
            tx.commit().await.map_err(classify)?;
            return Ok(Expiry::Refused(why, room));
        }
    }
    commit(tx).await?;
    Ok(Expiry::Expired)
}

/// For the broker's check-back: did this batch's transaction commit?
pub async fn batch_committed(pool: &Pool, batch_id: &str) -> anyhow::Result<bool> {
    let mut conn = pool.get_conn().await?;
    let found: Option<u8> = conn
        .exec_first(
            "SELECT 1 FROM stock_batch WHERE batch_id = ? LIMIT 1",
            (batch_id,),
        )
        .await?;
    Ok(found.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{CategoryId, UserId};

    fn reservation(order_no: u64, category: u64, quantity: u32) -> Reservation {
        Reservation {
            entry_id: "0-1".into(),
            order_no: OrderNo(order_no),
            user_id: UserId(order_no),
            category_id: CategoryId(category),
            quantity,
            seats_raw: String::new(),
            admitted_ms: 0,
            epoch: 1,
            seq: None,
            journey: None,
        }
    }

    fn server_error(code: u16) -> PersistError {
        classify(mysql_async::Error::Server(mysql_async::ServerError {
            code,
            message: format!("error {code}"),
            state: "HY000".into(),
        }))
    }

    #[test]
    fn only_errors_about_the_rows_refuse_a_batch_the_servers_own_are_retried() {
        // A CHECK constraint, an UNSIGNED below 0, a value too long: no retry helps.
        for code in [4025, 3819, 1690, 1406, 1264, 1048, 1452] {
            assert!(
                matches!(server_error(code), PersistError::Rejected(_)),
                "{code}"
            );
        }
        // Read-only (--read-only, a replica behind a moved address), shutting down, too
        // many connections, access denied, a table missing, the disk full, interrupted,
        // max_statement_time: the server's own.
        for code in [1290, 1836, 1053, 1040, 1045, 1146, 1021, 1317, 1969] {
            assert!(
                matches!(server_error(code), PersistError::ServerRefused(_)),
                "{code}"
            );
        }
        // A deadlock, a lock wait, a duplicate key, an idle timeout: another try.
        for code in [1213, 1205, 1062, 4031] {
            assert!(
                matches!(server_error(code), PersistError::NotCommitted(_)),
                "{code}"
            );
        }
        assert!(matches!(
            classify(mysql_async::Error::Io(mysql_async::IoError::Io(
                std::io::ErrorKind::BrokenPipe.into()
            ))),
            PersistError::NotCommitted(_)
        ));
    }

    #[test]
    fn a_batch_records_per_category_the_units_let_through_and_a_category_all_refused_as_synced() {
        let (a, b, c) = (
            reservation(1, 7, 1),
            reservation(2, 7, 2),
            reservation(3, 8, 1),
        );
        let batch = Batch {
            event_id: EventId(5),
            batch_id: "1-9".into(),
            reservations: Vec::new(),
            first_delivery: true,
        };
        assert_eq!(
            stock_batch_rows(&batch, &[&a, &b], &[(&c, Declined::SoldOut)]),
            "('1-9',7,5,3,2,0),('1-9',8,5,0,0,1)"
        );
    }
}
