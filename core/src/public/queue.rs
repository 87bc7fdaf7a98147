//! The waiting room's public endpoints (docs/waiting-room.md): join and read your place
//! (`/queue`), the proof-of-work challenge, and the lottery's fairness record. The edge
//! answers most `GET /queue` polls itself from its snapshot; these answer the rest.

use http::{Method, StatusCode};

use super::events::visible;
use crate::http::{ApiError, Request, Response, from_json, json, json_bytes, read_body};
use crate::room::JoinBody;
use crate::state::AppState;

/// Largest join body (a challenge and a nonce).
const MAX_JOIN_BODY: usize = 1024;

/// `POST` joins (body: nothing, or `{"challenge", "nonce"}`); `GET` reads your place.
pub async fn queue(
    state: &AppState,
    id: u64,
    user: u64,
    req: Request,
) -> Result<Response, ApiError> {
    let event = visible(state, id).await?;
    let answer = if req.method() == Method::POST {
        let bytes = read_body(req, MAX_JOIN_BODY).await?;
        let body: JoinBody = if bytes.iter().all(u8::is_ascii_whitespace) {
            JoinBody::default()
        } else {
            from_json(&bytes)?
        };
        state.room.join(&event, user, body).await?
    } else {
        state.room.status(&event, user).await?
    };
    Ok(json(StatusCode::OK, &answer))
}

pub async fn challenge(state: &AppState, id: u64) -> Result<Response, ApiError> {
    let event = visible(state, id).await?;
    Ok(json(StatusCode::OK, &state.room.challenge(&event)?))
}

pub async fn fairness(state: &AppState, id: u64) -> Result<Response, ApiError> {
    let event = visible(state, id).await?;
    // The kept record's bytes as they are (1.6 MB at 200 000 joiners): not copied and
    // checked again per request.
    Ok(json_bytes(
        StatusCode::OK,
        state.room.fairness(&event).await?,
    ))
}
