//! What an operator sets for an event's waiting room (`PUT /admin/events/{id}/waiting-room`),
//! checked whole before anything is written, and where it is kept: MySQL's
//! `waiting_room` (with the lottery's seed) and the room's hash in Redis.

use anyhow::Context;
use mysql_async::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Longest lead time of a room before the sale (a day).
pub const MAX_OPENS_BEFORE_S: u32 = 86_400;
/// Fastest fixed release rate.
pub const MAX_ADMIT_PER_S: u32 = 100_000;
/// Bounds of a pass's lifetime.
pub const MIN_PASS_TTL_S: u32 = 10;
pub const MAX_PASS_TTL_S: u32 = 3_600;
/// Hardest proof of work asked: 2^20 hashes, about 40 s on average at the ~28 000 a
/// second the buyer app measured in Chromium, and within a challenge's 300 s for nearly
/// every browser. 24 (was allowed) took about 10 minutes on average, past most
/// challenges' life: a browser's join then failed after minutes of work (review).
pub const MAX_CHALLENGE_BITS: u8 = 20;

/// How fast passes go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    /// This many positions per second.
    Fixed(u32),
    /// Following the core's own backlog (`room::gate`).
    Auto,
}

impl Serialize for Rate {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Rate::Fixed(n) => s.serialize_u32(*n),
            Rate::Auto => s.serialize_str("auto"),
        }
    }
}

/// An event's waiting room as set, with the lottery's commitment (SHA-256 of the seed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RoomConfig {
    pub enabled: bool,
    pub opens_before_s: u32,
    pub admit_per_s: Rate,
    pub pass_ttl_s: u32,
    pub challenge_bits: u8,
    pub require_pass_at_open: bool,
    pub commitment: String,
}

impl RoomConfig {
    /// Whether a purchase needs a `Queue-Pass`: always while the room is on; from the
    /// open (the only time a pass is issued) with `require_pass_at_open`.
    pub fn pass_required(&self) -> bool {
        self.enabled || self.require_pass_at_open
    }
}

/// `PUT /admin/events/{id}/waiting-room` as received: every field optional, the
/// current setting (or the default) kept for those left out.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoomRequest {
    pub enabled: Option<bool>,
    pub opens_before_s: Option<i64>,
    pub admit_per_s: Option<serde_json::Value>,
    pub pass_ttl_s: Option<i64>,
    pub challenge_bits: Option<i64>,
    pub require_pass_at_open: Option<bool>,
}

/// The settings of an event that never had a room: off.
pub fn defaults() -> RoomConfig {
    RoomConfig {
        enabled: false,
        opens_before_s: 900,
        admit_per_s: Rate::Auto,
        pass_ttl_s: 120,
        challenge_bits: 0,
        require_pass_at_open: false,
        commitment: String::new(),
    }
}

impl RoomRequest {
    /// The request in a JSON body: an object of known fields, none of them null (a
    /// field left out keeps its setting; null would say nothing either way).
    pub fn from_json(body: serde_json::Value) -> Result<RoomRequest, String> {
        if let Some(field) = body
            .as_object()
            .and_then(|o| o.iter().find(|(_, v)| v.is_null()))
        {
            return Err(format!(
                "{} must not be null (leave it out to keep it)",
                field.0
            ));
        }
        serde_json::from_value(body).map_err(|e| format!("invalid waiting room settings: {e}"))
    }

    /// `current` with this request's changes, or why the request is wrong.
    pub fn apply(self, current: &RoomConfig) -> Result<RoomConfig, String> {
        let within = |name: &str, v: Option<i64>, lo: i64, hi: i64, now: i64| match v {
            None => Ok(now),
            Some(v) if (lo..=hi).contains(&v) => Ok(v),
            Some(v) => Err(format!("{name} must be within {lo}..={hi}, not {v}")),
        };
        let admit_per_s = match self.admit_per_s {
            None => current.admit_per_s,
            Some(serde_json::Value::String(s)) if s == "auto" => Rate::Auto,
            Some(serde_json::Value::Number(n)) => match n.as_u64() {
                Some(v) if (1..=u64::from(MAX_ADMIT_PER_S)).contains(&v) => Rate::Fixed(v as u32),
                _ => {
                    return Err(format!(
                        "admit_per_s must be \"auto\" or a whole number within 1..={MAX_ADMIT_PER_S}"
                    ));
                }
            },
            Some(_) => {
                return Err(format!(
                    "admit_per_s must be \"auto\" or a whole number within 1..={MAX_ADMIT_PER_S}"
                ));
            }
        };
        Ok(RoomConfig {
            enabled: self.enabled.unwrap_or(current.enabled),
            opens_before_s: within(
                "opens_before_s",
                self.opens_before_s,
                0,
                MAX_OPENS_BEFORE_S.into(),
                current.opens_before_s.into(),
            )? as u32,
            admit_per_s,
            pass_ttl_s: within(
                "pass_ttl_s",
                self.pass_ttl_s,
                MIN_PASS_TTL_S.into(),
                MAX_PASS_TTL_S.into(),
                current.pass_ttl_s.into(),
            )? as u32,
            challenge_bits: within(
                "challenge_bits",
                self.challenge_bits,
                0,
                MAX_CHALLENGE_BITS.into(),
                current.challenge_bits.into(),
            )? as u8,
            require_pass_at_open: self
                .require_pass_at_open
                .unwrap_or(current.require_pass_at_open),
            commitment: current.commitment.clone(),
        })
    }
}

