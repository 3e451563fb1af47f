//! `aptix-bench`: the benchmarks of aptix-worker, kept out of the binary operators deploy.
//!
//! Each measures the product against a baseline measured in the same run (docs/benchmarks.md
//! has today's figures and how to reproduce them): `turns` pushes turns through the real job
//! path (in-process, or as separate `aptix` processes with their CPU per turn, callgrind's
//! instruction counts and, for a `count-allocations` build, allocations per turn), `store`, `limiter` and `rag` measure one part each, and `tool-call`
//! what an MCP server tool call adds to a turn. Configuration is
//! the product's (`APTIX_*`, `APTIX_CONFIG_FILE`).

mod bench;
mod bench_allocs;
mod bench_callgrind;
mod bench_in_flight;
mod bench_loop;
mod bench_procs;
mod bench_stream;
mod bench_tools;
mod bench_verdict;
mod bench_webhooks;
mod procfs;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser as _;

use aptix_worker::causes::with_causes;
use aptix_worker::config::Config;

/// The command line.
#[derive(clap::Parser)]
#[command(
    name = "aptix-bench",
    version,
    about = "Benchmarks of aptix-worker, each against a baseline measured in the same run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The benchmarks.
#[derive(clap::Subcommand)]
enum Command {
    /// Push turns through the real job path against the fake model and compare with a bare
    /// publish/consume baseline (RabbitMQ/Redis when their URLs are set, else in-memory).
    Turns(BenchArgs),
    /// Measure the session store's hot path (begin + commit of a turn) against a bare Redis
    /// SET+GET baseline, on APTIX_REDIS_URL (default redis://127.0.0.1:6379/).
    Store(BenchStoreArgs),
    /// Measure what the per-context call limiter adds to each model call (in memory, and on
    /// Redis when APTIX_REDIS_URL is set) against the bare semaphore / Redis round trip.
    Limiter(BenchLimiterArgs),
    /// Measure indexing and BM25 queries on a synthetic corpus (memory, and Redis when
    /// APTIX_REDIS_URL is set) against baselines measured in the same run.
    Rag(BenchRagArgs),
    /// Measure what one MCP server tool call adds to a turn (latency and CPU) against the
    /// bare call of the same tool through the same client, on any Streamable HTTP MCP server.
    ToolCall(BenchToolCallArgs),
}

/// Arguments of `aptix-bench tool-call`.
#[derive(Debug, clap::Args)]
pub struct BenchToolCallArgs {
    /// Calls and turns per phase.
    #[arg(long, default_value_t = 300)]
    pub turns: usize,
    /// The MCP server's Streamable HTTP endpoint (e.g. http://127.0.0.1:8765/mcp).
    #[arg(long)]
    pub mcp_url: String,
    /// The tool to call.
    #[arg(long)]
    pub tool: String,
    /// Its arguments, a JSON object.
    #[arg(long, default_value = "{}")]
    pub arguments: String,
}

