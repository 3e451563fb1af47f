//! Every family of the registry, registered once with its name and help text (what
//! `/metrics` lists, even before anything is counted).
//!
//! Owns: the families' names, help and buckets. Must not: count anything.

use std::sync::RwLock;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::*;

impl Metrics {
    /// A fresh registry with every family registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("aptix");
        let turns = Family::<Labels, Counter>::default();
        registry.register(
            "turns",
            "Turn results published, by status (completed, awaiting_client_tools, failed)",
            turns.clone(),
        );
        let accepted = Counter::default();
        registry.register(
            "turns_accepted",
            "Turns accepted by the front door (broker-confirmed jobs)",
            accepted.clone(),
        );
        let runs_index_missed = Counter::default();
        registry.register(
            "runs_index_missed",
            "Accepted turns the front door could not note in the runs index (the turns list misses them; the turns run)",
            runs_index_missed.clone(),
        );
        let queue_wait = Histogram::new(seconds_buckets());
        registry.register(
            "turn_queue_wait_seconds",
            "Time from a user turn's acceptance to the start of the run that produced its result (retry delays included)",
            queue_wait.clone(),
        );
        let turn_duration = Histogram::new(seconds_buckets());
        registry.register(
            "turn_duration_seconds",
            "Time one run of a turn took on a worker (model calls and server tools)",
            turn_duration.clone(),
        );
        let model_latency = Histogram::new(seconds_buckets());
        registry.register(
            "model_request_duration_seconds",
            "Latency of one Responses API call, retries included",
            model_latency.clone(),
        );
        let tokens = Family::<Labels, Counter>::default();
        registry.register(
            "model_tokens",
            "Tokens reported by the model, by kind (input, output; of those, cached_input read from the prompt cache and reasoning spent reasoning)",
            tokens.clone(),
        );
        let model_retries = Counter::default();
        registry.register(
            "model_retries",
            "Responses API calls retried after a transient failure",
            model_retries.clone(),
        );
        let background_calls = Family::<Labels, Counter>::default();
        registry.register(
            "model_background_calls",
            "Background model calls by event: started, reattached (a run followed a call an earlier run made), recalled (the server no longer had it, or someone else cancelled it; made again), remade (it ended failed with an error worth retrying; made again), cancelled (on the server), foreground (the server could not give it back; made in the foreground)",
            background_calls.clone(),
        );
        for event in [
            "started",
            "reattached",
            "recalled",
            "remade",
            "cancelled",
            "foreground",
        ] {
            let _ = background_calls.get_or_create(&[("event", event)]);
        }
        let flex_fallbacks = Counter::default();
        registry.register(
            "model_flex_fallbacks",
            "Flex model calls made at the default tier after flex capacity stayed unavailable for the agent context's wait",
            flex_fallbacks.clone(),
        );
        let job_retries = Family::<Labels, Counter>::default();
        registry.register(
            "job_retries",
            "Jobs sent back for a delayed retry, by reason (transient, session_busy, model_capacity, reply_unpublished, result_unreplicated)",
            job_retries.clone(),
        );
        let redeliveries = Counter::default();
        registry.register(
            "job_redeliveries",
            "Deliveries the broker marked as redelivered (a consumer died or lost its channel)",
            redeliveries.clone(),
        );
        let dead_lettered = Counter::default();
        registry.register(
            "jobs_dead_lettered",
            "Jobs moved to the dead-letter queue (poison or past the retry limit)",
            dead_lettered.clone(),
        );
        let duplicates = Family::<Labels, Counter>::default();
        registry.register(
            "duplicates_suppressed",
            "Requests or jobs recognised as repeats and answered from stored state, by stage (frontdoor, worker)",
            duplicates.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "turns_in_flight",
            "Turn jobs being run by this process's workers",
            in_flight.clone(),
        );
        let fenced = Counter::<u64, AtomicU64>::default();
        registry.register(
            "fenced_writes_rejected",
            "Session-store writes rejected because their lease was lost (stale writer stopped)",
            fenced.clone(),
        );
        // Known label values start at zero, so dashboards and alerts see every series at once.
        let turns_settled = ["completed", "awaiting_client_tools", "failed", "cancelled"]
            .map(|status| (status, turns.get_or_create(&[("status", status)]).clone()));
        // The order `Metrics::add_tokens` adds in.
        let tokens = ["input", "output", "cached_input", "reasoning"]
            .map(|kind| tokens.get_or_create(&[("kind", kind)]).clone());
        for reason in [
            "transient",
            "session_busy",
            "model_capacity",
            "reply_unpublished",
            "result_unreplicated",
        ] {
            job_retries.get_or_create(&[("reason", reason)]).inc_by(0);
        }
        let context_calls = Family::<ContextLabel, Gauge>::default();
        registry.register(
            "model_calls_in_flight",
            "Model calls running now in this process, by agent context",
            context_calls.clone(),
        );
        let capacity_waits = Family::<ContextLabel, Counter>::default();
        registry.register(
            "model_capacity_waits",
            "Model calls that waited for their agent context's limits (concurrency or rate)",
            capacity_waits.clone(),
        );
        let capacity_wait_seconds = Family::<ContextLabel, Counter<f64, AtomicU64>>::default();
        registry.register(
            "model_capacity_wait_seconds",
            "Time model calls spent waiting for their agent context's limits",
            capacity_wait_seconds.clone(),
        );
        let estimated_cost = Family::<ContextLabel, Counter<f64, AtomicU64>>::default();
        registry.register(
            "model_estimated_cost_dollars",
            "Estimated cost of model calls in US dollars at the agent context's prices, by agent context (contexts without prices stay at 0)",
            estimated_cost.clone(),
        );
        let history_lost = Family::<ContextLabel, Counter>::default();
        registry.register(
            "model_history_lost",
            "Continued model calls answered without the conversation they continued (made again with it replayed), by agent context",
            history_lost.clone(),
        );
        let rate_limited = Family::<ContextLabel, Counter>::default();
        registry.register(
            "model_rate_limited",
            "HTTP 429 answers received from the model server, by agent context",
            rate_limited.clone(),
        );
        let refused_by_policy = Family::<Labels, Counter>::default();
        registry.register(
            "turns_refused_by_policy",
            "User turns the front door refused by policy (onBusy: reject → session_busy)",
            refused_by_policy.clone(),
        );
        for reason in ["session_busy", "quota_exceeded"] {
            refused_by_policy
                .get_or_create(&[("reason", reason)])
                .inc_by(0);
        }
        for stage in ["frontdoor", "worker"] {
            duplicates.get_or_create(&[("stage", stage)]).inc_by(0);
        }
        let tenant_running = Family::<TenantLabel, Gauge>::default();
        registry.register(
            "tenant_running_turns",
            "Turns of a tenant with maxRunningTurns running now in this process",
            tenant_running.clone(),
        );
        let tenant_waiting = Family::<TenantLabel, Gauge>::default();
        registry.register(
            "tenant_turns_waiting",
            "Turns this process holds until their tenant's maxRunningTurns allows them to run",
            tenant_waiting.clone(),
        );
        let tenant_tokens = Family::<TenantLabel, Counter>::default();
        registry.register(
            "tenant_tokens",
            "Model tokens (input + output) spent by this process's turns, by tenant (tenants not in the tenants file count as other)",
            tenant_tokens.clone(),
        );
        let quota_rejections = Family::<QuotaLabels, Counter>::default();
        registry.register(
            "quota_rejections",
            "User turns the front door refused because their tenant's quota was spent",
            quota_rejections.clone(),
        );
        let http_requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by route template, method and status code",
            http_requests.clone(),
        );
        let http_duration = RouteHistograms::new_with_constructor(request_buckets);
        registry.register(
            "http_request_duration_seconds",
            "Time from an HTTP request's arrival to its answer's status and headers, by route template (a streamed body goes on after it)",
            http_duration.clone(),
        );
        let http_in_flight = Family::<RouteLabel, Gauge>::default();
        registry.register(
            "http_requests_in_flight",
            "HTTP requests this process is answering now, by route template: synchronous waits and long-polls show here while they wait",
            http_in_flight.clone(),
        );
        let http_timeouts = Family::<Labels, Counter>::default();
        registry.register(
            "http_connections_timed_out",
            "HTTP connections closed because the client sent nothing for the read timeout (APTIX_HTTP_READ_TIMEOUT_SECS), by what it was to send: phase=\"headers\" (a request's headers, or the next request on an idle keep-alive connection) or phase=\"body\" (the next bytes of a body)",
            http_timeouts.clone(),
        );
        let http_connections = Family::<Labels, Counter>::default();
        registry.register(
            "http_connections",
            "Connections the API accepted, by the protocol their first bytes spoke: protocol=\"http1\" (HTTP/1.1, a connection per call in flight) or protocol=\"http2\" (HTTP/2 by prior knowledge, many calls as streams of one connection)",
            http_connections.clone(),
        );
        let dependency_up = Family::<Labels, Gauge>::default();
        registry.register(
            "dependency_up",
            "Whether a dependency (store: Redis; broker: RabbitMQ) answered this process's probe at the latest scrape: 1 or 0",
            dependency_up.clone(),
        );
        let webhook_outcomes = Family::<[(&'static str, &'static str); 2], Counter>::default();
        registry.register(
            "webhook_deliveries",
            "Webhook delivery attempts by event type and outcome (delivered, retried, dead, poison)",
            webhook_outcomes.clone(),
        );
        let webhook_attempt_seconds = Histogram::new(seconds_buckets());
        registry.register(
            "webhook_attempt_duration_seconds",
            "Time one webhook POST took, to the receiver's answer or the failure",
            webhook_attempt_seconds.clone(),
        );
        let webhook_age_seconds = Histogram::new(seconds_buckets());
        registry.register(
            "webhook_delivery_age_seconds",
            "Time from an event's first enqueue to its 2xx answer (retries included)",
            webhook_age_seconds.clone(),
        );
        let webhooks_in_flight = Gauge::default();
        registry.register(
            "webhook_deliveries_in_flight",
            "Webhook POSTs under way in this process",
            webhooks_in_flight.clone(),
        );
        let webhook_queue_depth = Gauge::default();
        registry.register(
            "webhook_queue_depth",
            "Deliveries waiting in the webhook queue (not counting those in retry queues), as this process's sender last saw it",
            webhook_queue_depth.clone(),
        );
        let webhook_send_lag = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "webhook_send_lag_seconds",
            "Age of the event of this process's latest webhook attempt (time since its first enqueue): how far behind sending is",
            webhook_send_lag.clone(),
        );
        let tools = super::tools::ToolFamilies::register(&mut registry);
        if crate::allocs::counted().is_some() {
            registry.register_collector(Box::new(Allocations));
        }
        Self {
            registry,
            turns,
            turns_settled,
            queue_wait,
            turn_duration,
            model_latency,
            tokens,
            model_retries,
            background_calls,
            flex_fallbacks,
            job_retries,
            redeliveries,
            dead_lettered,
            duplicates,
            in_flight,
            accepted,
            runs_index_missed,
            fenced,
            context_calls,
            capacity_waits,
            capacity_wait_seconds,
            rate_limited,
            estimated_cost,
            history_lost,
            refused_by_policy,
            tenant_running,
            tenant_waiting,
            tenant_tokens,
            quota_rejections,
            http_requests,
            http_duration,
            http_in_flight,
            http_timeouts,
            http_connections,
            dependency_up,
            webhook_outcomes,
            webhook_attempt_seconds,
            webhook_age_seconds,
            webhooks_in_flight,
            webhook_queue_depth,
            webhook_send_lag,
            tools,
            pulse: crate::vitals::Pulse::default(),
            routes: RwLock::default(),
        }
    }
}

/// The counting allocator's counts, read at each scrape: only in a `count-allocations` build
/// (the families are not listed otherwise).
#[derive(Debug)]
struct Allocations;

impl prometheus_client::collector::Collector for Allocations {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric as _;
        use prometheus_client::metrics::TypedMetric as _;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let Some(counts) = crate::allocs::counted() else {
            return Ok(());
        };
        for (name, help, value) in [
            (
                "allocations",
                "Heap allocations and reallocations of this process since it started (a count-allocations build)",
                counts.allocations,
            ),
            (
                "allocated_bytes",
                "Bytes those allocations asked for (a reallocation counts its new size)",
                counts.bytes,
            ),
        ] {
            let counter = ConstCounter::new(value);
            let metric = encoder.encode_descriptor(name, help, None, ConstCounter::<u64>::TYPE)?;
            counter.encode(metric)?;
        }
        for (name, help, value) in [
            (
                "heap_held_bytes",
                "Heap bytes this process holds now: allocated and not freed (a count-allocations build)",
                counts.held,
            ),
            (
                "heap_held_peak_bytes",
                "The most heap bytes this process has held at once since it started",
                counts.held_peak,
            ),
        ] {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(name, help, None, ConstGauge::<i64>::TYPE)?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}
