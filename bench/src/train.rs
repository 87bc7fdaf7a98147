//! `sale --train STATIONS:SEATS` (docs/trains.md "The bench"): one class of seats on a
//! route, buyers with random journeys, and what the sale sold next to what 12306's
//! counters, and an exact first-fit seat model, would have sold on the same requests.

use std::collections::HashSet;
use std::time::Duration;

use rand::Rng;
use serde::Serialize;
use serde_json::Value;

use stampede_core::trains::{Journey, MAX_STATIONS};

use crate::audit::Audit;
use crate::stack::event_body;

/// Most seats of the bench's train class: a whole 16-carriage train's worth. A purchase
/// reads the class's seats in its script (docs/trains.md "Cost").
pub const MAX_SEATS: u32 = 1_000;

/// Seats per carriage at most.
const CARRIAGE: u32 = 100;

/// The train of `--train STATIONS:SEATS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Train {
    pub stations: u16,
    pub seats: u32,
}

impl Train {
    /// `STATIONS:SEATS`, e.g. `10:200`.
    pub fn parse(s: &str) -> Result<Train, String> {
        let (st, se) = s.split_once(':').ok_or("STATIONS:SEATS, e.g. 10:200")?;
        let stations: u16 = st.parse().map_err(|_| "STATIONS must be a number")?;
        let seats: u32 = se.parse().map_err(|_| "SEATS must be a number")?;
        if !(2..=MAX_STATIONS).contains(&usize::from(stations)) {
            return Err(format!("a train has 2 to {MAX_STATIONS} stations"));
        }
        if !(1..=MAX_SEATS).contains(&seats) {
            return Err(format!("SEATS is 1 to {MAX_SEATS}"));
        }
        Ok(Train { stations, seats })
    }

    pub fn segments(self) -> u32 {
        u32::from(self.stations) - 1
    }

    /// (carriages, seats per carriage): the most seats per carriage up to 100 that
    /// divide SEATS evenly.
    pub fn layout(self) -> (u32, u32) {
        let per = (1..=CARRIAGE.min(self.seats))
            .rev()
            .find(|d| self.seats.is_multiple_of(*d))
            .expect("1 divides");
        (self.seats / per, per)
    }

    /// The event: one class "Second" priced per segment, selling from `start_in`.
    pub fn event_body(self, per_user_limit: u32, start_in: Duration) -> Value {
        let (carriages, per) = self.layout();
        let mut body = event_body("stampede-bench train", 1, 1, None, per_user_limit, start_in);
        body["kind"] = "train".into();
        body["stations"] = (0..self.stations).map(|i| format!("S{i}")).collect();
        body["categories"] = serde_json::json!([
            {"name": "Second", "price_cents": 1000, "seats": {"rows": carriages, "cols": per}}
        ]);
        body
    }

    /// A journey drawn uniformly over the route's (from, to) pairs.
    pub fn journey(self, rng: &mut impl Rng) -> Journey {
        let a = rng.gen_range(0..self.stations);
        let b = rng.gen_range(0..self.stations - 1);
        let b = if b >= a { b + 1 } else { b };
        Journey {
            from: a.min(b),
            to: a.max(b),
        }
    }
}

/// A train sale's seat-segments: what was asked, what Stampede sold, and what 12306's
/// counters and an exact first-fit seat model would have sold on the same requests.
#[derive(Debug, Serialize)]
pub struct TrainReport {
    pub stations: u16,
    pub seats: u32,
    pub carriages: u32,
    pub seats_per_carriage: u32,
    /// seats × segments.
    pub seat_segments_total: u64,
    /// Buyers whose journey the sale decided (202 or 409 SOLD_OUT), each once, in the
    /// order the bench heard the decisions: the request sequence every model replays.
    pub requests: u64,
    /// Their journeys' seat-segments.
    pub demanded: u64,
    /// Seat-segments in the sale's orders (MySQL, the audit's count).
    pub sold: u64,
    /// Of which still in live orders when audited (fewer once orders were cancelled,
    /// as in --pay-race).
    pub held: u64,
    /// Of those buyers, how many heard SOLD_OUT first.
    pub sold_out: u64,
    /// sold ÷ seat_segments_total.
    pub utilisation: f64,
    /// sold ÷ demanded.
    pub sold_of_demanded: f64,
    pub counters_12306_sold: u64,
    pub counters_12306_utilisation: f64,
    pub counters_12306_refused: u64,
    /// Refusals while a seat was free on the journey (the counters' tickets seated
    /// first-fit): seats the counters could not see.
    pub counters_12306_false_sold_outs: u64,
    /// An exact seat model, first fit, on the same sequence.
    pub first_fit_sold: u64,
}

