//! A reservation as the admission script wrote it into an event's stream.

use anyhow::Context;
use redis::streams::StreamId;

use crate::domain::{CategoryId, EventId, OrderNo, UserId};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The stream entry, acknowledged once the reservation is settled or released.
    pub entry_id: String,
    /// The request id, which is the order number.
    pub order_no: OrderNo,
    pub user_id: UserId,
    pub category_id: CategoryId,
    pub quantity: u32,
    /// Seats as written by the script, `"r:c,r:c"` or empty.
    pub seats_raw: String,
    pub admitted_ms: i64,
    /// The generation of the event's Redis keys it was admitted under (`event.redis_epoch`).
    pub epoch: u64,
    /// Its number among the event's admissions (`meta.seq`); none in entries written
    /// before admissions were numbered.
    pub seq: Option<u64>,
    /// A train journey (`"<from>:<to>"` in the entry), whose seats are held on its
    /// segments only.
    pub journey: Option<crate::trains::Journey>,
}

/// The field reserve.lua writes a reservation in: its values joined by `|`, in the
/// order [`Reservation::from_entry`] reads them.
pub const ENTRY_FIELD: &str = "v1";

impl Reservation {
    /// The reservation of a stream entry: reserve.lua's one field [`ENTRY_FIELD`], or
    /// (entries queued by a core before it) one field per value, `r u c q s t` and
    /// `e n j` when present.
    pub fn from_entry(entry: &StreamId) -> anyhow::Result<Reservation> {
        match entry.map.get(ENTRY_FIELD) {
            Some(redis::Value::BulkString(packed)) => Self::from_packed(&entry.id, packed)
                .with_context(|| format!("stream entry {} field {ENTRY_FIELD}", entry.id)),
            Some(other) => {
                anyhow::bail!("stream entry {} field {ENTRY_FIELD} is {other:?}", entry.id)
            }
            None => Self::from_fields(entry),
        }
    }

    fn from_packed(id: &str, packed: &[u8]) -> anyhow::Result<Reservation> {
        let text = std::str::from_utf8(packed)?;
        let values: Vec<&str> = text.split('|').collect();
        let [r, u, c, q, s, t, e, n, j] = values[..] else {
            anyhow::bail!("{} values, not 9", values.len());
        };
        Ok(Reservation {
            entry_id: id.to_owned(),
            order_no: OrderNo(r.parse().context("request id")?),
            user_id: UserId(u.parse().context("user")?),
            category_id: CategoryId(c.parse().context("category")?),
            quantity: q.parse().context("quantity")?,
            seats_raw: s.to_owned(),
            admitted_ms: t.parse().context("time")?,
            epoch: e.parse().context("epoch")?,
            seq: Some(n.parse().context("seq")?),
            journey: if j.is_empty() {
                None
            } else {
                Some(crate::trains::Journey::parse(j).context("journey")?)
            },
        })
    }

    fn from_fields(entry: &StreamId) -> anyhow::Result<Reservation> {
        let field = |name: &str| -> anyhow::Result<String> {
            entry
                .get::<String>(name)
                .with_context(|| format!("stream entry {} has no field {name}", entry.id))
        };
        let number = |name: &str| -> anyhow::Result<u64> {
            field(name)?
                .parse()
                .with_context(|| format!("stream entry {} field {name}", entry.id))
        };
        Ok(Reservation {
            entry_id: entry.id.clone(),
            order_no: OrderNo(number("r")?),
            user_id: UserId(number("u")?),
            category_id: CategoryId(number("c")?),
            quantity: number("q")? as u32,
            seats_raw: field("s")?,
            admitted_ms: number("t")? as i64,
            // Written by every script since the keys have generations; older entries are 0.
            epoch: if entry.map.contains_key("e") {
                number("e")?
            } else {
                0
            },
            seq: entry
                .map
                .contains_key("n")
                .then(|| number("n"))
                .transpose()?,
            journey: match entry.get::<String>("j") {
                None => None,
                Some(j) => Some(
                    crate::trains::Journey::parse(&j)
                        .with_context(|| format!("stream entry {} field j", entry.id))?,
                ),
            },
        })
    }

