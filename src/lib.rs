//! # aptix-worker
//!
//! A queue-driven execution backend for LLM agent turns. A turn flows through the modules in
//! this order, and the tree mirrors it:
//!
//! - [`contract`] — the wire format: `AgentExecuteRequest` parsed into a valid `UserTurn` or
//!   `ToolContinuation`, `AgentExecuteResponse`, `InvokeResult`, error codes.
//! - [`config`] — configuration from `APTIX_*` environment variables; [`contexts`] — the
//!   agent and conversation contexts a request may name.
//!
//! - [`frontdoor`] — validation, idempotency and enqueueing; the HTTP API and batches.
//! - [`queue`] — the job path: RabbitMQ (or the embedded in-memory broker).
//! - [`worker`] — consume → run → reply → ack.
//! - [`pipeline`] — one turn: compose the model request, call the model, run server tools.
//! - [`llm`] — the Responses API client; [`fake_llm`] — a faithful fake of it for tests.
//! - [`store`] — session and turn state in Redis (or in memory), leases and fencing.
//! - [`rag`] — the chunk index, BM25 retrieval and `ragScope` filtering for `[CONTEXT]`.
//! - [`metrics`] — Prometheus metrics; [`telemetry`] — log format and output; [`tls`] — the
//!   crypto provider and the extra CA bundle for `amqps://`, `rediss://` and the model;
//!   [`trace`] — W3C trace context from the front door across the queue to the model.

pub mod app;
pub mod bench;
pub mod catalog;
pub mod config;
pub mod contexts;
pub mod contract;
pub mod fake_llm;
pub mod frontdoor;
pub mod llm;
pub mod metrics;
pub mod pipeline;
pub mod queue;
pub mod rag;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod tools;
pub mod trace;
pub mod worker;
