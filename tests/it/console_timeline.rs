//! The turn inspector's timeline in a real browser, on both backends: a turn whose first model
//! call failed (its run ended and the turn ran again), whose model then called a server tool
//! and asked the client for one — every step in the order it happened, the failed call with
//! why, the client's tools shown as a table while the turn waits, and the wait closed once
//! their results came back and the turn completed; a streaming call shown while it streams; a
//! call held back by its agent context's limit shown waiting for capacity.

use std::time::Duration;

use aptix_worker::fake_llm::{FakeOptions, Reply};
use serde_json::json;

use crate::app::{AppOptions, Backend, spawn};
use crate::support::browser::Browser;

/// The timeline's steps as `(kind, what)`: `what` is the step's first line. Read in one
/// script: the timeline is drawn again while a call streams, and a row found by one WebDriver
/// request can be gone by the next (a stale element).
async fn steps(browser: &Browser) -> Vec<(String, String)> {
    let rows = browser
        .client
        .execute(
            "return [...document.querySelectorAll('#timeline tr.step')]
                .map(row => [row.dataset.kind ?? '', row.querySelector('strong')?.innerText ?? null]);",
            vec![],
        )
        .await
        .expect("the timeline's rows");
    serde_json::from_value(rows.clone())
        .unwrap_or_else(|e| panic!("every step names itself ({e}): {rows}"))
}

fn step(kind: &str, what: &str) -> (String, String) {
    (kind.to_string(), what.to_string())
}

