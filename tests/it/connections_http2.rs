//! The API over HTTP/2 by prior knowledge, tried from outside as `connections.rs` tries
//! HTTP/1.1 (`APTIX_HTTP_READ_TIMEOUT_SECS=1`): many synchronous calls waiting at once are
//! streams of one connection, none cut by the read timeout however long its model takes; a
//! connection that carries no stream for the read timeout is closed, as is one whose preface
//! stops short; each connection is counted by the protocol it spoke.

use std::time::{Duration, Instant};

use aptix_worker::fake_llm::FakeOptions;
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::app::{App, AppOptions, Backend, spawn};
use crate::support::{metric, metric_value};

/// What opens an HTTP/2 connection (RFC 9113 §3.4), and an empty `SETTINGS` frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const EMPTY_SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];

/// Calls waiting at once.
const AT_ONCE: usize = 8;

async fn app() -> App {
    spawn(AppOptions {
        backend: Backend::Embedded,
        extra_env: vec![("APTIX_HTTP_READ_TIMEOUT_SECS", "1".into())],
        fake: FakeOptions {
            latency: Duration::from_secs(2),
            ..FakeOptions::default()
        },
        ..AppOptions::default()
    })
    .await
}

fn connections(text: &str, protocol: &str) -> f64 {
    metric(
        text,
        &format!("aptix_http_connections_total{{protocol=\"{protocol}\"}}"),
    )
}

#[tokio::test]
async fn calls_waiting_at_once_are_streams_of_one_connection_and_outlast_the_read_timeout() {
    let app = app().await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let started = Instant::now();
    let calls = (0..AT_ONCE).map(|i| {
        h2.post(format!("{}/api/ai/agent/execute", app.base))
            .bearer_auth("tok-a")
            .body(
                json!({"sessionId": format!("h2-{i}"), "turnId": "t", "instruction": "hi"})
                    .to_string(),
            )
            .send()
    });
    for answer in futures_util::future::join_all(calls).await {
        let answer = answer.unwrap();
        assert_eq!(answer.version(), reqwest::Version::HTTP_2);
        assert_eq!(answer.status().as_u16(), 200);
        let body: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(body["result"]["kind"], "final", "{body}");
    }
    // Each call waited on a 2 s model: twice the read timeout, which does not bound answers.
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(
        app.fake.peak_in_flight(),
        AT_ONCE as u64,
        "the calls overlapped"
    );
    // A call on the client's connection, then the server's count of HTTP/2 connections.
    let call_and_count = || async {
        let answer = h2
            .get(format!("{}/healthz", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 200);
        let text = app.metrics_text().await;
        (connections(&text, "http2"), text)
    };
    // The connection was not closed while its streams waited: the next call goes on it.
    let (counted, text) = call_and_count().await;
    assert_eq!(counted, 1.0, "{text}");
    // The idle connection is closed after the read timeout; the next call opens another.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (counted, text) = call_and_count().await;
    assert_eq!(counted, 2.0, "{text}");
    assert!(
        connections(&text, "http1") >= 1.0,
        "the scrapes' own: {text}"
    );
}

/// A streamed answer's lines come through its HTTP/2 stream as they are written, not when the
/// answer is whole (the stream is counted open until its body ends).
#[tokio::test]
async fn a_streamed_answer_comes_through_its_stream_as_it_is_written() {
    use crate::streaming::{
        answer_of, came_while_written, deltas, pieces, stream_lines_over, streaming_turn,
    };
    // Eight text pieces 250 ms apart: over two seconds, twice the read timeout.
    let app = spawn(AppOptions {
        backend: Backend::Embedded,
        extra_env: vec![("APTIX_HTTP_READ_TIMEOUT_SECS", "1".into())],
        fake: pieces(8, 250),
        ..AppOptions::default()
    })
    .await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let lines = stream_lines_over(&app, &h2, streaming_turn("h2-s", "t", "slowly")).await;
    let shown = deltas(&lines);
    let text: String = shown.iter().map(|d| d["text"].as_str().unwrap()).collect();
    assert_eq!(text, answer_of(&lines), "the deltas make up the answer");
    came_while_written(&lines);
    let text = app.metrics_text().await;
    assert_eq!(connections(&text, "http2"), 1.0, "{text}");
}

/// Reads until the server hangs up; when it did (`None`: not within `limit`).
async fn closed_after(mut conn: TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut seen = Vec::new();
    match tokio::time::timeout(limit, conn.read_to_end(&mut seen)).await {
        Ok(_) => Some(started.elapsed()),
        Err(_) => None,
    }
}

#[tokio::test]
async fn a_connection_with_no_stream_and_a_preface_cut_short_are_closed_and_counted() {
    let app = app().await;
    let addr = app.base.trim_start_matches("http://").to_string();
    let limit = Duration::from_secs(8);
    // Counted from here, read over connections closed after each answer (the test client's
    // pooled ones would be closed, and counted, while idle).
    let scraper = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let scrape = || async {
        let text = scraper
            .get(format!("{}/metrics", app.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        // A series shows once it was counted.
        let read = |series: &str| metric_value(&text, series).unwrap_or(0.0);
        (
            read("aptix_http_connections_timed_out_total{phase=\"headers\"}"),
            read("aptix_http_connections_total{protocol=\"http2\"}"),
        )
    };
    // The app's start-up request left a keep-alive connection; it is closed by now.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (timed_out_before, http2_before) = scrape().await;
    // The preface and settings, then nothing: no stream is ever opened. (It answers no ping
    // either, so the graceful close gives up on it a read timeout later.)
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    idle.write_all(PREFACE).await.unwrap();
    idle.write_all(&EMPTY_SETTINGS).await.unwrap();
    // Half the preface: neither HTTP/2 nor HTTP/1.1 yet.
    let mut cut = TcpStream::connect(&addr).await.unwrap();
    cut.write_all(&PREFACE[..16]).await.unwrap();
    let (idle, cut) = tokio::join!(closed_after(idle, limit), closed_after(cut, limit));
    for (what, at) in [("an idle HTTP/2 connection", idle), ("a cut preface", cut)] {
        let at = at.unwrap_or_else(|| panic!("{what} was kept past {limit:?}"));
        assert!(
            at >= Duration::from_millis(900),
            "{what} closed early: {at:?}"
        );
    }
    let (timed_out, http2) = scrape().await;
    assert_eq!(
        timed_out - timed_out_before,
        2.0,
        "both closed as timed out"
    );
    // The cut preface never became a connection of either protocol.
    assert_eq!(http2 - http2_before, 1.0);
}
