//! The chunk index in process memory (the embedded default and tests).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::{Chunk, ChunkIndex, ChunkMeta, Frequencies, Posting, RagError};

#[derive(Debug, Default)]
struct TenantIndex {
    /// (repo, path) → (content hash, chunk ids).
    files: BTreeMap<(String, String), (String, Vec<String>)>,
    /// id → (chunk, its terms, its metadata).
    chunks: HashMap<String, (Chunk, BTreeMap<String, u32>, ChunkMeta)>,
    postings: HashMap<String, HashMap<String, Posting>>,
    tokens: u64,
}

impl TenantIndex {
    fn drop_chunk(&mut self, id: &str) {
        if let Some((_, terms, meta)) = self.chunks.remove(id) {
            for term in terms.keys() {
                if let Some(p) = self.postings.get_mut(term) {
                    p.remove(id);
                    if p.is_empty() {
                        self.postings.remove(term);
                    }
                }
            }
            self.tokens -= u64::from(meta.tokens);
        }
    }
}

/// A [`ChunkIndex`] in memory.
#[derive(Debug, Default)]
pub struct MemoryIndex {
    tenants: Mutex<HashMap<String, TenantIndex>>,
}

impl MemoryIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, tenant: &str, f: impl FnOnce(&mut TenantIndex) -> T) -> Result<T, RagError> {
        let mut guard = self
            .tenants
            .lock()
            .map_err(|_| RagError::Unavailable("the in-memory index lock is poisoned".into()))?;
        Ok(f(guard.entry(tenant.to_string()).or_default()))
    }
}

#[async_trait::async_trait]
impl ChunkIndex for MemoryIndex {
    async fn files(&self, tenant: &str, repo: &str) -> Result<BTreeMap<String, String>, RagError> {
        self.with(tenant, |t| {
            t.files
                .iter()
                .filter(|((r, _), _)| r == repo)
                .map(|((_, p), (h, _))| (p.clone(), h.clone()))
                .collect()
        })
    }

    async fn put_file(
        &self,
        tenant: &str,
        repo: &str,
        path: &str,
        content_hash: &str,
        chunks: &[Chunk],
    ) -> Result<(), RagError> {
        self.with(tenant, |t| {
            let key = (repo.to_string(), path.to_string());
            if let Some((_, old)) = t.files.remove(&key) {
                for id in old {
                    t.drop_chunk(&id);
                }
            }
            let mut ids = Vec::with_capacity(chunks.len());
            for c in chunks {
                t.drop_chunk(&c.id);
                let terms = c.terms();
                let tokens: u32 = terms.values().sum();
                for (term, tf) in &terms {
                    t.postings.entry(term.clone()).or_default().insert(
                        c.id.clone(),
                        Posting {
                            tf: *tf,
                            len: tokens,
                        },
                    );
                }
                t.tokens += u64::from(tokens);
                t.chunks
                    .insert(c.id.clone(), (c.clone(), terms, c.meta(tokens)));
                ids.push(c.id.clone());
            }
            t.files.insert(key, (content_hash.to_string(), ids));
        })
    }

    async fn remove_file(&self, tenant: &str, repo: &str, path: &str) -> Result<usize, RagError> {
        self.with(tenant, |t| {
            let Some((_, ids)) = t.files.remove(&(repo.to_string(), path.to_string())) else {
                return 0;
            };
            for id in &ids {
                t.drop_chunk(id);
            }
            ids.len()
        })
    }

    async fn postings(
        &self,
        tenant: &str,
        terms: &[String],
    ) -> Result<Vec<HashMap<String, Posting>>, RagError> {
        self.with(tenant, |t| {
            terms
                .iter()
                .map(|term| t.postings.get(term).cloned().unwrap_or_default())
                .collect()
        })
    }

    async fn postings_of(
        &self,
        tenant: &str,
        terms: &[String],
        ids: &[String],
    ) -> Result<Vec<Vec<Option<Posting>>>, RagError> {
        self.with(tenant, |t| {
            terms
                .iter()
                .map(|term| {
                    let list = t.postings.get(term);
                    ids.iter()
                        .map(|id| list.and_then(|l| l.get(id).copied()))
                        .collect()
                })
                .collect()
        })
    }

    async fn frequencies(&self, tenant: &str, terms: &[String]) -> Result<Frequencies, RagError> {
        self.with(tenant, |t| Frequencies {
            chunks: t.chunks.len() as u64,
            tokens: t.tokens,
            df: terms
                .iter()
                .map(|term| t.postings.get(term).map_or(0, |l| l.len() as u64))
                .collect(),
        })
    }

    async fn metas(
        &self,
        tenant: &str,
        ids: &[String],
    ) -> Result<Vec<Option<ChunkMeta>>, RagError> {
        self.with(tenant, |t| {
            ids.iter()
                .map(|id| t.chunks.get(id).map(|(_, _, m)| m.clone()))
                .collect()
        })
    }

    async fn chunks(&self, tenant: &str, ids: &[String]) -> Result<Vec<Option<Chunk>>, RagError> {
        self.with(tenant, |t| {
            ids.iter()
                .map(|id| t.chunks.get(id).map(|(c, _, _)| c.clone()))
                .collect()
        })
    }
}
