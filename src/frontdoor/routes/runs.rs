//! `GET /v1/turns`: the runs list — the latest turns across sessions and batches, newest
//! first, filtered and paged ([`crate::frontdoor::runs`]). A tenant's token lists its own
//! turns; an admin's every tenant's, or one tenant's with `?tenant=`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use crate::contract::InvokeResult;
use crate::frontdoor::extract::{
    BadParameter, HttpState, QueryParams, Reader, answer, forbidden, unavailable,
};
use crate::frontdoor::openapi::{self as api_doc, Failure};
use crate::frontdoor::runs::{self, RunsListing, RunsQuery};
use crate::state::TurnStatus;

/// The most lines one page answers.
const MAX_LISTED: usize = 200;

/// The latest turns, newest first.
#[utoipa::path(get, path = "/v1/turns", tag = "turns",
    params(
        ("status" = Option<String>, Query, pattern = "^((queued|running|awaiting_client_tools|completed|failed|cancelled)(,(queued|running|awaiting_client_tools|completed|failed|cancelled))*)?$", description = "Only these statuses, comma-separated: queued, running, awaiting_client_tools, completed, failed, cancelled"),
        ("since" = Option<String>, Query, format = DateTime, description = "Only turns accepted at or after this time (RFC 3339)"),
        ("until" = Option<String>, Query, format = DateTime, description = "Only turns accepted at or before this time (RFC 3339)"),
        ("agentContext" = Option<String>, Query, description = "Only turns whose model calls go to this agent context"),
        ("batch" = Option<String>, Query, description = "Only lines of this batch"),
        ("q" = Option<String>, Query, description = "Only turns whose session or turn id holds this text (any case)"),
        ("limit" = Option<usize>, Query, minimum = 1, maximum = 200, description = "At most this many turns (default 50)"),
        ("after" = Option<String>, Query, pattern = "^([0-9]{1,18}\\.([A-Za-z0-9._:-]{1,64}/)?[A-Za-z0-9._:-]{1,128}/[A-Za-z0-9._:-]{1,128})?$", description = "Go on from a previous page's `next` (empty: from the newest)"),
        ("tenant" = Option<String>, Query, pattern = "^[A-Za-z0-9._:-]{1,64}$", description = "This tenant's turns: any tenant for an admin token (every tenant's without it), only its own for a tenant's"),
    ),
    responses(
        (status = 200, description = "A page of turns, newest first; `next` says where the next page starts. At most 2,000 index entries are read per page, so a filter that matches little may answer fewer turns than asked, with a `next`", body = api_doc::InvokeResult<RunsListing>),
        (status = 400, description = "A parameter cannot be read (INVALID_PARAMETER, naming it)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 403, description = "`tenant` names another tenant with a token that is not an admin's (FORBIDDEN)", body = Failure),
        (status = 503, description = "Store unavailable", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn list_turns(
    State(state): State<HttpState>,
    reader: Reader,
    query: QueryParams,
) -> Response {
    let mut asked = match read_query(&query) {
        Ok(q) => q,
        Err(bad) => return bad.into(),
    };
    asked.tenants = match (query.tenant(), reader.0.admin) {
        (Err(bad), _) => return bad.into(),
        (Ok(Some(t)), true) => vec![t],
        (Ok(Some(t)), false) if t == reader.0.tenant => vec![t],
        (Ok(Some(_)), false) => {
            return forbidden("tenant: only admin tokens may list another tenant's turns");
        }
        (Ok(None), true) => state.known_tenants(),
        (Ok(None), false) => vec![reader.0.tenant.clone()],
    };
    // A batch's lines are its items; a batch the caller may not see has none for it.
    if let Some(id) = &asked.batch {
        let items = match state.store.get_batch(id).await {
            Ok(Some(b)) if asked.tenants.contains(&b.tenant) => b.items,
            Ok(_) => Vec::new(),
            Err(e) => return unavailable(e),
        };
        asked.batch_turns = Some(
            items
                .into_iter()
                .map(|i| (i.session_id, i.turn_id))
                .collect(),
        );
    }
    match runs::list(&*state.store, &asked).await {
        Ok(listing) => answer(StatusCode::OK, InvokeResult::success(listing)),
        Err(e) => unavailable(e),
    }
}

/// The listing's parameters but the tenant.
fn read_query(query: &QueryParams) -> Result<RunsQuery, BadParameter> {
    let statuses = match query.text("status")? {
        None => Vec::new(),
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(status_named)
            .collect::<Result<_, _>>()?,
    };
    let after = match query
        .text("after")?
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        None => None,
        Some(text) => Some(runs::parse_position(text).ok_or_else(|| {
            BadParameter::new(format!(
                "after: not a position a page of this list gave as `next`: {text:?}"
            ))
        })?),
    };
    let named = |name: &str| -> Result<Option<String>, BadParameter> {
        Ok(query
            .text(name)?
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string))
    };
    Ok(RunsQuery {
        tenants: Vec::new(),
        statuses,
        since_ms: time_ms(query, "since")?,
        until_ms: time_ms(query, "until")?,
        agent_context: named("agentContext")?,
        batch: named("batch")?,
        batch_turns: None,
        search: named("q")?,
        limit: query.limit(50, MAX_LISTED)?,
        after,
    })
}

fn status_named(name: &str) -> Result<TurnStatus, BadParameter> {
    [
        TurnStatus::Queued,
        TurnStatus::Running,
        TurnStatus::AwaitingClientTools,
        TurnStatus::Completed,
        TurnStatus::Failed,
        TurnStatus::Cancelled,
    ]
    .into_iter()
    .find(|s| s.as_str() == name)
    .ok_or_else(|| {
        BadParameter::new(format!(
            "status: {name:?} is not a status (queued, running, awaiting_client_tools, completed, failed, cancelled)"
        ))
    })
}

/// `?<name>=<RFC 3339 time>` in milliseconds since the epoch, if given.
fn time_ms(query: &QueryParams, name: &str) -> Result<Option<i64>, BadParameter> {
    let Some(raw) = query.text(name)? else {
        return Ok(None);
    };
    time::OffsetDateTime::parse(raw.trim(), &time::format_description::well_known::Rfc3339)
        .ok()
        .and_then(|t| i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok())
        .map(Some)
        .ok_or_else(|| {
            BadParameter::new(format!(
                "{name}: must be a time written as RFC 3339 (2026-11-28T09:00:00Z), not {raw:?}"
            ))
        })
}
