//! `aptix run`, `aptix serve` and `aptix worker`: the processes that do the work, built through
//! [`App::build`], stopped by SIGTERM or Ctrl-C. `aptix run <files>` is the main job: each file
//! goes through the front door, the queue, a worker and the store as in a deployment, and this
//! process answers the turn's client tools as a client would.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use aptix_worker::app::App;
use aptix_worker::config::Config;
use aptix_worker::contract::{self, AgentExecuteResponse, InvokeResult};
use aptix_worker::delivery::{QueueReader, Waited};
use aptix_worker::frontdoor::http::{self, check_exposure, ops_router};
use aptix_worker::store::TurnStatusView;

use super::workspace::client_tool;

/// Arguments of `aptix run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// AgentExecuteRequest JSON files to run (acting as the client for workspace_read_file).
    pub files: Vec<PathBuf>,
    /// Where client tools (workspace_read_file) read files from.
    #[arg(long, default_value = "examples/workspace")]
    pub workspace: PathBuf,
    /// Address to serve the HTTP API on (default 127.0.0.1:8080 when no files are given).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
}

/// Arguments of `aptix serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Also consume and run turns in this process.
    #[arg(long)]
    pub worker: bool,
}

/// Arguments of `aptix worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// Serve /healthz, /readyz and /metrics on this address.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
}

/// `aptix run`.
pub async fn run(args: RunArgs, config: Config) -> anyhow::Result<ExitCode> {
    let RunArgs {
        files,
        workspace,
        listen,
    } = args;
    if files.is_empty() {
        let listen = listen.unwrap_or_else(default_listen);
        serve_api(listen, true, true, config).await
    } else {
        run_files(&files, &workspace, listen, config).await
    }
}

/// `aptix serve`.
pub async fn serve(args: ServeArgs, config: Config) -> anyhow::Result<ExitCode> {
    serve_api(args.listen, args.worker, false, config).await
}

/// `aptix worker`.
pub async fn worker(args: WorkerArgs, config: Config) -> anyhow::Result<ExitCode> {
    let WorkerArgs { listen } = args;
    if config.broker.url.is_none() {
        anyhow::bail!(
            "APTIX_AMQP_URL is not set: a standalone worker needs RabbitMQ (use `aptix run` for the embedded mode)"
        );
    }
    if config.store.url.is_none() {
        anyhow::bail!(
            "APTIX_REDIS_URL is not set: workers on several machines need a shared Redis"
        );
    }
    let app = App::build(&config).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let ops = match listen {
        Some(addr) => {
            check_exposure(&addr, &config.http.api_tokens)?;
            let listener = aptix_worker::net::listen(addr)
                .with_context(|| format!("cannot listen on {addr}"))?;
            tracing::info!(address = %listener.local_addr()?, "serving /healthz, /readyz and /metrics");
            let router = ops_router(app.http_state(&config));
            Some(tokio::spawn(http::serve(
                listener,
                router,
                shutdown.clone(),
            )))
        }
        None => None,
    };
    // On a task of the runtime, not on this thread (the one `block_on` parks between polls):
    // each delivery would otherwise wake this thread, which would hand the turn's task over
    // to a runtime thread, waking that one too.
    if let Err(e) = app.worker(&config).spawn(shutdown).await {
        tracing::error!(error = %e, "the worker's consume loop ended abnormally");
        return Ok(ExitCode::FAILURE);
    }
    if let Some(ops) = ops {
        let _ = ops.await;
    }
    tracing::info!("worker stopped");
    Ok(ExitCode::SUCCESS)
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}

