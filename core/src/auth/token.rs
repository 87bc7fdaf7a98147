//! User tokens: `<kid>.<user_id>.<expires_unix_s>.<signature>`, the signature being
//! HMAC-SHA1 over `<kid>.<user_id>.<expires_unix_s>` in standard base64 without
//! padding, with the secret whose key id is `<kid>`. HMAC-SHA1 because nginx's Lua
//! module has SHA-1 built in (the edge computes the MAC from `ngx.sha1_bin`, checked
//! against `ngx.hmac_sha1` at start), so the edge verifies a token with no library; as
//! a MAC it remains sound.
//!
//! Secrets rotate without a restart and without logging anyone out: the keyring holds
//! the current secret (it signs) and the previous ones (they still verify, until they
//! are dropped by the next rotation). Written as text, a keyring is one secret per
//! line, the current first — the format of `auth.token_secret_file`, which
//! `stampede rotate-token-secret` rewrites and the core re-reads while it runs.
//! A key id is the first 8 hex digits of the secret's SHA-1: derived, so the edge and
//! the core agree on it with nothing else to configure.

use std::path::Path;
use std::sync::{Arc, RwLock};

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha1::{Digest, Sha1};

type HmacSha1 = Hmac<Sha1>;

/// Shortest secret accepted.
pub const MIN_SECRET_LEN: usize = 16;

/// Why a token was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed token")]
    Malformed,
    #[error("token signed with a retired or unknown key")]
    UnknownKey,
    #[error("bad token signature")]
    BadSignature,
    #[error("token expired")]
    Expired,
}

/// Why a keyring could not be read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyringError {
    #[error("no secret in the keyring")]
    Empty,
    #[error("secret {0} of the keyring is shorter than {MIN_SECRET_LEN} characters")]
    TooShort(usize),
}

struct Key {
    id: String,
    secret: SecretString,
    /// HMAC keyed with the secret, made once: each signature or check clones it instead
    /// of padding and hashing the key again (two of the four SHA-1 blocks of a token).
    mac: HmacSha1,
}

/// The secrets tokens are signed with: the current first.
pub struct Keyring {
    keys: Vec<Key>,
}

impl Keyring {
    /// One secret per line (or comma-separated, as in an environment variable), the
    /// current first; blank entries ignored. The edge reads it the same way.
    pub fn parse(text: &str) -> Result<Keyring, KeyringError> {
        let keys = text
            .split(['\n', '\r', ','])
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .enumerate()
            .map(|(i, line)| {
                if line.len() < MIN_SECRET_LEN {
                    return Err(KeyringError::TooShort(i + 1));
                }
                let secret: SecretString = line.to_owned().into();
                Ok(Key {
                    id: key_id(line),
                    mac: mac(&secret),
                    secret,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(KeyringError::Empty);
        }
        Ok(Keyring { keys })
    }

    /// The key id of the current secret.
    pub fn current_id(&self) -> &str {
        &self.keys[0].id
    }

    /// Every key id, the current first.
    pub fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.id.as_str()).collect()
    }
}

/// The key id of a secret: 8 hex digits of its SHA-1.
pub fn key_id(secret: &str) -> String {
    hex::encode(&Sha1::digest(secret.as_bytes())[..4])
}

fn mac(secret: &SecretString) -> HmacSha1 {
    HmacSha1::new_from_slice(secret.expose_secret().as_bytes())
        .expect("HMAC takes keys of any length")
}

/// Signs and verifies user tokens with the keyring, which can be swapped while it runs.
#[derive(Clone)]
pub struct TokenSigner {
    keyring: Arc<RwLock<Arc<Keyring>>>,
}

impl TokenSigner {
    pub fn new(keyring: Keyring) -> TokenSigner {
        TokenSigner {
            keyring: Arc::new(RwLock::new(Arc::new(keyring))),
        }
    }

