//! Tenant quotas through the HTTP API, on both backends: `maxRunningTurns` holds a flooding
//! tenant to its cap without delaying another tenant's turns, and `tokensPerDay` refuses a
//! tenant's new turns once spent (while its accepted turns finish), with the counts shown by
//! `GET /v1/tenant/usage` and in the metrics.

use crate::support::metric;
use std::time::{Duration, Instant};

use aptix_worker::fake_llm::{FakeLlm, FakeOptions, Reply};
use futures_util::StreamExt as _;
use serde_json::{Value, json};

use crate::app::{App, AppOptions, Backend, code, spawn};
use crate::processes::Processes;

fn turn(session: &str, turn: &str, instruction: &str) -> String {
    json!({"sessionId": session, "turnId": turn, "instruction": instruction}).to_string()
}

/// A tenants file with `tenants` (written to a fresh temporary file).
pub(crate) fn tenants_file(tenants: Value) -> (&'static str, String) {
    let file = std::env::temp_dir().join(format!(
        "aptix-tenants-{}.json",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&file, json!({ "tenants": tenants }).to_string()).unwrap();
    ("APTIX_TENANTS_FILE", file.display().to_string())
}

async fn usage(app: &App, token: &str) -> Value {
    let (status, body) = app.get(Some(token), "/v1/tenant/usage").await;
    assert_eq!(status, 200, "{body}");
    body["result"].clone()
}

const A_TURNS: usize = 2000;
const B_TURNS: usize = 20;
const A_CAP: u64 = 2;

async fn a_flooding_tenant_waits_in_its_lane_and_does_not_delay_another(backend: Backend) {
    let app = spawn(AppOptions {
        backend,
        extra_env: vec![
            tenants_file(json!([{"id": "tenant-a", "maxRunningTurns": A_CAP}])),
            ("APTIX_CONCURRENCY", "8".into()),
        ],
        fake: FakeOptions {
            latency: Duration::from_millis(100),
            ..FakeOptions::default()
        },
        ..AppOptions::default()
    })
    .await;
    // Tenant A floods the queue: at its cap of two turns at a time, 100 ms each, its backlog
    // takes well over a minute.
    let accepted = futures_util::stream::iter(0..A_TURNS)
        .map(|i| {
            let app = &app;
            async move {
                app.post(Some("tok-a"), turn(&format!("a-{i}"), "t", "flood"))
                    .await
                    .0
            }
        })
        .buffer_unordered(32)
        .filter(|status| std::future::ready(*status == 202))
        .count()
        .await;
    assert_eq!(accepted, A_TURNS);
    let running = usage(&app, "tok-a").await;
    assert_eq!(running["maxRunningTurns"], A_CAP);
    assert!(
        running["runningTurns"].as_u64().unwrap() <= A_CAP,
        "{running}"
    );

    // Tenant B's turns arrive after all of A's, and run at once beside A's two.
    let started = Instant::now();
    for i in 0..B_TURNS {
        let (status, body) = app
            .post(Some("tok-b"), turn(&format!("b-{i}"), "t", "hello"))
            .await;
        assert_eq!(status, 202, "{body}");
    }
    for i in 0..B_TURNS {
        let result = app.settled("tok-b", &format!("b-{i}"), "t").await;
        assert_eq!(result["status"], "completed", "{result}");
    }
    let took = started.elapsed();
    // Told apart by what has run, not by a stopwatch: when B's last turn is done, A's backlog
    // is still almost all there (a shared queue would have run A's 2,000 first).
    let text = app.metrics_text().await;
    let completed = metric(&text, "aptix_turns_total{status=\"completed\"}") as usize;
    assert!(
        completed < B_TURNS + A_TURNS / 10,
        "{completed} turns had completed when B's {B_TURNS} were done ({took:?}): B waited behind A"
    );
    // A never runs more than its cap at once, and does run at it (sampled, across workers).
    let mut seen = Vec::new();
    for _ in 0..10 {
        let a = usage(&app, "tok-a").await;
        seen.push(a["runningTurns"].as_u64().unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen.iter().all(|n| *n <= A_CAP), "{seen:?}");
    assert!(seen.contains(&A_CAP), "{seen:?}");
    let gauge = metric(&text, "aptix_tenant_running_turns{tenant=\"tenant-a\"}");
    assert!((0.0..=A_CAP as f64).contains(&gauge), "{text}");
    // B is not configured: no cap, no lane, and its label is bounded.
    let b = usage(&app, "tok-b").await;
    assert_eq!(
        (&b["runningTurns"], &b["maxRunningTurns"]),
        (&Value::Null, &Value::Null)
    );
    assert!(!text.contains("tenant=\"tenant-b\""), "{text}");
}

async fn a_spent_token_quota_refuses_new_turns_until_midnight_utc(backend: Backend) {
    let app = spawn(AppOptions {
        backend,
        extra_env: vec![tenants_file(
            json!([{"id": "tenant-a", "tokensPerDay": 1}, {"id": "tenant-b", "tokensPerDay": 1_000_000}]),
        )],
        ..AppOptions::default()
    })
    .await;
    let fresh = usage(&app, "tok-a").await;
    assert_eq!(
        (&fresh["tokensUsed"], &fresh["tokensPerDay"]),
        (&json!(0), &json!(1))
    );
    assert!(
        fresh["resetsAt"].as_str().unwrap().ends_with("T00:00:00Z"),
        "{fresh}"
    );

    // The first turn is accepted and runs (its client tool round included): it spends more than
    // the quota, and a turn already accepted always finishes.
    let instruction = "#fake:call workspace_read_file {\"path\":\"README.md\"}";
    assert_eq!(
        app.post(Some("tok-a"), turn("s", "t1", instruction))
            .await
            .0,
        202
    );
    let waiting = app.settled("tok-a", "s", "t1").await;
    assert_eq!(waiting["status"], "awaiting_client_tools", "{waiting}");
    let call_id = waiting["result"]["result"]["toolCalls"][0]["toolCallId"].clone();
    let cont = json!({"sessionId": "s", "turnId": "t1", "toolResults": [
        {"toolCallId": call_id, "executionMs": 1, "resultJson": "{\"text\":\"# readme\"}"}]});
    let (status, body) = app.post(Some("tok-a"), cont.to_string()).await;
    assert_eq!(status, 202, "the rest of an accepted turn is taken: {body}");
    let done = app.settled("tok-a", "s", "t1").await;
    assert_eq!(done["status"], "completed", "{done}");

    // Every model call was counted to the tenant: the two calls' usage.
    let calls = app.fake.requests().len();
    assert_eq!(calls, 2);
    let spent = usage(&app, "tok-a").await;
    let used = spent["tokensUsed"].as_u64().unwrap();
    assert!(used > 1, "{spent}");
    assert_eq!(
        used,
        done["result"]["result"]["usage"]["totalTokens"]
            .as_u64()
            .unwrap(),
        "the counted tokens are the turn's usage, both model calls"
    );

    // A new turn now fails fast at every door, naming the reset; nothing reaches the model.
    let (status, body) = post_raw(&app, "tok-a", "/v1/turns", turn("s", "t2", "more")).await;
    assert_eq!((status.0, code(&body)), (429, "QUOTA_EXCEEDED"), "{body}");
    let message = body["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains(spent["resetsAt"].as_str().unwrap()),
        "{message}"
    );
    let retry_after: u64 = status.1.expect("Retry-After").parse().unwrap();
    assert!((1..=86_400).contains(&retry_after), "{retry_after}");
    let (status, body) = app
        .post_to(
            Some("tok-a"),
            "/api/ai/agent/execute",
            turn("s2", "t", "sync"),
        )
        .await;
    assert_eq!(body["successful"], false, "{status} {body}");
    assert_eq!(code(&body), "QUOTA_EXCEEDED");
    let batch = format!(
        "{}\n",
        json!({"customId": "one", "request": {"sessionId": "s3", "turnId": "t", "instruction": "x"}})
    );
    let (status, body) = app.post_to(Some("tok-a"), "/v1/batches", batch).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["result"]["accepted"], 0, "{body}");
    assert_eq!(body["result"]["errors"][0]["customId"], "one");
    assert_eq!(
        body["result"]["errors"][0]["errors"][0]["errorCode"],
        "QUOTA_EXCEEDED"
    );
    assert_eq!(
        app.fake.requests().len(),
        calls,
        "a refused turn reached the model"
    );

    // Another tenant is not affected.
    assert_eq!(app.post(Some("tok-b"), turn("b", "t", "hi")).await.0, 202);
    assert_eq!(app.settled("tok-b", "b", "t").await["status"], "completed");
    assert!(usage(&app, "tok-b").await["tokensUsed"].as_u64().unwrap() > 0);

    let text = app.metrics_text().await;
    assert!(
        metric(
            &text,
            "aptix_quota_rejections_total{tenant=\"tenant-a\",quota=\"tokens_per_day\"}"
        ) >= 3.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "aptix_tenant_tokens_total{tenant=\"tenant-a\"}") as u64,
        used
    );
    assert!(
        metric(
            &text,
            "aptix_turns_refused_by_policy_total{reason=\"quota_exceeded\"}"
        ) >= 3.0
    );
}

