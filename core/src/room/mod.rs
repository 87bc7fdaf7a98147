//! The waiting room (docs/waiting-room.md): a fair, stock-aware line in front of a sale.
//! Buyers join before the open (with a proof of work if asked); at the open the gate
//! orders them by a seed committed before it and revealed after (`lottery`), later
//! joiners go behind in arrival order, and passes go out at a rate (set or automatic)
//! the stock left can serve. A purchase then needs its pass (`Queue-Pass`), which the
//! edge verifies and this module claims, once, in Redis. The same pass, issued only
//! from the open, is the hidden purchase path of events without a room.

pub mod config;
pub mod gate;
pub mod lottery;
pub mod pass;
pub mod pow;
pub mod status;
pub mod store;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::auth::token::TokenSigner;
use crate::catalog::{EventRecord, EventStatus};
use crate::domain::{EventId, UserId};
use crate::http::ApiError;
use crate::keys::Bucket;
use config::RoomConfig;
use pass::{Pass, PassError};
use status::State;
use store::{Joined, PassUse, RoomStore};

/// A pass this purchase claimed, to give back if the purchase is refused.
#[derive(Debug, Clone)]
pub struct Claim {
    event: EventId,
    id: String,
    owner: String,
    nonce: String,
}

/// How long a purchase waits for a twin request (same buyer, same Idempotency-Key)
/// that holds its pass's claim before answering SALE_BUSY.
const CLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

pub struct WaitingRoom {
    pub store: RoomStore,
    pub tokens: TokenSigner,
    /// The fairness answer of each drawn room (it never changes after the draw).
    fairness: Mutex<HashMap<u64, Bytes>>,
    /// Held while one is built: at the draw every poller's first ask misses at once, and
    /// each read the whole line (a ZRANGE of every early joiner) and encoded it (review).
    /// (One lock per event: another event's build does not wait on it.)
    building_fairness: Mutex<HashMap<u64, std::sync::Arc<tokio::sync::Mutex<()>>>>,
}

fn no_room(id: u64) -> ApiError {
    ApiError::NotFound(format!("event {id} has no waiting room"))
}

fn not_open(message: String) -> ApiError {
    ApiError::Forbidden("NOT_OPEN", message)
}

fn refused(e: PassError) -> ApiError {
    ApiError::Forbidden(PassError::CODE, e.to_string())
}

/// The proof a join may carry: `{"challenge", "nonce"}`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinBody {
    pub challenge: Option<String>,
    pub nonce: Option<String>,
}

impl WaitingRoom {
    pub fn new(store: RoomStore, tokens: TokenSigner) -> WaitingRoom {
        WaitingRoom {
            store,
            tokens,
            fairness: Mutex::default(),
            building_fairness: Mutex::default(),
        }
    }

    /// The event's room as set, when it is on (or its purchase needs a pass).
    fn room(event: &EventRecord) -> Result<&RoomConfig, ApiError> {
        event
            .room
            .as_ref()
            .filter(|r| r.pass_required())
            .ok_or_else(|| no_room(event.id))
    }

    /// `GET /api/events/{id}/queue/challenge`.
    pub fn challenge(&self, event: &EventRecord) -> Result<Value, ApiError> {
        let room = Self::room(event)?;
        let now = Utc::now();
        // The hidden path's work is done from the open on, not ahead of it.
        if !room.enabled && now < event.sale_start {
            return Err(not_open(format!(
                "challenges are issued from the open, {}",
                event.sale_start
            )));
        }
        let (challenge, good_for) = pow::challenge(&self.tokens, event.id, now.timestamp());
        Ok(json!({
            "challenge": challenge, "bits": room.challenge_bits, "expires_in_s": good_for,
            "hash": "SHA-256 of \"<challenge>:<user id>:<event id>:<nonce>\" must start with `bits` zero bits; nonce: 1..=32 letters and digits",
        }))
    }

