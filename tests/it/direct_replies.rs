//! The direct reply channel: a front door hears of the turns it accepted without any
//! per-session binding in RabbitMQ; a long-poll of a turn accepted elsewhere binds the session
//! and still gets the result.

use std::time::Duration;

use aptix_worker::contract::{RequestLimits, parse_request};
use aptix_worker::fake_llm::FakeOptions;
use aptix_worker::frontdoor::{FrontDoor, Pickup};
use aptix_worker::trace::TraceContext;
use serde_json::{Value, json};

use crate::app::{App, AppOptions, spawn};
use crate::queue_events::{binding_keys, count};

/// An app on RabbitMQ and Redis whose model takes `latency` to answer.
async fn slow_app(latency: Duration) -> App {
    spawn(AppOptions {
        fake: FakeOptions {
            latency,
            ..Default::default()
        },
        ..AppOptions::default()
    })
    .await
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Long-polls a turn on `app` in the background.
fn long_poll(app: &App, session: &str) -> tokio::task::JoinHandle<Value> {
    let req = app
        .http
        .get(format!(
            "{}/v1/sessions/{session}/turns/t?wait=30",
            app.base
        ))
        .bearer_auth("tok-a");
    tokio::spawn(async move { req.send().await.unwrap().json::<Value>().await.unwrap() })
}

#[tokio::test]
async fn waiting_on_the_front_door_that_accepted_the_turn_binds_nothing() {
    let app = slow_app(Duration::from_millis(1500)).await;
    let (sync_sid, poll_sid) = (unique("sync"), unique("poll"));
    let sync = {
        let req = app
            .http
            .post(format!("{}/api/ai/agent/execute", app.base))
            .bearer_auth("tok-a")
            .json(&json!({"sessionId": sync_sid, "turnId": "t", "instruction": "hi"}));
        tokio::spawn(async move { req.send().await.unwrap().json::<Value>().await.unwrap() })
    };
    let body = json!({"sessionId": poll_sid, "turnId": "t", "instruction": "hi"});
    let (status, accepted) = app.post(Some("tok-a"), body.to_string()).await;
    assert_eq!(status, 202, "{accepted}");
    let poll = long_poll(&app, &poll_sid);
    // Both wait while the model takes its time: neither session is bound anywhere.
    app.wait_for_model_calls(2).await;
    app.wait_for_metric(
        "aptix_http_requests_in_flight{route=\"/v1/sessions/{sessionId}/turns/{turnId}\"}",
        |v| v >= 1.0,
    )
    .await;
    let keys = binding_keys();
    assert_eq!(
        count(&keys, crate::support::sid_a(&sync_sid).as_str()),
        0,
        "the synchronous wait bound its session"
    );
    assert_eq!(
        count(&keys, crate::support::sid_a(&poll_sid).as_str()),
        0,
        "the long-poll bound its session"
    );
    let answer = sync.await.unwrap();
    assert_eq!(answer["successful"], true, "{answer}");
    assert_eq!(answer["result"]["kind"], "final", "{answer}");
    let polled = poll.await.unwrap();
    assert_eq!(polled["result"]["status"], "completed", "{polled}");
}

#[tokio::test]
async fn a_long_poll_of_a_turn_accepted_elsewhere_binds_the_session_and_gets_the_result() {
    // The model takes long enough for the binding to outlast a `rabbitmqctl` listing on a
    // loaded machine (it starts an Erlang VM: seconds under load): at 1.5 s the turn could end,
    // and the binding go, before the first listing read the bindings.
    let app = slow_app(Duration::from_secs(5)).await;
    let sid = unique("elsewhere");
    // Another front door accepts the turn: the job names that front door, not this one.
    let other = FrontDoor::new(
        app.store.clone(),
        app.broker.clone(),
        RequestLimits::default(),
    );
    let body = json!({"sessionId": sid, "turnId": "t", "instruction": "hi"}).to_string();
    let request = parse_request(body.as_bytes(), &RequestLimits::default())
        .unwrap()
        .request;
    other
        .submit(
            "tenant-a",
            &request,
            &TraceContext::new_root(),
            Pickup::later(Some("amq.gen-another-front-door")),
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let poll = long_poll(&app, &sid);
    app.wait_for_model_calls(1).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(4);
    while count(&binding_keys(), crate::support::sid_a(&sid).as_str()) != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the long-poll did not bind the session"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let polled = poll.await.unwrap();
    assert_eq!(polled["result"]["status"], "completed", "{polled}");
    // Heard from the worker's broadcast (the session was marked watched before it was
    // bound), not from the store read a long-poll makes every 15 s in case it missed one.
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "the long-poll answered only after {:?}",
        started.elapsed()
    );
}

/// The synchronous answer is the result the worker published, byte for byte the result the
/// store keeps (the front door passes it on without reading it whole); a request whose
/// parsing left warnings gets the same result with its warnings joined.
#[tokio::test]
async fn the_synchronous_answer_is_the_published_result_and_keeps_the_requests_warnings() {
    let app = slow_app(Duration::from_millis(200)).await;
    for (extra, warned) in [(None, false), (Some(("conversationId", "old")), true)] {
        let sid = unique("sync-raw");
        let mut request = json!({"sessionId": sid, "turnId": "t", "instruction": "hi"});
        if let Some((field, value)) = extra {
            request[field] = json!(value);
        }
        let resp = app
            .http
            .post(format!("{}/api/ai/agent/execute", app.base))
            .bearer_auth("tok-a")
            .json(&request)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["content-type"],
            "application/json",
            "{extra:?}"
        );
        let answer: Value = resp.json().await.unwrap();
        app.conforms("post", "/api/ai/agent/execute", 200, &answer);
        assert_eq!(answer["successful"], true, "{answer}");
        let stored = app.settled("tok-a", &sid, "t").await["result"].clone();
        assert_eq!(stored["successful"], true, "{stored}");
        if warned {
            assert_eq!(
                answer["warnings"][0]["errorCode"], "UNKNOWN_FIELD",
                "{answer}"
            );
            let mut without = answer.clone();
            without["warnings"] = json!([]);
            assert_eq!(without, stored);
        } else {
            assert_eq!(answer, stored);
        }
    }
}
