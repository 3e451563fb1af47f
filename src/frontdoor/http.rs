//! The HTTP API (axum): every answer an `InvokeResult` in the wire format of DESIGN.md §2.
//!
//! Routes: turns (`POST /v1/turns`, `GET /v1/sessions/{sessionId}/turns/{turnId}` with
//! `?wait=<seconds>` long-polling), sessions (`GET /v1/sessions/{sessionId}` and its SSE
//! `/events`), batches (`POST /v1/batches`, `GET /v1/batches/{batchId}` and `/results`), the
//! original synchronous endpoint (`POST /api/ai/agent/execute`), and operations (`/healthz`,
//! `/readyz`, `/metrics`, `/openapi.json`). The router and the OpenAPI document are built from
//! the same annotated handlers, so the document covers every route.
//!
//! Auth: `Authorization: Bearer <token>`, tokens map to tenants; a session (or batch) belongs to
//! the tenant that created it, and another tenant's looks exactly like a missing one. `/healthz`,
//! `/readyz`, `/metrics` and `/openapi.json` need no token.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::batch::{BatchAccepted, BatchProgress, BatchResultLine};
use super::openapi::{self as api_doc, ExecuteResult, Failure};
use super::{FrontDoor, SubmitError};
use crate::catalog::ModeCatalog;
use crate::config::{ApiTokens, BatchLimits};
use crate::contexts::KnownContexts;
use crate::contract::{
    AgentExecuteRequest, ErrorCode, ErrorMessage, InvokeResult, RequestLimits, SessionId, TurnId,
    parse_request,
};
use crate::metrics::Metrics;
use crate::queue::Broker;
use crate::rag::indexer::IndexReport;
use crate::rag::{ChunkIndex, ChunkOptions};
use crate::store::TurnStatusView;
use crate::store::{ModeChange, SessionStore, TurnStatus};
use crate::trace::TraceContext;

/// What the handlers share.
#[derive(Clone)]
pub struct HttpState {
    /// Accepts requests.
    pub door: FrontDoor,
    /// Reads turn and session state.
    pub store: Arc<dyn SessionStore>,
    /// For readiness checks.
    pub broker: Arc<dyn Broker>,
    /// For mode display names.
    pub catalog: Arc<ModeCatalog>,
    /// Who may call.
    pub tokens: ApiTokens,
    /// Request size limits.
    pub limits: RequestLimits,
    /// Batch size limits.
    pub batch_limits: BatchLimits,
    /// The process's metrics (`GET /metrics`).
    pub metrics: Arc<Metrics>,
    /// The chunk index `POST /v1/index` writes to.
    pub index: Arc<dyn ChunkIndex>,
    /// How indexed files are cut.
    pub chunk_options: ChunkOptions,
}

pub use crate::config::LOCAL_TENANT;

/// The longest long-poll wait accepted.
const MAX_WAIT: Duration = Duration::from_secs(60);

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "aptix-worker",
        description = "Queue-driven execution of LLM agent turns: submit turns and batches, poll or subscribe for results."
    ),
    components(schemas(api_doc::AgentExecuteRequest, api_doc::AgentExecuteResponse, api_doc::BatchLine, api_doc::BatchRequest, api_doc::StreamFinalLine, ExecuteResult, Failure)),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The routes and the OpenAPI document describing exactly them.
fn parts() -> (Router<HttpState>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(post_turn))
        .routes(routes!(get_turn))
        .routes(routes!(get_session))
        .routes(routes!(session_events))
        .routes(routes!(post_batch))
        .routes(routes!(get_batch))
        .routes(routes!(get_batch_results))
        .routes(routes!(post_index))
        .routes(routes!(execute_sync))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(openapi_json))
        .split_for_parts()
}

/// The OpenAPI document of the API with only the built-in `default` contexts.
pub fn openapi() -> serde_json::Value {
    openapi_for(&KnownContexts::default())
}

/// The OpenAPI document of the API as a deployment with these contexts serves it at
/// `/openapi.json` (the request schemas list the configured context ids).
pub fn openapi_for(contexts: &KnownContexts) -> serde_json::Value {
    document(parts().1, contexts)
}

/// The generated document with the request schemas that the typed model cannot hold
/// (`oneOf`/`anyOf` beside properties) put in as written.
fn document(api: utoipa::openapi::OpenApi, contexts: &KnownContexts) -> serde_json::Value {
    let mut doc = serde_json::to_value(api).unwrap_or_default();
    if let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(serde_json::Value::as_object_mut)
    {
        for (name, schema) in api_doc::raw_schemas(contexts) {
            schemas.insert(name.to_string(), schema);
        }
    }
    doc
}