    /// `POST /api/events/{id}/queue`: joins the line (or, on the hidden path, takes a
    /// pass), and answers as [`WaitingRoom::status`].
    pub async fn join(
        &self,
        event: &EventRecord,
        user: u64,
        body: JoinBody,
    ) -> Result<Value, ApiError> {
        let room = Self::room(event)?;
        let now = Utc::now();
        let proof = body.challenge.as_deref().zip(body.nonce.as_deref());
        pow::check(
            &self.tokens,
            room.challenge_bits,
            event.id,
            user,
            proof,
            now.timestamp(),
        )
        .map_err(|e| ApiError::Forbidden("CHALLENGE_FAILED", e.to_string()))?;
        let event_id = EventId(event.id);
        if closed(event, now.timestamp_millis()) {
            return Err(not_open("the sale is over".into()));
        }
        if !room.enabled {
            // The hidden path: a pass from the open on, no line.
            if now < event.sale_start {
                return Err(not_open(format!(
                    "passes are issued from the open, {}",
                    event.sale_start
                )));
            }
            let Some(id) = self
                .store
                .next_hidden_id(event_id, event.categories.len())
                .await?
            else {
                return Ok(answer(State::SoldOut, None, None, None, None));
            };
            let expires_ms = now.timestamp_millis() + i64::from(room.pass_ttl_s) * 1000;
            let pass = Pass {
                event_id: event.id,
                user_id: user,
                id,
                expires_ms,
            };
            return Ok(answer(
                State::YourTurn,
                None,
                None,
                None,
                Some((&self.tokens, &pass)),
            ));
        }
        match self.store.join(event_id, user).await? {
            (Joined::Placed | Joined::Early, _) => self.status(event, user).await,
            (Joined::NotYet, opens_ms) => Err(not_open(format!(
                "the waiting room opens at {}",
                chrono::DateTime::from_timestamp_millis(opens_ms).unwrap_or_default()
            ))),
            (Joined::Ended, _) => Err(not_open("the sale is over".into())),
            (Joined::Off, _) => Err(ApiError::Unavailable(
                "the waiting room is being loaded; try again in a moment".into(),
            )),
        }
    }

    /// `GET /api/events/{id}/queue`, from Redis (the edge answers most from its
    /// snapshot, with the same rules: `room::status`).
    pub async fn status(&self, event: &EventRecord, user: u64) -> Result<Value, ApiError> {
        let room = Self::room(event)?;
        if !room.enabled {
            return Err(ApiError::NotFound(format!(
                "event {} has no waiting room: POST /api/events/{}/queue takes a pass once the sale is open",
                event.id, event.id
            )));
        }
        let event_id = EventId(event.id);
        let ttl_ms = i64::from(room.pass_ttl_s) * 1000;
        let (mut snapshot, place) = self
            .store
            .read(event_id, user, ttl_ms, event.categories.len())
            .await?;
        let place = place.ok_or_else(|| {
            ApiError::NotFound(format!(
                "you are not in the waiting room of event {}",
                event.id
            ))
        })?;
        let now_ms = Utc::now().timestamp_millis();
        snapshot.closed = closed(event, now_ms);
        let s = status::status(&snapshot, place, now_ms);
        let pass = s.pass.map(|(id, expires_ms)| Pass {
            event_id: event.id,
            user_id: user,
            id: id.to_string(),
            expires_ms,
        });
        Ok(answer(
            s.state,
            s.position,
            s.ahead,
            s.eta_s,
            pass.as_ref().map(|p| (&self.tokens, p)),
        ))
    }

