//! Seats in another slot than the buyer's bucket (an event of several buckets,
//! docs/scaling.md "Seated categories"): a seated purchase takes three round trips —
//! `seat_lock.lua` on the seats' slot (pending locks), `reserve.lua` on the buyer's
//! bucket, then `seat_confirm.lua` (kept) or `seat_free.lua` (given back). A lock the core
//! never settled (it died between the steps) is settled by the sweeper ([`settle_expired`])
//! from what the buyer's bucket recorded.

use std::sync::LazyLock;

use crate::domain::{CategoryId, EventId, OrderNo, UserId};
use crate::infra::redis::Redis;
use crate::keys::{Bucket, Keys};
use crate::script_codes::ScriptCode;

use super::{Purchase, Refusal, Seats};

static LOCK: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(crate::with_lua_lib!("seat_lock.lua")));
static CONFIRM: LazyLock<redis::Script> = LazyLock::new(|| {
    crate::infra::redis::script(include_str!("../../../lua/redis/seat_confirm.lua"))
});
static FREE: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(include_str!("../../../lua/redis/seat_free.lua")));
static EXPIRED: LazyLock<redis::Script> = LazyLock::new(|| {
    crate::infra::redis::script(include_str!("../../../lua/redis/seat_expired.lua"))
});

/// How long a pending lock waits for its purchase before the sweeper settles it.
/// reserve.lua refuses a lock older than 10 s, so the purchase is decided long before.
pub const PENDING_MS: u64 = 30_000;

/// The return codes of `seat_lock.lua`, one to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeatLockCode {
    Locked = 1,
    NotLoaded = -1,
    NotOpen = -2,
    SoldOut = -3,
    SeatTaken = -5,
    UnknownCategory = -6,
    UnknownSeat = -7,
    InFlight = -11,
}

impl ScriptCode for SeatLockCode {
    const SCRIPT: &'static str = "seat_lock.lua";
    const ALL: &'static [SeatLockCode] = &[
        SeatLockCode::Locked,
        SeatLockCode::NotLoaded,
        SeatLockCode::NotOpen,
        SeatLockCode::SoldOut,
        SeatLockCode::SeatTaken,
        SeatLockCode::UnknownCategory,
        SeatLockCode::UnknownSeat,
        SeatLockCode::InFlight,
    ];

    fn code(self) -> i64 {
        self as i64
    }
}

impl SeatLockCode {
    fn refusal(self) -> Option<Refusal> {
        Some(match self {
            SeatLockCode::Locked | SeatLockCode::InFlight => return None,
            SeatLockCode::NotLoaded | SeatLockCode::UnknownCategory => Refusal::Loading,
            SeatLockCode::NotOpen => Refusal::NotOpen,
            SeatLockCode::SoldOut => Refusal::SoldOut,
            SeatLockCode::SeatTaken => Refusal::SeatTaken,
            SeatLockCode::UnknownSeat => Refusal::Invalid("no such seat in the category".into()),
        })
    }
}

/// Seats pending for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locked {
    /// `"row:col"`.
    pub seats: Vec<String>,
    /// When the seats' master took them (its clock, ms).
    pub at_ms: i64,
}

/// What `seat_lock.lua` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Lock {
    Locked(Locked),
    Refused(Refusal),
    /// Another request with the same Idempotency-Key holds a pending lock: its answer
    /// is this one's, once its bucket has it.
    InFlight,
}

/// Takes the purchase's seats as pending for `request_id` (again the same seats if it
/// did before), or the refusal.
pub async fn lock(
    redis: &mut Redis,
    keys: &Keys,
    p: &Purchase,
    request_id: OrderNo,
    idempotency_key: &str,
    now_ms: i64,
) -> anyhow::Result<Lock> {
    anyhow::ensure!(
        matches!(p.seats, Seats::Best { .. } | Seats::Chosen { .. }),
        "seat_lock is for a seated purchase"
    );
    let (mode, cols, chosen) = p.seats.script_args();
    let e = p.bucket.event;
    let (code, seats, at_ms): (i64, String, i64) = LOCK
        .key(keys.event_meta(e))
        .key(keys.pool(e))
        .key(keys.sold_out(e))
        .key(keys.seats(p.bucket, p.category_id))
        .key(keys.row_free(p.bucket, p.category_id))
        .key(keys.seat_locks(e))
        .key(keys.seat_lock_records(e))
        .arg(p.category_id)
        .arg(p.user_id)
        .arg(p.quantity)
        .arg(request_id)
        .arg(idempotency_key)
        .arg(now_ms)
        .arg(mode)
        .arg(cols)
        .arg(PENDING_MS)
        .arg(chosen)
        .invoke_async(redis)
        .await?;
    let code = SeatLockCode::from_code(code)?;
    if code == SeatLockCode::InFlight {
        return Ok(Lock::InFlight);
    }
    if let Some(refusal) = code.refusal() {
        return Ok(Lock::Refused(refusal));
    }
    Ok(Lock::Locked(Locked {
        seats: seats.split(',').map(str::to_owned).collect(),
        at_ms,
    }))
}

/// `seat_confirm.lua`'s answer: the seats now locked for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Confirmed(pub usize);

/// `seat_free.lua`'s answer: the seats freed now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freed(pub usize);

/// `seat_expired.lua`'s answer: request id, record, request id, record, …
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due(pub Vec<String>);

