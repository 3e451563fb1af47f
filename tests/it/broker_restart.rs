//! A RabbitMQ restart under a waiting client, on a broker of the test's own (one node with its
//! own name, ports and data directory: the machine's broker, which the rest of the suite
//! shares, is never stopped). The broker's application is stopped and started again, which
//! every connection on it notices.

use std::time::Duration;

use aptix_worker::contract::{SessionId, TurnId};
use aptix_worker::fake_llm::FakeOptions;
use aptix_worker::store::TurnStatus;
use serde_json::{Value, json};

use crate::app::{AppOptions, spawn};
use crate::rabbit_cluster::{ONE_CLUSTER_AT_A_TIME, RabbitCluster};

#[tokio::test]
async fn a_synchronous_wait_gets_its_answer_across_a_broker_restart() {
    // Its Erlang VM beside another test's cluster would crowd CI's two cores.
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let broker = tokio::task::spawn_blocking(RabbitCluster::single)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the test's own RabbitMQ node did not start: {e}"));
    let app = spawn(AppOptions {
        amqp_url: Some(broker.urls()),
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
    let broker = tokio::task::spawn_blocking(move || {
        broker.stop_app(0).expect("the broker stops");
        std::thread::sleep(Duration::from_secs(2));
        broker.start_app(0).expect("the broker starts again");
        broker
    })
    .await
    .unwrap();
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
    drop(app);
    drop(broker);
}