/// The router with every route.
pub fn router(state: HttpState) -> Router {
    let (router, api) = parts();
    let doc = document(api, state.door.contexts());
    let api = Arc::new(serde_json::to_string(&doc).unwrap_or_else(|_| "{}".to_string()));
    let router = router
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        // Bodies are read (and limited) by the handler, so an oversized body still gets an
        // `InvokeResult` with `PAYLOAD_TOO_LARGE`.
        .layer(DefaultBodyLimit::disable())
        .layer(axum::Extension(OpenApiJson(api)))
        .with_state(state);
    with_http_layers(router)
}

/// The header that carries a request's id, in and out.
pub const REQUEST_ID: &str = "x-request-id";

/// What every router gets, outermost first: a request id (the client's `x-request-id`, else a
/// fresh UUID) set on the request and echoed on the answer; a span per request carrying the
/// method, the route and the id, closed by one access-log line with status and latency; and a
/// panic in a handler turned into a `500` `InvokeResult` with `INTERNAL`.
pub fn with_http_layers(router: Router) -> Router {
    use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
    let header = axum::http::HeaderName::from_static(REQUEST_ID);
    let trace = tower_http::trace::TraceLayer::new_for_http()
        .make_span_with(|request: &axum::http::Request<_>| {
            let route = request
                .extensions()
                .get::<axum::extract::MatchedPath>()
                .map_or("(no route)", |p| p.as_str());
            let id = request
                .headers()
                .get(REQUEST_ID)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let span = tracing::info_span!(
                "http",
                method = %request.method(),
                route,
                request_id = id,
                trace_id = tracing::field::Empty
            );
            // An exported request span joins the caller's trace; see `trace_of`.
            if let Some(parent) = request
                .headers()
                .get(crate::trace::TRACEPARENT)
                .and_then(|v| v.to_str().ok())
                .and_then(TraceContext::parse)
            {
                parent.adopt(&span);
            }
            span
        })
        .on_request(())
        .on_response(
            |response: &Response, latency: Duration, _span: &tracing::Span| {
                tracing::info!(
                    status = response.status().as_u16(),
                    latency_ms = latency.as_secs_f64() * 1000.0,
                    "request"
                );
            },
        )
        .on_failure(());
    router
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panicked))
        .layer(trace)
        .layer(PropagateRequestIdLayer::new(header.clone()))
        .layer(SetRequestIdLayer::new(header, MakeRequestUuid))
}

/// The answer when a handler panicked: the details go to the log, not to the client.
fn panicked(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    tracing::error!("a request handler panicked; answered 500");
    failure(
        StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::Internal,
        "an unexpected internal failure; it is logged under this request's x-request-id",
    )
}

#[derive(Clone)]
struct OpenApiJson(Arc<String>);

/// Any path no route has: a 404 `InvokeResult`, like every other answer.
async fn no_route(uri: axum::http::Uri) -> Response {
    failure(
        StatusCode::NOT_FOUND,
        ErrorCode::RouteNotFound,
        format!("no route has the path {:?}; see /openapi.json", uri.path()),
    )
}

/// A known path with a method it does not have.
async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    failure(
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::MethodNotAllowed,
        format!(
            "{method} is not allowed on {:?}; see /openapi.json",
            uri.path()
        ),
    )
}

/// Only `/healthz`, `/readyz` and `/metrics`: what a standalone worker serves.
pub fn ops_router(state: HttpState) -> Router {
    with_http_layers(
        Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .fallback(no_route)
            .method_not_allowed_fallback(wrong_method)
            .with_state(state),
    )
}

fn answer<T: Serialize>(status: StatusCode, result: InvokeResult<T>) -> Response {
    (status, Json(result)).into_response()
}

fn failure(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Response {
    answer::<()>(
        status,
        InvokeResult::failure(ErrorMessage::new(code, message)),
    )
}

/// The caller's tenant, if the call is authenticated.
fn tenant(state: &HttpState, headers: &HeaderMap) -> Option<String> {
    if state.tokens.is_empty() {
        return Some(LOCAL_TENANT.to_string());
    }
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    token
        .and_then(|t| state.tokens.tenant(t))
        .map(str::to_string)
}

fn unauthorized() -> Response {
    failure(
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthorized,
        "a valid Authorization: Bearer <token> header is required",
    )
}

fn unavailable(e: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "dependency unavailable");
    failure(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::ServiceUnavailable,
        "the service is temporarily unavailable; nothing was accepted, try again",
    )
}

/// Submit a turn (a user turn or a tool continuation).
#[utoipa::path(post, path = "/v1/turns", tag = "turns",
    request_body(content = api_doc::AgentExecuteRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "Accepted: the job is confirmed by the broker", body = api_doc::InvokeResult<api_doc::TurnStatusView>),
        (status = 400, description = "Invalid: every violation; nothing enqueued", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 404, description = "Continuation for a turn that does not exist", body = Failure),
        (status = 409, description = "Same ids, different payload; or the turn is not awaiting client tools", body = Failure),
        (status = 413, description = "Body over the limit", body = Failure),
        (status = 503, description = "Queue or store unavailable; nothing accepted", body = Failure),
    ))]