/// `decisions`: (µs after the open, buyer, admitted) of every 202 and 409 SOLD_OUT;
/// `journeys[buyer]`; the seat-segments sold from the audit.
pub fn report(
    train: Train,
    journeys: &[Journey],
    mut decisions: Vec<(u64, usize, bool)>,
    audit: &Audit,
) -> TrainReport {
    let sold = audit.seat_segments_ordered;
    decisions.sort_unstable_by_key(|d| d.0);
    let mut seen = HashSet::new();
    decisions.retain(|d| seen.insert(d.1));
    let sequence: Vec<Journey> = decisions.iter().map(|d| journeys[d.1]).collect();
    let total = u64::from(train.seats) * u64::from(train.segments());
    let demanded = span_sum(&sequence);
    let counters = counters_12306(train, &sequence);
    let (carriages, per) = train.layout();
    let share = |n: u64, of: u64| n as f64 / of.max(1) as f64;
    TrainReport {
        stations: train.stations,
        seats: train.seats,
        carriages,
        seats_per_carriage: per,
        seat_segments_total: total,
        requests: sequence.len() as u64,
        demanded,
        sold,
        held: audit.seat_segments_held,
        sold_out: decisions.iter().filter(|d| !d.2).count() as u64,
        utilisation: share(sold, total),
        sold_of_demanded: share(sold, demanded),
        counters_12306_sold: counters.sold,
        counters_12306_utilisation: share(counters.sold, total),
        counters_12306_refused: counters.refused,
        counters_12306_false_sold_outs: counters.false_sold_outs,
        first_fit_sold: first_fit(train, &sequence),
    }
}

fn span_sum(journeys: &[Journey]) -> u64 {
    journeys.iter().map(|j| u64::from(j.span())).sum()
}

/// A class's seats, each a bitset of its taken segments (at most 63).
struct Seats(Vec<u64>);

impl Seats {
    fn new(train: Train) -> Seats {
        Seats(vec![0; train.seats as usize])
    }

    fn mask(j: Journey) -> u64 {
        ((1u64 << j.span()) - 1) << j.from
    }

    fn free(&self, j: Journey) -> bool {
        self.0.iter().any(|s| s & Seats::mask(j) == 0)
    }

    /// Takes the lowest seat free on the whole journey, if one is.
    fn take_first_fit(&mut self, j: Journey) -> bool {
        let m = Seats::mask(j);
        match self.0.iter_mut().find(|s| **s & m == 0) {
            Some(s) => {
                *s |= m;
                true
            }
            None => false,
        }
    }
}

/// Seat-segments an exact seat model sells on `sequence`, each journey on the lowest
/// seat free on all of it.
fn first_fit(train: Train, sequence: &[Journey]) -> u64 {
    let mut seats = Seats::new(train);
    sequence
        .iter()
        .filter(|j| seats.take_first_fit(**j))
        .map(|j| u64::from(j.span()))
        .sum()
}

#[derive(Debug, PartialEq, Eq)]
struct CounterRun {
    sold: u64,
    refused: u64,
    false_sold_outs: u64,
}

