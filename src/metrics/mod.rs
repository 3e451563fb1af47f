//! Prometheus metrics: what the front door, the workers and the model client did.
//!
//! Owns: the metric families and their text exposition (`GET /metrics`). Must not: decide
//! anything. One [`Metrics`] is built per process and shared (`Arc`) by every part; parts built
//! without one (library users, tests) get a private registry nobody scrapes.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

mod register;
mod tools;

pub use tools::{ToolFamilies, ToolOutcome};

type Labels = [(&'static str, &'static str); 1];
/// `context="<agent context id>"`.
type ContextLabel = [(&'static str, String); 1];
/// `tenant="<configured tenant id or other>"`.
type TenantLabel = [(&'static str, String); 1];
/// `tenant="…",quota="…"`.
type QuotaLabels = [(&'static str, String); 2];
/// `route="<route template>",method="…",status="<code>"`. Built per request without
/// allocating: the route is an interned [`Arc<str>`], the method one of a fixed set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: Arc<str>,
    method: &'static str,
    status: u16,
}
/// `route="<route template>"`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: Arc<str>,
}
/// Histograms by route, each with [`request_buckets`].
type RouteHistograms = Family<RouteLabel, Histogram, fn() -> Histogram>;

/// The `route` label of a request no route matched: one series for every unknown path.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// Every metric of the process.
pub struct Metrics {
    registry: Registry,
    turns: Family<Labels, Counter>,
    /// `turns`' series for the statuses a turn settles with, looked up once.
    turns_settled: [(&'static str, Counter); 4],
    queue_wait: Histogram,
    turn_duration: Histogram,
    model_latency: Histogram,
    /// `model_tokens`' four series (input, output, cached input, reasoning), looked up once:
    /// each answer adds to all four.
    tokens: [Counter; 4],
    model_retries: Counter,
    background_calls: Family<Labels, Counter>,
    flex_fallbacks: Counter,
    job_retries: Family<Labels, Counter>,
    redeliveries: Counter,
    dead_lettered: Counter,
    duplicates: Family<Labels, Counter>,
    in_flight: Gauge,
    accepted: Counter,
    runs_index_missed: Counter,
    fenced: Counter<u64, AtomicU64>,
    context_calls: Family<ContextLabel, Gauge>,
    capacity_waits: Family<ContextLabel, Counter>,
    capacity_wait_seconds: Family<ContextLabel, Counter<f64, AtomicU64>>,
    rate_limited: Family<ContextLabel, Counter>,
    estimated_cost: Family<ContextLabel, Counter<f64, AtomicU64>>,
    history_lost: Family<ContextLabel, Counter>,
    refused_by_policy: Family<Labels, Counter>,
    tenant_running: Family<TenantLabel, Gauge>,
    tenant_waiting: Family<TenantLabel, Gauge>,
    tenant_tokens: Family<TenantLabel, Counter>,
    quota_rejections: Family<QuotaLabels, Counter>,
    http_requests: Family<RequestLabels, Counter>,
    http_duration: RouteHistograms,
    http_in_flight: Family<RouteLabel, Gauge>,
    http_timeouts: Family<Labels, Counter>,
    http_connections: Family<Labels, Counter>,
    dependency_up: Family<Labels, Gauge>,
    webhook_outcomes: Family<[(&'static str, &'static str); 2], Counter>,
    webhook_attempt_seconds: Histogram,
    webhook_age_seconds: Histogram,
    webhooks_in_flight: Gauge,
    webhook_queue_depth: Gauge,
    webhook_send_lag: Gauge<f64, AtomicU64>,
    /// The MCP server tools' families.
    pub tools: ToolFamilies,
    /// The counts of the current heartbeat slot (see [`crate::vitals`]).
    pulse: crate::vitals::Pulse,
    /// The route templates seen, so a request's labels share one copy of its route's name.
    /// As few as the routes, plus [`UNMATCHED_ROUTE`].
    routes: RwLock<HashSet<Arc<str>>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Buckets from 5 ms to about 22 minutes.
fn seconds_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.005, 2.0, 19)
}

/// Buckets from 1 ms to about 17 minutes: a health check takes well under a millisecond, the
/// synchronous endpoint as long as the turn.
fn request_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 21))
}

/// A method's label: the standard ones by name, any other as `other` (a client may send any
/// token as a method; the label must not grow with them).
fn method_label(method: &str) -> &'static str {
    const KNOWN: [&str; 9] = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
    ];
    KNOWN.into_iter().find(|m| *m == method).unwrap_or("other")
}

