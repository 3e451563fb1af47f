//! The embedded broker's own behaviour (the conformance suite shared with RabbitMQ is in
//! the integration tests).

use std::time::Duration;

use super::MemoryBroker;
use crate::contract::SessionId;
use crate::queue::{Audience, ReplyBus};

fn sid(s: &str) -> SessionId {
    SessionId::parse(s).expect("valid id")
}

#[tokio::test]
async fn a_reply_queue_keeps_its_newest_statuses_up_to_its_length() {
    let mut t = crate::queue::Topology::new("t");
    t.reply_queue_max_length = 3;
    let broker = MemoryBroker::default().with_reply_queues(&t);
    for i in 0..5 {
        let body = format!("{i}");
        broker
            .publish_reply(&sid("s"), "t", None, Audience::ANYONE, body.as_bytes())
            .await
            .unwrap();
    }
    let mut replies = broker.subscribe_replies(&sid("s")).await.unwrap();
    let mut got = Vec::new();
    while let Ok(body) = replies.try_recv() {
        got.push(String::from_utf8(body).unwrap());
    }
    assert_eq!(got, ["2", "3", "4"]);
}

#[tokio::test]
async fn nothing_is_kept_for_sessions_after_their_queues_expire_and_subscribers_leave() {
    let mut t = crate::queue::Topology::new("t");
    t.reply_queue_ttl = Duration::from_secs(60);
    let broker = MemoryBroker::default().with_reply_queues(&t);
    for i in 0..2_000 {
        let s = sid(&format!("s{i}"));
        // A waiter that came and went, and a result nobody consumed.
        let waiter = broker.subscribe_direct(&s, false).await.unwrap();
        broker
            .publish_reply(&s, "t", None, Audience::ANYONE, b"{}")
            .await
            .unwrap();
        drop(waiter);
    }
    // Waiters that left are forgotten; unconsumed queues stay until they expire.
    broker.sweep_after(Duration::from_secs(59));
    assert_eq!(broker.sessions_held(), 2_000, "the queues, not expired yet");
    broker.sweep_after(Duration::from_secs(61));
    assert_eq!(broker.sessions_held(), 0);
    // Sweeps happen on their own as statuses are published.
    for i in 0..1_100 {
        let s = sid(&format!("x{i}"));
        let _gone = broker.subscribe_session(&s, false).await.unwrap();
    }
    assert_eq!(broker.sessions_held(), 1_100);
    broker
        .publish_reply(&sid("y"), "t", None, Audience::ANYONE, b"{}")
        .await
        .unwrap();
    for _ in 0..super::SWEEP_EVERY {
        broker
            .publish_reply(&sid("y"), "t", None, Audience::ANYONE, b"{}")
            .await
            .unwrap();
    }
    assert_eq!(broker.sessions_held(), 1, "only y's queue is left");
}
