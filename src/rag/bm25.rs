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
}

impl Bm25Retriever {
    /// A retriever over `index`.
    pub fn new(index: Arc<dyn ChunkIndex>) -> Self {
        Self {
            index,
            k1: 1.2,
            b: 0.75,
            whole_read: WHOLE_READ_POSTINGS,
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
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

    use proptest::prelude::*;

    use super::*;
    use crate::contract::request::{RagCondition, RagOperator};
    use crate::rag::{Chunk, Frequencies, MemoryIndex};

    /// An index that counts the posting entries it hands out.
    struct Counted {
        inner: MemoryIndex,
        entries: AtomicU64,
        /// Answers one frequency fewer than asked (an index that is not what it claims).
        short: bool,
    }

    #[async_trait::async_trait]
    impl ChunkIndex for Counted {
        async fn files(&self, t: &str, r: &str) -> Result<BTreeMap<String, String>, RagError> {
            self.inner.files(t, r).await
        }
        async fn put_file(
            &self,
            t: &str,
            r: &str,
            p: &str,
            h: &str,
            c: &[Chunk],
        ) -> Result<(), RagError> {
            self.inner.put_file(t, r, p, h, c).await
        }
        async fn remove_file(&self, t: &str, r: &str, p: &str) -> Result<usize, RagError> {
            self.inner.remove_file(t, r, p).await
        }
        async fn postings(
            &self,
            t: &str,
            terms: &[String],
        ) -> Result<Vec<HashMap<String, Posting>>, RagError> {
            let lists = self.inner.postings(t, terms).await?;
            let n: usize = lists.iter().map(HashMap::len).sum();
            self.entries.fetch_add(n as u64, AtomicOrdering::Relaxed);
            Ok(lists)
        }
        async fn postings_of(
            &self,
            t: &str,
            terms: &[String],
            ids: &[String],
        ) -> Result<Vec<Vec<Option<Posting>>>, RagError> {
            self.entries
                .fetch_add((terms.len() * ids.len()) as u64, AtomicOrdering::Relaxed);
            self.inner.postings_of(t, terms, ids).await
        }
        async fn frequencies(&self, t: &str, terms: &[String]) -> Result<Frequencies, RagError> {
            let mut f = self.inner.frequencies(t, terms).await?;
            if self.short {
                f.df.pop();
            }
            Ok(f)
        }
        async fn metas(&self, t: &str, ids: &[String]) -> Result<Vec<Option<ChunkMeta>>, RagError> {
            self.inner.metas(t, ids).await
        }
        async fn chunks(&self, t: &str, ids: &[String]) -> Result<Vec<Option<Chunk>>, RagError> {
            self.inner.chunks(t, ids).await
        }
    }

    fn chunk(file: usize, section: usize, words: &[String], tag: &str) -> Chunk {
        Chunk {
            id: format!("c_{file}_{section}"),
            path: format!("doc-{file}.md"),
            line_start: section * 10 + 1,
            line_end: section * 10 + 9,
            language: "markdown".into(),
            repo: "r".into(),
            tags: vec![tag.into()],
            doc_id: None,
            content: words.join(" "),
        }
    }

    /// `files` files of `sections` chunks, words of `w<k>` with a few very common ones and a
    /// long tail (word k drawn with weight ~1/k), tagged `even`/`odd` by file.
    async fn corpus(index: &dyn ChunkIndex, files: &[Vec<Vec<u16>>]) {
        for (f, sections) in files.iter().enumerate() {
            let tag = if f % 2 == 0 { "even" } else { "odd" };
            let chunks: Vec<Chunk> = sections
                .iter()
                .enumerate()
                .map(|(s, words)| {
                    let words: Vec<String> = words.iter().map(|k| format!("w{k}")).collect();
                    chunk(f, s, &words, tag)
                })
                .collect();
            index
                .put_file("t", "r", &format!("doc-{f}.md"), "h", &chunks)
                .await
                .unwrap();
        }
    }

    /// A word index with weight about 1/(k+1) over `vocabulary` words.
    fn zipf(vocabulary: u16) -> impl Strategy<Value = u16> {
        (0.0f64..1.0).prop_map(move |u| {
            // Inverse of the continuous 1/x distribution over [1, vocabulary + 1).
            let k = (f64::from(vocabulary) + 1.0).powf(u) - 1.0;
            (k as u16).min(vocabulary - 1)
        })
    }

    fn scoped(text: String, limit: usize, scope: u8, exclude: Option<usize>) -> RagQuery {
        let conditions = match scope {
            1 => vec![RagCondition {
                key: "tags".into(),
                operator: RagOperator::Equals,
                values: vec!["even".into()],
            }],
            2 => vec![RagCondition {
                key: "path".into(),
                operator: RagOperator::NotEquals,
                values: vec!["doc-1.md".into(), "doc-2.md".into()],
            }],
            _ => Vec::new(),
        };
        RagQuery {
            text,
            conditions,
            exclude_paths: exclude.map(|f| format!("doc-{f}.md")).into_iter().collect(),
            limit,
        }
    }

    fn ranking(found: Vec<Scored>) -> Vec<(String, u64)> {
        found
            .into_iter()
            .map(|s| (s.chunk.id, s.score.to_bits()))
            .collect()
    }

    fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Reading the rarest terms first and the rest only for the chunks that can still
        /// make the top gives the very ranking of scoring every chunk: same chunks, same
        /// scores to the bit, same order — with and without a scope, whatever the limit.
        #[test]
        fn the_pruned_ranking_is_the_full_ranking(
            files in prop::collection::vec(
                prop::collection::vec(prop::collection::vec(zipf(60), 1..25), 1..5),
                1..30,
            ),
            queries in prop::collection::vec(
                (prop::collection::vec(zipf(80), 1..7), 1usize..12, 0u8..3, prop::option::of(0usize..30)),
                1..8,
            ),
        ) {
            block_on(async {
                let index: Arc<dyn ChunkIndex> = Arc::new(MemoryIndex::new());
                corpus(index.as_ref(), &files).await;
                let whole = Bm25Retriever::new(index.clone()).with_whole_read(u64::MAX);
                let pruned = Bm25Retriever::new(index.clone()).with_whole_read(0);
                let some = Bm25Retriever::new(index.clone()).with_whole_read(40);
                for (words, limit, scope, exclude) in &queries {
                    let text = words.iter().map(|k| format!("w{k}")).collect::<Vec<_>>().join(" ");
                    let q = scoped(text, *limit, *scope, *exclude);
                    let expected = ranking(whole.retrieve("t", &q).await.unwrap());
                    prop_assert_eq!(&ranking(pruned.retrieve("t", &q).await.unwrap()), &expected);
                    prop_assert_eq!(&ranking(some.retrieve("t", &q).await.unwrap()), &expected);
                }
                Ok(())
            })?;
        }
    }

    /// One rare word and two that every chunk holds: the common ones are read only for the
    /// chunks the rare one found, and the answer is the same as reading everything.
    #[tokio::test]
    async fn common_terms_are_read_only_for_the_chunks_that_can_still_rank() {
        let index = Arc::new(Counted {
            inner: MemoryIndex::new(),
            entries: AtomicU64::new(0),
            short: false,
        });
        let files: Vec<Vec<Vec<u16>>> = (0..200)
            .map(|f| {
                (0..5)
                    .map(|s| {
                        let mut words = vec![0, 1, 2 + (f * 5 + s) % 50];
                        if f % 40 == 0 && s == 0 {
                            words.push(999); // the rare word: 5 chunks of 1,000
                        }
                        words
                    })
                    .collect()
            })
            .collect();
        corpus(index.as_ref(), &files).await;
        let q = scoped("w999 w0 w1".into(), 3, 0, None);
        let whole = Bm25Retriever::new(index.clone()).with_whole_read(u64::MAX);
        let expected = ranking(whole.retrieve("t", &q).await.unwrap());
        let read_whole = index.entries.swap(0, AtomicOrdering::Relaxed);
        // (2,005 entries are few enough to be read whole at the default: a smaller budget
        // makes the same query take the pruned path.)
        let pruned = Bm25Retriever::new(index.clone()).with_whole_read(100);
        assert_eq!(ranking(pruned.retrieve("t", &q).await.unwrap()), expected);
        let read_pruned = index.entries.load(AtomicOrdering::Relaxed);
        assert_eq!(expected.len(), 3);
        assert!(
            expected.iter().all(
                |(id, _)| ["c_0_0", "c_40_0", "c_80_0", "c_120_0", "c_160_0"]
                    .contains(&id.as_str())
            ),
            "{expected:?}"
        );
        // Whole: 5 + 1,000 + 1,000 entries. Pruned: the rare list, then the two common lists
        // for its 5 chunks alone.
        assert_eq!(read_whole, 2005);
        assert_eq!(read_pruned, 5 + 2 * 5);
    }

    /// A query whose terms are all common reads every list whole: nothing can be skipped when
    /// no term is rarer than the others by enough, and the answer is still exact.
    #[tokio::test]
    async fn without_a_rare_term_every_list_is_read() {
        let index = Arc::new(Counted {
            inner: MemoryIndex::new(),
            entries: AtomicU64::new(0),
            short: false,
        });
        let files: Vec<Vec<Vec<u16>>> = (0..100)
            .map(|f| {
                (0..50)
                    .map(|s| vec![(f + s) % 2, 2 + (f + s) % 2])
                    .collect()
            })
            .collect();
        corpus(index.as_ref(), &files).await;
        let q = scoped("w0 w2".into(), 5, 0, None);
        let whole = Bm25Retriever::new(index.clone()).with_whole_read(u64::MAX);
        let expected = ranking(whole.retrieve("t", &q).await.unwrap());
        let read_whole = index.entries.swap(0, AtomicOrdering::Relaxed);
        let pruned = Bm25Retriever::new(index.clone()).with_whole_read(100);
        assert_eq!(ranking(pruned.retrieve("t", &q).await.unwrap()), expected);
        assert_eq!(index.entries.load(AtomicOrdering::Relaxed), read_whole);
    }

    /// An index whose frequencies do not match the terms asked is an error, not a ranking.
    #[tokio::test]
    async fn an_index_answering_short_is_an_error() {
        let index = Arc::new(Counted {
            inner: MemoryIndex::new(),
            entries: AtomicU64::new(0),
            short: true,
        });
        corpus(index.as_ref(), &[vec![vec![0, 1]]]).await;
        let q = scoped("w0 w1".into(), 3, 0, None);
        let err = Bm25Retriever::new(index)
            .retrieve("t", &q)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("1 frequencies for 2 terms"),
            "{err}"
        );
    }
}