async fn post_turn(State(state): State<HttpState>, request: Request) -> Response {
    let Some(tenant) = tenant(&state, request.headers()) else {
        return unauthorized();
    };
    let trace = trace_of(request.headers());
    let body = match read_body(request, state.limits.max_body_bytes).await {
        Ok(b) => b,
        Err(too_large) => return too_large,
    };
    let parsed = match parse_request(&body, &state.limits) {
        Ok(p) => p,
        Err(rejected) => {
            let status = if rejected.is_body_too_large() {
                StatusCode::PAYLOAD_TOO_LARGE
            } else {
                StatusCode::BAD_REQUEST
            };
            return answer::<()>(status, rejected.into_invoke_result());
        }
    };
    let submitted = match state.door.authorize(&tenant, &parsed.request).await {
        Ok(()) => state.door.submit_traced(&parsed.request, &trace).await,
        Err(e) => Err(e),
    };
    match submitted {
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
            Self::Unavailable(m) => unavailable(m),
            refused => {
                let status = StatusCode::from_u16(refused.http_status())
                    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                answer::<()>(status, refused.into_invoke_result())
            }
        }
    }
}

/// The caller's W3C trace context, or a new trace; its id is logged with the request.
/// When spans are exported the job carries the request span's own id, so the worker's span
/// hangs below it.
fn trace_of(headers: &HeaderMap) -> TraceContext {
    let trace = TraceContext::from_header(
        headers
            .get(crate::trace::TRACEPARENT)
            .and_then(|v| v.to_str().ok()),
    )
    .within(&tracing::Span::current());
    tracing::Span::current().record("trace_id", trace.trace_id());
    trace
}

/// Reads a body of at most `limit` bytes; a longer one is a `413` with `PAYLOAD_TOO_LARGE`.
async fn read_body(request: Request, limit: usize) -> Result<Bytes, Response> {
    axum::body::to_bytes(request.into_body(), limit)
        .await
        .map_err(|_| {
            failure(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::PayloadTooLarge,
                format!("$: the request body is larger than the limit of {limit} bytes"),
            )
        })
}

fn not_found_turn(sid: &SessionId, tid: &TurnId) -> Response {
    failure(
        StatusCode::NOT_FOUND,
        ErrorCode::TurnNotFound,
        format!("turn {tid} does not exist in session {sid}"),
    )
}

/// Parses path ids; a malformed id cannot exist, so it is a 404 like any absent one.
fn ids(session: &str, turn: Option<&str>) -> Option<(SessionId, Option<TurnId>)> {
    let sid = SessionId::parse(session).ok()?;
    match turn {
        None => Some((sid, None)),
        Some(t) => Some((sid, Some(TurnId::parse(t).ok()?))),
    }
}

/// A path parameter that could not be read (not UTF-8 once percent-decoded) is a 400 with an
/// `InvokeResult`, never the framework's plain-text answer.
struct ApiPath<T>(T);

impl<T, S> axum::extract::FromRequestParts<S> for ApiPath<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(Self(value)),
            Err(rejection) => Err(failure(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidParameter,
                format!("path: {}", rejection.body_text()),
            )),
        }
    }
}

/// The query string's parameters, in order; one that cannot be read is a 400 `InvokeResult`.
struct QueryParams(Vec<(String, String)>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for QueryParams {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        let raw = parts.uri.query().unwrap_or_default();
        serde_urlencoded::from_str(raw).map(Self).map_err(|e| {
            failure(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidParameter,
                format!("query: the query string cannot be read ({e})"),
            )
        })
    }
}

/// A query parameter that cannot be read; the message names it.
struct BadParameter(String);

impl From<BadParameter> for Response {
    fn from(BadParameter(message): BadParameter) -> Self {
        failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidParameter,
            message,
        )
    }
}

impl QueryParams {
    /// The one value of `name`, if given; given twice is an error.
    fn single(&self, name: &str) -> Result<Option<&str>, BadParameter> {
        let mut values = self.0.iter().filter(|(k, _)| k == name).map(|(_, v)| v);
        let first = values.next();
        if values.next().is_some() {
            return Err(BadParameter(format!("{name}: given more than once")));
        }
        Ok(first.map(String::as_str))
    }

    /// `?wait=<seconds>`: a number from 0 up; longer than [`MAX_WAIT`] is cut to it.
    fn wait(&self) -> Result<Duration, BadParameter> {
        let Some(raw) = self.single("wait")? else {
            return Ok(Duration::ZERO);
        };
        match raw.trim().parse::<f64>() {
            Ok(secs) if secs.is_finite() && secs >= 0.0 => {
                Ok(Duration::from_secs_f64(secs.min(MAX_WAIT.as_secs_f64())))
            }
            _ => Err(BadParameter(format!(
                "wait: must be a number of seconds from 0 (at most {} are waited), not {raw:?}",
                MAX_WAIT.as_secs()
            ))),
        }
    }
}

