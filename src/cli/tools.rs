//! The tool commands: `openapi`, `modes`, `error-codes`, `fake-llm` and the benchmarks.

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

/// Arguments of `aptix bench-store`.
#[derive(Debug, clap::Args)]
pub struct BenchStoreArgs {
    /// Turns to run.
    #[arg(long, default_value_t = 2000)]
    pub turns: usize,
}

/// Arguments of `aptix bench-limiter`.
#[derive(Debug, clap::Args)]
pub struct BenchLimiterArgs {
    /// Calls to measure per run.
    #[arg(long, default_value_t = 20_000)]
    pub calls: usize,
    /// Concurrent callers in the wide runs.
    #[arg(long, default_value_t = 64)]
    pub callers: usize,
}

/// Arguments of `aptix bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Turns to push.
    #[arg(long, default_value_t = 2000)]
    pub turns: usize,
    /// Sessions they are spread over (default: one per turn).
    #[arg(long)]
    pub sessions: Option<usize>,
    /// The fake model's latency in milliseconds.
    #[arg(long, default_value_t = 50)]
    pub latency_ms: u64,
    /// Worker concurrency (default: the product's, `APTIX_CONCURRENCY` or its default).
    #[arg(long)]
    pub concurrency: Option<u16>,
    /// Submit at this many turns per second (default: as fast as possible).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Instead: hold this many turns in flight against a slow model and report memory.
    #[arg(long)]
    pub in_flight: Option<usize>,
    /// Instead: stream `--turns` turns one at a time and report how much later their first
    /// words reach the client than the model wrote them, against calling the model directly.
    #[arg(long, conflicts_with = "in_flight")]
    pub first_delta: bool,
    /// Instead: `--sessions` clients in a closed loop through the synchronous endpoint over
    /// HTTP (RabbitMQ and Redis), with the CPU per turn of each process and a bare pipelined
    /// quorum publish/consume baseline.
    #[arg(long, conflicts_with_all = ["in_flight", "first_delta"])]
    pub closed_loop: bool,
    /// With --closed-loop: a new session for every turn (as `aptix batch` does).
    #[arg(long, requires = "closed_loop")]
    pub new_session_per_turn: bool,
    /// With --closed-loop: run the fake model, the front door and the worker as separate
    /// processes (`aptix fake-llm`, `aptix serve`, `aptix worker`), each with its own CPU per
    /// turn and memory per turn in flight.
    #[arg(long, requires = "closed_loop")]
    pub processes: bool,
    /// With --closed-loop: start the clients spread evenly over this many milliseconds
    /// instead of all at once (all at once, against a model of fixed latency, the clients
    /// stay in step: every turn arrives in a wave with the others).
    #[arg(long, default_value_t = 0, requires = "closed_loop")]
    pub ramp_up_ms: u64,
    /// With --closed-loop: messages of the bare publish/consume baseline.
    #[arg(long, default_value_t = 20_000, requires = "closed_loop")]
    pub baseline_messages: usize,
    /// With --processes: run this process under valgrind's callgrind and report the
    /// instructions it executes per turn (a CPU measure that does not move with the machine's
    /// other load; use a few hundred turns and one client, `--sessions 1`). Needs valgrind.
    #[arg(long, value_enum, requires = "processes")]
    pub callgrind: Option<super::bench_callgrind::Counted>,
    /// With --callgrind: keep callgrind's profile of the turns in this directory (for
    /// `callgrind_annotate`) instead of removing it after the run.
    #[arg(long, requires = "callgrind")]
    pub callgrind_out: Option<std::path::PathBuf>,
    /// Instead: leave this many idle session reply queues (one status each) on RabbitMQ and
    /// report the broker's resident memory per queue (for capacity planning).
    #[arg(long, conflicts_with_all = ["in_flight", "first_delta", "closed_loop"])]
    pub reply_queues: Option<usize>,
    /// Instead: send this many webhook deliveries to a receiver on loopback through the
    /// webhook queue and the sender (RabbitMQ when `APTIX_AMQP_URL` is set), against the bare
    /// HTTP client, with the CPU per delivery.
    #[arg(long, conflicts_with_all = ["in_flight", "first_delta", "closed_loop", "reply_queues"])]
    pub webhooks: Option<usize>,
}

