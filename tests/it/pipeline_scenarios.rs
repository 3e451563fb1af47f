//! The whole pipeline driven against the fake Responses server over HTTP.

use aptix_worker::contract::{AgentExecuteResponse, ErrorCode, InvokeResult, SessionId, TurnId};
use aptix_worker::fake_llm::Reply;
use aptix_worker::pipeline::PipelineSettings;
use aptix_worker::store::TurnStatus;
use serde_json::{Value, json};

use crate::support::{Setup, harness, request};

/// The right to write turn state directly, as these tests of the store do.
pub(super) const G: &aptix_worker::store::Grant = &aptix_worker::store::Grant::for_tests();

pub(super) type Result = InvokeResult<AgentExecuteResponse>;

pub(super) fn turn(session: &str, turn: &str, instruction: &str) -> Value {
    json!({"sessionId": session, "turnId": turn, "instruction": instruction})
}

pub(super) fn final_text(r: &Result) -> &str {
    match r.result() {
        Some(AgentExecuteResponse::Final(f)) => &f.primary_output_text,
        other => panic!(
            "expected a final response, got {other:?} / {:?}",
            r.errors()
        ),
    }
}

pub(super) fn only_error(r: &Result) -> (ErrorCode, String) {
    assert!(
        !r.is_successful(),
        "expected a failure, got {:?}",
        r.result()
    );
    let e = r.errors();
    assert_eq!(e.len(), 1, "{e:?}");
    (e[0].error_code, e[0].message.clone())
}

pub(super) fn client_call_ids(r: &Result) -> Vec<String> {
    match r.result() {
        Some(AgentExecuteResponse::ClientToolContinuation(c)) => {
            c.tool_calls().map(|t| t.tool_call_id.to_string()).collect()
        }
        other => panic!("expected a continuation, got {other:?} / {:?}", r.errors()),
    }
}

pub(super) fn results_json(ids: &[&str]) -> Value {
    Value::Array(ids.iter().map(|id| json!({"toolCallId": id, "executionMs": 5, "resultJson": "{\"contents\":\"# A\"}"})).collect())
}

