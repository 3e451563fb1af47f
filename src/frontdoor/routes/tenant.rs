//! `GET /v1/tenant/usage`: the calling tenant's quota counts (an extension of AGN-034).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use crate::contract::InvokeResult;
use crate::frontdoor::extract::{HttpState, QueryParams, Tenant, answer, unavailable};
use crate::frontdoor::openapi::{self as api_doc, Failure};
use crate::tenants::TenantUsage;

/// The calling tenant's model tokens and estimated cost today (or on another day of the last
/// eight), by agent context, its running turns and its limits.
#[utoipa::path(get, path = "/v1/tenant/usage", tag = "tenant",
    params(("day" = Option<String>, Query, format = Date, description = "A UTC day, YYYY-MM-DD (default: today); counts are kept eight days, so an older (or later) day shows none")),
    responses(
        (status = 200, description = "The tenant's counts and limits", body = api_doc::InvokeResult<TenantUsage>),
        (status = 400, description = "A parameter cannot be read (INVALID_PARAMETER, naming it)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 503, description = "The counters cannot be read", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn get_usage(
    State(state): State<HttpState>,
    Tenant(tenant): Tenant,
    query: QueryParams,
) -> Response {
    let day = match query.day() {
        Ok(day) => day,
        Err(bad) => return bad.into(),
    };
    match state.door.quotas().usage(&tenant, day.as_deref()).await {
        Ok(usage) => answer(StatusCode::OK, InvokeResult::success(usage)),
        Err(e) => unavailable(e),
    }
}
