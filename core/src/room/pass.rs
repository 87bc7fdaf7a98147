//! Queue passes (docs/waiting-room.md): `<kid>.q.<event>.<user>.<id>.<expires_ms>.<sig>`,
//! signed like a user token (HMAC-SHA1 with the token keyring, `auth::token`) so the
//! edge verifies one with what it already has. The id is the buyer's position in line
//! (or `h<n>` for a pass of the hidden purchase path); a pass admits one purchase
//! (`room_pass.lua`). Its claims have six parts where a token has three, so neither is
//! ever taken for the other.

use crate::auth::token::TokenSigner;

/// What a valid pass says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    pub event_id: u64,
    pub user_id: u64,
    pub id: String,
    pub expires_ms: i64,
}

/// Why a pass does not admit this purchase (every one is 403 QUEUE_REQUIRED).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PassError {
    #[error(
        "this sale admits buyers through its waiting room: join it, and buy with your pass in the Queue-Pass header when it is your turn"
    )]
    Missing,
    #[error("the queue pass is malformed or its signature is wrong")]
    Forged,
    #[error("the queue pass is for another event")]
    OtherEvent,
    #[error("the queue pass is another buyer's")]
    OtherUser,
    #[error("the queue pass has expired")]
    Expired,
    #[error("the queue pass was used for another purchase")]
    Used,
}

impl PassError {
    pub const CODE: &'static str = "QUEUE_REQUIRED";
}

/// A pass id: a position (canonical decimal) or `h<n>`.
fn valid_id(id: &str) -> bool {
    let digits = id.strip_prefix('h').unwrap_or(id);
    crate::domain::ids::canonical_id(digits).is_some()
}

/// Signs `pass` with the current key.
pub fn sign(signer: &TokenSigner, pass: &Pass) -> String {
    debug_assert!(valid_id(&pass.id));
    signer.sign_claims(&format!(
        "q.{}.{}.{}.{}",
        pass.event_id, pass.user_id, pass.id, pass.expires_ms
    ))
}

/// The pass in `text`, if it is signed by a key of the keyring, for this event and
/// user, and good at `now_ms`.
pub fn verify(
    signer: &TokenSigner,
    text: Option<&str>,
    event_id: u64,
    user_id: u64,
    now_ms: i64,
) -> Result<Pass, PassError> {
    let text = text.ok_or(PassError::Missing)?;
    let claims = signer.verify_claims(text).map_err(|_| PassError::Forged)?;
    let parts: Vec<&str> = claims.split('.').collect();
    let ["q", event, user, id, expires] = parts.as_slice() else {
        return Err(PassError::Forged);
    };
    let (Some(event), Some(user)) = (
        crate::domain::ids::canonical_id(event),
        crate::domain::ids::canonical_id(user),
    ) else {
        return Err(PassError::Forged);
    };
    let expires_ms: i64 = expires.parse().map_err(|_| PassError::Forged)?;
    if !valid_id(id) || !expires.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PassError::Forged);
    }
    if event != event_id {
        return Err(PassError::OtherEvent);
    }
    if user != user_id {
        return Err(PassError::OtherUser);
    }
    if expires_ms <= now_ms {
        return Err(PassError::Expired);
    }
    Ok(Pass {
        event_id,
        user_id,
        id: (*id).to_owned(),
        expires_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "queue-pass-test-secret-A";

    fn pass(id: &str) -> Pass {
        Pass {
            event_id: 7,
            user_id: 42,
            id: id.into(),
            expires_ms: 5_000,
        }
    }

    #[test]
    fn a_pass_admits_its_buyer_at_its_event_until_it_expires() {
        let s = TokenSigner::from_text(A).unwrap();
        let t = sign(&s, &pass("12"));
        assert_eq!(verify(&s, Some(&t), 7, 42, 4_999), Ok(pass("12")));
        assert_eq!(verify(&s, Some(&t), 7, 42, 5_000), Err(PassError::Expired));
        assert_eq!(verify(&s, Some(&t), 8, 42, 1), Err(PassError::OtherEvent));
        assert_eq!(verify(&s, Some(&t), 7, 43, 1), Err(PassError::OtherUser));
        assert_eq!(verify(&s, None, 7, 42, 1), Err(PassError::Missing));
        let h = sign(&s, &pass("h3"));
        assert_eq!(verify(&s, Some(&h), 7, 42, 1), Ok(pass("h3")));
    }

    #[test]
    fn forged_and_token_shaped_passes_are_refused() {
        let s = TokenSigner::from_text(A).unwrap();
        let t = sign(&s, &pass("12"));
        let other = TokenSigner::from_text("another-secret-of-16+").unwrap();
        assert_eq!(verify(&other, Some(&t), 7, 42, 1), Err(PassError::Forged));
        let later = t.replacen(".5000.", ".9000.", 1);
        assert_eq!(verify(&s, Some(&later), 7, 42, 1), Err(PassError::Forged));
        // A user token is no pass, and a pass no token.
        let token = s.sign(42, i64::MAX);
        assert_eq!(verify(&s, Some(&token), 7, 42, 1), Err(PassError::Forged));
        assert!(s.verify(&t, 1).is_err());
        for claims in [
            "q.7.42.012.5000",
            "q.7.42.x.5000",
            "q.7.42.12.+5000",
            "p.7.42.12.5000",
            "q.7.42.12",
        ] {
            let forged = s.sign_claims(claims);
            assert_eq!(
                verify(&s, Some(&forged), 7, 42, 1),
                Err(PassError::Forged),
                "{claims}"
            );
        }
    }
}