impl Metrics {
    /// An HTTP connection was closed after the client sent nothing for the read timeout, while
    /// the server waited for `phase`: `"headers"` or `"body"`.
    pub fn http_timed_out(&self, phase: &'static str) {
        self.http_timeouts.get_or_create(&[("phase", phase)]).inc();
    }

    /// The API accepted a connection that speaks `protocol`: `"http1"` or `"http2"`.
    pub fn http_connection(&self, protocol: &'static str) {
        self.http_connections
            .get_or_create(&[("protocol", protocol)])
            .inc();
    }

    /// An HTTP request was answered: `route` is the route's template (the same few series
    /// whatever ids a path carries; [`UNMATCHED_ROUTE`] for a path no route has), `took` the
    /// time until the answer's status and headers (a stream's body goes on after it).
    /// An HTTP request of route template `route` arrived (answered: [`Metrics::http_answered`]).
    pub fn http_started(&self, route: &str) {
        let route = self.route_name(route);
        self.http_in_flight
            .get_or_create(&RouteLabel { route })
            .inc();
    }

    /// An HTTP request [`Metrics::http_started`] was answered with `status` after `took` (or
    /// its client went away first).
    pub fn http_answered(&self, route: &str, method: &str, status: u16, took: Duration) {
        let route = self.route_name(route);
        self.http_in_flight
            .get_or_create(&RouteLabel {
                route: route.clone(),
            })
            .dec();
        self.http_duration
            .get_or_create(&RouteLabel {
                route: route.clone(),
            })
            .observe(took.as_secs_f64());
        self.http_requests
            .get_or_create(&RequestLabels {
                route,
                method: method_label(method),
                status,
            })
            .inc();
    }

    /// The one shared copy of a route template's name.
    fn route_name(&self, route: &str) -> Arc<str> {
        if let Some(known) = self.routes.read().ok().and_then(|r| r.get(route).cloned()) {
            return known;
        }
        let name: Arc<str> = Arc::from(route);
        if let Ok(mut routes) = self.routes.write() {
            // Another request may have added it meanwhile: keep the first copy.
            if let Some(known) = routes.get(route) {
                return known.clone();
            }
            routes.insert(name.clone());
        }
        name
    }

    /// A turn result was published with this status.
    pub fn turn_finished(&self, status: &'static str) {
        match self
            .turns_settled
            .iter()
            .find(|(known, _)| *known == status)
        {
            Some((_, series)) => series.inc(),
            None => self.turns.get_or_create(&[("status", status)]).inc(),
        };
    }

    /// The front door accepted a turn.
    pub fn turn_accepted(&self) {
        self.accepted.inc();
    }

    /// An accepted turn could not be noted in the runs index.
    pub fn runs_index_missed(&self) {
        self.runs_index_missed.inc();
    }

    /// How long a turn waited in the queue before the run that finished it started.
    pub fn observe_queue_wait(&self, wait: Duration) {
        self.queue_wait.observe(wait.as_secs_f64());
    }

    /// How long one run of a turn took.
    pub fn observe_turn_duration(&self, took: Duration) {
        self.turn_duration.observe(took.as_secs_f64());
    }

    /// One model call (with its retries) took this long.
    pub fn observe_model_latency(&self, took: Duration) {
        self.model_latency.observe(took.as_secs_f64());
    }

    /// Token usage of one model answer.
    pub fn add_tokens(&self, [input, output, cached_input, reasoning]: [u64; 4]) {
        for (series, n) in self
            .tokens
            .iter()
            .zip([input, output, cached_input, reasoning])
        {
            series.inc_by(n);
        }
    }

    /// A model call is retried.
    pub fn model_retry(&self) {
        self.model_retries.inc();
    }

