//! The validation chain (seed 000): small checks run in order against the cached event,
//! each able to refuse; only a request that passes them all reaches Redis.

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::{Purchase, Refusal, Seats};
use crate::catalog::{CategoryRecord, EventRecord};
use crate::domain::UserId;

/// `POST /api/events/{id}/orders` as received.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderBody {
    pub category_id: u64,
    pub quantity: Option<i64>,
    /// Seats as `"row:col"`, for seated categories (a train's `"carriage:seat"`).
    pub seat_ids: Option<Vec<String>>,
    /// A train ticket's journey: station indexes along the route (docs/trains.md).
    pub from: Option<i64>,
    pub to: Option<i64>,
}

/// What one check sees.
struct Candidate<'a> {
    body: &'a OrderBody,
    event: &'a EventRecord,
    now: DateTime<Utc>,
}

impl Candidate<'_> {
    /// A train ticket's journey, once `journey_on_the_route` passed.
    fn journey(&self) -> Option<crate::trains::Journey> {
        let (from, to) = (self.body.from?, self.body.to?);
        crate::trains::Journey::new(
            u16::try_from(from).ok()?,
            u16::try_from(to).ok()?,
            self.event.stations.len(),
        )
        .ok()
    }

    fn category(&self) -> Option<&CategoryRecord> {
        self.event
            .categories
            .iter()
            .find(|c| c.id == self.body.category_id)
    }
}

type Check = fn(&Candidate) -> Result<(), Refusal>;

/// The chain, in order: cheapest and most common refusals first.
const CHAIN: [(&str, Check); 6] = [
    ("one kind of purchase", one_kind_of_purchase),
    ("event on sale", event_on_sale),
    ("category exists", category_exists),
    ("journey on the route", journey_on_the_route),
    ("quantity within limit", quantity_within_limit),
    ("seats belong to category", seats_belong_to_category),
];

/// Runs the chain; the purchase to reserve if every check passes.
pub fn validate(
    body: &OrderBody,
    event: &EventRecord,
    user_id: UserId,
    now: DateTime<Utc>,
) -> Result<Purchase, Refusal> {
    checked(body, event, user_id.0, now, |_| true)
}

/// The chain without the sale window, for a purchase refused NOT_OPEN whose
/// Idempotency-Key may have been admitted before the window closed: the script checks
/// the key before the window, so a repeat gets its first answer and anything else
/// still NOT_OPEN.
pub fn validate_for_replay(
    body: &OrderBody,
    event: &EventRecord,
    user_id: UserId,
    now: DateTime<Utc>,
) -> Result<Purchase, Refusal> {
    checked(body, event, user_id.0, now, |name| name != "event on sale")
}

fn checked(
    body: &OrderBody,
    event: &EventRecord,
    user_id: u64,
    now: DateTime<Utc>,
    wanted: impl Fn(&str) -> bool,
) -> Result<Purchase, Refusal> {
    let candidate = Candidate { body, event, now };
    for (name, check) in CHAIN {
        if wanted(name) {
            check(&candidate)?;
        }
    }
    let category = candidate.category().expect("checked by category_exists");
    if let Some(journey) = candidate.journey() {
        let chosen: Vec<(u32, u32)> = body
            .seat_ids
            .iter()
            .flatten()
            .map(|s| parse_seat(s).expect("checked"))
            .collect();
        let quantity = body.quantity.map_or(chosen.len() as u32, |q| q as u32);
        return Ok(Purchase {
            event_id: event.id,
            category_id: category.id,
            user_id,
            quantity,
            seats: Seats::Journey {
                journey,
                seats: chosen,
            },
            bucket: crate::keys::Bucket::of_buyer(event.id, event.buckets, UserId(user_id)),
        });
    }
    let (quantity, seats) = match (&category.seats, &body.seat_ids, body.quantity) {
        (None, _, Some(q)) => (q as u32, Seats::None),
        (Some(grid), None, Some(q)) => (q as u32, Seats::Best { cols: grid.cols }),
        (Some(grid), Some(ids), _) => {
            let seats: Vec<(u32, u32)> = ids
                .iter()
                .map(|s| parse_seat(s).expect("checked"))
                .collect();
            (
                seats.len() as u32,
                Seats::Chosen {
                    cols: grid.cols,
                    seats,
                },
            )
        }
        _ => unreachable!("one_kind_of_purchase and seats_belong_to_category rule the rest out"),
    };
    Ok(Purchase {
        event_id: event.id,
        category_id: category.id,
        user_id,
        quantity,
        seats,
        bucket: crate::keys::Bucket::of_buyer(event.id, event.buckets, UserId(user_id)),
    })
}

