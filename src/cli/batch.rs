//! `aptix batch`: a folder of documents (or an NDJSON file of requests) run as one batch
//! through the HTTP API — one new session per input, a progress bar, one result file per input
//! plus `summary.json`, resumable: a re-run skips inputs that already have a result.
//!
//! Owns: the client side of a batch. Must not: reach RabbitMQ or Redis; without `--url` it
//! starts an embedded server and still talks HTTP to it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use aptix_worker::app::App;
use aptix_worker::config::{Config, Sources};
use aptix_worker::contract::{AgentExecuteResponse, InvokeResult};
use aptix_worker::frontdoor::batch::{BatchAccepted, BatchProgress, BatchResultLine};
use aptix_worker::mcp::approval::{APPROVAL_TOOL, Asked};

use super::batch_inputs::{assign_ids, read_inputs, salt};
use super::client::ApiClient;
use super::index::{repo_name, upload_index};
use super::progress::ProgressBar;
use super::workspace::client_tool;

/// Arguments of `aptix batch`.
#[derive(Debug, clap::Args)]
pub struct BatchArgs {
    /// A folder of *.md files, or an .ndjson file.
    pub input: PathBuf,
    /// The instruction every document is sent with.
    #[arg(long)]
    pub instruction: Option<String>,
    /// Where results go (default: aptix-results/<input name>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The API's base URL (default: an embedded server).
    #[arg(long, env = "APTIX_URL")]
    pub url: Option<String>,
    /// Bearer token.
    #[arg(long, env = "APTIX_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// How often progress is polled, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub poll_ms: u64,
    /// Index this folder first, so turns see related documents in their context.
    #[arg(long)]
    pub index: Option<PathBuf>,
    /// How long to keep trying when the API cannot be reached or answers 502, 503 or 504 (a
    /// front door restarting, RabbitMQ or Redis failing over), in seconds; 0 gives up at once.
    /// The batch goes on on the server meanwhile.
    #[arg(long, default_value_t = 300)]
    pub retry_for_secs: u64,
}

/// `aptix batch`.
pub async fn batch(args: BatchArgs, sources: &Sources<'_>) -> anyhow::Result<ExitCode> {
    let BatchArgs {
        input,
        instruction,
        out,
        url,
        token,
        poll_ms,
        index,
        retry_for_secs,
    } = args;
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
            let mut config = Config::read(sources)?;
            // A newcomer's first command: its server shows the console too (unless told not).
            config.http.console.get_or_insert(true);
            let app = App::build(&config).await?;
            let shutdown = CancellationToken::new();
            let worker_task = app.worker(&config).spawn(shutdown.clone());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            let server = app.spawn_http(&config, listener, shutdown.clone());
            eprintln!("no --url given: running an embedded server at http://{addr}");
            if config.http.console_on() {
                eprintln!("its console, while the batch runs: http://{addr}/console");
            }
            embedded = Some((shutdown, worker_task, server, app));
            format!("http://{addr}")
        }
    };
    // Every request of a batch is safe to send again: its turns are named by their ids.
    let client = ApiClient::new(&url, token).with_patience(Duration::from_secs(retry_for_secs));
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

/// What `aptix batch` works on.
#[derive(Debug, Clone)]
pub struct BatchJob {
    /// A folder of `*.md` files, or an NDJSON file of `{"customId", "request"}` lines.
    pub input: PathBuf,
    /// The instruction every folder input gets (required for a folder).
    pub instruction: Option<String>,
    /// Where result files and the summary go.
    pub out: PathBuf,
    /// How often progress is polled.
    pub poll: Duration,
    /// Client tool rounds answered per item before giving up on it.
    pub max_tool_rounds: u32,
}

/// What a batch run ended with.
#[derive(Debug, Clone, Default)]
pub struct BatchOutcome {
    /// Inputs found.
    pub total: usize,
    /// Inputs skipped because they already had a result.
    pub skipped: usize,
    /// Inputs that completed in this run.
    pub completed: usize,
    /// Inputs that failed (customId, why).
    pub failed: Vec<(String, String)>,
}

/// The result file of an input: its customId made safe as a file name, plus `.json`.
pub fn result_file(out: &Path, custom_id: &str) -> PathBuf {
    let safe: String = custom_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let safe = safe.trim_start_matches('.');
    let safe = if safe.is_empty() { "_" } else { safe };
    out.join(format!("{safe}.json"))
}

/// What a result file holds: the API's result line, the batch it came from and the attempt
/// (a re-run submits failed inputs again, as attempt 1, 2, …).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct SavedResult<'a> {
    #[serde(flatten)]
    line: &'a BatchResultLine,
    batch_id: &'a str,
    attempt: u64,
}

/// What a re-run needs of an earlier result file.
#[derive(serde::Deserialize)]
struct PreviousResult {
    status: String,
    #[serde(default)]
    attempt: u64,
}

