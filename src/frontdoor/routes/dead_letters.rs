//! `/v1/admin/dead-letters`: the dead-lettered jobs, read, requeued or discarded, for admin
//! tokens. Reading goes through the queue (each job is put back at its end before it is taken
//! from its place); requeueing and discarding name the turns or ask for all, and answer what
//! became of each job — with, for a requeue, how many of the turns had settled already (their
//! status is sent again; they do not run again).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};

use crate::contract::{ErrorCode, InvokeResult, SessionId, TurnId};
use crate::frontdoor::extract::{
    Admin, HttpState, LimitedBody, QueryParams, RequestSized, answer, failure, unavailable,
};
use crate::frontdoor::openapi::{self as api_doc, Failure};
use crate::queue::{DeadChoice, DeadLetter};

/// A dead-lettered job.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DeadLetterView {
    /// Its place in the queue, from 0 (the oldest).
    position: usize,
    /// The session its job names, when it names a valid one.
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<String>,
    /// The turn its job names, when it names a valid one.
    #[serde(skip_serializing_if = "Option::is_none")]
    turn_id: Option<String>,
    /// The tenant that submitted it, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<String>,
    /// Why it was dead-lettered.
    reason: String,
    /// The attempt it had reached.
    attempt: u32,
    /// The batch it is a line of, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    batch: Option<String>,
    /// Its size in bytes.
    bytes: usize,
}

fn view(position: usize, letter: &DeadLetter) -> DeadLetterView {
    let named = crate::queue::named_turn(&letter.body, letter.meta.tenant.as_deref());
    DeadLetterView {
        position,
        session_id: named.as_ref().map(|(s, _)| s.client_id().to_string()),
        turn_id: named.as_ref().map(|(_, t)| t.to_string()),
        tenant: letter.meta.tenant.clone(),
        reason: letter.reason.clone(),
        attempt: letter.meta.attempt,
        batch: letter.meta.batch.clone(),
        bytes: letter.body.len(),
    }
}

/// The most dead letters one call reads or requeues.
const MAX_DEAD: usize = 500;

/// The dead-lettered jobs, oldest first. Reading them goes through the queue (each is put
/// back at its end before it is taken from its place), so the queue keeps every job, in the
/// same order when all of them are read.
#[utoipa::path(get, path = "/v1/admin/dead-letters", tag = "admin",
    params(("limit" = Option<usize>, Query, minimum = 1, maximum = 500, description = "At most this many (default 100)")),
    responses(
        (status = 200, description = "The dead letters, oldest first", body = api_doc::InvokeResult<Vec<DeadLetterView>>),
        (status = 400, description = "A parameter cannot be read (INVALID_PARAMETER, naming it)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 403, description = "Not an admin token (FORBIDDEN)", body = Failure),
        (status = 503, description = "The broker cannot be read", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn dead_letters(
    State(state): State<HttpState>,
    _admin: Admin,
    query: QueryParams,
) -> Response {
    let limit = match query.limit(100, MAX_DEAD) {
        Ok(l) => l,
        Err(bad) => return bad.into(),
    };
    match state.broker.sweep_dead(limit, &|_| DeadChoice::Keep).await {
        Ok(swept) => {
            let views: Vec<DeadLetterView> = swept
                .iter()
                .enumerate()
                .map(|(i, (letter, _))| view(i, letter))
                .collect();
            answer(StatusCode::OK, InvokeResult::success(views))
        }
        Err(e) => unavailable(e),
    }
}

/// A turn, by its ids.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct TurnRef {
    /// The session.
    session_id: String,
    /// The turn.
    turn_id: String,
}

/// Which dead letters to requeue or discard: every one, or those of the turns named.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RequeueAsk {
    /// Every dead letter (up to 500 a call).
    #[serde(default)]
    all: bool,
    /// The dead letters of these turns.
    #[serde(default)]
    turns: Vec<TurnRef>,
}

/// What a requeue did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Requeued {
    /// Jobs put back on the job queue, as fresh jobs.
    requeued: usize,
    /// Of those, jobs whose turn had settled already (completed, failed or cancelled): the
    /// worker sends its status again and does not run it again.
    already_settled: usize,
    /// Jobs left in the dead-letter queue.
    kept: usize,
}