/// A turn's status; `?wait=<seconds>` long-polls until it leaves queued/running.
#[utoipa::path(get, path = "/v1/sessions/{sessionId}/turns/{turnId}", tag = "turns",
    params(
        ("sessionId" = String, Path, description = "The session"),
        ("turnId" = String, Path, description = "The turn"),
        ("wait" = Option<f64>, Query, minimum = 0, description = "Seconds to wait for the turn to leave queued/running (longer waits are cut to 60)"),
    ),
    responses(
        (status = 200, description = "The turn's status", body = api_doc::InvokeResult<api_doc::TurnStatusView>),
        (status = 400, description = "A parameter cannot be read (INVALID_PARAMETER, naming it)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 404, description = "No such turn in this session (or another tenant's)", body = Failure),
        (status = 503, description = "Store unavailable", body = Failure),
    ))]
async fn get_turn(
    State(state): State<HttpState>,
    headers: HeaderMap,
    ApiPath((session_id, turn_id)): ApiPath<(String, String)>,
    query: QueryParams,
) -> Response {
    let Some(tenant) = tenant(&state, &headers) else {
        return unauthorized();
    };
    let wait = match query.wait() {
        Ok(w) => w,
        Err(bad) => return bad.into(),
    };
    let Some((sid, Some(tid))) = ids(&session_id, Some(&turn_id)) else {
        return failure(
            StatusCode::NOT_FOUND,
            ErrorCode::TurnNotFound,
            format!("turn {turn_id:?} does not exist in session {session_id:?}"),
        );
    };
    match state.store.owner(&sid).await {
        Err(e) => return unavailable(e),
        Ok(Some(o)) if o == tenant => {}
        Ok(_) => return not_found_turn(&sid, &tid),
    }
    // Subscribe before the first read, so a result published in between is not missed. The
    // store stays the source of truth: it is read before waiting and after each wake-up.
    let mut events = if wait.is_zero() {
        None
    } else {
        match state.broker.subscribe_events(&sid).await {
            Ok(events) => Some(events),
            Err(e) => {
                tracing::warn!(error = %e, "cannot subscribe to the session's results; the long-poll reads the store instead");
                None
            }
        }
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut pause = Duration::from_millis(50);
    loop {
        let record = match state.store.get_turn(&sid, &tid).await {
            Err(e) => return unavailable(e),
            Ok(None) => return not_found_turn(&sid, &tid),
            Ok(Some(r)) => r,
        };
        if settled(record.status) || tokio::time::Instant::now() >= deadline {
            return answer(
                StatusCode::OK,
                InvokeResult::success(TurnStatusView::from(&record)),
            );
        }
        match events.as_mut() {
            Some(subscription) => {
                if !settled_event(subscription, &tid, deadline).await {
                    // The subscription ended (the broker connection was lost): read the
                    // store until the deadline instead.
                    events = None;
                }
            }
            None => {
                // One store read a second at most, however long the client waits.
                tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + pause)).await;
                pause = (pause * 3 / 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Whether a turn has left `queued`/`running` (its long-poll is over).
fn settled(status: TurnStatus) -> bool {
    !matches!(status, TurnStatus::Queued | TurnStatus::Running)
}

/// Waits until a settled status of `turn` is published or `deadline` passes; `false` when the
/// subscription ended first.
async fn settled_event(
    events: &mut crate::queue::Replies,
    turn: &TurnId,
    deadline: tokio::time::Instant,
) -> bool {
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Err(_elapsed) => return true,
            Ok(None) => return false,
            Ok(Some(body)) => {
                let Ok(view) = serde_json::from_slice::<TurnStatusView>(&body) else {
                    continue;
                };
                if &view.turn_id == turn && settled(view.status) {
                    return true;
                }
            }
        }
    }
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct SessionView {
    session_id: SessionId,
    mode_key: String,
    mode_display_name: String,
    mode_history: Vec<ModeChange>,
    turns: Vec<TurnSummary>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct TurnSummary {
    turn_id: TurnId,
    status: TurnStatus,
}

/// A session: its mode (keys, not ids), mode history and turns.
#[utoipa::path(get, path = "/v1/sessions/{sessionId}", tag = "sessions",
    params(("sessionId" = String, Path, description = "The session")),
    responses(
        (status = 400, description = "A path parameter cannot be read (INVALID_PARAMETER)", body = Failure),
        (status = 200, description = "The session", body = api_doc::InvokeResult<SessionView>),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 404, description = "No such session (or another tenant's)", body = Failure),
        (status = 503, description = "Store unavailable", body = Failure),
    ))]
async fn get_session(
    State(state): State<HttpState>,
    headers: HeaderMap,
    ApiPath(session_id): ApiPath<String>,
) -> Response {
    let Some(tenant) = tenant(&state, &headers) else {
        return unauthorized();
    };
    let missing = || {
        failure(
            StatusCode::NOT_FOUND,
            ErrorCode::SessionNotFound,
            format!("session {session_id:?} does not exist"),
        )
    };
    let Some((sid, _)) = ids(&session_id, None) else {
        return missing();
    };
    match state.store.owner(&sid).await {
        Err(e) => return unavailable(e),
        Ok(Some(o)) if o == tenant => {}
        Ok(_) => return missing(),
    }
    let (session, turn_ids) = match (
        state.store.get_session(&sid).await,
        state.store.list_turns(&sid).await,
    ) {
        (Ok(s), Ok(t)) => (s, t),
        (Err(e), _) | (_, Err(e)) => return unavailable(e),
    };
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
        turns,
    };
    answer(StatusCode::OK, InvokeResult::success(view))
}

