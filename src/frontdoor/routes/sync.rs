//! `POST /api/ai/agent/execute`: the original platform's synchronous endpoint — submit, then
//! wait for the turn's settled status (see [`crate::delivery`]).

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::contract::AgentExecuteResponse;
use crate::contract::{AgentExecuteRequest, SessionId, TurnId, parse_request};
use crate::contract::{ErrorCode, ErrorMessage, InvokeResult};
use crate::delivery::{Heard, Listener, Settled, Turn};
use crate::frontdoor::extract::{
    HttpState, LimitedBody, RequestSized, Tenant, Traced, answer, refused,
};
use crate::frontdoor::openapi::ExecuteResult;
use crate::frontdoor::openapi::{self as api_doc, Failure};
use crate::live::LiveBody;
use crate::state::{TurnStatus, TurnStatusView};
use crate::trace::TraceContext;

/// The longest the synchronous endpoint waits for a result.
pub(crate) const SYNC_WAIT: Duration = Duration::from_secs(600);

/// The original platform's synchronous endpoint: enqueue, wait, answer `200` with the
/// `InvokeResult<AgentExecuteResponse>` (failed for invalid requests and failed turns), or with
/// `"streaming": true` an NDJSON stream whose last line is
/// `{"kind":"final","index":99999,"final": <InvokeResult>}`. Only 401, 413 and 415 are not
/// 200.
#[utoipa::path(post, path = "/api/ai/agent/execute", tag = "compatibility",
    request_body(content = api_doc::AgentExecuteRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The turn's result (failed for invalid requests and failed turns); with \"streaming\": true an application/x-ndjson stream of StreamLine: delta and progress lines as they happen, then StreamFinalLine, after which the body ends",
            content((ExecuteResult = "application/json"), (api_doc::StreamLine = "application/x-ndjson"))),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 408, description = "The body stopped arriving for APTIX_HTTP_READ_TIMEOUT_SECS (REQUEST_TIMEOUT); the connection is closed", body = Failure),
        (status = 413, description = "Body over the limit", body = Failure),
        (status = 415, description = "UNSUPPORTED_CONTENT_ENCODING: a compressed body (Content-Encoding other than identity); UNSUPPORTED_MEDIA_TYPE: a Content-Type other than application/json, or a charset other than UTF-8", body = Failure),
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
    // The body's bytes share the connection's read buffer: not kept while the turn runs.
    drop(body);
    let streaming = matches!(&parsed.request, AgentExecuteRequest::UserTurn(t) if t.streaming());
    if streaming {
        return stream_sync(state, tenant, parsed.request, trace, parsed.warnings);
    }
    match run_sync(&state, &tenant, &parsed.request, &trace).await {
        // The result as the worker wrote it, unless the request's warnings join it.
        SyncAnswer::AsWritten(result) if parsed.warnings.is_empty() => (
            StatusCode::OK,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            result,
        )
            .into_response(),
        other => answer(
            StatusCode::OK,
            other.into_result().with_warnings(parsed.warnings),
        ),
    }
}

/// What the synchronous endpoint answers: a result made here, or a settled turn's result as
/// the worker that settled it wrote it (passed on without being read and written again).
pub(crate) enum SyncAnswer {
    /// Made here (a refusal, a failure to wait, a status read from the store).
    Made(Box<InvokeResult<AgentExecuteResponse>>),
    /// The JSON of the `InvokeResult` the worker published.
    AsWritten(axum::body::Bytes),
}

impl SyncAnswer {
    /// The result, read from its JSON if it came as written.
    fn into_result(self) -> InvokeResult<AgentExecuteResponse> {
        match self {
            Self::Made(result) => *result,
            Self::AsWritten(json) => serde_json::from_slice(&json).unwrap_or_else(|e| {
                unavailable_now(format!("the turn's result cannot be read: {e}"))
            }),
        }
    }
}

impl From<InvokeResult<AgentExecuteResponse>> for SyncAnswer {
    fn from(result: InvokeResult<AgentExecuteResponse>) -> Self {
        Self::Made(Box::new(result))
    }
}