/// Keeps the pending seats of an admitted request; the number now locked for it.
pub async fn confirm(
    redis: &mut Redis,
    keys: &Keys,
    event: EventId,
    category: CategoryId,
    request_id: OrderNo,
    seats: &str,
) -> anyhow::Result<Confirmed> {
    let home = Bucket::only(event);
    Ok(Confirmed(
        CONFIRM
            .key(keys.seats(home, category))
            .key(keys.pool(event))
            .key(keys.sold_out(event))
            .key(keys.seat_locks(event))
            .key(keys.seat_lock_records(event))
            .arg(request_id)
            .arg(category)
            .arg(seats)
            .invoke_async(redis)
            .await?,
    ))
}

/// Puts the seats `id` (a request or an order) holds, pending or locked, back on sale
/// with their units; the number freed now.
pub async fn free(
    redis: &mut Redis,
    keys: &Keys,
    event: EventId,
    category: CategoryId,
    id: OrderNo,
    seats: &str,
) -> anyhow::Result<Freed> {
    let home = Bucket::only(event);
    Ok(Freed(
        FREE.key(keys.seats(home, category))
            .key(keys.row_free(home, category))
            .key(keys.pool(event))
            .key(keys.sold_out(event))
            .key(keys.seat_locks(event))
            .key(keys.seat_lock_records(event))
            .arg(id)
            .arg(category)
            .arg(seats)
            .invoke_async(redis)
            .await?,
    ))
}

/// Units of seats pending per category (the reconciler's books count them as stock:
/// each goes back to it or becomes the buyer's).
pub async fn pending_units(
    redis: &mut Redis,
    keys: &Keys,
    event: EventId,
) -> anyhow::Result<Vec<(u64, i64)>> {
    let records: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(keys.seat_lock_records(event))
        .query_async(redis)
        .await?;
    Ok(records
        .iter()
        .filter_map(|(request, record)| Pending::parse(request, record))
        .map(|p| (p.category.0, p.seats.split(',').count() as i64))
        .collect())
}

/// One pending lock as `seat_lock.lua` recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    request: OrderNo,
    category: CategoryId,
    user: UserId,
    seats: String,
    key: String,
}

impl Pending {
    fn parse(request: &str, record: &str) -> Option<Pending> {
        let mut parts = record.splitn(5, '|');
        let category = CategoryId(parts.next()?.parse().ok()?);
        let user = UserId(parts.next()?.parse().ok()?);
        let _locked_ms = parts.next()?;
        let seats = parts.next()?.to_owned();
        let key = parts.next()?.to_owned();
        Some(Pending {
            request: OrderNo(request.parse().ok()?),
            category,
            user,
            seats,
            key,
        })
    }
}

/// Locks pending past their time, at most this many per sweep of an event.
const EXPIRED_PER_SWEEP: usize = 200;

/// Settles the event's pending locks whose time has passed: kept when the buyer's
/// bucket recorded the request as admitted (the core stopped before confirming), else
/// freed. Returns (kept, freed).
pub async fn settle_expired(
    redis: &mut Redis,
    keys: &Keys,
    event: EventId,
    buckets: u16,
) -> anyhow::Result<(usize, usize)> {
    let Due(due) = Due(EXPIRED
        .key(keys.seat_locks(event))
        .key(keys.seat_lock_records(event))
        .arg(EXPIRED_PER_SWEEP)
        .invoke_async(redis)
        .await?);
    let (mut kept, mut freed) = (0, 0);
    for pair in due.chunks_exact(2) {
        let Some(p) = Pending::parse(&pair[0], &pair[1]) else {
            tracing::error!(event_id = event.0, record = %pair[1], "unreadable seat lock record");
            continue;
        };
        let bucket = Bucket::of_buyer(event, buckets, p.user);
        let admitted: Option<String> = redis::cmd("HGET")
            .arg(keys.idempotency(bucket))
            .arg(crate::keys::idempotency_field(p.user, &p.key))
            .query_async(redis)
            .await?;
        if admitted
            .as_deref()
            .and_then(crate::keys::idempotency_request)
            == Some(p.request)
        {
            confirm(redis, keys, event, p.category, p.request, &p.seats).await?;
            kept += 1;
        } else {
            free(redis, keys, event, p.category, p.request, &p.seats).await?;
            freed += 1;
        }
    }
    if kept + freed > 0 {
        tracing::info!(
            event_id = event.0,
            kept,
            freed,
            "pending seat locks settled after their time"
        );
    }
    Ok((kept, freed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_of_the_script_maps_to_one_variant() {
        crate::script_codes::assert_mirrored::<SeatLockCode>(include_str!(
            "../../../lua/redis/seat_lock.lua"
        ));
        for &code in SeatLockCode::ALL {
            let answers = matches!(code, SeatLockCode::Locked | SeatLockCode::InFlight);
            assert_eq!(code.refusal().is_none(), answers, "{code:?}");
        }
    }

    #[test]
    fn pending_records_parse_back_keys_with_bars_included() {
        let p = Pending::parse("77", "3|41|1700000000000|2:1,2:2|k|1").unwrap();
        assert_eq!(
            p,
            Pending {
                request: OrderNo(77),
                category: CategoryId(3),
                user: UserId(41),
                seats: "2:1,2:2".into(),
                key: "k|1".into(),
            }
        );
        assert_eq!(Pending::parse("x", "3|41|1|2:1|k"), None);
        assert_eq!(Pending::parse("7", "3|41"), None);
    }
}
