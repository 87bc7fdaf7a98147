//! The join's proof of work (docs/waiting-room.md "Challenge"): a nonce whose SHA-256
//! with the challenge, the user and the event starts with `bits` zero bits. The user is
//! in the hash, so a thousand accounts cost a thousand proofs. A challenge is
//! `<window>.<mac>`: the window (5 minutes of Unix time) and 32 hex digits of a MAC of
//! it and the event with the token keyring, so the core issues and checks challenges
//! without storing any; one is good in its window and the next.

use sha2::{Digest, Sha256};

use crate::auth::token::TokenSigner;

/// Seconds a challenge window lasts.
pub const WINDOW_S: i64 = 300;
/// Longest nonce accepted.
pub const MAX_NONCE_LEN: usize = 32;

fn mac_of(signer: &TokenSigner, event_id: u64, window: i64) -> String {
    let signed = signer.sign_claims(&format!("c.{event_id}.{window}"));
    hex::encode(&Sha256::digest(signed.as_bytes())[..16])
}

/// The challenge to solve now, and the seconds it stays good.
pub fn challenge(signer: &TokenSigner, event_id: u64, now_s: i64) -> (String, i64) {
    let window = now_s.div_euclid(WINDOW_S);
    let good_for = (window + 2) * WINDOW_S - now_s;
    (
        format!("{window}.{}", mac_of(signer, event_id, window)),
        good_for,
    )
}

/// Leading zero bits of a digest.
fn zero_bits(digest: &[u8]) -> u32 {
    let mut n = 0;
    for b in digest {
        if *b == 0 {
            n += 8;
        } else {
            return n + b.leading_zeros();
        }
    }
    n
}

/// The hash a proof is judged by: SHA-256 of `<challenge>:<user>:<event>:<nonce>`.
pub fn digest(challenge: &str, user_id: u64, event_id: u64, nonce: &str) -> [u8; 32] {
    Sha256::digest(format!("{challenge}:{user_id}:{event_id}:{nonce}").as_bytes()).into()
}

/// Why a proof is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error(
        "this waiting room asks for a proof of work: {{\"challenge\", \"nonce\"}} (GET .../queue/challenge)"
    )]
    Missing,
    #[error("the challenge is not one this room issued, or it is older than 10 minutes")]
    Stale,
    #[error("the nonce must be 1..=32 letters and digits")]
    BadNonce,
    #[error("the proof has too few leading zero bits")]
    TooWeak,
}

/// Checks a proof for `bits` (0 asks for none).
pub fn check(
    signer: &TokenSigner,
    bits: u8,
    event_id: u64,
    user_id: u64,
    proof: Option<(&str, &str)>,
    now_s: i64,
) -> Result<(), ProofError> {
    if bits == 0 {
        return Ok(());
    }
    let (challenge, nonce) = proof.ok_or(ProofError::Missing)?;
    let (window, mac) = challenge.split_once('.').ok_or(ProofError::Stale)?;
    let window: i64 = window.parse().map_err(|_| ProofError::Stale)?;
    let current = now_s.div_euclid(WINDOW_S);
    if !(window == current || window == current - 1)
        || !bool::from(subtle::ConstantTimeEq::ct_eq(
            mac.as_bytes(),
            mac_of(signer, event_id, window).as_bytes(),
        ))
    {
        return Err(ProofError::Stale);
    }
    if nonce.is_empty()
        || nonce.len() > MAX_NONCE_LEN
        || !nonce.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err(ProofError::BadNonce);
    }
    if zero_bits(&digest(challenge, user_id, event_id, nonce)) < u32::from(bits) {
        return Err(ProofError::TooWeak);
    }
    Ok(())
}

/// A nonce for `bits` (what a buyer's browser and the bench do).
pub fn solve(challenge: &str, user_id: u64, event_id: u64, bits: u8) -> String {
    (0u64..)
        .map(|n| format!("{n:x}"))
        .find(|nonce| zero_bits(&digest(challenge, user_id, event_id, nonce)) >= u32::from(bits))
        .expect("some nonce has enough zero bits")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_solved_challenge_admits_its_user_only() {
        let s = TokenSigner::from_text("proof-of-work-test-secret").unwrap();
        let now = 1_000_000;
        let (c, good_for) = challenge(&s, 9, now);
        assert!(good_for > WINDOW_S && good_for <= 2 * WINDOW_S);
        let nonce = solve(&c, 5, 9, 10);
        assert_eq!(check(&s, 10, 9, 5, Some((&c, &nonce)), now), Ok(()));
        assert_eq!(
            check(&s, 10, 9, 5, Some((&c, &nonce)), now + WINDOW_S),
            Ok(())
        );
        assert_eq!(
            check(&s, 10, 9, 5, Some((&c, &nonce)), now + 2 * WINDOW_S),
            Err(ProofError::Stale)
        );
        assert_eq!(check(&s, 10, 9, 5, None, now), Err(ProofError::Missing));
        assert_eq!(check(&s, 0, 9, 5, None, now), Ok(()));
        // Another user (or event) needs a proof of their own.
        let other = (0..64)
            .map(|u| check(&s, 10, 9, u, Some((&c, &nonce)), now))
            .filter(Result::is_ok)
            .count();
        assert!(other < 4, "{other}");
        assert_eq!(
            check(&s, 10, 10, 5, Some((&c, &nonce)), now),
            Err(ProofError::Stale)
        );
        let forged = format!("{}.{}", now / WINDOW_S, "0".repeat(32));
        assert_eq!(
            check(&s, 10, 9, 5, Some((&forged, &nonce)), now),
            Err(ProofError::Stale)
        );
        for bad in ["", "a b", "ä", &"a".repeat(33)] {
            assert_eq!(
                check(&s, 10, 9, 5, Some((&c, bad)), now),
                Err(ProofError::BadNonce)
            );
        }
    }

    #[test]
    fn zero_bits_count_from_the_first_byte() {
        assert_eq!(zero_bits(&[0, 0x10, 0xff]), 11);
        assert_eq!(zero_bits(&[0x80]), 0);
        assert_eq!(zero_bits(&[0, 0]), 16);
    }
}
