//! The last line of defence (DESIGN.md invariants 1, 3, 4): inside a batch's local
//! transaction, whatever Redis said, MySQL refuses an order that would sell more units
//! than the category has, put a seat in two live orders, or take a buyer past the
//! event's limit. One locking read and one write per table per batch (categories,
//! holds, seats), never one per order: the category rows are hot.

use std::collections::{BTreeMap, HashMap, HashSet};

use mysql_async::Transaction;
use mysql_async::prelude::*;

use super::persist::{PersistError, classify};
use super::reservation::Reservation;
use crate::catalog::EventRecord;
use crate::domain::EventId;

/// Why MySQL turned a reservation away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declined {
    /// The category's units are all in orders already.
    SoldOut,
    /// The buyer would hold more than the event's per-user limit.
    OverLimit,
    /// A chosen seat is in another live order.
    SeatTaken,
    /// Its order number belongs to another buyer's order (minted twice).
    NumberTaken,
    /// Turned away before for a reason not known (a REFUSED row from before stock_log
    /// kept its reason): stays turned away.
    Before,
}

impl Declined {
    /// The reason the buyer's status gives (`FAILED:<request id>:<reason>`).
    pub fn reason(self) -> &'static str {
        match self {
            Declined::SoldOut => "sold out",
            Declined::OverLimit => "over the per-user limit",
            Declined::SeatTaken => "a chosen seat is taken",
            Declined::NumberTaken => "the order could not be created",
            Declined::Before => "refused",
        }
    }

    /// What stock_log's `reason` keeps of a REFUSED row (none for [`Declined::Before`]:
    /// its reason is not known; none for [`Declined::NumberTaken`], which writes no row:
    /// the number is the other buyer's order's).
    pub fn code(self) -> Option<&'static str> {
        match self {
            Declined::SoldOut => Some("SOLD_OUT"),
            Declined::OverLimit => Some("OVER_LIMIT"),
            Declined::SeatTaken => Some("SEAT_TAKEN"),
            Declined::NumberTaken | Declined::Before => None,
        }
    }

    /// A REFUSED row's `reason` read back: what the first refusal was, or
    /// [`Declined::Before`] when the row does not say (older rows, NULL).
    pub fn from_code(code: Option<&str>) -> Declined {
        match code {
            Some("SOLD_OUT") => Declined::SoldOut,
            Some("OVER_LIMIT") => Declined::OverLimit,
            Some("SEAT_TAKEN") => Declined::SeatTaken,
            _ => Declined::Before,
        }
    }
}

/// What the guards let through and what they turned away, and per category the units
/// left once the accepted ones are in (what Redis may offer at most).
pub struct Verdict<'a> {
    pub accepted: Vec<&'a Reservation>,
    pub declined: Vec<(&'a Reservation, Declined)>,
    pub room: BTreeMap<u64, i64>,
    /// The buyers whose hold row existed and is locked; the others have none yet.
    pub holders: HashSet<u64>,
}

