//! Exactly once where it matters: a worker process SIGKILLed while an MCP call is in flight
//! (sent, its answer not recorded), and another worker taking the turn over. The
//! side-effecting counter (no annotations: MCP's defaults say it may not be repeated) is never
//! run twice — the model is told the earlier attempt's outcome is unknown; the idempotent tool
//! is run again, with the same idempotency key, and its answer reaches the model.

use std::time::{Duration, Instant};

use aptix_worker::fake_llm::{FakeLlm, FakeOptions};
use serde_json::{Value, json};

use crate::mcp_support::{HttpServer, ToolsFile, tool_outputs};
use crate::processes::Processes;

/// Waits (up to 60 s) until turn `t` of session `s` has settled; its status.
async fn settled(procs: &Processes, s: &str, t: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = procs
            .get_json(&format!("/v1/sessions/{s}/turns/{t}?wait=20"))
            .await;
        let status = got["result"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if ["completed", "failed", "cancelled"].contains(&status.as_str()) {
            return got["result"].clone();
        }
        assert!(Instant::now() < deadline, "{s}/{t} did not settle: {got}");
    }
}

/// Submits a turn whose model calls `call`, waits until the MCP server has started running
/// `tool`, SIGKILLs the worker running it and starts another.
async fn kill_during(
    procs: &mut Processes,
    server: &HttpServer,
    session: &str,
    tool: &str,
    call: &str,
) {
    let body =
        json!({"sessionId": session, "turnId": "t", "instruction": format!("#fake:call {call}")});
    procs.submit(body.to_string()).await;
    server.state.wait_started(tool).await;
    let victim = procs.workers.len() - 1;
    procs.workers[victim]
        .child
        .kill()
        .expect("SIGKILL the worker");
    let _ = procs.workers[victim].child.wait();
    procs.add_worker();
}

#[tokio::test]
async fn services_a_worker_killed_mid_call_never_repeats_the_counter_and_repeats_the_idempotent_tool()
 {
    let server = HttpServer::start().await;
    let file = ToolsFile::new(vec![
        server.source("calc", json!({})),
        server.source(
            "strict",
            json!({"prefix": "strict_", "tools": ["add"], "unknownOutcome": "fail"}),
        ),
    ]);
    let fake = FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        FakeOptions::default(),
        Some(crate::support::schema()),
    )
    .await
    .unwrap();
    let mut env = file.env();
    env.push(("APTIX_LLM_BASE_URL", fake.base_url()));
    let mut procs = Processes::start(env, &[], 1).await;

    // The counter: sent, then its worker died before the answer was recorded.
    kill_during(
        &mut procs,
        &server,
        "counter",
        "add",
        "add {\"amount\": 1, \"delay_ms\": 4000}",
    )
    .await;
    let done = settled(&procs, "counter", "t").await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["attempts"], 2, "{done}");
    assert_eq!(server.state.calls_of("add").len(), 1, "never run twice");
    let told = fake
        .requests()
        .iter()
        .flat_map(tool_outputs)
        .map(|(_, out)| out)
        .find(|out| out.contains("outcomeUnknown"))
        .expect("the model is told the outcome is unknown");
    assert!(told.contains("whether it took effect is unknown"), "{told}");
    let seen = procs.get_json("/v1/sessions/counter/turns/t/inspect").await;
    let notes = seen["result"]["toolCalls"].as_array().unwrap();
    assert_eq!(notes.last().unwrap()["outcome"], "repeat_refused", "{seen}");

    // The idempotent tool: sent, its worker died, sent again with the same key.
    kill_during(
        &mut procs,
        &server,
        "marker",
        "mark",
        "mark {\"key\": \"k\", \"delay_ms\": 4000}",
    )
    .await;
    let done = settled(&procs, "marker", "t").await;
    assert_eq!(done["status"], "completed", "{done}");
    let marks = server.state.calls_of("mark");
    assert_eq!(marks.len(), 2, "run again: {marks:?}");
    assert!(
        marks[0]["key"].is_string() && marks[0]["key"] == marks[1]["key"],
        "{marks:?}"
    );
    let last = fake
        .requests()
        .iter()
        .flat_map(tool_outputs)
        .last()
        .unwrap();
    assert_eq!(last.1, "marked k");
    let seen = procs.get_json("/v1/sessions/marker/turns/t/inspect").await;
    let note = seen["result"]["toolCalls"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        (&note["outcome"], &note["repeated"]),
        (&json!("answered"), &json!(true)),
        "{seen}"
    );

    let text = crate::support::http_client()
        .get(format!("{}/metrics", procs.workers.last().unwrap().url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        crate::support::metric(
            &text,
            "aptix_tool_calls_total{source=\"calc\",tool=\"mark\",outcome=\"repeated\"}"
        ),
        1.0
    );

    // A source that asks to fail rather than tell: the turn fails with its own code.
    kill_during(
        &mut procs,
        &server,
        "strict",
        "add",
        "strict_add {\"amount\": 5, \"delay_ms\": 4000}",
    )
    .await;
    let done = settled(&procs, "strict", "t").await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(
        done["result"]["errors"][0]["errorCode"], "TOOL_OUTCOME_UNKNOWN",
        "{done}"
    );
    assert_eq!(
        server.state.calls_of("add").len(),
        2,
        "once for each session, never twice"
    );
}
