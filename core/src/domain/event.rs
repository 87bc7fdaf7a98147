//! An event as the admin describes it, checked whole before anything is written.

use chrono::{DateTime, Utc};
use serde::Deserialize;

/// Largest number of categories, seats per category and units per category; beyond
/// these an input is more likely a mistake than a sale.
pub const MAX_CATEGORIES: usize = 64;
pub const MAX_SEAT_SIDE: u32 = 1_000;
pub const MAX_SEATS_PER_CATEGORY: u32 = 100_000;
pub const MAX_UNITS_PER_CATEGORY: u32 = 10_000_000;
/// A ticket's price, at most (10 000 000 000.00): an order's amount — the price times up
/// to 1 000 tickets times up to 63 segments of a journey — then stays far inside u64
/// (review: an unbounded price wrapped an order's amount round to 0).
pub const MAX_PRICE_CENTS: u64 = 1_000_000_000_000;
/// Seats of all an event's categories, at most: a seat is a MySQL row and a Redis
/// field, all written when the event is created (64 categories of 100 000 were 6.4 M
/// rows from a 5 KB request, past the request's timeout).
pub const MAX_SEATS_PER_EVENT: u32 = 1_000_000;
/// Most Redis buckets one event's stock may be split over (docs/scaling.md).
pub const MAX_BUCKETS: u32 = 16;

/// `POST /admin/events` as received.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventRequest {
    pub title: String,
    pub venue: String,
    pub show_time: String,
    pub sale_start: String,
    pub sale_end: String,
    pub per_user_limit: i64,
    pub pay_timeout_s: i64,
    /// Redis buckets the stock is split over (1 when absent: one hash tag).
    pub buckets: Option<i64>,
    /// "sale" (absent) or "train" (docs/trains.md).
    pub kind: Option<String>,
    /// A train's stations along its route, in order.
    pub stations: Option<Vec<String>>,
    pub categories: Vec<CategoryRequest>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CategoryRequest {
    pub name: String,
    pub price_cents: i64,
    pub quantity: Option<i64>,
    pub seats: Option<SeatsRequest>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeatsRequest {
    pub rows: i64,
    pub cols: i64,
}

/// A valid new event.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub title: String,
    pub venue: String,
    pub show_time: DateTime<Utc>,
    pub sale_start: DateTime<Utc>,
    pub sale_end: DateTime<Utc>,
    pub per_user_limit: u32,
    pub pay_timeout_s: u32,
    pub buckets: u32,
    /// A train's stations (2 … 64, docs/trains.md); empty for any other event.
    pub stations: Vec<String>,
    pub categories: Vec<NewCategory>,
}