async fn the_timeline_tells_a_turn_in_order(backend: Backend, name: &str) {
    let app = spawn(AppOptions {
        backend,
        extra_env: vec![("APTIX_CONSOLE", "true".into())],
        ..AppOptions::default()
    })
    .await;
    app.fake.push([
        Reply::Error {
            status: 500,
            message: "The server had an error".into(),
            retry_after_ms: None,
        },
        Reply::Calls(vec![("agent_list_modes".into(), json!({}))]),
        Reply::Calls(vec![(
            "workspace_read_file".into(),
            json!({"path": "README.md"}),
        )]),
    ]);
    let body = json!({"sessionId": "story", "turnId": "t", "instruction": "Read the README",
        "inputArtifacts": [{"relativePath": "docs/brief.md", "fileName": "brief.md", "contents": "a brief", "origin": "user"}]});
    let (status, accepted) = app.post(Some("tok-a"), body.to_string()).await;
    assert_eq!(status, 202, "{accepted}");
    let (_, waiting) = app
        .get(Some("tok-a"), "/v1/sessions/story/turns/t?wait=30")
        .await;
    assert_eq!(
        waiting["result"]["status"], "awaiting_client_tools",
        "{waiting}"
    );
    let call = waiting["result"]["result"]["result"]["toolCalls"][0]["toolCallId"]
        .as_str()
        .expect("a client tool call")
        .to_string();

    let browser = Browser::start().await;
    browser.sign_in(&app.base, "tok-a").await;
    browser.show(&app.base, "/turn/story/t").await;
    // While it waits: the client's call as a table, the wait still open.
    let pending = browser
        .text_when("#pending", Duration::from_secs(10), |t| {
            t.contains("workspace_read_file")
        })
        .await;
    assert!(pending.contains("README.md"), "{pending}");
    let header = browser
        .text_when("#inspector", Duration::from_secs(5), |t| {
            t.contains("Read the README")
        })
        .await;
    assert!(
        header.contains("docs/brief.md") && header.contains("tenant-a"),
        "{header}"
    );
    browser
        .text_when("#timeline", Duration::from_secs(5), |t| {
            t.contains("still waiting")
        })
        .await;

    // The client answers; the turn completes.
    app.fake.push([Reply::Text("It says hello.".into())]);
    let answer = json!({"sessionId": "story", "turnId": "t", "toolResults": [{
        "toolCallId": call, "executionMs": 3,
        "resultJson": json!({"contents": "# hello"}).to_string()}]});
    assert_eq!(app.post(Some("tok-a"), answer.to_string()).await.0, 202);
    assert_eq!(
        app.settled("tok-a", "story", "t").await["status"],
        "completed"
    );
    browser
        .text_when("#inspector .status", Duration::from_secs(10), |t| {
            t == "completed"
        })
        .await;
    browser
        .text_when("#timeline", Duration::from_secs(5), |t| {
            t.contains("completed")
        })
        .await;
    let seen = steps(&browser).await;
    let model = "model call · m · default";
    assert_eq!(
        seen,
        [
            step("event", "queued"),
            step("event", "run started"),
            step("model failed", model),
            step("event", "run ended"),
            step("event", "run started"),
            step("model", model),
            step("tool", "tool · agent_list_modes"),
            step("model", model),
            step("event", "awaiting client tools"),
            step("wait", "waiting for the client's tools"),
            step("event", "run started"),
            step("tool", "client tool · workspace_read_file"),
            step("model", model),
            step("event", "completed"),
        ],
        "{seen:#?}"
    );
    let why = browser
        .text_when("#timeline tr.failed-call", Duration::ZERO, |_| true)
        .await;
    assert!(why.contains("LLM_UNAVAILABLE"), "{why}");
    assert_eq!(
        browser.count("#pending:not([hidden])").await,
        0,
        "no longer waiting"
    );
    // The client's answer is kept with its call, once the turn has moved on.
    let (_, inspected) = app
        .get(Some("tok-a"), "/v1/sessions/story/turns/t/inspect")
        .await;
    let answered = inspected["result"]["toolCalls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["source"] == "client")
        .cloned()
        .unwrap_or_else(|| panic!("the client's call: {inspected}"));
    assert_eq!(answered["name"], "workspace_read_file");
    assert_eq!(answered["executionMs"], 3);
    assert!(
        answered["output"]
            .as_str()
            .unwrap_or_default()
            .contains("# hello"),
        "{answered}"
    );
    browser.shot(&format!("timeline-{name}")).await;
    // From 800 px up nothing needs a sideways scroll (wide tables scroll in their card).
    assert!(!browser.overflows_at(800).await, "the timeline at 800 px");
    browser.show(&app.base, "/runs").await;
    browser
        .text_when("#runs", Duration::from_secs(10), |t| t.contains("story"))
        .await;
    assert!(!browser.overflows_at(800).await, "the turns list at 800 px");
}

/// A streaming turn's model call shows in the timeline while its text streams — to an
/// inspector opened after the call began too (the text names its call again every second) —
/// and as an answered call once it ends.
async fn a_streaming_call_shows_while_in_flight(backend: Backend, name: &str) {
    let app = spawn(AppOptions {
        backend,
        extra_env: vec![("APTIX_CONSOLE", "true".into())],
        fake: FakeOptions {
            stream_pieces: 16,
            stream_delay: Duration::from_millis(500),
            ..FakeOptions::default()
        },
        ..AppOptions::default()
    })
    .await;
    app.fake.push([Reply::Text(
        "one two three four five six seven eight nine ten eleven twelve thirteen fourteen".into(),
    )]);
    let body = json!({"sessionId": "flow", "turnId": "t", "instruction": "Count slowly",
        "streaming": true});
    let (status, accepted) = app.post(Some("tok-a"), body.to_string()).await;
    assert_eq!(status, 202, "{accepted}");
    // Opened once the text streams: the call began before the page subscribed.
    let (_, running) = app.get(Some("tok-a"), "/v1/sessions/flow/turns/t").await;
    assert_ne!(running["status"], "completed", "{running}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let browser = Browser::start().await;
    browser.sign_in(&app.base, "tok-a").await;
    browser.show(&app.base, "/turn/flow/t").await;
    let row = browser
        .text_when("#timeline tr.in-flight", Duration::from_secs(10), |t| {
            t.contains("in flight: its answer streams")
        })
        .await;
    assert!(row.contains("model call · m · default"), "{row}");
    // The header names the context the streaming call runs in.
    browser
        .text_when("#inspector", Duration::from_secs(5), |t| {
            t.contains("Agent context\ndefault")
        })
        .await;
    let model = "model call · m · default";
    let seen = steps(&browser).await;
    assert!(
        seen.contains(&step("model in flight", model)) && !seen.contains(&step("model", model)),
        "{seen:#?}"
    );
    browser.shot(&format!("in-flight-{name}")).await;
    assert_eq!(
        app.settled("tok-a", "flow", "t").await["status"],
        "completed"
    );
    browser
        .text_when("#inspector .status", Duration::from_secs(10), |t| {
            t == "completed"
        })
        .await;
    let seen = steps(&browser).await;
    assert_eq!(
        seen,
        [
            step("event", "queued"),
            step("event", "run started"),
            step("model", model),
            step("event", "completed"),
        ],
        "{seen:#?}"
    );
}

/// A call its agent context's limit held back shows the wait for capacity, then the call:
/// three turns at once in a context that allows two calls at once, each call 1.5 s long.
async fn a_wait_for_capacity_shows_before_its_call(backend: Backend) {
    let models = crate::contexts::models(Duration::from_millis(1500)).await;
    let mut extra_env = models.env();
    extra_env.push(("APTIX_CONSOLE", "true".into()));
    let app = spawn(AppOptions {
        backend,
        extra_env,
        ..AppOptions::default()
    })
    .await;
    for session in ["c1", "c2", "c3"] {
        let body = crate::contexts::turn(session, "t", Some("fast"), None);
        assert_eq!(app.post(Some("tok-a"), body).await.0, 202);
    }
    let mut held = None;
    for session in ["c1", "c2", "c3"] {
        assert_eq!(
            app.settled("tok-a", session, "t").await["status"],
            "completed"
        );
        let (_, inspected) = app
            .get(
                Some("tok-a"),
                &format!("/v1/sessions/{session}/turns/t/inspect"),
            )
            .await;
        let call = &inspected["result"]["modelCalls"][0];
        if call["capacityWaitMs"].as_u64().is_some_and(|ms| ms >= 1000) {
            assert!(
                call["latencyMs"].as_u64() >= call["capacityWaitMs"].as_u64(),
                "the wait is part of the call's time: {call}"
            );
            held = Some(session);
        }
    }
    let held = held.expect("one of the three calls waited for a free slot");
    let browser = Browser::start().await;
    browser.sign_in(&app.base, "tok-a").await;
    browser.show(&app.base, &format!("/turn/{held}/t")).await;
    browser
        .text_when("#timeline", Duration::from_secs(10), |t| {
            t.contains("waiting for capacity")
        })
        .await;
    assert_eq!(
        steps(&browser).await,
        [
            step("event", "queued"),
            step("event", "run started"),
            step("capacity", "waiting for capacity · fast"),
            step("model", "model call · fast-model · fast"),
            step("event", "completed"),
        ]
    );
}

#[tokio::test]
async fn a_wait_for_capacity_on_the_services() {
    a_wait_for_capacity_shows_before_its_call(Backend::Services).await;
}

#[tokio::test]
async fn a_wait_for_capacity_embedded() {
    a_wait_for_capacity_shows_before_its_call(Backend::Embedded).await;
}

#[tokio::test]
async fn a_call_in_flight_on_the_services() {
    a_streaming_call_shows_while_in_flight(Backend::Services, "services").await;
}

#[tokio::test]
async fn a_call_in_flight_embedded() {
    a_streaming_call_shows_while_in_flight(Backend::Embedded, "embedded").await;
}

#[tokio::test]
async fn the_timeline_on_the_services() {
    the_timeline_tells_a_turn_in_order(Backend::Services, "services").await;
}

#[tokio::test]
async fn the_timeline_embedded() {
    the_timeline_tells_a_turn_in_order(Backend::Embedded, "embedded").await;
}
