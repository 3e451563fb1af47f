//! What the HTTP layer adds to every answer: a panicking handler's internal invoke result, a
//! request the client abandons counted as 499, a session whose reply queue expired.

use super::lifecycle::*;
use crate::app::{AppOptions, Backend, code, spawn};
use aptix_worker::fake_llm::Reply;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) async fn boom() -> &'static str {
    panic!("a handler bug")
}

/// A handler that panics is answered with a JSON `InvokeResult` (`INTERNAL`, 500) that names
/// the request id, and the server goes on serving.
#[tokio::test]
pub(super) async fn a_panicking_handler_gets_an_internal_invoke_result() {
    use aptix_worker::frontdoor::http::{serve, with_http_layers};
    let metrics = Arc::new(aptix_worker::metrics::Metrics::new());
    let router = with_http_layers(
        axum::Router::new()
            .route("/boom", axum::routing::get(boom))
            .route("/fine", axum::routing::get(|| async { "fine" })),
        metrics.clone(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(serve(listener, router, stop.clone()));
    let http = crate::support::http_client();
    let resp = http.get(format!("{base}/boom")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 500);
    assert!(resp.headers().contains_key("x-request-id"));
    let body: Value = resp.json().await.unwrap();
    assert_eq!(code(&body), "INTERNAL");
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("x-request-id")
    );
    let resp = http.get(format!("{base}/fine")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    // The panic is counted as the 500 it was answered with.
    let text = metrics.encode();
    assert!(
        text.contains("aptix_http_requests_total{route=\"/boom\",method=\"GET\",status=\"500\"} 1"),
        "{text}"
    );
    stop.cancel();
}

/// A request whose client gives up before the answer still shows in the metrics, as 499.
#[tokio::test]
pub(super) async fn a_request_the_client_abandons_is_counted_as_499() {
    use aptix_worker::frontdoor::http::{serve, with_http_layers};
    let metrics = Arc::new(aptix_worker::metrics::Metrics::new());
    let router = with_http_layers(
        axum::Router::new().route(
            "/slow/{id}",
            axum::routing::get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        ),
        metrics.clone(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(serve(listener, router, stop.clone()));
    let gave_up = crate::support::http_client()
        .get(format!("{base}/slow/1"))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(gave_up.is_err(), "the client timed out");
    let line = "aptix_http_requests_total{route=\"/slow/{id}\",method=\"GET\",status=\"499\"} 1";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !metrics.encode().contains(line) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not counted: {}",
            metrics.encode()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
}

/// Reply queues expire when unused; publishing to one does not keep it alive. A session that
/// comes back after its queue expired must find its results in the queue again, whether the
/// front door had its event consumer bound for the session (synchronous endpoint, long-poll)
/// or not (plain polling) — with `APTIX_REPLY_QUEUES=every-session`, which keeps a queue for
/// every status. RabbitMQ only: the embedded broker's queues do not expire.
#[tokio::test]
pub(super) async fn a_session_whose_reply_queue_expired_gets_its_results_there_again() {
    let ttl = Duration::from_millis(1500);
    let app = spawn(AppOptions {
        reply_queue_ttl: Some(ttl),
        extra_env: vec![("APTIX_REPLY_QUEUES", "every-session".into())],
        ..AppOptions::default()
    })
    .await;
    let peek = crate::support::amqp_peek().await;
    let queue = app.topology.reply_queue(&crate::support::sid_a("s"));
    let until_expired = || async {
        for _ in 0..30 {
            if !crate::support::queue_exists(&queue).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("the reply queue {queue} did not expire");
    };
    // The turn ids of the replies waiting in the session's queue. A reply reaches the queue a
    // moment after the publish completes at the front door's event consumer (each queue takes
    // the message on its own), so wait up to two seconds for it to show.
    let turn_ids_in_queue = || async {
        let mut found = Vec::new();
        for _ in 0..20 {
            found.extend(
                crate::support::take_all(&peek, &queue)
                    .await
                    .iter()
                    .filter_map(|b| serde_json::from_slice::<Value>(b).ok())
                    .filter_map(|v| v["turnId"].as_str().map(str::to_string)),
            );
            if !found.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        found
    };
    // First turn: the queue is created and gets the result.
    app.fake.push([Reply::Text("one".into())]);
    app.post(
        Some("tok-a"),
        json!({"sessionId": "s", "turnId": "t1", "instruction": "x"}).to_string(),
    )
    .await;
    let (_, body) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t1?wait=10")
        .await;
    assert_eq!(body["result"]["status"], "completed");
    assert_eq!(turn_ids_in_queue().await, ["t1"]);
    until_expired().await;
    // Second turn through the synchronous endpoint: the front door's event queue is bound for
    // the session, so a publish would not be returned even with the reply queue gone.
    app.fake.push([Reply::Text("two".into())]);
    let resp = app
        .http
        .post(format!("{}/api/ai/agent/execute", app.base))
        .bearer_auth("tok-a")
        .body(json!({"sessionId": "s", "turnId": "t2", "instruction": "x"}).to_string())
        .send()
        .await
        .unwrap();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["result"]["primaryOutputText"], "two", "{body}");
    assert_eq!(turn_ids_in_queue().await, ["t2"]);
    until_expired().await;
    // Third turn, polled without waiting (no event consumer bound).
    app.fake.push([Reply::Text("three".into())]);
    app.post(
        Some("tok-a"),
        json!({"sessionId": "s", "turnId": "t3", "instruction": "x"}).to_string(),
    )
    .await;
    let mut status = String::new();
    for _ in 0..100 {
        let (_, body) = app.get(Some("tok-a"), "/v1/sessions/s/turns/t3").await;
        status = body["result"]["status"].as_str().unwrap_or_default().into();
        if status == "completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, "completed");
    // The reply is published after the result is stored.
    assert_eq!(turn_ids_in_queue().await, ["t3"]);
}

/// At the default `APTIX_REPLY_QUEUES=async-turns`, a turn submitted with `POST /v1/turns`
/// leaves its status in the session's reply queue for a client that subscribes later
/// (`aptix watch`); a synchronous call and a batch line, whose answers are read from the HTTP
/// response and the batch, do not make the broker keep a queue for their sessions.
pub(super) async fn by_default_only_turns_submitted_to_be_read_later_keep_a_reply_queue(
    backend: Backend,
) {
    let app = app_on(backend).await;
    // Read later: submitted, settled, then subscribed to.
    app.post(
        Some("tok-a"),
        json!({"sessionId": "later", "turnId": "t", "instruction": "x"}).to_string(),
    )
    .await;
    app.settled("tok-a", "later", "t").await;
    // Answered in the response.
    let resp = app
        .http
        .post(format!("{}/api/ai/agent/execute", app.base))
        .bearer_auth("tok-a")
        .body(json!({"sessionId": "sync", "turnId": "t", "instruction": "x"}).to_string())
        .send()
        .await
        .unwrap();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["successful"], true, "{body}");
    // A batch line, read from the batch.
    let line = json!({"customId": "doc", "request": {"sessionId": "line", "instruction": "x"}});
    let (status, body) = app
        .post_to(Some("tok-a"), "/v1/batches", line.to_string())
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["result"]["batchId"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = app.get(Some("tok-a"), &format!("/v1/batches/{id}")).await;
        if body["result"]["completed"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the batch did not finish: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first_status = |session: &'static str| {
        let broker = app.broker.clone();
        async move {
            let sid = crate::support::sid_a(session);
            let mut replies = broker.subscribe_replies(&sid).await.unwrap();
            tokio::time::timeout(Duration::from_millis(800), replies.recv())
                .await
                .ok()
                .flatten()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        }
    };
    let kept = first_status("later")
        .await
        .expect("the status waits in the queue");
    assert_eq!(kept["status"], "completed", "{kept}");
    for session in ["sync", "line"] {
        assert_eq!(first_status(session).await, None, "{session} kept a queue");
    }
}
