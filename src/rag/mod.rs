//! Retrieval-augmented context (AGN-002, AGN-034 §4.4): an index of chunked files, a lexical
//! BM25 retriever, `ragScope` filtering, and the budget that keeps the `[CONTEXT]` block bounded.
//!
//! Owns: chunking, the chunk index (Redis, or memory on the embedded default), ranking and
//! filtering. Must not: format the block (`pipeline::compose` does) or know about turns.
//!
//! Indexes are per tenant: a tenant's turns only ever see chunks that tenant indexed.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::contract::request::{RagCondition, RagOperator};

#[cfg(feature = "bench")]
pub mod bench;
pub mod bm25;
pub mod chunker;
pub mod indexer;
pub mod memory;
pub mod redis;

pub use bm25::{Bm25Retriever, WHOLE_READ_POSTINGS};
pub use chunker::{ChunkOptions, chunk_file};
pub use indexer::{IndexReport, index_files, index_folder};
pub use memory::MemoryIndex;
pub use redis::RedisIndex;

/// One chunk of the `[CONTEXT]` block (AGN-002 §5).
#[derive(Debug, Clone, PartialEq)]
pub struct ContextChunk {
    /// Stable chunk id.
    pub id: String,
    /// Path relative to the workspace.
    pub path: String,
    /// First line (1-based).
    pub line_start: usize,
    /// Last line (inclusive).
    pub line_end: usize,
    /// Language tag for the fence.
    pub language: String,
    /// The text.
    pub content: String,
}

/// One indexed chunk of a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Chunk {
    /// Stable id (same content at the same place → same id).
    pub id: String,
    /// Path relative to the indexed folder.
    pub path: String,
    /// First line, 1-based.
    pub line_start: usize,
    /// Last line, inclusive.
    pub line_end: usize,
    /// Language (fence tag).
    pub language: String,
    /// The repository the folder was indexed as.
    pub repo: String,
    /// Tags of the file (declared in it, or given when indexing).
    #[serde(default)]
    pub tags: Vec<String>,
    /// A document id such as `AGN-033`, when the file has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc_id: Option<String>,
    /// The text.
    pub content: String,
}

impl Chunk {
    /// What ranking and filtering need, without the text.
    pub fn meta(&self, tokens: u32) -> ChunkMeta {
        ChunkMeta {
            path: self.path.clone(),
            language: self.language.clone(),
            repo: self.repo.clone(),
            tags: self.tags.clone(),
            doc_id: self.doc_id.clone(),
            tokens,
        }
    }

    /// The terms this chunk is found by (its text, path and document id) with their counts.
    pub fn terms(&self) -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        let extra = [self.path.as_str(), self.doc_id.as_deref().unwrap_or("")];
        for t in tokenize(&self.content)
            .into_iter()
            .chain(extra.iter().flat_map(|s| tokenize(s)))
        {
            *out.entry(t).or_insert(0) += 1;
        }
        out
    }

    /// The chunk as a `[CONTEXT]` entry.
    pub fn to_context(&self) -> ContextChunk {
        ContextChunk {
            id: self.id.clone(),
            path: self.path.clone(),
            line_start: self.line_start,
            line_end: self.line_end,
            language: self.language.clone(),
            content: self.content.clone(),
        }
    }
}

/// A chunk's metadata and length in tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChunkMeta {
    /// Path relative to the indexed folder.
    pub path: String,
    /// Language.
    pub language: String,
    /// Repository.
    pub repo: String,
    /// Tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Document id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc_id: Option<String>,
    /// Length in tokens (BM25's document length).
    pub tokens: u32,
}

impl ChunkMeta {
    /// The values of a metadata key (`None` for a key chunks do not have).
    fn values(&self, key: &str) -> Option<Vec<&str>> {
        Some(match key {
            "path" => vec![self.path.as_str()],
            "language" => vec![self.language.as_str()],
            "repo" => vec![self.repo.as_str()],
            "tags" => self.tags.iter().map(String::as_str).collect(),
            "docId" => self.doc_id.iter().map(String::as_str).collect(),
            _ => return None,
        })
    }