/// A day counted by a version before 2026-12-05 kept its tokens and cost in keys of their own
/// beside the tally (which the versions before 2026-11-26 did not keep at all). On the day of
/// an upgrade those counts still hold the quotas: the larger of them and the tally's sum is
/// what the tenant used.
#[tokio::test]
async fn a_day_an_earlier_version_counted_still_holds_the_quotas() {
    let app = spawn(AppOptions {
        extra_env: vec![tenants_file(json!([
            {"id": "tenant-a", "tokensPerDay": 100},
            {"id": "tenant-b", "costPerDay": 1.0}
        ]))],
        ..AppOptions::default()
    })
    .await;
    let today = time::OffsetDateTime::now_utc().date();
    let day = format!(
        "{:04}-{:02}-{:02}",
        today.year(),
        u8::from(today.month()),
        today.day()
    );
    let ns = &app.topology.namespace;
    let mut conn = crate::support::redis_connection().await;
    for (key, n) in [
        (format!("{ns}:limit:{{tenant:tenant-a}}:tokens:{day}"), 150),
        (
            format!("{ns}:limit:{{tenant-cost:tenant-b}}:tokens:{day}"),
            2_000_000,
        ),
    ] {
        let _: () = ::redis::cmd("SET")
            .arg(key)
            .arg(n)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let a = usage(&app, "tok-a").await;
    assert_eq!(a["tokensUsed"], 150, "{a}");
    let b = usage(&app, "tok-b").await;
    assert_eq!(b["estimatedCostUsd"], 2.0, "{b}");
    for (token, quota) in [("tok-a", "tokens"), ("tok-b", "cost")] {
        let (status, body) = post_raw(&app, token, "/v1/turns", turn("s", "t", "hi")).await;
        assert_eq!(
            (status.0, code(&body)),
            (429, "QUOTA_EXCEEDED"),
            "{quota}: {body}"
        );
    }
    assert!(app.fake.requests().is_empty(), "a refused turn ran");
}

/// POST with the status and the `Retry-After` header.
async fn post_raw(
    app: &App,
    token: &str,
    path: &str,
    body: String,
) -> ((u16, Option<String>), Value) {
    let resp = app
        .http
        .post(format!("{}{path}", app.base))
        .bearer_auth(token)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    ((status, retry_after), resp.json().await.unwrap())
}

#[tokio::test]
async fn a_bad_tenants_file_stops_every_process_naming_the_entry() {
    let (var, path) = tenants_file(json!([{"id": "a"}, {"id": "a"}]));
    for command in [&["worker"][..], &["serve", "--listen", "127.0.0.1:0"]] {
        let out = crate::cli::aptix()
            .args(command)
            .env(var, &path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command:?} started: {stderr}");
        assert!(stderr.contains("APTIX_TENANTS_FILE"), "{stderr}");
        assert!(
            stderr.contains("tenants[1] (\"a\"): the id is defined twice"),
            "{stderr}"
        );
    }
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [
        a_flooding_tenant_waits_in_its_lane_and_does_not_delay_another,
        a_spent_token_quota_refuses_new_turns_until_midnight_utc,
    ],
);

/// `aptix serve` and `aptix worker` processes with a tenants file that caps the local tenant
/// (no API tokens: every caller is `local`).
async fn deployment(fake: &FakeLlm, cap: u32, workers: usize, slot_ttl_ms: u64) -> Processes {
    let env = vec![
        tenants_file(json!([{"id": "local", "maxRunningTurns": cap}])),
        ("APTIX_LLM_BASE_URL", fake.base_url()),
        ("APTIX_CALL_SLOT_TTL_MS", slot_ttl_ms.to_string()),
    ];
    Processes::start(env, &["local"], workers).await
}

/// The local tenant's running turns, across all workers.
async fn running(d: &Processes) -> u64 {
    d.get_json("/v1/tenant/usage").await["result"]["runningTurns"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn two_worker_processes_share_a_tenants_cap_and_its_retries_return_to_its_lane() {
    let fake = FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        FakeOptions {
            latency: Duration::from_millis(300),
            ..FakeOptions::default()
        },
        Some(crate::support::schema()),
    )
    .await
    .unwrap();
    // The first call fails: its turn is retried through the shared retry queues and has to
    // find its way back to the tenant's lane.
    fake.push([Reply::Error {
        status: 500,
        message: "overloaded".into(),
        retry_after_ms: None,
    }]);
    let d = deployment(&fake, 2, 2, 5_000).await;
    let sessions: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
    for s in &sessions {
        d.submit(turn(s, "t", "work")).await;
    }
    for s in &sessions {
        d.wait_completed(s).await;
    }
    assert_eq!(fake.requests().len(), 9, "eight turns and one failed call");
    assert_eq!(
        fake.peak_in_flight(),
        2,
        "two workers of eight slots each could run all eight at once; the tenant's cap is two"
    );
    let ran = d.logged("turn started");
    assert!(ran.iter().all(|n| *n > 0), "turns per worker: {ran:?}");
    let moved: usize = d.logged("job moved to its tenant's lane").iter().sum();
    assert_eq!(moved, 1, "the retried job went back to the lane once");
    // Every running slot was given back.
    let deadline = Instant::now() + Duration::from_secs(5);
    while running(&d).await != 0 {
        assert!(
            Instant::now() < deadline,
            "running slots were not given back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_worker_killed_holding_a_running_slot_frees_it_when_the_slot_expires() {
    const SLOT_TTL_MS: u64 = 2_000;
    let fake = FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        FakeOptions::default(),
        Some(crate::support::schema()),
    )
    .await
    .unwrap();
    // The first call hangs: its worker dies holding the tenant's only running slot.
    fake.push([Reply::Delay(
        Duration::from_secs(30),
        Box::new(Reply::Text("too late".into())),
    )]);
    let mut d = deployment(&fake, 1, 1, SLOT_TTL_MS).await;
    d.submit(turn("held", "t", "work")).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while fake.requests().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the first call never reached the model"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(running(&d).await, 1);
    let mut dead = d.workers.remove(0);
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
    d.add_worker();
    d.submit(turn("next", "t", "work")).await;
    // Both turns complete, each exactly once: the dead worker's job is redelivered on the
    // lane and runs once its stale slot has expired.
    d.wait_completed("held").await;
    d.wait_completed("next").await;
    // (A result is logged as published just after it is stored: give the log a moment.)
    let deadline = Instant::now() + Duration::from_secs(5);
    while d.logged("result published").iter().sum::<usize>() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let published = d.logged("result published");
    assert_eq!(
        published,
        vec![2],
        "each turn published once, by the new worker"
    );
}

#[tokio::test]
async fn a_lane_job_that_waits_too_long_goes_back_to_its_lane_and_runs_once() {
    let fake = FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        FakeOptions {
            latency: Duration::from_millis(500),
            ..FakeOptions::default()
        },
        Some(crate::support::schema()),
    )
    .await
    .unwrap();
    // Two workers each hold one job of the tenant; with a cap of one, the other's job keeps
    // timing out and going back to the lane while the first runs.
    let env = vec![
        tenants_file(json!([{"id": "local", "maxRunningTurns": 1}])),
        ("APTIX_LLM_BASE_URL", fake.base_url()),
        ("APTIX_LANE_WAIT_MS", "100".into()),
        ("RUST_LOG", "info,aptix_worker::worker=debug".into()),
    ];
    let d = Processes::start(env, &["local"], 2).await;
    let sessions: Vec<String> = (0..4).map(|i| format!("w{i}")).collect();
    for s in &sessions {
        d.submit(turn(s, "t", "work")).await;
    }
    for s in &sessions {
        d.wait_completed(s).await;
    }
    assert_eq!(fake.requests().len(), 4, "each turn called the model once");
    assert_eq!(fake.peak_in_flight(), 1, "the cap of one held");
    let given_back: usize = d.logged("giving a lane job back").iter().sum();
    assert!(given_back > 0, "no job waited past APTIX_LANE_WAIT_MS");
    let deadline = Instant::now() + Duration::from_secs(5);
    while d.logged("result published").iter().sum::<usize>() < 4 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        d.logged("result published").iter().sum::<usize>(),
        4,
        "each published once"
    );
}
