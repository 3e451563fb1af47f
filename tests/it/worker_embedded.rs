//! The worker on the embedded broker (the same worker code path as RabbitMQ): shutdown and
//! jobs that do not apply to their turn.

use std::sync::Arc;
use std::time::Duration;

use aptix_worker::app::App;
use aptix_worker::config::Config;
use aptix_worker::contract::SessionId;
use aptix_worker::fake_llm::{FakeLlm, FakeOptions};
use aptix_worker::frontdoor::FrontDoor;
use aptix_worker::queue::Broker;
use aptix_worker::store::{TurnStatus, TurnStatusView};
use aptix_worker::worker::Worker;

use crate::support::SubmitLocal as _;
use tokio_util::sync::CancellationToken;

/// The embedded deployment (no URLs: in-memory broker and store) built as the binary builds
/// it, against a fake model answering after `latency`, with a worker that gives in-flight
/// turns `grace` to finish when it stops.
async fn setup(
    latency: Duration,
    grace: Duration,
) -> (Arc<dyn Broker>, Worker, FrontDoor, (App, FakeLlm)) {
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
    let base_url = fake.base_url();
    let mut config =
        Config::from_lookup(|k| (k == "APTIX_LLM_BASE_URL").then(|| base_url.clone())).unwrap();
    config.model.max_retries = 0;
    config.worker.shutdown_grace = grace;
    let app = App::build(&config).await.unwrap();
    let worker = app.worker(&config);
    let door = app.front_door(&config);
    (app.broker.clone(), worker, door, (app, fake))
}

/// Waits (up to 10 s) until the fake model has a request: the turn is in its model call.
async fn model_called(fake: &FakeLlm) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fake.requests().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the model was never called"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn shutdown_finishes_in_flight_turns_within_the_grace_period() {
    let (broker, worker, door, kept) =
        setup(Duration::from_millis(500), Duration::from_secs(5)).await;
    let mut replies = broker
        .subscribe_replies(&SessionId::parse("s").unwrap())
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let task = worker.spawn(stop.clone());
    door.submit_local(br#"{"sessionId":"s","turnId":"t","instruction":"slow"}"#)
        .await
        .unwrap();
    model_called(&kept.1).await; // the turn is now waiting for the model
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
    let (broker, worker, door, kept) =
        setup(Duration::from_secs(3), Duration::from_millis(200)).await;
    let stop = CancellationToken::new();
    let task = worker.spawn(stop.clone());
    door.submit_local(br#"{"sessionId":"s","turnId":"t","instruction":"slow"}"#)
        .await
        .unwrap();
    model_called(&kept.1).await;
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
    let (broker, worker, door, _kept) = setup(Duration::ZERO, Duration::from_secs(5)).await;
    let mut replies = broker
        .subscribe_replies(&SessionId::parse("s").unwrap())
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let task = worker.spawn(stop.clone());
    door.submit_local(br#"{"sessionId":"s","turnId":"t","instruction":"hi"}"#)
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
    door.submit_local(br#"{"sessionId":"s","turnId":"t2","instruction":"next"}"#)
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
    stop.cancel();
    task.await.unwrap();
    // Once the worker is gone, a requeued or unacked job would be delivered again.
    let mut deliveries = broker.consume(1).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), deliveries.recv())
            .await
            .is_err(),
        "the stray job was acked, not requeued"
    );
}

/// On the embedded broker too: a job the worker's limits refuse fails its turn (published) and
/// is dead-lettered, instead of leaving the turn `queued`.
#[tokio::test]
async fn a_job_the_worker_cannot_read_fails_its_turn() {
    let fake = FakeLlm::start("127.0.0.1:0".parse().unwrap(), FakeOptions::default(), None)
        .await
        .unwrap();
    let base_url = fake.base_url();
    let config =
        Config::from_lookup(|k| (k == "APTIX_LLM_BASE_URL").then(|| base_url.clone())).unwrap();
    let app = App::build(&config).await.unwrap();
    let door = app.front_door(&config);
    let mut narrow = config.clone();
    narrow.limits.request.max_instruction_bytes = 10;
    let worker = app.worker(&narrow);
    let mut replies = app
        .broker
        .subscribe_replies(&SessionId::parse("s").unwrap())
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let task = worker.spawn(stop.clone());
    door.submit_local(br#"{"sessionId":"s","turnId":"t","instruction":"more than ten bytes"}"#)
        .await
        .expect("accepted by the front door's limits");
    let reply = tokio::time::timeout(Duration::from_secs(5), replies.recv())
        .await
        .expect("a reply in time")
        .unwrap();
    let view: TurnStatusView = serde_json::from_slice(&reply).unwrap();
    assert_eq!(view.status, TurnStatus::Failed);
    let dead = app.broker.drain_dead(10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    stop.cancel();
    task.await.unwrap();
}