    /// Whether the chunk passes every condition (AND). `==`/`!=` compare exactly;
    /// `contains`/`does_not_contain` look for a substring, ignoring case. A condition on an
    /// unknown key is ignored (the request was warned about it).
    pub fn matches(&self, conditions: &[RagCondition]) -> bool {
        conditions.iter().all(|c| {
            let Some(have) = self.values(&c.key) else {
                return true;
            };
            let contains = |h: &str, v: &str| h.to_lowercase().contains(&v.to_lowercase());
            match c.operator {
                RagOperator::Equals => have.iter().any(|h| c.values.iter().any(|v| h == v)),
                RagOperator::NotEquals => !have.iter().any(|h| c.values.iter().any(|v| h == v)),
                RagOperator::Contains => {
                    have.iter().any(|h| c.values.iter().any(|v| contains(h, v)))
                }
                RagOperator::DoesNotContain => {
                    !have.iter().any(|h| c.values.iter().any(|v| contains(h, v)))
                }
            }
        })
    }
}

/// Words too common to rank by.
const STOPWORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "is", "it", "of", "on",
    "or", "that", "the", "this", "to", "was", "with", "its", "into", "not", "no", "we", "our",
];

/// Lower-cased alphanumeric runs of 2-40 characters, stopwords dropped.
pub fn tokenize(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| (2..=40).contains(&w.chars().count()))
        .map(str::to_lowercase)
        .filter(|w| !STOPWORDS.contains(&w.as_str()))
        .collect()
}

/// A failed index or retrieval operation.
#[derive(Debug, thiserror::Error)]
pub enum RagError {
    /// The backend is unusable (the in-memory index's lock is poisoned).
    #[error("index unavailable: {0}")]
    Unavailable(String),
    /// Redis failed or did not answer in time; the client's error is kept and written into the
    /// message, not returned as the source.
    #[error("index unavailable: {0}")]
    Redis(::redis::RedisError),
    /// Stored index data is not what the index wrote.
    #[error("index data is corrupt: {0}")]
    Corrupt(String),
    /// A stored value could not be decoded.
    #[error("index data under {key} cannot be decoded: {error}")]
    Decode {
        /// The key whose value failed to decode.
        key: String,
        /// The decoder's error (written into the message).
        error: serde_json::Error,
    },
    /// The folder to index could not be read.
    #[error("cannot read {}: {error}", path.display())]
    Folder {
        /// The folder.
        path: std::path::PathBuf,
        /// The I/O error (written into the message).
        error: std::io::Error,
    },
}

/// One chunk in a term's posting list: how often the term occurs there, and the chunk's length
/// in tokens (so ranking needs no second lookup per candidate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Posting {
    /// Occurrences of the term in the chunk.
    pub tf: u32,
    /// The chunk's length in tokens.
    pub len: u32,
}

/// How large a tenant's index is, and how common some terms are in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frequencies {
    /// Chunks in the index.
    pub chunks: u64,
    /// Tokens in all of them.
    pub tokens: u64,
    /// For each term asked about, the chunks holding it.
    pub df: Vec<u64>,
}

/// Where chunks are kept, with what BM25 needs to rank them. Implementations: [`MemoryIndex`]
/// and [`RedisIndex`]; both pass one conformance suite.
#[async_trait::async_trait]
pub trait ChunkIndex: Send + Sync + 'static {
    /// A key of the index's own server that exists while `tenant`'s index holds a chunk (see
    /// [`Retriever::absence_probe`]); `None` for an index without one.
    fn presence_key(&self, tenant: &str) -> Option<String> {
        let _ = tenant;
        None
    }
    /// The tenant's indexed files of `repo`, with the content hash they were indexed at.
    async fn files(&self, tenant: &str, repo: &str) -> Result<BTreeMap<String, String>, RagError>;
    /// Replaces every chunk of one file by `chunks` (atomically).
    async fn put_file(
        &self,
        tenant: &str,
        repo: &str,
        path: &str,
        content_hash: &str,
        chunks: &[Chunk],
    ) -> Result<(), RagError>;
    /// Deletes a file's chunks; returns how many there were.
    async fn remove_file(&self, tenant: &str, repo: &str, path: &str) -> Result<usize, RagError>;
    /// For each term, the chunks holding it.
    async fn postings(
        &self,
        tenant: &str,
        terms: &[String],
    ) -> Result<Vec<HashMap<String, Posting>>, RagError>;
    /// For each term, the postings of the chunks `ids`, in the order asked (`None` where a
    /// chunk does not hold the term).
    async fn postings_of(
        &self,
        tenant: &str,
        terms: &[String],
        ids: &[String],
    ) -> Result<Vec<Vec<Option<Posting>>>, RagError>;
    /// The index's size (chunks, tokens) and how many chunks hold each of `terms`, in one read.
    async fn frequencies(&self, tenant: &str, terms: &[String]) -> Result<Frequencies, RagError>;
    /// Metadata of chunks, in the order asked.
    async fn metas(&self, tenant: &str, ids: &[String])
    -> Result<Vec<Option<ChunkMeta>>, RagError>;
    /// Chunks, in the order asked.
    async fn chunks(&self, tenant: &str, ids: &[String]) -> Result<Vec<Option<Chunk>>, RagError>;
}

