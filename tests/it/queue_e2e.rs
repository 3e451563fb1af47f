//! The whole job path against the real local RabbitMQ and Redis: front door → queue → worker →
//! pipeline → Redis → reply queue, including the faults it must survive. Every test uses its own
//! namespace and cleans up; every wait is bounded.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use aptix_worker::contract::{ErrorCode, SessionId, TurnId};
use aptix_worker::fake_llm::{FakeLlm, FakeOptions, Reply};
use aptix_worker::frontdoor::FrontDoor;
use aptix_worker::pipeline::PipelineSettings;
use aptix_worker::queue::{JobQueue as _, RabbitBroker, Replies, ReplyBus as _, Topology};
use aptix_worker::store::{SessionStore, TurnStatus, TurnStatusView};
use aptix_worker::worker::{Worker, WorkerSettings};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::SubmitLocal as _;
use crate::support::{RabbitGuard, RedisGuard, rabbit, rabbit_broker, redis_store, schema};

pub(super) struct Deployment {
    fake: FakeLlm,
    store: Arc<dyn SessionStore>,
    rabbit: RabbitGuard,
    door: FrontDoor,
    _redis: RedisGuard,
}

pub(super) struct RunningWorker {
    broker: Arc<RabbitBroker>,
    worker: Worker,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Deployment {
    async fn new(options: FakeOptions) -> Self {
        let fake = FakeLlm::start("127.0.0.1:0".parse().unwrap(), options, Some(schema()))
            .await
            .unwrap();
        let redis = redis_store().await;
        let store: Arc<dyn SessionStore> = redis.store.clone();
        let rabbit = rabbit().await;
        let door = FrontDoor::new(store.clone(), rabbit.broker.clone(), Default::default());
        Self {
            fake,
            store,
            rabbit,
            door,
            _redis: redis,
        }
    }

    fn topology(&self) -> &Topology {
        &self.rabbit.topology
    }

    /// Starts a worker with its own RabbitMQ connection (named, so tests can kill it).
    async fn worker(&self, name: &str, settings: WorkerSettings, lease: Duration) -> RunningWorker {
        let broker = rabbit_broker(
            self.topology(),
            &format!("{}-{name}", self.topology().namespace),
        )
        .await;
        let llm = aptix_worker::llm::LlmClient::new(
            &self.fake.base_url(),
            None,
            Duration::from_secs(2),
            Duration::from_secs(30),
            0,
        )
        .unwrap()
        .with_min_backoff(Duration::from_millis(10));
        let mut ps = PipelineSettings::new("gpt-test");
        ps.lease_ttl = lease;
        let pipeline = aptix_worker::pipeline::Pipeline::new(
            self.store.clone(),
            Arc::new(aptix_worker::catalog::ModeCatalog::builtin()),
            llm,
            ps,
        )
        .unwrap();
        let worker = Worker::new(broker.clone(), pipeline, self.topology().clone(), settings);
        let stop = CancellationToken::new();
        let task = worker.spawn(stop.clone());
        RunningWorker {
            broker,
            worker,
            stop,
            task,
        }
    }

    async fn replies(&self, sid: &str) -> Replies {
        self.rabbit
            .broker
            .subscribe_replies(&SessionId::parse(sid).unwrap())
            .await
            .unwrap()
    }

    async fn status(&self, sid: &str, tid: &str) -> TurnStatus {
        self.store
            .get_turn(
                &SessionId::parse(sid).unwrap(),
                &TurnId::parse(tid).unwrap(),
            )
            .await
            .unwrap()
            .expect("turn stored")
            .status
    }
}

pub(super) fn settings() -> WorkerSettings {
    WorkerSettings {
        concurrency: 8,
        max_attempts: 3,
        busy_delay: Duration::from_millis(200),
        shutdown_grace: Duration::from_secs(5),
        ..WorkerSettings::default()
    }
}

pub(super) async fn next_reply(r: &mut Replies, secs: u64) -> TurnStatusView {
    let body = tokio::time::timeout(Duration::from_secs(secs), r.recv())
        .await
        .expect("a reply in time")
        .expect("reply stream open");
    serde_json::from_slice(&body).expect("a turn status")
}

pub(super) fn submit_body(v: serde_json::Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

/// Kills a worker's broker connection from the RabbitMQ side.
pub(super) fn close_connection(name: &str) {
    let out = Command::new("rabbitmqctl")
        .args([
            "-q",
            "list_connections",
            "--no-table-headers",
            "pid",
            "client_properties",
        ])
        .output()
        .expect("rabbitmqctl runs");
    let listing = String::from_utf8_lossy(&out.stdout);
    let pid = listing
        .lines()
        .find(|l| l.contains(&format!("\"{name}\"")))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("connection {name} not found in:\n{listing}"))
        .to_string();
    let status = Command::new("rabbitmqctl")
        .args(["close_connection", &pid, "test: forced close"])
        .status()
        .expect("rabbitmqctl runs");
    assert!(status.success());
}

#[tokio::test]
pub(super) async fn a_turn_and_a_tool_continuation_go_through() {
    let d = Deployment::new(FakeOptions::default()).await;
    let w = d.worker("w1", settings(), Duration::from_secs(10)).await;
    let mut replies = d.replies("s").await;
    d.fake.push([
        Reply::Calls(vec![(
            "workspace_read_file".into(),
            json!({"path": "a.md"}),
        )]),
        Reply::Text("done".into()),
    ]);
    let accepted = d
        .door
        .submit_local(&submit_body(
            json!({"sessionId": "s", "turnId": "t", "instruction": "read a.md"}),
        ))
        .await
        .unwrap();
    assert_eq!(
        accepted.status,
        TurnStatus::Queued,
        "accepted only after the broker confirmed"
    );
    let first = next_reply(&mut replies, 10).await;
    assert_eq!(first.status, TurnStatus::AwaitingClientTools);
    assert_eq!(d.status("s", "t").await, TurnStatus::AwaitingClientTools);
    let result = first.result.unwrap();
    let Some(aptix_worker::contract::AgentExecuteResponse::ClientToolContinuation(c)) =
        result.result()
    else {
        panic!()
    };
    let id = c.tool_call_ids()[0].to_string();
    d.door.submit_local(&submit_body(json!({"sessionId": "s", "turnId": "t", "toolResults": [{"toolCallId": id, "executionMs": 2, "resultJson": "{\"text\":\"# A\"}"}]}))).await.unwrap();
    let second = next_reply(&mut replies, 10).await;
    assert_eq!(second.status, TurnStatus::Completed);
    assert_eq!(second.turn_id.as_str(), "t");
    assert_eq!(d.status("s", "t").await, TurnStatus::Completed);
    w.stop.cancel();
    w.task.await.unwrap();
}

#[tokio::test]
pub(super) async fn a_poison_message_is_dead_lettered_and_the_worker_keeps_serving() {
    let d = Deployment::new(FakeOptions::default()).await;
    let w = d.worker("w1", settings(), Duration::from_secs(10)).await;
    d.rabbit
        .broker
        .publish_job(b"{ this is not a job")
        .await
        .unwrap();
    d.rabbit
        .broker
        .publish_job(br#"{"sessionId": "bad id"}"#)
        .await
        .unwrap();
    let mut replies = d.replies("s").await;
    d.door
        .submit_local(&submit_body(
            json!({"sessionId": "s", "turnId": "t", "instruction": "hi"}),
        ))
        .await
        .unwrap();
    assert_eq!(
        next_reply(&mut replies, 10).await.status,
        TurnStatus::Completed
    );
    let mut dead = Vec::new();
    for _ in 0..50 {
        dead.extend(d.rabbit.broker.drain_dead(10).await.unwrap());
        if dead.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(
        dead.iter()
            .all(|(_, reason)| reason.starts_with("unparseable job: ")),
        "{dead:?}"
    );
    assert_eq!(
        w.worker
            .stats()
            .dead_lettered
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    w.stop.cancel();
    w.task.await.unwrap();
}

/// A job the front door accepted but the worker cannot read (the two run with different
/// `APTIX_MAX_*` limits) fails its turn with the parser's reasons, published like any result,
/// and is dead-lettered: the turn does not stay `queued` behind a job that is gone.
#[tokio::test]
pub(super) async fn a_job_the_worker_cannot_read_fails_its_turn_and_is_dead_lettered() {
    let d = Deployment::new(FakeOptions::default()).await;
    let narrow = WorkerSettings {
        limits: aptix_worker::contract::RequestLimits {
            max_instruction_bytes: 10,
            ..Default::default()
        },
        ..settings()
    };
    let w = d.worker("w1", narrow, Duration::from_secs(10)).await;
    let mut replies = d.replies("s").await;
    d.door
        .submit_local(&submit_body(
            json!({"sessionId": "s", "turnId": "t", "instruction": "a longer instruction than ten bytes"}),
        ))
        .await
        .expect("the front door's limits take it");
    let reply = next_reply(&mut replies, 10).await;
    assert_eq!(
        (reply.turn_id.as_str(), reply.status),
        ("t", TurnStatus::Failed)
    );
    let result = serde_json::to_value(&reply.result).unwrap();
    assert_eq!(
        result["errors"][0]["errorCode"], "PAYLOAD_TOO_LARGE",
        "{result}"
    );
    assert!(
        result["errors"][0]["details"]
            .as_str()
            .is_some_and(|d| d.contains("APTIX_MAX_")),
        "{result}"
    );
    assert_eq!(d.status("s", "t").await, TurnStatus::Failed);
    let mut dead = Vec::new();
    for _ in 0..50 {
        dead.extend(d.rabbit.broker.drain_dead(10).await.unwrap());
        if !dead.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(
        dead[0].1.starts_with("unparseable job: PAYLOAD_TOO_LARGE"),
        "{dead:?}"
    );
    w.stop.cancel();
    w.task.await.unwrap();
}

#[tokio::test]
pub(super) async fn a_turn_for_a_busy_session_runs_after_the_first_in_order() {
    let d = Deployment::new(FakeOptions {
        latency: Duration::from_millis(400),
        ..Default::default()
    })
    .await;
    let w = d.worker("w1", settings(), Duration::from_secs(10)).await;
    let mut replies = d.replies("s").await;
    d.door
        .submit_local(&submit_body(
            json!({"sessionId": "s", "turnId": "t1", "instruction": "first"}),
        ))
        .await
        .unwrap();
    d.door
        .submit_local(&submit_body(
            json!({"sessionId": "s", "turnId": "t2", "instruction": "second"}),
        ))
        .await
        .unwrap();
    let a = next_reply(&mut replies, 20).await;
    let b = next_reply(&mut replies, 20).await;
    assert_eq!(
        (a.turn_id.as_str(), a.status),
        ("t1", TurnStatus::Completed)
    );
    assert_eq!(
        (b.turn_id.as_str(), b.status),
        ("t2", TurnStatus::Completed)
    );
    assert!(
        w.worker
            .stats()
            .busy
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1,
        "t2 found the session busy"
    );
    // t2 continued the conversation from t1's answer.
    let reqs = d.fake.requests();
    assert_eq!(reqs.len(), 2);
    assert!(reqs[0].get("previous_response_id").is_none());
    assert!(reqs[1]["previous_response_id"].is_string());
    w.stop.cancel();
    w.task.await.unwrap();
}

#[tokio::test]
pub(super) async fn past_the_retry_limit_the_job_is_dead_lettered_and_a_failed_result_published() {
    let d = Deployment::new(FakeOptions::default()).await;
    for _ in 0..10 {
        d.fake.push([Reply::Error {
            status: 503,
            message: "overloaded".into(),
            retry_after_ms: None,
        }]);
    }
    let w = d.worker("w1", settings(), Duration::from_secs(10)).await;
    let mut replies = d.replies("s").await;
    d.door
        .submit_local(&submit_body(
            json!({"sessionId": "s", "turnId": "t", "instruction": "hi"}),
        ))
        .await
        .unwrap();
    let r = next_reply(&mut replies, 20).await;
    assert_eq!(r.status, TurnStatus::Failed);
    let result = r.result.unwrap();
    let e = result.errors()[0].clone();
    assert_eq!(e.error_code, ErrorCode::LlmUnavailable);
    assert!(
        e.message.starts_with("gave up after 3 attempts"),
        "{}",
        e.message
    );
    assert_eq!(d.fake.requests().len(), 3, "three runs, no more");
    assert_eq!(d.status("s", "t").await, TurnStatus::Failed);
    let dead = d.rabbit.broker.drain_dead(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert!(dead[0].1.contains("gave up after 3 attempts"));
    w.stop.cancel();
    w.task.await.unwrap();
}

#[tokio::test]
pub(super) async fn the_worker_recovers_when_its_connection_is_force_closed() {
    let d = Deployment::new(FakeOptions::default()).await;
    let w = d
        .worker("recover", settings(), Duration::from_secs(10))
        .await;
    let mut replies = d.replies("s").await;
    d.door
        .submit_local(&submit_body(
            json!({"sessionId": "s", "turnId": "t1", "instruction": "before"}),
        ))
        .await
        .unwrap();
    assert_eq!(
        next_reply(&mut replies, 10).await.status,
        TurnStatus::Completed
    );
    close_connection(w.broker.connection_name());
    d.door
        .submit_local(&submit_body(
            json!({"sessionId": "s", "turnId": "t2", "instruction": "after"}),
        ))
        .await
        .unwrap();
    // If the close raced t1's ack, t1 is redelivered and its stored result published again
    // (replies are at-least-once); it must not run again.
    let r = loop {
        let r = next_reply(&mut replies, 20).await;
        if r.turn_id.as_str() == "t2" {
            break r;
        }
        assert_eq!(r.status, TurnStatus::Completed);
    };
    assert_eq!(r.status, TurnStatus::Completed);
    assert_eq!(
        d.fake.requests().len(),
        2,
        "each turn called the model once"
    );
    w.stop.cancel();
    w.task.await.unwrap();
}

/// Runs turn `s/t` on a worker that changes the mode (a server tool), then dies in its second
/// model call the way a killed process does: no ack, no retry, no lease release (the lease
/// expires after `LEASE`). Returns the session's replies, subscribed before the submission.
pub(super) async fn kill_the_worker_in_its_second_model_call(d: &Deployment) -> Replies {
    d.fake.push([
        Reply::Calls(vec![(
            "agent_change_mode".into(),
            json!({"mode": "ddr_authoring", "branch": false, "reason": "once"}),
        )]),
        Reply::Delay(
            Duration::from_secs(60),
            Box::new(Reply::Text("never".into())),
        ),
    ]);
    // A grace period of zero makes stopping drop every in-flight turn on the spot.
    let sudden = WorkerSettings {
        shutdown_grace: Duration::ZERO,
        ..settings()
    };
    let doomed = d.worker("doomed", sudden, LEASE).await;
    let replies = d.replies("s").await;
    d.door
        .submit_local(&submit_body(
            json!({"sessionId": "s", "turnId": "t", "instruction": "switch"}),
        ))
        .await
        .unwrap();
    for _ in 0..300 {
        if d.fake.requests().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        d.fake.requests().len(),
        2,
        "the tool ran and the next model call is in flight"
    );
    // Kill it: its connection drops with the job unacked and its in-flight turn stops dead.
    close_connection(doomed.broker.connection_name());
    doomed.stop.cancel();
    doomed.task.await.unwrap();
    replies
}

pub(super) const LEASE: Duration = Duration::from_millis(600);

#[tokio::test]
pub(super) async fn a_worker_killed_mid_turn_leaves_the_turn_completed_exactly_once() {
    let d = Deployment::new(FakeOptions::default()).await;
    let mut replies = kill_the_worker_in_its_second_model_call(&d).await;
    d.fake
        .push([Reply::Text("finished by the second worker".into())]);
    let survivor = d.worker("survivor", settings(), LEASE).await;
    let r = next_reply(&mut replies, 30).await;
    assert_eq!(r.status, TurnStatus::Completed);
    assert_eq!(d.status("s", "t").await, TurnStatus::Completed);
    let session = d
        .store
        .get_session(&SessionId::parse("s").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        session.mode_history.len(),
        1,
        "the server tool ran exactly once"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), replies.recv())
            .await
            .is_err(),
        "exactly one result"
    );
    assert_eq!(d.fake.requests().len(), 3);
    survivor.stop.cancel();
    survivor.task.await.unwrap();
}

#[tokio::test]
pub(super) async fn a_turn_cancelled_while_its_worker_is_dead_ends_cancelled_exactly_once() {
    let d = Deployment::new(FakeOptions::default()).await;
    let sid = SessionId::parse("s").unwrap();
    let tid = TurnId::parse("t").unwrap();
    let mut replies = kill_the_worker_in_its_second_model_call(&d).await;
    // Cancelled while nobody runs it: the record still says running. (Submitted without a
    // tenant: the local tenant's.)
    let asked = d.door.cancel("local", &sid, &tid).await.unwrap();
    assert!(matches!(
        asked,
        aptix_worker::frontdoor::cancel::Cancelled::Stopping(_)
    ));
    // The redelivered job resumes on another worker, which stops at its first safe point.
    let survivor = d.worker("survivor", settings(), LEASE).await;
    let r = next_reply(&mut replies, 30).await;
    assert_eq!(r.status, TurnStatus::Cancelled);
    assert_eq!(d.status("s", "t").await, TurnStatus::Cancelled);
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), replies.recv())
            .await
            .is_err(),
        "exactly one result"
    );
    assert_eq!(d.fake.requests().len(), 2, "no model call after the cancel");
    let session = d.store.get_session(&sid).await.unwrap().unwrap();
    assert_eq!(session.mode_history.len(), 1, "the server tool ran once");
    survivor.stop.cancel();
    survivor.task.await.unwrap();
}

#[tokio::test]
pub(super) async fn an_unroutable_publish_is_an_error_not_silence() {
    let d = Deployment::new(FakeOptions::default()).await;
    // Someone deletes the job queue under us: the mandatory publish comes back as returned.
    crate::support::rabbitmqctl(&["delete_queue", &d.topology().jobs()]);
    let err = d
        .door
        .submit_local(&submit_body(
            json!({"sessionId": "s", "turnId": "t", "instruction": "hi"}),
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(err, aptix_worker::frontdoor::SubmitError::Unavailable(ref m) if m.contains("unroutable")),
        "{err:?}"
    );
}
