//! `GET /v1/sessions/{sessionId}` (mode, mode history, turns) and its Server-Sent Events
//! (`/events`: one event per turn result published for the session).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::contract::{InvokeResult, SessionId, TurnId};
use crate::delivery::Resume;
use crate::frontdoor::extract::{
    ApiPath, HttpState, Reader, answer, not_found_session, unavailable,
};
use crate::frontdoor::openapi::{self as api_doc, Failure};
use crate::live::{LiveBody, LiveEvent};
use crate::queue::SessionEvent;
use crate::store::ModeChange;
use crate::store::TurnStatus;

/// `<turnId>:<index>` (a live event) or `<turnId>` (a result), as sent in `id:`.
fn parse_event_id(id: &str) -> Option<Resume> {
    let (turn, index) = match id.rsplit_once(':') {
        Some((turn, n)) => match n.parse::<u64>() {
            Ok(n) => (turn, Some(n)),
            Err(_) => (id, None),
        },
        None => (id, None),
    };
    TurnId::parse(turn)
        .ok()
        .map(|turn| Resume { turn, after: index })
}

/// A session event as Server-Sent Event (none for a body that cannot be read).
fn sse_event(event: SessionEvent) -> Option<axum::response::sse::Event> {
    use axum::response::sse::Event;
    match event {
        SessionEvent::Status(body) => {
            let view = serde_json::from_slice::<crate::store::TurnStatusView>(&body).ok()?;
            Some(
                Event::default()
                    .event("turn")
                    .id(&view.turn_id)
                    .data(String::from_utf8_lossy(&body)),
            )
        }
        SessionEvent::Live(body) => {
            let live = serde_json::from_slice::<LiveEvent>(&body).ok()?;
            let (kind, data) = match live.body {
                LiveBody::Delta { text, call, .. } => {
                    let mut data = serde_json::json!({"sessionId": live.session_id, "turnId": live.turn_id, "index": live.index, "text": text});
                    // The first text of a model call names the call (the console's call in
                    // flight).
                    if let (Some(call), Some(fields)) = (call, data.as_object_mut()) {
                        fields.insert("call".into(), serde_json::json!(call));
                    }
                    ("delta", data)
                }
                LiveBody::Progress { message } => (
                    "progress",
                    serde_json::json!({"sessionId": live.session_id, "turnId": live.turn_id, "index": live.index, "message": message}),
                ),
            };
            Some(
                Event::default()
                    .event(kind)
                    .id(format!("{}:{}", live.turn_id, live.index))
                    .data(data.to_string()),
            )
        }
    }
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SessionView {
    session_id: SessionId,
    mode_key: String,
    mode_display_name: String,
    mode_history: Vec<ModeChange>,
    /// The agent context the session latched on its first turn (absent before one was
    /// accepted).
    #[serde(skip_serializing_if = "Option::is_none")]
    agent_context_id: Option<String>,
    /// The conversation context the session latched on its first turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    conversation_context_id: Option<String>,
    turns: Vec<TurnSummary>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TurnSummary {
    turn_id: TurnId,
    status: TurnStatus,
}

/// A session: its mode (keys, not ids), mode history and turns.
#[utoipa::path(get, path = "/v1/sessions/{sessionId}", tag = "sessions",
    params(("sessionId" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The session (named within the caller's tenant)"),
        ("tenant" = Option<String>, Query, pattern = "^[A-Za-z0-9._:-]{1,64}$", description = "Whose session: an admin's token may name any tenant, a tenant's token only its own (default: the token's tenant)")),
    responses(
        (status = 400, description = "A parameter cannot be read (INVALID_PARAMETER, naming it), or a path id is not an id (INVALID_ID)", body = Failure),
        (status = 200, description = "The session", body = api_doc::InvokeResult<SessionView>),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 403, description = "`tenant` names another tenant and the token is not an admin's (FORBIDDEN)", body = Failure),
        (status = 404, description = "No such session in the tenant", body = Failure),
        (status = 503, description = "Store unavailable", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn get_session(
    State(state): State<HttpState>,
    ApiPath(session_id): ApiPath<String>,
    reader: Reader,
) -> Response {
    let missing = || not_found_session(&session_id);
    let sid = match reader.session(&session_id) {
        Ok(sid) => sid,
        Err(invalid) => return invalid.into_response(),
    };
    let (session, turn_ids, contexts) = match tokio::join!(
        state.store.get_session(&sid),
        state.store.list_turns(&sid),
        state.store.latched_contexts(&sid),
    ) {
        (Ok(s), Ok(t), Ok(c)) => (s, t, c),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return unavailable(e),
    };
    // A session is there once a turn was accepted for it (its contexts latched then).
    if session.is_none() && turn_ids.is_empty() && contexts.is_none() {
        return missing();
    }
    let mut turns = Vec::with_capacity(turn_ids.len());
    for tid in turn_ids {
        match state.store.get_turn(&sid, &tid).await {
            Ok(Some(r)) => turns.push(TurnSummary {
                turn_id: tid,
                status: r.status,
            }),
            Ok(None) => {} // expired
            Err(e) => return unavailable(e),
        }
    }
    // A session whose first turn has not started yet is in the default mode.
    let mode = match &session {
        Some(s) => state.catalog.by_id_or_default(&s.mode_id),
        None => state.catalog.default_mode(),
    };
    let view = SessionView {
        session_id: sid,
        mode_key: mode.key.clone(),
        mode_display_name: mode.display_name.clone(),
        mode_history: session.map(|s| s.mode_history).unwrap_or_default(),
        agent_context_id: contexts.as_ref().map(|c| c.agent_context_id.clone()),
        conversation_context_id: contexts.map(|c| c.conversation_context_id),
        turns,
    };
    answer(StatusCode::OK, InvokeResult::success(view))
}

/// Server-Sent Events: one `event: turn` per result of the session as it is published, `id:` the
/// turn id, `data:` the turn status JSON; before it, for a turn that streams, `event: delta`
/// (`data: {sessionId, turnId, index, text}`) and `event: progress` (`data: {sessionId, turnId,
/// index, message}`), `id: <turnId>:<index>`. Every subscriber gets every event. A client that
/// reconnects with `Last-Event-ID` naming a turn gets that turn's result at once if it has
/// settled meanwhile.
#[utoipa::path(get, path = "/v1/sessions/{sessionId}/events", tag = "sessions",
    params(("sessionId" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The session, named within the caller's tenant (may not exist yet; subscribing writes nothing)"),
           ("tenant" = Option<String>, Query, pattern = "^[A-Za-z0-9._:-]{1,64}$", description = "Whose session: an admin's token may name any tenant, a tenant's token only its own (default: the token's tenant)"),
           ("Last-Event-ID" = Option<String>, Header, description = "The id of the last event received, when reconnecting")),
    responses(
        (status = 400, description = "A parameter cannot be read (INVALID_PARAMETER, naming it), or a path id is not an id (INVALID_ID)", body = Failure),
        (status = 200, description = "An event stream; a turn event's data is a TurnStatusView, a delta event's a SessionDeltaEvent, a progress event's a SessionProgressEvent", content_type = "text/event-stream", body = api_doc::TurnStatusView),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 403, description = "`tenant` names another tenant and the token is not an admin's (FORBIDDEN)", body = Failure),
                (status = 503, description = "Broker unavailable", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn session_events(
    State(state): State<HttpState>,
    ApiPath(session_id): ApiPath<String>,
    reader: Reader,
    headers: axum::http::HeaderMap,
) -> Response {
    // Subscribing before the first turn is allowed, and writes nothing: the session is the
    // caller's tenant's (an admin names another tenant with `?tenant=`), whoever else uses
    // the same id.
    let sid = match reader.session(&session_id) {
        Ok(sid) => sid,
        Err(invalid) => return invalid.into_response(),
    };
    // A reconnecting client gets what it missed of the turn it names (whichever front door it
    // was connected to), then what is published.
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_event_id);
    let following = match state.door.delivery().follow(&sid, resume).await {
        Ok(following) => following,
        Err(e) => return unavailable(e),
    };
    let stream = futures_util::stream::unfold(following, |mut following| async move {
        loop {
            let next = following.next().await?;
            if let Some(event) = sse_event(next) {
                return Some((Ok::<_, std::convert::Infallible>(event), following));
            }
        }
    });
    axum::response::sse::Sse::new(stream)
        .keep_alive(axum::response::sse::KeepAlive::default())
        .into_response()
}
