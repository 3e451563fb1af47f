//! `/v1/admin/…`: the system at a glance and the dead-letter queue, for admin tokens
//! (`token=tenant:admin` in `APTIX_API_TOKENS`; every caller when no tokens are configured).
//! The console's System page reads exactly these.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};

use crate::contract::{ErrorCode, InvokeResult};
use crate::frontdoor::extract::{
    Admin, HttpState, LimitedBody, QueryParams, RequestSized, answer, failure, unavailable,
};
use crate::frontdoor::openapi::{self as api_doc, Failure};
use crate::queue::{DeadChoice, DeadLetter, QueueDepth};
use crate::vitals::{Heartbeat, SystemLoad};

/// A worker alive now.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WorkerView {
    /// The worker's id (host, process, a random part).
    worker: String,
    /// Its host.
    host: String,
    /// Its process id.
    pid: u32,
    /// When it started (RFC 3339).
    started_at: String,
    /// Milliseconds since its latest heartbeat.
    last_seen_ms: i64,
    /// Turns it runs now.
    running: u32,
    /// Turns it runs at once at most.
    concurrency: u16,
}

/// One tenant now.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TenantNow {
    /// The tenant.
    tenant: String,
    /// Turns of it running now, over every worker.
    running_turns: u32,
    /// Model tokens it used today (UTC).
    tokens_today: u64,
    /// Its estimated model cost today, in dollars (at the agent contexts' prices).
    estimated_cost_usd_today: f64,
}

/// The system at a glance.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SystemView {
    /// When this was read (Unix milliseconds).
    at_ms: i64,
    /// Workers alive (a heartbeat within the last 16 s).
    workers: Vec<WorkerView>,
    /// Results per second and latency over the last five minutes, in 5 s slots, with model
    /// calls by agent context and running turns by tenant.
    load: SystemLoad,
    /// Messages waiting in each queue.
    queues: Vec<QueueDepth>,
    /// Every known tenant's running turns and usage today.
    tenants: Vec<TenantNow>,
}

fn unix_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// Heartbeats older than this are removed when the system is read.
const FORGET_AFTER_MS: i64 = 10 * 60 * 1000;

/// The workers alive now; heartbeats long stale (or unreadable) are removed on the way.
async fn workers(state: &HttpState) -> Result<Vec<Heartbeat>, crate::store::StoreError> {
    let held = state.store.heartbeats().await?;
    let now = unix_ms();
    for (worker, body) in &held {
        let stale = serde_json::from_slice::<Heartbeat>(body)
            .map_or(true, |h| now - h.at_ms > FORGET_AFTER_MS);
        // Tidying only: a heartbeat left behind is removed on a later read.
        if stale && let Err(e) = state.store.drop_heartbeat(worker).await {
            tracing::debug!(%worker, error = %e, "stale heartbeat not removed");
        }
    }
    Ok(crate::vitals::alive(
        held.into_iter().map(|(_, b)| b).collect(),
    ))
}

/// The system at a glance: workers alive, results per second and latency percentiles over the
/// last minutes, queue depths, model calls in flight and capacity waits per agent context,
/// and every tenant's running turns and usage today.
#[utoipa::path(get, path = "/v1/admin/system", tag = "admin",
    responses(
        (status = 200, description = "The system now", body = api_doc::InvokeResult<SystemView>),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 403, description = "Not an admin token (FORBIDDEN)", body = Failure),
        (status = 503, description = "The store or the broker cannot be read", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn system(State(state): State<HttpState>, _admin: Admin) -> Response {
    let (workers, queues) = match tokio::join!(workers(&state), state.broker.depths()) {
        (Ok(w), Ok(q)) => (w, q),
        (Err(e), _) => return unavailable(e),
        (_, Err(e)) => return unavailable(e),
    };
    let at_ms = unix_ms();
    let load = SystemLoad::of(&workers, at_ms / 1000);
    let mut tenants = Vec::new();
    for tenant in state.known_tenants() {
        let usage = match state.door.quotas().usage(&tenant, None).await {
            Ok(u) => u,
            Err(e) => return unavailable(e),
        };
        tenants.push(TenantNow {
            running_turns: load.running_by_tenant.get(&tenant).copied().unwrap_or(0),
            tokens_today: usage.tokens_used,
            estimated_cost_usd_today: usage.cost_micros as f64 / 1e6,
            tenant,
        });
    }
    let workers = workers
        .iter()
        .map(|h| WorkerView {
            worker: h.worker.clone(),
            host: h.host.clone(),
            pid: h.pid,
            started_at: h.started_at.clone(),
            last_seen_ms: (at_ms - h.at_ms).max(0),
            running: h.running.values().sum(),
            concurrency: h.concurrency,
        })
        .collect();
    let view = SystemView {
        at_ms,
        workers,
        load,
        queues,
        tenants,
    };
    answer(StatusCode::OK, InvokeResult::success(view))
}

/// A dead-lettered job.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DeadLetterView {
    /// Its place in the queue, from 0 (the oldest).
    position: usize,
    /// The session its job names, when it names a valid one.
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<String>,
    /// The turn its job names, when it names a valid one.
    #[serde(skip_serializing_if = "Option::is_none")]
    turn_id: Option<String>,
    /// The tenant that submitted it, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<String>,
    /// Why it was dead-lettered.
    reason: String,
    /// The attempt it had reached.
    attempt: u32,
    /// The batch it is a line of, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    batch: Option<String>,
    /// Its size in bytes.
    bytes: usize,
}

