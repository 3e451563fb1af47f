//! `/healthz`, `/readyz` (bounded probes of RabbitMQ and Redis), `/metrics` and
//! `/openapi.json`: the routes an operator uses, none behind a token.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::contract::{ErrorCode, ErrorMessage, InvokeResult, SessionId};
use crate::frontdoor::extract::{HttpState, OpenApiJson, answer};
use crate::frontdoor::openapi::{self as api_doc, Failure};

/// Liveness: the process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", security(()),
    responses((status = 200, description = "Alive", body = api_doc::InvokeResult<api_doc::Health>)))]
pub(crate) async fn healthz() -> Response {
    answer(
        StatusCode::OK,
        InvokeResult::success(serde_json::json!({"status": "alive"})),
    )
}

/// Readiness: RabbitMQ and Redis are reachable (MCP tool sources are reported beside, and a
/// down one is a warning).
#[utoipa::path(get, path = "/readyz", tag = "operations", security(()),
    responses(
        (status = 200, description = "Ready", body = api_doc::InvokeResult<api_doc::Health>),
        (status = 503, description = "A dependency is unreachable (each one named)", body = Failure),
    ))]
pub(crate) async fn readyz(State(state): State<HttpState>) -> Response {
    let (store, broker) = probe(&state).await;
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
        None => {
            // MCP tool sources are reported, not required: a worker whose tool server is down
            // still runs every turn that does not call it (and those that do fail retryably).
            let sources = state.mcp.as_ref().map(|m| m.status()).unwrap_or_default();
            let warnings = sources.iter().filter(|s| !s.up).map(|s| {
                ErrorMessage::new(
                    ErrorCode::ToolUnavailable,
                    format!(
                        "MCP tool source {}: {}",
                        s.name,
                        s.problem.as_deref().unwrap_or("down")
                    ),
                )
            });
            let warnings: Vec<ErrorMessage> = warnings.collect();
            let mut body = serde_json::json!({"status": "ready"});
            if !sources.is_empty() {
                body["toolSources"] = serde_json::json!(sources);
            }
            answer(
                StatusCode::OK,
                InvokeResult::success(body).with_warnings(warnings),
            )
        }
    }
}

/// Probes the store and the broker at once, each bounded by [`READY_PROBE`], so the answer
/// comes within a second whatever hangs.
async fn probe(state: &HttpState) -> (Result<(), String>, Result<(), String>) {
    let probe = SessionId::parse("readyz-probe").ok();
    let store = async {
        match probe {
            Some(probe) => bounded_probe(state.store.get_session(&probe)).await,
            None => Ok(()),
        }
    };
    let broker = bounded_probe(state.broker.check());
    tokio::join!(store, broker)
}

/// How long a readiness probe may take before the dependency counts as stuck.
pub(crate) const READY_PROBE: Duration = Duration::from_millis(800);

/// A readiness probe with its error as text, or "did not answer" past [`READY_PROBE`].
pub(crate) async fn bounded_probe<T, E: std::fmt::Display>(
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

/// Prometheus metrics (text exposition format).
#[utoipa::path(get, path = "/metrics", tag = "operations", security(()),
    responses((status = 200, description = "Metrics", content_type = "text/plain; version=0.0.4", body = String)))]
pub(crate) async fn metrics(State(state): State<HttpState>) -> Response {
    state.metrics.sync_fenced(state.store.fenced_rejections());
    // Probed at every scrape (bounded, both at once): `aptix_dependency_up` says what this
    // process reaches now, whoever scrapes it.
    let (store, broker) = probe(&state).await;
    state.metrics.dependency_probed("store", store.is_ok());
    state.metrics.dependency_probed("broker", broker.is_ok());
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
pub(crate) async fn openapi_json(
    axum::Extension(OpenApiJson(api)): axum::Extension<OpenApiJson>,
) -> Response {
    (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        api.as_str().to_owned(),
    )
        .into_response()
}
