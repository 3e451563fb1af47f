//! One conformance suite for both brokers: the in-memory one and RabbitMQ.

use std::sync::Arc;
use std::time::Duration;

use aptix_worker::contract::SessionId;
use aptix_worker::queue::{Broker, Deliveries, Delivery, MemoryBroker};

use crate::support::{RabbitGuard, rabbit};

pub struct Subject {
    pub broker: Arc<dyn Broker>,
    _guard: Option<RabbitGuard>,
}

fn memory() -> Subject {
    Subject {
        broker: Arc::new(MemoryBroker::new()),
        _guard: None,
    }
}

async fn rabbitmq() -> Subject {
    let g = rabbit().await;
    Subject {
        broker: g.broker.clone(),
        _guard: Some(g),
    }
}

async fn next(d: &mut Deliveries) -> Delivery {
    tokio::time::timeout(Duration::from_secs(5), d.recv())
        .await
        .expect("a delivery in time")
        .expect("stream open")
}

async fn nothing_within(d: &mut Deliveries, ms: u64) {
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

async fn a_retry_arrives_after_its_delay_with_its_attempt(s: Subject) {
    let mut d = s.broker.consume(10).await.unwrap();
    s.broker
        .publish_retry(b"later", 3, Duration::from_millis(200), None)
        .await
        .unwrap();
    nothing_within(&mut d, 100).await;
    let x = next(&mut d).await;
    assert_eq!((x.body.as_slice(), x.attempt), (&b"later"[..], 3));
    x.ack().await.unwrap();
}

async fn dead_letters_keep_their_reason(s: Subject) {
    s.broker
        .publish_dead(b"poison", 2, "unparseable job")
        .await
        .unwrap();
    let dead = s.broker.drain_dead(10).await.unwrap();
    assert_eq!(
        dead,
        vec![(b"poison".to_vec(), "unparseable job".to_string())]
    );
    assert!(s.broker.drain_dead(10).await.unwrap().is_empty());
}

async fn replies_reach_the_session_subscriber_in_order(s: Subject) {
    let sid = SessionId::parse("s-1").unwrap();
    let other = SessionId::parse("s-2").unwrap();
    let mut r = s.broker.subscribe_replies(&sid).await.unwrap();
    s.broker.publish_reply(&sid, "t1", b"one").await.unwrap();
    s.broker
        .publish_reply(&other, "t9", b"not mine")
        .await
        .unwrap();
    s.broker.publish_reply(&sid, "t2", b"two").await.unwrap();
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
    let mut a = s.broker.subscribe_events(&sid).await.unwrap();
    let mut b = s.broker.subscribe_events(&sid).await.unwrap();
    let mut queue = s.broker.subscribe_replies(&sid).await.unwrap();
    s.broker.publish_reply(&sid, "t1", b"one").await.unwrap();
    s.broker.publish_reply(&sid, "t2", b"two").await.unwrap();
    for rx in [&mut a, &mut b, &mut queue] {
        for expected in [&b"one"[..], b"two"] {
            let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(got, expected);
        }
    }
}

for_each_backend!(
    backends: [memory => super::memory(), rabbitmq => super::rabbitmq().await],
    tests: [
        publish_consume_ack_in_order,
        a_requeued_delivery_comes_back_redelivered,
        prefetch_bounds_unacked_deliveries,
        a_retry_arrives_after_its_delay_with_its_attempt,
        dead_letters_keep_their_reason,
        replies_reach_the_session_subscriber_in_order,
        every_event_subscriber_gets_every_result,
    ],
);