fn view(position: usize, letter: &DeadLetter) -> DeadLetterView {
    let named = crate::queue::named_turn(&letter.body, letter.meta.tenant.as_deref());
    DeadLetterView {
        position,
        session_id: named.as_ref().map(|(s, _)| s.client_id().to_string()),
        turn_id: named.as_ref().map(|(_, t)| t.to_string()),
        tenant: letter.meta.tenant.clone(),
        reason: letter.reason.clone(),
        attempt: letter.meta.attempt,
        batch: letter.meta.batch.clone(),
        bytes: letter.body.len(),
    }
}

/// The most dead letters one call reads or requeues.
const MAX_DEAD: usize = 500;

/// The dead-lettered jobs, oldest first. Reading them goes through the queue (each is put
/// back at its end before it is taken from its place), so the queue keeps every job, in the
/// same order when all of them are read.
#[utoipa::path(get, path = "/v1/admin/dead-letters", tag = "admin",
    params(("limit" = Option<usize>, Query, minimum = 1, maximum = 500, description = "At most this many (default 100)")),
    responses(
        (status = 200, description = "The dead letters, oldest first", body = api_doc::InvokeResult<Vec<DeadLetterView>>),
        (status = 400, description = "A parameter cannot be read (INVALID_PARAMETER, naming it)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 403, description = "Not an admin token (FORBIDDEN)", body = Failure),
        (status = 503, description = "The broker cannot be read", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn dead_letters(
    State(state): State<HttpState>,
    _admin: Admin,
    query: QueryParams,
) -> Response {
    let limit = match query.limit(100, MAX_DEAD) {
        Ok(l) => l,
        Err(bad) => return bad.into(),
    };
    match state.broker.sweep_dead(limit, &|_| DeadChoice::Keep).await {
        Ok(swept) => {
            let views: Vec<DeadLetterView> = swept
                .iter()
                .enumerate()
                .map(|(i, (letter, _))| view(i, letter))
                .collect();
            answer(StatusCode::OK, InvokeResult::success(views))
        }
        Err(e) => unavailable(e),
    }
}

/// A turn, by its ids.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct TurnRef {
    /// The session.
    session_id: String,
    /// The turn.
    turn_id: String,
}

/// Which dead letters to requeue: every one, or those of the turns named.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RequeueAsk {
    /// Requeue every dead letter (up to 500 a call).
    #[serde(default)]
    all: bool,
    /// Requeue the dead letters of these turns.
    #[serde(default)]
    turns: Vec<TurnRef>,
}

/// What a requeue did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Requeued {
    /// Jobs put back on the job queue, as fresh jobs.
    requeued: usize,
    /// Jobs left in the dead-letter queue.
    kept: usize,
}

/// Puts dead-lettered jobs back on the job queue as fresh jobs (the same tenant, trace,
/// batch and webhook; attempt 0): every one (`{"all": true}`) or those of the turns named
/// (`{"turns": [{"sessionId", "turnId"}]}`). Each is on the job queue before it leaves the
/// dead-letter queue. A turn that has settled since (failed, say) only has its status
/// delivered again; one that has not runs.
#[utoipa::path(post, path = "/v1/admin/dead-letters/requeue", tag = "admin",
    request_body(content = RequeueAsk, content_type = "application/json"),
    responses(
        (status = 200, description = "How many were requeued and kept", body = api_doc::InvokeResult<Requeued>),
        (status = 400, description = "The body is not a RequeueAsk, or asks for nothing (MALFORMED_JSON)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 403, description = "Not an admin token (FORBIDDEN)", body = Failure),
        (status = 408, description = "The body stopped arriving for APTIX_HTTP_READ_TIMEOUT_SECS (REQUEST_TIMEOUT); the connection is closed", body = Failure),
        (status = 413, description = "The body is larger than APTIX_MAX_BODY_BYTES", body = Failure),
        (status = 415, description = "Not JSON, or compressed", body = Failure),
        (status = 503, description = "The broker cannot be reached", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn requeue_dead(
    State(state): State<HttpState>,
    _admin: Admin,
    LimitedBody(body, _): LimitedBody<RequestSized>,
) -> Response {
    let ask: RequeueAsk = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            return failure(
                StatusCode::BAD_REQUEST,
                ErrorCode::MalformedJson,
                format!("$: {e}"),
            );
        }
    };
    if !ask.all && ask.turns.is_empty() {
        return failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::MalformedJson,
            "$: name the turns to requeue (\"turns\") or ask for all (\"all\": true)",
        );
    }
    let wanted: std::collections::HashSet<(String, String)> = ask
        .turns
        .into_iter()
        .map(|t| (t.session_id, t.turn_id))
        .collect();
    let all = ask.all;
    let choose = move |letter: &DeadLetter| {
        // The client's ids (the tenant is a field of the letter beside them).
        let named = crate::queue::named_turn(&letter.body, None)
            .map(|(s, t)| (s.to_string(), t.to_string()))
            .is_some_and(|ids| wanted.contains(&ids));
        if all || named {
            DeadChoice::Requeue
        } else {
            DeadChoice::Keep
        }
    };
    match state.broker.sweep_dead(MAX_DEAD, &choose).await {
        Ok(swept) => {
            let requeued = swept
                .iter()
                .filter(|(_, c)| *c == DeadChoice::Requeue)
                .count();
            tracing::info!(requeued, "dead letters requeued");
            answer(
                StatusCode::OK,
                InvokeResult::success(Requeued {
                    requeued,
                    kept: swept.len() - requeued,
                }),
            )
        }
        Err(e) => unavailable(e),
    }
}