/// What to retrieve.
#[derive(Debug, Clone, Default)]
pub struct RagQuery {
    /// Free text (the instruction and the artifact names).
    pub text: String,
    /// Scope conditions, ANDed.
    pub conditions: Vec<RagCondition>,
    /// Paths never to return (files the request already carries whole).
    pub exclude_paths: Vec<String>,
    /// The most chunks to return.
    pub limit: usize,
}

/// A retrieved chunk with its score.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// The chunk.
    pub chunk: Chunk,
    /// Higher is more relevant.
    pub score: f64,
}

/// Finds the chunks relevant to a query. The built-in one is [`Bm25Retriever`]; an
/// embedding-based retriever (an OpenAI-compatible `/v1/embeddings` call plus a vector store)
/// fits behind the same trait.
#[async_trait::async_trait]
pub trait Retriever: Send + Sync + 'static {
    /// The best chunks for `query` in `tenant`'s index, best first.
    async fn retrieve(&self, tenant: &str, query: &RagQuery) -> Result<Vec<Scored>, RagError>;
    /// A key of the index's server whose absence says `tenant` has nothing to retrieve, for a
    /// caller that can look it up in a step it takes anyway on that server (a turn's begin
    /// step) and retrieve only when it exists; `None`: just retrieve. A retriever that has
    /// seen the tenant's index answers `None`, so such a tenant's read goes beside that step,
    /// not after it.
    fn absence_probe(&self, tenant: &str) -> Option<String> {
        let _ = tenant;
        None
    }
}

/// How much retrieved context one turn may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RagBudget {
    /// The most retrieved chunks.
    pub max_chunks: usize,
    /// The most characters of chunk text in the whole block (artifacts count, but are never cut).
    pub max_chars: usize,
}

impl Default for RagBudget {
    fn default() -> Self {
        Self {
            max_chunks: 8,
            max_chars: 24_000,
        }
    }
}

/// What did not fit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cut {
    /// Ids of retrieved chunks left out, best first.
    pub ids: Vec<String>,
    /// Their characters.
    pub chars: usize,
}