pub(super) fn function_outputs(body: &Value) -> Vec<(String, String)> {
    body["input"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .map(|i| {
            (
                i["call_id"].as_str().unwrap().to_string(),
                i["output"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

pub(super) async fn status(h: &crate::support::Harness, s: &str, t: &str) -> TurnStatus {
    h.store
        .get_turn(&SessionId::parse(s).unwrap(), &TurnId::parse(t).unwrap())
        .await
        .unwrap()
        .expect("turn stored")
        .status
}

#[tokio::test]
pub(super) async fn plain_answer_then_a_follow_up_turn() {
    let h = harness(Setup::default()).await;
    h.fake
        .push([Reply::Text("Hello.".into()), Reply::Text("Again.".into())]);
    let r = h
        .pipeline
        .run(&request(turn("s1", "t1", "hi")))
        .await
        .unwrap();
    assert_eq!(final_text(&r), "Hello.");
    let Some(AgentExecuteResponse::Final(f)) = r.result() else {
        unreachable!()
    };
    assert_eq!(f.meta.mode_display_name, "General");
    assert!(f.usage.expect("usage").total_tokens > 0);
    assert_eq!(status(&h, "s1", "t1").await, TurnStatus::Completed);
    let sid = SessionId::parse("s1").unwrap();
    let first_id = h
        .store
        .get_session(&sid)
        .await
        .unwrap()
        .unwrap()
        .previous_response_id
        .expect("continuation id stored");

    let r2 = h
        .pipeline
        .run(&request(turn("s1", "t2", "again")))
        .await
        .unwrap();
    assert_eq!(final_text(&r2), "Again.");
    let reqs = h.fake.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        reqs[0]["input"][0]["role"], "system",
        "the first call of a session carries the boot prompt"
    );
    assert!(reqs[0].get("previous_response_id").is_none());
    assert_eq!(
        reqs[1]["input"].as_array().unwrap().len(),
        1,
        "later calls carry only the new user message"
    );
    assert_eq!(reqs[1]["input"][0]["role"], "user");
    assert_eq!(
        reqs[1]["previous_response_id"].as_str(),
        Some(first_id.as_str())
    );
    for r in &reqs {
        assert!(
            r["instructions"]
                .as_str()
                .unwrap()
                .starts_with("Current Mode: general\n")
        );
        assert_eq!(
            r["tools"].as_array().unwrap().len(),
            3,
            "tools are sent on every call"
        );
    }
}

#[tokio::test]
pub(super) async fn a_server_tool_loop_runs_on_the_server() {
    let h = harness(Setup::default()).await;
    h.fake.push([
        Reply::Calls(vec![(
            "agent_list_modes".into(),
            json!({"includeExamples": true}),
        )]),
        Reply::Text("There are three modes.".into()),
    ]);
    let r = h
        .pipeline
        .run(&request(turn("s", "t", "which modes exist?")))
        .await
        .unwrap();
    assert_eq!(final_text(&r), "There are three modes.");
    let Some(AgentExecuteResponse::Final(f)) = r.result() else {
        unreachable!()
    };
    assert_eq!(f.tool_results.len(), 1, "server tools run are listed");
    let reqs = h.fake.requests();
    assert_eq!(reqs.len(), 2);
    let outputs = function_outputs(&reqs[1]);
    assert_eq!(outputs.len(), 1);
    let listed: Value = serde_json::from_str(&outputs[0].1).unwrap();
    assert_eq!(listed["modes"].as_array().unwrap().len(), 3);
    assert_eq!(
        listed["modes"][0]["exampleUtterances"][0],
        "What does this function do?"
    );
    assert!(reqs[1]["previous_response_id"].as_str().is_some());
    assert!(
        reqs[1]["tools"].is_array(),
        "tools are resent on tool-output calls"
    );
}

#[tokio::test]
pub(super) async fn a_mode_change_mid_turn_is_persisted_and_seen() {
    let h = harness(Setup::default()).await;
    h.fake.push([
        Reply::Calls(vec![(
            "agent_change_mode".into(),
            json!({"mode": "ddr_authoring", "branch": false, "reason": "User wants a DDR."}),
        )]),
        Reply::Text("Let's write the DDR.".into()),
        Reply::Text("Next.".into()),
    ]);
    let r = h
        .pipeline
        .run(&request(turn("s", "t1", "write a DDR")))
        .await
        .unwrap();
    let Some(AgentExecuteResponse::Final(f)) = r.result() else {
        panic!("{:?}", r.errors())
    };
    assert_eq!(f.meta.mode_display_name, "DDR Authoring");
    assert!(
        f.primary_output_text
            .starts_with("You are now in DDR Authoring mode.\n\n"),
        "welcome message is prepended"
    );
    let tool_result: Value = match &f.tool_results[0].outcome {
        aptix_worker::contract::ToolOutcome::Result(j) => serde_json::from_str(j.as_str()).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        tool_result,
        json!({"success": true, "mode": "ddr_authoring", "branch": false, "reason": "User wants a DDR."})
    );

    let session = h
        .store
        .get_session(&SessionId::parse("s").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(session.mode_key, "ddr_authoring");
    assert_eq!(session.mode_id, "A9E1F9C15A0C4F8D9AF51F3E8B2A6D22");
    assert_eq!(session.mode_history.len(), 1);
    let entry = &session.mode_history[0];
    assert_eq!(
        (
            entry.previous_mode.as_str(),
            entry.new_mode.as_str(),
            entry.reason.as_str(),
            entry.turn_id.as_str()
        ),
        ("general", "ddr_authoring", "User wants a DDR.", "t1")
    );

    let reqs = h.fake.requests();
    assert!(
        reqs[1]["instructions"]
            .as_str()
            .unwrap()
            .starts_with("Current Mode: ddr_authoring\n"),
        "the next call names the new mode"
    );
    let names = |r: &Value| {
        r["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert!(
        names(&reqs[1]).contains(&"workspace_read_file".to_string()),
        "tools are not changed mid-turn"
    );

    // The next turn runs in the new mode with its tools.
    h.pipeline
        .run(&request(turn("s", "t2", "continue")))
        .await
        .unwrap();
    let reqs = h.fake.requests();
    assert!(
        reqs[2]["input"][0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("[MODE: ddr_authoring]\n\n[INSTRUCTION]\ncontinue")
    );
    assert!(!names(&reqs[2]).contains(&"workspace_read_file".to_string()));
}

#[tokio::test]
pub(super) async fn rejected_mode_changes_go_back_to_the_model() {
    let h = harness(Setup::default()).await;
    h.fake.push([
        Reply::Calls(vec![(
            "agent_change_mode".into(),
            json!({"mode": "ddr_authoring", "branch": false, "reason": ""}),
        )]),
        Reply::Calls(vec![(
            "agent_change_mode".into(),
            json!({"mode": "poetry", "branch": false, "reason": "r"}),
        )]),
        Reply::Text("Staying.".into()),
    ]);
    let r = h.pipeline.run(&request(turn("s", "t", "x"))).await.unwrap();
    assert_eq!(final_text(&r), "Staying.");
    let reqs = h.fake.requests();
    let first = &function_outputs(&reqs[1])[0].1;
    assert!(first.contains("ModeChangeTool requires a non-empty 'reason' string explaining why the mode change is needed."), "{first}");
    let second = &function_outputs(&reqs[2])[0].1;
    assert!(
        second.contains("Valid modes: general, ddr_authoring, workflow_authoring"),
        "{second}"
    );
    let session = h
        .store
        .get_session(&SessionId::parse("s").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(session.mode_key, "general");
    assert!(session.mode_history.is_empty());
}

#[tokio::test]
pub(super) async fn several_mode_changes_last_wins_with_a_warning() {
    let h = harness(Setup::default()).await;
    h.fake.push([
        Reply::Calls(vec![
            (
                "agent_change_mode".into(),
                json!({"mode": "ddr_authoring", "branch": false, "reason": "a"}),
            ),
            (
                "agent_change_mode".into(),
                json!({"mode": "workflow_authoring", "branch": true, "reason": "b"}),
            ),
        ]),
        Reply::Text("ok".into()),
    ]);
    let r = h.pipeline.run(&request(turn("s", "t", "x"))).await.unwrap();
    let Some(AgentExecuteResponse::Final(f)) = r.result() else {
        panic!()
    };
    assert_eq!(f.meta.mode_display_name, "Workflow Authoring");
    assert_eq!(f.user_warnings.len(), 1, "{:?}", f.user_warnings);
    let session = h
        .store
        .get_session(&SessionId::parse("s").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(session.mode_history.len(), 2);
    assert_eq!(session.mode_key, "workflow_authoring");
}

#[tokio::test]
pub(super) async fn client_tool_continuation_with_an_exact_match() {
    let h = harness(Setup::default()).await;
    h.fake.push([Reply::Calls(vec![
        ("workspace_read_file".into(), json!({"path": "a.md"})),
        ("workspace_read_file".into(), json!({"path": "b.md"})),
    ])]);
    let r = h
        .pipeline
        .run(&request(turn("s", "t", "read a and b")))
        .await
        .unwrap();
    let ids = client_call_ids(&r);
    assert_eq!(ids.len(), 2);
    assert_eq!(status(&h, "s", "t").await, TurnStatus::AwaitingClientTools);
    let session = h
        .store
        .get_session(&SessionId::parse("s").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        session.previous_response_id, None,
        "the session never points at a response with unanswered calls"
    );

    h.fake.push([Reply::Text("Both read.".into())]);
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let cont = json!({"sessionId": "s", "turnId": "t", "toolResults": results_json(&id_refs)});
    let r = h.pipeline.run(&request(cont)).await.unwrap();
    assert_eq!(final_text(&r), "Both read.");
    let reqs = h.fake.requests();
    let outputs: Vec<String> = function_outputs(&reqs[1])
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(outputs, ids);
    assert_eq!(status(&h, "s", "t").await, TurnStatus::Completed);
}

#[tokio::test]
pub(super) async fn each_kind_of_mismatch_fails_the_turn_but_not_the_session() {
    for (kind, make) in [
        (
            "count",
            Box::new(|ids: &[String]| results_json(&[ids[0].as_str()]))
                as Box<dyn Fn(&[String]) -> Value>,
        ),
        (
            "order",
            Box::new(|ids: &[String]| results_json(&[ids[1].as_str(), ids[0].as_str()])),
        ),
        (
            "id",
            Box::new(|ids: &[String]| results_json(&[ids[0].as_str(), "call_other"])),
        ),
    ] {
        let h = harness(Setup::default()).await;
        h.fake.push([Reply::Text("first".into())]);
        h.pipeline
            .run(&request(turn("s", "t0", "hello")))
            .await
            .unwrap();
        h.fake.push([Reply::Calls(vec![
            ("workspace_read_file".into(), json!({"path": "a"})),
            ("workspace_read_file".into(), json!({"path": "b"})),
        ])]);
        let ids = client_call_ids(
            &h.pipeline
                .run(&request(turn("s", "t1", "read")))
                .await
                .unwrap(),
        );
        let r = h
            .pipeline
            .run(&request(
                json!({"sessionId": "s", "turnId": "t1", "toolResults": make(&ids)}),
            ))
            .await
            .unwrap();
        let (code, message) = only_error(&r);
        assert_eq!(code, ErrorCode::ToolResultsMismatch, "{kind}: {message}");
        assert_eq!(status(&h, "s", "t1").await, TurnStatus::Failed, "{kind}");
        // The session survives: the next turn continues from the last good response, which the
        // fake (like the real API) accepts only because it has no unanswered calls.
        h.fake.push([Reply::Text("still here".into())]);
        let r = h
            .pipeline
            .run(&request(turn("s", "t2", "next")))
            .await
            .unwrap();
        assert_eq!(final_text(&r), "still here", "{kind}");
    }
}

#[tokio::test]
pub(super) async fn mixed_server_and_client_calls() {
    let h = harness(Setup::default()).await;
    h.fake.push([Reply::Calls(vec![
        ("agent_list_modes".into(), json!({"includeExamples": null})),
        ("workspace_read_file".into(), json!({"path": "a.md"})),
    ])]);
    let r = h.pipeline.run(&request(turn("s", "t", "x"))).await.unwrap();
    let ids = client_call_ids(&r);
    assert_eq!(ids.len(), 1, "only the client call is returned");
    h.fake.push([Reply::Text("done".into())]);
    let r = h.pipeline.run(&request(json!({"sessionId": "s", "turnId": "t", "toolResults": results_json(&[ids[0].as_str()])}))).await.unwrap();
    let Some(AgentExecuteResponse::Final(f)) = r.result() else {
        panic!("{:?}", r.errors())
    };
    assert_eq!(f.tool_results.len(), 1, "the server tool run is listed");
    let reqs = h.fake.requests();
    assert_eq!(
        function_outputs(&reqs[1]).len(),
        2,
        "server and client outputs go back together"
    );
}

#[tokio::test]
pub(super) async fn undeclared_tools_are_answered_as_errors_not_run() {
    let h = harness(Setup::default()).await;
    h.fake.push([
        Reply::Calls(vec![("drop_database".into(), json!({}))]),
        Reply::Text("sorry".into()),
    ]);
    let r = h.pipeline.run(&request(turn("s", "t", "x"))).await.unwrap();
    assert_eq!(final_text(&r), "sorry");
    let out = &function_outputs(&h.fake.requests()[1])[0].1;
    assert!(
        out.contains("Tool 'drop_database' is not available in this mode."),
        "{out}"
    );
}

#[tokio::test]
pub(super) async fn the_iteration_limit_ends_the_turn() {
    let mut settings = PipelineSettings::new("gpt-test");
    settings.max_iterations = 2;
    let h = harness(Setup {
        settings,
        ..Setup::default()
    })
    .await;
    for _ in 0..3 {
        h.fake.push([Reply::Calls(vec![(
            "agent_list_modes".into(),
            json!({"includeExamples": false}),
        )])]);
    }
    let r = h
        .pipeline
        .run(&request(turn("s", "t", "loop")))
        .await
        .unwrap();
    assert_eq!(only_error(&r).0, ErrorCode::IterationLimit);
    assert_eq!(h.fake.requests().len(), 2);
    assert_eq!(status(&h, "s", "t").await, TurnStatus::Failed);
}
