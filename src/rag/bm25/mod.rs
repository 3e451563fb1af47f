//! Okapi BM25 ranking over a [`ChunkIndex`], exact, without reading every posting of common
//! terms.
//!
//! A query's terms are weighed first (their document frequencies: one read). When their posting
//! lists are short in all, they are read whole and every chunk is scored. When they are long —
//! a large index and a common word — the lists are read rarest term first, and reading stops
//! once the terms left could not lift a chunk not yet seen above the chunks already in hand
//! (each term adds at most `idf × (k1 + 1)` to a chunk's score: the "max-score" bound of
//! Turtle and Flood). The terms left are then read only for the chunks that can still reach the
//! top, by id. The ranking is the same as scoring everything: same chunks, same scores, same
//! order (each chunk's parts are added in one order of the terms either way).
//!
//! Owns: scoring, the bound and the order of reads. Must not: know where the index lives.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{ChunkIndex, ChunkMeta, Posting, RagError, RagQuery, Retriever, Scored, tokenize};

mod indexed;
use indexed::Indexed;

/// Posting entries a query reads whole (all its terms' lists, in one read) before it switches
/// to reading the rarest terms first: for the small indexes most tenants have, one read costs
/// less than the pruned path's extra ones.
pub const WHOLE_READ_POSTINGS: u64 = 4096;

/// Okapi BM25 (k1 = 1.2, b = 0.75): works offline, needs no model.
#[derive(Clone)]
pub struct Bm25Retriever {
    index: Arc<dyn ChunkIndex>,
    k1: f64,
    b: f64,
    whole_read: u64,
    /// The tenants seen with an index (shared by clones).
    indexed: Arc<Indexed>,
}

impl Bm25Retriever {
    /// A retriever over `index`.
    pub fn new(index: Arc<dyn ChunkIndex>) -> Self {
        Self {
            index,
            k1: 1.2,
            b: 0.75,
            whole_read: WHOLE_READ_POSTINGS,
            indexed: Arc::default(),
        }
    }

    /// The same retriever, reading a query's postings whole only while they hold at most
    /// `entries` (0: always the rarest term first). The ranking does not change; only the reads.
    pub fn with_whole_read(mut self, entries: u64) -> Self {
        self.whole_read = entries;
        self
    }
}

/// What scoring one query needs: the weights of its terms and the index's average length.
struct Weights {
    k1: f64,
    b: f64,
    avg: f64,
    idf: Vec<f64>,
}

impl Weights {
    /// What chunk `p` of term `i`'s list adds to the chunk's score.
    fn part(&self, i: usize, p: Posting) -> f64 {
        let tf = f64::from(p.tf);
        let norm = 1.0 - self.b + self.b * f64::from(p.len) / self.avg;
        self.idf[i] * tf * (self.k1 + 1.0) / (tf + self.k1 * norm)
    }

    /// The most term `i` can add to any chunk's score (`tf / (tf + k1·norm)` stays below 1).
    fn bound(&self, i: usize) -> f64 {
        self.idf[i] * (self.k1 + 1.0)
    }

    /// The terms any chunk holds, in the order their parts are added to every score: the one
    /// that can add most first (ties in query order). Both ways of ranking add in this order,
    /// so they reach the same scores to the bit.
    fn order(&self, df: &[u64]) -> Vec<usize> {
        let mut order: Vec<usize> = (0..df.len()).filter(|&i| df[i] > 0).collect();
        order.sort_by(|&a, &b| self.bound(b).total_cmp(&self.bound(a)).then(a.cmp(&b)));
        order
    }
}

/// `a` is below `b` by more than rounding could explain (both are sums of a few positive
/// terms, added in different orders).
fn surely_below(a: f64, b: f64) -> bool {
    a * (1.0 + 1e-9) + 1e-12 < b
}

/// Best first; equal scores by id.
fn by_rank<S: Ord>(a: &(S, f64), b: &(S, f64)) -> Ordering {
    b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0))
}

/// Which chunks pass the query's scope, read from their metadata as needed and kept.
struct Scope<'a> {
    index: &'a dyn ChunkIndex,
    tenant: &'a str,
    query: &'a RagQuery,
    known: HashMap<String, bool>,
}

