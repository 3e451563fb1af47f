//! `aptix index`: a folder chunked into the retrieval index, through the HTTP API (`--url`) or
//! straight into Redis. Unchanged files are skipped, changed ones re-chunked, files gone from
//! the folder removed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::json;

use aptix_worker::app::redis_options;
use aptix_worker::config::{Config, LOCAL_TENANT, Sources};
use aptix_worker::contract::InvokeResult;
use aptix_worker::rag::{ChunkOptions, IndexReport, RedisIndex};
use aptix_worker::tokens::ApiTokens;

use super::client::ApiClient;

/// Arguments of `aptix index`.
#[derive(Debug, clap::Args)]
pub struct IndexArgs {
    /// The folder.
    pub folder: PathBuf,
    /// The repository name chunks carry (default: the folder's name).
    #[arg(long)]
    pub repo: Option<String>,
    /// A tag for every chunk (repeatable).
    #[arg(long = "tag")]
    pub tags: Vec<String>,
    /// The API's base URL.
    #[arg(long, env = "APTIX_URL")]
    pub url: Option<String>,
    /// Bearer token.
    #[arg(long, env = "APTIX_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The tenant whose index to write when writing straight to Redis (required when
    /// APTIX_API_TOKENS is set; otherwise `local`, the tenant of an API without tokens).
    #[arg(long)]
    pub tenant: Option<String>,
}

/// `aptix index`.
pub async fn index(args: IndexArgs, sources: &Sources<'_>) -> anyhow::Result<ExitCode> {
    let IndexArgs {
        folder,
        repo,
        tags,
        url,
        token,
        tenant,
    } = args;
    let repo = repo_name(&folder, repo);
    let report = match url {
        Some(url) => {
            let client = ApiClient::new(&url, token);
            upload_index(&client, &folder, &repo, &tags).await?
        }
        None => {
            let config = Config::read(sources)?;
            let Some(redis) = &config.store.url else {
                anyhow::bail!(
                    "nothing to index into: pass --url of a running server (the embedded in-memory index lives inside it) or set APTIX_REDIS_URL"
                );
            };
            let tenant = index_tenant(tenant, &config.http.api_tokens)?;
            let index = RedisIndex::connect_with(
                redis.expose(),
                &config.namespace,
                &redis_options(&config),
            )
            .await?;
            let opts = ChunkOptions {
                max_lines: config.rag.chunk_lines,
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
) -> anyhow::Result<aptix_worker::rag::IndexReport> {
    let (files, skipped) = aptix_worker::rag::indexer::read_folder(folder)
        .with_context(|| format!("reading {}", folder.display()))?;
    let mut total = aptix_worker::rag::IndexReport {
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
        let answer: InvokeResult<IndexReport> =
            serde_json::from_value(answer).context("the API's index report cannot be read")?;
        let Some(r) = answer.result() else {
            bail!("the API answered 200 without an index report");
        };
        total.indexed += r.indexed;
        total.unchanged += r.unchanged;
        total.chunks += r.chunks;
        total.removed += r.removed;
        total.skipped.extend(r.skipped.iter().cloned());
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