/// What a discard did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Discarded {
    /// Jobs taken out of the dead-letter queue for good.
    discarded: usize,
    /// Jobs left in it.
    kept: usize,
}

/// The ask in `body`, or what is wrong with it (answered 400 `MALFORMED_JSON`).
fn read_ask(body: &[u8], verb: &str) -> Result<RequeueAsk, String> {
    let ask: RequeueAsk = serde_json::from_slice(body).map_err(|e| format!("$: {e}"))?;
    if !ask.all && ask.turns.is_empty() {
        return Err(format!(
            "$: name the turns to {verb} (\"turns\") or ask for all (\"all\": true)"
        ));
    }
    Ok(ask)
}

/// Reads the ask in `body` and sweeps the dead letters it names with `chosen`, or answers
/// why not.
async fn sweep_asked(
    state: &HttpState,
    body: &[u8],
    verb: &str,
    chosen: DeadChoice,
) -> Result<Vec<(DeadLetter, DeadChoice)>, Box<Response>> {
    let ask = read_ask(body, verb).map_err(|message| {
        Box::new(failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::MalformedJson,
            message,
        ))
    })?;
    sweep(state, ask, chosen)
        .await
        .map_err(|e| Box::new(unavailable(e)))
}

/// The turns the dead letters name whose records say they have settled for good (completed,
/// failed or cancelled), read through the queue without changing it.
async fn settled_turns(
    state: &HttpState,
) -> Result<std::collections::HashSet<(SessionId, TurnId)>, Response> {
    let letters = state
        .broker
        .sweep_dead(MAX_DEAD, &|_| DeadChoice::Keep)
        .await
        .map_err(unavailable)?;
    let ids: Vec<(SessionId, TurnId)> = letters
        .iter()
        .filter_map(|(l, _)| crate::queue::named_turn(&l.body, l.meta.tenant.as_deref()))
        .collect();
    let records = state.store.get_turns(&ids).await.map_err(unavailable)?;
    Ok(ids
        .into_iter()
        .zip(records)
        .filter(|(_, r)| r.as_ref().is_some_and(|r| r.status.is_final()))
        .map(|(id, _)| id)
        .collect())
}

/// Sweeps the dead-letter queue, doing `chosen` to the letters `ask` names and keeping the
/// rest.
async fn sweep(
    state: &HttpState,
    ask: RequeueAsk,
    chosen: DeadChoice,
) -> Result<Vec<(DeadLetter, DeadChoice)>, crate::queue::QueueError> {
    let wanted: std::collections::HashSet<(String, String)> = ask
        .turns
        .into_iter()
        .map(|t| (t.session_id, t.turn_id))
        .collect();
    let all = ask.all;
    let choose = move |letter: &DeadLetter| {
        // The client's ids (the tenant is a field of the letter beside them).
        let named = crate::queue::named_turn(&letter.body, None)
            .map(|(s, t)| (s.to_string(), t.to_string()))
            .is_some_and(|ids| wanted.contains(&ids));
        if all || named {
            chosen
        } else {
            DeadChoice::Keep
        }
    };
    state.broker.sweep_dead(MAX_DEAD, &choose).await
}

