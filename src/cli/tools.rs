//! The tool commands: `openapi`, `modes`, `contexts`, `error-codes`, `fake-llm`, `probe`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;

use aptix_worker::catalog::ModeCatalog;
use aptix_worker::config::Config;
use aptix_worker::contract;
use aptix_worker::fake_llm::{FakeLlm, FakeOptions, create_response_validator};
use aptix_worker::frontdoor::http;

/// Arguments of `aptix fake-llm`.
#[derive(Debug, clap::Args)]
pub struct FakeLlmArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8089")]
    pub listen: SocketAddr,
    /// Delay added to every answer, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Store no responses (every previous_response_id is unknown).
    #[arg(long)]
    pub stateless: bool,
    /// Remember at most this many responses for previous_response_id (about 100 bytes each),
    /// forgetting the oldest first: a forgotten one is previous_response_not_found, as an
    /// expired one is on the real API, so a server left running keeps its memory bounded.
    #[arg(long, default_value_t = 100_000)]
    pub keep_responses: usize,
    /// The official OpenAPI document (JSON) to validate requests against.
    #[arg(long)]
    pub openapi: Option<PathBuf>,
    /// Answer 401 invalid_api_key unless requests carry this bearer key (read from the
    /// environment variable of this name, so the key stays out of the process list).
    #[arg(long, value_name = "ENV_VAR")]
    pub api_key_env: Option<String>,
    /// Pieces a streamed answer's text is cut into.
    #[arg(long, default_value_t = 4)]
    pub stream_pieces: usize,
    /// Pause between streamed events, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub stream_delay_ms: u64,
    /// Break the first N streamed answers halfway (the connection drops before
    /// response.completed), as a failing server would.
    #[arg(long, default_value_t = 0)]
    pub break_streams: usize,
    /// Refuse stream: true with a 400, as a server without streaming does.
    #[arg(long)]
    pub no_streaming: bool,
}

/// Arguments of `aptix probe`.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// The URL to GET (e.g. http://127.0.0.1:8080/readyz).
    pub url: String,
    /// How long the answer may take, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    pub timeout_ms: u64,
}

/// `aptix openapi`.
pub async fn openapi() -> anyhow::Result<ExitCode> {
    println!("{}", serde_json::to_string_pretty(&http::openapi())?);
    Ok(ExitCode::SUCCESS)
}

/// `aptix modes`.
pub async fn modes(config: Config) -> anyhow::Result<ExitCode> {
    let catalog = ModeCatalog::load(config.worker.modes_file.as_deref())?;
    println!("{}", serde_json::to_string_pretty(&catalog.to_json())?);
    Ok(ExitCode::SUCCESS)
}

/// `aptix contexts`: the agent and conversation contexts in use, keys masked (the contexts
/// file is checked exactly as a worker checks it at start-up).
pub async fn contexts(config: Config) -> anyhow::Result<ExitCode> {
    let contexts = aptix_worker::app::contexts_in_use(&config, None);
    println!("{}", serde_json::to_string_pretty(&contexts.describe())?);
    Ok(ExitCode::SUCCESS)
}

/// `aptix probe`: exit 0 on a 2xx answer, 1 (naming the status or the failure) otherwise.
pub async fn probe(args: ProbeArgs) -> anyhow::Result<ExitCode> {
    let client = aptix_worker::tls::http_client_builder(None)?
        .timeout(Duration::from_millis(args.timeout_ms))
        .build()?;
    match client.get(&args.url).send().await {
        Ok(resp) if resp.status().is_success() => Ok(ExitCode::SUCCESS),
        Ok(resp) => {
            eprintln!("{} answered {}", args.url, resp.status());
            Ok(ExitCode::FAILURE)
        }
        Err(e) => {
            eprintln!("{} cannot be reached: {e}", args.url);
            Ok(ExitCode::FAILURE)
        }
    }
}

/// `aptix error-codes`.
pub async fn error_codes() -> anyhow::Result<ExitCode> {
    print!("{}", contract::codes::markdown_table());
    Ok(ExitCode::SUCCESS)
}

/// `aptix fake-llm`.
pub async fn fake_llm(args: FakeLlmArgs) -> anyhow::Result<ExitCode> {
    let FakeLlmArgs {
        listen,
        latency_ms,
        stateless,
        keep_responses,
        openapi,
        api_key_env,
        stream_pieces,
        stream_delay_ms,
        break_streams,
        no_streaming,
    } = args;
    let schema = match openapi {
        Some(p) => Some(create_response_validator(&p).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let api_key = match api_key_env {
        None => None,
        Some(var) => Some(
            std::env::var(&var)
                .map_err(|_| anyhow::anyhow!("--api-key-env names {var}, which is not set"))?,
        ),
    };
    let options = FakeOptions {
        latency: Duration::from_millis(latency_ms),
        stateless,
        api_key,
        stream_pieces,
        stream_delay: Duration::from_millis(stream_delay_ms),
        break_streams,
        no_streaming,
        no_background: false,
        // A server that runs for days keeps no record nobody reads.
        forget_requests: true,
        keep_responses: Some(keep_responses),
        stamp_answers: false,
    };
    let fake = FakeLlm::start(listen, options, schema)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    tracing::info!(base_url = %fake.base_url(), "fake Responses API listening; Ctrl-C stops it");
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    Ok(ExitCode::SUCCESS)
}