/// Serves the HTTP API until SIGTERM/Ctrl-C, with a worker in this process when asked.
/// Serves the HTTP API on `listen` (with a worker when `worker`); the console is on when
/// `APTIX_CONSOLE` says so, or by default with `console_by_default` (`aptix run`, so a
/// newcomer finds it).
async fn serve_api(
    listen: SocketAddr,
    worker: bool,
    console_by_default: bool,
    mut config: Config,
) -> anyhow::Result<ExitCode> {
    if console_by_default {
        config.http.console.get_or_insert(true);
    }
    if !worker && !config.tools.sources.sources.is_empty() {
        // A front door runs no turns: its workers connect to the tool sources, it does not.
        tracing::info!(
            "APTIX_TOOLS_FILE is for the workers; this front door does not connect to its sources"
        );
        config.tools.sources = Default::default();
    }
    check_exposure(&listen, &config.http.api_tokens)?;
    if config.broker.url.is_none() && !worker {
        anyhow::bail!(
            "on the embedded in-memory queue nothing else can run the turns: use `aptix run` or add --worker (or set APTIX_AMQP_URL)"
        );
    }
    let app = App::build(&config).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let worker_task = worker.then(|| app.worker(&config).spawn(shutdown.clone()));
    let listener =
        aptix_worker::net::listen(listen).with_context(|| format!("cannot listen on {listen}"))?;
    let address = listener.local_addr()?;
    // Said once the routes are built: from here a request is answered without delay.
    let server = app.spawn_http(&config, listener, shutdown);
    tracing::info!(%address, worker, "HTTP API listening");
    if config.http.console_on() {
        tracing::info!(url = %format!("http://{address}/console"), "console on");
    }
    server.await??;
    if let Some(t) = worker_task {
        let _ = t.await;
    }
    Ok(ExitCode::SUCCESS)
}

/// Cancels `token` on SIGTERM or Ctrl-C.
pub async fn stop_on_signal(token: CancellationToken) {
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

/// The main job: each file becomes a turn that goes through the front door, the queue, a worker
/// and the store, exactly as in a deployment (embedded in-memory parts unless URLs are set);
/// client tool calls for `workspace_read_file` are answered from `workspace`, as a client would.
async fn run_files(
    files: &[PathBuf],
    workspace: &Path,
    listen: Option<SocketAddr>,
    config: Config,
) -> anyhow::Result<ExitCode> {
    let app = App::build(&config).await?;
    let door = app.front_door(&config);
    let shutdown = CancellationToken::new();
    let worker_task = app.worker(&config).spawn(shutdown.clone());
    let server = match listen {
        Some(addr) => {
            check_exposure(&addr, &config.http.api_tokens)?;
            let listener = aptix_worker::net::listen(addr)
                .with_context(|| format!("cannot listen on {addr}"))?;
            let address = listener.local_addr()?;
            let server = app.spawn_http(&config, listener, shutdown.clone());
            tracing::info!(%address, "HTTP API listening while the files run");
            Some(server)
        }
        None => None,
    };

    let mut all_ok = true;
    for file in files {
        let body = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        let parsed = match contract::parse_request(&body, &config.limits.request) {
            Ok(p) => p,
            Err(rejected) => {
                all_ok = false;
                let r: InvokeResult<AgentExecuteResponse> = rejected.into_invoke_result();
                println!("{}: {}", file.display(), serde_json::to_string_pretty(&r)?);
                continue;
            }
        };
        let mut request = parsed.request;
        // Read from the session's reply queue, as a client that subscribes does (the session
        // marked watched, so that workers send its statuses there).
        let mut replies = door
            .delivery()
            .read_reply_queue(request.session_id(), config.broker.reply_queue_ttl)
            .await?;
        // Act as the client for continuations we can serve, a few rounds at most.
        let mut rounds = 0;
        let result = loop {
            if let Err(e) = super::submit_local(&door, &request).await {
                break e.into_invoke_result();
            }
            let view = wait_for(&mut replies, request.turn_id()).await?;
            let Some(result) = view.result else {
                anyhow::bail!("a reply without a result");
            };
            rounds += 1;
            let Some(AgentExecuteResponse::ClientToolContinuation(c)) = result.result() else {
                break result;
            };
            // A question for a person (approving a server tool call) is not ours to answer:
            // the turn is left waiting, and shown as it is.
            let for_a_person = c
                .tool_calls()
                .any(|t| t.name == aptix_worker::mcp::approval::APPROVAL_TOOL);
            if rounds > 4 || for_a_person {
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
            request = contract::parse_request(cont.to_string().as_bytes(), &config.limits.request)
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

/// Waits (up to 10 minutes) for the settled status of `turn` among the session's replies.
async fn wait_for(
    replies: &mut QueueReader,
    turn: &contract::TurnId,
) -> anyhow::Result<TurnStatusView> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    match replies.settled(turn, deadline).await {
        Waited::Settled(view) => Ok(*view),
        Waited::TimedOut => anyhow::bail!("no result within 10 minutes"),
        Waited::Closed => anyhow::bail!("the reply stream ended"),
    }
}
