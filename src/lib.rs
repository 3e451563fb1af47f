//! # aptix-worker
//!
//! A queue-driven execution backend for LLM agent turns. The path of one turn, and the module
//! that owns each step:
//!
//! front door → queue → worker → pipeline [compose, model, server tools, reasoner, lifecycle]
//! → store → delivery
//!
//! - [`frontdoor`] — validation, idempotency, recording the turn as queued and enqueueing it
//!   with a publisher confirm (and noting it in the runs index); the HTTP API (`http` and
//!   `routes`, its connections served in `serve`: HTTP/1.1 on a codec of our own in `h1`,
//!   and HTTP/2 by prior knowledge),
//!   batches (`batch`, read back in `batch_results`, failed lines sent again in
//!   `batch_retry`), the runs list (`runs`) and the console (`console`, static pages over
//!   the public API).
//! - [`queue`] — the broker's three parts, the job queue (jobs, delayed retries, dead
//!   letters), the reply bus and the webhook queue, and the two brokers: RabbitMQ, or the
//!   embedded in-memory one.
//! - [`worker`] — consume → run → reply → ack / retry / dead-letter.
//! - [`pipeline`] — one turn, the AGN-027 layers as types: `compose` (B, functions that
//!   import neither a model client nor the store), `model_call` (C: `ModelCaller`, over the
//!   client in [`llm`]; it reads through `CallReads` and holds no store), `server_tools` (D:
//!   `ServerTools`, over [`tools`] and the mode [`catalog`], and the MCP servers operators
//!   plug in through [`mcp`], whose calls its executor `server_tools::mcp` makes exactly once
//!   where that matters; no model client, no store writer),
//!   `reasoner` (E: the `Pipeline`, the only one that holds the others and loops, once
//!   `opening` has begun a user turn's run; a client's continuation, approvals of MCP calls
//!   included, re-enters it through `continuation`) and
//!   `lifecycle` (F: `Lifecycle`, the only holder of the store's writer in the pipeline, each
//!   transition one atomic store step); `outcome` holds what a run comes to, `backends` maps a
//!   turn's contexts to its model client, model and boot prompt; each model call holds to its
//!   agent context's limits through the [`limiter`]; retrieval for the `[CONTEXT]` block from
//!   [`rag`].
//! - [`store`] — persistence of [`state`] (session, turn record, checkpoint, batches, the
//!   runs index of each tenant's turns) in Redis or memory, leases and fencing, behind three traits: `StoreReader` (reads), `RecordWriter`
//!   (writes that are not a turn's state: owners, latched contexts, cancel requests, watch
//!   marks, live events, batches, heartbeats; what the front door and its handlers hold) and
//!   `SessionStore` (the turn-state writes, which take layer F's grant; held by the lifecycle
//!   and its `Intake`, and by the composition root that wires them).
//! - [`delivery`] — the one owner of result delivery: a settled status delivered (on the
//!   store's replicas, then to the session's reply queue, the front door waiting for it and the
//!   session's watchers), a streaming turn's live events kept and published, and every wait for
//!   a turn (the synchronous endpoint, long-polls, Server-Sent Events, `aptix run`); a
//!   settled status's [`webhooks`] enqueued (sent, signed, by the worker's sender), and a
//!   batch line counted towards `batch.completed` once its events are out.
//! - [`live`] — a streaming turn's text and progress notes, batched into live events for the
//!   delivery's live outlet.
//!
//! A session id names a session within its tenant: [`contract::SessionId::within`] scopes it
//! where a request's tenant becomes known (the front door, the worker, a route's reader), and
//! every key, queue and binding is made from the scoped id.
//!
//! Beside the path: [`contract`] (the wire format), [`config`] (typed sections declared once,
//! read from the environment over an optional TOML file), [`contexts`], [`tenants`]
//! (tenant quotas), [`tokens`] (whom an API token stands for), [`sizing`] (the default
//! concurrency from the memory a process may use) and [`secret`] (what a process is configured
//! with), [`causes`] (an error and its causes as one line), [`app`] (the
//! composition root that wires the parts from a configuration), [`metrics`], [`telemetry`]
//! (logs and span export), [`trace`] (W3C trace context across the queue), [`tls`], [`net`]
//! (listening sockets with a backlog for bursts), [`hex`] (bytes as hex text), [`digits`]
//! (fixed-width decimal text), `h1` (how bytes come off an HTTP/1.1 connection: the read
//! buffer and a body's framing, shared by the model client's connections and the API's),
//! [`vitals`] (each worker's heartbeat and the system view folded
//! from them), [`sched`] (the CPU
//! scheduling class of the long-running processes), [`allocs`] (the counting allocator a
//! `count-allocations` build installs, for the bench's allocations per turn), [`fake_llm`] (a
//! faithful fake of the Responses API — and of a chat-only server — for tests and demos).
//!
//! The `aptix` binary (`src/main.rs`, the commands in `src/cli/`) is what operators run; the
//! benchmarks are a workspace member of their own (`crates/bench`, `aptix-bench`), and the
//! library's entry points for them are built only with the `bench` feature.

pub mod allocs;
pub mod app;
pub mod catalog;
pub mod causes;
pub mod config;
pub mod contexts;
pub mod contract;
pub mod delivery;
pub mod digits;
pub mod fake_llm;
pub mod frontdoor;
mod h1;
pub mod hex;
pub mod limiter;
pub mod live;
pub mod llm;
pub mod mcp;
pub mod metrics;
pub mod net;
pub mod pipeline;
pub mod queue;
pub mod rag;
pub mod sched;
pub mod secret;
pub mod sizing;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod tenants;
pub mod tls;
pub mod tokens;
pub mod tools;
pub mod trace;
pub mod vitals;
pub mod webhooks;
pub mod worker;
