//! What the HTTP handlers share: the state, the extractors that every route reads the same way
//! (the caller's tenant, a body within its limit, path ids and query parameters that answer an
//! `InvokeResult` when they cannot be read, the trace context) and the shapes of the answers.
//!
//! Owns: reading a request and writing an answer. Must not: route, or decide anything about
//! turns.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::FrontDoor;
pub(crate) use super::body::{BatchSized, IndexSized, LimitedBody, RequestSized};
use crate::catalog::ModeCatalog;
use crate::config::{BatchLimits, LOCAL_TENANT};
use crate::contract::{ErrorCode, ErrorMessage, InvokeResult, RequestLimits, SessionId, TurnId};
use crate::metrics::Metrics;
use crate::queue::Broker;
use crate::rag::{ChunkIndex, ChunkOptions};
use crate::store::RecordWriter;
use crate::tokens::ApiTokens;
use crate::trace::TraceContext;

/// What the handlers share: one pointer, so the copy every extractor of every request takes
/// costs one reference count, whatever the parts hold (a deployment's tokens, its limits).
#[derive(Clone)]
pub struct HttpState(Arc<HttpParts>);

impl HttpState {
    /// The handlers' state over `parts`.
    pub fn new(parts: HttpParts) -> Self {
        Self(Arc::new(parts))
    }
}

impl std::ops::Deref for HttpState {
    type Target = HttpParts;

    fn deref(&self) -> &HttpParts {
        &self.0
    }
}

/// What the handlers share ([`HttpState`]).
pub struct HttpParts {
    /// Accepts requests.
    pub door: FrontDoor,
    /// Reads turn and session state, and writes what is not a turn's state (heartbeats let go,
    /// the console's reads): no handler can write a turn.
    pub store: Arc<dyn RecordWriter>,
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
    /// Serve the console (`/console`, `APTIX_CONSOLE`).
    pub console: bool,
    /// How long a body may stop arriving before the request is answered `408` and its
    /// connection closed (`APTIX_HTTP_READ_TIMEOUT_SECS`).
    pub read_timeout: Duration,
    /// The MCP tool sources of this process, when it has any (`/readyz` reports them).
    pub mcp: Option<crate::mcp::McpTools>,
}

impl HttpState {
    /// Every tenant the deployment knows of (its tokens' and its tenants file's), sorted;
    /// `local` when no tokens are configured.
    pub(crate) fn known_tenants(&self) -> Vec<String> {
        let mut out: std::collections::BTreeSet<String> = self
            .door
            .quotas()
            .tenants()
            .iter()
            .map(|(t, _)| t.to_string())
            .collect();
        if self.tokens.is_empty() {
            out.insert(LOCAL_TENANT.to_string());
        }
        out.extend(self.tokens.tenants().into_iter().map(str::to_string));
        out.into_iter().collect()
    }
}

/// The longest long-poll wait accepted.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// The served OpenAPI document, serialized once.
#[derive(Clone)]
pub(crate) struct OpenApiJson(pub(crate) Arc<String>);

pub(crate) fn answer<T: Serialize>(status: StatusCode, result: InvokeResult<T>) -> Response {
    (status, Json(result)).into_response()
}

pub(crate) fn failure(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Response {
    answer::<()>(
        status,
        InvokeResult::failure(ErrorMessage::new(code, message)),
    )
}

/// Whom the call stands for, if it is authenticated. Without configured tokens every caller
/// is the `local` tenant and an admin (one person's machine).
fn caller(state: &HttpState, headers: &HeaderMap) -> Option<crate::tokens::Caller> {
    if state.tokens.is_empty() {
        return Some(crate::tokens::Caller {
            tenant: LOCAL_TENANT.to_string(),
            admin: true,
        });
    }
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    token.and_then(|t| state.tokens.caller(t)).cloned()
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
        caller(state, &parts.headers)
            .map(|c| Tenant(c.tenant))
            .ok_or_else(unauthorized)
    }
}

/// Whom the call stands for — its tenant and whether it is an admin's — for the routes an
/// admin may use on every tenant's work (reading a session, a turn or a batch, cancelling),
/// and whose sessions its ids name: the caller's tenant's, or for an admin the tenant named
/// with `?tenant=`. `401` as [`Tenant`]; `403 FORBIDDEN` for a tenant's token naming another
/// tenant.
pub(crate) struct Reader(pub(crate) crate::tokens::Caller, String);

