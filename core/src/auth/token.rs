//! User tokens: `<user_id>.<expires_unix_s>.<signature>`, the signature being
//! HMAC-SHA1 over `<user_id>.<expires_unix_s>` in standard base64 without padding.
//! HMAC-SHA1 because nginx's Lua module has it built in (`ngx.hmac_sha1`), so the edge
//! verifies a token with no library and no string building beyond one concatenation;
//! as a MAC it remains sound.

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha1::Sha1;

type HmacSha1 = Hmac<Sha1>;

/// Why a token was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed token")]
    Malformed,
    #[error("bad token signature")]
    BadSignature,
    #[error("token expired")]
    Expired,
}

/// Signs and verifies user tokens with the shared secret.
#[derive(Clone)]
pub struct TokenSigner {
    secret: SecretString,
}

impl TokenSigner {
    pub fn new(secret: SecretString) -> TokenSigner {
        TokenSigner { secret }
    }

    fn mac(&self) -> HmacSha1 {
        HmacSha1::new_from_slice(self.secret.expose_secret().as_bytes())
            .expect("HMAC takes keys of any length")
    }

    /// A token for `user_id` valid until `expires_unix_s`.
    pub fn sign(&self, user_id: u64, expires_unix_s: i64) -> String {
        let claims = format!("{user_id}.{expires_unix_s}");
        let mut mac = self.mac();
        mac.update(claims.as_bytes());
        let sig = STANDARD_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{claims}.{sig}")
    }

    /// The user id of a valid, unexpired token.
    pub fn verify(&self, token: &str, now_unix_s: i64) -> Result<u64, TokenError> {
        let (claims, sig) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let (user, expires) = claims.split_once('.').ok_or(TokenError::Malformed)?;
        let user_id: u64 = user.parse().map_err(|_| TokenError::Malformed)?;
        let expires: i64 = expires.parse().map_err(|_| TokenError::Malformed)?;
        let sig = STANDARD_NO_PAD
            .decode(sig)
            .map_err(|_| TokenError::Malformed)?;
        let mut mac = self.mac();
        mac.update(claims.as_bytes());
        mac.verify_slice(&sig)
            .map_err(|_| TokenError::BadSignature)?;
        if expires <= now_unix_s {
            return Err(TokenError::Expired);
        }
        Ok(user_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer(secret: &str) -> TokenSigner {
        TokenSigner::new(secret.to_owned().into())
    }

    #[test]
    fn a_signed_token_verifies_to_its_user() {
        let s = signer("a-secret-of-some-length");
        let t = s.sign(42, 2_000);
        assert_eq!(s.verify(&t, 1_000), Ok(42));
    }

    #[test]
    fn expired_forged_and_malformed_tokens_are_refused() {
        let s = signer("a-secret-of-some-length");
        let t = s.sign(42, 2_000);
        assert_eq!(s.verify(&t, 2_000), Err(TokenError::Expired));
        assert_eq!(
            signer("another-secret-entirely").verify(&t, 1),
            Err(TokenError::BadSignature)
        );
        let forged = t.replacen("42.", "43.", 1);
        assert_eq!(s.verify(&forged, 1), Err(TokenError::BadSignature));
        for bad in ["", "42", "42.2000", "x.2000.abc", "42.y.abc", "42.2000.!!!"] {
            assert_eq!(s.verify(bad, 1), Err(TokenError::Malformed), "{bad}");
        }
    }

    #[test]
    fn the_signature_matches_a_known_hmac_sha1_vector() {
        // RFC 2202 test case 2: key "Jefe", data "what do ya want for nothing?".
        let mut mac = HmacSha1::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let hex: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hex, "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79");
    }
}
