//! Trains (issue "Trains", docs/trains.md): a seat is sold by route segment. A class's
//! seats are one Redis hash, `"<carriage>:<seat>"` → one character per segment
//! (`lua/redis/lib/segments.lua`); availability is counted from them, never kept apart.

use std::sync::LazyLock;

use crate::domain::{CategoryId, EventId};
use crate::infra::redis::Redis;
use crate::keys::{Bucket, Keys};

/// Most stations on one route (so at most 63 segments).
pub const MAX_STATIONS: usize = 64;

/// A journey from station `from` to station `to` (0-based, `from < to`): it uses the
/// segments `from + 1 ..= to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Journey {
    pub from: u16,
    pub to: u16,
}

impl Journey {
    /// A journey on a route of `stations` stations, or why not.
    pub fn new(from: u16, to: u16, stations: usize) -> Result<Journey, String> {
        if usize::from(to) >= stations {
            return Err(format!(
                "to must be a station of the route (0 … {})",
                stations - 1
            ));
        }
        if from >= to {
            return Err("from must come before to".into());
        }
        Ok(Journey { from, to })
    }

    /// As the scripts take and the stream carries it: `"<from>:<to>"`.
    pub fn encode(self) -> String {
        format!("{}:{}", self.from, self.to)
    }

    pub fn parse(text: &str) -> Option<Journey> {
        let (f, t) = text.split_once(':')?;
        let (from, to) = (f.parse().ok()?, t.parse().ok()?);
        (from < to).then_some(Journey { from, to })
    }

    /// From an order item's `from_station`, `to_station` columns (NULL for a ticket
    /// that is not a train's).
    pub fn from_columns(from: Option<u16>, to: Option<u16>) -> Option<Journey> {
        Some(Journey {
            from: from?,
            to: to?,
        })
    }

    /// How many segments it uses.
    pub fn span(self) -> u32 {
        u32::from(self.to - self.from)
    }
}

/// The units a ticket of `quantity` counts in the stock: its seat-segments on a train
/// (quantity × the journey's segments), else the quantity.
pub fn units(quantity: u32, journey: Option<Journey>) -> u32 {
    quantity * journey.map_or(1, Journey::span)
}

impl Journey {
    /// The segments it uses, as 0-based indexes.
    pub fn segments(self) -> std::ops::Range<usize> {
        usize::from(self.from)..usize::from(self.to)
    }

    /// Whether two journeys share a segment.
    pub fn overlaps(self, other: Journey) -> bool {
        self.from < other.to && other.from < self.to
    }
}

/// A class's seats before anything is sold: every segment free.
pub fn free_seat(stations: usize) -> String {
    "0".repeat(stations.saturating_sub(1))
}

static AVAILABLE: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(crate::with_lua_lib!("train_available.lua")));

/// `train_available.lua`'s answer for one class: seats free on the whole journey, and
/// the class's version (changes to its seats so far) the count was taken at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Available {
    pub free: u64,
    pub version: u64,
}

/// Seats free on the journey per class, from the seats themselves (one round trip).
pub async fn available(
    redis: &mut Redis,
    keys: &Keys,
    event: EventId,
    classes: &[CategoryId],
    journey: Journey,
) -> anyhow::Result<Vec<Available>> {
    let b = Bucket::only(event);
    let mut call = AVAILABLE.prepare_invoke();
    for &c in classes {
        call.key(keys.segments(b, c));
    }
    call.key(keys.segment_versions(event))
        .arg(journey.from)
        .arg(journey.to);
    for &c in classes {
        call.arg(c);
    }
    let flat: Vec<u64> = call.invoke_async(redis).await?;
    Ok(flat
        .chunks_exact(2)
        .map(|p| Available {
            free: p[0],
            version: p[1],
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journeys_are_checked_encoded_and_overlap_by_segment() {
        assert_eq!(Journey::new(0, 3, 4), Ok(Journey { from: 0, to: 3 }));
        assert!(Journey::new(2, 2, 4).is_err());
        assert!(Journey::new(3, 1, 4).is_err());
        assert!(Journey::new(0, 4, 4).is_err());
        let ac = Journey { from: 0, to: 2 };
        assert_eq!(Journey::parse(&ac.encode()), Some(ac));
        assert_eq!(Journey::parse("2:2"), None);
        assert_eq!(Journey::parse("x:2"), None);
        assert_eq!(ac.segments(), 0..2);
        let (ab, cd, bc) = (
            Journey { from: 0, to: 1 },
            Journey { from: 2, to: 3 },
            Journey { from: 1, to: 2 },
        );
        assert!(!ab.overlaps(cd) && !cd.overlaps(ab));
        assert!(ac.overlaps(bc) && bc.overlaps(ac));
        assert!(!ab.overlaps(bc), "they meet at a station, not on a segment");
        assert_eq!(free_seat(4), "000");
    }
}
