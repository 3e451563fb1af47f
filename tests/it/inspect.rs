//! The turn inspector's data (`GET /v1/sessions/{sid}/turns/{tid}/inspect`), on both
//! backends: a turn's history from `queued` on, each model call and request, each server tool
//! call with its output; a run that failed and ran again says why; another tenant's turn is
//! missing.

use aptix_worker::fake_llm::Reply;
use serde_json::{Value, json};

use crate::app::{App, AppOptions, Backend, spawn};

async fn inspect(app: &App, token: &str, session: &str, turn: &str) -> (u16, Value) {
    app.get(
        Some(token),
        &format!("/v1/sessions/{session}/turns/{turn}/inspect"),
    )
    .await
}

fn events(inspection: &Value) -> Vec<(String, u64)> {
    inspection["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap().to_string(),
                e["attempt"].as_u64().unwrap(),
            )
        })
        .collect()
}

async fn a_turn_with_a_server_tool_shows_its_calls_tools_and_history(backend: Backend) {
    let app = spawn(AppOptions {
        backend,
        ..AppOptions::default()
    })
    .await;
    let body = json!({"sessionId": "i", "turnId": "t", "instruction": "Modes?\n#fake:call agent_list_modes {}"});
    assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
    assert_eq!(app.settled("tok-a", "i", "t").await["status"], "completed");
    let (status, body) = inspect(&app, "tok-a", "i", "t").await;
    assert_eq!(status, 200, "{body}");
    let seen = &body["result"];
    assert_eq!(
        events(seen),
        [
            ("queued".to_string(), 0),
            ("run_started".into(), 1),
            ("completed".into(), 1)
        ]
    );
    let calls = seen["modelCalls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{seen}");
    let usages = app.fake.usages();
    for (call, reported) in calls.iter().zip(&usages) {
        assert_eq!(call["usage"]["promptTokens"], reported["input_tokens"]);
        assert_eq!(call["usage"]["completionTokens"], reported["output_tokens"]);
        assert_eq!(
            (&call["agentContext"], &call["model"]),
            (&json!("default"), &json!("m"))
        );
        assert_eq!(call["attempt"], 1);
    }
    assert!(
        calls[0].get("text").is_none(),
        "the first answer only calls a tool"
    );
    assert_eq!(
        calls[1]["text"], seen["result"]["result"]["primaryOutputText"],
        "the second answer is the turn's text"
    );
    let requests = seen["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0]["model"], "m");
    assert!(!requests[0]["instructions"].as_str().unwrap().is_empty());
    assert!(requests[0]["input"].to_string().contains("Modes?"));
    let tools = seen["toolCalls"].as_array().unwrap();
    assert_eq!(tools.len(), 1, "{seen}");
    assert_eq!(tools[0]["name"], "agent_list_modes");
    assert_eq!(tools[0]["arguments"], "{}");
    assert!(tools[0].get("replayed").is_none());
    let output: Value = serde_json::from_str(tools[0]["output"].as_str().unwrap()).unwrap();
    assert!(output.is_object(), "{output}");
    // The request that answered the tool carries its output.
    assert!(
        requests[1]
            .to_string()
            .contains(tools[0]["toolCallId"].as_str().unwrap())
    );

    // Another tenant's turn reads as missing.
    let (status, _) = inspect(&app, "tok-b", "i", "t").await;
    assert_eq!(status, 404);
}

async fn a_run_that_failed_and_ran_again_says_why(backend: Backend) {
    let app = spawn(AppOptions {
        backend,
        ..AppOptions::default()
    })
    .await;
    app.fake.push([Reply::Error {
        status: 500,
        message: "The server had an error".into(),
        retry_after_ms: None,
    }]);
    let body = json!({"sessionId": "r", "turnId": "t", "instruction": "hello"});
    assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
    assert_eq!(app.settled("tok-a", "r", "t").await["status"], "completed");
    let (_, body) = inspect(&app, "tok-a", "r", "t").await;
    let seen = &body["result"];
    assert_eq!(
        events(seen),
        [
            ("queued".to_string(), 0),
            ("run_started".into(), 1),
            ("run_ended".into(), 1),
            ("run_started".into(), 2),
            ("completed".into(), 2)
        ],
        "{seen}"
    );
    let ended = &seen["history"][2]["detail"];
    assert!(
        ended.as_str().unwrap().starts_with("LLM_UNAVAILABLE"),
        "{ended}"
    );
    // Both requests were sent; one was answered.
    assert_eq!(seen["requests"].as_array().unwrap().len(), 2);
    assert_eq!(seen["modelCalls"].as_array().unwrap().len(), 1);
    assert_eq!(seen["modelCalls"][0]["attempt"], 2);
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [
        a_turn_with_a_server_tool_shows_its_calls_tools_and_history,
        a_run_that_failed_and_ran_again_says_why,
    ],
);
