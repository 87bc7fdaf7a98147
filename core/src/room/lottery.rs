//! The draw at the open (docs/waiting-room.md "Fairness"). Everyone who joined before
//! the open is ordered by SHA-256 of `<seed>:<user id>` (hex, ascending); the seed's
//! SHA-256 was published before the open and the seed itself is published after, with
//! the joiners, so anyone can recompute the order.

use sha2::{Digest, Sha256};

/// The rule as published at `GET /api/events/{id}/queue/fairness`.
pub const RULE: &str = "Everyone in `joined` (who joined before the open) is ordered by the \
lowercase hex SHA-256 of \"<seed>:<user id>\" (seed as published, user id in decimal), \
ascending: positions 1..N. Anyone who joined after the open is behind them, in arrival \
order (N+1, N+2, ...). commitment = hex SHA-256 of the seed text.";

/// The key a user is ordered by.
pub fn ticket(seed_hex: &str, user_id: u64) -> [u8; 32] {
    Sha256::digest(format!("{seed_hex}:{user_id}").as_bytes()).into()
}

/// The joiners in line order.
pub fn order(seed_hex: &str, mut users: Vec<u64>) -> Vec<u64> {
    users.sort_by_cached_key(|u| ticket(seed_hex, *u));
    users
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_depends_on_the_seed_only() {
        let users: Vec<u64> = (1..=50).collect();
        let a = order("aa", users.clone());
        let mut reversed = users.clone();
        reversed.reverse();
        assert_eq!(order("aa", reversed), a, "arrival order does not matter");
        assert_ne!(order("ab", users.clone()), a);
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, users);
        // The first in line has the smallest ticket.
        assert!(users.iter().all(|u| ticket("aa", a[0]) <= ticket("aa", *u)));
    }
}