    /// A background model call event (`started`, `reattached`, `recalled`, `remade`,
    /// `cancelled`).
    pub fn background_call(&self, event: &'static str) {
        self.background_calls
            .get_or_create(&[("event", event)])
            .inc();
    }

    /// A flex call is made at the default tier.
    pub fn flex_fallback(&self) {
        self.flex_fallbacks.inc();
    }

    /// A job goes back for a delayed retry (`transient`, `session_busy`, `model_capacity`, or
    /// `reply_unpublished`: its result is stored but could not be published yet;
    /// `result_unreplicated`: stored, but not yet on the replicas `APTIX_REDIS_MIN_REPLICAS`
    /// requires).
    pub fn job_retry(&self, reason: &'static str) {
        self.job_retries.get_or_create(&[("reason", reason)]).inc();
    }

    /// A delivery was marked redelivered.
    pub fn redelivered(&self) {
        self.redeliveries.inc();
    }

    /// A job was dead-lettered.
    pub fn dead_lettered(&self) {
        self.dead_lettered.inc();
    }

    /// A repeat was answered from stored state at `stage` (`frontdoor` or `worker`).
    pub fn duplicate_suppressed(&self, stage: &'static str) {
        self.duplicates.get_or_create(&[("stage", stage)]).inc();
    }

    /// A model call of `context` starts (it holds its capacity).
    pub fn context_call_started(&self, context: &str) {
        self.context_calls
            .get_or_create(&context_label(context))
            .inc();
    }

    /// A model call of `context` ended.
    pub fn context_call_finished(&self, context: &str) {
        self.context_calls
            .get_or_create(&context_label(context))
            .dec();
    }

    /// A model call of `context` waited `waited` for capacity.
    pub fn capacity_waited(&self, context: &str, waited: Duration) {
        let label = context_label(context);
        self.capacity_waits.get_or_create(&label).inc();
        self.capacity_wait_seconds
            .get_or_create(&label)
            .inc_by(waited.as_secs_f64());
    }

    /// The model server of `context` answered 429.
    pub fn context_rate_limited(&self, context: &str) {
        self.rate_limited
            .get_or_create(&context_label(context))
            .inc();
    }

    /// The front door refused a user turn by policy.
    pub fn turn_refused_by_policy(&self, reason: &'static str) {
        self.refused_by_policy
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// Makes the tenant series start at zero for the configured tenants (so a rate or an
    /// increase over them means something from the first scrape on).
    pub fn register_tenants<'a>(&self, tenants: impl IntoIterator<Item = &'a str>) {
        for t in tenants {
            let label = tenant_label(t);
            self.tenant_running.get_or_create(&label).set(0);
            self.tenant_waiting.get_or_create(&label).set(0);
            self.tenant_tokens.get_or_create(&label).inc_by(0);
            self.quota_rejections
                .get_or_create(&[
                    ("tenant", t.to_string()),
                    ("quota", "tokens_per_day".to_string()),
                ])
                .inc_by(0);
        }
    }

    /// Makes the series of an agent context start at zero.
    pub fn register_context(&self, context: &str) {
        let label = context_label(context);
        self.context_calls.get_or_create(&label).set(0);
        self.capacity_waits.get_or_create(&label).inc_by(0);
        self.capacity_wait_seconds.get_or_create(&label).inc_by(0.0);
        self.rate_limited.get_or_create(&label).inc_by(0);
        self.estimated_cost.get_or_create(&label).inc_by(0.0);
        self.history_lost.get_or_create(&label).inc_by(0);
    }

    /// A continued call of `context` was answered without its conversation.
    pub fn history_lost(&self, context: &str) {
        self.history_lost
            .get_or_create(&context_label(context))
            .inc();
    }

    /// Adds `micros` millionths of a dollar to the context's estimated cost.
    pub fn estimated_cost(&self, context: &str, micros: u64) {
        self.estimated_cost
            .get_or_create(&context_label(context))
            .inc_by(micros as f64 / 1e6);
    }

    /// A turn of `tenant` (a label value) started running under its tenant's cap; the guard
    /// ends it.
    pub fn tenant_turn_running(&self, tenant: &str) -> Tracked {
        Tracked::new(
            self.tenant_running
                .get_or_create(&tenant_label(tenant))
                .clone(),
        )
    }

