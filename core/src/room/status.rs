//! What a buyer in line reads (`GET /api/events/{id}/queue`): computed from the room's
//! state by the edge (`lua/edge/stampede/room.lua`, from its snapshot) and by the core
//! (here, from Redis) with the same rules, in this order:
//!
//! 1. the sale closed or over → `closed`;
//! 2. every category sold out → `sold_out`;
//! 3. joined before the open and not drawn yet → `waiting`, no position yet;
//! 4. a position released less than `pass_ttl_s` ago → `your_turn` with a pass good
//!    until that release + `pass_ttl_s`; released longer ago → `expired`;
//! 5. otherwise `waiting`: `ahead` = position − served − 1, `eta_s` = ⌈(ahead + 1) ÷
//!    the release rate in force⌉ (none while the rate is 0).

use serde::Serialize;

/// A release: positions `from + 1 ..= upto` had their turn from `at_ms` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub from: u64,
    pub upto: u64,
    pub at_ms: i64,
}

impl Step {
    /// A step as `room_release.lua` writes it: `<from>:<upto>:<ms>`.
    pub fn parse(text: &str) -> Option<Step> {
        let mut p = text.split(':');
        let step = Step {
            from: p.next()?.parse().ok()?,
            upto: p.next()?.parse().ok()?,
            at_ms: p.next()?.parse().ok()?,
        };
        p.next().is_none().then_some(step)
    }
}

/// The room as one read saw it.
#[derive(Debug, Clone, Default)]
pub struct Room {
    pub closed: bool,
    pub sold_out: bool,
    /// The last position released.
    pub served: u64,
    /// Positions per second now.
    pub rate: f64,
    pub ttl_ms: i64,
    /// The releases of the last `ttl_ms` at least.
    pub steps: Vec<Step>,
}

/// A buyer's place: joined before the open and not drawn yet, or a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Undrawn,
    At(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Waiting,
    YourTurn,
    SoldOut,
    Closed,
    Expired,
}

/// The answer, before the pass is signed.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub state: State,
    pub position: Option<u64>,
    pub ahead: Option<u64>,
    pub eta_s: Option<u64>,
    /// `your_turn`: the pass's id (the position) and when it expires.
    pub pass: Option<(u64, i64)>,
}

pub fn status(room: &Room, place: Place, now_ms: i64) -> Status {
    let plain = |state| Status {
        state,
        position: None,
        ahead: None,
        eta_s: None,
        pass: None,
    };
    if room.closed {
        return plain(State::Closed);
    }
    if room.sold_out {
        return plain(State::SoldOut);
    }
    let Place::At(p) = place else {
        return plain(State::Waiting);
    };
    if p <= room.served {
        let step = room.steps.iter().find(|s| s.from < p && p <= s.upto);
        return match step {
            Some(s) if s.at_ms + room.ttl_ms > now_ms => Status {
                state: State::YourTurn,
                position: Some(p),
                ahead: Some(0),
                eta_s: Some(0),
                pass: Some((p, s.at_ms + room.ttl_ms)),
            },
            _ => Status {
                position: Some(p),
                ..plain(State::Expired)
            },
        };
    }
    let ahead = p - room.served - 1;
    Status {
        state: State::Waiting,
        position: Some(p),
        ahead: Some(ahead),
        eta_s: (room.rate > 0.0).then(|| ((ahead + 1) as f64 / room.rate).ceil() as u64),
        pass: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room() -> Room {
        Room {
            served: 10,
            rate: 4.0,
            ttl_ms: 1_000,
            steps: vec![
                Step {
                    from: 0,
                    upto: 5,
                    at_ms: 100,
                },
                Step {
                    from: 5,
                    upto: 10,
                    at_ms: 900,
                },
            ],
            ..Room::default()
        }
    }

    #[test]
    fn each_place_reads_its_state() {
        let r = room();
        let s = status(&r, Place::At(7), 1_000);
        assert_eq!((s.state, s.pass), (State::YourTurn, Some((7, 1_900))));
        assert_eq!(status(&r, Place::At(3), 1_100).state, State::Expired);
        assert_eq!(status(&r, Place::At(3), 1_099).state, State::YourTurn);
        let w = status(&r, Place::At(19), 1_000);
        assert_eq!(
            (w.state, w.ahead, w.eta_s),
            (State::Waiting, Some(8), Some(3))
        );
        assert_eq!(status(&r, Place::Undrawn, 0).state, State::Waiting);
        assert_eq!(Step::parse("5:10:900"), Some(r.steps[1]));
        assert_eq!(Step::parse("5:10:900:1"), None);
        let sold = Room {
            sold_out: true,
            ..room()
        };
        assert_eq!(status(&sold, Place::At(7), 1_000).state, State::SoldOut);
        let closed = Room {
            closed: true,
            sold_out: true,
            ..room()
        };
        assert_eq!(status(&closed, Place::At(19), 1_000).state, State::Closed);
        let stopped = Room {
            rate: 0.0,
            ..room()
        };
        assert_eq!(status(&stopped, Place::At(19), 1_000).eta_s, None);
    }
}