fn seat_tuples(seats: &[(u64, u32, u32)]) -> String {
    seats
        .iter()
        .map(|(c, r, col)| format!("({c},{r},{col})"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Locks the categories, the buyers' holds and the seats the reservations touch, and
/// decides each reservation in order (the stream's, the order of admission). The room
/// left is also measured for `sold_out_before`: the categories of reservations an
/// earlier attempt refused SOLD_OUT, whose refusal in Redis is still to run with its cap.
pub async fn judge<'a>(
    tx: &mut Transaction<'_>,
    event: &EventRecord,
    fresh: Vec<&'a Reservation>,
    sold_out_before: &[u64],
) -> Result<Verdict<'a>, PersistError> {
    let mut verdict = Verdict {
        accepted: Vec::new(),
        declined: Vec::new(),
        room: BTreeMap::new(),
        holders: HashSet::new(),
    };
    if fresh.is_empty() && sold_out_before.is_empty() {
        return Ok(verdict);
    }
    let list = |ids: &mut dyn Iterator<Item = u64>| {
        let mut ids: Vec<u64> = ids.collect();
        ids.sort_unstable();
        ids.dedup();
        ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
    };
    let categories: Vec<(u64, i64, i64)> = tx
        .query(format!(
            "SELECT id, CAST(total AS SIGNED), CAST(committed AS SIGNED) FROM ticket_category \
             WHERE id IN ({}) ORDER BY id FOR UPDATE",
            list(
                &mut fresh
                    .iter()
                    .map(|r| r.category_id.0)
                    .chain(sold_out_before.iter().copied())
            )
        ))
        .await
        .map_err(classify)?;
    let mut room: HashMap<u64, i64> = categories
        .into_iter()
        .map(|(id, total, committed)| (id, total - committed))
        .collect();
    if fresh.is_empty() {
        verdict.room = room.into_iter().collect();
        return Ok(verdict);
    }
    // The buyers' hold rows that exist, locked in user order (so that two batches wait
    // for each other, never deadlock). A buyer without one holds nothing: `record`
    // inserts their row with a plain INSERT, which a row another transaction inserted
    // meanwhile refuses (a duplicate key: the batch is tried again, and then finds it).
    let users = list(&mut fresh.iter().map(|r| r.user_id.0));
    let holds: Vec<(u64, i64)> = tx
        .query(format!(
            "SELECT user_id, CAST(units AS SIGNED) FROM user_hold WHERE event_id = {} \
             AND user_id IN ({users}) ORDER BY user_id FOR UPDATE",
            event.id
        ))
        .await
        .map_err(classify)?;
    verdict.holders = holds.iter().map(|(user, _)| *user).collect();
    let mut held: HashMap<u64, i64> = holds.into_iter().collect();
    let wanted: Vec<(u64, u32, u32)> = fresh
        .iter()
        .filter(|r| r.journey.is_none())
        .flat_map(|r| {
            r.seats()
                .into_iter()
                .map(|(row, col)| (r.category_id.0, row, col))
        })
        .collect();
    let mut seat_owner: HashMap<(u64, u32, u32), Option<u64>> = HashMap::new();
    if !wanted.is_empty() {
        let rows: Vec<(u64, u32, u32, String, Option<u64>)> = tx
            .query(format!(
                "SELECT category_id, row_no, col_no, status, order_no FROM seat \
                 WHERE (category_id, row_no, col_no) IN ({}) FOR UPDATE",
                seat_tuples(&wanted)
            ))
            .await
            .map_err(classify)?;
        for (c, r, col, status, owner) in rows {
            seat_owner.insert((c, r, col), (status != "FREE").then_some(owner).flatten());
        }
    }
    // A train's seats, per segment (docs/trains.md): who holds each one asked for.
    let wanted_segments: Vec<(u64, u32, u32, usize)> =
        fresh.iter().flat_map(|r| seat_segments(r)).collect();
    let mut segment_owner: HashMap<(u64, u32, u32, usize), u64> = HashMap::new();
    if !wanted_segments.is_empty() {
        let rows: Vec<(u64, u32, u32, usize, u64)> = tx
            .query(format!(
                "SELECT category_id, row_no, col_no, segment, order_no FROM seat_segment \
                 WHERE (category_id, row_no, col_no, segment) IN ({}) FOR UPDATE",
                wanted_segments
                    .iter()
                    .map(|(c, r, col, k)| format!("({c},{r},{col},{k})"))
                    .collect::<Vec<_>>()
                    .join(",")
            ))
            .await
            .map_err(classify)?;
        for (c, r, col, k, owner) in rows {
            segment_owner.insert((c, r, col, k), owner);
        }
    }
    let seats_in_grid = |r: &Reservation| {
        let grid = event
            .categories
            .iter()
            .find(|c| c.id == r.category_id.0)
            .and_then(|c| c.seats);
        r.seats().iter().all(|&(row, col)| {
            grid.is_some_and(|g| (1..=g.rows).contains(&row) && (1..=g.cols).contains(&col))
        })
    };
    let limit = i64::from(event.per_user_limit);
    let mut claimed: HashSet<(u64, u32, u32)> = HashSet::new();
    let mut claimed_segments: HashSet<(u64, u32, u32, usize)> = HashSet::new();
    for r in fresh {
        let q = i64::from(r.quantity);
        let units = i64::from(r.units());
        let segments = seat_segments(r);
        let segment_free = |s: &(u64, u32, u32, usize)| {
            !claimed_segments.contains(s)
                && segment_owner
                    .get(s)
                    .is_none_or(|owner| *owner == r.order_no.0)
        };
        let seats: Vec<(u64, u32, u32)> = r
            .seats()
            .into_iter()
            .map(|(row, col)| (r.category_id.0, row, col))
            .collect();
        let seat_free = |s: &(u64, u32, u32)| {
            !claimed.contains(s)
                && match seat_owner.get(s) {
                    // No such seat row: the category is unseated here, or the seat unknown.
                    None => false,
                    Some(None) => true,
                    Some(Some(owner)) => *owner == r.order_no.0,
                }
        };
        let category_room = room.get(&r.category_id.0).copied().unwrap_or(0);
        let user_held = held.get(&r.user_id.0).copied().unwrap_or(0);
        let seats_taken = match r.journey {
            None => !seats.iter().all(seat_free),
            Some(_) => {
                !seats_in_grid(r) || segments.is_empty() || !segments.iter().all(segment_free)
            }
        };
        let decision = if category_room < units {
            Err(Declined::SoldOut)
        } else if user_held + q > limit {
            Err(Declined::OverLimit)
        } else if seats_taken {
            Err(Declined::SeatTaken)
        } else {
            Ok(())
        };
        match decision {
            Ok(()) => {
                room.insert(r.category_id.0, category_room - units);
                held.insert(r.user_id.0, user_held + q);
                if r.journey.is_none() {
                    claimed.extend(seats);
                }
                claimed_segments.extend(segments);
                verdict.accepted.push(r);
            }
            Err(why) => verdict.declined.push((r, why)),
        }
    }
    verdict.room = room.into_iter().collect();
    Ok(verdict)
}

/// A train ticket's (category, carriage, seat, segment) for each of its seats and each
/// segment of its journey (segment i runs from station i to i + 1); none for others.
fn seat_segments(r: &Reservation) -> Vec<(u64, u32, u32, usize)> {
    let Some(j) = r.journey else {
        return Vec::new();
    };
    r.seats()
        .into_iter()
        .flat_map(|(row, col)| j.segments().map(move |k| (r.category_id.0, row, col, k)))
        .collect()
}

/// Writes what [`judge`] let through: one UPDATE per category, one upsert of the holds
/// that exist and one insert of the new ones, one upsert of the seats (locked for their
/// orders), one insert of a train's seat-segments.
pub async fn record(
    tx: &mut Transaction<'_>,
    event_id: EventId,
    verdict: &Verdict<'_>,
) -> Result<(), PersistError> {
    let accepted = &verdict.accepted;
    let mut units: BTreeMap<u64, u64> = BTreeMap::new();
    let mut holds: BTreeMap<u64, u64> = BTreeMap::new();
    let mut seats = Vec::new();
    let mut segments = Vec::new();
    for r in accepted {
        *units.entry(r.category_id.0).or_default() += u64::from(r.units());
        *holds.entry(r.user_id.0).or_default() += u64::from(r.quantity);
        if r.journey.is_some() {
            for (c, row, col, k) in seat_segments(r) {
                segments.push(format!("({c},{row},{col},{k},{},{event_id})", r.order_no));
            }
            continue;
        }
        for (row, col) in r.seats() {
            seats.push(format!(
                "({},{row},{col},{event_id},'LOCKED',{})",
                r.category_id, r.order_no
            ));
        }
    }
    for (category, n) in &units {
        // The CHECK (committed <= total) is the backstop of the judgement above.
        tx.exec_drop(
            "UPDATE ticket_category SET committed = committed + ? WHERE id = ?",
            (n, category),
        )
        .await
        .map_err(classify)?;
    }
    // One row write per buyer: the locked rows raised, the missing ones inserted (a
    // duplicate key here is a row inserted since `judge` looked: the batch rolls back).
    let (known, new): (Vec<_>, Vec<_>) = holds
        .iter()
        .partition(|(user, _)| verdict.holders.contains(user));
    for (rows, upsert) in [(known, true), (new, false)] {
        if rows.is_empty() {
            continue;
        }
        let values = rows
            .iter()
            .map(|(u, n)| format!("({event_id},{u},{n})"))
            .collect::<Vec<_>>()
            .join(",");
        let on_duplicate = if upsert {
            " ON DUPLICATE KEY UPDATE units = units + VALUES(units)"
        } else {
            ""
        };
        tx.query_drop(format!(
            "INSERT INTO user_hold (event_id, user_id, units) VALUES {values}{on_duplicate}"
        ))
        .await
        .map_err(classify)?;
    }
    if !seats.is_empty() {
        tx.query_drop(format!(
            "INSERT INTO seat (category_id, row_no, col_no, event_id, status, order_no) VALUES {} \
             ON DUPLICATE KEY UPDATE status = 'LOCKED', order_no = VALUES(order_no)",
            seats.join(",")
        ))
        .await
        .map_err(classify)?;
    }
    if !segments.is_empty() {
        // The primary key is the backstop: a seat sold twice on a segment fails the batch.
        tx.query_drop(format!(
            "INSERT INTO seat_segment (category_id, row_no, col_no, segment, order_no, event_id) \
             VALUES {}",
            segments.join(",")
        ))
        .await
        .map_err(classify)?;
    }
    Ok(())
}

/// The orders among `numbers` that exist already with another buyer than the one their
/// reservation names: an order number minted twice.
pub fn minted_twice(existing: &[(u64, u64)], r: &Reservation) -> bool {
    existing
        .iter()
        .any(|(no, user)| *no == r.order_no.0 && *user != r.user_id.0)
}

/// What stock_log already says of a batch's fresh reservations, in one read.
#[derive(Debug, Default)]
pub struct History {
    /// Turned away before (a replay): order number → what its row says; their rows
    /// exist with no order.
    pub decided: HashMap<u64, Decided>,
    /// The largest admission number among them that an order of the event already has:
    /// Redis handed it out again, so it went back in time.
    pub reissued: Option<u64>,
}

/// A reservation turned away before, as its stock_log row says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decided {
    /// EXPIRED: past its deadline.
    Expired,
    /// REFUSED by the guards, for the reason its row keeps.
    Refused(Declined),
}

