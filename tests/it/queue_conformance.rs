//! One conformance suite for both brokers: the in-memory one and RabbitMQ.

use std::sync::Arc;
use std::time::Duration;

use aptix_worker::contract::SessionId;
use aptix_worker::queue::{
    Audience, Broker, Deliveries, Delivery, JobMeta, MemoryBroker, ReplyBus as _, SessionEvent,
};

use crate::support::{RabbitGuard, rabbit};

pub struct Subject {
    pub broker: Arc<dyn Broker>,
    _guard: Option<RabbitGuard>,
}

pub(super) fn memory() -> Subject {
    Subject {
        broker: Arc::new(MemoryBroker::new()),
        _guard: None,
    }
}

pub(super) async fn rabbitmq() -> Subject {
    let g = rabbit().await;
    Subject {
        broker: g.broker.clone(),
        _guard: Some(g),
    }
}

pub(super) async fn next(d: &mut Deliveries) -> Delivery {
    tokio::time::timeout(Duration::from_secs(5), d.recv())
        .await
        .expect("a delivery in time")
        .expect("stream open")
}

pub(super) async fn nothing_within(d: &mut Deliveries, ms: u64) {
    if let Ok(Some(x)) = tokio::time::timeout(Duration::from_millis(ms), d.recv()).await {
        panic!("unexpected delivery {x:?}");
    }
}

async fn publish_consume_ack_in_order(s: Subject) {
    for i in 0..3 {
        s.broker
            .publish_job(format!("job-{i}").as_bytes())
            .await
            .unwrap();
    }
    let mut d = s.broker.consume(10).await.unwrap();
    for i in 0..3 {
        let x = next(&mut d).await;
        assert_eq!(x.body, format!("job-{i}").into_bytes());
        assert_eq!((x.attempt, x.redelivered), (0, false));
        x.ack().await.unwrap();
    }
    nothing_within(&mut d, 300).await;
}

async fn a_requeued_delivery_comes_back_redelivered(s: Subject) {
    s.broker.publish_job(b"job").await.unwrap();
    let mut d = s.broker.consume(10).await.unwrap();
    next(&mut d).await.requeue().await.unwrap();
    let again = next(&mut d).await;
    assert_eq!(again.body, b"job");
    assert!(again.redelivered);
    again.ack().await.unwrap();
    nothing_within(&mut d, 300).await;
}

async fn prefetch_bounds_unacked_deliveries(s: Subject) {
    for i in 0..3 {
        s.broker
            .publish_job(format!("{i}").as_bytes())
            .await
            .unwrap();
    }
    let mut d = s.broker.consume(2).await.unwrap();
    let a = next(&mut d).await;
    let _b = next(&mut d).await;
    nothing_within(&mut d, 300).await;
    a.ack().await.unwrap();
    assert_eq!(next(&mut d).await.body, b"2");
}

async fn a_retry_arrives_after_its_delay_with_its_headers(s: Subject) {
    let mut d = s.broker.consume(10).await.unwrap();
    let meta = JobMeta {
        attempt: 3,
        traceparent: Some(TRACEPARENT.into()),
        tenant: Some(CAPPED.into()),
        reply_to: Some("a-waiting-front-door".into()),
        reply_queue_wanted: false,
        webhook: Some("https://hooks.example.com/aptix".into()),
        batch: Some("batch-1".into()),
    };
    s.broker
        .publish_retry(b"later", Duration::from_millis(200), &meta)
        .await
        .unwrap();
    nothing_within(&mut d, 100).await;
    let x = next(&mut d).await;
    // A retry goes back to the shared queue (the worker moves a capped tenant's job on).
    assert_eq!(
        (x.body.as_slice(), x.meta(), x.lane.as_deref()),
        (&b"later"[..], meta, None)
    );
    x.ack().await.unwrap();
}

const CAPPED: &str = "capped";
const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

