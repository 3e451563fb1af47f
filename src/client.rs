//! A client of the HTTP API, used by the CLI commands (`submit`, `status`, `watch`, `batch`).
//!
//! Owns: talking to a running front door over HTTP, and the batch workflow on the client side
//! (inputs → one batch → progress → one result file per input, resumable). Must not: reach
//! RabbitMQ or Redis directly; everything goes through the API a remote user would use.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::catalog::READ_FILE_TOOL;
use crate::contract::request::{RelativePath, default_id};

/// A small client of the HTTP API.
#[derive(Debug, Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl ApiClient {
    /// A client of the API at `base` (e.g. `http://127.0.0.1:8080`).
    pub fn new(base: &str, token: Option<String>) -> Self {
        Self {
            http: {
                crate::tls::install_crypto_provider();
                reqwest::Client::new()
            },
            base: base.trim_end_matches('/').to_string(),
            token,
        }
    }

    /// The API's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<(u16, Value)> {
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

    /// POSTs a JSON body; returns the HTTP status and the JSON answer.
    pub async fn post(&self, path: &str, body: Vec<u8>) -> anyhow::Result<(u16, Value)> {
        self.send(
            self.request(reqwest::Method::POST, path)
                .header("content-type", "application/json")
                .body(body),
        )
        .await
    }

    /// GETs a JSON answer.
    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, Value)> {
        self.send(self.request(reqwest::Method::GET, path)).await
    }

    /// Follows a session's Server-Sent Events, calling `on_event` with each event's data until
    /// the stream ends or `on_event` returns `false`. `on_subscribed` runs once the server has
    /// subscribed (it answers only then), so nothing published afterwards is missed.
    pub async fn watch(
        &self,
        session_id: &str,
        on_subscribed: impl FnOnce(),
        mut on_event: impl FnMut(&str) -> bool,
    ) -> anyhow::Result<()> {
        let resp = self
            .request(
                reqwest::Method::GET,
                &format!("/v1/sessions/{session_id}/events"),
            )
            .header("accept", "text/event-stream")
            .send()
            .await
            .with_context(|| format!("cannot reach the API at {}", self.base))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            bail!("the API refused the subscription ({status}): {body}");
        }
        on_subscribed();
        let mut stream = resp.bytes_stream();
        let mut decoder = SseDecoder::default();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.context("the event stream broke")?;
            for data in decoder.push(&chunk) {
                if !on_event(&data) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// GETs an NDJSON answer as one JSON value per line.
    pub async fn get_ndjson(&self, path: &str) -> anyhow::Result<Vec<Value>> {
        let resp = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .with_context(|| format!("cannot reach the API at {}", self.base))?;
        let status = resp.status();
        let text = resp.text().await.context("reading the answer")?;
        if !status.is_success() {
            bail!("GET {path} answered {status}: {text}");
        }
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).context("an answer line is not JSON"))
            .collect()
    }
}

/// Runs one client tool call the way the IDE extension would: `workspace_read_file` reads from
/// `workspace`; other tools are reported as not implemented by this client.
pub fn client_tool(workspace: &Path, call: &Value) -> Value {
    let id = call["toolCallId"].as_str().unwrap_or_default();
    let name = call["name"].as_str().unwrap_or_default();
    let fail = |msg: String| json!({"toolCallId": id, "executionMs": 0, "errorMessage": msg});
    if name != READ_FILE_TOOL {
        return fail(format!("this client does not implement {name}"));
    }
    let started = Instant::now();
    let args: Value = call["argumentsJson"]
        .as_str()
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or_default();
    let Some(path) = args.get("path").and_then(Value::as_str) else {
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
            "executionMs": u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "resultJson": json!({"path": path, "contents": text}).to_string(),
        }),
        Err(e) => fail(format!("cannot read {path}: {e}")),
    }
}

/// The repository name for a folder: `explicit`, else the folder's own name.
pub fn repo_name(folder: &Path, explicit: Option<String>) -> String {
    explicit.unwrap_or_else(|| {
        std::fs::canonicalize(folder)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "default".into())
    })
}

/// Files sent per `POST /v1/index` request (and at most this many bytes).
const INDEX_GROUP_FILES: usize = 200;
const INDEX_GROUP_BYTES: usize = 8 * 1024 * 1024;

