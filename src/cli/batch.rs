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
use sha2::{Digest as _, Sha256};
use tokio_util::sync::CancellationToken;

use aptix_worker::app::App;
use aptix_worker::config::Config;
use aptix_worker::contract::request::default_id;
use aptix_worker::contract::{AgentExecuteResponse, InvokeResult, text_without_bom};
use aptix_worker::frontdoor::batch::{BatchAccepted, BatchProgress, BatchResultLine};

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
}

/// `aptix batch`.
pub async fn batch(args: BatchArgs) -> anyhow::Result<ExitCode> {
    let BatchArgs {
        input,
        instruction,
        out,
        url,
        token,
        poll_ms,
        index,
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
            let config = Config::from_env()?;
            let app = App::build(&config).await?;
            let shutdown = CancellationToken::new();
            let worker_task = app.worker(&config).spawn(shutdown.clone());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            let server = app.spawn_http(&config, listener, shutdown.clone());
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

/// One input of a batch: its customId and the request (ids filled in by [`assign_ids`]).
struct Item {
    custom_id: String,
    request: Value,
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

/// Reads the inputs of a batch.
fn read_inputs(job: &BatchJob) -> anyhow::Result<Vec<Item>> {
    if job.input.is_dir() {
        let Some(instruction) = &job.instruction else {
            bail!("--instruction is required when the input is a folder");
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(&job.input)
            .with_context(|| format!("reading {}", job.input.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "md"))
            .collect();
        files.sort();
        let mut items = Vec::with_capacity(files.len());
        for path in files {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let contents = read_text(&path)?;
            items.push(Item {
                custom_id: name.clone(),
                request: json!({
                    "instruction": instruction,
                    "inputArtifacts": [{
                        "relativePath": name,
                        "fileName": name,
                        "contents": contents,
                        "origin": "user",
                        "language": "markdown"
                    }]
                }),
            });
        }
        if items.is_empty() {
            bail!("no *.md files in {}", job.input.display());
        }
        return Ok(items);
    }
    let text = read_text(&job.input)?;
    let mut items = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not JSON", job.input.display(), n + 1))?;
        let Some(custom_id) = v["customId"].as_str() else {
            bail!(
                "{} line {}: a string customId is required",
                job.input.display(),
                n + 1
            );
        };
        let mut request = v["request"].clone();
        if let (Some(instruction), Some(obj)) = (&job.instruction, request.as_object_mut()) {
            obj.entry("instruction")
                .or_insert_with(|| Value::String(instruction.clone()));
        }
        items.push(Item {
            custom_id: custom_id.to_string(),
            request,
        });
    }
    Ok(items)
}

/// An input file's text, without the byte order mark it may begin with.
fn read_text(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading {} (inputs must be UTF-8)", path.display()))?;
    Ok(text_without_bom(&text).to_owned())
}

/// Per output folder state: a random salt that makes this folder's turn ids its own, so a
/// re-run after a crash finds the turns it submitted instead of running them again.
fn salt(out: &Path) -> anyhow::Result<String> {
    let file = out.join(".aptix-batch-state.json");
    if let Ok(text) = std::fs::read_to_string(&file)
        && let Ok(v) = serde_json::from_str::<Value>(&text)
        && let Some(s) = v["salt"].as_str()
    {
        return Ok(s.to_string());
    }
    let s = uuid::Uuid::new_v4().simple().to_string();
    std::fs::write(&file, json!({"salt": s}).to_string())
        .with_context(|| format!("writing {}", file.display()))?;
    Ok(s)
}

fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    aptix_worker::hex::lower(&h.finalize()[..12])
}

/// Gives a request stable ids: the same input in the same output folder maps to the same
/// session and turn, and a new attempt after a failure to a new turn.
fn assign_ids(item: &mut Item, salt: &str, attempt: u64) {
    let body = item.request.to_string();
    let sid = format!("batch-{}", short_hash(&[salt, &item.custom_id]));
    let tid = format!("t{attempt}-{}", short_hash(&[salt, &item.custom_id, &body]));
    // Ids the input already has (in either spelling) are kept.
    if let Some(obj) = item.request.as_object_mut() {
        default_id(obj, "sessionId", "SessionId", || sid);
        default_id(obj, "turnId", "TurnId", || tid);
    }
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
    let mut items = read_inputs(job)?;
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
            bar.show(done, pending.len(), failed, p.running, false);
            if p.queued + p.running == 0 {
                if p.awaiting_client_tools == 0 {
                    bar.show(done, pending.len(), failed, 0, true);
                    break;
                }
                // Act as the client for calls it can serve; give up on an item after a few rounds.
                let mut answered = 0;
                for line in result_lines(client, &batch_id).await? {
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
                    let r = rounds.entry(id.clone()).or_default();
                    *r += 1;
                    if *r > job.max_tool_rounds {
                        continue;
                    }
                    let tool_results: Vec<Value> = waiting
                        .tool_calls()
                        .map(|c| client_tool(&workspace, c))
                        .collect();
                    let cont =
                        json!({"sessionId": sid, "turnId": tid, "toolResults": tool_results});
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
                    bar.show(done, pending.len(), failed, 0, true);
                    break;
                }
            }
            tokio::time::sleep(job.poll).await;
        }
        let mut results: BTreeMap<String, BatchResultLine> = result_lines(client, &batch_id)
            .await?
            .into_iter()
            .filter_map(|line| Some((line.custom_id.clone()?, line)))
            .collect();
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
                    .and_then(|r| r.errors().first().map(|e| e.message.clone()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_saved_behind_a_byte_order_mark_are_read_without_it() {
        let root =
            std::env::temp_dir().join(format!("aptix-bom-{}", uuid::Uuid::new_v4().simple()));
        let folder = root.join("docs");
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("a.md"), "\u{feff}# DDR-1 Alpha\n").unwrap();
        let lines = root.join("batch.ndjson");
        std::fs::write(
            &lines,
            "\u{feff}{\"customId\":\"x\",\"request\":{\"instruction\":\"hi\"}}\n",
        )
        .unwrap();
        let job = |input: PathBuf| BatchJob {
            input,
            instruction: Some("Review".into()),
            out: root.join("out"),
            poll: Duration::from_millis(50),
            max_tool_rounds: 1,
        };
        let from_folder = read_inputs(&job(folder)).unwrap();
        assert_eq!(
            from_folder[0].request["inputArtifacts"][0]["contents"],
            "# DDR-1 Alpha\n"
        );
        let from_lines = read_inputs(&job(lines)).unwrap();
        assert_eq!(from_lines[0].custom_id, "x");
        assert_eq!(from_lines[0].request["instruction"], "hi");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn result_files_are_safe_names_inside_the_folder() {
        let out = Path::new("/tmp/out");
        assert_eq!(result_file(out, "ddr-1.md"), out.join("ddr-1.md.json"));
        assert_eq!(result_file(out, "../x/y"), out.join("_x_y.json"));
        assert_eq!(result_file(out, "a b"), out.join("a_b.json"));
        assert_eq!(result_file(out, "..."), out.join("_.json"));
    }

    #[test]
    fn ids_are_stable_per_salt_and_change_per_attempt() {
        let item = || Item {
            custom_id: "a.md".into(),
            request: json!({"instruction": "x"}),
        };
        let (mut a, mut b, mut c, mut d) = (item(), item(), item(), item());
        assign_ids(&mut a, "s1", 0);
        assign_ids(&mut b, "s1", 0);
        assign_ids(&mut c, "s1", 1);
        assign_ids(&mut d, "s2", 0);
        assert_eq!(a.request, b.request);
        assert_eq!(a.request["sessionId"], c.request["sessionId"]);
        assert_ne!(a.request["turnId"], c.request["turnId"]);
        assert_ne!(a.request["sessionId"], d.request["sessionId"]);
        // Ids given in the input are kept, whichever spelling they use.
        let mut given = Item {
            custom_id: "b.md".into(),
            request: json!({"SessionId": "mine", "instruction": "x"}),
        };
        assign_ids(&mut given, "s1", 0);
        assert_eq!(given.request["SessionId"], "mine");
        assert!(given.request.get("sessionId").is_none());
        assert!(given.request["turnId"].as_str().unwrap().starts_with("t0-"));
    }
}
