//! `GET /v1/admin/system`: the system at a glance, for admin tokens (`token=tenant:admin` in
//! `APTIX_API_TOKENS`; every caller when no tokens are configured). The console's System page
//! reads exactly this and the dead-letter routes ([`super::dead_letters`]).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;

use crate::contract::InvokeResult;
use crate::frontdoor::extract::{Admin, HttpState, answer, unavailable};
use crate::frontdoor::openapi::{self as api_doc, Failure};
use crate::queue::QueueDepth;
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
