//! The ranking's exactness (pruned equals scored whole, bit for bit) and what it reads.

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
            |(id, _)| ["c_0_0", "c_40_0", "c_80_0", "c_120_0", "c_160_0"].contains(&id.as_str())
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