fn one_kind_of_purchase(c: &Candidate) -> Result<(), Refusal> {
    match (&c.body.quantity, &c.body.seat_ids) {
        (Some(_), None) | (None, Some(_)) => Ok(()),
        _ => Err(Refusal::Invalid(
            "give exactly one of quantity or seat_ids".into(),
        )),
    }
}

fn event_on_sale(c: &Candidate) -> Result<(), Refusal> {
    if c.event.on_sale_at(c.now) {
        Ok(())
    } else {
        Err(Refusal::NotOpen)
    }
}

fn category_exists(c: &Candidate) -> Result<(), Refusal> {
    c.category().map(|_| ()).ok_or_else(|| {
        Refusal::Invalid(format!(
            "no category {} in event {}",
            c.body.category_id, c.event.id
        ))
    })
}

fn journey_on_the_route(c: &Candidate) -> Result<(), Refusal> {
    let (from, to) = (c.body.from, c.body.to);
    if !c.event.is_train() {
        return match (from, to) {
            (None, None) => Ok(()),
            _ => Err(Refusal::Invalid(format!(
                "event {} is not a train: no from or to",
                c.event.id
            ))),
        };
    }
    let (Some(from), Some(to)) = (from, to) else {
        return Err(Refusal::Invalid(
            "a train ticket needs from and to (station indexes along the route)".into(),
        ));
    };
    let stations = c.event.stations.len();
    let index = |v: i64| u16::try_from(v).ok().filter(|&i| usize::from(i) < stations);
    let (Some(from), Some(to)) = (index(from), index(to)) else {
        return Err(Refusal::Invalid(format!(
            "from and to must be stations of the route (0 … {})",
            stations - 1
        )));
    };
    crate::trains::Journey::new(from, to, stations)
        .map(|_| ())
        .map_err(Refusal::Invalid)
}

fn quantity_within_limit(c: &Candidate) -> Result<(), Refusal> {
    let limit = i64::from(c.event.per_user_limit);
    let asked = match (&c.body.quantity, &c.body.seat_ids) {
        (Some(q), _) => *q,
        (_, Some(ids)) => ids.len() as i64,
        _ => 0,
    };
    if (1..=limit).contains(&asked) {
        Ok(())
    } else {
        Err(Refusal::Invalid(format!(
            "quantity must be within 1..={limit}, got {asked}"
        )))
    }
}

fn seats_belong_to_category(c: &Candidate) -> Result<(), Refusal> {
    let Some(ids) = &c.body.seat_ids else {
        return Ok(());
    };
    let category = c.category().expect("checked by category_exists");
    let Some(grid) = category.seats else {
        return Err(Refusal::Invalid(format!(
            "category {} has no seats to choose",
            category.id
        )));
    };
    let mut seen = std::collections::HashSet::new();
    for id in ids {
        let (row, col) = parse_seat(id)
            .ok_or_else(|| Refusal::Invalid(format!("seat id {id:?} is not \"row:col\"")))?;
        if row == 0 || col == 0 || row > grid.rows || col > grid.cols {
            return Err(Refusal::Invalid(format!(
                "seat {id} is not in category {}",
                category.id
            )));
        }
        if !seen.insert((row, col)) {
            return Err(Refusal::Invalid(format!("seat {id} is chosen twice")));
        }
    }
    Ok(())
}

