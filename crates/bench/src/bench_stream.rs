//! `aptix-bench turns --first-delta`: how much later a streaming turn's first words reach its client
//! than the model wrote them. For each turn, the time from the fake model handing its first
//! text delta to the connection to the client reading its first NDJSON `delta` line — through
//! the front door, the worker, the events exchange and the event hub — against the same model
//! called directly (the client reading the first delta event of a streamed call), in the same
//! run.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt as _;
use tokio_util::sync::CancellationToken;

use aptix_worker::config::Config;
use aptix_worker::fake_llm::FakeOptions;
use aptix_worker::worker::WorkerSettings;

use super::bench::{cleanup, ms, parts_with, percentile, percentiles};

/// Reads a streamed body until `is_first` accepts a line; returns when it did.
async fn first_line(
    resp: reqwest::Response,
    is_first: impl Fn(&str) -> bool,
) -> anyhow::Result<Instant> {
    let mut bytes = resp.bytes_stream();
    let mut pending = Vec::new();
    let mut seen = None;
    while let Some(chunk) = bytes.next().await {
        pending.extend_from_slice(&chunk.context("the stream broke")?);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if seen.is_none() && is_first(&String::from_utf8_lossy(&line)) {
                seen = Some(Instant::now());
            }
        }
    }
    seen.context("the stream had no text")
}

/// Runs `turns` streaming turns one after another, and as many direct streamed calls.
pub async fn run(config: &Config, turns: usize) -> anyhow::Result<()> {
    let fake = FakeOptions {
        stream_pieces: 16,
        stream_delay: Duration::from_millis(5),
        ..FakeOptions::default()
    };
    let p = parts_with(config, fake).await?;
    let result = measure(&p, turns).await;
    cleanup(&p).await;
    result
}

async fn measure(p: &super::bench::Parts, turns: usize) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let (stop_worker, worker) = p.start_worker(WorkerSettings::default());
    let stop = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    p.app.spawn_http(&p.config, listener, stop.clone());

    // The model called directly, streamed.
    let mut direct = Vec::with_capacity(turns);
    for i in 0..turns {
        let resp = http
            .post(format!("{}/responses", p.fake.base_url()))
            .json(&serde_json::json!({"model": "bench-model", "input": format!("direct {i}"), "stream": true}))
            .send()
            .await?;
        let read = first_line(resp, |l| l.contains("\"response.output_text.delta\"")).await?;
        let wrote = *p
            .fake
            .first_delta_times()
            .last()
            .context("no delta written")?;
        direct.push(read.saturating_duration_since(wrote));
    }
    // Through the product.
    let mut relayed = Vec::with_capacity(turns);
    for i in 0..turns {
        let before = p.fake.first_delta_times().len();
        let resp = http
            .post(format!("{base}/api/ai/agent/execute"))
            .body(serde_json::json!({"sessionId": format!("fd-{i}"), "turnId": "t", "instruction": "stream", "streaming": true}).to_string())
            .send()
            .await?;
        let read = first_line(resp, |l| l.contains("\"kind\":\"delta\"")).await?;
        let times = p.fake.first_delta_times();
        anyhow::ensure!(times.len() == before + 1, "one streamed call per turn");
        relayed.push(read.saturating_duration_since(times[before]));
    }
    stop.cancel();
    stop_worker.cancel();
    let _ = worker.await;
    direct.sort();
    relayed.sort();
    let show = percentiles;
    println!(
        "aptix-bench turns --first-delta: {turns} streaming turns, one at a time, {} + {}",
        if p.config.broker.url.is_some() {
            "RabbitMQ"
        } else {
            "in-memory broker"
        },
        if p.config.store.url.is_some() {
            "Redis"
        } else {
            "in-memory store"
        },
    );
    println!(
        "  model's first delta -> client, model called directly   {}",
        show(&direct)
    );
    println!(
        "  model's first delta -> client's first NDJSON line       {}",
        show(&relayed)
    );
    println!(
        "  added by the product at p50: {:.2} ms",
        ms(percentile(&relayed, 0.5)) - ms(percentile(&direct, 0.5))
    );
    Ok(())
}