/// One read of stock_log by the reservations' order numbers and admission numbers.
pub async fn history(
    tx: &mut Transaction<'_>,
    event_id: EventId,
    fresh: &[&Reservation],
) -> Result<History, PersistError> {
    let mut history = History {
        decided: HashMap::new(),
        reissued: None,
    };
    if fresh.is_empty() {
        return Ok(history);
    }
    let join = |ids: &mut dyn Iterator<Item = u64>| {
        ids.map(|n| n.to_string()).collect::<Vec<_>>().join(",")
    };
    let numbers = join(&mut fresh.iter().map(|r| r.order_no.0));
    let seqs = join(&mut fresh.iter().filter_map(|r| r.seq));
    let by_seq = if seqs.is_empty() {
        String::new()
    } else {
        format!(" OR (event_id = {event_id} AND seq IN ({seqs}))")
    };
    let rows: Vec<(u64, String, Option<u64>, Option<String>)> = tx
        .query(format!(
            "SELECT order_no, status, seq, reason FROM stock_log \
             WHERE order_no IN ({numbers}){by_seq}"
        ))
        .await
        .map_err(classify)?;
    for (order_no, status, seq, reason) in rows {
        let ours = fresh.iter().any(|r| r.order_no.0 == order_no);
        let decided = match status.as_str() {
            "EXPIRED" => Some(Decided::Expired),
            "REFUSED" => Some(Decided::Refused(Declined::from_code(reason.as_deref()))),
            _ => None,
        };
        if ours && let Some(decided) = decided {
            history.decided.insert(order_no, decided);
        } else if !ours && let Some(seq) = seq {
            history.reissued = history.reissued.max(Some(seq));
        }
    }
    Ok(history)
}

#[cfg(test)]
mod tests {
    use super::Declined;

    #[test]
    fn a_refusals_reason_reads_back_as_itself_and_an_unknown_one_as_before() {
        for why in [Declined::SoldOut, Declined::OverLimit, Declined::SeatTaken] {
            assert_eq!(Declined::from_code(why.code()), why);
        }
        assert_eq!(Declined::Before.code(), None);
        assert_eq!(Declined::NumberTaken.code(), None);
        for unknown in [
            None,
            Some(""),
            Some("sold out"),
            Some("sold_out"),
            Some("BEFORE"),
        ] {
            assert_eq!(
                Declined::from_code(unknown),
                Declined::Before,
                "{unknown:?}"
            );
        }
    }
}