/// Server-Sent Events: one `event: turn` per result of the session as it is published, `id:` the
/// turn id, `data:` the turn status JSON. Every subscriber gets every event.
#[utoipa::path(get, path = "/v1/sessions/{sessionId}/events", tag = "sessions",
    params(("sessionId" = String, Path, description = "The session (may not exist yet)")),
    responses(
        (status = 400, description = "A path parameter cannot be read (INVALID_PARAMETER)", body = Failure),
        (status = 200, description = "An event stream; each event's data is a TurnStatusView", content_type = "text/event-stream", body = api_doc::TurnStatusView),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 404, description = "Another tenant's session", body = Failure),
        (status = 503, description = "Broker unavailable", body = Failure),
    ))]
async fn session_events(
    State(state): State<HttpState>,
    headers: HeaderMap,
    ApiPath(session_id): ApiPath<String>,
) -> Response {
    let Some(tenant) = tenant(&state, &headers) else {
        return unauthorized();
    };
    let Some((sid, _)) = ids(&session_id, None) else {
        return failure(
            StatusCode::NOT_FOUND,
            ErrorCode::SessionNotFound,
            format!("session {session_id:?} does not exist"),
        );
    };
    // Subscribing before the first turn is allowed, and makes the subscriber the owner.
    match state.store.claim_owner(&sid, &tenant).await {
        Err(e) => return unavailable(e),
        Ok(owner) if owner != tenant => {
            return failure(
                StatusCode::NOT_FOUND,
                ErrorCode::SessionNotFound,
                format!("session {session_id:?} does not exist"),
            );
        }
        Ok(_) => {}
    }
    let events = match state.broker.subscribe_events(&sid).await {
        Ok(e) => e,
        Err(e) => return unavailable(e),
    };
    let stream = futures_util::stream::unfold(events, |mut events| async move {
        let body = events.recv().await?;
        let text = String::from_utf8_lossy(&body).into_owned();
        let id = serde_json::from_slice::<crate::store::TurnStatusView>(&body)
            .map(|v| v.turn_id.to_string())
            .unwrap_or_default();
        let event = axum::response::sse::Event::default()
            .event("turn")
            .id(id)
            .data(text);
        Some((Ok::<_, std::convert::Infallible>(event), events))
    });
    axum::response::sse::Sse::new(stream)
        .keep_alive(axum::response::sse::KeepAlive::default())
        .into_response()
}

