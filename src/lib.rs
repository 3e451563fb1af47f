//! # aptix-worker
//!
//! A queue-driven execution backend for LLM agent turns. A turn flows through the modules in
//! this order, and the tree mirrors it:
//!
//! - [`contract`] — the wire format: `AgentExecuteRequest` parsed into a valid `UserTurn` or
//!   `ToolContinuation`, `AgentExecuteResponse`, `InvokeResult`, error codes.
//! - [`config`] — configuration from `APTIX_*` environment variables.
//!
//! Later stages (front door, queue, worker, pipeline, LLM client, store) are added as their
//! issues land; see the README for what runs today.

pub mod bench;
pub mod catalog;
pub mod config;
pub mod contract;
pub mod fake_llm;
pub mod frontdoor;
pub mod llm;
pub mod pipeline;
pub mod queue;
pub mod store;
pub mod tools;
pub mod worker;
