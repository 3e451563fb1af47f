//! `aptix-bench rag`: index and query time on a synthetic corpus of a few thousand chunks, for
//! the in-memory and the Redis index, each against a baseline measured in the same run:
//!
//! - indexing against chunking alone (memory) and against one pipelined `HSET` of each chunk's
//!   text (Redis): what the inverted index and its bookkeeping cost on top of storing the text;
//! - a BM25 query against a brute-force scan that counts the query's terms in every chunk in
//!   memory (the cheapest "retrieval" there is, and the one that stops scaling first).

use std::time::{Duration, Instant};

use super::chunker::{ChunkOptions, chunk_file};
use super::{Bm25Retriever, Chunk, ChunkIndex, MemoryIndex, RagError, RagQuery, RedisIndex};
use super::{Retriever, tokenize};

/// Benchmark size.
#[derive(Debug, Clone, Copy)]
pub struct RagBenchOptions {
    /// Markdown files in the corpus.
    pub files: usize,
    /// Sections (chunks) per file.
    pub sections: usize,
    /// Queries timed per index.
    pub queries: usize,
}

const WORDS: &[&str] = &[
    "lease",
    "queue",
    "retry",
    "session",
    "turn",
    "worker",
    "fencing",
    "token",
    "broker",
    "redis",
    "model",
    "prompt",
    "context",
    "chunk",
    "index",
    "mode",
    "catalog",
    "tool",
    "continuation",
    "result",
    "batch",
    "tenant",
    "metric",
    "latency",
    "budget",
    "replay",
    "schema",
    "request",
    "response",
    "artifact",
    "scope",
    "filter",
    "ranking",
    "deadline",
    "shutdown",
    "consumer",
    "publisher",
    "confirm",
    "dead",
    "letter",
    "poison",
    "backoff",
    "timeout",
    "snapshot",
    "ledger",
    "checkpoint",
    "owner",
    "fence",
    "commit",
    "rollback",
];

/// Distinct words in the synthetic vocabulary.
const VOCABULARY: usize = 5000;

/// A word from a Zipf-like distribution over the vocabulary (rank r drawn with weight ~1/r):
/// a few very common words and a long tail, like real text.
fn zipf_word(rng: &mut fastrand::Rng) -> String {
    // Inverse-transform sampling of a continuous 1/x density on [1, V].
    let r = (VOCABULARY as f64).powf(rng.f64()) as usize;
    let r = r.clamp(1, VOCABULARY);
    match WORDS.get(r - 1) {
        Some(w) => (*w).to_string(),
        None => format!("term{r}"),
    }
}

/// A deterministic corpus: `files` Markdown files of `sections` sections of ~8 lines each.
pub fn corpus(opts: RagBenchOptions) -> Vec<(String, String)> {
    let mut rng = fastrand::Rng::with_seed(7);
    (0..opts.files)
        .map(|f| {
            let mut text = format!("# BEN-{f:04} Design record {f}\n\n");
            for s in 0..opts.sections {
                text.push_str(&format!("## Section {s}\n"));
                for _ in 0..7 {
                    let line: Vec<String> = (0..10).map(|_| zipf_word(&mut rng)).collect();
                    text.push_str(&line.join(" "));
                    text.push('\n');
                }
                text.push('\n');
            }
            (format!("docs/BEN-{f:04}.md"), text)
        })
        .collect()
}

