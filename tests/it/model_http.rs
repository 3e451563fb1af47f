//! How the model client reaches the model server, seen from the server (the fake model counts
//! the connections it accepted and the requests that came over HTTP/2): over HTTP/1.1 by
//! default, one connection per call in flight; with `APTIX_LLM_HTTP=http2`, every call a
//! stream, on as few connections as `APTIX_LLM_HTTP2_STREAMS` streams each allow.

use std::time::Duration;

use aptix_worker::fake_llm::FakeOptions;
use serde_json::json;

use crate::app::{App, AppOptions, Backend, spawn};

/// Calls made at once, each waiting on the model while the others start.
const AT_ONCE: usize = 8;

/// Runs [`AT_ONCE`] turns of new sessions at once against a model answering after a second,
/// with `env`; every one completes.
async fn turns_at_once(env: Vec<(&'static str, String)>) -> App {
    let app = spawn(AppOptions {
        backend: Backend::Services,
        extra_env: env,
        fake: FakeOptions {
            latency: Duration::from_secs(1),
            ..FakeOptions::default()
        },
        ..AppOptions::default()
    })
    .await;
    let sent = (0..AT_ONCE).map(|i| {
        let body = json!({"sessionId": format!("wire-{i}"), "turnId": "t", "instruction": "hi"});
        app.post_to(Some("tok-a"), "/api/ai/agent/execute", body.to_string())
    });
    for (status, body) in futures_util::future::join_all(sent).await {
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["kind"], "final", "{body}");
    }
    assert_eq!(app.fake.requests().len(), AT_ONCE);
    assert_eq!(
        app.fake.peak_in_flight(),
        AT_ONCE as u64,
        "the calls overlapped at the model"
    );
    app
}

#[tokio::test]
async fn by_default_each_call_in_flight_has_an_http1_connection_of_its_own() {
    let app = turns_at_once(Vec::new()).await;
    assert_eq!(app.fake.http2_requests(), 0);
    assert_eq!(app.fake.connections(), AT_ONCE as u64);
}

#[tokio::test]
async fn over_http2_the_calls_share_as_few_connections_as_their_streams_allow() {
    let app = turns_at_once(vec![
        ("APTIX_LLM_HTTP", "http2".into()),
        ("APTIX_LLM_HTTP2_STREAMS", "4".into()),
    ])
    .await;
    assert_eq!(app.fake.http2_requests(), AT_ONCE as u64);
    // Four streams a connection: the fifth call opened a second one.
    assert_eq!(app.fake.connections(), 2);
    // A streamed answer's events come through its HTTP/2 stream as they are written.
    let lines = crate::streaming::stream_lines(
        &app,
        crate::streaming::streaming_turn("wire-streamed", "t", "tell me more"),
    )
    .await;
    assert!(
        !crate::streaming::deltas(&lines).is_empty(),
        "deltas streamed: {lines:?}"
    );
    assert!(
        crate::streaming::answer_of(&lines).contains("tell me more"),
        "{lines:?}"
    );
    assert_eq!(app.fake.http2_requests(), AT_ONCE as u64 + 1);
    assert_eq!(app.fake.connections(), 2, "no connection more");
}