impl Scope<'_> {
    /// Whether each of `ids` passes (a chunk gone from the index does not).
    async fn passes(&mut self, ids: &[&str]) -> Result<Vec<bool>, RagError> {
        let unknown: Vec<String> = ids
            .iter()
            .filter(|id| !self.known.contains_key(**id))
            .map(|id| id.to_string())
            .collect();
        if !unknown.is_empty() {
            let metas = self.index.metas(self.tenant, &unknown).await?;
            for (id, meta) in unknown.into_iter().zip(metas) {
                let pass = meta.is_some_and(|m: ChunkMeta| {
                    !self.query.exclude_paths.iter().any(|p| p == &m.path)
                        && m.matches(&self.query.conditions)
                });
                self.known.insert(id, pass);
            }
        }
        Ok(ids
            .iter()
            .map(|id| self.known.get(*id).copied().unwrap_or(false))
            .collect())
    }

    /// Walks `ranked` (best first) a window at a time and returns the first `limit` that pass.
    async fn best<S: AsRef<str> + Clone + Sync>(
        &mut self,
        ranked: &[(S, f64)],
        limit: usize,
    ) -> Result<Vec<(S, f64)>, RagError> {
        let mut chosen = Vec::new();
        for window in ranked.chunks(window(limit)) {
            let ids: Vec<&str> = window.iter().map(|(id, _)| id.as_ref()).collect();
            for (entry, pass) in window.iter().zip(self.passes(&ids).await?) {
                if pass {
                    chosen.push(entry.clone());
                    if chosen.len() == limit {
                        return Ok(chosen);
                    }
                }
            }
        }
        Ok(chosen)
    }
}

/// Metadata read per step while looking for chunks in scope.
fn window(limit: usize) -> usize {
    limit.saturating_mul(4).max(32)
}

impl Bm25Retriever {
    /// Every chunk of every list, scored.
    fn rank_all(
        w: &Weights,
        order: &[usize],
        mut lists: Vec<HashMap<String, Posting>>,
    ) -> Vec<(String, f64)> {
        let mut scores: HashMap<String, f64> = HashMap::new();
        for &i in order {
            for (id, p) in lists.get_mut(i).map(std::mem::take).unwrap_or_default() {
                *scores.entry(id).or_insert(0.0) += w.part(i, p);
            }
        }
        let mut ranked: Vec<(String, f64)> = scores.into_iter().collect();
        ranked.sort_unstable_by(by_rank);
        ranked
    }

    /// The score below which no chunk can be among the best `limit` in scope: the score so far
    /// of the `limit`-th best chunk in scope (scores only grow), or `None` when fewer are known.
    async fn floor(
        seen: &HashMap<String, f64>,
        scope: &mut Scope<'_>,
        limit: usize,
    ) -> Result<Option<f64>, RagError> {
        let mut ranked: Vec<(&str, f64)> = seen.iter().map(|(id, s)| (id.as_str(), *s)).collect();
        // Most of the time the first window holds enough chunks in scope: sort only that.
        let head = window(limit).min(ranked.len());
        if head < ranked.len() {
            ranked.select_nth_unstable_by(head, by_rank);
            ranked[..head].sort_unstable_by(by_rank);
            let best = scope.best(&ranked[..head], limit).await?;
            if best.len() == limit {
                return Ok(best.last().map(|(_, s)| *s));
            }
        }
        ranked.sort_unstable_by(by_rank);
        let best = scope.best(&ranked, limit).await?;
        Ok((best.len() == limit)
            .then(|| best.last().map(|(_, s)| *s))
            .flatten())
    }

