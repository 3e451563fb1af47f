//! `POST /v1/turns` (a user turn or a tool continuation, answered `202` once the broker
//! confirmed the job) and `GET /v1/sessions/{sessionId}/turns/{turnId}` with `?wait=` long-polls.
//! The only HTTP mapping of a refused submission ([`SubmitError`]) lives here.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::contract::parse_request;
use crate::contract::{ErrorCode, InvokeResult};
use crate::delivery::{Settled, Turn};
use crate::frontdoor::SubmitError;
use crate::frontdoor::extract::{
    ApiPath, HttpState, LimitedBody, QueryParams, Reader, RequestSized, Tenant, Traced, answer,
    not_found_turn, refused, unavailable, unavailable_unaccepted,
};
use crate::frontdoor::openapi::{self as api_doc, Failure};
use crate::store::TurnStatusView;

/// Submit a turn (a user turn or a tool continuation).
#[utoipa::path(post, path = "/v1/turns", tag = "turns",
    request_body(content = api_doc::AgentExecuteRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "Accepted: the job is confirmed by the broker", body = api_doc::InvokeResult<api_doc::TurnStatusView>),
        (status = 400, description = "Invalid: every violation; nothing enqueued", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 404, description = "Continuation for a turn that does not exist", body = Failure),
        (status = 409, description = "Same ids, different payload; or the turn is not awaiting client tools", body = Failure),
        (status = 408, description = "The body stopped arriving for APTIX_HTTP_READ_TIMEOUT_SECS (REQUEST_TIMEOUT); the connection is closed", body = Failure),
        (status = 413, description = "Body over the limit", body = Failure),
        (status = 415, description = "UNSUPPORTED_CONTENT_ENCODING: a compressed body (Content-Encoding other than identity); UNSUPPORTED_MEDIA_TYPE: a Content-Type other than application/json, or a charset other than UTF-8", body = Failure),
        (status = 429, description = "QUOTA_EXCEEDED: the tenant's daily token quota is spent (a new user turn); the message and Retry-After say when it resets", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds until the quota resets"))),
        (status = 503, description = "Queue or store unavailable; nothing accepted", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn post_turn(
    State(state): State<HttpState>,
    Traced(trace): Traced,
    Tenant(tenant): Tenant,
    LimitedBody(body, _): LimitedBody<RequestSized>,
) -> Response {
    let parsed = match parse_request(&body, &state.limits) {
        Ok(p) => p,
        Err(rejected) => return refused(rejected, StatusCode::BAD_REQUEST),
    };
    // The turn names this process, so a long-poll here hears of it without a binding.
    let address = state.door.delivery().address().await;
    match state
        .door
        .submit(
            &tenant,
            &parsed.request,
            &trace,
            crate::frontdoor::Pickup::later(address.as_deref()),
        )
        .await
    {
        Ok(view) => answer(
            StatusCode::ACCEPTED,
            InvokeResult::success(view).with_warnings(parsed.warnings),
        ),
        Err(refused) => refused.into_response(),
    }
}

impl IntoResponse for SubmitError {
    /// The status and `InvokeResult` of a refusal; a dependency failure is logged and answered
    /// with a message that says nothing was accepted.
    fn into_response(self) -> Response {
        match self {
            Self::Unavailable(m) => unavailable_unaccepted(m),
            Self::Untold(m) => {
                tracing::warn!(error = %m, "done, but not told of");
                let mut response = answer::<()>(
                    StatusCode::SERVICE_UNAVAILABLE,
                    InvokeResult::failure(crate::contract::ErrorMessage::new(
                        ErrorCode::ServiceUnavailable,
                        m,
                    )),
                );
                response
                    .headers_mut()
                    .insert(axum::http::header::RETRY_AFTER, 1.into());
                response
            }
            refused => {
                let status = StatusCode::from_u16(refused.http_status())
                    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                let retry_after = refused.retry_after_secs();
                let mut response = answer::<()>(status, refused.into_invoke_result());
                if let Some(secs) = retry_after {
                    response
                        .headers_mut()
                        .insert(axum::http::header::RETRY_AFTER, secs.into());
                }
                response
            }
        }
    }
}

/// Everything kept of a turn, for a person looking into it (the console's turn inspector):
/// its history from `queued` on (runs started and ended, and why), every model call answered
/// (model, agent context, latency, tokens, tier, text) and request sent, every server tool
/// call with its arguments and output (and whether it was replayed from the ledger), and the
/// result.
#[utoipa::path(get, path = "/v1/sessions/{sessionId}/turns/{turnId}/inspect", tag = "turns",
    params(
        ("sessionId" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The session (named within the caller's tenant)"),
        ("tenant" = Option<String>, Query, pattern = "^[A-Za-z0-9._:-]{1,64}$", description = "Whose session: an admin's token may name any tenant, a tenant's token only its own (default: the token's tenant)"),
        ("turnId" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The turn"),
    ),
    responses(
        (status = 200, description = "The turn as kept", body = api_doc::InvokeResult<crate::state::TurnInspection>),
        (status = 400, description = "A parameter cannot be read (INVALID_PARAMETER, naming it), or a path id is not an id (INVALID_ID)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 403, description = "`tenant` names another tenant and the token is not an admin's (FORBIDDEN)", body = Failure),
        (status = 404, description = "No such turn in this session", body = Failure),
        (status = 503, description = "Store unavailable", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn inspect_turn(
    State(state): State<HttpState>,
    ApiPath((session_id, turn_id)): ApiPath<(String, String)>,
    reader: Reader,
) -> Response {
    let (sid, tid) = match reader.turn(&session_id, &turn_id) {
        Ok(ids) => ids,
        Err(refused) => return refused.into_response(),
    };
    let record = match state.store.get_turn(&sid, &tid).await {
        Err(e) => return unavailable(e),
        Ok(None) => return not_found_turn(&sid, &tid),
        Ok(Some(r)) => r,
    };
    // The requests as sent: each with the prompt its transcript names put back.
    let named = crate::state::TurnInspection::prompts_named(&record);
    let prompts = match state.store.prompts(&named).await {
        Ok(prompts) => prompts,
        Err(e) => return unavailable(e),
    };
    answer(
        StatusCode::OK,
        InvokeResult::success(crate::state::TurnInspection::of(&record, &prompts)),
    )
}

/// A turn's status; `?wait=<seconds>` long-polls until it leaves queued/running.
#[utoipa::path(get, path = "/v1/sessions/{sessionId}/turns/{turnId}", tag = "turns",
    params(
        ("sessionId" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The session (named within the caller's tenant)"),
        ("tenant" = Option<String>, Query, pattern = "^[A-Za-z0-9._:-]{1,64}$", description = "Whose session: an admin's token may name any tenant, a tenant's token only its own (default: the token's tenant)"),
        ("turnId" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The turn"),
        ("wait" = Option<f64>, Query, minimum = 0, description = "Seconds to wait for the turn to leave queued/running (longer waits are cut to 60)"),
    ),
    responses(
        (status = 200, description = "The turn's status", body = api_doc::InvokeResult<api_doc::TurnStatusView>),
        (status = 400, description = "A parameter cannot be read (INVALID_PARAMETER, naming it), or a path id is not an id (INVALID_ID)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 403, description = "`tenant` names another tenant and the token is not an admin's (FORBIDDEN)", body = Failure),
        (status = 404, description = "No such turn in this session", body = Failure),
        (status = 503, description = "Store unavailable", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn get_turn(
    State(state): State<HttpState>,
    ApiPath((session_id, turn_id)): ApiPath<(String, String)>,
    query: QueryParams,
    reader: Reader,
) -> Response {
    let wait = match query.wait() {
        Ok(w) => w,
        Err(bad) => return bad.into(),
    };
    let (sid, tid) = match reader.turn(&session_id, &turn_id) {
        Ok(ids) => ids,
        Err(refused) => return refused.into_response(),
    };
    if wait.is_zero() {
        return match state.store.get_turn(&sid, &tid).await {
            Err(e) => unavailable(e),
            Ok(None) => not_found_turn(&sid, &tid),
            Ok(Some(r)) => answer(
                StatusCode::OK,
                InvokeResult::success(TurnStatusView::from(&r)),
            ),
        };
    }
    let deadline = tokio::time::Instant::now() + wait;
    let waited = match state.door.delivery().turn(&sid, &tid).await {
        Err(e) => return unavailable(e),
        Ok(Turn::Gone) => Ok(None),
        Ok(Turn::Settled(view)) => Ok(Some(*view)),
        Ok(Turn::Unsettled(mut listener)) => listener
            .settled(deadline)
            .await
            .and_then(|settled| settled.map(Settled::into_view).transpose()),
    };
    match waited {
        Err(e) => unavailable(e),
        Ok(None) => not_found_turn(&sid, &tid),
        Ok(Some(view)) => answer(StatusCode::OK, InvokeResult::success(view)),
    }
}

/// Cancel a turn: a queued turn, or one waiting for client tools, is `cancelled` at once
/// (`200`); a running one stops at its next safe point (`202`; its `cancelled` status follows
/// on the session's events and the long-poll). Idempotent.
#[utoipa::path(post, path = "/v1/sessions/{sessionId}/turns/{turnId}/cancel", tag = "turns",
    params(
        ("sessionId" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The session (named within the caller's tenant)"),
        ("tenant" = Option<String>, Query, pattern = "^[A-Za-z0-9._:-]{1,64}$", description = "Whose session: an admin's token may name any tenant, a tenant's token only its own (default: the token's tenant)"),
        ("turnId" = String, Path, pattern = "^[A-Za-z0-9._:-]{1,128}$", description = "The turn"),
    ),
    responses(
        (status = 200, description = "The turn is cancelled", body = api_doc::InvokeResult<api_doc::TurnStatusView>),
        (status = 202, description = "The turn is running; it stops within about a second", body = api_doc::InvokeResult<api_doc::TurnStatusView>),
        (status = 400, description = "A parameter cannot be read (INVALID_PARAMETER, naming it), or a path id is not an id (INVALID_ID)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 403, description = "`tenant` names another tenant and the token is not an admin's (FORBIDDEN)", body = Failure),
        (status = 404, description = "No such turn in this session", body = Failure),
        (status = 409, description = "The turn has finished (TURN_ALREADY_FINISHED, naming its status)", body = Failure),
        (status = 503, description = "Store unavailable; or the turn is cancelled but its status could not be told of (the message says so: cancel again to tell of it)", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn cancel_turn(
    State(state): State<HttpState>,
    ApiPath((session_id, turn_id)): ApiPath<(String, String)>,
    reader: Reader,
) -> Response {
    use crate::frontdoor::cancel::Cancelled;
    let (sid, tid) = match reader.turn(&session_id, &turn_id) {
        Ok(ids) => ids,
        Err(refused) => return refused.into_response(),
    };
    match state.door.cancel_owned(&sid, &tid).await {
        Ok(Cancelled::Done(view)) => answer(StatusCode::OK, InvokeResult::success(view)),
        Ok(Cancelled::Stopping(view)) => answer(StatusCode::ACCEPTED, InvokeResult::success(view)),
        Err(refused) => refused.into_response(),
    }
}