/// 12306's counter method on `sequence`: a counter per (from, to) starting at the
/// seat count; a journey is refused when its own counter is 0, else every counter whose
/// pair shares a segment with it goes down by one (not below 0). Tickets sold this
/// way always find a seat (fewer than SEATS sold journeys share a segment with one
/// allowed), so they are seated first-fit to see which refusals had a seat free.
fn counters_12306(train: Train, sequence: &[Journey]) -> CounterRun {
    let n = usize::from(train.stations);
    let mut left = vec![train.seats; n * n];
    let mut seats = Seats::new(train);
    let mut run = CounterRun {
        sold: 0,
        refused: 0,
        false_sold_outs: 0,
    };
    for &j in sequence {
        let (f, t) = (usize::from(j.from), usize::from(j.to));
        if left[f * n + t] == 0 {
            run.refused += 1;
            run.false_sold_outs += u64::from(seats.free(j));
            continue;
        }
        for a in 0..t {
            for b in (a + 1).max(f + 1)..n {
                left[a * n + b] = left[a * n + b].saturating_sub(1);
            }
        }
        assert!(seats.take_first_fit(j), "a counter-sold ticket has a seat");
        run.sold += u64::from(j.span());
    }
    run
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn j(from: u16, to: u16) -> Journey {
        Journey { from, to }
    }

    fn train(stations: u16, seats: u32) -> Train {
        Train { stations, seats }
    }

    #[test]
    fn the_train_option_reads_stations_and_seats_within_bounds() {
        assert_eq!(Train::parse("10:200"), Ok(train(10, 200)));
        assert_eq!(Train::parse("64:1000"), Ok(train(64, 1000)));
        assert_eq!(Train::parse("2:1"), Ok(train(2, 1)));
        for bad in ["10", "1:5", "65:5", "x:y", "10:0", "10:1001", "10:-3", ":5"] {
            assert!(Train::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn seats_fill_carriages_of_at_most_a_hundred_evenly() {
        assert_eq!(train(10, 200).layout(), (2, 100));
        assert_eq!(train(10, 150).layout(), (2, 75));
        assert_eq!(train(10, 64).layout(), (1, 64));
        assert_eq!(train(10, 101).layout(), (101, 1));
    }

    #[test]
    fn journeys_cover_every_pair_in_route_order() {
        let t = train(5, 1);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let drawn: HashSet<Journey> = (0..2_000).map(|_| t.journey(&mut rng)).collect();
        assert_eq!(drawn.len(), 10, "every one of the 5 × 4 / 2 pairs");
        assert!(drawn.iter().all(|j| j.from < j.to && j.to < 5));
    }

    #[test]
    fn counters_refuse_a_journey_whose_seat_two_short_tickets_share() {
        // Two seats, A B C. A→B decrements (A,B) and (A,C); B→C decrements (B,C) and
        // (A,C): (A,C) is 0 although both sat on seat 1 and seat 2 is free A→C.
        let sequence = [j(0, 1), j(1, 2), j(0, 2)];
        assert_eq!(
            counters_12306(train(3, 2), &sequence),
            CounterRun {
                sold: 2,
                refused: 1,
                false_sold_outs: 1
            }
        );
        assert_eq!(first_fit(train(3, 2), &sequence), 4, "the whole train");
    }

    #[test]
    fn with_one_seat_the_counters_are_exact() {
        // A→B leaves (B,C) alone (it shares no segment), so B→C sells; then A→C's
        // counter is 0 and the seat is indeed taken.
        let sequence = [j(0, 1), j(1, 2), j(0, 2)];
        assert_eq!(
            counters_12306(train(3, 1), &sequence),
            CounterRun {
                sold: 2,
                refused: 1,
                false_sold_outs: 0
            }
        );
    }

    #[test]
    fn first_fit_fills_gaps_and_refuses_only_a_taken_journey() {
        // One seat, A B C D: A→B, C→D, then B→C fills the gap; A→D finds it full.
        let sequence = [j(0, 1), j(2, 3), j(1, 2), j(0, 3)];
        assert_eq!(first_fit(train(4, 1), &sequence), 3);
        // 63 segments: the whole route's mask is exact.
        assert_eq!(first_fit(train(64, 1), &[j(0, 63), j(62, 63)]), 63);
    }

    #[test]
    fn counters_never_sell_a_ticket_without_a_seat_nor_beyond_the_train() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..200 {
            let t = train(rng.gen_range(2..=8), rng.gen_range(1..=4));
            let sequence: Vec<Journey> = (0..40).map(|_| t.journey(&mut rng)).collect();
            // `counters_12306` asserts every ticket it sells finds a seat.
            let run = counters_12306(t, &sequence);
            let total = u64::from(t.seats * t.segments());
            assert!(run.sold <= total && first_fit(t, &sequence) <= total);
            assert!(run.false_sold_outs <= run.refused);
        }
    }

    #[test]
    fn the_sequence_is_each_buyers_first_decision_in_time() {
        let t = train(3, 1);
        let journeys = [j(0, 2), j(0, 1), j(1, 2)];
        // Buyer 0 is decided last; buyer 1's repeat (a later 202) counts once.
        let decisions = vec![(30, 0, false), (10, 1, true), (20, 2, true), (25, 1, true)];
        let audit = Audit {
            seat_segments_ordered: 2,
            seat_segments_held: 2,
            ..Audit::default()
        };
        let r = report(t, &journeys, decisions, &audit);
        assert_eq!((r.requests, r.demanded, r.sold_out), (3, 4, 1));
        assert_eq!((r.counters_12306_sold, r.first_fit_sold), (2, 2));
        assert_eq!(r.utilisation, 1.0);
        assert_eq!(r.sold_of_demanded, 0.5);
    }
}