    /// From keyring text (one secret per line, the current first).
    pub fn from_text(text: &str) -> Result<TokenSigner, KeyringError> {
        Keyring::parse(text).map(TokenSigner::new)
    }

    fn keyring(&self) -> Arc<Keyring> {
        self.keyring
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Swaps in a new keyring; tokens of keys it still holds stay valid.
    pub fn replace(&self, keyring: Keyring) {
        *self.keyring.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keyring);
    }

    /// The key ids in force, the current first.
    pub fn key_ids(&self) -> Vec<String> {
        self.keyring()
            .ids()
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// A token for `user_id` valid until `expires_unix_s`, signed with the current key.
    pub fn sign(&self, user_id: u64, expires_unix_s: i64) -> String {
        self.sign_claims(&format!("{user_id}.{expires_unix_s}"))
    }

    /// `<kid>.<claims>.<signature>` with the current key: a user token's shape, and a
    /// queue pass's (`room::pass`), whose claims have more parts, so neither is ever
    /// taken for the other.
    pub fn sign_claims(&self, claims: &str) -> String {
        let keyring = self.keyring();
        let key = &keyring.keys[0];
        let signed = format!("{}.{claims}", key.id);
        let mut mac = key.mac.clone();
        mac.update(signed.as_bytes());
        let sig = STANDARD_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{signed}.{sig}")
    }

    /// The claims (without the key id) of a string [`TokenSigner::sign_claims`] made
    /// with a key of the keyring.
    pub fn verify_claims<'a>(&self, signed: &'a str) -> Result<&'a str, TokenError> {
        let (claimed, sig) = signed.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let (kid, claims) = claimed.split_once('.').ok_or(TokenError::Malformed)?;
        let sig = STANDARD_NO_PAD
            .decode(sig)
            .map_err(|_| TokenError::Malformed)?;
        let keyring = self.keyring();
        let key = keyring
            .keys
            .iter()
            .find(|k| k.id == kid)
            .ok_or(TokenError::UnknownKey)?;
        let mut mac = key.mac.clone();
        mac.update(claimed.as_bytes());
        // verify_slice compares in constant time.
        mac.verify_slice(&sig)
            .map_err(|_| TokenError::BadSignature)?;
        Ok(claims)
    }

    /// The user id of a valid, unexpired token signed with a key of the keyring.
    pub fn verify(&self, token: &str, now_unix_s: i64) -> Result<u64, TokenError> {
        self.verify_expiring(token, now_unix_s)
            .map(|(user, _)| user)
    }