/// The batch's result lines, read as the crate's own type.
async fn result_lines(client: &ApiClient, batch_id: &str) -> anyhow::Result<Vec<BatchResultLine>> {
    client
        .get_ndjson(&format!("/v1/batches/{batch_id}/results"))
        .await?
        .into_iter()
        .map(|line| serde_json::from_value(line).context("a batch result line cannot be read"))
        .collect()
}

/// Runs a batch through the API: submits the inputs without a result as one batch, shows
/// progress, answers `workspace_read_file` calls from the input folder, writes one result file
/// per input and `summary.json`, and reports what failed.
pub async fn run_batch(client: &ApiClient, job: &BatchJob) -> anyhow::Result<BatchOutcome> {
    let mut items = read_inputs(&job.input, job.instruction.as_deref())?;
    std::fs::create_dir_all(&job.out).with_context(|| format!("creating {}", job.out.display()))?;
    let salt = salt(&job.out)?;
    let mut outcome = BatchOutcome {
        total: items.len(),
        ..BatchOutcome::default()
    };
    // Every input needs a result file of its own.
    let mut seen = std::collections::HashMap::new();
    for item in &items {
        let file = result_file(&job.out, &item.custom_id);
        if let Some(other) = seen.insert(file.clone(), item.custom_id.clone()) {
            bail!(
                "customIds {other:?} and {:?} would share the result file {}; make them differ in letters or digits",
                item.custom_id,
                file.display()
            );
        }
    }
    // Resume: an input with a completed result is done; one that failed gets a new attempt.
    let mut pending = Vec::new();
    for mut item in items.drain(..) {
        let file = result_file(&job.out, &item.custom_id);
        let previous: Option<PreviousResult> = std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        match previous {
            Some(p) if p.status == "completed" => outcome.skipped += 1,
            Some(p) => {
                let attempt = p.attempt + 1;
                assign_ids(&mut item, &salt, attempt);
                pending.push((item, attempt));
            }
            None => {
                assign_ids(&mut item, &salt, 0);
                pending.push((item, 0));
            }
        }
    }
    if outcome.skipped > 0 {
        eprintln!(
            "{} of {} input(s) already have a result in {}; skipping them",
            outcome.skipped,
            outcome.total,
            job.out.display()
        );
    }
    let attempts: BTreeMap<String, u64> = pending
        .iter()
        .map(|(i, a)| (i.custom_id.clone(), *a))
        .collect();
    if !pending.is_empty() {
        let body: String = pending
            .iter()
            .map(|(i, _)| json!({"customId": i.custom_id, "request": i.request}).to_string() + "\n")
            .collect();
        let resp = client
            .request(reqwest::Method::POST, "/v1/batches")
            .header("content-type", "application/x-ndjson")
            .body(body);
        let (status, answer) = client.send(resp).await?;
        if status != 202 {
            bail!(
                "the API refused the batch ({status}): {}",
                serde_json::to_string_pretty(&answer).unwrap_or_default()
            );
        }
        let accepted: InvokeResult<BatchAccepted> =
            serde_json::from_value(answer).context("the API's 202 is not a batch")?;
        let accepted = accepted
            .result()
            .context("the API accepted the batch without saying which")?;
        let batch_id = accepted.batch_id.clone();
        eprintln!(
            "batch {batch_id}: {} submitted, {} accepted",
            pending.len(),
            accepted.accepted
        );
        let workspace = if job.input.is_dir() {
            job.input.clone()
        } else {
            job.input
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default()
        };
        // Accepted: from here on a failure leaves the batch running on the server.
        let followed = follow(client, &batch_id, pending.len(), &workspace, job).await;
        let mut results = followed.with_context(|| {
            format!(
                "batch {batch_id} goes on on the server without this command: run it again with the same arguments to collect its results"
            )
        })?;
        for (item, _) in &pending {
            let line = results
                .remove(&item.custom_id)
                .unwrap_or_else(|| BatchResultLine {
                    custom_id: Some(item.custom_id.clone()),
                    line: 0,
                    session_id: None,
                    turn_id: None,
                    status: "missing".to_string(),
                    result: None,
                });
            let saved = SavedResult {
                line: &line,
                batch_id: &batch_id,
                attempt: attempts.get(&item.custom_id).copied().unwrap_or(0),
            };
            let file = result_file(&job.out, &item.custom_id);
            std::fs::write(&file, serde_json::to_string_pretty(&saved)? + "\n")
                .with_context(|| format!("writing {}", file.display()))?;
            if line.status == "completed" {
                outcome.completed += 1;
            } else {
                let why = line
                    .result
                    .as_ref()
                    .and_then(|r| {
                        r.errors()
                            .first()
                            .map(|e| e.message.clone())
                            .or_else(|| awaiting_approval(&line, r))
                    })
                    .unwrap_or_else(|| format!("status {}", line.status));
                outcome.failed.push((item.custom_id.clone(), why));
            }
        }
    }
    let summary = json!({
        "input": job.input,
        "total": outcome.total,
        "skipped": outcome.skipped,
        "completed": outcome.completed,
        "failed": outcome.failed.iter().map(|(id, why)| json!({"customId": id, "reason": why})).collect::<Vec<_>>(),
    });
    let file = job.out.join("summary.json");
    std::fs::write(&file, serde_json::to_string_pretty(&summary)? + "\n")
        .with_context(|| format!("writing {}", file.display()))?;
    Ok(outcome)
}