/// The longest the synchronous endpoint waits for a result.
const SYNC_WAIT: Duration = Duration::from_secs(600);

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
async fn execute_sync(State(state): State<HttpState>, request: Request) -> Response {
    let Some(tenant) = tenant(&state, request.headers()) else {
        return unauthorized();
    };
    let trace = trace_of(request.headers());
    let body = match read_body(request, state.limits.max_body_bytes).await {
        Ok(b) => b,
        Err(too_large) => return too_large,
    };
    let parsed = match parse_request(&body, &state.limits) {
        Ok(p) => p,
        Err(rejected) if rejected.is_body_too_large() => {
            return answer::<()>(StatusCode::PAYLOAD_TOO_LARGE, rejected.into_invoke_result());
        }
        Err(rejected) => return answer::<()>(StatusCode::OK, rejected.into_invoke_result()),
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

async fn run_sync(
    state: &HttpState,
    tenant: &str,
    request: &AgentExecuteRequest,
    trace: &TraceContext,
) -> InvokeResult<crate::contract::AgentExecuteResponse> {
    let (sid, tid) = (request.session_id(), request.turn_id());
    let fail = |code, message: String| InvokeResult::failure(ErrorMessage::new(code, message));
    if let Err(refused) = state.door.authorize(tenant, request).await {
        return refused.into_invoke_result();
    }
    // Subscribe before enqueueing so the result cannot slip past.
    let mut events = match state.broker.subscribe_events(sid).await {
        Ok(e) => e,
        Err(e) => return fail(ErrorCode::ServiceUnavailable, e.to_string()),
    };
    let accepted = match state.door.submit_traced(request, trace).await {
        Ok(view) => view,
        Err(refused) => return refused.into_invoke_result(),
    };
    let settled = |s: TurnStatus| {
        matches!(
            s,
            TurnStatus::Completed | TurnStatus::Failed | TurnStatus::AwaitingClientTools
        )
    };
    // A request for a turn that already ran gets its stored result at once.
    if settled(accepted.status)
        && matches!(request, AgentExecuteRequest::UserTurn(_))
        && let Some(r) = accepted.result
    {
        return r;
    }
    let deadline = tokio::time::Instant::now() + SYNC_WAIT;
    loop {
        let next = tokio::time::timeout_at(deadline, events.recv()).await;
        let Ok(Some(body)) = next else {
            return fail(
                ErrorCode::ServiceUnavailable,
                format!(
                    "turn {tid} did not finish in time; poll GET /v1/sessions/{sid}/turns/{tid}"
                ),
            );
        };
        let Ok(view) = serde_json::from_slice::<crate::store::TurnStatusView>(&body) else {
            continue;
        };
        if &view.turn_id == tid
            && settled(view.status)
            && let Some(result) = view.result
        {
            return result;
        }
    }
}

/// Liveness: the process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", security(()),
    responses((status = 200, description = "Alive", body = api_doc::InvokeResult<api_doc::Health>)))]
async fn healthz() -> Response {
    answer(
        StatusCode::OK,
        InvokeResult::success(serde_json::json!({"status": "alive"})),
    )
}

/// Readiness: RabbitMQ and Redis are reachable.
#[utoipa::path(get, path = "/readyz", tag = "operations", security(()),
    responses(
        (status = 200, description = "Ready", body = api_doc::InvokeResult<api_doc::Health>),
        (status = 503, description = "A dependency is unreachable (each one named)", body = Failure),
    ))]
async fn readyz(State(state): State<HttpState>) -> Response {
    // Both probes at once, each bounded, so the answer comes within a second whatever hangs.
    let probe = SessionId::parse("readyz-probe").ok();
    let store = async {
        match probe {
            Some(probe) => bounded_probe(state.store.get_session(&probe)).await,
            None => Ok(()),
        }
    };
    let broker = bounded_probe(state.broker.check());
    let (store, broker) = tokio::join!(store, broker);
    let errors: Vec<ErrorMessage> = [("session store", store), ("message broker", broker)]
        .into_iter()
        .filter_map(|(what, probe)| {
            probe
                .err()
                .map(|e| ErrorMessage::new(ErrorCode::ServiceUnavailable, format!("{what}: {e}")))
        })
        .collect();
    match InvokeResult::<()>::failures(errors) {
        Some(failed) => answer(StatusCode::SERVICE_UNAVAILABLE, failed),
        None => answer(
            StatusCode::OK,
            InvokeResult::success(serde_json::json!({"status": "ready"})),
        ),
    }
}

/// How long a readiness probe may take before the dependency counts as stuck.
const READY_PROBE: Duration = Duration::from_millis(800);

/// A readiness probe with its error as text, or "did not answer" past [`READY_PROBE`].
async fn bounded_probe<T, E: std::fmt::Display>(
    probe: impl std::future::Future<Output = Result<T, E>>,
) -> Result<(), String> {
    match tokio::time::timeout(READY_PROBE, probe).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "did not answer within {} ms (stalled?)",
            READY_PROBE.as_millis()
        )),
    }
}

/// Submit a batch: NDJSON, one `{"customId", "request"}` per line, each validated on its own.
#[utoipa::path(post, path = "/v1/batches", tag = "batches",
    request_body(content = api_doc::BatchLine, content_type = "application/x-ndjson",
        description = "One BatchLine per line; a request may leave out sessionId/turnId"),
    responses(
        (status = 202, description = "Good lines enqueued; bad lines listed by line number and customId", body = api_doc::InvokeResult<BatchAccepted>),
        (status = 400, description = "No lines, or not UTF-8", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 413, description = "More bytes or lines than the limits allow", body = Failure),
        (status = 503, description = "Store unavailable", body = Failure),
    ))]
async fn post_batch(State(state): State<HttpState>, request: Request) -> Response {
    let Some(tenant) = tenant(&state, request.headers()) else {
        return unauthorized();
    };
    let body = match read_body(request, state.batch_limits.max_bytes).await {
        Ok(b) => b,
        Err(too_large) => return too_large,
    };
    use super::batch::BatchError;
    match state
        .door
        .submit_batch(&tenant, &body, state.batch_limits)
        .await
    {
        Ok(accepted) => answer(StatusCode::ACCEPTED, InvokeResult::success(accepted)),
        Err(BatchError::TooLarge(m)) => failure(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::PayloadTooLarge,
            format!("$: {m}"),
        ),
        Err(BatchError::Invalid(m)) => failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::MalformedJson,
            format!("$: {m}"),
        ),
        Err(BatchError::Store(e)) => unavailable(e),
    }
}