    /// What it takes from the category's stock: its quantity, or for a train ticket
    /// its seat-segments (seats × segments of the journey, docs/trains.md).
    pub fn units(&self) -> u32 {
        crate::trains::units(self.quantity, self.journey)
    }

    /// Seats as (row, col).
    pub fn seats(&self) -> Vec<(u32, u32)> {
        self.seats_raw
            .split(',')
            .filter_map(|s| {
                let (r, c) = s.split_once(':')?;
                Some((r.parse().ok()?, c.parse().ok()?))
            })
            .collect()
    }
}

/// The reservations one message carries: of one event, created in one MySQL transaction.
#[derive(Debug, Clone)]
pub struct Batch {
    pub event_id: EventId,
    /// Unique per attempt; stock_log and stock_batch rows record it, the check-back
    /// looks for it.
    pub batch_id: String,
    pub reservations: Vec<Reservation>,
    /// Every reservation was read from the stream for the first time (XREADGROUP `>`)
    /// and this is the first attempt at it: no attempt before can have created or turned
    /// away any of them, so the first try leaves the checks for that to the unique keys
    /// (`persist::create_orders`).
    pub first_delivery: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fields: &[(&str, &str)]) -> StreamId {
        let mut entry = StreamId {
            id: "1-0".into(),
            ..Default::default()
        };
        for (k, v) in fields {
            entry
                .map
                .insert((*k).into(), redis::Value::BulkString(v.as_bytes().to_vec()));
        }
        entry
    }

    #[test]
    fn a_stream_entry_becomes_a_reservation() {
        let r = Reservation::from_entry(&entry(&[(ENTRY_FIELD, "77|5|9|2|1:2,1:3|1000|4|12|")]))
            .unwrap();
        assert_eq!(
            (r.order_no, r.user_id, r.category_id, r.quantity),
            (OrderNo(77), UserId(5), CategoryId(9), 2)
        );
        assert_eq!(
            (r.admitted_ms, r.epoch, r.seq, r.journey),
            (1000, 4, Some(12), None)
        );
        assert_eq!(r.seats(), vec![(1, 2), (1, 3)]);
        let train =
            Reservation::from_entry(&entry(&[(ENTRY_FIELD, "78|5|9|1||1000|4|13|2:5")])).unwrap();
        assert_eq!(
            (train.journey.map(|j| j.span()), train.units()),
            (Some(3), 3)
        );
    }

    #[test]
    fn a_malformed_entry_is_refused_by_name() {
        for (packed, why) in [
            ("77|5|9|2|1:2|1000|4|12", "8 values, not 9"),
            ("77|5|9|2|1:2|1000|4|12||", "10 values, not 9"),
            ("77|x|9|2|1:2|1000|4|12|", "user"),
            ("77|5|9|-2|1:2|1000|4|12|", "quantity"),
            ("77|5|9|1||1000|4|13|5:2", "journey"),
            ("", "1 values, not 9"),
        ] {
            let err = Reservation::from_entry(&entry(&[(ENTRY_FIELD, packed)])).unwrap_err();
            assert!(format!("{err:#}").contains(why), "{packed:?}: {err:#}");
        }
    }

    #[test]
    fn an_entry_queued_before_the_packed_field_still_reads() {
        let mut fields = vec![
            ("r", "77"),
            ("u", "5"),
            ("c", "9"),
            ("q", "2"),
            ("s", "1:2,1:3"),
            ("t", "1000"),
        ];
        let r = Reservation::from_entry(&entry(&fields)).unwrap();
        assert_eq!(
            (r.order_no, r.user_id, r.quantity, r.epoch, r.seq),
            (OrderNo(77), UserId(5), 2, 0, None)
        );
        fields.extend([("e", "3"), ("n", "8"), ("j", "0:2")]);
        let r = Reservation::from_entry(&entry(&fields)).unwrap();
        assert_eq!((r.epoch, r.seq, r.units()), (3, Some(8), 4));
        fields.retain(|(k, _)| *k != "u");
        assert!(
            Reservation::from_entry(&entry(&fields))
                .unwrap_err()
                .to_string()
                .contains("no field u")
        );
    }
}