impl Reader {
    /// Whether the caller may read (or cancel) work of `owner`.
    pub(crate) fn may_see(&self, owner: &str) -> bool {
        self.0.admin || self.0.tenant == owner
    }

    /// A path's session id as the session it names for this call (within the reader's
    /// scope); `400 INVALID_ID` when it is not an id, as for a body's.
    pub(crate) fn session(&self, raw: &str) -> Result<SessionId, InvalidPathId> {
        SessionId::parse(raw)
            .map(|sid| sid.within(&self.1))
            .map_err(|error| InvalidPathId {
                param: "sessionId",
                error,
            })
    }

    /// A path's session and turn ids ([`Reader::session`]).
    pub(crate) fn turn(
        &self,
        session: &str,
        turn: &str,
    ) -> Result<(SessionId, TurnId), InvalidPathId> {
        let sid = self.session(session)?;
        let tid = TurnId::parse(turn).map_err(|error| InvalidPathId {
            param: "turnId",
            error,
        })?;
        Ok((sid, tid))
    }
}

/// A path parameter that is not an id: answered `400 INVALID_ID` with the rule it breaks, not
/// its text (which may be long, or hold bytes a log should not).
#[derive(Debug)]
pub(crate) struct InvalidPathId {
    param: &'static str,
    error: crate::contract::ids::IdError,
}

impl IntoResponse for InvalidPathId {
    fn into_response(self) -> Response {
        failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidId,
            format!("{}: {}", self.param, self.error),
        )
    }
}

/// The `tenant` query parameter of the routes that read sessions, turns and batches.
#[derive(serde::Deserialize)]
struct ScopeQuery {
    tenant: Option<String>,
}

impl axum::extract::FromRequestParts<HttpState> for Reader {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &HttpState,
    ) -> Result<Self, Response> {
        let caller = caller(state, &parts.headers).ok_or_else(unauthorized)?;
        let asked = parts
            .uri
            .query()
            .and_then(|q| serde_urlencoded::from_str::<ScopeQuery>(q).ok())
            .and_then(|q| q.tenant);
        if let Some(t) = &asked
            && let Err(e) = crate::contract::ids::check_tenant(t)
        {
            return Err(BadParameter(format!("tenant: {e}")).into());
        }
        let scope = match asked {
            None => caller.tenant.clone(),
            Some(t) if t == caller.tenant || caller.admin => t,
            Some(_) => {
                return Err(forbidden(
                    "tenant: only admin tokens may name another tenant's work",
                ));
            }
        };
        Ok(Reader(caller, scope))
    }
}

/// An admin's call (`/v1/admin/…`): `401` without a valid token, `403 FORBIDDEN` with a
/// tenant's token.
pub(crate) struct Admin;

impl axum::extract::FromRequestParts<HttpState> for Admin {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &HttpState,
    ) -> Result<Self, Response> {
        match caller(state, &parts.headers) {
            None => Err(unauthorized()),
            Some(c) if c.admin => Ok(Admin),
            Some(_) => Err(forbidden(
                "this route is for admin tokens (token=tenant:admin in APTIX_API_TOKENS)",
            )),
        }
    }
}

/// `403 FORBIDDEN`: a valid token asking for what only an admin's may.
pub(crate) fn forbidden(message: &str) -> Response {
    failure(StatusCode::FORBIDDEN, ErrorCode::Forbidden, message)
}

pub(crate) fn unauthorized() -> Response {
    failure(
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthorized,
        "a valid Authorization: Bearer <token> header is required",
    )
}

/// The `Retry-After` of a 503: the store or the broker it needs is down, and the process
/// reconnects on the next request, so a client may try again in about a second.
pub(crate) const RETRY_UNAVAILABLE_SECS: u64 = 1;

/// A 503 for a request that needed the store or the broker: logged with its cause, answered
/// with `Retry-After` and a message that claims nothing about what happened (a write may have
/// been partly made: an index upload, a batch whose record could not be updated).
pub(crate) fn unavailable(e: impl std::fmt::Display) -> Response {
    unavailable_saying(e, "the service is temporarily unavailable; try again")
}

