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
use aptix_worker::contract::SessionId;
use aptix_worker::contract::request::RelativePath;
use aptix_worker::contract::{self, AgentExecuteResponse, InvokeResult};
use aptix_worker::fake_llm::{FakeLlm, FakeOptions, create_response_validator};
use aptix_worker::frontdoor::http::{HttpState, check_exposure, serve};
use aptix_worker::frontdoor::{FrontDoor, SubmitError};
use aptix_worker::llm::LlmClient;
use aptix_worker::pipeline::{Pipeline, PipelineSettings};
use aptix_worker::queue::{Broker, MemoryBroker, RabbitBroker, Topology};
use aptix_worker::store::{MemoryStore, RedisStore, SessionStore, TurnStatusView};
use aptix_worker::worker::{Worker, WorkerSettings};
use tokio_util::sync::CancellationToken;

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
enum DlqAction {
    /// Print dead-lettered jobs with their reasons (they stay dead-lettered, moved to the back).
    List {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        max: usize,
    },
    /// Put dead-lettered jobs back on the job queue as fresh jobs.
    Requeue {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        max: usize,
    },
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
    /// Serve the HTTP API (front door). With --worker, also run a worker in this process
    /// (required on the embedded in-memory queue).
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Also consume and run turns in this process.
        #[arg(long)]
        worker: bool,
    },
    /// Run a worker: consume turn jobs from RabbitMQ (APTIX_AMQP_URL) until SIGTERM/Ctrl-C.
    Worker,
    /// Enqueue request files through the front door (prints each accepted turn's status).
    Enqueue {
        /// AgentExecuteRequest JSON files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print a session's results as they arrive on its reply queue (Ctrl-C stops).
    Watch {
        /// The session id.
        session_id: String,
    },
    /// Submit one request file to the HTTP API and print its result (or, with --no-wait, its
    /// accepted status).
    Submit {
        /// The AgentExecuteRequest JSON file.
        file: PathBuf,
        /// The API's base URL.
        #[arg(long, env = "APTIX_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Bearer token.
        #[arg(long, env = "APTIX_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Print the accepted status instead of waiting for the result.
        #[arg(long)]
        no_wait: bool,
    },
    /// Print a turn's status from the HTTP API.
    Status {
        /// The session id.
        session_id: String,
        /// The turn id.
        turn_id: String,
        /// The API's base URL.
        #[arg(long, env = "APTIX_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Bearer token.
        #[arg(long, env = "APTIX_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Inspect or replay the dead-letter queue (APTIX_AMQP_URL).
    Dlq {
        #[command(subcommand)]
        action: DlqAction,
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
    /// Push turns through the real job path against the fake model and compare with a bare
    /// publish/consume baseline (RabbitMQ/Redis when their URLs are set, else in-memory).
    Bench {
        /// Turns to push.
        #[arg(long, default_value_t = 2000)]
        turns: usize,
        /// Sessions they are spread over (default: one per turn).
        #[arg(long)]
        sessions: Option<usize>,
        /// The fake model's latency in milliseconds.
        #[arg(long, default_value_t = 50)]
        latency_ms: u64,
        /// Worker concurrency.
        #[arg(long, default_value_t = 256)]
        concurrency: u16,
        /// Submit at this many turns per second (default: as fast as possible).
        #[arg(long)]
        rate: Option<f64>,
        /// Instead: hold this many turns in flight against a slow model and report memory.
        #[arg(long)]
        in_flight: Option<usize>,
    },
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
        Command::Serve { listen, worker } => {
            let config = Config::from_env()?;
            check_exposure(&listen, &config.api_tokens).map_err(anyhow::Error::msg)?;
            if config.amqp_url.is_none() && !worker {
                anyhow::bail!(
                    "on the embedded in-memory queue nothing else can run the turns: add --worker (or set APTIX_AMQP_URL)"
                );
            }
            let app = App::build(&config).await?;
            let shutdown = CancellationToken::new();
            tokio::spawn(stop_on_signal(shutdown.clone()));
            let worker_task = worker.then(|| app.worker(&config).spawn(shutdown.clone()));
            let state = HttpState {
                door: app.front_door(&config),
                store: app.store.clone(),
                broker: app.broker.clone(),
                catalog: app.catalog.clone(),
                tokens: config.api_tokens.clone(),
                limits: config.limits,
            };
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("cannot listen on {listen}"))?;
            tracing::info!(address = %listener.local_addr()?, "HTTP API listening");
            serve(listener, state, shutdown).await?;
            if let Some(t) = worker_task {
                let _ = t.await;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Submit {
            file,
            url,
            token,
            no_wait,
        } => {
            let body =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let client = ApiClient::new(&url, token);
            let (status, accepted) = client.post("/v1/turns", body).await?;
            if status != 202 || no_wait {
                println!("{}", serde_json::to_string_pretty(&accepted)?);
                return Ok(if status == 202 {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                });
            }
            let (sid, tid) = (
                accepted["result"]["sessionId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                accepted["result"]["turnId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
            loop {
                let (status, view) = client
                    .get(&format!("/v1/sessions/{sid}/turns/{tid}?wait=30"))
                    .await?;
                let state = view["result"]["status"].as_str().unwrap_or_default();
                if status != 200 || !matches!(state, "queued" | "running") {
                    let result = &view["result"]["result"];
                    let shown = if result.is_null() { &view } else { result };
                    println!("{}", serde_json::to_string_pretty(shown)?);
                    let ok = status == 200 && state != "failed";
                    return Ok(if ok {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    });
                }
            }
        }
        Command::Status {
            session_id,
            turn_id,
            url,
            token,
        } => {
            let client = ApiClient::new(&url, token);
            let (status, view) = client
                .get(&format!("/v1/sessions/{session_id}/turns/{turn_id}"))
                .await?;
            println!("{}", serde_json::to_string_pretty(&view)?);
            Ok(if status == 200 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Dlq { action } => {
            let config = Config::from_env()?;
            let Some(url) = &config.amqp_url else {
                anyhow::bail!("APTIX_AMQP_URL is not set: the dead-letter queue lives in RabbitMQ");
            };
            let mut topology = Topology::new(&config.namespace);
            topology.reply_queue_ttl = config.reply_queue_ttl;
            let broker = RabbitBroker::new(url.expose(), topology, "aptix-dlq");
            broker.connect().await?;
            match action {
                DlqAction::List { max } => {
                    let dead = broker.drain_dead(max).await?;
                    for (body, reason) in &dead {
                        println!(
                            "{}",
                            json!({"reason": reason, "job": String::from_utf8_lossy(body)})
                        );
                        broker.publish_dead(body, 0, reason).await?;
                    }
                    eprintln!("{} dead-lettered job(s) listed", dead.len());
                }
                DlqAction::Requeue { max } => {
                    let dead = broker.drain_dead(max).await?;
                    for (body, _) in &dead {
                        broker.publish_job(body).await?;
                    }
                    eprintln!("{} job(s) requeued", dead.len());
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Worker => {
            let config = Config::from_env()?;
            if config.amqp_url.is_none() {
                anyhow::bail!(
                    "APTIX_AMQP_URL is not set: a standalone worker needs RabbitMQ (use `aptix run` for the embedded mode)"
                );
            }
            if config.redis_url.is_none() {
                anyhow::bail!(
                    "APTIX_REDIS_URL is not set: workers on several machines need a shared Redis"
                );
            }
            let app = App::build(&config).await?;
            let shutdown = CancellationToken::new();
            tokio::spawn(stop_on_signal(shutdown.clone()));
            app.worker(&config).run(shutdown).await;
            tracing::info!("worker stopped");
            Ok(ExitCode::SUCCESS)
        }
        Command::Enqueue { files } => {
            let config = Config::from_env()?;
            let app = App::build(&config).await?;
            let door = app.front_door(&config);
            let mut all_ok = true;
            for file in files {
                let body =
                    std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
                match door.submit(&body).await {
                    Ok(view) => println!("{}: {}", file.display(), serde_json::to_string(&view)?),
                    Err(e) => {
                        all_ok = false;
                        println!(
                            "{}: {}",
                            file.display(),
                            serde_json::to_string_pretty(&submit_error_result(e))?
                        );
                    }
                }
            }
            Ok(if all_ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Watch { session_id } => {
            let config = Config::from_env()?;
            let sid = SessionId::parse(session_id.as_str())
                .map_err(|e| anyhow::anyhow!("session id {session_id:?}: {e}"))?;
            let app = App::build(&config).await?;
            let mut replies = app.broker.subscribe_replies(&sid).await?;
            let shutdown = CancellationToken::new();
            tokio::spawn(stop_on_signal(shutdown.clone()));
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    next = replies.recv() => match next {
                        Some(body) => println!("{}", String::from_utf8_lossy(&body)),
                        None => anyhow::bail!("the reply stream ended (broker connection lost)"),
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
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
        Command::Bench {
            turns,
            sessions,
            latency_ms,
            concurrency,
            rate,
            in_flight,
        } => {
            let config = Config::from_env()?;
            match in_flight {
                Some(k) => {
                    let latency =
                        Duration::from_millis(if latency_ms == 50 { 2000 } else { latency_ms });
                    aptix_worker::bench::memory(&config, k, latency).await?
                }
                None => {
                    let opts = aptix_worker::bench::BenchOptions {
                        turns,
                        sessions: sessions.unwrap_or(turns),
                        latency: Duration::from_millis(latency_ms),
                        concurrency,
                        rate,
                    };
                    aptix_worker::bench::run(&config, &opts).await?
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::ErrorCodes => {
            print!("{}", contract::codes::markdown_table());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Everything a process needs, built from the configuration: embedded in-memory parts when no
/// URLs are set, RabbitMQ and Redis when they are.
struct App {
    catalog: Arc<ModeCatalog>,
    store: Arc<dyn SessionStore>,
    broker: Arc<dyn Broker>,
    pipeline: Pipeline,
    topology: Topology,
    /// Keeps the built-in fake model alive when no model server is configured.
    _fake: Option<FakeLlm>,
}

impl App {
    async fn build(config: &Config) -> anyhow::Result<Self> {
        let catalog = Arc::new(ModeCatalog::load(config.modes_file.as_deref())?);
        let (base_url, fake) = match config.model_base_url() {
            Some(url) => (url, None),
            None => {
                let fake =
                    FakeLlm::start("127.0.0.1:0".parse()?, FakeOptions::default(), None).await?;
                tracing::info!(base_url = %fake.base_url(), "no model configured; using the built-in fake model");
                (fake.base_url(), Some(fake))
            }
        };
        let llm = LlmClient::from_config(config, &base_url)?;
        let store: Arc<dyn SessionStore> = match &config.redis_url {
            Some(url) => {
                tracing::info!(namespace = %config.namespace, "using the Redis session store");
                Arc::new(
                    RedisStore::connect(url.expose(), &config.namespace, config.retention).await?,
                )
            }
            None => Arc::new(MemoryStore::new()),
        };
        let mut topology = Topology::new(&config.namespace);
        topology.reply_queue_ttl = config.reply_queue_ttl;
        let broker: Arc<dyn Broker> = match &config.amqp_url {
            Some(url) => {
                let name = format!("aptix-{}", uuid::Uuid::new_v4().simple());
                let rabbit = RabbitBroker::new(url.expose(), topology.clone(), &name);
                rabbit.connect().await?;
                tracing::info!(namespace = %config.namespace, "using RabbitMQ");
                Arc::new(rabbit)
            }
            None => Arc::new(MemoryBroker::new()),
        };
        let mut settings = PipelineSettings::new(config.model.clone());
        settings.max_iterations = config.max_iterations;
        settings.replay = config.llm_replay;
        settings.lease_ttl = config.lease;
        let pipeline = Pipeline::new(store.clone(), catalog.clone(), llm, settings)
            .map_err(anyhow::Error::msg)?;
        Ok(Self {
            catalog,
            store,
            broker,
            pipeline,
            topology,
            _fake: fake,
        })
    }

    fn worker(&self, config: &Config) -> Worker {
        let settings = WorkerSettings {
            concurrency: u16::try_from(config.concurrency).unwrap_or(u16::MAX),
            max_attempts: config.max_attempts,
            turn_deadline: config.turn_deadline,
            shutdown_grace: config.shutdown_grace,
            limits: config.limits,
            ..WorkerSettings::default()
        };
        Worker::new(
            self.broker.clone(),
            self.pipeline.clone(),
            self.topology.clone(),
            settings,
        )
    }

    fn front_door(&self, config: &Config) -> FrontDoor {
        FrontDoor::new(self.store.clone(), self.broker.clone(), config.limits)
    }
}

/// Cancels `token` on SIGTERM or Ctrl-C.
async fn stop_on_signal(token: CancellationToken) {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    let _ = tokio::signal::ctrl_c().await;
                    token.cancel();
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutdown requested");
    token.cancel();
}

/// The `InvokeResult` a client gets for a request the front door did not accept.
fn submit_error_result(e: SubmitError) -> InvokeResult<AgentExecuteResponse> {
    match e {
        SubmitError::Invalid(rejected) => rejected.into_invoke_result(),
        SubmitError::Conflict(m) | SubmitError::NotFound(m) | SubmitError::NotAwaitingTools(m) => {
            InvokeResult::failure(m)
        }
        SubmitError::Unavailable(m) => InvokeResult::failure(contract::ErrorMessage::new(
            contract::ErrorCode::Internal,
            m,
        )),
    }
}

/// The main job: each file becomes a turn that goes through the front door, the queue, a worker
/// and the store, exactly as in a deployment (embedded in-memory parts unless URLs are set);
/// client tool calls for `workspace_read_file` are answered from `workspace`, as a client would.
async fn run_files(files: &[PathBuf], workspace: &Path) -> anyhow::Result<ExitCode> {
    let config = Config::from_env()?;
    let app = App::build(&config).await?;
    let door = app.front_door(&config);
    let shutdown = CancellationToken::new();
    let worker_task = app.worker(&config).spawn(shutdown.clone());

    let mut all_ok = true;
    for file in files {
        let body = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        let parsed = match contract::parse_request(&body, &config.limits) {
            Ok(p) => p,
            Err(rejected) => {
                all_ok = false;
                let r: InvokeResult<AgentExecuteResponse> = rejected.into_invoke_result();
                println!("{}: {}", file.display(), serde_json::to_string_pretty(&r)?);
                continue;
            }
        };
        let mut request = parsed.request;
        let mut replies = app.broker.subscribe_replies(request.session_id()).await?;
        // Act as the client for continuations we can serve, a few rounds at most.
        let mut rounds = 0;
        let result = loop {
            if let Err(e) = door.submit_parsed(&request).await {
                break submit_error_result(e);
            }
            let view = wait_for(&mut replies, request.turn_id()).await?;
            let Some(result) = view.result else {
                anyhow::bail!("a reply without a result");
            };
            rounds += 1;
            let Some(AgentExecuteResponse::ClientToolContinuation(c)) = result.result() else {
                break result;
            };
            if rounds > 4 {
                break result;
            }
            println!(
                "{}: {}",
                file.display(),
                serde_json::to_string_pretty(&result)?
            );
            let results: Vec<serde_json::Value> = c
                .tool_calls()
                .map(|call| client_tool(workspace, call))
                .collect();
            let cont = json!({
                "sessionId": c.meta.session_id, "turnId": c.meta.turn_id, "toolResults": results
            });
            request = contract::parse_request(cont.to_string().as_bytes(), &config.limits)
                .map_err(|r| anyhow::anyhow!("building the continuation: {:?}", r.errors))?
                .request;
        };
        let result = result.with_warnings(parsed.warnings);
        all_ok &= result.is_successful();
        println!(
            "{}: {}",
            file.display(),
            serde_json::to_string_pretty(&result)?
        );
    }
    shutdown.cancel();
    let _ = worker_task.await;
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Waits for the next reply about `turn` that is not an intermediate state.
async fn wait_for(
    replies: &mut aptix_worker::queue::Replies,
    turn: &contract::TurnId,
) -> anyhow::Result<TurnStatusView> {
    loop {
        let body = tokio::time::timeout(Duration::from_secs(600), replies.recv())
            .await
            .context("no result within 10 minutes")?
            .context("the reply stream ended")?;
        let view: TurnStatusView = serde_json::from_slice(&body).context("an unreadable reply")?;
        if &view.turn_id == turn {
            return Ok(view);
        }
    }
}

/// A small client of the HTTP API for the CLI commands.
struct ApiClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl ApiClient {
    fn new(base: &str, token: Option<String>) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: base.trim_end_matches('/').to_string(),
            token,
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<(u16, serde_json::Value)> {
        let req = match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach the API at {}", self.base))?;
        let status = resp.status().as_u16();
        let body = resp
            .json()
            .await
            .context("the API answered with something that is not JSON")?;
        Ok((status, body))
    }

    async fn post(&self, path: &str, body: Vec<u8>) -> anyhow::Result<(u16, serde_json::Value)> {
        self.send(
            self.http
                .post(format!("{}{path}", self.base))
                .header("content-type", "application/json")
                .body(body),
        )
        .await
    }

    async fn get(&self, path: &str) -> anyhow::Result<(u16, serde_json::Value)> {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
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