    /// The chunks that can be among the best `limit` in scope, exactly scored, best first:
    /// reading the rarest terms whole first and the rest only for those chunks.
    async fn rank_pruned(
        &self,
        w: &Weights,
        (tenant, terms, df, order): (&str, &[String], &[u64], &[usize]),
        scope: &mut Scope<'_>,
        limit: usize,
    ) -> Result<Vec<(String, f64)>, RagError> {
        // Each chunk seen so far, and its score from the terms read so far.
        let mut seen: HashMap<String, f64> = HashMap::new();
        let mut next = 0;
        let mut floor = None;
        while next < order.len() {
            // The next terms whole: at least one, then as many as fit in one read.
            let start = next;
            let mut entries = df[order[next]];
            next += 1;
            while next < order.len() && entries + df[order[next]] <= self.whole_read {
                entries += df[order[next]];
                next += 1;
            }
            let batch = &order[start..next];
            let names: Vec<String> = batch.iter().map(|&i| terms[i].clone()).collect();
            let lists = self.index.postings(tenant, &names).await?;
            for (&i, list) in batch.iter().zip(lists) {
                for (id, p) in list {
                    *seen.entry(id).or_insert(0.0) += w.part(i, p);
                }
            }
            if next == order.len() {
                break;
            }
            let left: f64 = order[next..].iter().map(|&i| w.bound(i)).sum();
            floor = Self::floor(&seen, scope, limit).await?;
            if floor.is_some_and(|f| surely_below(left, f)) {
                break;
            }
        }
        let rest = &order[next..];
        if let (false, Some(floor)) = (rest.is_empty(), floor) {
            // No chunk unseen can reach the floor; of those seen, keep the ones that still can,
            // and read the terms left for them alone (or whole, when that is less to read).
            let left: f64 = rest.iter().map(|&i| w.bound(i)).sum();
            seen.retain(|_, partial| !surely_below(*partial + left, floor));
            let names: Vec<String> = rest.iter().map(|&i| terms[i].clone()).collect();
            let whole: u64 = rest.iter().map(|&i| df[i]).sum();
            if (seen.len() * rest.len()) as u64 >= whole {
                for (&i, list) in rest.iter().zip(self.index.postings(tenant, &names).await?) {
                    for (id, p) in list {
                        if let Some(score) = seen.get_mut(&id) {
                            *score += w.part(i, p);
                        }
                    }
                }
            } else {
                let mut open: Vec<String> = seen.keys().cloned().collect();
                open.sort_unstable();
                let found = self.index.postings_of(tenant, &names, &open).await?;
                for (&i, column) in rest.iter().zip(found) {
                    for (id, p) in open.iter().zip(column) {
                        if let (Some(p), Some(score)) = (p, seen.get_mut(id)) {
                            *score += w.part(i, p);
                        }
                    }
                }
            }
        }
        let mut ranked: Vec<(String, f64)> = seen.into_iter().collect();
        ranked.sort_unstable_by(by_rank);
        Ok(ranked)
    }
}

#[async_trait::async_trait]
impl Retriever for Bm25Retriever {
    fn absence_probe(&self, tenant: &str) -> Option<String> {
        if self.indexed.contains(tenant) {
            return None;
        }
        self.index.presence_key(tenant)
    }

    async fn retrieve(&self, tenant: &str, query: &RagQuery) -> Result<Vec<Scored>, RagError> {
        let mut unique = HashSet::new();
        let terms: Vec<String> = tokenize(&query.text)
            .into_iter()
            .filter(|t| unique.insert(t.clone()))
            .collect();
        if terms.is_empty() || query.limit == 0 {
            return Ok(Vec::new());
        }
        let f = self.index.frequencies(tenant, &terms).await?;
        if f.df.len() != terms.len() {
            return Err(RagError::Corrupt(format!(
                "the index gave {} frequencies for {} terms",
                f.df.len(),
                terms.len()
            )));
        }
        if f.chunks == 0 {
            return Ok(Vec::new());
        }
        self.indexed.note(tenant);
        let n = f.chunks as f64;
        let w = Weights {
            k1: self.k1,
            b: self.b,
            avg: (f.tokens as f64 / n).max(1.0),
            idf: f
                .df
                .iter()
                .map(|&df| {
                    let df = df as f64;
                    (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
                })
                .collect(),
        };
        let mut scope = Scope {
            index: self.index.as_ref(),
            tenant,
            query,
            known: HashMap::new(),
        };
        let order = w.order(&f.df);
        let ranked = if f.df.iter().sum::<u64>() <= self.whole_read {
            Self::rank_all(&w, &order, self.index.postings(tenant, &terms).await?)
        } else {
            self.rank_pruned(&w, (tenant, &terms, &f.df, &order), &mut scope, query.limit)
                .await?
        };
        let best = scope.best(&ranked, query.limit).await?;
        let ids: Vec<String> = best.iter().map(|(id, _)| id.clone()).collect();
        let chunks = self.index.chunks(tenant, &ids).await?;
        Ok(best
            .into_iter()
            .zip(chunks)
            .filter_map(|((_, score), chunk)| {
                Some(Scored {
                    chunk: chunk?,
                    score,
                })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests;
