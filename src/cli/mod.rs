//! The `aptix` commands, one file per group: the processes ([`serve`]: run, serve, worker),
//! turns through the API ([`turns`]: submit, status, watch, enqueue, validate), [`batch`],
//! [`index`], [`dlq`] and the [`tools`] (openapi, modes, error codes, the fake model, the
//! benchmarks). [`client`] is the HTTP API client they share; [`workspace`] answers client
//! tools when the CLI acts as a turn's client.
//!
//! Owns: argument parsing and what each command prints. Must not: hold product logic — that
//! lives in the library, wired by `aptix_worker::app::App`. `anyhow` is used here (and in
//! `main`) only.

use std::process::ExitCode;

use aptix_worker::config::{Config, Sources};
use clap::{Parser, Subcommand};

pub mod batch;
mod batch_inputs;
pub mod client;
pub mod config;
pub mod dlq;
pub mod index;
pub mod mcp;
pub mod progress;
pub mod serve;
pub mod tools;
pub mod turns;
pub mod watch;
pub mod webhooks;
pub mod workspace;

/// The command line.
#[derive(Parser)]
#[command(
    name = "aptix",
    version,
    about = "Queue-driven execution backend for LLM agent turns"
)]
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Command {
    /// Front door and worker in one process (embedded in-memory queue and store unless
    /// APTIX_AMQP_URL / APTIX_REDIS_URL are set; the built-in fake model unless
    /// APTIX_LLM_BASE_URL or OPENAI_API_KEY is set). Serves the HTTP API until SIGTERM/Ctrl-C;
    /// given request files, runs them in order instead and exits.
    Run(serve::RunArgs),
    /// Serve the HTTP API (front door). With --worker, also run a worker in this process
    /// (required on the embedded in-memory queue; `aptix run` is the same).
    Serve(serve::ServeArgs),
    /// Run a worker: consume turn jobs from RabbitMQ (APTIX_AMQP_URL) until SIGTERM/Ctrl-C.
    Worker(serve::WorkerArgs),
    /// Run a folder of *.md documents (or an NDJSON file of {"customId","request"} lines) as a
    /// batch through the HTTP API: one new session per input, a progress bar, one result file
    /// per input plus summary.json. Re-running skips inputs that already completed. Without
    /// --url (or APTIX_URL), runs an embedded server in this process.
    Batch(batch::BatchArgs),
    /// Print the OpenAPI document of the HTTP API.
    Openapi,
    /// Print the effective configuration: every setting's value (secrets masked) and where it
    /// came from (default, the APTIX_CONFIG_FILE file, or the environment variable); with
    /// --reference, the reference of every setting as Markdown.
    Config(config::ConfigArgs),
    /// Index a folder for retrieval (Markdown by heading, code by lines): through the HTTP API
    /// with --url, else straight into Redis (APTIX_REDIS_URL). Unchanged files are skipped,
    /// changed ones re-chunked, files gone from the folder removed.
    Index(index::IndexArgs),
    /// Enqueue request files through the front door (prints each accepted turn's status).
    Enqueue(turns::EnqueueArgs),
    /// Print a session's turn results as the HTTP API publishes them (Server-Sent Events;
    /// Ctrl-C stops).
    Watch(watch::WatchArgs),
    /// Submit one request file to the HTTP API and print its result (or, with --no-wait, its
    /// accepted status).
    Submit(turns::SubmitArgs),
    /// Print a turn's status from the HTTP API.
    Status(turns::StatusArgs),
    /// Cancel a turn through the HTTP API: a queued or waiting turn at once, a running one at
    /// its next safe point.
    Cancel(turns::StatusArgs),
    /// Inspect or replay the dead-letter queue (APTIX_AMQP_URL).
    Dlq(dlq::DlqArgs),
    /// List the webhook deliveries that never succeeded, or send them again (APTIX_AMQP_URL).
    Webhooks(webhooks::WebhooksArgs),
    /// Serve the fake Responses API (for tests, demos and benchmarks).
    FakeLlm(tools::FakeLlmArgs),
    /// Parse AgentExecuteRequest JSON files (or `-` for stdin) and print each InvokeResult.
    Validate(turns::ValidateArgs),
    /// Print the mode catalog in use (the file format of APTIX_MODES_FILE).
    Modes,
    /// Print the agent and conversation contexts in use (APTIX_CONTEXTS_FILE plus the
    /// built-in `default`s), keys masked; a bad contexts file is reported naming the entry.
    Contexts,
    /// Print the server tools in use per mode: the built-in ones and those of the MCP servers
    /// of APTIX_TOOLS_FILE (connected as a worker connects them), with their sources and
    /// annotations; exit 1 when a source does not answer.
    Tools,
    /// Print the table of error codes as Markdown.
    ErrorCodes,
    /// GET a URL and succeed on a 2xx answer (container health checks: the image has no curl).
    Probe(tools::ProbeArgs),
}