/// A 503 for a submission refused before anything was stored or enqueued.
pub(crate) fn unavailable_unaccepted(e: impl std::fmt::Display) -> Response {
    unavailable_saying(
        e,
        "the service is temporarily unavailable; nothing was accepted, try again",
    )
}

fn unavailable_saying(e: impl std::fmt::Display, message: &str) -> Response {
    tracing::warn!(error = %e, "dependency unavailable");
    let mut response = failure(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::ServiceUnavailable,
        message,
    );
    response.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        RETRY_UNAVAILABLE_SECS.into(),
    );
    response
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

/// The request's place in its trace (see [`trace_of`]), as an extractor.
pub(crate) struct Traced(pub(crate) TraceContext);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Traced {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Self(trace_of(&parts.headers)))
    }
}

/// The answer to a request body the contract refuses: `413` when it is over the size limit,
/// else `invalid` (`400` on `/v1/turns`; `200` on the synchronous endpoint, which answers every
/// invalid request with a failed `InvokeResult`).
pub(crate) fn refused(rejected: crate::contract::RequestRejected, invalid: StatusCode) -> Response {
    let status = if rejected.is_body_too_large() {
        StatusCode::PAYLOAD_TOO_LARGE
    } else {
        invalid
    };
    answer::<()>(status, rejected.into_invoke_result())
}

/// A session that does not exist, or is another tenant's (the two look the same).
pub(crate) fn not_found_session(session: &str) -> Response {
    failure(
        StatusCode::NOT_FOUND,
        ErrorCode::SessionNotFound,
        format!("session {session:?} does not exist"),
    )
}

/// A turn that does not exist in the session (or the session is another tenant's).
pub(crate) fn not_found_turn(sid: &SessionId, tid: &TurnId) -> Response {
    failure(
        StatusCode::NOT_FOUND,
        ErrorCode::TurnNotFound,
        format!("turn {tid} does not exist in session {}", sid.client_id()),
    )
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

impl BadParameter {
    /// A refusal whose message names the parameter.
    pub(crate) fn new(message: String) -> Self {
        Self(message)
    }
}

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

    /// The one value of `name`, as given, if given.
    pub(crate) fn text(&self, name: &str) -> Result<Option<&str>, BadParameter> {
        self.single(name)
    }

    /// `?webhook=<url>`, if given (the URL is checked by whoever uses it).
    pub(crate) fn webhook(&self) -> Result<Option<String>, BadParameter> {
        Ok(self.single("webhook")?.map(str::to_string))
    }

    /// `?serviceTier=auto|default|flex|priority`, if given.
    pub(crate) fn service_tier(
        &self,
    ) -> Result<Option<crate::contexts::ServiceTier>, BadParameter> {
        let Some(raw) = self.single("serviceTier")? else {
            return Ok(None);
        };
        crate::contexts::ServiceTier::parse(raw.trim())
            .map(Some)
            .ok_or_else(|| {
                BadParameter(format!(
                    "serviceTier: must be auto, default, flex or priority, not {raw:?}"
                ))
            })
    }

    /// `?day=YYYY-MM-DD`: a UTC day, if given (its counts are kept eight days; an older or
    /// later day has none).
    pub(crate) fn day(&self) -> Result<Option<String>, BadParameter> {
        let Some(raw) = self.single("day")? else {
            return Ok(None);
        };
        let format = time::macros::format_description!("[year]-[month]-[day]");
        match time::Date::parse(raw.trim(), &format) {
            Ok(day) => Ok(Some(
                day.format(&format).unwrap_or_else(|_| raw.to_string()),
            )),
            Err(_) => Err(BadParameter(format!(
                "day: must be a UTC day written YYYY-MM-DD, not {raw:?}"
            ))),
        }
    }

    /// `?limit=<n>`: how many items a listing answers, 1 to `max` (`default` when absent).
    pub(crate) fn limit(&self, default: usize, max: usize) -> Result<usize, BadParameter> {
        let Some(raw) = self.single("limit")? else {
            return Ok(default);
        };
        match raw.trim().parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(BadParameter(format!(
                "limit: must be a whole number from 1 to {max}, not {raw:?}"
            ))),
        }
    }

    /// `?tenant=<name>`, if given.
    pub(crate) fn tenant(&self) -> Result<Option<String>, BadParameter> {
        Ok(self
            .single("tenant")?
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string))
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
