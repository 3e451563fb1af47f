//! The HTTP API (axum): every answer an `InvokeResult` in the wire format of DESIGN.md §2.
//!
//! Owns: the router and the OpenAPI document (built from the same annotated handlers, so the
//! document covers every route), the layers every request passes (request id, access log,
//! catch-panic, timeouts), the extractors and answers the handlers share (tenant, size-limited
//! body, path ids, query parameters, trace context). Connections are served by `serve` (HTTP/1.1
//! on a codec of our own in `h1`, and HTTP/2 by prior knowledge, each with its deadlines). The handlers themselves are in
//! [`super::routes`]: turns, sessions, the synchronous endpoint, batches, index, operations.
//! Must not: hold business logic — that is the front door's ([`super::FrontDoor`]).
//!
//! Auth: `Authorization: Bearer <token>`, tokens map to tenants; a session (or batch) belongs to
//! the tenant that created it, and another tenant's looks exactly like a missing one. `/healthz`,
//! `/readyz`, `/metrics` and `/openapi.json` need no token.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;

use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use super::extract::{HttpParts, HttpState};
use super::extract::{OpenApiJson, failure};
use super::openapi::{self as api_doc, ExecuteResult, Failure};
use super::routes;
use super::routes::ops::{healthz, metrics, readyz};
pub use super::serve::{HEADER_READ_TIMEOUT, HTTP2_STREAMS, Reading, serve, serve_with};
use crate::contexts::KnownContexts;
use crate::contract::ErrorCode;
use crate::tokens::ApiTokens;
use crate::trace::TraceContext;

pub use crate::config::LOCAL_TENANT;

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "aptix-worker",
        description = "Queue-driven execution of LLM agent turns: submit turns and batches, poll or subscribe for results."
    ),
    components(schemas(api_doc::AgentExecuteRequest, api_doc::AgentExecuteResponse, api_doc::BatchLine, api_doc::BatchRequest, api_doc::StreamFinalLine, api_doc::StreamLine, api_doc::SessionDeltaEvent, api_doc::SessionProgressEvent, ExecuteResult, Failure, crate::contexts::ServiceTier)),
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
        .routes(routes!(routes::turns::post_turn, routes::runs::list_turns))
        .routes(routes!(routes::turns::get_turn))
        .routes(routes!(routes::turns::inspect_turn))
        .routes(routes!(routes::turns::cancel_turn))
        .routes(routes!(routes::sessions::get_session))
        .routes(routes!(routes::sessions::session_events))
        .routes(routes!(
            routes::batches::post_batch,
            routes::batches::list_batches
        ))
        .routes(routes!(routes::batches::get_batch))
        .routes(routes!(routes::batches::get_batch_results))
        .routes(routes!(routes::batches::cancel_batch))
        .routes(routes!(routes::batches::retry_batch))
        .routes(routes!(routes::index::post_index))
        .routes(routes!(routes::sync::execute_sync))
        .routes(routes!(routes::tenant::get_usage))
        .routes(routes!(routes::admin::system))
        .routes(routes!(routes::dead_letters::dead_letters))
        .routes(routes!(routes::dead_letters::requeue_dead))
        .routes(routes!(routes::dead_letters::discard_dead))
        .routes(routes!(routes::webhooks::dead_deliveries))
        .routes(routes!(routes::webhooks::replay_dead_deliveries))
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
    super::links::add_links(&mut doc);
    doc
}

/// The router with every route.
pub fn router(state: HttpState) -> Router {
    let (router, api) = parts();
    let counted_in = state.metrics.clone();
    let doc = document(api, state.door.contexts());
    let api = Arc::new(serde_json::to_string(&doc).unwrap_or_else(|_| "{}".to_string()));
    let router = match state.console {
        true => router.merge(super::console::routes()),
        false => router,
    };
    let router = router
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .with_state(state);
    // Bodies are read (and limited) by the handler, so an oversized body still gets an
    // `InvokeResult` with `PAYLOAD_TOO_LARGE`.
    let inner = tower::ServiceBuilder::new()
        .layer(DefaultBodyLimit::disable())
        .layer(axum::Extension(OpenApiJson(api)));
    layered(router, counted_in, inner)
}

/// The header that carries a request's id, in and out.
pub const REQUEST_ID: &str = "x-request-id";

/// What every router gets, outermost first: each answer counted in `metrics`
/// (`aptix_http_requests_total`, `aptix_http_request_duration_seconds`, by route template,
/// method and status); a request id (the client's `x-request-id`, else a fresh UUID) set on the
/// request and echoed on the answer; a span per request carrying the method, the route and the
/// id, closed by one access-log line with status and latency; and a panic in a handler turned
/// into a `500` `InvokeResult` with `INTERNAL` (counted as such).
pub fn with_http_layers(router: Router, metrics: Arc<crate::metrics::Metrics>) -> Router {
    layered(router, metrics, tower::layer::util::Identity::new())
}

/// [`with_http_layers`] with `inner` (layers of the router's own) innermost, all in one stack.
fn layered<L>(router: Router, metrics: Arc<crate::metrics::Metrics>, inner: L) -> Router
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<
            axum::extract::Request,
            Response = Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    <L::Service as tower::Service<axum::extract::Request>>::Future: Send + 'static,
{
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
            // An exported request span joins the caller's trace; see `extract::trace_of`.
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
            |response: &Response<_>, latency: Duration, _span: &tracing::Span| {
                tracing::info!(
                    status = response.status().as_u16(),
                    latency_ms = latency.as_secs_f64() * 1000.0,
                    "request"
                );
            },
        )
        .on_failure(());
    // One stack, put on the routes at once: each `Router::layer` call wraps every route in a
    // box of its own, cloned and called through for each request.
    router.layer(
        tower::ServiceBuilder::new()
            .layer(super::counted::CountedLayer(metrics))
            .layer(SetRequestIdLayer::new(header.clone(), MakeRequestUuid))
            .layer(PropagateRequestIdLayer::new(header))
            .layer(trace)
            .layer(tower_http::catch_panic::CatchPanicLayer::custom(panicked))
            .layer(inner),
    )
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
    let counted_in = state.metrics.clone();
    with_http_layers(
        Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .fallback(no_route)
            .method_not_allowed_fallback(wrong_method)
            .with_state(state),
        counted_in,
    )
}

/// An address the API must not listen on as configured.
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to listen on {0} without APTIX_API_TOKENS: anyone who can reach it could run turns; set tokens or listen on 127.0.0.1"
)]
pub struct Exposed(pub std::net::SocketAddr);

/// Refuses to expose an unauthenticated API beyond this machine.
pub fn check_exposure(addr: &std::net::SocketAddr, tokens: &ApiTokens) -> Result<(), Exposed> {
    if tokens.is_empty() && !addr.ip().is_loopback() {
        return Err(Exposed(*addr));
    }
    Ok(())
}
