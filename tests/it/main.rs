//! All integration tests compile into this one binary (faster builds, shared helpers).

/// Runs each named test function once per backend, in a module per backend:
///
/// ```ignore
/// for_each_backend!(
///     backends: [memory => super::memory(), redis => super::redis().await],
///     tests: [saves_and_reads_back, a_lease_is_exclusive],
/// );
/// ```
///
/// makes `memory::saves_and_reads_back` call `saves_and_reads_back(super::memory())`, and so on.
/// The conformance suites (store, queue) and the lifecycle tests (services, embedded) use it.
macro_rules! for_each_backend {
    (backends: [$($backend:ident => $make:expr),+ $(,)?], tests: $tests:tt $(,)?) => {
        $( for_each_backend!(@one $backend, $make, $tests); )+
    };
    (@one $backend:ident, $make:expr, [$($name:ident),* $(,)?]) => {
        mod $backend {
            $( #[tokio::test] async fn $name() { super::$name($make).await } )*
        }
    };
}

mod app;
mod processes;
mod support;

mod admin;
mod background;
mod batch_retry;
mod broker_restart;
mod cancel;
mod cli;
mod cli_batch;
mod cli_telemetry;
mod compose;
mod compose_golden;
mod config_file;
mod connections;
mod connections_http2;
mod console;
mod console_batches;
mod console_runs;
mod console_timeline;
mod contexts;
mod contexts_processes;
mod contract_props;
mod contract_request;
mod contract_request_limits;
mod contract_response;
mod conversation;
mod cpu_scheduling;
mod direct_replies;
mod errors;
mod front_doors;
mod gateway;
mod hosted_tools;
mod http_api;
mod http_api_edges;
mod http_batches;
mod inspect;
mod lifecycle;
mod lifecycle_http;
mod lifecycle_stalls;
mod limiter;
mod mcp_approvals;
mod mcp_crash;
mod mcp_support;
mod mcp_tools;
mod model_alpn;
mod model_http;
mod openapi_agreement;
mod ops_files;
mod pipeline_model_failures;
mod pipeline_redis;
mod pipeline_replay;
mod pipeline_scenarios;
mod queue_conformance;
mod queue_conformance_dead;
mod queue_e2e;
mod queue_events;
mod rabbit_cluster;
mod rag;
mod rag_scope;
mod redis_cluster;
mod redis_cluster_failover;
mod redis_commands;
mod redis_failover;
mod restarts;
mod runs_list;
mod store_conformance;
mod store_conformance_begin;
mod store_conformance_intake;
mod store_conformance_runs;
mod store_conformance_session;
mod store_expiries;
mod store_faults;
mod store_faults_cluster;
mod streaming;
mod streaming_cli;
mod tenant_sessions;
mod tenants;
mod tls;
mod usage;
mod webhook_dead;
mod webhook_order;
mod webhook_retries;
mod webhook_tenants;
mod webhooks;
mod worker_embedded;
