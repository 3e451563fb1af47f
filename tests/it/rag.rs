//! Retrieval: chunking, the index (memory and real Redis, one suite), BM25 ranking, `ragScope`
//! operators, the budget and the composed `[CONTEXT]` block, on a small corpus written here.

use super::rag_scope::cond;
use std::path::PathBuf;
use std::sync::Arc;

use aptix_worker::contract::request::{RagCondition, RagOperator};
use aptix_worker::rag::{
    Bm25Retriever, Chunk, ChunkIndex, ChunkOptions, MemoryIndex, RagQuery, RedisIndex, Retriever,
    chunk_file, index_folder,
};

use crate::support::{RedisGuard, redis_store, redis_url};

pub(super) const QUEUE_DOC: &str = "# AGN-201 Queue retries
**Tags:** queue, retries

Why jobs are retried through delay queues.

## Decision
A failed job goes to a delay queue whose messages dead-letter back to the job queue.
```sh
# not a heading: inside a fence
```

## Risks
Poison messages loop forever unless the attempt count is capped.";

pub(super) const LEASE_DOC: &str = "# AGN-202 Session leases
**Tags:** state, redis

Only one turn of a session runs at a time.

## Decision
A worker takes the session lease with a fencing token before running a turn. Lease renewal
happens every third of the lease time; a stale fencing token makes every write fail.

## Alternatives
A global lock per session in the database.";

