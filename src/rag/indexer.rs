//! Indexing: files in, chunks out, the index brought in line with what was given.
//!
//! A file whose content did not change since it was indexed is left alone; a changed file's
//! chunks are replaced; with a complete listing, files of the repo that are no longer there are
//! removed from the index.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::chunker::{ChunkOptions, chunk_file, language_for};
use super::{ChunkIndex, RagError};

/// The largest file indexed; larger ones are skipped (and reported).
pub const MAX_FILE_BYTES: usize = 1024 * 1024;

/// What an indexing run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct IndexReport {
    /// The repository indexed.
    pub repo: String,
    /// Files given (or found).
    pub files: usize,
    /// Files (re)indexed because they were new or changed.
    pub indexed: usize,
    /// Files left alone because their content did not change.
    pub unchanged: usize,
    /// Chunks written for the (re)indexed files.
    pub chunks: usize,
    /// Files removed from the index because they are gone.
    pub removed: usize,
    /// Files not indexed, with why.
    pub skipped: Vec<SkippedFile>,
}

/// A file that was not indexed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkippedFile {
    /// Its path.
    pub path: String,
    /// Why.
    pub reason: String,
}

fn content_hash(text: &str) -> String {
    crate::hex::lower(&Sha256::digest(text.as_bytes()))
}

/// Indexes `files` (relative path, contents) as `repo` for `tenant`. With `complete`, the
/// listing is the whole repo: indexed files not in it are removed. `progress` is called after
/// each file with (files done, files in all).
#[allow(clippy::too_many_arguments)]
pub async fn index_files(
    index: &dyn ChunkIndex,
    tenant: &str,
    repo: &str,
    files: &[(String, String)],
    tags: &[String],
    complete: bool,
    opts: ChunkOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<IndexReport, RagError> {
    let mut report = IndexReport {
        repo: repo.to_string(),
        files: files.len(),
        ..IndexReport::default()
    };
    let known = index.files(tenant, repo).await?;
    for (done, (path, text)) in files.iter().enumerate() {
        let hash = content_hash(text);
        if text.len() > MAX_FILE_BYTES {
            report.skipped.push(SkippedFile {
                path: path.clone(),
                reason: format!("larger than {MAX_FILE_BYTES} bytes"),
            });
        } else if known.get(path) == Some(&hash) {
            report.unchanged += 1;
        } else {
            match chunk_file(repo, path, text, tags, opts) {
                Some(chunks) => {
                    index.put_file(tenant, repo, path, &hash, &chunks).await?;
                    report.indexed += 1;
                    report.chunks += chunks.len();
                }
                None => report.skipped.push(SkippedFile {
                    path: path.clone(),
                    reason: "not a file type that is indexed".into(),
                }),
            }
        }
        progress(done + 1, files.len());
    }
    if complete {
        let present: HashSet<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
        for path in known.keys().filter(|p| !present.contains(p.as_str())) {
            index.remove_file(tenant, repo, path).await?;
            report.removed += 1;
        }
    }
    Ok(report)
}

/// Files found (relative path and where it is, or its text) and files skipped.
pub type Listing<T> = (Vec<(String, T)>, Vec<SkippedFile>);

/// Directories never walked into.
const SKIPPED_DIRS: &[&str] = &["target", "node_modules", "bin", "obj", "dist", "build"];

/// The indexable files under `root` (relative paths with `/`, sorted), plus the ones skipped.
pub fn walk(root: &Path) -> std::io::Result<Listing<PathBuf>> {
    let mut found = BTreeSet::new();
    let mut skipped = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let kind = entry.file_type()?;
            if name.starts_with('.') {
                continue;
            }
            if kind.is_dir() {
                if !SKIPPED_DIRS.contains(&name.as_str()) {
                    stack.push(path);
                }
                continue;
            }
            if !kind.is_file() {
                continue;
            }
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            if language_for(&rel).is_some() {
                found.insert((rel, path));
            } else {
                skipped.push(SkippedFile {
                    path: rel,
                    reason: "not a file type that is indexed".into(),
                });
            }
        }
    }
    Ok((found.into_iter().collect(), skipped))
}

/// Reads the indexable files under `folder` (non-UTF-8 ones are reported as skipped).
pub fn read_folder(folder: &Path) -> std::io::Result<Listing<String>> {
    let (paths, mut skipped) = walk(folder)?;
    let mut files = Vec::with_capacity(paths.len());
    for (rel, path) in paths {
        match std::fs::read(&path) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => files.push((rel, text)),
                Err(_) => skipped.push(SkippedFile {
                    path: rel,
                    reason: "not UTF-8 text".into(),
                }),
            },
            Err(e) => skipped.push(SkippedFile {
                path: rel,
                reason: format!("unreadable: {e}"),
            }),
        }
    }
    Ok((files, skipped))
}

/// Indexes everything under `folder` as `repo` (a complete listing: files gone from the folder
/// leave the index).
pub async fn index_folder(
    index: &dyn ChunkIndex,
    tenant: &str,
    repo: &str,
    folder: &Path,
    tags: &[String],
    opts: ChunkOptions,
    progress: impl FnMut(usize, usize),
) -> Result<IndexReport, RagError> {
    let (files, skipped) = read_folder(folder).map_err(|error| RagError::Folder {
        path: folder.to_path_buf(),
        error,
    })?;
    let mut report = index_files(index, tenant, repo, &files, tags, true, opts, progress).await?;
    report.skipped.extend(skipped);
    Ok(report)
}
