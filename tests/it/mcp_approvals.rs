//! A person's approval of an MCP tool call, through every way a client reaches a turn: the
//! synchronous endpoint (approved), `POST /v1/turns` (denied), and a batch line whose webhook
//! says it waits (approved from the event). The call asks as the client tool
//! `aptix_approve_server_tool` under the model's own call id; the tool runs only once approved.

use std::time::Duration;

use serde_json::{Value, json};

use crate::app::{App, AppOptions, Backend, spawn};
use crate::mcp_support::{HttpServer, ToolsFile, tool_outputs};
use crate::webhooks::{Receiver, webhook_env};

async fn app_with(backend: Backend, file: &ToolsFile, more: Vec<(&'static str, String)>) -> App {
    let mut env = file.env();
    env.extend(more);
    let app = spawn(AppOptions {
        backend,
        extra_env: env,
        ..AppOptions::default()
    })
    .await;
    app.wait_for_metric("aptix_tool_source_up{source=\"calc\"}", |v| v == 1.0)
        .await;
    app
}

/// The one pending call of a waiting turn's result, checked to be an approval question about
/// `add` with `amount`; its call id.
fn the_question(result: &Value, amount: i64) -> String {
    assert_eq!(result["kind"], "client_tool_continuation", "{result}");
    let calls = result["toolCalls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{result}");
    assert_eq!(calls[0]["name"], "aptix_approve_server_tool");
    let asked: Value = serde_json::from_str(calls[0]["argumentsJson"].as_str().unwrap()).unwrap();
    assert_eq!(
        (&asked["tool"], &asked["source"], &asked["arguments"]),
        (&json!("add"), &json!("calc"), &json!({"amount": amount})),
        "{asked}"
    );
    assert_eq!(asked["annotations"]["readOnly"], false);
    calls[0]["toolCallId"].as_str().unwrap().to_string()
}

fn answer((session, turn): (&str, &str), call_id: &str, verdict: Value) -> String {
    json!({"sessionId": session, "turnId": turn, "toolResults": [
        {"toolCallId": call_id, "executionMs": 1, "resultJson": verdict.to_string()}
    ]})
    .to_string()
}

/// The synchronous endpoint: the turn answers with the question; the answer "approved" runs
/// the tool, whose output reaches the model.
pub(super) async fn approved_through_the_synchronous_endpoint(backend: Backend) {
    let server = HttpServer::start().await;
    let file = ToolsFile::new(vec![server.source("calc", json!({"approval": ["add"]}))]);
    let app = app_with(backend, &file, vec![]).await;
    let turn =
        json!({"sessionId": "s", "turnId": "t", "instruction": "#fake:call add {\"amount\": 3}"});
    let (status, asked) = app
        .post_to(Some("tok-a"), "/api/ai/agent/execute", turn.to_string())
        .await;
    assert_eq!(status, 200, "{asked}");
    let call_id = the_question(&asked["result"], 3);
    assert!(
        server.state.calls_of("add").is_empty(),
        "not run before it is approved"
    );
    let (status, done) = app
        .post_to(
            Some("tok-a"),
            "/api/ai/agent/execute",
            answer(("s", "t"), &call_id, json!({"approved": true})),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["result"]["kind"], "final", "{done}");
    assert_eq!(server.state.calls_of("add").len(), 1);
    let last = app.fake.requests().last().cloned().unwrap();
    assert_eq!(tool_outputs(&last), vec![(call_id, "added 3".to_string())]);
    let text = app.metrics_text().await;
    for outcome in ["approval_asked", "approved", "answered"] {
        let series =
            format!("aptix_tool_calls_total{{source=\"calc\",tool=\"add\",outcome=\"{outcome}\"}}");
        assert_eq!(crate::support::metric(&text, &series), 1.0, "{series}");
    }
}

/// `POST /v1/turns`: the turn waits; a denial tells the model why and runs nothing.
pub(super) async fn denied_through_the_async_api(backend: Backend) {
    let server = HttpServer::start().await;
    // A tool that says it may destroy needs approval by default; `add` says nothing, so the
    // source asks for every call.
    let file = ToolsFile::new(vec![server.source("calc", json!({"approval": "always"}))]);
    let app = app_with(backend, &file, vec![]).await;
    let turn =
        json!({"sessionId": "s", "turnId": "t", "instruction": "#fake:call add {\"amount\": 4}"});
    assert_eq!(app.post(Some("tok-a"), turn.to_string()).await.0, 202);
    let waiting = app.settled("tok-a", "s", "t").await;
    assert_eq!(waiting["status"], "awaiting_client_tools", "{waiting}");
    let call_id = the_question(&waiting["result"]["result"], 4);
    let verdict = json!({"approved": false, "reason": "over budget"});
    assert_eq!(
        app.post(Some("tok-a"), answer(("s", "t"), &call_id, verdict))
            .await
            .0,
        202
    );
    let done = app.settled("tok-a", "s", "t").await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(
        server.state.calls_of("add").is_empty(),
        "a denied call never runs"
    );
    let (_, told) = tool_outputs(app.fake.requests().last().unwrap()).remove(0);
    let told: Value = serde_json::from_str(&told).unwrap();
    assert_eq!(told["denied"], true);
    assert!(
        told["error"].as_str().unwrap().contains("over budget"),
        "{told}"
    );
}

/// A batch line: its webhook's `turn.awaiting_client_tools` event carries the question; the
/// answer sent for the line's turn runs the tool, and the batch completes.
pub(super) async fn a_batch_line_waits_for_approval_and_its_webhook_asks(backend: Backend) {
    let server = HttpServer::start().await;
    let receiver = Receiver::start([]).await;
    let file = ToolsFile::new(vec![server.source("calc", json!({"approval": ["add"]}))]);
    let app = app_with(backend, &file, webhook_env(&[])).await;
    let line =
        json!({"customId": "a", "request": {"instruction": "#fake:call add {\"amount\": 5}"}});
    let path = format!(
        "/v1/batches?webhook={}",
        receiver.url.replace(':', "%3A").replace('/', "%2F")
    );
    let (status, body) = app.post_to(Some("tok-a"), &path, line.to_string()).await;
    assert_eq!(status, 202, "{body}");
    let batch_id = body["result"]["batchId"].as_str().unwrap().to_string();
    let event = |got: &[crate::webhooks::Received], kind: &str| -> Option<Value> {
        got.iter()
            .map(|r| serde_json::from_str::<Value>(&r.body).unwrap())
            .find(|e| e["type"] == kind)
    };
    let got = receiver
        .until(Duration::from_secs(30), |got| {
            event(got, "turn.awaiting_client_tools").is_some()
        })
        .await;
    let waiting = event(&got, "turn.awaiting_client_tools").unwrap();
    let data = &waiting["data"];
    let session = data["sessionId"].as_str().unwrap().to_string();
    let turn = data["turnId"].as_str().unwrap().to_string();
    let call_id = the_question(&data["result"]["result"], 5);
    let (status, listed) = app
        .get(Some("tok-a"), &format!("/v1/batches/{batch_id}"))
        .await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["result"]["awaitingClientTools"], 1, "{listed}");
    let approve = answer((&session, &turn), &call_id, json!({"approved": true}));
    assert_eq!(app.post(Some("tok-a"), approve).await.0, 202);
    assert_eq!(
        app.settled("tok-a", &session, &turn).await["status"],
        "completed"
    );
    assert_eq!(server.state.calls_of("add").len(), 1);
    // The line's completion is told too (a line waiting for its client counts as settled for
    // `batch.completed`, which may come before or after it).
    receiver
        .until(Duration::from_secs(30), |got| {
            event(got, "turn.completed").is_some() && event(got, "batch.completed").is_some()
        })
        .await;
}

