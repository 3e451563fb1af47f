//! Nothing grows per session: `aptix serve` and `aptix worker` serve ten thousand sessions of
//! one turn each and end up with the memory they had before (after a warm-up of as many
//! sessions at the same concurrency, so the allocator's pools have reached what this load
//! needs: a 2,000-session warm-up left the worker's still growing by 3-6 MiB, which a loaded
//! CI machine once pushed over the bound; a kept kilobyte per session would still add ten). A binary of its own: it keeps both
//! cores busy for a minute, which the timing of the other tests should not have to share.

#![allow(dead_code)] // the shared helpers serve the other test binary too

#[path = "it/processes.rs"]
mod processes;
#[path = "it/support.rs"]
mod support;

use std::time::Duration;

use aptix_worker::fake_llm::{FakeLlm, FakeOptions};
use futures_util::StreamExt as _;
use serde_json::{Value, json};

use crate::processes::Processes;
use crate::support::http_client;

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Runs one synchronous turn in each of `n` new sessions, `width` at a time.
async fn one_turn_each(p: &Processes, prefix: &str, n: usize, width: usize) {
    let url = format!("{}/api/ai/agent/execute", p.serve.url());
    let client = http_client();
    let failures = futures_util::stream::iter(0..n)
        .map(|i| {
            let body =
                json!({"sessionId": format!("{prefix}-{i}"), "turnId": "t", "instruction": "hi"});
            let req = client.post(&url).json(&body);
            async move {
                let answer: Value = req.send().await.ok()?.json().await.ok()?;
                (answer["successful"] != true).then_some(answer)
            }
        })
        .buffer_unordered(width)
        .filter_map(|failed| async move { failed })
        .collect::<Vec<_>>()
        .await;
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        failures.first()
    );
}

#[tokio::test]
async fn ten_thousand_sessions_leave_serve_and_worker_where_they_started() {
    let fake = FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        FakeOptions {
            stateless: true,
            ..Default::default()
        },
        None,
    )
    .await
    .unwrap();
    let env = vec![
        ("APTIX_LLM_BASE_URL", fake.base_url()),
        ("APTIX_CONCURRENCY", "64".into()),
        // Ten thousand durable reply queues for an hour would burden the broker (and a restart
        // of it) for the tests that follow: they expire on their own a few seconds after use.
        ("APTIX_REPLY_QUEUE_TTL_SECS", "5".into()),
    ];
    let p = Processes::start(env, &[], 1).await;
    let pids = [p.serve.child.id(), p.workers[0].child.id()];
    one_turn_each(&p, "warm", 10_000, 64).await;
    // Subscribers that left are forgotten every two seconds.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = pids.map(rss_kib);
    one_turn_each(&p, "load", 10_000, 64).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = pids.map(rss_kib);
    for (i, name) in ["serve", "worker"].iter().enumerate() {
        let grown = after[i].saturating_sub(before[i]);
        eprintln!(
            "{name}: {} KiB before, {} KiB after ten thousand sessions",
            before[i], after[i]
        );
        // A kilobyte kept per session would be ten megabytes.
        assert!(
            grown < 6 * 1024,
            "{name} grew by {grown} KiB over ten thousand sessions ({} → {} KiB)",
            before[i],
            after[i]
        );
    }
}