impl Command {
    /// The log level when `RUST_LOG` is not set: client commands keep stderr for their own
    /// progress.
    pub fn default_log_level(&self) -> &'static str {
        match self {
            Self::Batch(_)
            | Self::Submit(_)
            | Self::Status(_)
            | Self::Cancel(_)
            | Self::Watch(_)
            | Self::Validate(_)
            | Self::Probe(_) => "warn",
            _ => "info",
        }
    }

    /// Whether this is one of the long-running processes that `APTIX_CPU_SCHEDULING` applies
    /// to (the front door, the worker, or both in one process).
    pub fn long_running(&self) -> bool {
        matches!(self, Self::Run(_) | Self::Serve(_) | Self::Worker(_))
    }
}

/// Submits `request` as the local tenant's, in a trace of its own, its result picked up later:
/// how the commands that run a deployment in-process (`run`, `turns submit`) enqueue.
pub(crate) async fn submit_local(
    door: &aptix_worker::frontdoor::FrontDoor,
    request: &aptix_worker::contract::AgentExecuteRequest,
) -> Result<aptix_worker::store::TurnStatusView, aptix_worker::frontdoor::SubmitError> {
    let trace = aptix_worker::trace::TraceContext::new_root();
    let pickup = aptix_worker::frontdoor::Pickup::later(None);
    door.submit(aptix_worker::config::LOCAL_TENANT, request, &trace, pickup)
        .await
}

/// Runs the command. `sources` are the configuration's layers, read once by the binary; the
/// commands that need the configuration get it read from them here.
pub async fn run(cli: Cli, sources: Sources<'_>) -> anyhow::Result<ExitCode> {
    let config = || Config::read(&sources);
    match cli.command {
        Command::Run(args) => serve::run(args, config()?).await,
        Command::Serve(args) => serve::serve(args, config()?).await,
        Command::Worker(args) => serve::worker(args, config()?).await,
        Command::Batch(args) => batch::batch(args, &sources).await,
        Command::Openapi => tools::openapi().await,
        Command::Config(args) => config::config(args, &sources),
        Command::Index(args) => index::index(args, &sources).await,
        Command::Enqueue(args) => turns::enqueue(args, config()?).await,
        Command::Watch(args) => watch::watch(args).await,
        Command::Submit(args) => turns::submit(args).await,
        Command::Status(args) => turns::status(args).await,
        Command::Cancel(args) => turns::cancel(args).await,
        Command::Dlq(args) => dlq::dlq(args, config()?).await,
        Command::Webhooks(args) => webhooks::webhooks(args, config()?).await,
        Command::FakeLlm(args) => tools::fake_llm(args).await,
        Command::Validate(args) => turns::validate(args, config()?).await,
        Command::Modes => tools::modes(config()?).await,
        Command::Contexts => tools::contexts(config()?).await,
        Command::Tools => mcp::tools(config()?).await,
        Command::ErrorCodes => tools::error_codes().await,
        Command::Probe(args) => tools::probe(args).await,
    }
}
