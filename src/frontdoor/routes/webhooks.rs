//! `/v1/admin/webhooks/dead`: the webhook deliveries that never succeeded, for admin tokens —
//! listed, and sent again — on whichever broker the deployment runs (the embedded one
//! included, which no other process can reach). `aptix webhooks --url` goes through these.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;

use crate::contract::InvokeResult;
use crate::frontdoor::extract::{Admin, HttpState, QueryParams, answer, unavailable};
use crate::frontdoor::openapi::{self as api_doc, Failure};
use crate::webhooks::dead::{self, DeadDelivery};

/// The most dead deliveries one call reads or sends again.
const MAX_DEAD: usize = 1000;

/// The dead webhook deliveries, oldest first; they stay where they are.
#[utoipa::path(get, path = "/v1/admin/webhooks/dead", tag = "admin",
    params(("limit" = Option<usize>, Query, minimum = 1, maximum = 1000, description = "At most this many (default 100)")),
    responses(
        (status = 200, description = "The dead deliveries, oldest first", body = api_doc::InvokeResult<Vec<DeadDelivery>>),
        (status = 400, description = "A parameter cannot be read (INVALID_PARAMETER, naming it)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 403, description = "Not an admin token (FORBIDDEN)", body = Failure),
        (status = 503, description = "The broker cannot be read", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn dead_deliveries(
    State(state): State<HttpState>,
    _admin: Admin,
    query: QueryParams,
) -> Response {
    let limit = match query.limit(100, MAX_DEAD) {
        Ok(l) => l,
        Err(bad) => return bad.into(),
    };
    match dead::list(state.broker.as_ref(), limit).await {
        Ok(dead) => answer(StatusCode::OK, InvokeResult::success(dead)),
        Err(e) => unavailable(e),
    }
}

/// What a replay did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Replayed {
    /// Deliveries sent again, as fresh deliveries of the same events.
    replayed: usize,
}

/// Sends dead webhook deliveries again, oldest first, each as a fresh delivery of the same
/// event (same `webhook-id`, the retry schedule from its start). What is not a delivery stays
/// dead, and so does what could not be sent again.
#[utoipa::path(post, path = "/v1/admin/webhooks/dead/replay", tag = "admin",
    params(("limit" = Option<usize>, Query, minimum = 1, maximum = 1000, description = "At most this many (default 100)")),
    responses(
        (status = 200, description = "How many were sent again", body = api_doc::InvokeResult<Replayed>),
        (status = 400, description = "A parameter cannot be read (INVALID_PARAMETER, naming it)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 403, description = "Not an admin token (FORBIDDEN)", body = Failure),
        (status = 503, description = "The broker cannot be reached", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn replay_dead_deliveries(
    State(state): State<HttpState>,
    _admin: Admin,
    query: QueryParams,
) -> Response {
    let limit = match query.limit(100, MAX_DEAD) {
        Ok(l) => l,
        Err(bad) => return bad.into(),
    };
    match dead::replay(state.broker.as_ref(), limit).await {
        Ok(replayed) => answer(StatusCode::OK, InvokeResult::success(Replayed { replayed })),
        Err(e) => unavailable(e),
    }
}