/// The commitment to a seed: SHA-256 of its hex text, in hex.
pub fn commitment(seed_hex: &str) -> String {
    hex::encode(Sha256::digest(seed_hex.as_bytes()))
}

type Row = (bool, u32, Option<u32>, u32, u8, bool, String);

fn from_row((enabled, opens_before_s, admit, pass_ttl_s, bits, require, seed): Row) -> RoomConfig {
    RoomConfig {
        enabled,
        opens_before_s,
        admit_per_s: admit.map_or(Rate::Auto, Rate::Fixed),
        pass_ttl_s,
        challenge_bits: bits,
        require_pass_at_open: require,
        commitment: commitment(&seed),
    }
}

const COLUMNS: &str =
    "enabled, opens_before_s, admit_per_s, pass_ttl_s, challenge_bits, require_pass_at_open, seed";

/// The event's room as set, if one was ever set.
pub async fn load(
    conn: &mut mysql_async::Conn,
    event_id: u64,
) -> anyhow::Result<Option<RoomConfig>> {
    let row: Option<Row> = conn
        .exec_first(
            format!("SELECT {COLUMNS} FROM waiting_room WHERE event_id = ?"),
            (event_id,),
        )
        .await
        .context("Failed to read the waiting room")?;
    Ok(row.map(from_row))
}

/// The seed of the event's lottery (secret until the draw).
pub async fn seed(pool: &mysql_async::Pool, event_id: u64) -> anyhow::Result<Option<String>> {
    let mut conn = crate::infra::mysql::checkout(pool)
        .await
        .context("Failed to get a MySQL connection")?;
    conn.exec_first(
        "SELECT seed FROM waiting_room WHERE event_id = ?",
        (event_id,),
    )
    .await
    .context("Failed to read the lottery's seed")
}

/// Writes the settings; the seed is drawn the first time and never changes after.
pub async fn save(
    pool: &mysql_async::Pool,
    event_id: u64,
    c: &RoomConfig,
) -> anyhow::Result<RoomConfig> {
    let mut conn = crate::infra::mysql::checkout(pool)
        .await
        .context("Failed to get a MySQL connection")?;
    let seed = hex::encode(rand::random::<[u8; 32]>());
    let admit = match c.admit_per_s {
        Rate::Fixed(n) => Some(n),
        Rate::Auto => None,
    };
    conn.exec_drop(
        "INSERT INTO waiting_room (event_id, enabled, opens_before_s, admit_per_s, pass_ttl_s, \
         challenge_bits, require_pass_at_open, seed) VALUES (?, ?, ?, ?, ?, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE enabled = VALUES(enabled), opens_before_s = VALUES(opens_before_s), \
         admit_per_s = VALUES(admit_per_s), pass_ttl_s = VALUES(pass_ttl_s), \
         challenge_bits = VALUES(challenge_bits), require_pass_at_open = VALUES(require_pass_at_open), \
         updated_at = CURRENT_TIMESTAMP(3)",
        (
            event_id,
            c.enabled,
            c.opens_before_s,
            admit,
            c.pass_ttl_s,
            c.challenge_bits,
            c.require_pass_at_open,
            seed,
        ),
    )
    .await
    .context("Failed to write the waiting room")?;
    load(&mut conn, event_id)
        .await?
        .context("the waiting room just written is gone")
}

/// Events whose room is on or whose purchase needs a pass, with a sale not yet over.
pub async fn active(pool: &mysql_async::Pool) -> anyhow::Result<Vec<u64>> {
    let mut conn = crate::infra::mysql::checkout(pool)
        .await
        .context("Failed to get a MySQL connection")?;
    conn.query(
        "SELECT r.event_id FROM waiting_room r JOIN event e ON e.id = r.event_id \
         WHERE r.enabled = 1 AND e.status = 'PUBLISHED' AND e.sale_end > UTC_TIMESTAMP(3)",
    )
    .await
    .context("Failed to list the waiting rooms")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: &str) -> Result<RoomConfig, String> {
        RoomRequest::from_json(serde_json::from_str(json).map_err(|e| e.to_string())?)?
            .apply(&defaults())
    }

    #[test]
    fn settings_are_checked_whole() {
        let c = req(r#"{"enabled":true,"admit_per_s":200,"challenge_bits":12}"#).unwrap();
        assert!(c.enabled && c.pass_required());
        assert_eq!(c.admit_per_s, Rate::Fixed(200));
        assert_eq!((c.challenge_bits, c.pass_ttl_s), (12, 120));
        assert_eq!(
            req(r#"{"admit_per_s":"auto"}"#).unwrap().admit_per_s,
            Rate::Auto
        );
        for bad in [
            r#"{"admit_per_s":0}"#,
            r#"{"admit_per_s":1.5}"#,
            r#"{"admit_per_s":"fast"}"#,
            r#"{"admit_per_s":-1}"#,
            r#"{"admit_per_s":100001}"#,
            r#"{"pass_ttl_s":9}"#,
            r#"{"pass_ttl_s":3601}"#,
            r#"{"opens_before_s":-1}"#,
            r#"{"opens_before_s":86401}"#,
            r#"{"challenge_bits":25}"#,
            r#"{"enabled":"yes"}"#,
            r#"{"seed":"00"}"#,
            r#"{"require_pass_at_open":null}"#,
            r#"{"admit_per_s":null}"#,
            r#"[]"#,
        ] {
            assert!(req(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_commitment_is_sha256_of_the_seed_text() {
        assert_eq!(
            commitment("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
