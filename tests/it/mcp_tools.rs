//! MCP server tools against a real MCP server we did not write (the official Python SDK, see
//! `mcp_support`), on both backends: discovery, the model (our fake, scripted by the turn's
//! instruction) calling each kind of tool and getting its output, `isError`, a schema
//! mismatch, a timeout, the source down and back, `list_changed`, stdio, and a URL outside the
//! allow-list.

use std::time::Duration;

use serde_json::{Value, json};

use crate::app::{App, AppOptions, Backend, spawn};
use crate::mcp_support::{
    HttpServer, State, ToolsFile, free_port, idempotency_key, offered, tool_outputs,
};

/// An app whose tools file is `file`, once every source it names is up.
async fn app_with(backend: Backend, file: &ToolsFile, more: Vec<(&'static str, String)>) -> App {
    let mut env = file.env();
    env.extend(more);
    spawn(AppOptions {
        backend,
        extra_env: env,
        ..AppOptions::default()
    })
    .await
}

async fn wait_up(app: &App, source: &str) {
    app.wait_for_metric(
        &format!("aptix_tool_source_up{{source=\"{source}\"}}"),
        |v| v == 1.0,
    )
    .await;
}

/// The trace the client of [`run`] sends its turns in.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// Submits turn `turn` of session `session` (tenant A) with `instruction`, in trace
/// [`TRACE_ID`]; its settled status.
async fn run(app: &App, session: &str, turn: &str, instruction: &str) -> Value {
    let body = json!({"sessionId": session, "turnId": turn, "instruction": instruction});
    let trace = format!("00-{TRACE_ID}-00f067aa0ba902b7-01");
    let (status, accepted) = app
        .post_with(
            Some("tok-a"),
            "/v1/turns",
            &[("traceparent", &trace)],
            body.to_string(),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    app.settled("tok-a", session, turn).await
}

/// The model's requests after the one that asked for tools: the outputs each carried.
fn outputs_sent(app: &App) -> Vec<(String, String)> {
    app.fake.requests().iter().flat_map(tool_outputs).collect()
}

/// Discovery at start-up; a read-only, an idempotent and a side-effecting tool called in the
/// order the model asked, each output given back to the model as the tool answered it, each
/// call carrying the documented idempotency key; the calls in the turn's record.
pub(super) async fn discovered_tools_are_offered_and_their_outputs_reach_the_model(
    backend: Backend,
) {
    let server = HttpServer::start().await;
    let file = ToolsFile::new(vec![server.source(
        "calc",
        json!({"prefix": "t_", "tools": ["lookup", "mark", "add", "fail", "nap"]}),
    )]);
    let app = app_with(backend, &file, vec![]).await;
    wait_up(&app, "calc").await;
    let done = run(
        &app,
        "s",
        "t",
        "#fake:call t_lookup {\"city\": \"Oslo\"}\n#fake:call t_mark {\"key\": \"k1\"}\n#fake:call t_add {\"amount\": 2}",
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    let requests = app.fake.requests();
    let tools = offered(&requests[0]);
    for t in ["t_lookup", "t_mark", "t_add", "t_fail", "t_nap"] {
        assert!(tools.contains(&t.to_string()), "{t} offered: {tools:?}");
    }
    assert!(
        !tools.contains(&"t_grow".to_string()),
        "not in the allow-list"
    );
    let lookup = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "t_lookup")
        .unwrap();
    assert_eq!(lookup["type"], "function");
    assert_eq!(lookup["parameters"]["properties"]["city"]["type"], "string");
    let outputs = tool_outputs(&requests[1]);
    assert_eq!(outputs.len(), 3, "{outputs:?}");
    let first: Value = serde_json::from_str(&outputs[0].1).unwrap();
    assert_eq!(first, json!({"city": "Oslo", "temperatureC": 21}));
    assert_eq!(outputs[1].1, "marked k1");
    assert_eq!(outputs[2].1, "added 2");
    // Run in order, once each, each with its call's key.
    let calls = server.state.calls();
    let ran: Vec<&str> = calls.iter().map(|c| c["tool"].as_str().unwrap()).collect();
    assert_eq!(ran, ["lookup", "mark", "add"]);
    for (call, (call_id, _)) in calls.iter().zip(&outputs) {
        assert_eq!(
            call["key"],
            idempotency_key("tenant-a/s", "t", call_id).as_str(),
            "{call}"
        );
        // The client's trace goes on to the tool server, as a header of the call's own HTTP
        // request and in its `_meta`, under a span of the worker's.
        let header = call["traceparent"]
            .as_str()
            .unwrap_or_else(|| panic!("no traceparent header: {call}"));
        assert_eq!(call["metaTraceparent"], header, "{call}");
        let parts: Vec<&str> = header.split('-').collect();
        assert_eq!(
            (parts.len(), parts[0], parts[1]),
            (4, "00", TRACE_ID),
            "{call}"
        );
        assert_ne!(
            parts[2], "00f067aa0ba902b7",
            "a span of the worker's: {call}"
        );
    }
    // The turn's record names the source and the outcome of each call.
    let (status, seen) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t/inspect")
        .await;
    assert_eq!(status, 200, "{seen}");
    let notes = seen["result"]["toolCalls"].as_array().unwrap();
    assert_eq!(notes.len(), 3, "{seen}");
    assert!(
        notes
            .iter()
            .all(|n| n["source"] == "calc" && n["outcome"] == "answered"),
        "{notes:?}"
    );
    let text = app.metrics_text().await;
    let answered = crate::support::metric(
        &text,
        "aptix_tool_calls_total{source=\"calc\",tool=\"add\",outcome=\"answered\"}",
    );
    assert_eq!(answered, 1.0);
}

/// A source's `tenants` and `modes` decide whose turns, in which modes, are offered its tools:
/// tenant B's turn gets them, tenant A's does not (a call of one answers "not available").
pub(super) async fn a_source_is_offered_only_to_its_tenants(backend: Backend) {
    let server = HttpServer::start().await;
    let file = ToolsFile::new(vec![server.source(
        "calc",
        json!({"tenants": ["tenant-b"], "modes": ["general"]}),
    )]);
    let app = app_with(backend, &file, vec![]).await;
    wait_up(&app, "calc").await;
    let body = json!({"sessionId": "s", "turnId": "t", "instruction": "#fake:call lookup {\"city\": \"Rome\"}"});
    assert_eq!(app.post(Some("tok-b"), body.to_string()).await.0, 202);
    assert_eq!(app.settled("tok-b", "s", "t").await["status"], "completed");
    assert!(offered(&app.fake.requests()[0]).contains(&"lookup".to_string()));
    let done = run(&app, "s", "t", "#fake:call lookup {\"city\": \"Rome\"}").await;
    assert_eq!(done["status"], "completed", "{done}");
    let requests = app.fake.requests();
    assert!(
        !offered(&requests[2]).contains(&"lookup".to_string()),
        "not tenant A's"
    );
    let out = tool_outputs(&requests[3]);
    assert!(
        out[0].1.contains("is not available in this mode"),
        "{out:?}"
    );
    assert_eq!(
        server.state.calls_of("lookup").len(),
        1,
        "tenant B's call only"
    );
}

/// A tool that answers `isError` answers the model; arguments that do not match the schema
/// answer the model without calling the server.
pub(super) async fn a_tool_error_and_a_schema_mismatch_answer_the_model(backend: Backend) {
    let server = HttpServer::start().await;
    let file = ToolsFile::new(vec![server.source("calc", json!({}))]);
    let app = app_with(backend, &file, vec![]).await;
    wait_up(&app, "calc").await;
    let done = run(
        &app,
        "s",
        "t",
        "#fake:call fail {\"reason\": \"no stock\"}\n#fake:call add {\"amount\": \"two\"}",
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    let outputs = outputs_sent(&app);
    assert_eq!(outputs.len(), 2, "{outputs:?}");
    let error: Value = serde_json::from_str(&outputs[0].1).unwrap();
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("cannot do it: no stock"),
        "{error}"
    );
    let mismatch: Value = serde_json::from_str(&outputs[1].1).unwrap();
    let says = mismatch["error"].as_str().unwrap();
    assert!(
        says.contains("do not match the tool's schema") && says.contains("/amount"),
        "{says}"
    );
    assert!(
        server.state.calls_of("add").is_empty(),
        "the server was not called"
    );
    assert_eq!(server.state.calls_of("fail").len(), 1);
}

/// A call that takes longer than the source's timeout fails the turn retryably; once the
/// attempts run out the turn fails with TOOL_UNAVAILABLE (the read-only tool was tried once
/// per attempt, nothing more).
pub(super) async fn a_call_past_its_timeout_fails_the_turn_retryably(backend: Backend) {
    let server = HttpServer::start().await;
    let file = ToolsFile::new(vec![server.source("calc", json!({"callTimeoutMs": 300}))]);
    let app = app_with(
        backend,
        &file,
        vec![
            ("APTIX_MAX_ATTEMPTS", "2".into()),
            ("APTIX_RETRY_DELAYS", "100ms".into()),
        ],
    )
    .await;
    wait_up(&app, "calc").await;
    let done = run(&app, "s", "t", "#fake:call nap {\"ms\": 5000}").await;
    assert_eq!(done["status"], "failed", "{done}");
    let errors = done["result"]["errors"].as_array().unwrap();
    assert_eq!(errors[0]["errorCode"], "TOOL_UNAVAILABLE", "{done}");
    assert!(
        errors[0]["message"]
            .as_str()
            .unwrap()
            .contains("did not answer within"),
        "{done}"
    );
    assert_eq!(server.state.calls_of("nap").len(), 2, "once per attempt");
}

/// A source that is down at start-up: the app starts, `/readyz` says so (still ready), the
/// metric says so and its tools are absent; once the server answers, its tools are offered.
/// A call while the server is killed fails the turn retryably and runs once when it is back.
pub(super) async fn a_source_down_and_back_loses_and_doubles_nothing(backend: Backend) {
    let port = free_port();
    let state = State::new();
    let file = ToolsFile::new(vec![json!({
        "name": "late", "url": format!("http://127.0.0.1:{port}/mcp"), "connectTimeoutMs": 1000
    })]);
    let app = app_with(
        backend,
        &file,
        vec![
            ("APTIX_MAX_ATTEMPTS", "20".into()),
            ("APTIX_RETRY_DELAYS", "300ms".into()),
        ],
    )
    .await;
    let (status, ready) = app.get(None, "/readyz").await;
    assert_eq!(status, 200, "{ready}");
    let source = &ready["result"]["toolSources"][0];
    assert_eq!(
        (&source["name"], &source["up"]),
        (&json!("late"), &json!(false)),
        "{ready}"
    );
    assert_eq!(
        ready["warnings"][0]["errorCode"], "TOOL_UNAVAILABLE",
        "{ready}"
    );
    let early = run(&app, "s", "t0", "#fake:call add {\"amount\": 1}").await;
    let out = outputs_sent(&app);
    assert_eq!(early["status"], "completed", "{early}");
    assert!(
        out[0].1.contains("is not available in this mode"),
        "absent while down: {out:?}"
    );

    // The server comes up where the source points: the worker connects on its own.
    let mut server = HttpServer::at(port, state).await;
    wait_up(&app, "late").await;
    let (_, ready) = app.get(None, "/readyz").await;
    assert_eq!(ready["result"]["toolSources"][0]["up"], true, "{ready}");

    // Killed: a turn that calls it fails and waits; back: the call runs once.
    server.kill();
    let body =
        json!({"sessionId": "s", "turnId": "t1", "instruction": "#fake:call add {\"amount\": 2}"});
    assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
    app.wait_for_metric(
        "aptix_tool_calls_total{source=\"late\",tool=\"add\",outcome=\"failed\"}",
        |v| v >= 1.0,
    )
    .await;
    server.restart().await;
    let done = app.settled("tok-a", "s", "t1").await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        server.state.calls_of("add").len(),
        1,
        "{:?}",
        server.state.calls()
    );
    let last = outputs_sent(&app).pop().unwrap();
    assert_eq!(last.1, "added 2");
}

/// A tool added at the server (`notifications/tools/list_changed`) is offered from then on.
pub(super) async fn a_list_changed_notification_brings_new_tools(backend: Backend) {
    let server = HttpServer::start().await;
    let file = ToolsFile::new(vec![server.source("calc", json!({}))]);
    let app = app_with(backend, &file, vec![]).await;
    wait_up(&app, "calc").await;
    let before = app
        .wait_for_metric("aptix_tool_source_tools{source=\"calc\"}", |v| v > 0.0)
        .await;
    let done = run(&app, "s", "t1", "#fake:call grow {}").await;
    assert_eq!(done["status"], "completed", "{done}");
    app.wait_for_metric("aptix_tool_source_tools{source=\"calc\"}", |v| v > before)
        .await;
    let done = run(&app, "s", "t2", "#fake:call extra {}").await;
    assert_eq!(done["status"], "completed", "{done}");
    let requests = app.fake.requests();
    let last = requests.last().unwrap();
    assert_eq!(tool_outputs(last).last().unwrap().1, "extra ran");
    assert!(offered(&requests[requests.len() - 2]).contains(&"extra".to_string()));
}

/// A stdio source: the command is started and kept; killed, it is started again and its
/// tools answer as before.
pub(super) async fn a_stdio_server_is_started_kept_and_restarted(backend: Backend) {
    let state = State::new();
    let file = ToolsFile::new(vec![state.stdio_source("local", json!({"prefix": "loc_"}))]);
    let app = app_with(backend, &file, vec![]).await;
    wait_up(&app, "local").await;
    let done = run(
        &app,
        "s",
        "t1",
        "#fake:call loc_lookup {\"city\": \"Lima\"}",
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    let first = state.calls_of("lookup");
    assert_eq!(first.len(), 1);
    let pid = first[0]["pid"].as_i64().unwrap();
    // The child dies (as a crash would): the worker starts it again.
    std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    app.wait_for_metric("aptix_tool_source_up{source=\"local\"}", |v| v == 0.0)
        .await;
    wait_up(&app, "local").await;
    let done = run(
        &app,
        "s",
        "t2",
        "#fake:call loc_lookup {\"city\": \"Quito\"}",
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    let calls = state.calls_of("lookup");
    assert_eq!(calls.len(), 2);
    assert_ne!(calls[1]["pid"], pid, "a new process");
    let out: Value = serde_json::from_str(&outputs_sent(&app).pop().unwrap().1).unwrap();
    assert_eq!(out["city"], "Quito");
}

/// A URL outside the allow-list: a loopback address without `APTIX_TOOLS_ALLOW` stops
/// start-up naming the variable; a name that resolves to one is refused at connection.
pub(super) async fn a_url_outside_the_allow_list_is_refused(backend: Backend) {
    let server = HttpServer::start().await;
    let file = ToolsFile::new(vec![server.source("calc", json!({}))]);
    let refused = aptix_worker::config::Config::from_lookup(|k| match k {
        "APTIX_TOOLS_FILE" => Some(file.path.display().to_string()),
        "APTIX_TOOLS_ALLOW_HTTP" => Some("true".into()),
        _ => None,
    })
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("APTIX_TOOLS_FILE") && refused.contains("not a public address"),
        "{refused}"
    );
    // By name: `localhost` passes the start-up check, and its address is refused on connect.
    let by_name = ToolsFile::new(vec![json!({
        "name": "named", "url": format!("http://localhost:{}/mcp", server.port)
    })]);
    let app = spawn(AppOptions {
        backend,
        extra_env: vec![
            ("APTIX_TOOLS_FILE", by_name.path.display().to_string()),
            ("APTIX_TOOLS_ALLOW_HTTP", "true".into()),
        ],
        ..AppOptions::default()
    })
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let problem = loop {
        let (_, ready) = app.get(None, "/readyz").await;
        let p = ready["result"]["toolSources"][0]["problem"].clone();
        if p.as_str().is_some_and(|p| p != "not connected yet") {
            break p;
        }
        assert!(std::time::Instant::now() < deadline, "{ready}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        problem.as_str().unwrap().contains("not a public address"),
        "{problem}"
    );
    assert!(server.state.calls().is_empty());
}

/// `aptix tools`, as an operator runs it: the catalog per mode with each MCP tool's source,
/// annotations and repeat safety; a mode the source does not serve lacks its tools; a source
/// that does not answer makes it exit 1, naming the problem.
#[tokio::test]
async fn aptix_tools_prints_the_catalog_in_use_per_mode() {
    let server = HttpServer::start().await;
    let file = ToolsFile::new(vec![
        server.source(
            "calc",
            json!({"prefix": "t_", "modes": ["general"], "repeat": {"add": "safe"}}),
        ),
        json!({"name": "gone", "url": format!("http://127.0.0.1:{}/mcp", free_port()), "connectTimeoutMs": 500}),
    ]);
    let out = crate::support::aptix()
        .arg("tools")
        .envs(file.env())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "a source is down");
    assert!(String::from_utf8_lossy(&out.stderr).contains("did not answer"));
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let sources = printed["sources"].as_array().unwrap();
    assert_eq!(
        (&sources[0]["name"], &sources[0]["up"]),
        (&json!("calc"), &json!(true))
    );
    assert_eq!(
        (&sources[1]["name"], &sources[1]["up"]),
        (&json!("gone"), &json!(false))
    );
    assert!(
        sources[1]["problem"]
            .as_str()
            .unwrap()
            .contains("127.0.0.1"),
        "{printed}"
    );
    let mode = |key: &str| {
        printed["modes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mode"] == key)
            .unwrap()["tools"]
            .as_array()
            .unwrap()
            .clone()
    };
    let general = mode("general");
    let tool = |name: &str| general.iter().find(|t| t["name"] == name).unwrap().clone();
    assert_eq!(tool("agent_change_mode")["location"], "server");
    let lookup = tool("t_lookup");
    assert_eq!(
        (
            &lookup["source"],
            &lookup["remoteName"],
            &lookup["annotations"]["readOnly"]
        ),
        (&json!("calc"), &json!("lookup"), &json!(true))
    );
    assert_eq!(lookup["repeatedAfterACrash"], true);
    assert_eq!(tool("t_mark")["repeatedAfterACrash"], true, "idempotent");
    assert_eq!(
        tool("t_add")["repeatedAfterACrash"],
        true,
        "the operator's override"
    );
    assert_eq!(
        tool("t_nap")["annotations"]["destructive"],
        true,
        "MCP's default"
    );
    assert!(
        mode("ddr_authoring")
            .iter()
            .all(|t| t.get("source").is_none()),
        "a mode the source does not serve"
    );
}

/// The README's example: `examples/mcp/tools.json` (its command pointed at the SDK's
/// interpreter, as the README's install puts it at `.venv-mcp`) with `aptix run` runs a turn
/// that calls the example server's tool, and its output is in the turn's tool results.
#[tokio::test]
async fn the_readme_example_runs_a_turn_that_calls_a_tool() {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mcp/tools.json");
    let mut tools: Value =
        serde_json::from_str(&std::fs::read_to_string(example).unwrap()).unwrap();
    assert_eq!(tools["sources"][0]["command"], ".venv-mcp/bin/python");
    tools["sources"][0]["command"] = json!(crate::mcp_support::python());
    let file = std::env::temp_dir().join(format!(
        "aptix-example-tools-{}.json",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&file, tools.to_string()).unwrap();
    let out = crate::support::aptix()
        .args(["run", "examples/mcp/turn.json"])
        .env("APTIX_TOOLS_FILE", &file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json_start = stdout.find('{').unwrap();
    let result: Value = serde_json::from_str(&stdout[json_start..]).unwrap();
    let output = result["result"]["toolResults"][0]["resultJson"]
        .as_str()
        .unwrap();
    assert!(
        output.contains("Oslo: 21 °C and sunny tomorrow."),
        "{result}"
    );
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [
        discovered_tools_are_offered_and_their_outputs_reach_the_model,
        a_tool_error_and_a_schema_mismatch_answer_the_model,
        a_source_is_offered_only_to_its_tenants,
        a_call_past_its_timeout_fails_the_turn_retryably,
        a_source_down_and_back_loses_and_doubles_nothing,
        a_list_changed_notification_brings_new_tools,
        a_stdio_server_is_started_kept_and_restarted,
        a_url_outside_the_allow_list_is_refused,
    ],
);