/// Indexes a folder through the API: the files in groups (progress on stderr), then the
/// complete listing so files gone from the folder leave the index.
pub async fn upload_index(
    client: &ApiClient,
    folder: &Path,
    repo: &str,
    tags: &[String],
) -> anyhow::Result<crate::rag::IndexReport> {
    let (files, skipped) = crate::rag::indexer::read_folder(folder)
        .with_context(|| format!("reading {}", folder.display()))?;
    let mut total = crate::rag::IndexReport {
        repo: repo.to_string(),
        files: files.len(),
        skipped,
        ..Default::default()
    };
    let mut groups: Vec<Vec<&(String, String)>> = vec![Vec::new()];
    let mut bytes = 0;
    for f in &files {
        let last = groups.last_mut().map(|g| g.len()).unwrap_or(0);
        if last >= INDEX_GROUP_FILES || (last > 0 && bytes + f.1.len() > INDEX_GROUP_BYTES) {
            groups.push(Vec::new());
            bytes = 0;
        }
        bytes += f.1.len();
        if let Some(g) = groups.last_mut() {
            g.push(f);
        }
    }
    let keep: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    let count = groups.len();
    let mut done = 0;
    for (i, group) in groups.into_iter().enumerate() {
        let mut body = json!({
            "repo": repo,
            "tags": tags,
            "files": group.iter().map(|(p, c)| json!({"path": p, "contents": c})).collect::<Vec<_>>(),
        });
        if i + 1 == count {
            body["keep"] = json!(keep);
        }
        let (status, answer) = client.post("/v1/index", serde_json::to_vec(&body)?).await?;
        if status != 200 {
            bail!(
                "the API refused to index ({status}): {}",
                serde_json::to_string_pretty(&answer).unwrap_or_default()
            );
        }
        let r = &answer["result"];
        let n = |k: &str| usize::try_from(r[k].as_u64().unwrap_or(0)).unwrap_or(0);
        total.indexed += n("indexed");
        total.unchanged += n("unchanged");
        total.chunks += n("chunks");
        total.removed += n("removed");
        for s in r["skipped"].as_array().into_iter().flatten() {
            total.skipped.push(crate::rag::indexer::SkippedFile {
                path: s["path"].as_str().unwrap_or_default().to_string(),
                reason: s["reason"].as_str().unwrap_or_default().to_string(),
            });
        }
        done += group.len();
        if count > 1 || files.len() >= INDEX_GROUP_FILES {
            eprintln!(
                "indexing {}: {done}/{} file(s)",
                folder.display(),
                files.len()
            );
        }
    }
    Ok(total)
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

/// One input of a batch: its customId and the request (ids filled in by [`prepare`]).
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
            let contents = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {} (inputs must be UTF-8)", path.display()))?;
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
    let text = std::fs::read_to_string(&job.input)
        .with_context(|| format!("reading {}", job.input.display()))?;
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
    h.finalize()
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect()
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

/// Shows progress on stderr: a redrawn bar on a terminal, a line every few seconds otherwise.
struct ProgressBar {
    started: Instant,
    last_line: Option<Instant>,
    tty: bool,
}

impl ProgressBar {
    fn new() -> Self {
        use std::io::IsTerminal as _;
        Self {
            started: Instant::now(),
            last_line: None,
            tty: std::io::stderr().is_terminal(),
        }
    }

    fn show(&mut self, done: usize, total: usize, failed: usize, running: usize, force: bool) {
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = done as f64 / secs;
        let width = 30usize;
        let filled = (done * width)
            .checked_div(total)
            .unwrap_or(width)
            .min(width);
        let bar = format!("{}{}", "#".repeat(filled), ".".repeat(width - filled));
        let text = format!(
            "[{bar}] {done}/{total} done, {failed} failed, {running} running, {rate:.1}/s, {secs:.0}s"
        );
        let mut err = std::io::stderr();
        if self.tty {
            let _ = write!(err, "\r{text}");
            if force {
                let _ = writeln!(err);
            }
        } else if force
            || self
                .last_line
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(2))
        {
            let _ = writeln!(err, "{text}");
            self.last_line = Some(Instant::now());
        }
        let _ = err.flush();
    }
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
        let previous: Option<Value> = std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        match previous {
            Some(p) if p["status"] == "completed" => outcome.skipped += 1,
            Some(p) => {
                let attempt = p["attempt"].as_u64().unwrap_or(0) + 1;
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
    let mut results: BTreeMap<String, Value> = BTreeMap::new();
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
        let (status, accepted) = client.send(resp).await?;
        if status != 202 {
            bail!(
                "the API refused the batch ({status}): {}",
                serde_json::to_string_pretty(&accepted).unwrap_or_default()
            );
        }
        let batch_id = accepted["result"]["batchId"]
            .as_str()
            .context("the batch answer has no batchId")?
            .to_string();
        eprintln!(
            "batch {batch_id}: {} submitted, {} accepted",
            pending.len(),
            accepted["result"]["accepted"]
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
            let (status, progress) = client.get(&format!("/v1/batches/{batch_id}")).await?;
            if status != 200 {
                bail!("GET /v1/batches/{batch_id} answered {status}: {progress}");
            }
            let p = &progress["result"];
            let n = |k: &str| usize::try_from(p[k].as_u64().unwrap_or(0)).unwrap_or(0);
            let failed = n("failed") + n("rejected") + n("expired");
            let done = n("completed") + failed;
            bar.show(done, pending.len(), failed, n("running"), false);
            if n("queued") + n("running") == 0 {
                if n("awaitingClientTools") == 0 {
                    bar.show(done, pending.len(), failed, 0, true);
                    break;
                }
                // Act as the client for calls it can serve; give up on an item after a few rounds.
                let lines = client
                    .get_ndjson(&format!("/v1/batches/{batch_id}/results"))
                    .await?;
                let mut answered = 0;
                for line in lines
                    .iter()
                    .filter(|l| l["status"] == "awaiting_client_tools")
                {
                    let id = line["customId"].as_str().unwrap_or_default().to_string();
                    let r = rounds.entry(id).or_default();
                    *r += 1;
                    if *r > job.max_tool_rounds {
                        continue;
                    }
                    let calls = line["result"]["result"]["toolCalls"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    let tool_results: Vec<Value> =
                        calls.iter().map(|c| client_tool(&workspace, c)).collect();
                    let cont = json!({
                        "sessionId": line["sessionId"], "turnId": line["turnId"],
                        "toolResults": tool_results
                    });
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
        for line in client
            .get_ndjson(&format!("/v1/batches/{batch_id}/results"))
            .await?
        {
            if let Some(id) = line["customId"].as_str() {
                results.insert(id.to_string(), line.clone());
            }
        }
        for (item, _) in &pending {
            let line = results.remove(&item.custom_id).unwrap_or_else(|| {
                json!({"customId": item.custom_id, "status": "missing",
                       "result": null})
            });
            let status = line["status"].as_str().unwrap_or("missing").to_string();
            let mut saved = line.clone();
            if let Some(obj) = saved.as_object_mut() {
                obj.insert("batchId".into(), Value::String(batch_id.clone()));
                obj.insert(
                    "attempt".into(),
                    json!(attempts.get(&item.custom_id).copied().unwrap_or(0)),
                );
            }
            let file = result_file(&job.out, &item.custom_id);
            std::fs::write(&file, serde_json::to_string_pretty(&saved)? + "\n")
                .with_context(|| format!("writing {}", file.display()))?;
            if status == "completed" {
                outcome.completed += 1;
            } else {
                let why = line["result"]["errors"][0]["message"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("status {status}"));
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

/// Reads Server-Sent Events from a byte stream that the network cuts anywhere, even inside a
/// multi-byte character: bytes are kept until a line is complete, and only whole lines are
/// decoded. Yields each event's data (its `data:` lines joined by newlines); other fields and
/// comments (keep-alives) are skipped.
#[derive(Debug, Default)]
pub struct SseDecoder {
    pending: Vec<u8>,
    data: Option<String>,
}

impl SseDecoder {
    /// Feeds bytes as they arrived; returns the data of every event they completed.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let mut line: Vec<u8> = self.pending.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            // A line is whole, so it splits no character; invalid UTF-8 is the server's fault.
            let line = String::from_utf8_lossy(&line);
            if line.is_empty() {
                if let Some(data) = self.data.take() {
                    events.push(data);
                }
            } else if let Some(value) = line.strip_prefix("data:") {
                let value = value.strip_prefix(' ').unwrap_or(value);
                match &mut self.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(value);
                    }
                    None => self.data = Some(value.to_string()),
                }
            }
        }
        events
    }
}

#[cfg(test)]
mod sse_tests {
    use super::SseDecoder;

    #[test]
    fn characters_split_across_chunks_arrive_whole() {
        let stream = "event: turn\nid: t1\ndata: {\"instruction\":\"Grüße, 你好 🚀\"}\n\n: keep-alive\n\ndata: a\ndata: b\r\n\r\n";
        let mut decoder = SseDecoder::default();
        let mut events = Vec::new();
        for byte in stream.as_bytes() {
            events.extend(decoder.push(std::slice::from_ref(byte)));
        }
        assert_eq!(
            events,
            vec![
                "{\"instruction\":\"Grüße, 你好 🚀\"}".to_string(),
                "a\nb".to_string()
            ]
        );
    }

    #[test]
    fn an_unfinished_event_is_not_yielded() {
        let mut decoder = SseDecoder::default();
        assert!(decoder.push(b"data: half").is_empty());
        assert!(decoder.push(b"\n").is_empty());
        assert_eq!(decoder.push(b"\n"), vec!["half".to_string()]);
    }
}
