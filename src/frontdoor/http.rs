//! The HTTP API (axum): every answer an `InvokeResult` in the wire format of DESIGN.md §2.
//!
//! Owns: the router and the OpenAPI document (built from the same annotated handlers, so the
//! document covers every route), the layers every request passes (request id, access log,
//! catch-panic, timeouts), the extractors and answers the handlers share (tenant, size-limited
//! body, path ids, query parameters, trace context) and serving. The handlers themselves are in
//! [`super::routes`]: turns, sessions, the synchronous endpoint, batches, index, operations.
//! Must not: hold business logic — that is the front door's ([`super::FrontDoor`]).
//!
//! Auth: `Authorization: Bearer <token>`, tokens map to tenants; a session (or batch) belongs to
//! the tenant that created it, and another tenant's looks exactly like a missing one. `/healthz`,
//! `/readyz`, `/metrics` and `/openapi.json` need no token.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Request};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::FrontDoor;
use super::openapi::{self as api_doc, ExecuteResult, Failure};
use super::routes;
use crate::catalog::ModeCatalog;
use crate::config::{ApiTokens, BatchLimits};
use crate::contexts::KnownContexts;
use crate::contract::{ErrorCode, ErrorMessage, InvokeResult, RequestLimits, SessionId, TurnId};
use crate::frontdoor::routes::ops::healthz;
use crate::frontdoor::routes::ops::metrics;
use crate::frontdoor::routes::ops::readyz;
use crate::metrics::Metrics;
use crate::queue::Broker;
use crate::rag::{ChunkIndex, ChunkOptions};
use crate::store::SessionStore;
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
        .routes(routes!(routes::turns::post_turn))
        .routes(routes!(routes::turns::get_turn))
        .routes(routes!(routes::sessions::get_session))
        .routes(routes!(routes::sessions::session_events))
        .routes(routes!(routes::batches::post_batch))
        .routes(routes!(routes::batches::get_batch))
        .routes(routes!(routes::batches::get_batch_results))
        .routes(routes!(routes::index::post_index))
        .routes(routes!(routes::sync::execute_sync))
        .routes(routes!(routes::ops::healthz))
        .routes(routes!(routes::ops::readyz))
        .routes(routes!(routes::ops::metrics))
        .routes(routes!(routes::ops::openapi_json))
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
pub(crate) struct OpenApiJson(pub(crate) Arc<String>);

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

pub(crate) fn answer<T: Serialize>(status: StatusCode, result: InvokeResult<T>) -> Response {
    (status, Json(result)).into_response()
}

pub(crate) fn failure(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Response {
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

/// The caller's tenant: `Authorization: Bearer <token>` mapped through `APTIX_API_TOKENS`
/// (`local` when no tokens are configured). Without a valid token the request is answered 401
/// before anything else is read; as the last of a handler's header extractors it keeps that
/// order.
pub(crate) struct Tenant(pub(crate) String);

impl axum::extract::FromRequestParts<HttpState> for Tenant {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &HttpState,
    ) -> Result<Self, Response> {
        tenant(state, &parts.headers)
            .map(Tenant)
            .ok_or_else(unauthorized)
    }
}

/// Which limit a route's body is read within.
pub(crate) trait BodyLimit {
    /// The limit, in bytes.
    fn bytes(state: &HttpState) -> usize;
}

/// A single request: `APTIX_MAX_BODY_BYTES`.
pub(crate) struct RequestSized;

impl BodyLimit for RequestSized {
    fn bytes(state: &HttpState) -> usize {
        state.limits.max_body_bytes
    }
}

/// A batch or an index upload: `APTIX_MAX_BATCH_BYTES`.
pub(crate) struct BatchSized;

impl BodyLimit for BatchSized {
    fn bytes(state: &HttpState) -> usize {
        state.batch_limits.max_bytes
    }
}

/// The request body, read whole within the route's limit `L`; a longer one is answered 413
/// `PAYLOAD_TOO_LARGE` without being read further.
pub(crate) struct LimitedBody<L>(pub(crate) Bytes, pub(crate) std::marker::PhantomData<L>);

impl<L: BodyLimit> axum::extract::FromRequest<HttpState> for LimitedBody<L> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &HttpState) -> Result<Self, Response> {
        read_body(request, L::bytes(state))
            .await
            .map(|body| Self(body, std::marker::PhantomData))
    }
}

pub(crate) fn unauthorized() -> Response {
    failure(
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthorized,
        "a valid Authorization: Bearer <token> header is required",
    )
}

pub(crate) fn unavailable(e: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "dependency unavailable");
    failure(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::ServiceUnavailable,
        "the service is temporarily unavailable; nothing was accepted, try again",
    )
}

/// The caller's W3C trace context, or a new trace; its id is logged with the request.
/// When spans are exported the job carries the request span's own id, so the worker's span
/// hangs below it.
pub(crate) fn trace_of(headers: &HeaderMap) -> TraceContext {
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
pub(crate) async fn read_body(request: Request, limit: usize) -> Result<Bytes, Response> {
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

pub(crate) fn not_found_turn(sid: &SessionId, tid: &TurnId) -> Response {
    failure(
        StatusCode::NOT_FOUND,
        ErrorCode::TurnNotFound,
        format!("turn {tid} does not exist in session {sid}"),
    )
}

/// Parses path ids; a malformed id cannot exist, so it is a 404 like any absent one.
pub(crate) fn ids(session: &str, turn: Option<&str>) -> Option<(SessionId, Option<TurnId>)> {
    let sid = SessionId::parse(session).ok()?;
    match turn {
        None => Some((sid, None)),
        Some(t) => Some((sid, Some(TurnId::parse(t).ok()?))),
    }
}

/// A path parameter that could not be read (not UTF-8 once percent-decoded) is a 400 with an
/// `InvokeResult`, never the framework's plain-text answer.
pub(crate) struct ApiPath<T>(pub(crate) T);

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
pub(crate) struct QueryParams(Vec<(String, String)>);

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
pub(crate) struct BadParameter(String);

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
    pub(crate) fn wait(&self) -> Result<Duration, BadParameter> {
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
