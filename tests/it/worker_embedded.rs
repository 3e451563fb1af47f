//! The worker on the embedded broker (the same worker code path as RabbitMQ): shutdown and
//! jobs that do not apply to their turn.

use std::sync::Arc;
use std::time::Duration;

use aptix_worker::catalog::ModeCatalog;
use aptix_worker::contract::SessionId;
use aptix_worker::fake_llm::{FakeLlm, FakeOptions};
use aptix_worker::frontdoor::FrontDoor;
use aptix_worker::llm::LlmClient;
use aptix_worker::pipeline::{Pipeline, PipelineSettings};
use aptix_worker::queue::{JobQueue as _, MemoryBroker, ReplyBus as _, Topology};
use aptix_worker::store::{MemoryStore, SessionStore, TurnStatus, TurnStatusView};
use aptix_worker::worker::{Worker, WorkerSettings};
use tokio_util::sync::CancellationToken;

async fn setup(
    latency: Duration,
    grace: Duration,
) -> (Arc<MemoryBroker>, Worker, FrontDoor, FakeLlm) {
    let fake = FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        FakeOptions {
            latency,
            ..Default::default()
        },
        None,
    )
    .await
    .unwrap();
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let broker = Arc::new(MemoryBroker::new());
    let llm = LlmClient::new(
        &fake.base_url(),
        None,
        Duration::from_secs(2),
        Duration::from_secs(30),
        0,
    )
    .unwrap();
    let pipeline = Pipeline::new(
        store.clone(),
        Arc::new(ModeCatalog::builtin()),
        llm,
        PipelineSettings::new("m"),
    )
    .unwrap();
    let settings = WorkerSettings {
        shutdown_grace: grace,
        ..WorkerSettings::default()
    };
    let worker = Worker::new(broker.clone(), pipeline, Topology::new("t"), settings);
    let door = FrontDoor::new(store, broker.clone(), Default::default());
    (broker, worker, door, fake)
}

#[tokio::test]
async fn shutdown_finishes_in_flight_turns_within_the_grace_period() {
    let (broker, worker, door, _fake) =
        setup(Duration::from_millis(500), Duration::from_secs(5)).await;
    let mut replies = broker
        .subscribe_replies(&SessionId::parse("s").unwrap())
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let task = worker.spawn(stop.clone());
    door.submit(br#"{"sessionId":"s","turnId":"t","instruction":"slow"}"#)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await; // the turn is now waiting for the model
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("stops within the grace period")
        .unwrap();
    let body = replies
        .try_recv()
        .expect("the in-flight turn finished before the worker stopped");
    let view: TurnStatusView = serde_json::from_slice(&body).unwrap();
    assert_eq!(view.status, TurnStatus::Completed);
}

#[tokio::test]
async fn turns_unfinished_at_the_deadline_are_left_for_redelivery() {
    let (broker, worker, door, _fake) =
        setup(Duration::from_secs(3), Duration::from_millis(200)).await;
    let stop = CancellationToken::new();
    let task = worker.spawn(stop.clone());
    door.submit(br#"{"sessionId":"s","turnId":"t","instruction":"slow"}"#)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("gives up after the grace period")
        .unwrap();
    assert_eq!(
        worker
            .stats()
            .completed
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    // The job was not acked: once its task is gone the broker has it again for another worker.
    let mut deliveries = broker.consume(1).await.unwrap();
    let again = tokio::time::timeout(Duration::from_secs(5), deliveries.recv())
        .await
        .expect("redelivered")
        .unwrap();
    assert!(again.redelivered);
}

#[tokio::test]
async fn a_stray_continuation_job_is_dropped_without_overwriting_the_turn_status() {
    let (broker, worker, door, _fake) = setup(Duration::ZERO, Duration::from_secs(5)).await;
    let mut replies = broker
        .subscribe_replies(&SessionId::parse("s").unwrap())
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let task = worker.spawn(stop.clone());
    door.submit(br#"{"sessionId":"s","turnId":"t","instruction":"hi"}"#)
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), replies.recv())
        .await
        .unwrap()
        .unwrap();
    let view: TurnStatusView = serde_json::from_slice(&first).unwrap();
    assert_eq!(view.status, TurnStatus::Completed);
    // A continuation job for the completed turn (bypassing the front door, as a duplicate or a
    // race would) is acked without a reply.
    broker
        .publish_job(br#"{"sessionId":"s","turnId":"t","toolResults":[{"toolCallId":"c","executionMs":1,"resultJson":"{}"}]}"#)
        .await
        .unwrap();
    door.submit(br#"{"sessionId":"s","turnId":"t2","instruction":"next"}"#)
        .await
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), replies.recv())
        .await
        .unwrap()
        .unwrap();
    let view: TurnStatusView = serde_json::from_slice(&next).unwrap();
    assert_eq!(
        (view.turn_id.as_str(), view.status),
        ("t2", TurnStatus::Completed)
    );
    assert_eq!(
        broker.ready_len(),
        0,
        "the stray job was acked, not requeued"
    );
    stop.cancel();
    task.await.unwrap();
}
