//! RabbitMQ's memory alarm blocks every publisher on the broker, so this test has a binary of
//! its own: cargo runs test binaries one after another, and nothing else publishes while the
//! alarm is up. The watermark is restored afterwards, even if the test fails.

#![allow(dead_code)] // the shared helpers serve the other test binary too

#[path = "it/app.rs"]
mod app;
#[path = "it/support.rs"]
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use app::{AppOptions, code, spawn};
use support::rabbitmqctl;

/// Puts the memory watermark back as it was when dropped.
struct Watermark(String);

impl Watermark {
    fn lower_to_nothing() -> Self {
        let before = rabbitmqctl(&["eval", "vm_memory_monitor:get_vm_memory_high_watermark()."])
            .trim()
            .to_string();
        rabbitmqctl(&["set_vm_memory_high_watermark", "0.000001"]);
        Self(before)
    }
}

impl Drop for Watermark {
    fn drop(&mut self) {
        let value = self
            .0
            .parse::<f64>()
            .map(|v| v.to_string())
            .unwrap_or_else(|_| "0.4".into());
        let _ = Command::new("rabbitmqctl")
            .args(["set_vm_memory_high_watermark", &value])
            .output();
    }
}

fn alarm_is_up() -> bool {
    let out = Command::new("rabbitmq-diagnostics")
        .args(["-q", "alarms"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_lowercase())
        .unwrap_or_default();
    out.contains("memory")
}

#[tokio::test]
async fn a_broker_under_a_memory_alarm_is_a_prompt_503_and_readyz_says_so() {
    let app = spawn(AppOptions {
        dependency_timeout: Some(Duration::from_millis(1500)),
        ..AppOptions::default()
    })
    .await;
    let turn = |tid: &str| json!({"sessionId": "s", "turnId": tid, "instruction": "x"}).to_string();
    app.fake.push([app_reply("before")]);
    let (status, _) = app.post(Some("tok-a"), turn("t1")).await;
    assert_eq!(status, 202);
    {
        let _alarm = Watermark::lower_to_nothing();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !alarm_is_up() {
            assert!(Instant::now() < deadline, "the memory alarm did not go up");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let started = Instant::now();
        let (status, body) = app.post(Some("tok-a"), turn("t2")).await;
        assert_eq!(
            (status, code(&body)),
            (503, "SERVICE_UNAVAILABLE"),
            "{body}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let t2 = aptix_worker::contract::TurnId::parse("t2").unwrap();
        let sid = aptix_worker::contract::SessionId::parse("s")
            .unwrap()
            .within("tenant-a");
        assert!(app.store.get_turn(&sid, &t2).await.unwrap().is_none());
        let started = Instant::now();
        let (status, body) = app.get(None, "/readyz").await;
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(status, 503, "{body}");
        assert!(body.to_string().contains("message broker"), "{body}");
    }
    // The alarm is over: the broker takes jobs again.
    let deadline = Instant::now() + Duration::from_secs(20);
    while alarm_is_up() {
        assert!(Instant::now() < deadline, "the memory alarm did not clear");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    app.fake.push([app_reply("after")]);
    let mut accepted = false;
    for _ in 0..20 {
        let (status, _) = app.post(Some("tok-a"), turn("t3")).await;
        if status == 202 {
            accepted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(accepted, "the front door recovers once the alarm clears");
}

fn app_reply(text: &str) -> aptix_worker::fake_llm::Reply {
    aptix_worker::fake_llm::Reply::Text(text.into())
}
