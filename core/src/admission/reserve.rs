//! The one Redis round trip of an admission: `lua/redis/reserve.lua`.

use std::sync::LazyLock;

use crate::infra::redis::Redis;

use super::{Purchase, Refusal, Seats};
use crate::domain::OrderNo;
use crate::keys::Keys;
use crate::script_codes::ScriptCode;

/// reserve.lua as Redis runs it (lua/redis/lib/ in front).
pub const RESERVE_LUA: &str = crate::with_lua_lib!("reserve.lua");

static RESERVE: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(RESERVE_LUA));

/// The return codes of `reserve.lua`, one to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReserveCode {
    Queued = 1,
    Replayed = 2,
    NotLoaded = -1,
    NotOpen = -2,
    SoldOut = -3,
    LimitReached = -4,
    SeatTaken = -5,
    UnknownCategory = -6,
    UnknownSeat = -7,
    KeyReused = -8,
    SaleBusy = -9,
    Refill = -10,
}

impl crate::script_codes::ScriptCode for ReserveCode {
    const SCRIPT: &'static str = "reserve.lua";
    const ALL: &'static [ReserveCode] = &[
        ReserveCode::Queued,
        ReserveCode::Replayed,
        ReserveCode::NotLoaded,
        ReserveCode::NotOpen,
        ReserveCode::SoldOut,
        ReserveCode::LimitReached,
        ReserveCode::SeatTaken,
        ReserveCode::UnknownCategory,
        ReserveCode::UnknownSeat,
        ReserveCode::KeyReused,
        ReserveCode::SaleBusy,
        ReserveCode::Refill,
    ];

    fn code(self) -> i64 {
        self as i64
    }
}

impl ReserveCode {
    /// The buyer's answer for a refusing code; None for the two admitting ones and for
    /// REFILL (the core refills the bucket and tries again).
    pub fn refusal(self) -> Option<Refusal> {
        Some(match self {
            ReserveCode::Queued | ReserveCode::Replayed | ReserveCode::Refill => return None,
            // Validation found the event on sale and the category in it: keys missing in
            // Redis mean they were lost and are being rebuilt.
            ReserveCode::NotLoaded | ReserveCode::UnknownCategory => Refusal::Loading,
            ReserveCode::NotOpen => Refusal::NotOpen,
            ReserveCode::SoldOut => Refusal::SoldOut,
            ReserveCode::LimitReached => Refusal::LimitReached,
            ReserveCode::SeatTaken => Refusal::SeatTaken,
            ReserveCode::UnknownSeat => Refusal::Invalid("no such seat in the category".into()),
            ReserveCode::KeyReused => Refusal::KeyReused,
            ReserveCode::SaleBusy => Refusal::Busy,
        })
    }
}

/// An admitted purchase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    /// The request id, which is also the order number the order will have.
    pub request_id: OrderNo,
    /// True when this answers a repeated Idempotency-Key; nothing new was reserved.
    pub replayed: bool,
    /// Seats taken, `"row:col"`.
    pub seats: Vec<String>,
}

/// What the script answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Reserved(Reserved),
    Refused(Refusal),
    /// The buyer's bucket has fewer units than asked for (events of several buckets).
    Refill,
}

impl Outcome {
    /// The buyer's answer; REFILL, which the core acts on before answering, as
    /// SOLD_OUT.
    pub fn into_result(self) -> Result<Reserved, Refusal> {
        match self {
            Outcome::Reserved(r) => Ok(r),
            Outcome::Refused(refusal) => Err(refusal),
            Outcome::Refill => Err(Refusal::SoldOut),
        }
    }
}

