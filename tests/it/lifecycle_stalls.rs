//! A stalled dependency is a prompt 503 and nothing half accepted: Redis stalled at admission, the broker stalled at enqueue, a cancel the broker does not take.

use crate::app::{AppOptions, code, spawn};
use aptix_worker::contract::TurnId;
use aptix_worker::fake_llm::Reply;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Redis stops answering (a proxy in front of it holds every byte, connections stay open):
/// `POST /v1/turns` answers 503 within a bound instead of hanging, `/readyz` answers within a
/// second naming the store, nothing is left half-accepted, and all recovers when Redis does.
#[tokio::test]
async fn a_stalled_redis_is_a_prompt_503_and_nothing_is_half_accepted() {
    let proxy = crate::support::StallProxy::start("127.0.0.1:6379").await;
    let app = spawn(AppOptions {
        redis_url: Some(format!("redis://{}/", proxy.addr)),
        dependency_timeout: Some(Duration::from_millis(700)),
        ..AppOptions::default()
    })
    .await;
    app.fake.push([Reply::Text("before".into())]);
    let turn = |tid: &str| json!({"sessionId": "s", "turnId": tid, "instruction": "x"}).to_string();
    let (status, _) = app.post(Some("tok-a"), turn("t1")).await;
    assert_eq!(status, 202);
    let (_, done) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t1?wait=10")
        .await;
    assert_eq!(done["result"]["status"], "completed");

    proxy.stall(true);
    let started = Instant::now();
    let (status, body) = app.post(Some("tok-a"), turn("t2")).await;
    assert_eq!(
        (status, code(&body)),
        (503, "SERVICE_UNAVAILABLE"),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    // A read is refused as promptly, without claiming anything about acceptance.
    let (status, body) = app.get(Some("tok-a"), "/v1/sessions/s/turns/t1").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body["errors"][0]["message"],
        "the service is temporarily unavailable; try again"
    );
    let started = Instant::now();
    let (status, body) = app.get(None, "/readyz").await;
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status, 503);
    let named = body["errors"].as_array().unwrap().iter().any(|e| {
        e["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("session store:")
    });
    assert!(named, "{body}");

    // The writes held by the stall arrive now, in order, ahead of the reads below on the same
    // connection: the turn's record and then its removal. What is left is what was accepted.
    proxy.resume().await;
    let sid = crate::support::sid_a("s");
    let turns: Vec<String> = app
        .store
        .list_turns(&sid)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(turns, ["t1"], "the refused turn left nothing behind");
    app.fake.push([Reply::Text("after".into())]);
    let (status, body) = app.post(Some("tok-a"), turn("t3")).await;
    assert_eq!(status, 202, "{body}");
    let (_, done) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t3?wait=10")
        .await;
    assert_eq!(done["result"]["status"], "completed");
    let (status, _) = app.get(None, "/readyz").await;
    assert_eq!(status, 200);
}

/// RabbitMQ stops answering: the front door does not wait for a confirm without end; the turn
/// is refused with 503 and taken back, `/readyz` names the broker within a second.
#[tokio::test]
async fn a_stalled_broker_is_a_prompt_503_and_the_turn_is_taken_back() {
    let proxy = crate::support::StallProxy::start("127.0.0.1:5672").await;
    let app = spawn(AppOptions {
        amqp_url: Some(format!("amqp://guest:guest@{}/%2f", proxy.addr)),
        dependency_timeout: Some(Duration::from_millis(700)),
        ..AppOptions::default()
    })
    .await;
    let turn = |tid: &str| json!({"sessionId": "s", "turnId": tid, "instruction": "x"}).to_string();
    app.fake.push([Reply::Text("before".into())]);
    let (status, _) = app.post(Some("tok-a"), turn("t1")).await;
    assert_eq!(status, 202);
    proxy.stall(true);
    let started = Instant::now();
    let (status, body) = app.post(Some("tok-a"), turn("t2")).await;
    assert_eq!(
        (status, code(&body)),
        (503, "SERVICE_UNAVAILABLE"),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let sid = crate::support::sid_a("s");
    let t2 = TurnId::parse("t2").unwrap();
    assert!(
        app.store.get_turn(&sid, &t2).await.unwrap().is_none(),
        "a turn whose job was not confirmed is not left queued"
    );
    let started = Instant::now();
    let (status, body) = app.get(None, "/readyz").await;
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status, 503);
    let named = body["errors"].as_array().unwrap().iter().any(|e| {
        e["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("message broker:")
    });
    assert!(named, "{body}");
    proxy.stall(false);
}

/// A cancel decided at the front door whose status the broker does not take is stored, but
/// the client is not told it went well: 503 saying the turn is cancelled and to cancel again.
/// Cancelling again once the broker is back answers 200 and puts the status in the session's
/// reply queue (where a stored-but-untold cancel would never have gone).
#[tokio::test]
async fn a_cancel_the_broker_does_not_take_is_a_503_and_cancelling_again_tells_of_it() {
    let proxy = crate::support::StallProxy::start("127.0.0.1:5672").await;
    let app = spawn(AppOptions {
        amqp_url: Some(format!("amqp://guest:guest@{}/%2f", proxy.addr)),
        dependency_timeout: Some(Duration::from_millis(700)),
        ..AppOptions::default()
    })
    .await;
    let instruction = "#fake:call workspace_read_file {\"path\":\"README.md\"}";
    let body = json!({"sessionId": "s", "turnId": "t", "instruction": instruction}).to_string();
    assert_eq!(app.post(Some("tok-a"), body).await.0, 202);
    let waiting = app.settled("tok-a", "s", "t").await;
    assert_eq!(waiting["status"], "awaiting_client_tools", "{waiting}");
    let cancel = || app.post_to(Some("tok-a"), "/v1/sessions/s/turns/t/cancel", Vec::new());
    let peek = crate::support::amqp_peek().await;
    let queue = app.topology.reply_queue(&crate::support::sid_a("s"));
    crate::support::take_all(&peek, &queue).await;

    proxy.stall(true);
    let (status, body) = cancel().await;
    assert_eq!(
        (status, code(&body)),
        (503, "SERVICE_UNAVAILABLE"),
        "{body}"
    );
    let message = body["errors"][0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("is cancelled") && message.contains("cancel it again"),
        "{body}"
    );
    let record = app
        .store
        .get_turn(&crate::support::sid_a("s"), &TurnId::parse("t").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status.as_str(), "cancelled");
    proxy.stall(false);
    // What the stalled connection held may still arrive; only what the next cancel tells
    // counts from here on.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    crate::support::take_all(&peek, &queue).await;

    let (status, body) = cancel().await;
    assert_eq!(
        (status, &body["result"]["status"]),
        (200, &json!("cancelled")),
        "{body}"
    );
    let mut told = Vec::new();
    for _ in 0..30 {
        told.extend(
            crate::support::take_all(&peek, &queue)
                .await
                .iter()
                .filter_map(|b| serde_json::from_slice::<Value>(b).ok())
                .filter(|v| v["turnId"] == "t" && v["status"] == "cancelled"),
        );
        if !told.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(told.len(), 1, "the second cancel tells of the turn once");
}