    /// A turn of `tenant` is held until its tenant's cap allows it; the guard ends that.
    pub fn tenant_turn_waiting(&self, tenant: &str) -> Tracked {
        Tracked::new(
            self.tenant_waiting
                .get_or_create(&tenant_label(tenant))
                .clone(),
        )
    }

    /// `tenant`'s turns spent `tokens` model tokens.
    pub fn tenant_spent(&self, tenant: &str, tokens: u64) {
        self.tenant_tokens
            .get_or_create(&tenant_label(tenant))
            .inc_by(tokens);
    }

    /// The front door refused a turn of `tenant` because `quota` is spent.
    pub fn quota_rejected(&self, tenant: &str, quota: &'static str) {
        self.quota_rejections
            .get_or_create(&[("tenant", tenant.to_string()), ("quota", quota.to_string())])
            .inc();
    }

    /// The counts a worker's heartbeat reports (see [`crate::vitals`]).
    pub fn pulse(&self) -> &crate::vitals::Pulse {
        &self.pulse
    }

    /// Model calls of `context` in flight now.
    pub fn context_calls_now(&self, context: &str) -> i64 {
        self.context_calls
            .get(&context_label(context))
            .map_or(0, |g| g.get())
    }

    /// Calls of `context` that waited for capacity, so far.
    pub fn capacity_waits_so_far(&self, context: &str) -> u64 {
        self.capacity_waits
            .get(&context_label(context))
            .map_or(0, |c| c.get())
    }

    /// A turn run starts; the guard ends it.
    pub fn run_started(&self) -> InFlight<'_> {
        self.in_flight.inc();
        InFlight(self)
    }

    /// Brings the fenced-write counter up to the store's own count (read at scrape time).
    pub fn sync_fenced(&self, total: u64) {
        let seen = self.fenced.get();
        if total > seen {
            self.fenced.inc_by(total - seen);
        }
    }

    /// Whether `dependency` (`store`, `broker`) answered the latest probe.
    pub fn dependency_probed(&self, dependency: &'static str, up: bool) {
        self.dependency_up
            .get_or_create(&[("dependency", dependency)])
            .set(i64::from(up));
    }

    /// A webhook POST starts.
    pub fn webhook_started(&self) {
        self.webhooks_in_flight.inc();
    }

    /// A webhook POST ended after `took`.
    pub fn webhook_finished(&self, took: Duration) {
        self.webhooks_in_flight.dec();
        self.webhook_attempt_seconds.observe(took.as_secs_f64());
    }

    /// The webhook queue holds `n` deliveries.
    pub fn webhook_queue(&self, n: u64) {
        self.webhook_queue_depth
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A webhook attempt was made for an event first enqueued `age` ago.
    pub fn webhook_attempted(&self, age: Duration) {
        self.webhook_send_lag.set(age.as_secs_f64());
    }

    /// A webhook was delivered `age` after its event was first enqueued.
    pub fn webhook_delivered(&self, age: Duration) {
        self.webhook_age_seconds.observe(age.as_secs_f64());
    }

    /// Makes the series of `event` and `outcome` exist (at zero until it happens).
    pub fn webhook_outcome_seen(&self, event: &'static str, outcome: &'static str) {
        self.webhook_outcomes
            .get_or_create(&[("event", event), ("outcome", outcome)])
            .inc_by(0);
    }

    /// What a webhook attempt of `event` came to.
    pub fn webhook_outcome(&self, event: &'static str, outcome: &'static str) {
        self.webhook_outcomes
            .get_or_create(&[("event", event), ("outcome", outcome)])
            .inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

fn context_label(context: &str) -> ContextLabel {
    [("context", context.to_string())]
}

fn tenant_label(tenant: &str) -> TenantLabel {
    [("tenant", tenant.to_string())]
}

/// Holds a gauge one higher until dropped.
#[derive(Debug)]
pub struct Tracked(Gauge);

impl Tracked {
    fn new(gauge: Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Counts a run as in flight until dropped.
#[derive(Debug)]
pub struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

#[cfg(test)]
mod tests;
