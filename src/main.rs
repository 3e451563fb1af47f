//! The `aptix` binary: configuration, telemetry, and the subcommands. Kept thin; the work is in
//! the library.

use std::io::Read as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use serde_json::json;

use aptix_worker::catalog::{ModeCatalog, READ_FILE_TOOL};
use aptix_worker::config::Config;
use aptix_worker::contract::request::RelativePath;
use aptix_worker::contract::{self, AgentExecuteResponse, InvokeResult};
use aptix_worker::fake_llm::{FakeLlm, FakeOptions, create_response_validator};
use aptix_worker::llm::LlmClient;
use aptix_worker::pipeline::{Pipeline, PipelineSettings};
use aptix_worker::store::{MemoryStore, RedisStore, SessionStore};

#[derive(Parser)]
#[command(
    name = "aptix",
    version,
    about = "Queue-driven execution backend for LLM agent turns"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run request files through the agent pipeline in this process (embedded store; the
    /// built-in fake model unless APTIX_LLM_BASE_URL or OPENAI_API_KEY is set).
    Run {
        /// AgentExecuteRequest JSON files, run in order.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Where client tools (workspace_read_file) read files from.
        #[arg(long, default_value = "examples/workspace")]
        workspace: PathBuf,
    },
    /// Serve the fake Responses API (for tests, demos and benchmarks).
    FakeLlm {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8089")]
        listen: SocketAddr,
        /// Delay added to every answer, in milliseconds.
        #[arg(long, default_value_t = 0)]
        latency_ms: u64,
        /// Store no responses (every previous_response_id is unknown).
        #[arg(long)]
        stateless: bool,
        /// The official OpenAPI document (JSON) to validate requests against.
        #[arg(long)]
        openapi: Option<PathBuf>,
    },
    /// Parse AgentExecuteRequest JSON files (or `-` for stdin) and print each InvokeResult.
    Validate {
        /// Request files to check.
        #[arg(required = true)]
        files: Vec<String>,
    },
    /// Print the mode catalog in use (the file format of APTIX_MODES_FILE).
    Modes,
    /// Measure the session store's hot path (begin + commit of a turn) against a bare Redis
    /// SET+GET baseline, on APTIX_REDIS_URL (default redis://127.0.0.1:6379/).
    BenchStore {
        /// Turns to run.
        #[arg(long, default_value_t = 2000)]
        turns: usize,
    },
    /// Print the table of error codes as Markdown.
    ErrorCodes,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run { files, workspace } => run_files(&files, &workspace).await,
        Command::FakeLlm {
            listen,
            latency_ms,
            stateless,
            openapi,
        } => {
            let schema = match openapi {
                Some(p) => Some(Arc::new(
                    create_response_validator(&p).map_err(anyhow::Error::msg)?,
                )),
                None => None,
            };
            let options = FakeOptions {
                latency: Duration::from_millis(latency_ms),
                stateless,
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
        Command::Validate { files } => {
            let config = Config::from_env()?;
            let mut all_valid = true;
            for file in files {
                let body = if file == "-" {
                    let mut buf = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut buf)
                        .context("reading stdin")?;
                    buf
                } else {
                    std::fs::read(&file).with_context(|| format!("reading {file}"))?
                };
                let result = match contract::parse_request(&body, &config.limits) {
                    Ok(parsed) => {
                        InvokeResult::success(parsed.request).with_warnings(parsed.warnings)
                    }
                    Err(rejected) => rejected.into_invoke_result(),
                };
                all_valid &= result.is_successful();
                println!("{file}: {}", serde_json::to_string_pretty(&result)?);
            }
            Ok(if all_valid {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Modes => {
            let config = Config::from_env()?;
            let catalog = ModeCatalog::load(config.modes_file.as_deref())?;
            println!("{}", serde_json::to_string_pretty(&catalog.to_json())?);
            Ok(ExitCode::SUCCESS)
        }
        Command::BenchStore { turns } => {
            let config = Config::from_env()?;
            let url = config
                .redis_url
                .map(|u| u.expose().to_string())
                .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_string());
            aptix_worker::store::bench::run(&url, turns).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::ErrorCodes => {
            print!("{}", contract::codes::markdown_table());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The embedded single-process run: each file is one request; client tool calls for
/// `workspace_read_file` are answered from `workspace`, as a client would.
async fn run_files(files: &[PathBuf], workspace: &Path) -> anyhow::Result<ExitCode> {
    let config = Config::from_env()?;
    let catalog = Arc::new(ModeCatalog::load(config.modes_file.as_deref())?);
    let (base_url, _fake) = match config.model_base_url() {
        Some(url) => (url, None),
        None => {
            let fake = FakeLlm::start("127.0.0.1:0".parse()?, FakeOptions::default(), None).await?;
            tracing::info!(base_url = %fake.base_url(), "no model configured; using the built-in fake model");
            (fake.base_url(), Some(fake))
        }
    };
    let llm = LlmClient::from_config(&config, &base_url)?;
    let store: Arc<dyn SessionStore> = match &config.redis_url {
        Some(url) => {
            tracing::info!(namespace = %config.namespace, "using the Redis session store");
            Arc::new(RedisStore::connect(url.expose(), &config.namespace, config.retention).await?)
        }
        None => Arc::new(MemoryStore::new()),
    };
    let mut settings = PipelineSettings::new(config.model.clone());
    settings.max_iterations = config.max_iterations;
    settings.replay = config.llm_replay;
    settings.lease_ttl = config.lease;
    let pipeline = Pipeline::new(store, catalog, llm, settings).map_err(anyhow::Error::msg)?;

    let mut all_ok = true;
    for file in files {
        let body = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        let result = match contract::parse_request(&body, &config.limits) {
            Err(rejected) => rejected.into_invoke_result(),
            Ok(parsed) => {
                let mut r = run_once(&pipeline, &parsed.request).await;
                // Act as the client for continuations we can serve, a few rounds at most.
                for _ in 0..4 {
                    let Some(AgentExecuteResponse::ClientToolContinuation(c)) = r.result() else {
                        break;
                    };
                    let results: Vec<serde_json::Value> = c
                        .tool_calls()
                        .map(|call| client_tool(workspace, call))
                        .collect();
                    println!("{}: {}", file.display(), serde_json::to_string_pretty(&r)?);
                    let cont = json!({
                        "sessionId": c.meta.session_id, "turnId": c.meta.turn_id, "toolResults": results
                    });
                    r = match contract::parse_request(cont.to_string().as_bytes(), &config.limits) {
                        Ok(p) => run_once(&pipeline, &p.request).await,
                        Err(rejected) => rejected.into_invoke_result(),
                    };
                }
                r.with_warnings(parsed.warnings)
            }
        };
        all_ok &= result.is_successful();
        println!(
            "{}: {}",
            file.display(),
            serde_json::to_string_pretty(&result)?
        );
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn run_once(
    pipeline: &Pipeline,
    request: &contract::AgentExecuteRequest,
) -> InvokeResult<AgentExecuteResponse> {
    match pipeline.run(request).await {
        Ok(r) => r,
        // Without a queue there is nobody to retry later: report the transient failure.
        Err(retryable) => InvokeResult::failure(retryable.error),
    }
}

/// Runs one client tool call the way the IDE extension would.
fn client_tool(workspace: &Path, call: &contract::ToolCall) -> serde_json::Value {
    let id = call.tool_call_id.as_str();
    let fail = |msg: String| json!({"toolCallId": id, "executionMs": 0, "errorMessage": msg});
    if call.name != READ_FILE_TOOL {
        return fail(format!("this client does not implement {}", call.name));
    }
    let started = std::time::Instant::now();
    let args: serde_json::Value =
        serde_json::from_str(call.arguments_json.as_str()).unwrap_or_default();
    let Some(path) = args.get("path").and_then(|p| p.as_str()) else {
        return fail("missing 'path'".into());
    };
    let Ok(rel) = RelativePath::parse(path) else {
        return fail(format!(
            "{path:?} is not a relative path inside the workspace"
        ));
    };
    match std::fs::read_to_string(workspace.join(rel.as_str())) {
        Ok(text) => json!({
            "toolCallId": id,
            "executionMs": started.elapsed().as_millis() as u64,
            "resultJson": json!({"path": path, "contents": text}).to_string(),
        }),
        Err(e) => fail(format!("cannot read {path}: {e}")),
    }
}
