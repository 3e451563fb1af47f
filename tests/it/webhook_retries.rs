//! Webhook deliveries that fail for long: dead-lettered past the schedule and replayed, a sender
//! killed mid-POST.

use super::webhooks::*;
use crate::app::{AppOptions, spawn};
use serde_json::Value;
use std::time::{Duration, Instant};

/// Deliveries that fail past the give-up age are dead-lettered; `aptix webhooks failed` lists
/// them and `aptix webhooks replay` sends them again, with the same event id.
#[tokio::test]
async fn a_receiver_down_past_the_schedule_is_dead_lettered_and_replay_delivers_it() {
    let receiver = Receiver::start([Answer::Status(503); 100]).await;
    let settings = [
        ("APTIX_WEBHOOK_RETRY_DELAYS_SECS", "1"),
        ("APTIX_WEBHOOK_GIVE_UP_SECS", "4"),
    ];
    let app = spawn(AppOptions {
        extra_env: webhook_env(&settings),
        ..AppOptions::default()
    })
    .await;
    let (status, body) = app
        .post(Some("tok-a"), turn_with_webhook("s", "t1", &receiver.url))
        .await;
    assert_eq!(status, 202, "{body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.broker.dead_hooks(1, false).await.unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "not dead-lettered: {:#?}",
            receiver.got()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Tried every second until the next try would come past the give-up age.
    let tried = receiver.got().len();
    assert!((2..=5).contains(&tried), "{tried} attempts");
    let cli = |args: &[&str]| {
        let out = crate::support::aptix()
            .args(args)
            .env("APTIX_AMQP_URL", crate::support::amqp_url())
            .env("APTIX_NAMESPACE", &app.topology.namespace)
            .envs(settings)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let failed = cli(&["webhooks", "failed"]);
    let listed: Value = serde_json::from_str(failed.lines().next().unwrap()).unwrap();
    let id = receiver.got()[0].headers["webhook-id"].clone();
    assert_eq!(listed["eventId"], id.as_str(), "{failed}");
    assert_eq!(listed["event"], "turn.completed");
    assert_eq!(listed["attempts"], tried);
    assert!(
        listed["lastError"].as_str().unwrap().contains("503"),
        "{failed}"
    );
    // Listing leaves them where they are.
    assert_eq!(app.broker.dead_hooks(10, false).await.unwrap().len(), 1);
    receiver.answer_from_now([]);
    cli(&["webhooks", "replay"]);
    let got = receiver
        .until(Duration::from_secs(30), |got| {
            got.iter().any(|r| r.answered == 200)
        })
        .await;
    assert_eq!(got.len(), tried + 1);
    assert_eq!(got[tried].headers["webhook-id"], id, "the same event");
    verify_independently(&got[tried..]);
    assert!(app.broker.dead_hooks(10, false).await.unwrap().is_empty());
}

/// A worker SIGKILLed while its POST waits for the receiver: the delivery was never acked, so
/// the next worker sends it again — at least once, with the same event id.
#[tokio::test]
async fn a_sender_killed_mid_post_delivers_again_after_restart() {
    let receiver = Receiver::start([Answer::Hang]).await;
    // The default schedule: no retry happens here, and the processes' queues are the ones
    // the test's clean-up knows.
    let env = webhook_env(&[])
        .into_iter()
        .filter(|(k, _)| *k != "APTIX_WEBHOOK_RETRY_DELAYS_SECS")
        .collect();
    let mut p = crate::processes::Processes::start(env, &[], 1).await;
    p.submit(turn_with_webhook("s", "t1", &receiver.url)).await;
    receiver
        .until(Duration::from_secs(30), |got| got.len() == 1)
        .await;
    let mut killed = p.workers.remove(0);
    killed.child.kill().unwrap();
    let _ = killed.child.wait();
    p.add_worker();
    let got = receiver
        .until(Duration::from_secs(30), |got| {
            got.iter().any(|r| r.answered == 200)
        })
        .await;
    assert_eq!(got.len(), 2, "{got:#?}");
    assert_eq!(got[0].headers["webhook-id"], got[1].headers["webhook-id"]);
    assert_eq!(got[0].body, got[1].body);
    // No tokens: the local tenant's deliveries are signed with the deployment's secret.
    assert_eq!(verify_with(SECRET, None, &got), Ok(()));
}
