//! `POST /api/ai/agent/execute`: the original platform's synchronous endpoint — submit, then
//! wait for the turn's settled status on the session's events.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::contract::{AgentExecuteRequest, parse_request};
use crate::contract::{ErrorCode, ErrorMessage, InvokeResult};
use crate::frontdoor::extract::{
    HttpState, LimitedBody, RequestSized, Tenant, Traced, answer, refused,
};
use crate::frontdoor::openapi::ExecuteResult;
use crate::frontdoor::openapi::{self as api_doc, Failure};
use crate::replies::{Waited, next_settled};
use crate::trace::TraceContext;

/// The longest the synchronous endpoint waits for a result.
pub(crate) const SYNC_WAIT: Duration = Duration::from_secs(600);

/// The original platform's synchronous endpoint: enqueue, wait, answer `200` with the
/// `InvokeResult<AgentExecuteResponse>` (failed for invalid requests and failed turns), or with
/// `"streaming": true` an NDJSON stream whose last line is
/// `{"kind":"final","index":99999,"final": <InvokeResult>}`. Only 401 and 413 are not 200.
#[utoipa::path(post, path = "/api/ai/agent/execute", tag = "compatibility",
    request_body(content = api_doc::AgentExecuteRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The turn's result (failed for invalid requests and failed turns); with \"streaming\": true an application/x-ndjson stream whose last line is StreamFinalLine",
            content((ExecuteResult = "application/json"), (api_doc::StreamFinalLine = "application/x-ndjson"))),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 413, description = "Body over the limit", body = Failure),
    ))]
pub(crate) async fn execute_sync(
    State(state): State<HttpState>,
    Traced(trace): Traced,
    Tenant(tenant): Tenant,
    LimitedBody(body, _): LimitedBody<RequestSized>,
) -> Response {
    let parsed = match parse_request(&body, &state.limits) {
        Ok(p) => p,
        Err(rejected) => return refused(rejected, StatusCode::OK),
    };
    let streaming = matches!(&parsed.request, AgentExecuteRequest::UserTurn(t) if t.streaming());
    let result = run_sync(&state, &tenant, &parsed.request, &trace)
        .await
        .with_warnings(parsed.warnings);
    if streaming {
        let line = serde_json::json!({"kind": "final", "index": 99999, "final": result});
        return (
            StatusCode::OK,
            [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
            format!("{line}\n"),
        )
            .into_response();
    }
    answer(StatusCode::OK, result)
}

pub(crate) async fn run_sync(
    state: &HttpState,
    tenant: &str,
    request: &AgentExecuteRequest,
    trace: &TraceContext,
) -> InvokeResult<crate::contract::AgentExecuteResponse> {
    let (sid, tid) = (request.session_id(), request.turn_id());
    let fail = |code, message: String| InvokeResult::failure(ErrorMessage::new(code, message));
    // Subscribe before enqueueing so the result cannot slip past.
    let mut events = match state.broker.subscribe_events(sid).await {
        Ok(e) => e,
        Err(e) => return fail(ErrorCode::ServiceUnavailable, e.to_string()),
    };
    let accepted = match state.door.submit_for(tenant, request, trace).await {
        Ok(view) => view,
        Err(refused) => return refused.into_invoke_result(),
    };
    // A request for a turn that already ran gets its stored result at once.
    if accepted.status.is_settled()
        && matches!(request, AgentExecuteRequest::UserTurn(_))
        && let Some(r) = accepted.result
    {
        return r;
    }
    let deadline = tokio::time::Instant::now() + SYNC_WAIT;
    loop {
        match next_settled(&mut events, tid, deadline).await {
            Waited::Settled(view) => {
                if let Some(result) = view.result {
                    return result;
                }
            }
            Waited::TimedOut | Waited::Closed => {
                return fail(
                    ErrorCode::ServiceUnavailable,
                    format!(
                        "turn {tid} did not finish in time; poll GET /v1/sessions/{sid}/turns/{tid}"
                    ),
                );
            }
        }
    }
}
