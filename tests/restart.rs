//! A RabbitMQ restart under a waiting client. The broker's application is stopped and started
//! again, which every connection on it notices, so this test has a binary of its own: cargo
//! runs test binaries one after another. The broker is started again even if the test fails.

#![allow(dead_code)] // the shared helpers serve the other test binary too

#[path = "it/app.rs"]
mod app;
#[path = "it/support.rs"]
mod support;

use std::process::Command;
use std::time::Duration;

use aptix_worker::contract::{SessionId, TurnId};
use aptix_worker::fake_llm::FakeOptions;
use aptix_worker::store::TurnStatus;
use serde_json::{Value, json};

use app::{AppOptions, spawn};
use support::rabbitmqctl;

/// The broker's application, stopped until this is dropped.
struct Stopped;

impl Stopped {
    fn now() -> Self {
        rabbitmqctl(&["stop_app"]);
        Self
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // Bounded: a broker that recovers many durable queues takes its time, but the test
        // must end either way (the answer's own timeout then fails it).
        let _ = Command::new("timeout")
            .args(["180", "rabbitmqctl", "start_app"])
            .output();
        let _ = Command::new("rabbitmqctl")
            .args(["await_startup", "--timeout", "60"])
            .output();
    }
}

#[tokio::test]
async fn a_synchronous_wait_gets_its_answer_across_a_broker_restart() {
    let app = spawn(AppOptions {
        fake: FakeOptions {
            latency: Duration::from_secs(4),
            ..Default::default()
        },
        ..AppOptions::default()
    })
    .await;
    let sid = format!("restart-{}", uuid::Uuid::new_v4().simple());
    let waiting = {
        let req = app
            .http
            .post(format!("{}/api/ai/agent/execute", app.base))
            .bearer_auth("tok-a")
            .timeout(Duration::from_secs(300))
            .json(&json!({"sessionId": sid, "turnId": "t", "instruction": "hi"}));
        tokio::spawn(async move { req.send().await.unwrap().json::<Value>().await.unwrap() })
    };
    // The worker is in the model call, the client waits directly on the front door's hub:
    // the broker goes away under both, and comes back.
    app.wait_for_model_calls(1).await;
    {
        let _stopped = Stopped::now();
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let answer = tokio::time::timeout(Duration::from_secs(120), waiting)
        .await
        .expect("the waiting client gets an answer, never a hang")
        .unwrap();
    assert_eq!(answer["successful"], true, "{answer}");
    assert_eq!(answer["result"]["kind"], "final", "{answer}");
    let record = app
        .store
        .get_turn(
            // tok-a is tenant-a's: its sessions are scoped to it.
            &SessionId::parse(&sid).unwrap().within("tenant-a"),
            &TurnId::parse("t").unwrap(),
        )
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(record.status, TurnStatus::Completed);
    assert_eq!(
        answer,
        serde_json::to_value(record.result.unwrap()).unwrap(),
        "the answer is the stored result"
    );
}