    /// The user id and expiry (Unix s) of a valid, unexpired token signed with a key of
    /// the keyring.
    pub fn verify_expiring(&self, token: &str, now_unix_s: i64) -> Result<(u64, i64), TokenError> {
        let (claimed, _) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let mut parts = claimed.split('.');
        let (Some(_kid), Some(user), Some(expires), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let user_id = crate::domain::ids::canonical_id(user).ok_or(TokenError::Malformed)?;
        let expires: i64 = expires.parse().map_err(|_| TokenError::Malformed)?;
        self.verify_claims(token)?;
        if expires <= now_unix_s {
            return Err(TokenError::Expired);
        }
        Ok((user_id, expires))
    }

    /// Re-reads `path` (a keyring file) and swaps it in when its key ids changed; the
    /// ids now in force. A file that cannot be read or parsed changes nothing.
    pub fn reload_from(&self, path: &Path) -> anyhow::Result<Option<Vec<String>>> {
        let text = std::fs::read_to_string(path)?;
        let keyring = Keyring::parse(&text)?;
        if keyring.ids() == self.keyring().ids() {
            return Ok(None);
        }
        let ids = keyring.ids().into_iter().map(str::to_owned).collect();
        self.replace(keyring);
        Ok(Some(ids))
    }
}

/// A new secret: 24 random bytes in hex.
pub fn new_secret() -> String {
    hex::encode(rand::random::<[u8; 24]>())
}

/// The keyring text after a rotation of `current`: a new secret first, then the
/// secret that was current (still accepted); older ones are dropped.
pub fn rotated(current: &str) -> Result<String, KeyringError> {
    let keyring = Keyring::parse(current)?;
    let previous = keyring.keys[0].secret.expose_secret();
    Ok(format!("{}\n{previous}\n", new_secret()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "a-secret-of-some-length";
    const B: &str = "another-secret-entirely";

    fn signer(text: &str) -> TokenSigner {
        TokenSigner::from_text(text).unwrap()
    }

    #[test]
    fn a_signed_token_verifies_to_its_user_and_names_its_key() {
        let s = signer(A);
        let t = s.sign(42, 2_000);
        assert_eq!(s.verify(&t, 1_000), Ok(42));
        assert!(t.starts_with(&format!("{}.42.2000.", key_id(A))), "{t}");
        assert_eq!(key_id(A).len(), 8);
    }

    #[test]
    fn expired_forged_and_malformed_tokens_are_refused() {
        let s = signer(A);
        let t = s.sign(42, 2_000);
        assert_eq!(s.verify(&t, 2_000), Err(TokenError::Expired));
        assert_eq!(signer(B).verify(&t, 1), Err(TokenError::UnknownKey));
        let forged = t.replacen(".42.", ".43.", 1);
        assert_eq!(s.verify(&forged, 1), Err(TokenError::BadSignature));
        // A forger who knows a key id but not its secret.
        let kid = key_id(A);
        let impostor = signer(B).sign(42, 4_000).replacen(&key_id(B), &kid, 1);
        assert_eq!(s.verify(&impostor, 1), Err(TokenError::BadSignature));
        for bad in [
            "",
            "42",
            "42.2000",
            "x.2000.abc",
            "42.y.abc",
            "42.2000.!!!",
            &format!("{kid}.42.2000"),
            &format!("{kid}.042.2000.abc"),
            &format!("{kid}.+42.2000.abc"),
            &format!("{kid}.42.2000.x.abc"),
        ] {
            assert_eq!(s.verify(bad, 1), Err(TokenError::Malformed), "{bad}");
        }
    }

    #[test]
    fn a_rotation_keeps_the_previous_key_and_drops_the_one_before() {
        let s = signer(A);
        let before = s.sign(7, 4_000);
        let once = rotated(A).unwrap();
        s.replace(Keyring::parse(&once).unwrap());
        let after = s.sign(7, 4_000);
        assert_ne!(s.key_ids()[0], key_id(A));
        assert_eq!(s.key_ids()[1], key_id(A));
        assert_eq!(
            s.verify(&before, 1),
            Ok(7),
            "the previous key still verifies"
        );
        assert_eq!(s.verify(&after, 1), Ok(7));
        s.replace(Keyring::parse(&rotated(&once).unwrap()).unwrap());
        assert_eq!(
            s.verify(&before, 1),
            Err(TokenError::UnknownKey),
            "two rotations ago"
        );
        assert_eq!(s.verify(&after, 1), Ok(7));
    }

    #[test]
    fn keyrings_refuse_short_or_no_secrets() {
        assert!(matches!(Keyring::parse(""), Err(KeyringError::Empty)));
        assert!(matches!(Keyring::parse("\n \n"), Err(KeyringError::Empty)));
        assert!(matches!(
            Keyring::parse(&format!("{A}\nshort\n")),
            Err(KeyringError::TooShort(2))
        ));
        // The edge's format too: commas, as in STAMPEDE_TOKEN_SECRET.
        let ring = Keyring::parse(&format!("{A},{B}")).unwrap();
        assert_eq!(ring.ids(), vec![key_id(A), key_id(B)]);
    }

    #[test]
    fn the_signature_matches_a_known_hmac_sha1_vector() {
        // RFC 2202 test case 2: key "Jefe", data "what do ya want for nothing?".
        let mut mac = HmacSha1::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac.finalize().into_bytes()),
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
    }
}