/// Puts dead-lettered jobs back on the job queue as fresh jobs (the same tenant, trace,
/// batch and webhook; attempt 0): every one (`{"all": true}`) or those of the turns named
/// (`{"turns": [{"sessionId", "turnId"}]}`). Each is on the job queue before it leaves the
/// dead-letter queue. A turn that has settled since (failed, say) only has its status
/// delivered again (counted in `alreadySettled`); one that has not runs.
#[utoipa::path(post, path = "/v1/admin/dead-letters/requeue", tag = "admin",
    request_body(content = RequeueAsk, content_type = "application/json"),
    responses(
        (status = 200, description = "How many were requeued (and of those, how many had settled already) and kept", body = api_doc::InvokeResult<Requeued>),
        (status = 400, description = "The body is not a RequeueAsk, or asks for nothing (MALFORMED_JSON)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 403, description = "Not an admin token (FORBIDDEN)", body = Failure),
        (status = 408, description = "The body stopped arriving for APTIX_HTTP_READ_TIMEOUT_SECS (REQUEST_TIMEOUT); the connection is closed", body = Failure),
        (status = 413, description = "The body is larger than APTIX_MAX_BODY_BYTES", body = Failure),
        (status = 415, description = "Not JSON, or compressed", body = Failure),
        (status = 503, description = "The broker cannot be reached", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn requeue_dead(
    State(state): State<HttpState>,
    _admin: Admin,
    LimitedBody(body, _): LimitedBody<RequestSized>,
) -> Response {
    let ask = match read_ask(&body, "requeue") {
        Ok(ask) => ask,
        Err(message) => return failure(StatusCode::BAD_REQUEST, ErrorCode::MalformedJson, message),
    };
    // Which of the dead letters' turns have settled, read before any of them is requeued: a
    // requeued job can run and settle before a read after the sweep.
    let settled = match settled_turns(&state).await {
        Ok(settled) => settled,
        Err(refused) => return refused,
    };
    let swept = match sweep(&state, ask, DeadChoice::Requeue).await {
        Ok(s) => s,
        Err(e) => return unavailable(e),
    };
    let requeued: Vec<&DeadLetter> = swept
        .iter()
        .filter(|(_, c)| *c == DeadChoice::Requeue)
        .map(|(l, _)| l)
        .collect();
    let already_settled = requeued
        .iter()
        .filter_map(|l| crate::queue::named_turn(&l.body, l.meta.tenant.as_deref()))
        .filter(|turn| settled.contains(turn))
        .count();
    tracing::info!(
        requeued = requeued.len(),
        already_settled,
        "dead letters requeued"
    );
    answer(
        StatusCode::OK,
        InvokeResult::success(Requeued {
            requeued: requeued.len(),
            already_settled,
            kept: swept.len() - requeued.len(),
        }),
    )
}

/// Takes dead-lettered jobs out of the dead-letter queue for good: every one or those of the
/// turns named (as for a requeue). Their turns stay as they are (a dead-lettered turn's
/// record is settled, usually failed).
#[utoipa::path(post, path = "/v1/admin/dead-letters/discard", tag = "admin",
    request_body(content = RequeueAsk, content_type = "application/json"),
    responses(
        (status = 200, description = "How many were discarded and kept", body = api_doc::InvokeResult<Discarded>),
        (status = 400, description = "The body is not a RequeueAsk, or asks for nothing (MALFORMED_JSON)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 403, description = "Not an admin token (FORBIDDEN)", body = Failure),
        (status = 408, description = "The body stopped arriving for APTIX_HTTP_READ_TIMEOUT_SECS (REQUEST_TIMEOUT); the connection is closed", body = Failure),
        (status = 413, description = "The body is larger than APTIX_MAX_BODY_BYTES", body = Failure),
        (status = 415, description = "Not JSON, or compressed", body = Failure),
        (status = 503, description = "The broker cannot be reached", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn discard_dead(
    State(state): State<HttpState>,
    _admin: Admin,
    LimitedBody(body, _): LimitedBody<RequestSized>,
) -> Response {
    let swept = match sweep_asked(&state, &body, "discard", DeadChoice::Discard).await {
        Ok(s) => s,
        Err(refused) => return *refused,
    };
    let discarded = swept
        .iter()
        .filter(|(_, c)| *c == DeadChoice::Discard)
        .count();
    tracing::info!(discarded, "dead letters discarded");
    answer(
        StatusCode::OK,
        InvokeResult::success(Discarded {
            discarded,
            kept: swept.len() - discarded,
        }),
    )
}
