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
    // Exactly what the model server received, though the record keeps each request without
    // its prompt (instructions and tools), which it names and the store keeps once.
    assert_eq!(requests, &app.fake.requests(), "the requests as sent");
    let sid = aptix_worker::contract::SessionId::parse("i")
        .unwrap()
        .within("tenant-a");
    let kept = app
        .store
        .get_turn(&sid, &aptix_worker::contract::TurnId::parse("t").unwrap())
        .await
        .unwrap()
        .unwrap();
    for request in &kept.requests {
        let value = request.to_value().unwrap();
        assert!(
            value.get("instructions").is_none() && value.get("tools").is_none(),
            "{value}"
        );
        assert_eq!(
            value["aptixPrompt"].as_str().map(str::len),
            Some(32),
            "{value}"
        );
    }
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
    // Both requests were sent; both calls are listed, the first with why it got no answer.
    assert_eq!(seen["requests"].as_array().unwrap().len(), 2);
    let calls = seen["modelCalls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{seen}");
    assert_eq!(calls[0]["attempt"], 1);
    let why = calls[0]["error"].as_str().unwrap_or_default();
    assert!(why.starts_with("LLM_UNAVAILABLE"), "{why}");
    assert_eq!(calls[0]["responseId"], "");
    assert_eq!(calls[1]["attempt"], 2);
    assert!(calls[1].get("error").is_none(), "{seen}");
    // Each call says when it started, after the turn was accepted, in order.
    let start = |c: &serde_json::Value| c["startMs"].as_u64().expect("startMs");
    assert!(start(&calls[0]) <= start(&calls[1]), "{seen}");
    assert_eq!(seen["input"]["instruction"], "hello");
    assert_eq!(seen["tenant"], "tenant-a");
}

/// A tenant whose entry says `"keepBodies": false`: its turn records keep no request sent,
/// no answer text and no tool arguments — in the store, not only in what the API shows — and
/// say so; the result and everything else are kept. Another tenant's turn keeps them.
async fn a_tenant_that_keeps_no_bodies_has_none_in_its_records(backend: Backend) {
    let app = spawn(AppOptions {
        backend,
        extra_env: vec![crate::tenants::tenants_file(
            json!([{"id": "tenant-b", "keepBodies": false}]),
        )],
        ..AppOptions::default()
    })
    .await;
    let instruction = "Secret plans?\n#fake:call agent_list_modes {\"q\": \"secret\"}";
    for (token, session) in [("tok-b", "nb"), ("tok-a", "na")] {
        let body = json!({"sessionId": session, "turnId": "t", "instruction": instruction});
        assert_eq!(app.post(Some(token), body.to_string()).await.0, 202);
        assert_eq!(
            app.settled(token, session, "t").await["status"],
            "completed"
        );
    }
    let (status, body) = inspect(&app, "tok-b", "nb", "t").await;
    assert_eq!(status, 200, "{body}");
    let seen = &body["result"];
    assert_eq!(seen["bodiesWithheld"], true);
    assert_eq!(seen["requests"], json!([]));
    let calls = seen["modelCalls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "the calls themselves are kept: {seen}");
    assert!(calls.iter().all(|c| c.get("text").is_none()), "{seen}");
    assert!(calls[1]["usage"]["promptTokens"].as_u64().unwrap() > 0);
    assert_eq!(seen["toolCalls"][0]["name"], "agent_list_modes");
    assert_eq!(seen["toolCalls"][0]["arguments"], "");
    assert!(
        !seen["result"]["result"]["primaryOutputText"]
            .as_str()
            .unwrap()
            .is_empty(),
        "the result is kept"
    );
    // Nothing of the instruction in the stored record itself.
    let stored = app
        .store
        .get_turn(
            &aptix_worker::contract::SessionId::parse("nb")
                .unwrap()
                .within("tenant-b"),
            &aptix_worker::contract::TurnId::parse("t").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    let kept = serde_json::to_string(&stored).unwrap();
    assert!(!kept.contains("Secret plans"), "{kept}");
    assert!(!kept.contains("\"q\""), "{kept}");
    // Nor the client's answer to a tool it ran for the turn.
    app.fake.push([Reply::Calls(vec![(
        "workspace_read_file".into(),
        json!({"path": "plans.md"}),
    )])]);
    let body = json!({"sessionId": "nb", "turnId": "t2", "instruction": "read the plans"});
    assert_eq!(app.post(Some("tok-b"), body.to_string()).await.0, 202);
    let waiting = app.settled("tok-b", "nb", "t2").await;
    let call = waiting["result"]["result"]["toolCalls"][0]["toolCallId"]
        .as_str()
        .unwrap_or_else(|| panic!("a client call: {waiting}"))
        .to_string();
    let answer = json!({"sessionId": "nb", "turnId": "t2", "toolResults": [{
        "toolCallId": call, "executionMs": 2,
        "resultJson": json!({"contents": "the secret contents"}).to_string()}]});
    assert_eq!(app.post(Some("tok-b"), answer.to_string()).await.0, 202);
    assert_eq!(
        app.settled("tok-b", "nb", "t2").await["status"],
        "completed"
    );
    let stored = app
        .store
        .get_turn(
            &aptix_worker::contract::SessionId::parse("nb")
                .unwrap()
                .within("tenant-b"),
            &aptix_worker::contract::TurnId::parse("t2").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    let kept = serde_json::to_string(&stored).unwrap();
    assert!(!kept.contains("secret contents"), "{kept}");
    assert!(
        stored
            .tools
            .iter()
            .any(|t| t.source.as_deref() == Some("client"))
    );

    let (_, body) = inspect(&app, "tok-a", "na", "t").await;
    let seen = &body["result"];
    assert_eq!(seen["bodiesWithheld"], false);
    assert!(
        seen["input"]["instruction"]
            .as_str()
            .is_some_and(|i| i.starts_with("Secret plans?")),
        "the other tenant's instruction is kept: {seen}"
    );
    assert_eq!(seen["requests"].as_array().unwrap().len(), 2);
    assert!(seen["modelCalls"][1]["text"].is_string());
    assert!(
        seen["toolCalls"][0]["arguments"]
            .as_str()
            .unwrap()
            .contains("secret")
    );
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [
        a_turn_with_a_server_tool_shows_its_calls_tools_and_history,
        a_run_that_failed_and_ran_again_says_why,
        a_tenant_that_keeps_no_bodies_has_none_in_its_records,
    ],
);
