//! The `aptix` binary: configuration, telemetry, and the subcommands. Kept thin; the work is in
//! the library.

use std::io::Read as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use serde_json::json;

use aptix_worker::catalog::ModeCatalog;
use aptix_worker::client::{ApiClient, BatchJob, client_tool, repo_name, run_batch, upload_index};
use aptix_worker::config::{ApiTokens, Config, LOCAL_TENANT};
use aptix_worker::contract::{self, AgentExecuteResponse, InvokeResult};
use aptix_worker::fake_llm::{FakeLlm, FakeOptions, create_response_validator};
use aptix_worker::frontdoor::http::{
    HttpState, check_exposure, openapi, ops_router, router, serve,
};
use aptix_worker::frontdoor::{FrontDoor, SubmitError};
use aptix_worker::llm::LlmClient;
use aptix_worker::metrics::Metrics;
use aptix_worker::pipeline::{Pipeline, PipelineSettings};
use aptix_worker::queue::{Broker, MemoryBroker, RabbitBroker, Topology};
use aptix_worker::rag::{Bm25Retriever, ChunkIndex, ChunkOptions, MemoryIndex, RedisIndex};
use aptix_worker::store::{MemoryStore, RedisStore, SessionStore, TurnStatusView};
use aptix_worker::telemetry::{self, LogFormat};
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
    /// Front door and worker in one process (embedded in-memory queue and store unless
    /// APTIX_AMQP_URL / APTIX_REDIS_URL are set; the built-in fake model unless
    /// APTIX_LLM_BASE_URL or OPENAI_API_KEY is set). Serves the HTTP API until SIGTERM/Ctrl-C;
    /// given request files, runs them in order instead and exits.
    Run {
        /// AgentExecuteRequest JSON files to run (acting as the client for workspace_read_file).
        files: Vec<PathBuf>,
        /// Where client tools (workspace_read_file) read files from.
        #[arg(long, default_value = "examples/workspace")]
        workspace: PathBuf,
        /// Address to serve the HTTP API on (default 127.0.0.1:8080 when no files are given).
        #[arg(long)]
        listen: Option<SocketAddr>,
    },
    /// Serve the HTTP API (front door). With --worker, also run a worker in this process
    /// (required on the embedded in-memory queue; `aptix run` is the same).
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Also consume and run turns in this process.
        #[arg(long)]
        worker: bool,
    },
    /// Run a worker: consume turn jobs from RabbitMQ (APTIX_AMQP_URL) until SIGTERM/Ctrl-C.
    Worker {
        /// Serve /healthz, /readyz and /metrics on this address.
        #[arg(long)]
        listen: Option<SocketAddr>,
    },
    /// Run a folder of *.md documents (or an NDJSON file of {"customId","request"} lines) as a
    /// batch through the HTTP API: one new session per input, a progress bar, one result file
    /// per input plus summary.json. Re-running skips inputs that already completed. Without
    /// --url (or APTIX_URL), runs an embedded server in this process.
    Batch {
        /// A folder of *.md files, or an .ndjson file.
        input: PathBuf,
        /// The instruction every document is sent with.
        #[arg(long)]
        instruction: Option<String>,
        /// Where results go (default: aptix-results/<input name>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// The API's base URL (default: an embedded server).
        #[arg(long, env = "APTIX_URL")]
        url: Option<String>,
        /// Bearer token.
        #[arg(long, env = "APTIX_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// How often progress is polled, in milliseconds.
        #[arg(long, default_value_t = 500)]
        poll_ms: u64,
        /// Index this folder first, so turns see related documents in their context.
        #[arg(long)]
        index: Option<PathBuf>,
    },
    /// Print the OpenAPI document of the HTTP API.
    Openapi,
    /// Index a folder for retrieval (Markdown by heading, code by lines): through the HTTP API
    /// with --url, else straight into Redis (APTIX_REDIS_URL). Unchanged files are skipped,
    /// changed ones re-chunked, files gone from the folder removed.
    Index {
        /// The folder.
        folder: PathBuf,
        /// The repository name chunks carry (default: the folder's name).
        #[arg(long)]
        repo: Option<String>,
        /// A tag for every chunk (repeatable).
        #[arg(long = "tag")]
        tags: Vec<String>,
        /// The API's base URL.
        #[arg(long, env = "APTIX_URL")]
        url: Option<String>,
        /// Bearer token.
        #[arg(long, env = "APTIX_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// The tenant whose index to write when writing straight to Redis (required when
        /// APTIX_API_TOKENS is set; otherwise `local`, the tenant of an API without tokens).
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Enqueue request files through the front door (prints each accepted turn's status).
    Enqueue {
        /// AgentExecuteRequest JSON files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print a session's turn results as the HTTP API publishes them (Server-Sent Events;
    /// Ctrl-C stops).
    Watch {
        /// The session id.
        session_id: String,
        /// The API's base URL.
        #[arg(long, env = "APTIX_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Bearer token.
        #[arg(long, env = "APTIX_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Stop after this many events.
        #[arg(long)]
        count: Option<usize>,
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
    /// Measure indexing and BM25 queries on a synthetic corpus (memory, and Redis when
    /// APTIX_REDIS_URL is set) against baselines measured in the same run.
    BenchRag {
        /// Files in the corpus.
        #[arg(long, default_value_t = 500)]
        files: usize,
        /// Sections (chunks) per file.
        #[arg(long, default_value_t = 8)]
        sections: usize,
        /// Queries timed per index.
        #[arg(long, default_value_t = 300)]
        queries: usize,
    },
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
    aptix_worker::tls::install_crypto_provider();
    let matches = Cli::command().get_matches();
    let service = matches.subcommand_name().unwrap_or("cli").to_string();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // Client commands keep stderr for their own progress unless RUST_LOG asks for more.
    let default_level = match cli.command {
        Command::Batch { .. }
        | Command::Submit { .. }
        | Command::Status { .. }
        | Command::Watch { .. }
        | Command::Validate { .. } => "warn",
        _ => "info",
    };
    let format = match LogFormat::parse(std::env::var("APTIX_LOG_FORMAT").ok().as_deref()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Span export (when asked for) sends from the runtime, so it is set up inside it.
    let telemetry = {
        let _inside = runtime.enter();
        match telemetry::init(format, default_level, &format!("aptix-{service}")) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    };
    let code = runtime.block_on(run(cli));
    // Flush the spans still queued while the runtime that sends them is alive.
    {
        let _inside = runtime.enter();
        telemetry.shutdown();
    }
    match code {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run {
            files,
            workspace,
            listen,
        } => {
            if files.is_empty() {
                let listen = listen.unwrap_or_else(default_listen);
                serve_api(listen, true).await
            } else {
                run_files(&files, &workspace, listen).await
            }
        }
        Command::Serve { listen, worker } => serve_api(listen, worker).await,
        Command::Batch {
            input,
            instruction,
            out,
            url,
            token,
            poll_ms,
            index,
        } => {
            let out = out.unwrap_or_else(|| {
                let name = input
                    .file_stem()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "batch".into());
                PathBuf::from("aptix-results").join(name)
            });
            let job = BatchJob {
                input,
                instruction,
                out,
                poll: Duration::from_millis(poll_ms.max(10)),
                max_tool_rounds: 4,
            };
            // Without a URL, an embedded server on a free loopback port does the work.
            let mut embedded = None;
            let url = match url {
                Some(u) => u,
                None => {
                    let config = Config::from_env()?;
                    let app = App::build(&config).await?;
                    let shutdown = CancellationToken::new();
                    let worker_task = app.worker(&config).spawn(shutdown.clone());
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                    let addr = listener.local_addr()?;
                    let router = router(app.http_state(&config));
                    let server = tokio::spawn(serve(listener, router, shutdown.clone()));
                    eprintln!("no --url given: running an embedded server at http://{addr}");
                    embedded = Some((shutdown, worker_task, server, app));
                    format!("http://{addr}")
                }
            };
            let client = ApiClient::new(&url, token);
            let indexed = match &index {
                Some(folder) => upload_index(&client, folder, &repo_name(folder, None), &[])
                    .await
                    .map(|r| {
                        eprintln!(
                            "indexed {}: {} file(s) ({} new or changed, {} chunk(s)), {} removed",
                            folder.display(),
                            r.files,
                            r.indexed,
                            r.chunks,
                            r.removed
                        )
                    }),
                None => Ok(()),
            };
            let outcome = match indexed {
                Ok(()) => run_batch(&client, &job).await,
                Err(e) => Err(e),
            };
            if let Some((shutdown, worker_task, server, _app)) = embedded {
                shutdown.cancel();
                let _ = worker_task.await;
                let _ = server.await;
            }
            let outcome = outcome?;
            println!(
                "{} input(s): {} completed now, {} already done, {} failed; results in {}",
                outcome.total,
                outcome.completed,
                outcome.skipped,
                outcome.failed.len(),
                job.out.display()
            );
            if outcome.failed.is_empty() {
                return Ok(ExitCode::SUCCESS);
            }
            println!("failed:");
            for (id, why) in &outcome.failed {
                println!("  {id}: {why}");
            }
            Ok(ExitCode::FAILURE)
        }
        Command::Index {
            folder,
            repo,
            tags,
            url,
            token,
            tenant,
        } => {
            let repo = repo_name(&folder, repo);
            let report = match url {
                Some(url) => {
                    let client = ApiClient::new(&url, token);
                    upload_index(&client, &folder, &repo, &tags).await?
                }
                None => {
                    let config = Config::from_env()?;
                    let Some(redis) = &config.redis_url else {
                        anyhow::bail!(
                            "nothing to index into: pass --url of a running server (the embedded in-memory index lives inside it) or set APTIX_REDIS_URL"
                        );
                    };
                    let tenant = index_tenant(tenant, &config.api_tokens)?;
                    let index = RedisIndex::connect_with(
                        redis.expose(),
                        &config.namespace,
                        &redis_options(&config),
                    )
                    .await?;
                    let opts = ChunkOptions {
                        max_lines: config.chunk_lines,
                    };
                    let mut shown = std::time::Instant::now();
                    aptix_worker::rag::index_folder(
                        &index,
                        &tenant,
                        &repo,
                        &folder,
                        &tags,
                        opts,
                        |done, all| {
                            if done == all || shown.elapsed() >= Duration::from_secs(1) {
                                eprintln!("indexing {}: {done}/{all} file(s)", folder.display());
                                shown = std::time::Instant::now();
                            }
                        },
                    )
                    .await?
                }
            };
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Openapi => {
            println!("{}", serde_json::to_string_pretty(&openapi())?);
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
            let broker = RabbitBroker::new(url.expose(), topology, "aptix-dlq")
                .with_timeout(config.dependency_timeout)
                .with_tls_ca(config.tls_ca.clone());
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
        Command::Worker { listen } => {
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
            let ops = match listen {
                Some(addr) => {
                    check_exposure(&addr, &config.api_tokens).map_err(anyhow::Error::msg)?;
                    let listener = tokio::net::TcpListener::bind(addr)
                        .await
                        .with_context(|| format!("cannot listen on {addr}"))?;
                    tracing::info!(address = %listener.local_addr()?, "serving /healthz, /readyz and /metrics");
                    let router = ops_router(app.http_state(&config));
                    Some(tokio::spawn(serve(listener, router, shutdown.clone())))
                }
                None => None,
            };
            app.worker(&config).run(shutdown).await;
            if let Some(ops) = ops {
                let _ = ops.await;
            }
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
        Command::Watch {
            session_id,
            url,
            token,
            count,
        } => {
            let client = ApiClient::new(&url, token);
            let shutdown = CancellationToken::new();
            tokio::spawn(stop_on_signal(shutdown.clone()));
            let mut seen = 0usize;
            let subscribed = || eprintln!("watching session {session_id}; Ctrl-C stops");
            let watch = client.watch(&session_id, subscribed, |data| {
                println!("{data}");
                seen += 1;
                count.is_none_or(|c| seen < c)
            });
            tokio::select! {
                _ = shutdown.cancelled() => {}
                r = watch => r?,
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
                Some(p) => Some(create_response_validator(&p).map_err(anyhow::Error::msg)?),
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
        Command::BenchRag {
            files,
            sections,
            queries,
        } => {
            let config = Config::from_env()?;
            let opts = aptix_worker::rag::bench::RagBenchOptions {
                files,
                sections,
                queries,
            };
            aptix_worker::rag::bench::run(config.redis_url.as_ref().map(|u| u.expose()), opts)
                .await?;
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
    metrics: Arc<Metrics>,
    index: Arc<dyn ChunkIndex>,
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
        let metrics = Arc::new(Metrics::new());
        let llm = LlmClient::from_config(config, &base_url)?.with_metrics(metrics.clone());
        let store: Arc<dyn SessionStore> = match &config.redis_url {
            Some(url) => {
                tracing::info!(namespace = %config.namespace, "using the Redis session store");
                Arc::new(
                    RedisStore::connect_with(
                        url.expose(),
                        &config.namespace,
                        config.retention,
                        &redis_options(config),
                    )
                    .await?,
                )
            }
            None => Arc::new(MemoryStore::new()),
        };
        let mut topology = Topology::new(&config.namespace);
        topology.reply_queue_ttl = config.reply_queue_ttl;
        let broker: Arc<dyn Broker> = match &config.amqp_url {
            Some(url) => {
                let name = format!("aptix-{}", uuid::Uuid::new_v4().simple());
                let rabbit = RabbitBroker::new(url.expose(), topology.clone(), &name)
                    .with_timeout(config.dependency_timeout)
                    .with_tls_ca(config.tls_ca.clone());
                rabbit.connect().await?;
                tracing::info!(namespace = %config.namespace, "using RabbitMQ");
                Arc::new(rabbit)
            }
            None => Arc::new(MemoryBroker::new()),
        };
        let index: Arc<dyn ChunkIndex> = match &config.redis_url {
            Some(url) => Arc::new(
                RedisIndex::connect_with(url.expose(), &config.namespace, &redis_options(config))
                    .await?,
            ),
            None => Arc::new(MemoryIndex::new()),
        };
        let mut settings = PipelineSettings::new(config.model.clone());
        settings.max_iterations = config.max_iterations;
        settings.replay = config.llm_replay;
        settings.lease_ttl = config.lease;
        let pipeline = Pipeline::new(store.clone(), catalog.clone(), llm, settings)
            .map_err(anyhow::Error::msg)?
            .with_metrics(metrics.clone())
            .with_rag(
                Arc::new(Bm25Retriever::new(index.clone())),
                config.rag_budget,
            );
        Ok(Self {
            catalog,
            store,
            broker,
            pipeline,
            topology,
            metrics,
            index,
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
        .with_metrics(self.metrics.clone())
    }

    fn front_door(&self, config: &Config) -> FrontDoor {
        FrontDoor::new(self.store.clone(), self.broker.clone(), config.limits)
            .with_contexts(self.pipeline.known_contexts())
            .with_metrics(self.metrics.clone())
    }

    fn http_state(&self, config: &Config) -> HttpState {
        HttpState {
            door: self.front_door(config),
            store: self.store.clone(),
            broker: self.broker.clone(),
            catalog: self.catalog.clone(),
            tokens: config.api_tokens.clone(),
            limits: config.limits,
            batch_limits: config.batch_limits,
            metrics: self.metrics.clone(),
            index: self.index.clone(),
            chunk_options: ChunkOptions {
                max_lines: config.chunk_lines,
            },
        }
    }
}

/// How this process connects to Redis.
fn redis_options(config: &Config) -> aptix_worker::store::redis::RedisOptions {
    aptix_worker::store::redis::RedisOptions {
        timeout: config.dependency_timeout,
        ca: config.tls_ca.clone(),
    }
}

/// The tenant `aptix index` writes to when it writes straight to Redis: one an authenticated
/// caller can read. With tokens configured, `local` (what an API without tokens uses) would be
/// an index nobody can see, so the tenant must be named, and be one of the configured ones.
fn index_tenant(asked: Option<String>, tokens: &ApiTokens) -> anyhow::Result<String> {
    if tokens.is_empty() {
        return Ok(asked.unwrap_or_else(|| LOCAL_TENANT.to_string()));
    }
    let tenants = tokens.tenants();
    match asked {
        Some(t) if tenants.contains(&t.as_str()) => Ok(t),
        Some(t) => anyhow::bail!(
            "--tenant {t:?} is not a tenant of APTIX_API_TOKENS, so no caller could read its index; configured tenants: {}",
            tenants.join(", ")
        ),
        None => anyhow::bail!(
            "APTIX_API_TOKENS is set, so the index must belong to one of its tenants: pass --tenant <name> (configured tenants: {})",
            tenants.join(", ")
        ),
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}

/// Serves the HTTP API until SIGTERM/Ctrl-C, with a worker in this process when asked.
async fn serve_api(listen: SocketAddr, worker: bool) -> anyhow::Result<ExitCode> {
    let config = Config::from_env()?;
    check_exposure(&listen, &config.api_tokens).map_err(anyhow::Error::msg)?;
    if config.amqp_url.is_none() && !worker {
        anyhow::bail!(
            "on the embedded in-memory queue nothing else can run the turns: use `aptix run` or add --worker (or set APTIX_AMQP_URL)"
        );
    }
    let app = App::build(&config).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let worker_task = worker.then(|| app.worker(&config).spawn(shutdown.clone()));
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    tracing::info!(address = %listener.local_addr()?, worker, "HTTP API listening");
    serve(listener, router(app.http_state(&config)), shutdown).await?;
    if let Some(t) = worker_task {
        let _ = t.await;
    }
    Ok(ExitCode::SUCCESS)
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
async fn run_files(
    files: &[PathBuf],
    workspace: &Path,
    listen: Option<SocketAddr>,
) -> anyhow::Result<ExitCode> {
    let config = Config::from_env()?;
    let app = App::build(&config).await?;
    let door = app.front_door(&config);
    let shutdown = CancellationToken::new();
    let worker_task = app.worker(&config).spawn(shutdown.clone());
    let server = match listen {
        Some(addr) => {
            check_exposure(&addr, &config.api_tokens).map_err(anyhow::Error::msg)?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?;
            tracing::info!(address = %listener.local_addr()?, "HTTP API listening while the files run");
            let router = router(app.http_state(&config));
            Some(tokio::spawn(serve(listener, router, shutdown.clone())))
        }
        None => None,
    };

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
                .map(|call| client_tool(workspace, &serde_json::to_value(call).unwrap_or_default()))
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
    if let Some(server) = server {
        let _ = server.await;
    }
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
