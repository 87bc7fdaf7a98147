//! Who is calling: user tokens (issued by the core, verified by the edge and the core),
//! the guards of login, and the admin token.

pub mod login;
pub mod token;

/// Compares secrets in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