/// Arguments of `aptix bench-rag`.
#[derive(Debug, clap::Args)]
pub struct BenchRagArgs {
    /// Files in the corpus.
    #[arg(long, default_value_t = 500)]
    pub files: usize,
    /// Sections (chunks) per file.
    #[arg(long, default_value_t = 8)]
    pub sections: usize,
    /// Queries timed per index.
    #[arg(long, default_value_t = 300)]
    pub queries: usize,
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

/// `aptix bench-store`.
pub async fn bench_store(args: BenchStoreArgs, config: Config) -> anyhow::Result<ExitCode> {
    let BenchStoreArgs { turns } = args;
    let url = config
        .store
        .url
        .map(|u| u.expose().to_string())
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_string());
    aptix_worker::pipeline::lifecycle::bench::run(&url, turns).await?;
    Ok(ExitCode::SUCCESS)
}

/// `aptix bench-limiter`.
pub async fn bench_limiter(args: BenchLimiterArgs, config: Config) -> anyhow::Result<ExitCode> {
    let url = config.store.url.as_ref().map(|u| u.expose().to_string());
    aptix_worker::limiter::bench::run(url.as_deref(), args.calls, args.callers.max(1)).await?;
    Ok(ExitCode::SUCCESS)
}

/// `aptix bench`.
pub async fn bench(args: BenchArgs, config: Config) -> anyhow::Result<ExitCode> {
    let BenchArgs {
        turns,
        sessions,
        latency_ms,
        concurrency,
        rate,
        in_flight,
        first_delta,
        closed_loop,
        processes,
        new_session_per_turn,
        ramp_up_ms,
        baseline_messages,
        callgrind,
        callgrind_out,
        reply_queues,
        webhooks,
    } = args;
    let concurrency =
        concurrency.unwrap_or_else(|| u16::try_from(config.worker.concurrency).unwrap_or(u16::MAX));
    if let Some(n) = webhooks {
        super::bench_webhooks::run(&config, n).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(n) = reply_queues {
        super::bench_loop::idle_reply_queues(&config, n).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if closed_loop {
        let opts = super::bench_loop::LoopOptions {
            sessions: sessions.unwrap_or(500),
            turns,
            new_session_per_turn,
            latency: Duration::from_millis(latency_ms),
            concurrency,
            ramp_up: Duration::from_millis(ramp_up_ms),
            baseline_messages,
            callgrind,
            callgrind_out,
        };
        if processes {
            super::bench_procs::run(&config, &opts).await?;
        } else {
            super::bench_loop::run(&config, &opts).await?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    if first_delta {
        super::bench_stream::run(&config, turns).await?;
        return Ok(ExitCode::SUCCESS);
    }
    match in_flight {
        Some(k) => {
            let latency = Duration::from_millis(if latency_ms == 50 { 2000 } else { latency_ms });
            super::bench::memory(&config, k, latency).await?
        }
        None => {
            let opts = super::bench::BenchOptions {
                turns,
                sessions: sessions.unwrap_or(turns),
                latency: Duration::from_millis(latency_ms),
                concurrency,
                rate,
            };
            super::bench::run(&config, &opts).await?
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `aptix bench-rag`.
pub async fn bench_rag(args: BenchRagArgs, config: Config) -> anyhow::Result<ExitCode> {
    let BenchRagArgs {
        files,
        sections,
        queries,
    } = args;
    let opts = aptix_worker::rag::bench::RagBenchOptions {
        files,
        sections,
        queries,
    };
    aptix_worker::rag::bench::run(config.store.url.as_ref().map(|u| u.expose()), opts).await?;
    Ok(ExitCode::SUCCESS)
}