/// One NDJSON line.
fn line(value: serde_json::Value) -> Result<axum::body::Bytes, std::convert::Infallible> {
    Ok(format!("{value}\n").into())
}

/// The last line: `{"kind":"final","index":99999,"final":<InvokeResult>}`.
fn final_line<T: serde::Serialize>(result: &InvokeResult<T>) -> serde_json::Value {
    serde_json::json!({"kind": "final", "index": 99999, "final": result})
}

/// The streamed answer: the turn's live events as `delta` and `progress` lines, each sent as
/// it arrives, then the final line; the body ends right after it.
fn stream_sync(
    state: HttpState,
    tenant: String,
    request: AgentExecuteRequest,
    trace: TraceContext,
    warnings: Vec<ErrorMessage>,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let result = relay_turn(&state, &tenant, &request, &trace, &tx)
            .await
            .with_warnings(warnings);
        let _ = tx.send(line(final_line(&result))).await;
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (
        StatusCode::OK,
        [
            (axum::http::header::CONTENT_TYPE, "application/x-ndjson"),
            (axum::http::header::CACHE_CONTROL, "no-cache"),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// Submits the turn and relays its live events to `lines` until its result, which it returns.
async fn relay_turn(
    state: &HttpState,
    tenant: &str,
    request: &AgentExecuteRequest,
    trace: &TraceContext,
    lines: &tokio::sync::mpsc::Sender<Result<axum::body::Bytes, std::convert::Infallible>>,
) -> InvokeResult<crate::contract::AgentExecuteResponse> {
    // The session is the tenant's: the wait below listens for the scoped id.
    let request = &*request.within(tenant);
    let (sid, tid) = (request.session_id(), request.turn_id());
    // Boxed: the submission's state is large and short-lived, the wait's small and long.
    let submitted = Box::pin(submit_and_listen(state, tenant, request, trace, true)).await;
    // The accepted status is not kept while the call waits.
    let (mut listener, running) = match submitted {
        Ok((listener, accepted)) => {
            if accepted.status.is_settled()
                && let Some(r) = accepted.result
            {
                return r;
            }
            (listener, accepted.status == TurnStatus::Running)
        }
        Err(failed) => return failed,
    };
    let deadline = tokio::time::Instant::now() + SYNC_WAIT;
    if running {
        // Its text went to the front door that accepted it; its result comes here.
        return wait_elsewhere(state, (sid, tid), deadline)
            .await
            .into_result();
    }
    loop {
        let view = match listener.next(deadline).await {
            Ok(Heard::Live(event)) => {
                let shown = match event.body {
                    LiveBody::Delta { text, .. } => {
                        serde_json::json!({"kind": "delta", "index": event.index, "text": text})
                    }
                    LiveBody::Progress { message } => {
                        serde_json::json!({"kind": "progress", "index": event.index, "message": message})
                    }
                };
                if lines.send(line(shown)).await.is_err() {
                    // The client went away; the turn goes on and its result is stored.
                    return unavailable_now("the client disconnected".into());
                }
                continue;
            }
            Ok(Heard::Settled(settled)) => Some(settled),
            Ok(Heard::Unsettled(view)) => Some(Settled::Read(view)),
            Ok(Heard::Gone) => None,
            Err(e) => return unavailable_now(e.to_string()),
        };
        return outcome(sid, tid, view).into_result();
    }
}

pub(crate) async fn run_sync(
    state: &HttpState,
    tenant: &str,
    request: &AgentExecuteRequest,
    trace: &TraceContext,
) -> SyncAnswer {
    // The session is the tenant's: the wait below listens for the scoped id.
    let request = &*request.within(tenant);
    let (sid, tid) = (request.session_id(), request.turn_id());
    // Boxed: the submission's state is large and short-lived, the wait's small and long.
    let submitted = Box::pin(submit_and_listen(state, tenant, request, trace, false)).await;
    // The accepted status is not kept while the call waits.
    let (mut listener, running) = match submitted {
        Ok((listener, accepted)) => {
            // A request for a turn that already ran gets its stored result at once.
            if accepted.status.is_settled()
                && matches!(request, AgentExecuteRequest::UserTurn(_))
                && let Some(r) = accepted.result
            {
                return r.into();
            }
            (listener, accepted.status == TurnStatus::Running)
        }
        Err(failed) => return failed.into(),
    };
    let deadline = tokio::time::Instant::now() + SYNC_WAIT;
    if running {
        // Boxed: a rare wait, kept out of every call's state.
        return Box::pin(wait_elsewhere(state, (sid, tid), deadline)).await;
    }
    match listener.settled(deadline).await {
        Ok(settled) => outcome(sid, tid, settled),
        Err(e) => unavailable_now(e.to_string()).into(),
    }
}

/// The wait for a turn that was already running when its request came (sent again after the
/// front door that accepted it went away, say): its job named that front door, so its
/// statuses do not come here directly; the delivery hears of it through the session.
async fn wait_elsewhere(
    state: &HttpState,
    (sid, tid): (&SessionId, &TurnId),
    deadline: tokio::time::Instant,
) -> SyncAnswer {
    let waited = match state.door.delivery().turn(sid, tid).await {
        Err(e) => return unavailable_now(e.to_string()).into(),
        Ok(Turn::Gone) => Ok(None),
        Ok(Turn::Settled(view)) => Ok(Some(Settled::Read(view))),
        Ok(Turn::Unsettled(mut listener)) => listener.settled(deadline).await,
    };
    match waited {
        Ok(settled) => outcome(sid, tid, settled),
        Err(e) => unavailable_now(e.to_string()).into(),
    }
}

/// Listens for the turn directly (live events too when `live`), then submits it naming this
/// process: the worker sends its statuses here, and neither text nor result can slip past.
/// Gives the listener and the accepted status, or the answer to give when either step failed.
async fn submit_and_listen(
    state: &HttpState,
    tenant: &str,
    request: &AgentExecuteRequest,
    trace: &TraceContext,
    live: bool,
) -> Result<(Listener, TurnStatusView), InvokeResult<crate::contract::AgentExecuteResponse>> {
    let listener = state
        .door
        .delivery()
        .expect(request.session_id(), request.turn_id(), live)
        .await
        .map_err(|e| unavailable_now(e.to_string()))?;
    let accepted = state
        .door
        .submit(
            tenant,
            request,
            trace,
            crate::frontdoor::Pickup::in_response(listener.address()),
        )
        .await
        .map_err(|refused| refused.into_invoke_result())?;
    Ok((listener, accepted))
}

fn unavailable_now(message: String) -> InvokeResult<crate::contract::AgentExecuteResponse> {
    InvokeResult::failure(ErrorMessage::new(ErrorCode::ServiceUnavailable, message))
}

/// The synchronous answer for what the wait came to: the turn's result once it settled (as
/// its worker wrote it when it was heard from the worker), else a failure that says where to
/// look.
fn outcome(sid: &SessionId, tid: &TurnId, settled: Option<Settled>) -> SyncAnswer {
    let without_result = |status: TurnStatus| {
        unavailable_now(format!(
            "turn {tid} is {} without a result",
            status.as_str()
        ))
    };
    match settled {
        Some(Settled::Published(heard)) if heard.status().is_settled() => {
            heard.result_json().map_or_else(
                || without_result(heard.status()).into(),
                SyncAnswer::AsWritten,
            )
        }
        Some(Settled::Read(view)) if view.status.is_settled() => view
            .result
            .unwrap_or_else(|| without_result(view.status))
            .into(),
        Some(_) => unavailable_now(format!(
            "turn {tid} did not finish in time; poll GET /v1/sessions/{}/turns/{tid}",
            sid.client_id()
        ))
        .into(),
        None => unavailable_now(format!(
            "turn {tid} of session {} no longer exists",
            sid.client_id()
        ))
        .into(),
    }
}