/// Looks up the caller's batch, or answers 401/404/503.
async fn caller_batch(
    state: &HttpState,
    headers: &HeaderMap,
    batch_id: &str,
) -> Result<crate::store::BatchRecord, Response> {
    let Some(tenant) = tenant(state, headers) else {
        return Err(unauthorized());
    };
    let missing = || {
        failure(
            StatusCode::NOT_FOUND,
            ErrorCode::BatchNotFound,
            format!("batch {batch_id:?} does not exist"),
        )
    };
    if crate::contract::ids::check_id(batch_id).is_err() {
        return Err(missing());
    }
    match state.door.batch(&tenant, batch_id).await {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(missing()),
        Err(e) => Err(unavailable(e)),
    }
}

/// A batch's progress: its turns counted by status.
#[utoipa::path(get, path = "/v1/batches/{batchId}", tag = "batches",
    params(("batchId" = String, Path, description = "The batch")),
    responses(
        (status = 400, description = "A path parameter cannot be read (INVALID_PARAMETER)", body = Failure),
        (status = 200, description = "Counts by status", body = api_doc::InvokeResult<BatchProgress>),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 404, description = "No such batch (or another tenant's)", body = Failure),
        (status = 503, description = "Store unavailable", body = Failure),
    ))]
async fn get_batch(
    State(state): State<HttpState>,
    headers: HeaderMap,
    ApiPath(batch_id): ApiPath<String>,
) -> Response {
    let batch = match caller_batch(&state, &headers, &batch_id).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    match state.door.batch_progress(&batch).await {
        Ok(p) => answer(StatusCode::OK, InvokeResult::success(p)),
        Err(e) => unavailable(e),
    }
}

/// A batch's results: NDJSON, one line per submitted line (accepted lines in order, then
/// rejected ones); `result` is present once the turn settled.
#[utoipa::path(get, path = "/v1/batches/{batchId}/results", tag = "batches",
    params(("batchId" = String, Path, description = "The batch")),
    responses(
        (status = 400, description = "A path parameter cannot be read (INVALID_PARAMETER)", body = Failure),
        (status = 200, description = "One BatchResultLine per line", content_type = "application/x-ndjson", body = BatchResultLine),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 404, description = "No such batch (or another tenant's)", body = Failure),
    ))]
async fn get_batch_results(
    State(state): State<HttpState>,
    headers: HeaderMap,
    ApiPath(batch_id): ApiPath<String>,
) -> Response {
    use futures_util::StreamExt as _;
    let batch = match caller_batch(&state, &headers, &batch_id).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let lines = state.door.batch_results(batch).map(|chunk| {
        let chunk = chunk.map_err(|e| {
            // Headers are sent already: end the stream early; the client sees a short body.
            tracing::warn!(error = %e, "batch results cut short");
            std::io::Error::other(e.to_string())
        })?;
        let mut out = Vec::new();
        for line in chunk {
            if serde_json::to_writer(&mut out, &line).is_ok() {
                out.push(b'\n');
            }
        }
        Ok::<_, std::io::Error>(Bytes::from(out))
    });
    (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(lines),
    )
        .into_response()
}

/// A file to index.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IndexFile {
    /// Path relative to the repository root (`/`-separated, no `..`).
    pub path: String,
    /// The file's text.
    pub contents: String,
}

/// `POST /v1/index`: files to (re)index for the caller's tenant.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IndexRequest {
    /// The repository the files belong to (chunk metadata `repo`).
    pub repo: String,
    /// Tags added to every chunk of these files.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Files to index; unchanged ones are skipped.
    #[serde(default)]
    pub files: Vec<IndexFile>,
    /// The repository's complete file listing: indexed files not in it are removed.
    #[serde(default)]
    pub keep: Option<Vec<String>>,
}

impl IndexRequest {
    /// Reads and checks a body: JSON of this shape, `repo` an id, every path relative. The
    /// errors are what a 400 answer lists.
    pub fn parse(body: &[u8]) -> Result<Self, Vec<ErrorMessage>> {
        let req: Self = serde_json::from_slice(body).map_err(|e| {
            vec![ErrorMessage::new(
                ErrorCode::MalformedJson,
                format!("$: not an index request ({e})"),
            )]
        })?;
        let mut errors = Vec::new();
        if let Err(e) = crate::contract::ids::check_id(&req.repo) {
            errors.push(ErrorMessage::new(
                ErrorCode::InvalidId,
                format!("repo: {e}"),
            ));
        }
        let listed = req.files.iter().map(|f| f.path.as_str());
        let kept = req.keep.iter().flatten().map(String::as_str);
        for (i, path) in listed.chain(kept).enumerate() {
            if let Err(why) = crate::contract::request::RelativePath::parse(path) {
                errors.push(ErrorMessage::new(
                    ErrorCode::InvalidPath,
                    format!("path #{}: {path:?} {why}", i + 1),
                ));
            }
        }
        if errors.is_empty() {
            Ok(req)
        } else {
            Err(errors)
        }
    }
}