/// Queries of five words drawn like the text (a mix of common and rare terms).
fn queries(n: usize) -> Vec<String> {
    let mut rng = fastrand::Rng::with_seed(11);
    (0..n)
        .map(|_| {
            (0..5)
                .map(|_| zipf_word(&mut rng))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// The brute-force baseline: count query terms in every chunk, keep the best `limit`.
fn scan(chunks: &[(Vec<String>, usize)], query: &str, limit: usize) -> Vec<usize> {
    let terms = tokenize(query);
    let mut scored: Vec<(usize, usize)> = chunks
        .iter()
        .map(|(tokens, i)| (tokens.iter().filter(|t| terms.contains(t)).count(), *i))
        .filter(|(s, _)| *s > 0)
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().take(limit).map(|(_, i)| i).collect()
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn time_queries(
    index: std::sync::Arc<dyn ChunkIndex>,
    qs: &[String],
) -> Result<Vec<Duration>, RagError> {
    let retriever = Bm25Retriever::new(index);
    let mut times = Vec::with_capacity(qs.len());
    for q in qs {
        let query = RagQuery {
            text: q.clone(),
            limit: 8,
            ..RagQuery::default()
        };
        let t = Instant::now();
        let hits = retriever.retrieve("bench", &query).await?;
        times.push(t.elapsed());
        std::hint::black_box(hits);
    }
    times.sort();
    Ok(times)
}

/// How long indexing `files` (all of them, as new) takes.
async fn time_indexing(
    index: &dyn ChunkIndex,
    files: &[(String, String)],
    copts: ChunkOptions,
) -> Result<Duration, RagError> {
    let t = Instant::now();
    super::index_files(index, "bench", "bench", files, &[], true, copts, |_, _| {}).await?;
    Ok(t.elapsed())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One report line: index time and query latency percentiles.
fn row(label: &str, index: Duration, queries: &[Duration]) {
    println!(
        "  {label:<30}{:>10.1} ms {:>8.2} ms {:>8.2} ms",
        ms(index),
        ms(pct(queries, 0.5)),
        ms(pct(queries, 0.99))
    );
}

/// One ratio line: `measured` over `baseline`, index and query percentiles.
fn ratio_row(
    label: &str,
    (index, queries): (Duration, &[Duration]),
    (base_index, base_queries): (Duration, &[Duration]),
) {
    let r = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    println!(
        "  {label:<30}{:>10.2}x {:>9.2}x {:>9.2}x",
        r(index, base_index),
        r(pct(queries, 0.5), pct(base_queries, 0.5)),
        r(pct(queries, 0.99), pct(base_queries, 0.99))
    );
}

/// Runs the benchmark (Redis part only with `redis_url`) and prints the report.
pub async fn run(redis_url: Option<&str>, opts: RagBenchOptions) -> Result<(), RagError> {
    let files = corpus(opts);
    let qs = queries(opts.queries);
    let copts = ChunkOptions::default();

    // Baseline for indexing: chunking alone.
    let t = Instant::now();
    let chunked: Vec<Vec<Chunk>> = files
        .iter()
        .map(|(p, text)| chunk_file("bench", p, text, &[], copts).unwrap_or_default())
        .collect();
    let chunk_time = t.elapsed();
    let n_chunks: usize = chunked.iter().map(Vec::len).sum();
    println!(
        "aptix-bench rag: {} files, {n_chunks} chunks, {VOCABULARY}-word Zipf vocabulary, {} queries of 5 terms, top 8",
        files.len(),
        qs.len()
    );

    let memory = std::sync::Arc::new(MemoryIndex::new());
    let mem_index = time_indexing(memory.as_ref(), &files, copts).await?;

    // Baseline for queries: a brute-force scan over pre-tokenized chunks in memory.
    let scan_corpus: Vec<(Vec<String>, usize)> = chunked
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| (tokenize(&c.content), i))
        .collect();
    let mut scan_times = Vec::with_capacity(qs.len());
    for q in &qs {
        let t = Instant::now();
        std::hint::black_box(scan(&scan_corpus, q, 8));
        scan_times.push(t.elapsed());
    }
    scan_times.sort();
    let mem_q = time_queries(memory, &qs).await?;

    println!("                                   index total   query p50   query p99");
    row("baseline: chunk only / scan", chunk_time, &scan_times);
    row("memory index (BM25)", mem_index, &mem_q);
    ratio_row(
        "ratio memory / baseline",
        (mem_index, &mem_q),
        (chunk_time, &scan_times),
    );

    let Some(url) = redis_url else {
        println!("  (set APTIX_REDIS_URL for the Redis index)");
        return Ok(());
    };
    let ns = format!("aptix-bench-{}", uuid::Uuid::new_v4().simple());
    let client = redis::Client::open(url).map_err(RagError::Redis)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(RagError::Redis)?;
    // Baseline for Redis indexing: every chunk's text stored with one HSET, 500 per pipeline.
    let t = Instant::now();
    let all: Vec<&Chunk> = chunked.iter().flatten().collect();
    for part in all.chunks(500) {
        let mut pipe = redis::pipe();
        for c in part {
            pipe.hset(format!("{ns}:baseline"), &c.id, &c.content)
                .ignore();
        }
        pipe.query_async::<()>(&mut conn)
            .await
            .map_err(RagError::Redis)?;
    }
    let hset_time = t.elapsed();
    let redis = std::sync::Arc::new(RedisIndex::connect(url, &ns).await?);
    let redis_index = time_indexing(redis.as_ref(), &files, copts).await?;
    let redis_q = time_queries(redis, &qs).await?;
    // Clean up the bench keys (SCAN, not KEYS: the Redis may be shared).
    let cleaned = match crate::store::RedisStore::connect(url, &ns, Default::default()).await {
        Ok(store) => store.delete_namespace().await.map(drop),
        Err(e) => Err(e),
    };
    if let Err(e) = cleaned {
        tracing::warn!(namespace = %ns, error = %e, "could not delete the benchmark's keys");
    }
    println!(
        "  {:<30}{:>10.1} ms",
        "baseline: HSET of chunk text",
        ms(hset_time)
    );
    row("Redis index (BM25)", redis_index, &redis_q);
    ratio_row(
        "ratio Redis / baseline",
        (redis_index, &redis_q),
        (hset_time, &scan_times),
    );
    Ok(())
}
