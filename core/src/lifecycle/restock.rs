//! Giving a cancelled order's units and seats back in Redis, exactly once
//! (`lua/redis/restock.lua`); the cancellation and the reconciler both use it.

use std::sync::LazyLock;

use crate::infra::redis::Redis;

use crate::domain::{CategoryId, OrderNo, UserId};
use crate::keys::{Bucket, Keys};
use crate::script_codes::ScriptCode;

static RESTOCK: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(crate::with_lua_lib!("restock.lua")));

/// `restock.lua`'s answers, one to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restocked {
    Now = 1,
    Before = 0,
}

impl crate::script_codes::ScriptCode for Restocked {
    const SCRIPT: &'static str = "restock.lua";
    const ALL: &'static [Restocked] = &[Restocked::Now, Restocked::Before];

    fn code(self) -> i64 {
        self as i64
    }
}

/// What giving a cancelled order's units back needs to know of it.
pub struct GiveBack<'a> {
    pub order_no: OrderNo,
    pub user_id: UserId,
    /// The buyer's bucket of the event, where the units go back.
    pub bucket: Bucket,
    pub category_id: CategoryId,
    pub quantity: u32,
    /// `"row:col"`, empty for unseated tickets.
    pub seats: &'a [String],
    /// A train ticket's journey: its seats go back on those segments only.
    pub journey: Option<crate::trains::Journey>,
}

/// Gives a cancelled order's units and seats back in Redis, once: into the buyer's
/// bucket (for an event of several buckets the sweeper then clears the edge's sold-out
/// flag, within a second, and the next drain finds the units).
///
/// Seats in another slot than the bucket (an event of several buckets) go back first,
/// with their units, by `seat_free.lua` (which frees only seats still locked for this
/// order, so a repeat changes nothing); then the bucket's part.
pub async fn restock(redis: &mut Redis, keys: &Keys, o: GiveBack<'_>) -> anyhow::Result<Restocked> {
    let b = o.bucket;
    let seats = o.seats.join(",");
    let seats_elsewhere = !b.holds_seats() && !seats.is_empty();
    if seats_elsewhere {
        crate::admission::seat_lock::free(redis, keys, b.event, o.category_id, o.order_no, &seats)
            .await?;
    }
    let (seats_key, row_free_key) = if o.journey.is_some() {
        (
            keys.segments(b, o.category_id),
            keys.segment_versions(b.event),
        )
    } else if b.holds_seats() {
        (
            keys.seats(b, o.category_id),
            keys.row_free(b, o.category_id),
        )
    } else {
        (keys.stock(b), keys.stock(b))
    };
    // A train ticket's units are its seat-segments.
    let units = crate::trains::units(o.quantity, o.journey);
    let back = if seats_elsewhere { 0 } else { units };
    let code: i64 = RESTOCK
        .key(keys.restocked(b))
        .key(keys.stock(b))
        .key(keys.dry(b))
        .key(keys.held(b))
        .key(keys.purchase_status(b))
        .key(seats_key)
        .key(row_free_key)
        .arg(o.order_no)
        .arg(o.user_id)
        .arg(o.category_id)
        .arg(o.quantity)
        .arg(if seats_elsewhere { "" } else { seats.as_str() })
        .arg(back)
        .arg(o.journey.map(|j| j.encode()).unwrap_or_default())
        .invoke_async(redis)
        .await?;
    Restocked::from_code(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_of_the_script_maps_to_one_variant() {
        crate::script_codes::assert_mirrored::<Restocked>(include_str!(
            "../../../lua/redis/restock.lua"
        ));
    }
}