/// Index files for retrieval: Markdown is chunked by heading, code by a bounded number of lines;
/// a changed file's chunks are replaced; with `keep`, files not listed are removed.
#[utoipa::path(post, path = "/v1/index", tag = "retrieval",
    request_body(content = IndexRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "What was indexed, left alone, removed and skipped", body = api_doc::InvokeResult<IndexReport>),
        (status = 400, description = "Malformed body, bad repo name or path", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 413, description = "Body over APTIX_MAX_BATCH_BYTES", body = Failure),
        (status = 503, description = "Index unavailable", body = Failure),
    ))]
async fn post_index(State(state): State<HttpState>, request: Request) -> Response {
    let Some(tenant) = tenant(&state, request.headers()) else {
        return unauthorized();
    };
    let body = match read_body(request, state.batch_limits.max_bytes).await {
        Ok(b) => b,
        Err(too_large) => return too_large,
    };
    let req = match IndexRequest::parse(&body) {
        Ok(r) => r,
        Err(errors) => match InvokeResult::<()>::failures(errors) {
            Some(failed) => return answer(StatusCode::BAD_REQUEST, failed),
            None => {
                return failure(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::MalformedJson,
                    "$: not an index request",
                );
            }
        },
    };
    let files: Vec<(String, String)> = req
        .files
        .into_iter()
        .map(|f| (f.path, f.contents))
        .collect();
    let index = state.index.as_ref();
    let result = crate::rag::index_files(
        index,
        &tenant,
        &req.repo,
        &files,
        &req.tags,
        false,
        state.chunk_options,
        |_, _| {},
    )
    .await;
    let mut report = match result {
        Ok(r) => r,
        Err(e) => return unavailable(e),
    };
    if let Some(keep) = req.keep {
        let keep: std::collections::HashSet<String> = keep.into_iter().collect();
        let known = match index.files(&tenant, &req.repo).await {
            Ok(k) => k,
            Err(e) => return unavailable(e),
        };
        for path in known.keys().filter(|p| !keep.contains(*p)) {
            if let Err(e) = index.remove_file(&tenant, &req.repo, path).await {
                return unavailable(e);
            }
            report.removed += 1;
        }
    }
    tracing::info!(%tenant, repo = %report.repo, indexed = report.indexed, unchanged = report.unchanged, removed = report.removed, chunks = report.chunks, "index updated");
    answer(StatusCode::OK, InvokeResult::success(report))
}

/// Prometheus metrics (text exposition format).
#[utoipa::path(get, path = "/metrics", tag = "operations", security(()),
    responses((status = 200, description = "Metrics", content_type = "text/plain; version=0.0.4", body = String)))]
async fn metrics(State(state): State<HttpState>) -> Response {
    state.metrics.sync_fenced(state.store.fenced_rejections());
    (
        StatusCode::OK,
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", body = Object)))]
async fn openapi_json(axum::Extension(OpenApiJson(api)): axum::Extension<OpenApiJson>) -> Response {
    (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        api.as_str().to_owned(),
    )
        .into_response()
}

/// How long a client may take to send a request's headers, and how long an idle keep-alive
/// connection waits for the next request, before the connection is closed. Bodies and answers
/// are not bounded by it: a long-poll, an SSE stream or the synchronous endpoint may take as
/// long as the route allows.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a stopping server waits for open connections (an SSE stream never ends by itself).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown` fires, closing connections that do not send
/// their headers within [`HEADER_READ_TIMEOUT`] (slow or idle clients).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    serve_with(listener, router, shutdown, HEADER_READ_TIMEOUT).await
}

/// [`serve`] with another header-read timeout.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: tokio_util::sync::CancellationToken,
    header_read_timeout: Duration,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (stream, _peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment, keep serving.
                    tracing::warn!(error = %e, "could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection closed with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown grace period; closing them");
    }
    Ok(())
}

/// Refuses to expose an unauthenticated API beyond this machine.
pub fn check_exposure(addr: &std::net::SocketAddr, tokens: &ApiTokens) -> Result<(), String> {
    if tokens.is_empty() && !addr.ip().is_loopback() {
        return Err(format!(
            "refusing to listen on {addr} without APTIX_API_TOKENS: anyone who can reach it could run turns; set tokens or listen on 127.0.0.1"
        ));
    }
    Ok(())
}
