//! The event hub and reply queues on RabbitMQ: one consumer shared by every subscriber, unwatched sessions unbound, streams that end with their connection, reply queues declared with other arguments, full reply queues dropping their oldest.

use super::queue_e2e::*;
use crate::support::{RabbitGuard, rabbit, rabbit_broker};
use aptix_worker::contract::SessionId;
use aptix_worker::queue::{JobQueue as _, ReplyBus as _, SessionEvent};
use std::time::Duration;

/// Consumers whose tag is `tag`.
fn consumers_tagged(tag: &str) -> usize {
    rabbitmqctl_lines(&["list_consumers", "consumer_tag"])
        .iter()
        .filter(|l| l.as_str() == tag)
        .count()
}

/// The routing keys of every binding on the broker.
pub(crate) fn binding_keys() -> Vec<String> {
    rabbitmqctl_lines(&["list_bindings", "routing_key"])
}

pub(crate) fn count(keys: &[String], key: &str) -> usize {
    keys.iter().filter(|k| k.as_str() == key).count()
}

fn rabbitmqctl_lines(args: &[&str]) -> Vec<String> {
    crate::support::rabbitmqctl(&[&["-q", "--no-table-headers"], args].concat())
        .lines()
        .map(|l| l.trim().to_string())
        .collect()
}

#[tokio::test]
async fn event_subscribers_share_one_consumer_and_unwatched_sessions_are_unbound() {
    let guard = rabbit().await;
    let tag = format!("events-{}", guard.broker.connection_name());
    let prefix = format!("hub-{}", uuid::Uuid::new_v4().simple());
    let key = |i: usize| format!("{prefix}-{i}");
    let mut streams = Vec::new();
    for i in 0..20 {
        let sid = SessionId::parse(key(i)).unwrap();
        streams.push(guard.broker.subscribe_session(&sid, false).await.unwrap());
    }
    // A second subscriber of the same session shares the binding, though it wants live
    // events too: statuses and live events travel on one exchange.
    let sid0 = SessionId::parse(key(0)).unwrap();
    let mut twin = guard.broker.subscribe_session(&sid0, true).await.unwrap();
    // The broker's listing can lag behind a busy broker (and each `rabbitmqctl` call takes a
    // second or more on a loaded machine): ask again for up to 20 s, judging the last answer.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut seen = consumers_tagged(&tag);
    while seen != 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        seen = consumers_tagged(&tag);
    }
    assert_eq!(
        seen,
        1,
        "one consumer for every subscriber; the consumers listed:\n{}",
        rabbitmqctl_lines(&["list_consumers", "queue_name", "consumer_tag"]).join("\n")
    );
    let keys = binding_keys();
    assert!(
        (0..20).all(|i| count(&keys, &key(i)) == 1),
        "one binding per session"
    );

    // Both subscribers of session 0 get its event; nobody else does.
    let body = br#"{"turnId":"t"}"#;
    guard
        .broker
        .publish_reply(
            &sid0,
            "t",
            None,
            aptix_worker::queue::Audience::ANYONE,
            body,
        )
        .await
        .unwrap();
    for rx in [&mut streams[0], &mut twin] {
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap();
        assert_eq!(got, Some(SessionEvent::Status(body.to_vec())));
    }
    assert!(streams[1].try_recv().is_err());

    // Subscribers that go away while their sessions are quiet: their bindings are removed.
    streams.truncate(1);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while {
        let keys = binding_keys();
        (1..20).any(|i| count(&keys, &key(i)) > 0)
    } {
        assert!(
            std::time::Instant::now() < deadline,
            "unwatched sessions are still bound"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Session 0 is still watched: its event binding stays (its durable reply queue has none:
    // it is published to through the default exchange).
    assert_eq!(count(&binding_keys(), &key(0)), 1);
    drop(twin);
}

#[tokio::test]
async fn event_streams_end_when_the_connection_drops_and_resubscribing_works() {
    let guard = rabbit().await;
    let sid = SessionId::parse(format!("drop-{}", uuid::Uuid::new_v4().simple())).unwrap();
    let mut before = guard.broker.subscribe_session(&sid, false).await.unwrap();
    close_connection(guard.broker.connection_name());
    let ended = tokio::time::timeout(Duration::from_secs(10), before.recv())
        .await
        .expect("the stream ends instead of hanging");
    assert_eq!(ended, None);
    // The next subscription opens a fresh consumer on a fresh connection.
    let mut after = guard.broker.subscribe_session(&sid, false).await.unwrap();
    guard
        .broker
        .publish_reply(
            &sid,
            "t",
            None,
            aptix_worker::queue::Audience::ANYONE,
            b"{}",
        )
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), after.recv())
        .await
        .unwrap();
    assert_eq!(got, Some(SessionEvent::Status(b"{}".to_vec())));
}