async fn a_lane_is_a_queue_of_its_own_that_keeps_its_headers(s: Subject) {
    let lane_meta = JobMeta::new(Some(TRACEPARENT), Some(CAPPED));
    s.broker
        .enqueue(Some(CAPPED), b"capped-job", &lane_meta)
        .await
        .unwrap();
    s.broker
        .enqueue(None, b"shared-job", &JobMeta::new(None, Some("free")))
        .await
        .unwrap();
    let mut shared = s.broker.consume(10).await.unwrap();
    let x = next(&mut shared).await;
    assert_eq!(
        (x.body.as_slice(), x.tenant.as_deref(), x.lane.as_deref()),
        (&b"shared-job"[..], Some("free"), None)
    );
    x.ack().await.unwrap();
    nothing_within(&mut shared, 300).await;

    let mut lane = s.broker.consume_lane(CAPPED, 10).await.unwrap();
    let x = next(&mut lane).await;
    assert_eq!(
        (x.body.as_slice(), x.meta(), x.lane.as_deref()),
        (&b"capped-job"[..], lane_meta.clone(), Some(CAPPED))
    );
    // Given back, it comes back on its lane, not on the shared queue.
    x.requeue().await.unwrap();
    let again = next(&mut lane).await;
    assert!(again.redelivered);
    assert_eq!(
        (again.meta(), again.lane.as_deref()),
        (lane_meta, Some(CAPPED))
    );
    again.ack().await.unwrap();
    nothing_within(&mut shared, 200).await;
}

async fn replies_reach_the_session_subscriber_in_order(s: Subject) {
    let sid = SessionId::parse("s-1").unwrap();
    let other = SessionId::parse("s-2").unwrap();
    let mut r = s.broker.subscribe_replies(&sid).await.unwrap();
    s.broker
        .publish_reply(&sid, "t1", None, Audience::ANYONE, b"one")
        .await
        .unwrap();
    s.broker
        .publish_reply(&other, "t9", None, Audience::ANYONE, b"not mine")
        .await
        .unwrap();
    s.broker
        .publish_reply(&sid, "t2", None, Audience::ANYONE, b"two")
        .await
        .unwrap();
    for expected in [&b"one"[..], b"two"] {
        let got = tokio::time::timeout(Duration::from_secs(5), r.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, expected);
    }
}

async fn every_event_subscriber_gets_every_result(s: Subject) {
    let sid = SessionId::parse("s-1").unwrap();
    let mut a = s.broker.subscribe_session(&sid, false).await.unwrap();
    let mut b = s.broker.subscribe_session(&sid, true).await.unwrap();
    let mut queue = s.broker.subscribe_replies(&sid).await.unwrap();
    s.broker
        .publish_reply(&sid, "t1", None, Audience::ANYONE, b"one")
        .await
        .unwrap();
    s.broker
        .publish_reply(&sid, "t2", None, Audience::ANYONE, b"two")
        .await
        .unwrap();
    for rx in [&mut a, &mut b] {
        for expected in [&b"one"[..], b"two"] {
            let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(got, SessionEvent::Status(expected.to_vec()));
        }
    }
    for expected in [&b"one"[..], b"two"] {
        let got = tokio::time::timeout(Duration::from_secs(5), queue.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, expected);
    }
}

async fn live_events_reach_live_subscribers_before_the_result_and_nowhere_else(s: Subject) {
    let sid = SessionId::parse("live-1").unwrap();
    let other = SessionId::parse("live-2").unwrap();
    let mut live = s.broker.subscribe_session(&sid, true).await.unwrap();
    let mut results_only = s.broker.subscribe_session(&sid, false).await.unwrap();
    let mut other_live = s.broker.subscribe_session(&other, true).await.unwrap();
    s.broker.publish_live(&sid, None, b"d0").await.unwrap();
    s.broker.publish_live(&sid, None, b"d1").await.unwrap();
    s.broker
        .publish_reply(&sid, "t", None, Audience::ANYONE, b"result")
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(
            tokio::time::timeout(Duration::from_secs(5), live.recv())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(
        got,
        vec![
            SessionEvent::Live(b"d0".to_vec()),
            SessionEvent::Live(b"d1".to_vec()),
            SessionEvent::Status(b"result".to_vec()),
        ]
    );
    let first = tokio::time::timeout(Duration::from_secs(5), results_only.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        first,
        SessionEvent::Status(b"result".to_vec()),
        "a results subscriber sees no live events"
    );
    // Nothing of this session reached the other one, and the durable reply queue holds the
    // result only.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), other_live.recv())
            .await
            .is_err()
    );
    let mut replies = s.broker.subscribe_replies(&sid).await.unwrap();
    let queued = tokio::time::timeout(Duration::from_secs(5), replies.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(queued, b"result");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), replies.recv())
            .await
            .is_err(),
        "a live event reached the reply queue"
    );
}