/// Runs the script on the buyer's bucket; Err for Redis trouble. `locked`: the seats
/// `seat_lock.lua` took for this request in their own slot (events of several buckets).
#[allow(clippy::too_many_arguments)]
pub async fn reserve(
    redis: &mut Redis,
    keys: &Keys,
    p: &Purchase,
    request_id: OrderNo,
    idempotency_key: &str,
    now_ms: i64,
    max_stream_depth: u64,
    locked: Option<&super::seat_lock::Locked>,
) -> anyhow::Result<Outcome> {
    let (mode, cols, chosen): (String, i64, Vec<String>) = match (&p.seats, locked) {
        (Seats::Best { .. }, Some(l)) => ("locked-auto".into(), l.at_ms, l.seats.clone()),
        (Seats::Chosen { .. }, Some(l)) => ("locked-pick".into(), l.at_ms, l.seats.clone()),
        (seats, _) => {
            let (mode, cols, chosen) = seats.script_args();
            (mode, cols.into(), chosen)
        }
    };
    let b = p.bucket;
    let [meta, stock, dry, held, idempotency, status, stream] = keys.admission(b);
    // No seats: no seat keys (each argument costs Redis about 1.4 k instructions; README
    // "Measured"). Seats in another slot are never touched here: the bucket's own key
    // stands in.
    let seat_keys = match (&p.seats, locked) {
        (Seats::None, _) => None,
        (Seats::Journey { .. }, _) => Some((
            keys.segments(b, p.category_id),
            keys.segment_versions(b.event),
        )),
        (Seats::Best { .. } | Seats::Chosen { .. }, None) if b.holds_seats() => Some((
            keys.seats(b, p.category_id),
            keys.row_free(b, p.category_id),
        )),
        _ => Some((stock.clone(), stock.clone())),
    };
    // EVALSHA built as one command, as redis::ScriptInvocation would build it from its
    // own copy of every key and argument (callgrind: ~3.5 k instructions a purchase);
    // a Redis without the script (restarted, flushed) gets it loaded, then the call again.
    let keys_count = if seat_keys.is_some() { 9 } else { 7 };
    let mut eval = redis::Cmd::with_capacity(13 + keys_count + chosen.len(), 512);
    eval.arg("EVALSHA")
        .arg(RESERVE.get_hash())
        .arg(keys_count)
        .arg(&meta)
        .arg(&stock)
        .arg(&dry)
        .arg(&held)
        .arg(&idempotency)
        .arg(&status)
        .arg(&stream);
    if let Some((seats_key, row_free_key)) = &seat_keys {
        eval.arg(seats_key).arg(row_free_key);
    }
    eval.arg(p.category_id)
        .arg(p.user_id)
        .arg(p.quantity)
        .arg(request_id)
        .arg(idempotency_key)
        .arg(now_ms)
        .arg(&mode)
        .arg(cols)
        .arg(max_stream_depth)
        .arg(&chosen);
    let (code, rid, seats): (i64, String, String) = match eval.query_async(redis).await {
        Err(e) if e.kind() == redis::ErrorKind::NoScriptError => {
            RESERVE.load_async(redis).await?;
            eval.query_async(redis).await?
        }
        answer => answer?,
    };
    let code = ReserveCode::from_code(code)?;
    if code == ReserveCode::Refill {
        return Ok(Outcome::Refill);
    }
    if let Some(refusal) = code.refusal() {
        return Ok(Outcome::Refused(refusal));
    }
    Ok(Outcome::Reserved(Reserved {
        request_id: OrderNo(rid.parse()?),
        replayed: code == ReserveCode::Replayed,
        seats: if seats.is_empty() {
            Vec::new()
        } else {
            seats.split(',').map(str::to_owned).collect()
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_of_the_script_maps_to_one_variant() {
        crate::script_codes::assert_mirrored::<ReserveCode>(include_str!(
            "../../../lua/redis/reserve.lua"
        ));
        for &code in <ReserveCode as ScriptCode>::ALL {
            let admits = matches!(
                code,
                ReserveCode::Queued | ReserveCode::Replayed | ReserveCode::Refill
            );
            assert_eq!(code.refusal().is_none(), admits, "{code:?}");
        }
    }
}