/// For a line whose turn waits for a person's approval of server tool calls: what it waits
/// for, and how to answer.
fn awaiting_approval(
    line: &BatchResultLine,
    result: &InvokeResult<AgentExecuteResponse>,
) -> Option<String> {
    let Some(AgentExecuteResponse::ClientToolContinuation(waiting)) = result.result() else {
        return None;
    };
    let asked: Vec<String> = waiting
        .tool_calls()
        .filter_map(aptix_worker::mcp::approval::asked)
        .map(|asked| match asked {
            Asked::Server { tool, .. } => tool,
            Asked::Hosted { source, tool } => format!("{tool} ({source})"),
        })
        .collect();
    (!asked.is_empty()).then(|| {
        format!(
            "waits for a person's approval of {} (answer {APPROVAL_TOOL} for session {} turn {}: see docs/tools.md)",
            asked.join(", "),
            line.session_id.as_ref().map_or("?", |s| s.client_id()),
            line.turn_id.as_ref().map_or("?", |t| t.as_str()),
        )
    })
}

/// Follows an accepted batch of `expected` items until none is queued or running, showing
/// progress and answering the `workspace_read_file` calls it can from `workspace` (for the
/// job's `max_tool_rounds` rounds per item, polling at its pace); the result lines by customId.
async fn follow(
    client: &ApiClient,
    batch_id: &str,
    expected: usize,
    workspace: &Path,
    job: &BatchJob,
) -> anyhow::Result<BTreeMap<String, BatchResultLine>> {
    let mut rounds: BTreeMap<String, u32> = BTreeMap::new();
    let mut bar = ProgressBar::new();
    loop {
        let (status, answer) = client.get(&format!("/v1/batches/{batch_id}")).await?;
        if status != 200 {
            bail!("GET /v1/batches/{batch_id} answered {status}: {answer}");
        }
        let progress: InvokeResult<BatchProgress> =
            serde_json::from_value(answer).context("the batch's progress cannot be read")?;
        let p = progress
            .result()
            .context("the API answered without the batch's progress")?;
        let failed = p.failed + p.rejected + p.expired;
        let done = p.completed + failed;
        bar.show(done, expected, failed, p.running, false);
        if p.queued + p.running == 0 {
            if p.awaiting_client_tools == 0 {
                bar.show(done, expected, failed, 0, true);
                break;
            }
            // Act as the client for calls it can serve; give up on an item after a few rounds.
            let mut answered = 0;
            for line in result_lines(client, batch_id).await? {
                let (Some(id), Some(sid), Some(tid)) =
                    (&line.custom_id, &line.session_id, &line.turn_id)
                else {
                    continue;
                };
                let Some(AgentExecuteResponse::ClientToolContinuation(waiting)) =
                    line.result.as_ref().and_then(InvokeResult::result)
                else {
                    continue;
                };
                // A question for a person (the approval of a server tool call) is not this
                // command's to answer: the line waits, and is listed as waiting for it.
                if waiting.tool_calls().any(|c| c.name == APPROVAL_TOOL) {
                    continue;
                }
                let r = rounds.entry(id.clone()).or_default();
                *r += 1;
                if *r > job.max_tool_rounds {
                    continue;
                }
                let tool_results: Vec<Value> = waiting
                    .tool_calls()
                    .map(|c| client_tool(workspace, c))
                    .collect();
                let cont = json!({"sessionId": sid, "turnId": tid, "toolResults": tool_results});
                let (status, answer) = client
                    .post("/v1/turns", cont.to_string().into_bytes())
                    .await?;
                if status != 202 {
                    tracing::warn!(%status, %answer, "a continuation was refused");
                } else {
                    answered += 1;
                }
            }
            if answered == 0 {
                bar.show(done, expected, failed, 0, true);
                break;
            }
        }
        tokio::time::sleep(job.poll).await;
    }
    Ok(result_lines(client, batch_id)
        .await?
        .into_iter()
        .filter_map(|line| Some((line.custom_id.clone()?, line)))
        .collect::<BTreeMap<String, BatchResultLine>>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_files_are_safe_names_inside_the_folder() {
        let out = Path::new("/tmp/out");
        assert_eq!(result_file(out, "ddr-1.md"), out.join("ddr-1.md.json"));
        assert_eq!(result_file(out, "../x/y"), out.join("_x_y.json"));
        assert_eq!(result_file(out, "a b"), out.join("a_b.json"));
        assert_eq!(result_file(out, "..."), out.join("_.json"));
    }
}