fn parse_seat(id: &str) -> Option<(u32, u32)> {
    let (row, col) = id.split_once(':')?;
    Some((row.parse().ok()?, col.parse().ok()?))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::catalog::{EventStatus, SeatGrid};

    /// An event of two categories (10 GA units, 2 × 3 seats), its sale on 2030-01-01
    /// from 00:00 to 12:00 UTC: for the tests of other modules too.
    pub(crate) fn event() -> EventRecord {
        let t = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        EventRecord {
            id: 7,
            title: "t".into(),
            venue: "v".into(),
            show_time: t("2030-01-02T00:00:00Z"),
            sale_start: t("2030-01-01T00:00:00Z"),
            sale_end: t("2030-01-01T12:00:00Z"),
            per_user_limit: 4,
            pay_timeout_s: 60,
            buckets: 1,
            status: EventStatus::Published,
            kind: "sale".into(),
            stations: Vec::new(),
            room: None,
            categories: vec![
                CategoryRecord {
                    id: 1,
                    name: "GA".into(),
                    price_cents: 100,
                    total: 10,
                    remain: 10,
                    seats: None,
                },
                CategoryRecord {
                    id: 2,
                    name: "S".into(),
                    price_cents: 100,
                    total: 6,
                    remain: 6,
                    seats: Some(SeatGrid { rows: 2, cols: 3 }),
                },
            ],
        }
    }

    fn during_sale() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2030-01-01T06:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn body(category_id: u64, quantity: Option<i64>, seats: Option<&[&str]>) -> OrderBody {
        OrderBody {
            category_id,
            quantity,
            seat_ids: seats.map(|s| s.iter().map(|x| x.to_string()).collect()),
            from: None,
            to: None,
        }
    }

    #[test]
    fn valid_purchases_become_units_best_seats_or_chosen_seats() {
        let e = event();
        let p = validate(&body(1, Some(2), None), &e, UserId(9), during_sale()).unwrap();
        assert_eq!((p.quantity, p.seats), (2, Seats::None));
        let p = validate(&body(2, Some(3), None), &e, UserId(9), during_sale()).unwrap();
        assert_eq!((p.quantity, p.seats), (3, Seats::Best { cols: 3 }));
        let p = validate(
            &body(2, None, Some(&["1:1", "2:3"])),
            &e,
            UserId(9),
            during_sale(),
        )
        .unwrap();
        assert_eq!(
            p.seats,
            Seats::Chosen {
                cols: 3,
                seats: vec![(1, 1), (2, 3)]
            }
        );
    }

    #[test]
    fn each_check_refuses_what_it_guards() {
        let e = event();
        let now = during_sale();
        let invalid =
            |b: OrderBody| matches!(validate(&b, &e, UserId(9), now), Err(Refusal::Invalid(_)));
        assert!(invalid(body(1, None, None)), "neither quantity nor seats");
        assert!(invalid(body(2, Some(1), Some(&["1:1"]))), "both");
        assert!(invalid(body(99, Some(1), None)), "unknown category");
        assert!(invalid(body(1, Some(0), None)), "zero");
        assert!(invalid(body(1, Some(5), None)), "over the limit");
        assert!(
            invalid(body(1, None, Some(&["1:1"]))),
            "seats in an unseated category"
        );
        assert!(
            invalid(body(2, None, Some(&["3:1"]))),
            "row outside the grid"
        );
        assert!(
            invalid(body(2, None, Some(&["1:1", "1:1"]))),
            "same seat twice"
        );
        assert!(invalid(body(2, None, Some(&["A1"]))), "not row:col");
        let before = DateTime::parse_from_rfc3339("2029-12-31T23:59:59Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            validate(&body(1, Some(1), None), &e, UserId(9), before),
            Err(Refusal::NotOpen)
        );
        let mut closed = event();
        closed.status = EventStatus::Closed;
        assert_eq!(
            validate(&body(1, Some(1), None), &closed, UserId(9), now),
            Err(Refusal::NotOpen)
        );
    }
}