/// Artifacts first (always kept), then retrieved chunks in rank order while they fit the
/// budget; returns the block's chunks and what was cut.
pub fn within_budget(
    artifacts: Vec<ContextChunk>,
    retrieved: Vec<ContextChunk>,
    budget: RagBudget,
) -> (Vec<ContextChunk>, Cut) {
    let mut used: usize = artifacts.iter().map(|c| c.content.chars().count()).sum();
    let mut out = artifacts;
    let mut taken = 0;
    let mut cut = Cut::default();
    for c in retrieved {
        let size = c.content.chars().count();
        if taken < budget.max_chunks && used + size <= budget.max_chars {
            used += size;
            taken += 1;
            out.push(c);
        } else {
            cut.chars += size;
            cut.ids.push(c.id);
        }
    }
    (out, cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder that cannot be read is named in the error, with its I/O error.
    #[tokio::test]
    async fn an_unreadable_folder_is_named_with_its_cause() {
        let missing = std::env::temp_dir().join(format!("aptix-missing-{}", uuid::Uuid::new_v4()));
        let index = MemoryIndex::new();
        let Err(e) = index_folder(
            &index,
            "t",
            "r",
            &missing,
            &[],
            ChunkOptions::default(),
            |_, _| {},
        )
        .await
        else {
            panic!("the folder does not exist");
        };
        assert!(
            matches!(&e, RagError::Folder { path, error } if *path == missing && error.kind() == std::io::ErrorKind::NotFound),
            "{e:?}"
        );
        assert!(
            e.to_string().contains(&missing.display().to_string()),
            "{e}"
        );
    }

    fn meta() -> ChunkMeta {
        ChunkMeta {
            path: "docs/AGN-033.md".into(),
            language: "markdown".into(),
            repo: "aptix".into(),
            tags: vec!["rag".into(), "Queue".into()],
            doc_id: Some("AGN-033".into()),
            tokens: 10,
        }
    }

    fn cond(key: &str, op: RagOperator, values: &[&str]) -> RagCondition {
        RagCondition {
            key: key.into(),
            operator: op,
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn each_operator_and_their_conjunction() {
        let m = meta();
        use RagOperator::*;
        assert!(m.matches(&[cond("language", Equals, &["json", "markdown"])]));
        assert!(
            !m.matches(&[cond("language", Equals, &["Markdown"])]),
            "exact"
        );
        assert!(m.matches(&[cond("repo", NotEquals, &["other"])]));
        assert!(!m.matches(&[cond("repo", NotEquals, &["aptix"])]));
        assert!(
            m.matches(&[cond("path", Contains, &["agn-0"])]),
            "ignores case"
        );
        assert!(!m.matches(&[cond("path", Contains, &["src/"])]));
        assert!(m.matches(&[cond("tags", DoesNotContain, &["secret"])]));
        assert!(!m.matches(&[cond("tags", DoesNotContain, &["queue"])]));
        assert!(m.matches(&[cond("tags", Equals, &["rag"])]), "any tag");
        assert!(m.matches(&[cond("docId", Equals, &["AGN-033"])]));
        // ANDed: one failing condition excludes the chunk.
        assert!(!m.matches(&[
            cond("docId", Equals, &["AGN-033"]),
            cond("repo", Equals, &["other"])
        ]));
        // Unknown keys are ignored.
        assert!(m.matches(&[cond("owner", Equals, &["x"])]));
        // A chunk without a document id never equals one.
        let mut no_id = meta();
        no_id.doc_id = None;
        assert!(!no_id.matches(&[cond("docId", Equals, &["AGN-033"])]));
        assert!(no_id.matches(&[cond("docId", NotEquals, &["AGN-033"])]));
    }

    #[test]
    fn tokenizer_lowercases_and_drops_noise() {
        assert_eq!(
            tokenize("The Retry-Budget of AGN-033: a_b x"),
            vec!["retry", "budget", "agn", "033"]
        );
    }

    fn ctx(id: &str, chars: usize) -> ContextChunk {
        ContextChunk {
            id: id.into(),
            path: "p".into(),
            line_start: 1,
            line_end: 1,
            language: "text".into(),
            content: "x".repeat(chars),
        }
    }

    #[test]
    fn the_budget_keeps_artifacts_and_cuts_retrieved_chunks_in_rank_order() {
        let budget = RagBudget {
            max_chunks: 2,
            max_chars: 100,
        };
        let (kept, cut) = within_budget(
            vec![ctx("art", 50)],
            vec![ctx("r1", 30), ctx("r2", 30), ctx("r3", 10), ctx("r4", 5)],
            budget,
        );
        let ids: Vec<&str> = kept.iter().map(|c| c.id.as_str()).collect();
        // r2 does not fit the characters; r3 fits; r4 is over the chunk count.
        assert_eq!(ids, vec!["art", "r1", "r3"]);
        assert_eq!(cut.ids, vec!["r2", "r4"]);
        assert_eq!(cut.chars, 35);
        // Artifacts alone over the budget are still all kept.
        let (kept, cut) = within_budget(vec![ctx("big", 500)], vec![ctx("r", 1)], budget);
        assert_eq!(kept.len(), 1);
        assert_eq!(cut.ids, vec!["r"]);
    }
}
