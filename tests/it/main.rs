//! All integration tests compile into this one binary (faster builds, shared helpers).

mod app;
mod support;

mod cli;
mod compose_golden;
mod contract_props;
mod contract_request;
mod contract_response;
mod http_api;
mod lifecycle;
mod openapi_agreement;
mod pipeline_redis;
mod pipeline_scenarios;
mod queue_conformance;
mod queue_e2e;
mod rag;
mod store_conformance;
mod tls;
mod worker_embedded;