async fn a_direct_subscriber_hears_the_jobs_that_name_it(s: Subject) {
    let sid = SessionId::parse(format!("direct-{}", uuid::Uuid::new_v4().simple())).unwrap();
    let mut live = s.broker.subscribe_direct(&sid, true).await.unwrap();
    let mut results = s.broker.subscribe_direct(&sid, false).await.unwrap();
    let address = live.address.clone();
    assert_eq!(address, results.address, "one address per process");
    s.broker
        .publish_live(&sid, address.as_deref(), b"d0")
        .await
        .unwrap();
    s.broker
        .publish_reply(&sid, "t", address.as_deref(), Audience::ANYONE, b"result")
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(
            tokio::time::timeout(Duration::from_secs(5), live.events.recv())
                .await
                .expect("in time")
                .expect("open"),
        );
    }
    assert_eq!(
        got,
        [
            SessionEvent::Live(b"d0".to_vec()),
            SessionEvent::Status(b"result".to_vec())
        ]
    );
    let first = tokio::time::timeout(Duration::from_secs(5), results.events.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        first,
        SessionEvent::Status(b"result".to_vec()),
        "no live events"
    );
    // The session's reply queue holds the status too.
    let mut replies = s.broker.subscribe_replies(&sid).await.unwrap();
    let queued = tokio::time::timeout(Duration::from_secs(5), replies.recv())
        .await
        .unwrap();
    assert_eq!(queued.as_deref(), Some(&b"result"[..]));
    if address.is_some() {
        // A broker that needs the address delivers nothing else directly: a job that named
        // no one (or another process) is heard through the session's watchers only.
        s.broker
            .publish_reply(&sid, "t2", None, Audience::ANYONE, b"elsewhere")
            .await
            .unwrap();
        s.broker
            .publish_reply(
                &sid,
                "t3",
                Some("amq.gen-someone-else"),
                Audience::ANYONE,
                b"not here",
            )
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(300), results.events.recv())
                .await
                .is_err(),
            "a direct subscriber heard a job that did not name it"
        );
    }
}

for_each_backend!(
    backends: [memory => super::memory(), rabbitmq => super::rabbitmq().await],
    tests: [
        publish_consume_ack_in_order,
        a_requeued_delivery_comes_back_redelivered,
        prefetch_bounds_unacked_deliveries,
        a_retry_arrives_after_its_delay_with_its_headers,
        a_lane_is_a_queue_of_its_own_that_keeps_its_headers,
        replies_reach_the_session_subscriber_in_order,
        every_event_subscriber_gets_every_result,
        live_events_reach_live_subscribers_before_the_result_and_nowhere_else,
        a_direct_subscriber_hears_the_jobs_that_name_it,
    ],
);

/// With `APTIX_REPLY_QUEUES=on-subscribe`, a session has a reply queue only once a client
/// subscribed to it: statuses before that are not queued (the store has them), statuses after
/// it are, also while the subscriber is away.
async fn on_subscribe_a_reply_queue_exists_once_a_client_subscribed(
    broker: Arc<dyn Broker>,
    queue_exists: impl AsyncFn(&SessionId) -> bool,
    unconsumed: impl AsyncFn(&SessionId) -> bool,
) {
    let sid = SessionId::parse(format!("on-sub-{}", uuid::Uuid::new_v4().simple())).unwrap();
    broker
        .publish_reply(&sid, "t1", None, Audience::ANYONE, b"before")
        .await
        .unwrap();
    assert!(!queue_exists(&sid).await, "a status declared the queue");
    let mut replies = broker.subscribe_replies(&sid).await.unwrap();
    assert!(queue_exists(&sid).await);
    broker
        .publish_reply(&sid, "t2", None, Audience::ANYONE, b"after")
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), replies.recv())
        .await
        .unwrap();
    assert_eq!(got.as_deref(), Some(&b"after"[..]), "only what came after");
    drop(replies);
    // The client went away: once the broker has let its consumer go, a status waits.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !unconsumed(&sid).await {
        assert!(std::time::Instant::now() < deadline, "the consumer stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    broker
        .publish_reply(&sid, "t3", None, Audience::ANYONE, b"later")
        .await
        .unwrap();
    let mut again = broker.subscribe_replies(&sid).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), again.recv())
        .await
        .unwrap();
    assert_eq!(
        got.as_deref(),
        Some(&b"later"[..]),
        "kept while the client was away"
    );
}