impl NewEvent {
    /// Units of a category as the stock books count them: for a train's class its
    /// seat-segments (seats × segments of the route), else its units or seats.
    pub fn units(&self, c: &NewCategory) -> u32 {
        match self.stations.len() {
            0 => c.stock.total(),
            n => c.stock.total() * (n as u32 - 1),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct NewCategory {
    pub name: String,
    pub price_cents: u64,
    pub stock: Stock,
}

/// How a category's units are counted: plain units or a grid of seats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stock {
    Units(u32),
    Seats { rows: u32, cols: u32 },
}

impl Stock {
    pub fn total(self) -> u32 {
        match self {
            Stock::Units(n) => n,
            Stock::Seats { rows, cols } => rows * cols,
        }
    }
}

impl TryFrom<EventRequest> for NewEvent {
    type Error = String;

    fn try_from(r: EventRequest) -> Result<NewEvent, String> {
        let title = text("title", &r.title, 200)?;
        let venue = text("venue", &r.venue, 200)?;
        let show_time = time("show_time", &r.show_time)?;
        let sale_start = time("sale_start", &r.sale_start)?;
        let sale_end = time("sale_end", &r.sale_end)?;
        if sale_start >= sale_end {
            return Err("sale_start must be before sale_end".into());
        }
        // A sale over before it is made could never open, and a show before its sale
        // starts is a mistake in one of the two (review: both were accepted).
        if sale_end <= chrono::Utc::now() {
            return Err("sale_end is in the past: the sale could never open".into());
        }
        if show_time < sale_start {
            return Err("show_time must not be before sale_start".into());
        }
        let per_user_limit = within("per_user_limit", r.per_user_limit, 1, 1_000)?;
        let pay_timeout_s = within("pay_timeout_s", r.pay_timeout_s, 1, 86_400)?;
        let buckets = within("buckets", r.buckets.unwrap_or(1), 1, MAX_BUCKETS.into())?;
        if r.categories.is_empty() {
            return Err("an event needs at least one category".into());
        }
        if r.categories.len() > MAX_CATEGORIES {
            return Err(format!("at most {MAX_CATEGORIES} categories"));
        }
        let mut categories: Vec<NewCategory> = Vec::with_capacity(r.categories.len());
        for (i, c) in r.categories.into_iter().enumerate() {
            let name = text(&format!("categories[{i}].name"), &c.name, 100)?;
            if categories.iter().any(|other| other.name == name) {
                return Err(format!("categories[{i}].name {name:?} is used twice"));
            }
            let price_cents = u64::try_from(c.price_cents)
                .ok()
                .filter(|p| *p <= MAX_PRICE_CENTS)
                .ok_or_else(|| {
                    format!("categories[{i}].price_cents must be 0 … {MAX_PRICE_CENTS}")
                })?;
            let stock = match (c.quantity, c.seats) {
                (Some(q), None) => Stock::Units(within(
                    &format!("categories[{i}].quantity"),
                    q,
                    1,
                    i64::from(MAX_UNITS_PER_CATEGORY),
                )?),
                (None, Some(s)) => {
                    let rows = within(
                        &format!("categories[{i}].seats.rows"),
                        s.rows,
                        1,
                        MAX_SEAT_SIDE.into(),
                    )?;
                    let cols = within(
                        &format!("categories[{i}].seats.cols"),
                        s.cols,
                        1,
                        MAX_SEAT_SIDE.into(),
                    )?;
                    if rows * cols > MAX_SEATS_PER_CATEGORY {
                        return Err(format!(
                            "categories[{i}] has {} seats; at most {MAX_SEATS_PER_CATEGORY}",
                            rows * cols
                        ));
                    }
                    Stock::Seats { rows, cols }
                }
                _ => {
                    return Err(format!(
                        "categories[{i}] needs exactly one of quantity or seats"
                    ));
                }
            };
            categories.push(NewCategory {
                name,
                price_cents,
                stock,
            });
        }
        let seats: u32 = categories
            .iter()
            .map(|c| match c.stock {
                Stock::Seats { rows, cols } => rows * cols,
                Stock::Units(_) => 0,
            })
            .sum();
        if seats > MAX_SEATS_PER_EVENT {
            return Err(format!(
                "the categories have {seats} seats; at most {MAX_SEATS_PER_EVENT} an event"
            ));
        }
        let stations = match (r.kind.as_deref(), r.stations) {
            (None | Some("sale"), None) => Vec::new(),
            (None | Some("sale"), Some(_)) => {
                return Err("stations are for kind \"train\"".into());
            }
            (Some("train"), None) => return Err("a train needs its stations".into()),
            (Some("train"), Some(names)) => {
                let max = crate::trains::MAX_STATIONS;
                if !(2..=max).contains(&names.len()) {
                    return Err(format!("a train has 2 to {max} stations"));
                }
                let mut stations: Vec<String> = Vec::with_capacity(names.len());
                for (i, name) in names.iter().enumerate() {
                    let name = text(&format!("stations[{i}]"), name, 100)?;
                    if stations.contains(&name) {
                        return Err(format!("stations[{i}] {name:?} is on the route twice"));
                    }
                    stations.push(name);
                }
                if buckets != 1 {
                    return Err("a train has 1 bucket (a seat's segments stay in one slot)".into());
                }
                if let Some(i) = categories
                    .iter()
                    .position(|c| !matches!(c.stock, Stock::Seats { .. }))
                {
                    return Err(format!(
                        "categories[{i}] of a train is a class: it needs seats \
                         (rows = carriages, cols = seats per carriage), not a quantity"
                    ));
                }
                stations
            }
            (Some(other), _) => {
                return Err(format!("kind must be \"sale\" or \"train\", not {other:?}"));
            }
        };
        Ok(NewEvent {
            title,
            venue,
            show_time,
            sale_start,
            sale_end,
            per_user_limit,
            pay_timeout_s,
            buckets,
            stations,
            categories,
        })
    }
}

fn text(field: &str, value: &str, max: usize) -> Result<String, String> {
    let v = value.trim();
    if v.is_empty() {
        return Err(format!("{field} must not be empty"));
    }
    if v.chars().count() > max {
        return Err(format!("{field} is longer than {max} characters"));
    }
    if let Some(c) = v.chars().find(|c| unseen(*c)) {
        return Err(format!(
            "{field} contains U+{:04X}, a control or invisible character",
            u32::from(c)
        ));
    }
    Ok(v.to_owned())
}

/// A character a buyer or an operator would not see as what it is: controls (a line
/// break, a NUL, an escape), line and paragraph separators, the direction overrides and
/// isolates that reorder what follows them on screen, and the invisible ones that make
/// two names look alike ("GA" and "GA" with a zero-width space are two categories).
/// The zero-width joiner and non-joiner stay allowed: scripts and emoji need them.
fn unseen(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{E0000}'..='\u{E007F}'
        )
}

/// Times from 1970 to 9999 (UTC): what MySQL's DATETIME and the sale's millisecond
/// clocks hold.
fn time(field: &str, value: &str) -> Result<DateTime<Utc>, String> {
    use chrono::Datelike;
    let t = DateTime::parse_from_rfc3339(value)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{field} is not an RFC 3339 time ({value:?}): {e}"))?;
    if !(1970..=9999).contains(&t.year()) {
        return Err(format!(
            "{field} must be within the years 1970..=9999 UTC, got {value:?}"
        ));
    }
    Ok(t)
}

fn within(field: &str, value: i64, min: i64, max: i64) -> Result<u32, String> {
    if value < min || value > max {
        return Err(format!("{field} must be within {min}..={max}, got {value}"));
    }
    Ok(value as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(categories: serde_json::Value) -> EventRequest {
        serde_json::from_value(serde_json::json!({
            "title": "Concert", "venue": "Arena",
            "show_time": "2030-01-02T20:00:00Z",
            "sale_start": "2030-01-01T10:00:00+08:00", "sale_end": "2030-01-01T12:00:00Z",
            "per_user_limit": 4, "pay_timeout_s": 900,
            "categories": categories,
        }))
        .unwrap()
    }

    /// Why an event of one GA category, changed by `edit`, is refused.
    fn refusal(edit: impl FnOnce(&mut EventRequest)) -> String {
        let mut r = request(serde_json::json!([{"name": "GA", "price_cents": 1, "quantity": 1}]));
        edit(&mut r);
        NewEvent::try_from(r).expect_err("refused")
    }

    #[test]
    fn a_train_has_stations_and_seated_classes_counted_in_seat_segments() {
        let classes = serde_json::json!([
            {"name": "first", "price_cents": 2000, "seats": {"rows": 2, "cols": 10}},
        ]);
        let train = |kind: serde_json::Value, stations: serde_json::Value| {
            let r = serde_json::json!({
                "title": "G1", "venue": "Line 1",
                "show_time": "2030-01-02T20:00:00Z",
                "sale_start": "2030-01-01T10:00:00Z", "sale_end": "2030-01-01T12:00:00Z",
                "per_user_limit": 4, "pay_timeout_s": 900,
                "kind": kind, "stations": stations, "categories": classes,
            });
            serde_json::from_value::<EventRequest>(r)
                .map_err(|e| e.to_string())
                .and_then(NewEvent::try_from)
        };
        let e = train("train".into(), serde_json::json!(["A", "B", "C", "D"])).unwrap();
        assert_eq!(e.stations, ["A", "B", "C", "D"]);
        assert_eq!(e.units(&e.categories[0]), 20 * 3);
        for (kind, stations, why) in [
            (
                serde_json::json!("train"),
                serde_json::json!(["A"]),
                "2 to 64",
            ),
            (
                serde_json::json!("train"),
                serde_json::json!(["A", "B", "A"]),
                "twice",
            ),
            (
                serde_json::json!("train"),
                serde_json::json!(["A", ""]),
                "stations[1]",
            ),
            (
                serde_json::json!("train"),
                serde_json::Value::Null,
                "needs its stations",
            ),
            (
                serde_json::json!("sale"),
                serde_json::json!(["A", "B"]),
                "for kind",
            ),
            (
                serde_json::json!("boat"),
                serde_json::json!(["A", "B"]),
                "kind must be",
            ),
        ] {
            let err = train(kind, stations).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
        let many: Vec<String> = (0..65).map(|i| format!("S{i}")).collect();
        assert!(train("train".into(), serde_json::json!(many)).is_err());
        let mut r = request(serde_json::json!([{"name": "GA", "price_cents": 1, "quantity": 9}]));
        r.kind = Some("train".into());
        r.stations = Some(vec!["A".into(), "B".into()]);
        assert!(NewEvent::try_from(r).unwrap_err().contains("needs seats"));
    }

    #[test]
    fn a_valid_event_becomes_a_new_event_in_utc() {
        let e = NewEvent::try_from(request(serde_json::json!([
            {"name": "GA", "price_cents": 5000, "quantity": 300},
            {"name": "Seated", "price_cents": 9000, "seats": {"rows": 10, "cols": 20}},
        ])))
        .unwrap();
        assert_eq!(e.sale_start.to_rfc3339(), "2030-01-01T02:00:00+00:00");
        assert_eq!(e.categories[0].stock, Stock::Units(300));
        assert_eq!(e.categories[1].stock.total(), 200);
    }

    #[test]
    fn names_with_controls_or_invisible_characters_are_refused_and_joiners_kept() {
        for (bad, code) in [
            ("GA\u{200B}", "U+200B"),
            ("Stalls\nrow 1", "U+000A"),
            ("A\u{0}B", "U+0000"),
            ("\u{202E}AG", "U+202E"),
            ("VIP\u{2066}x\u{2069}", "U+2066"),
            ("\u{FEFF}GA", "U+FEFF"),
            ("G\u{00AD}A", "U+00AD"),
            ("GA\u{E0041}", "U+E0041"),
            ("GA\u{1B}[31m", "U+001B"),
        ] {
            let r = request(serde_json::json!([{"name": bad, "price_cents": 1, "quantity": 1}]));
            let e = NewEvent::try_from(r).expect_err(bad);
            assert!(
                e.contains("categories[0].name") && e.contains(code),
                "{bad:?}: {e}"
            );
        }
        let e = refusal(|r| r.title = "Tour\u{2028}2031".into());
        assert!(e.contains("title") && e.contains("U+2028"), "{e}");
        // Persian with a zero-width non-joiner, an emoji family with joiners, accents.
        for good in ["می\u{200C}خواهم", "👨\u{200D}👩\u{200D}👧", "Café Élysée"] {
            let r = request(serde_json::json!([{"name": good, "price_cents": 1, "quantity": 1}]));
            let event = NewEvent::try_from(r).unwrap_or_else(|e| panic!("{good:?}: {e}"));
            assert_eq!(event.categories[0].name, good);
        }
    }

    #[test]
    fn bad_input_is_refused_with_the_field_named() {
        let cases = [
            (serde_json::json!([]), "at least one category"),
            (
                serde_json::json!([{"name": "GA", "price_cents": 1, "quantity": 0}]),
                "quantity",
            ),
            (
                serde_json::json!([{"name": "GA", "price_cents": -1, "quantity": 3}]),
                "price_cents",
            ),
            (
                serde_json::json!([{"name": "S", "price_cents": 1, "seats": {"rows": 0, "cols": 3}}]),
                "seats.rows",
            ),
            (
                serde_json::json!([{"name": "GA", "price_cents": 1}]),
                "exactly one",
            ),
            (
                serde_json::json!([{"name": "GA", "price_cents": 1, "quantity": 1, "seats": {"rows": 1, "cols": 1}}]),
                "exactly one",
            ),
            (
                serde_json::json!([{"name": "A", "price_cents": 1, "quantity": 1}, {"name": "A", "price_cents": 1, "quantity": 1}]),
                "used twice",
            ),
            (
                serde_json::json!([{"name": "GA", "price_cents": 4_611_686_018_427_387_904u64, "quantity": 10}]),
                "price_cents must be 0 … 1000000000000",
            ),
            (
                serde_json::json!((0..11).map(|i| serde_json::json!({"name": format!("S{i}"), "price_cents": 1, "seats": {"rows": 1000, "cols": 100}})).collect::<Vec<_>>()),
                "1100000 seats; at most 1000000 an event",
            ),
        ];
        for (cats, expected) in cases {
            let err = NewEvent::try_from(request(cats)).unwrap_err();
            assert!(err.contains(expected), "{err} should mention {expected}");
        }
        let at_most =
            serde_json::json!([{"name": "GA", "price_cents": MAX_PRICE_CENTS, "quantity": 1}]);
        assert!(NewEvent::try_from(request(at_most)).is_ok());
    }

    #[test]
    fn bad_times_are_refused() {
        assert!(
            refusal(|r| r.sale_end = "2030-01-01T01:00:00Z".into()).contains("before sale_end")
        );
        assert!(
            refusal(|r| {
                (r.sale_start, r.sale_end) =
                    ("2024-01-01T10:00:00Z".into(), "2024-01-01T12:00:00Z".into())
            })
            .contains("sale_end is in the past")
        );
        assert!(
            refusal(|r| r.show_time = "2029-12-31T20:00:00Z".into())
                .contains("show_time must not be before sale_start")
        );
        assert!(refusal(|r| r.show_time = "tomorrow".into()).contains("show_time"));
        for out_of_range in [
            "0017-01-10T00:00:00Z",
            "1969-12-31T23:59:59Z",
            "9999-12-31T23:00:00-02:00",
        ] {
            assert!(
                refusal(|r| r.sale_start = out_of_range.into()).contains("1970..=9999"),
                "{out_of_range}"
            );
        }
    }

    #[test]
    fn buckets_default_to_one_and_stay_in_range_with_or_without_seats() {
        let units = serde_json::json!([{"name": "GA", "price_cents": 1, "quantity": 9}]);
        assert_eq!(
            NewEvent::try_from(request(units.clone())).unwrap().buckets,
            1
        );
        for (value, ok) in [
            (1, true),
            (3, true),
            (16, true),
            (0, false),
            (17, false),
            (-1, false),
        ] {
            let mut r = request(units.clone());
            r.buckets = Some(value);
            match NewEvent::try_from(r) {
                Ok(e) => assert!(ok && e.buckets == value as u32, "{value}"),
                Err(e) => assert!(!ok && e.contains("buckets"), "{value}: {e}"),
            }
        }
        let mut r = request(serde_json::json!([
            {"name": "GA", "price_cents": 1, "quantity": 9},
            {"name": "S", "price_cents": 1, "seats": {"rows": 2, "cols": 2}},
        ]));
        r.buckets = Some(2);
        assert_eq!(NewEvent::try_from(r).unwrap().buckets, 2);
    }
}