/// `aptix batch` answers the client tools it can, but never a question for a person: the line
/// whose model calls a tool that needs approval is left waiting and listed as such.
#[tokio::test]
async fn aptix_batch_leaves_an_approval_to_a_person_and_lists_it() {
    let server = HttpServer::start().await;
    let file = ToolsFile::new(vec![server.source("calc", json!({"approval": ["add"]}))]);
    let root =
        std::env::temp_dir().join(format!("aptix-approve-{}", uuid::Uuid::new_v4().simple()));
    let (input, out) = (root.join("in"), root.join("out"));
    std::fs::create_dir_all(&input).unwrap();
    std::fs::write(
        input.join("a.md"),
        "# A\n\n#fake:call add {\"amount\": 1}\n",
    )
    .unwrap();
    std::fs::write(input.join("b.md"), "# B\n\nNothing to do.\n").unwrap();
    let o = crate::support::aptix()
        .arg("batch")
        .arg(&input)
        .args(["--instruction", "Review it", "--poll-ms", "50", "--out"])
        .arg(&out)
        .envs(file.env())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("1 completed now"), "{stdout}");
    assert!(
        stdout.contains("a.md: waits for a person's approval of add"),
        "{stdout}"
    );
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let reason = summary["failed"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("aptix_approve_server_tool"), "{summary}");
    assert!(
        server.state.calls_of("add").is_empty(),
        "nothing ran unapproved"
    );
    let _ = std::fs::remove_dir_all(&root);
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [
        approved_through_the_synchronous_endpoint,
        denied_through_the_async_api,
        a_batch_line_waits_for_approval_and_its_webhook_asks,
    ],
);