fn on_subscribe_topology() -> aptix_worker::queue::Topology {
    let mut t = crate::support::test_topology();
    t.reply_queues = aptix_worker::queue::ReplyQueues::OnSubscribe;
    t
}

#[tokio::test]
async fn on_subscribe_reply_queues_in_memory() {
    let broker = MemoryBroker::default().with_reply_queues(&on_subscribe_topology());
    let held = broker.clone();
    on_subscribe_a_reply_queue_exists_once_a_client_subscribed(
        Arc::new(broker),
        async |_sid: &SessionId| held.sessions_held() > 0,
        async |_sid: &SessionId| true, // a dropped subscription goes as it is dropped
    )
    .await;
}

#[tokio::test]
async fn on_subscribe_reply_queues_on_rabbitmq() {
    let topology = on_subscribe_topology();
    let guard = RabbitGuard {
        broker: crate::support::rabbit_broker(&topology, "on-subscribe").await,
        topology: topology.clone(),
    };
    on_subscribe_a_reply_queue_exists_once_a_client_subscribed(
        guard.broker.clone(),
        async |sid: &SessionId| crate::support::queue_exists(&topology.reply_queue(sid)).await,
        async |sid: &SessionId| {
            crate::support::queue_consumers(&topology.reply_queue(sid)).await == Some(0)
        },
    )
    .await;
}

/// On RabbitMQ a status of a session nobody marked watched goes to the front door its job
/// named and nowhere else: a broadcast with no watcher bound and a publish to an on-subscribe
/// reply queue that no client declared would cost the broker for nobody. Marked watched, it
/// goes everywhere. (The embedded broker delivers to every subscriber of its process either
/// way, which costs nothing.)
#[tokio::test]
async fn an_unwatched_status_goes_only_to_the_front_door_its_job_named() {
    const UNWATCHED: Audience = Audience {
        watched: false,
        reply_queue_wanted: true,
    };
    let topology = on_subscribe_topology();
    let guard = RabbitGuard {
        broker: crate::support::rabbit_broker(&topology, "unwatched").await,
        topology: topology.clone(),
    };
    let broker = guard.broker.clone();
    let sid = SessionId::parse(format!("unwatched-{}", uuid::Uuid::new_v4().simple())).unwrap();
    // A watcher bound without marking the session, and a reply queue declared without it.
    let mut events = broker.subscribe_session(&sid, false).await.unwrap();
    let mut queue = broker.subscribe_replies(&sid).await.unwrap();
    let mut direct = broker.subscribe_direct(&sid, false).await.unwrap();
    let address = direct.address.clone();
    assert!(address.is_some());
    broker
        .publish_reply(&sid, "t1", address.as_deref(), UNWATCHED, b"unwatched")
        .await
        .unwrap();
    broker
        .publish_reply(&sid, "t2", address.as_deref(), Audience::ANYONE, b"watched")
        .await
        .unwrap();
    let within = Duration::from_secs(5);
    for expected in [&b"unwatched"[..], b"watched"] {
        let got = tokio::time::timeout(within, direct.events.recv())
            .await
            .expect("in time")
            .expect("open");
        assert_eq!(got, SessionEvent::Status(expected.to_vec()));
    }
    // Each hears first (and only) the watched one: the unwatched one was not sent there.
    let heard = tokio::time::timeout(within, events.recv()).await.unwrap();
    assert_eq!(heard, Some(SessionEvent::Status(b"watched".to_vec())));
    let queued = tokio::time::timeout(within, queue.recv()).await.unwrap();
    assert_eq!(queued.as_deref(), Some(&b"watched"[..]));
}