fn main() -> ExitCode {
    aptix_worker::tls::install_crypto_provider();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let _telemetry = {
        let _inside = runtime.enter();
        match aptix_worker::telemetry::init(
            aptix_worker::telemetry::LogFormat::Text,
            "warn",
            "aptix-bench",
            None,
        ) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {}", with_causes(&e));
                return ExitCode::from(2);
            }
        }
    };
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let done = runtime.block_on(async move {
        match cli.command {
            Command::Turns(args) => bench_turns(args, config).await,
            Command::Store(args) => bench_store(args, config).await,
            Command::Limiter(args) => bench_limiter(args, config).await,
            Command::Rag(args) => bench_rag(args, config).await,
            Command::ToolCall(args) => bench_tool_call(args, config).await,
        }
    });
    match done {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", with_causes(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// Arguments of `aptix-bench store`.
#[derive(Debug, clap::Args)]
pub struct BenchStoreArgs {
    /// Turns to run.
    #[arg(long, default_value_t = 2000)]
    pub turns: usize,
}

/// Arguments of `aptix-bench limiter`.
#[derive(Debug, clap::Args)]
pub struct BenchLimiterArgs {
    /// Calls to measure per run.
    #[arg(long, default_value_t = 20_000)]
    pub calls: usize,
    /// Concurrent callers in the wide runs.
    #[arg(long, default_value_t = 64)]
    pub callers: usize,
}

/// Arguments of `aptix-bench turns`.
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
    /// processes (`aptix fake-llm`, `aptix serve`, `aptix worker`: the `aptix` binary beside this one, or `APTIX_BIN`), each with its own CPU per
    /// turn and memory per turn in flight.
    #[arg(long, requires = "closed_loop")]
    pub processes: bool,
    /// With --closed-loop: the clients call the front door over HTTP/2 by prior knowledge
    /// (each call a stream; a connection per 500 clients) instead of a connection each over
    /// HTTP/1.1.
    #[arg(long, requires = "closed_loop")]
    pub http2: bool,
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
    /// other load; use a few hundred turns and one client, `--sessions 1`). Needs valgrind;
    /// `redis` also `redis-server` on PATH (a private one is started for the run, its CPU
    /// figure above is then not the product's Redis).
    #[arg(long, value_enum, requires = "processes")]
    pub callgrind: Option<bench_callgrind::Counted>,
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

/// Arguments of `aptix-bench rag`.
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

/// `aptix-bench store`.
async fn bench_store(args: BenchStoreArgs, config: Config) -> anyhow::Result<ExitCode> {
    let BenchStoreArgs { turns } = args;
    let url = config
        .store
        .url
        .map(|u| u.expose().to_string())
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_string());
    aptix_worker::pipeline::lifecycle::bench::run(&url, turns).await?;
    Ok(ExitCode::SUCCESS)
}

/// `aptix-bench limiter`.
async fn bench_limiter(args: BenchLimiterArgs, config: Config) -> anyhow::Result<ExitCode> {
    let url = config.store.url.as_ref().map(|u| u.expose().to_string());
    aptix_worker::limiter::bench::run(url.as_deref(), args.calls, args.callers.max(1)).await?;
    Ok(ExitCode::SUCCESS)
}

/// `aptix-bench turns`.
async fn bench_turns(args: BenchArgs, config: Config) -> anyhow::Result<ExitCode> {
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
        http2,
        reply_queues,
        webhooks,
    } = args;
    let concurrency =
        concurrency.unwrap_or_else(|| u16::try_from(config.worker.concurrency).unwrap_or(u16::MAX));
    if let Some(n) = webhooks {
        bench_webhooks::run(&config, n).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(n) = reply_queues {
        bench_loop::idle_reply_queues(&config, n).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if closed_loop {
        let opts = bench_loop::LoopOptions {
            sessions: sessions.unwrap_or(500),
            turns,
            new_session_per_turn,
            latency: Duration::from_millis(latency_ms),
            concurrency,
            ramp_up: Duration::from_millis(ramp_up_ms),
            baseline_messages,
            callgrind,
            callgrind_out,
            http2,
        };
        if processes {
            bench_procs::run(&config, &opts).await?;
        } else {
            bench_loop::run(&config, &opts).await?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    if first_delta {
        bench_stream::run(&config, turns).await?;
        return Ok(ExitCode::SUCCESS);
    }
    match in_flight {
        Some(k) => {
            let latency = Duration::from_millis(if latency_ms == 50 { 2000 } else { latency_ms });
            bench::memory(&config, k, latency).await?
        }
        None => {
            let opts = bench::BenchOptions {
                turns,
                sessions: sessions.unwrap_or(turns),
                latency: Duration::from_millis(latency_ms),
                concurrency,
                rate,
            };
            bench::run(&config, &opts).await?
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `aptix-bench rag`.
async fn bench_rag(args: BenchRagArgs, config: Config) -> anyhow::Result<ExitCode> {
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

async fn bench_tool_call(args: BenchToolCallArgs, config: Config) -> anyhow::Result<ExitCode> {
    let arguments = match serde_json::from_str(&args.arguments) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => anyhow::bail!("--arguments must be a JSON object, not {}", args.arguments),
    };
    let options = bench_tools::ToolCallOptions {
        turns: args.turns,
        url: args.mcp_url,
        tool: args.tool,
        arguments,
    };
    bench_tools::run(&config, options).await?;
    Ok(ExitCode::SUCCESS)
}