    /// `GET /api/events/{id}/queue/fairness`: the commitment before the draw; the seed,
    /// the rule and who joined before the open after it.
    pub async fn fairness(&self, event: &EventRecord) -> Result<Bytes, ApiError> {
        let room = event
            .room
            .as_ref()
            .filter(|r| r.enabled)
            .ok_or_else(|| no_room(event.id))?;
        let kept = || {
            self.fairness
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&event.id)
                .cloned()
        };
        if let Some(body) = kept() {
            return Ok(body);
        }
        let event_id = EventId(event.id);
        let Some(seed) = self.store.revealed_seed(event_id).await? else {
            let body =
                json!({"commitment": room.commitment, "rule": lottery::RULE, "drawn": false});
            return Ok(Bytes::from(body.to_string()));
        };
        // Drawn: one build at a time per event; those who waited find it built.
        let lock = self
            .building_fairness
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(event.id)
            .or_default()
            .clone();
        let _building = lock.lock().await;
        if let Some(body) = kept() {
            return Ok(body);
        }
        let mut joined = self.store.early(event_id).await?;
        joined.sort_unstable();
        let body = Bytes::from(
            json!({
                "commitment": room.commitment, "rule": lottery::RULE, "drawn": true,
                "seed": seed, "joined": joined,
            })
            .to_string(),
        );
        self.fairness
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(event.id, body.clone());
        Ok(body)
    }

    /// Before a purchase at `now`: its pass checked and claimed for this request (None
    /// when the event needs none, or the purchase used the pass already: a repeat of its
    /// key). Without a good pass, only a repeat of an Idempotency-Key already used in
    /// this event goes on (to its first answer). Another request of the same purchase
    /// holding the claim is waited for (a moment), so twin requests never both spend it.
    ///
    /// A sale not on sale at `now` (before its open, past its end, closed) needs no pass:
    /// the admission, at the same `now`, answers NOT_OPEN — or a repeated key's first
    /// answer — and admits nothing new. "Join the queue" would be the wrong answer there.
    pub async fn claim(
        &self,
        event: &EventRecord,
        user: u64,
        key: &str,
        header: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Option<Claim>, ApiError> {
        let Some(room) = event.room.as_ref().filter(|r| r.pass_required()) else {
            return Ok(None);
        };
        if !event.on_sale_at(now) {
            return Ok(None);
        }
        let now_ms = now.timestamp_millis();
        let event_id = EventId(event.id);
        let checked = pass::verify(&self.tokens, header, event.id, user, now_ms).and_then(|p| {
            // A room's passes are positions, the hidden path's `h<n>`: each good for its
            // mode only (a hidden-path pass does not skip a room switched on since).
            if p.id.starts_with('h') == room.enabled {
                Err(PassError::Forged)
            } else {
                Ok(p)
            }
        });
        let pass = match checked {
            Ok(pass) => pass,
            Err(e) => {
                return if self.key_seen(event, user, key).await? {
                    Ok(None)
                } else {
                    Err(refused(e))
                };
            }
        };
        let claim = Claim {
            event: event_id,
            id: pass.id,
            owner: format!("{user}:{key}"),
            nonce: format!("{:016x}", rand::random::<u64>()),
        };
        let until = std::time::Instant::now() + CLAIM_WAIT;
        loop {
            let answer = self
                .store
                .pass(
                    event_id,
                    "use",
                    &claim.id,
                    &claim.owner,
                    &claim.nonce,
                    pass.expires_ms,
                )
                .await?;
            match answer {
                PassUse::Claimed => return Ok(Some(claim)),
                PassUse::Same => return Ok(None),
                PassUse::Taken => return Err(refused(PassError::Used)),
                PassUse::Expired => return Err(refused(PassError::Expired)),
                PassUse::InFlight if std::time::Instant::now() < until => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                PassUse::InFlight => {
                    return Err(ApiError::Pending(
                        "another request of this purchase is being decided; try again in a moment"
                            .into(),
                    ));
                }
            }
        }
    }

    /// After the purchase: its claim settled — kept once admitted or when the outcome is
    /// unknown (`admitted`), given back when refused, for another try while it lasts.
    pub async fn settle(&self, claim: Claim, admitted: bool) {
        let op = if admitted { "done" } else { "give" };
        if let Err(e) = self
            .store
            .pass(claim.event, op, &claim.id, &claim.owner, &claim.nonce, 0)
            .await
        {
            // A claim left pending counts as used after store::CLAIM_PENDING_MS.
            tracing::warn!(
                event_id = claim.event.0,
                op,
                error = format!("{e:#}"),
                "a queue pass's claim was not settled"
            );
        }
    }

    async fn key_seen(&self, event: &EventRecord, user: u64, key: &str) -> anyhow::Result<bool> {
        let bucket = Bucket::of_buyer(event.id, event.buckets, UserId(user));
        Ok(redis::cmd("HEXISTS")
            .arg(self.store.keys.idempotency(bucket))
            .arg(crate::keys::idempotency_field(UserId(user), key))
            .query_async(&mut self.store.redis.clone())
            .await?)
    }
}

/// The sale closed or over.
fn closed(event: &EventRecord, now_ms: i64) -> bool {
    event.status != EventStatus::Published || now_ms >= event.sale_end.timestamp_millis()
}

/// The answer of the queue endpoints.
fn answer(
    state: State,
    position: Option<u64>,
    ahead: Option<u64>,
    eta_s: Option<u64>,
    pass: Option<(&TokenSigner, &Pass)>,
) -> Value {
    let mut body = json!({"state": state, "position": position, "ahead": ahead, "eta_s": eta_s});
    if let Some((signer, p)) = pass {
        body["pass"] = pass::sign(signer, p).into();
        body["pass_expires_ms"] = p.expires_ms.into();
    }
    body
}

/// For the gate and the stats.
pub fn store(redis: &crate::infra::redis::Redis, keys: &crate::keys::Keys) -> RoomStore {
    RoomStore {
        redis: redis.clone(),
        keys: keys.clone(),
    }
}

pub type Shared = Arc<WaitingRoom>;