#[tokio::test]
async fn a_reply_queue_declared_with_other_arguments_is_used_as_it_is() {
    let guard = rabbit().await;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (old, fresh) = (
        SessionId::parse(format!("old-{id}")).unwrap(),
        SessionId::parse(format!("fresh-{id}")).unwrap(),
    );
    // As an older version left it: a day's expiry and no length limit. Declaring it with
    // today's arguments is refused by the broker (PRECONDITION_FAILED closes the channel).
    let conn = crate::support::amqp_peek().await;
    let ch = conn.create_channel().await.unwrap();
    let mut args = lapin::types::FieldTable::default();
    args.insert(
        "x-expires".into(),
        lapin::types::AMQPValue::LongLongInt(60_000),
    );
    let old_queue = guard.topology.reply_queue(&old);
    ch.queue_declare(
        old_queue.as_str().into(),
        lapin::options::QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        args,
    )
    .await
    .unwrap();
    guard
        .broker
        .publish_reply(
            &old,
            "t1",
            None,
            aptix_worker::queue::Audience::ANYONE,
            b"one",
        )
        .await
        .expect("published to the queue as it is");
    guard
        .broker
        .publish_reply(
            &old,
            "t2",
            None,
            aptix_worker::queue::Audience::ANYONE,
            b"two",
        )
        .await
        .unwrap();
    // The refusal closed only the declaring channel: jobs still go out, and a new session's
    // queue is declared on a fresh channel.
    guard.broker.publish_job(b"{}").await.unwrap();
    guard
        .broker
        .publish_reply(
            &fresh,
            "t",
            None,
            aptix_worker::queue::Audience::ANYONE,
            b"three",
        )
        .await
        .unwrap();
    assert_eq!(
        crate::support::take_all(&conn, &old_queue).await,
        [b"one".to_vec(), b"two".to_vec()]
    );
    assert_eq!(
        crate::support::take_all(&conn, &guard.topology.reply_queue(&fresh)).await,
        [b"three".to_vec()]
    );
    // The new queue carries today's arguments: an idle expiry and a length limit.
    let listed = rabbitmqctl_lines(&["list_queues", "name", "arguments"]);
    let line = listed
        .iter()
        .find(|l| l.starts_with(&guard.topology.reply_queue(&fresh)))
        .expect("the new reply queue is listed");
    assert!(
        line.contains("x-max-length") && line.contains("x-expires"),
        "{line}"
    );
    let _ = ch
        .queue_delete(old_queue.as_str().into(), Default::default())
        .await;
}

#[tokio::test]
async fn a_full_reply_queue_drops_its_oldest_statuses() {
    let mut topology = crate::support::test_topology();
    topology.reply_queue_max_length = 2;
    let guard = RabbitGuard {
        broker: rabbit_broker(&topology, "max-length").await,
        topology,
    };
    let sid = SessionId::parse(format!("full-{}", uuid::Uuid::new_v4().simple())).unwrap();
    for body in [&b"1"[..], b"2", b"3"] {
        guard
            .broker
            .publish_reply(&sid, "t", None, aptix_worker::queue::Audience::ANYONE, body)
            .await
            .unwrap();
    }
    let conn = crate::support::amqp_peek().await;
    assert_eq!(
        crate::support::take_all(&conn, &guard.topology.reply_queue(&sid)).await,
        [b"2".to_vec(), b"3".to_vec()]
    );
}