/// A Rust file of 130 lines: three chunks of at most 60 lines.
pub(super) fn code_file() -> String {
    (1..=130)
        .map(|i| match i {
            1 => "// Lease handling for sessions.".to_string(),
            75 => "fn renew_lease_with_zebra_marker() {}".to_string(),
            n => format!("let line_{n} = {n};"),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The corpus in a fresh folder.
pub(super) fn corpus() -> PathBuf {
    let root = std::env::temp_dir().join(format!("aptix-rag-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(root.join("docs")).unwrap();
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("docs/AGN-201-queue-retries.md"), QUEUE_DOC).unwrap();
    std::fs::write(root.join("docs/AGN-202-session-leases.md"), LEASE_DOC).unwrap();
    std::fs::write(root.join("src/lease.rs"), code_file()).unwrap();
    std::fs::write(root.join("logo.png"), [0x89, 0x50, 0x4e, 0x47]).unwrap();
    root
}

pub(super) struct Cleanup(pub(super) PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) fn opts() -> ChunkOptions {
    ChunkOptions { max_lines: 60 }
}

#[test]
pub(super) fn markdown_is_chunked_by_heading_with_exact_line_spans() {
    let chunks = chunk_file(
        "aptix",
        "docs/AGN-201-queue-retries.md",
        QUEUE_DOC,
        &["extra".to_string()],
        opts(),
    )
    .unwrap();
    let spans: Vec<(usize, usize)> = chunks.iter().map(|c| (c.line_start, c.line_end)).collect();
    assert_eq!(spans, vec![(1, 4), (6, 10), (12, 13)]);
    let lines: Vec<&str> = QUEUE_DOC.lines().collect();
    for c in &chunks {
        assert_eq!(c.content, lines[c.line_start - 1..c.line_end].join("\n"));
        assert_eq!(c.language, "markdown");
        assert_eq!(c.repo, "aptix");
        assert_eq!(c.doc_id.as_deref(), Some("AGN-201"));
        assert_eq!(c.tags, vec!["queue", "retries", "extra"]);
        assert!(c.id.starts_with("c_"));
    }
    // Stable ids: the same input gives the same ids; a changed section gets a new one and the
    // others keep theirs.
    let again = chunk_file(
        "aptix",
        "docs/AGN-201-queue-retries.md",
        QUEUE_DOC,
        &["extra".into()],
        opts(),
    )
    .unwrap();
    assert_eq!(chunks, again);
    let edited = QUEUE_DOC.replace("Poison messages", "Poisonous messages");
    let changed = chunk_file(
        "aptix",
        "docs/AGN-201-queue-retries.md",
        &edited,
        &["extra".into()],
        opts(),
    )
    .unwrap();
    assert_eq!(changed[0].id, chunks[0].id);
    assert_eq!(changed[1].id, chunks[1].id);
    assert_ne!(changed[2].id, chunks[2].id);
}

#[test]
pub(super) fn code_is_chunked_by_a_bounded_number_of_lines() {
    let code = code_file();
    let chunks = chunk_file("aptix", "src/lease.rs", &code, &[], opts()).unwrap();
    let spans: Vec<(usize, usize)> = chunks.iter().map(|c| (c.line_start, c.line_end)).collect();
    assert_eq!(spans, vec![(1, 60), (61, 120), (121, 130)]);
    assert!(chunks[1].content.contains("zebra"));
    assert!(chunks[1].content.starts_with("let line_61 = 61;"));
    assert!(
        chunks
            .iter()
            .all(|c| c.language == "rust" && c.doc_id.is_none())
    );
    // A Markdown section longer than the bound is split too.
    let long = format!("# Big\n{}", vec!["text"; 150].join("\n"));
    let spans: Vec<(usize, usize)> = chunk_file("r", "big.md", &long, &[], opts())
        .unwrap()
        .iter()
        .map(|c| (c.line_start, c.line_end))
        .collect();
    assert_eq!(spans, vec![(1, 60), (61, 120), (121, 151)]);
}

/// Both index implementations, the Redis one under a fresh namespace on the local Redis and on
/// the tests' Redis Cluster.
pub(super) async fn indexes() -> Vec<(&'static str, Arc<dyn ChunkIndex>, Option<RedisGuard>)> {
    let guard = redis_store().await;
    let redis = RedisIndex::connect(&redis_url(), guard.store.namespace())
        .await
        .expect("Redis is reachable");
    let cluster = RedisIndex::connect_with(
        &crate::redis_cluster::cluster().await.urls,
        guard.store.namespace(),
        &aptix_worker::store::redis::RedisOptions {
            cluster: true,
            ..Default::default()
        },
    )
    .await
    .expect("the cluster is reachable");
    vec![
        ("memory", Arc::new(MemoryIndex::new()), None),
        ("redis", Arc::new(redis), Some(guard)),
        ("cluster", Arc::new(cluster), None),
    ]
}

pub(super) async fn search(
    index: &Arc<dyn ChunkIndex>,
    tenant: &str,
    text: &str,
    conditions: Vec<RagCondition>,
) -> Vec<(String, usize)> {
    Bm25Retriever::new(index.clone())
        .retrieve(
            tenant,
            &RagQuery {
                text: text.into(),
                conditions,
                exclude_paths: Vec::new(),
                limit: 10,
            },
        )
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.chunk.path, s.chunk.line_start))
        .collect()
}

#[tokio::test]
pub(super) async fn reindexing_replaces_changed_files_and_deletes_removed_ones() {
    for (name, index, _guard) in indexes().await {
        let root = corpus();
        let _c = Cleanup(root.clone());
        let report = index_folder(index.as_ref(), "t1", "aptix", &root, &[], opts(), |_, _| {})
            .await
            .unwrap();
        assert_eq!(
            (report.files, report.indexed, report.chunks, report.removed),
            (3, 3, 9, 0),
            "{name}"
        );
        assert_eq!(report.skipped.len(), 1, "{name}: the PNG is skipped");
        assert_eq!(
            index.frequencies("t1", &[]).await.unwrap().chunks,
            9,
            "{name}"
        );
        assert_eq!(index.files("t1", "aptix").await.unwrap().len(), 3);

        // Nothing changed: nothing is rewritten.
        let report = index_folder(index.as_ref(), "t1", "aptix", &root, &[], opts(), |_, _| {})
            .await
            .unwrap();
        assert_eq!((report.indexed, report.unchanged), (0, 3), "{name}");

        // A changed file: its old chunks are gone, the new ones found.
        std::fs::write(
            root.join("src/lease.rs"),
            code_file().replace("zebra", "yak"),
        )
        .unwrap();
        let report = index_folder(index.as_ref(), "t1", "aptix", &root, &[], opts(), |_, _| {})
            .await
            .unwrap();
        assert_eq!(
            (report.indexed, report.unchanged, report.chunks),
            (1, 2, 3),
            "{name}"
        );
        assert!(
            search(&index, "t1", "zebra", vec![]).await.is_empty(),
            "{name}: old term gone"
        );
        assert_eq!(
            search(&index, "t1", "yak", vec![]).await,
            vec![("src/lease.rs".to_string(), 61)]
        );
        assert_eq!(
            index.frequencies("t1", &[]).await.unwrap().chunks,
            9,
            "{name}: no orphans"
        );
        assert!(index.postings("t1", &["zebra".into()]).await.unwrap()[0].is_empty());

        // A removed file leaves the index.
        std::fs::remove_file(root.join("docs/AGN-201-queue-retries.md")).unwrap();
        let report = index_folder(index.as_ref(), "t1", "aptix", &root, &[], opts(), |_, _| {})
            .await
            .unwrap();
        assert_eq!(report.removed, 1, "{name}");
        assert_eq!(
            index.frequencies("t1", &[]).await.unwrap().chunks,
            6,
            "{name}"
        );
        assert!(
            search(&index, "t1", "poison delay", vec![])
                .await
                .is_empty(),
            "{name}"
        );
        assert!(
            !index
                .files("t1", "aptix")
                .await
                .unwrap()
                .contains_key("docs/AGN-201-queue-retries.md")
        );

        // Another tenant's index is separate.
        assert!(
            search(&index, "t2", "lease", vec![]).await.is_empty(),
            "{name}"
        );
    }
}

/// The Redis index's presence key lives exactly as long as the tenant's index holds a chunk:
/// the begin step's probe then costs a tenant whose files were all removed no read.
#[tokio::test]
pub(super) async fn the_presence_key_goes_with_the_last_chunk() {
    let guard = redis_store().await;
    let index: Arc<dyn ChunkIndex> = Arc::new(
        RedisIndex::connect(&redis_url(), guard.store.namespace())
            .await
            .expect("Redis is reachable"),
    );
    let key = index.presence_key("t3").expect("the Redis index has one");
    let mut conn = crate::support::redis_connection().await;
    let exists = async |conn: &mut redis::aio::MultiplexedConnection| -> bool {
        redis::AsyncCommands::exists(conn, &key).await.unwrap()
    };
    assert!(!exists(&mut conn).await, "nothing indexed: no key");
    let root = corpus();
    let _c = Cleanup(root.clone());
    index_folder(index.as_ref(), "t3", "aptix", &root, &[], opts(), |_, _| {})
        .await
        .unwrap();
    assert!(exists(&mut conn).await, "indexed: the key is there");

    // One file of three removed: chunks remain, and so does the key.
    std::fs::remove_file(root.join("docs/AGN-201-queue-retries.md")).unwrap();
    index_folder(index.as_ref(), "t3", "aptix", &root, &[], opts(), |_, _| {})
        .await
        .unwrap();
    assert!(exists(&mut conn).await, "chunks remain");

    // Every file removed: the last chunk takes the key with it.
    std::fs::remove_file(root.join("docs/AGN-202-session-leases.md")).unwrap();
    std::fs::remove_file(root.join("src/lease.rs")).unwrap();
    let report = index_folder(index.as_ref(), "t3", "aptix", &root, &[], opts(), |_, _| {})
        .await
        .unwrap();
    assert_eq!(report.removed, 2);
    assert!(!exists(&mut conn).await, "an empty index has no key");
    let empty = index.frequencies("t3", &["lease".into()]).await.unwrap();
    assert_eq!((empty.chunks, empty.df.as_slice()), (0, &[0][..]));

    // Indexed again: the key is back, with the right count.
    std::fs::write(root.join("docs/AGN-202-session-leases.md"), LEASE_DOC).unwrap();
    index_folder(index.as_ref(), "t3", "aptix", &root, &[], opts(), |_, _| {})
        .await
        .unwrap();
    assert!(exists(&mut conn).await);
    assert!(index.frequencies("t3", &[]).await.unwrap().chunks > 0);
}

#[tokio::test]
pub(super) async fn the_obviously_relevant_chunk_ranks_first() {
    for (name, index, _guard) in indexes().await {
        let root = corpus();
        let _c = Cleanup(root.clone());
        index_folder(index.as_ref(), "t", "aptix", &root, &[], opts(), |_, _| {})
            .await
            .unwrap();
        let hits = search(
            &index,
            "t",
            "How does lease renewal with a fencing token work?",
            vec![],
        )
        .await;
        assert_eq!(
            hits[0],
            ("docs/AGN-202-session-leases.md".to_string(), 6),
            "{name}: {hits:?}"
        );
        let hits = search(&index, "t", "delay queue dead-letter", vec![]).await;
        assert_eq!(
            hits[0],
            ("docs/AGN-201-queue-retries.md".to_string(), 6),
            "{name}: {hits:?}"
        );
        assert!(
            search(&index, "t", "kubernetes helm", vec![])
                .await
                .is_empty()
        );
    }
}

/// 120 files of 6 chunks whose words follow a long-tailed distribution (`w0` in most chunks,
/// `w150` in few), tagged by file parity; deterministic.
pub(super) async fn long_tailed_corpus(index: &dyn ChunkIndex) {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for f in 0..120 {
        let chunks: Vec<Chunk> = (0..6)
            .map(|s| {
                let words: Vec<String> = (0..(8 + next() % 30))
                    .map(|_| {
                        // Weight about 1/(k+1) over 200 words.
                        let u = (next() % 1_000_000) as f64 / 1_000_000.0;
                        format!("w{}", (201f64.powf(u) - 1.0) as u32)
                    })
                    .collect();
                Chunk {
                    id: format!("c_{f}_{s}"),
                    path: format!("doc-{f}.md"),
                    line_start: s * 10 + 1,
                    line_end: s * 10 + 9,
                    language: "markdown".into(),
                    repo: "r".into(),
                    tags: vec![if f % 2 == 0 { "even" } else { "odd" }.into()],
                    doc_id: None,
                    content: words.join(" "),
                }
            })
            .collect();
        index
            .put_file("t", "r", &format!("doc-{f}.md"), "h", &chunks)
            .await
            .unwrap();
    }
}

/// Every index answers the reads ranking builds on alike — a term's frequency is the length of
/// its list, a posting read by id is the one in the list — and ranking that reads the rarest
/// terms first returns exactly what scoring every chunk does, scope and all.
#[tokio::test]
pub(super) async fn pruned_ranking_reads_each_index_alike_and_matches_the_full_ranking() {
    for (name, index, _guard) in indexes().await {
        long_tailed_corpus(index.as_ref()).await;
        let terms: Vec<String> = ["w0", "w3", "w40", "w190", "absent"]
            .iter()
            .map(|t| t.to_string())
            .collect();
        let f = index.frequencies("t", &terms).await.unwrap();
        assert_eq!(f.chunks, 720, "{name}");
        let lists = index.postings("t", &terms).await.unwrap();
        let lens: Vec<u64> = lists.iter().map(|l| l.len() as u64).collect();
        assert_eq!(f.df, lens, "{name}");
        assert!(f.df[0] > 300 && f.df[4] == 0, "{name}: {:?}", f.df);
        let ids: Vec<String> = (0..720)
            .map(|i| format!("c_{}_{}", i / 6, i % 6))
            .chain(["c_missing".to_string()])
            .collect();
        let lengths: u64 = index
            .metas("t", &ids)
            .await
            .unwrap()
            .iter()
            .flatten()
            .map(|m| u64::from(m.tokens))
            .sum();
        assert_eq!(
            f.tokens, lengths,
            "{name}: the tokens are the chunks' lengths"
        );
        let by_id = index.postings_of("t", &terms, &ids).await.unwrap();
        for (list, column) in lists.iter().zip(&by_id) {
            let expected: Vec<_> = ids.iter().map(|id| list.get(id).copied()).collect();
            assert_eq!(column, &expected, "{name}");
        }
        assert!(
            index
                .frequencies("nobody", &terms)
                .await
                .unwrap()
                .df
                .iter()
                .all(|d| *d == 0),
            "{name}"
        );

        let whole = Bm25Retriever::new(index.clone()).with_whole_read(u64::MAX);
        let pruned = Bm25Retriever::new(index.clone()).with_whole_read(0);
        let queries = [
            ("w0 w1 w150", vec![], vec![]),
            (
                "w0 w2 w5 w77",
                vec![cond("tags", RagOperator::Equals, &["odd"])],
                vec![],
            ),
            ("w1 w3 w120 w199", vec![], vec!["doc-7.md".to_string()]),
            ("w0 w1 w2 w3", vec![], vec![]),
            (
                "w60",
                vec![cond("path", RagOperator::NotEquals, &["doc-1.md"])],
                vec![],
            ),
        ];
        for (text, conditions, exclude_paths) in queries {
            let q = RagQuery {
                text: text.into(),
                conditions,
                exclude_paths,
                limit: 8,
            };
            let rank = |found: Vec<aptix_worker::rag::Scored>| -> Vec<(String, u64)> {
                found
                    .into_iter()
                    .map(|s| (s.chunk.id, s.score.to_bits()))
                    .collect()
            };
            let expected = rank(whole.retrieve("t", &q).await.unwrap());
            assert!(!expected.is_empty(), "{name}: {text}");
            assert_eq!(
                rank(pruned.retrieve("t", &q).await.unwrap()),
                expected,
                "{name}: {text}"
            );
        }
    }
}
