//! The whole pipeline driven against the fake Responses server over HTTP.

use std::time::{Duration, Instant};

use aptix_worker::contract::{AgentExecuteResponse, ErrorCode, InvokeResult, SessionId, TurnId};
use aptix_worker::fake_llm::{FakeOptions, Reply};
use aptix_worker::pipeline::PipelineSettings;
use aptix_worker::store::{TurnStatus, TurnStatusView};
use serde_json::{Value, json};

use crate::support::{Setup, harness, request};

/// The right to write turn state directly, as these tests of the store do.
const G: &aptix_worker::store::Grant = &aptix_worker::store::Grant::for_tests();

type Result = InvokeResult<AgentExecuteResponse>;

fn turn(session: &str, turn: &str, instruction: &str) -> Value {
    json!({"sessionId": session, "turnId": turn, "instruction": instruction})
}

fn final_text(r: &Result) -> &str {
    match r.result() {
        Some(AgentExecuteResponse::Final(f)) => &f.primary_output_text,
        other => panic!(
            "expected a final response, got {other:?} / {:?}",
            r.errors()
        ),
    }
}

fn only_error(r: &Result) -> (ErrorCode, String) {
    assert!(
        !r.is_successful(),
        "expected a failure, got {:?}",
        r.result()
    );
    let e = r.errors();
    assert_eq!(e.len(), 1, "{e:?}");
    (e[0].error_code, e[0].message.clone())
}

fn client_call_ids(r: &Result) -> Vec<String> {
    match r.result() {
        Some(AgentExecuteResponse::ClientToolContinuation(c)) => {
            c.tool_calls().map(|t| t.tool_call_id.to_string()).collect()
        }
        other => panic!("expected a continuation, got {other:?} / {:?}", r.errors()),
    }
}

fn results_json(ids: &[&str]) -> Value {
    Value::Array(ids.iter().map(|id| json!({"toolCallId": id, "executionMs": 5, "resultJson": "{\"contents\":\"# A\"}"})).collect())
}

fn function_outputs(body: &Value) -> Vec<(String, String)> {
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

async fn status(h: &crate::support::Harness, s: &str, t: &str) -> TurnStatus {
    h.store
        .get_turn(&SessionId::parse(s).unwrap(), &TurnId::parse(t).unwrap())
        .await
        .unwrap()
        .expect("turn stored")
        .status
}

#[tokio::test]
async fn plain_answer_then_a_follow_up_turn() {
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
async fn a_server_tool_loop_runs_on_the_server() {
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
async fn a_mode_change_mid_turn_is_persisted_and_seen() {
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
async fn rejected_mode_changes_go_back_to_the_model() {
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
async fn several_mode_changes_last_wins_with_a_warning() {
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
async fn client_tool_continuation_with_an_exact_match() {
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
async fn each_kind_of_mismatch_fails_the_turn_but_not_the_session() {
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
async fn mixed_server_and_client_calls() {
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
async fn undeclared_tools_are_answered_as_errors_not_run() {
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
async fn the_iteration_limit_ends_the_turn() {
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

#[tokio::test]
async fn a_429_with_retry_after_is_honoured_then_succeeds() {
    let h = harness(Setup::default()).await;
    h.fake.push([
        Reply::Error {
            status: 429,
            message: "Rate limit reached".into(),
            retry_after_ms: Some(400),
        },
        Reply::Text("ok".into()),
    ]);
    let started = Instant::now();
    let r = h.pipeline.run(&request(turn("s", "t", "x"))).await.unwrap();
    assert_eq!(final_text(&r), "ok");
    // The client's own backoff is 10 ms in tests, so only the header explains this wait.
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "retry-after-ms was not honoured"
    );
    assert_eq!(h.fake.requests().len(), 2);
}

#[tokio::test]
async fn repeated_5xx_is_a_retryable_failure_after_the_retries() {
    let h = harness(Setup::default()).await;
    for _ in 0..3 {
        h.fake.push([Reply::Error {
            status: 503,
            message: "overloaded".into(),
            retry_after_ms: None,
        }]);
    }
    let err = h
        .pipeline
        .run(&request(turn("s", "t", "x")))
        .await
        .unwrap_err();
    assert_eq!(err.error.error_code, ErrorCode::LlmUnavailable);
    assert!(
        err.error.message.contains("after 3 attempt(s)")
            && err.error.message.contains("overloaded"),
        "{}",
        err.error.message
    );
    assert_eq!(h.fake.requests().len(), 3, "one call plus two retries");
}

#[tokio::test]
async fn a_terminal_400_fails_the_turn_with_the_model_message() {
    let h = harness(Setup::default()).await;
    h.fake.push([Reply::Error {
        status: 400,
        message: "Invalid 'input': too long.".into(),
        retry_after_ms: None,
    }]);
    let r = h.pipeline.run(&request(turn("s", "t", "x"))).await.unwrap();
    let (code, message) = only_error(&r);
    assert_eq!(code, ErrorCode::LlmRejected);
    assert!(message.contains("Invalid 'input': too long."), "{message}");
    assert!(
        !message.contains('{'),
        "no raw vendor JSON reaches the client: {message}"
    );
    assert_eq!(h.fake.requests().len(), 1, "4xx is not retried");
}

#[tokio::test]
async fn a_timeout_is_retryable() {
    let h = harness(Setup {
        timeout: Duration::from_millis(300),
        max_retries: 1,
        ..Setup::default()
    })
    .await;
    for _ in 0..2 {
        h.fake.push([Reply::Delay(
            Duration::from_secs(3),
            Box::new(Reply::Text("late".into())),
        )]);
    }
    let err = h
        .pipeline
        .run(&request(turn("s", "t", "x")))
        .await
        .unwrap_err();
    assert_eq!(err.error.error_code, ErrorCode::LlmUnavailable);
    assert!(
        err.error.message.contains("timed out"),
        "{}",
        err.error.message
    );
}

#[tokio::test]
async fn malformed_and_empty_model_output_fail_the_turn() {
    for reply in [
        Reply::Malformed,
        Reply::Empty,
        Reply::Failed("invalid_prompt".into()),
    ] {
        let h = harness(Setup::default()).await;
        h.fake.push([reply.clone()]);
        let r = h.pipeline.run(&request(turn("s", "t", "x"))).await.unwrap();
        assert_eq!(only_error(&r).0, ErrorCode::LlmBadResponse, "{reply:?}");
    }
}

#[tokio::test]
async fn refusals_incomplete_answers_and_unknown_items_are_reported() {
    let h = harness(Setup::default()).await;
    h.fake.push([
        Reply::Refusal("I can't help with that.".into()),
        Reply::Incomplete("Half an ans".into()),
        Reply::UnknownItemThenText("text".into()),
    ]);
    let r = h
        .pipeline
        .run(&request(turn("s", "t1", "x")))
        .await
        .unwrap();
    assert_eq!(final_text(&r), "I can't help with that.");
    let Some(AgentExecuteResponse::Final(f)) = r.result() else {
        unreachable!()
    };
    assert_eq!(
        f.user_warnings,
        vec!["The model declined part of this request.".to_string()]
    );
    let r = h
        .pipeline
        .run(&request(turn("s", "t2", "x")))
        .await
        .unwrap();
    let Some(AgentExecuteResponse::Final(f)) = r.result() else {
        unreachable!()
    };
    assert!(
        f.user_warnings[0].contains("max_output_tokens"),
        "{:?}",
        f.user_warnings
    );
    let r = h
        .pipeline
        .run(&request(turn("s", "t3", "x")))
        .await
        .unwrap();
    assert_eq!(final_text(&r), "text");
    assert_eq!(r.warnings()[0].error_code, ErrorCode::UnknownOutputItem);
}

#[tokio::test]
async fn replay_mode_resends_the_conversation() {
    let mut settings = PipelineSettings::new("gpt-test");
    settings.replay = true;
    let h = harness(Setup {
        settings,
        options: FakeOptions {
            stateless: true,
            ..Default::default()
        },
        ..Setup::default()
    })
    .await;
    h.fake
        .push([Reply::Text("one".into()), Reply::Text("two".into())]);
    h.pipeline
        .run(&request(turn("s", "t1", "first")))
        .await
        .unwrap();
    let r = h
        .pipeline
        .run(&request(turn("s", "t2", "second")))
        .await
        .unwrap();
    assert_eq!(final_text(&r), "two");
    let reqs = h.fake.requests();
    assert!(reqs[1].get("previous_response_id").is_none());
    let roles: Vec<&str> = reqs[1]["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["role"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(reqs[1]["input"][2]["content"], "one");
}

#[tokio::test]
async fn previous_response_not_found_falls_back_to_replay() {
    let h = harness(Setup {
        options: FakeOptions {
            stateless: true,
            ..Default::default()
        },
        ..Setup::default()
    })
    .await;
    h.fake
        .push([Reply::Text("one".into()), Reply::Text("two".into())]);
    h.pipeline
        .run(&request(turn("s", "t1", "first")))
        .await
        .unwrap();
    let r = h
        .pipeline
        .run(&request(turn("s", "t2", "second")))
        .await
        .unwrap();
    assert_eq!(final_text(&r), "two");
    let reqs = h.fake.requests();
    assert_eq!(reqs.len(), 3);
    assert!(
        reqs[1]["previous_response_id"].is_string(),
        "first try continues by id"
    );
    assert!(
        reqs[2].get("previous_response_id").is_none(),
        "the fallback replays"
    );
    assert_eq!(reqs[2]["input"].as_array().unwrap().len(), 4);
    let session = h
        .store
        .get_session(&SessionId::parse("s").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(session.replay, "later turns replay straight away");
}

/// A fake left running keeps a bounded number of responses: past its limit the oldest is
/// forgotten and answers `previous_response_not_found`, the newest still continue.
#[tokio::test]
async fn the_fake_forgets_its_oldest_responses_past_its_limit() {
    let h = harness(Setup {
        options: FakeOptions {
            keep_responses: Some(2),
            ..Default::default()
        },
        ..Setup::default()
    })
    .await;
    let client = crate::support::http_client();
    let url = format!("{}/responses", h.fake.base_url());
    let call = |previous: Option<&str>| {
        let mut body = json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "[MODE: general]\n\n[INSTRUCTION]\nhi"}]}]});
        if let Some(p) = previous {
            body["previous_response_id"] = json!(p);
        }
        let (client, url) = (client.clone(), url.clone());
        async move {
            let r = client.post(url).json(&body).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (status, body) = call(None).await;
        assert_eq!(status, 200, "{body}");
        ids.push(body["id"].as_str().unwrap().to_string());
    }
    let (status, body) = call(Some(&ids[0])).await;
    assert_eq!(status, 400, "the oldest is forgotten: {body}");
    assert_eq!(body["error"]["code"], "previous_response_not_found");
    for kept in &ids[1..] {
        let (status, body) = call(Some(kept)).await;
        assert_eq!(status, 200, "{kept} is kept: {body}");
    }
}

/// The fake answers like the real API: each kind of non-streamed answer is a valid `Response`
/// by the official OpenAPI document, and echoes the request's settings (instructions, model,
/// tools, tool choice, the previous response) as the API does.
#[tokio::test]
async fn the_fakes_answers_are_valid_responses_that_echo_the_request() {
    let h = harness(Setup::default()).await;
    // With the live API's one drift from its document allowed, a real answer is valid, and so
    // must the fake's be.
    let valid = crate::support::official_answer_check("Response");
    let live: Value = serde_json::from_str(include_str!(
        "../fixtures/openai/examples/01_text_response_openai_python_live_snapshot.json"
    ))
    .unwrap();
    assert!(valid(&live).is_ok(), "{:?}", valid(&live));
    let client = crate::support::http_client();
    let url = format!("{}/responses", h.fake.base_url());
    let tool = json!({"type": "function", "name": "lookup", "description": "Looks up a word.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"], "additionalProperties": false},
        "strict": true});
    let mut previous: Option<String> = None;
    for reply in [
        Reply::Text("plain".into()),
        Reply::Calls(vec![("lookup".into(), json!({"q": "x"}))]),
        Reply::Refusal("no".into()),
        Reply::Incomplete("cut".into()),
        Reply::Empty,
        Reply::Failed("server_error".into()),
    ] {
        let kind = format!("{reply:?}");
        h.fake.push([reply]);
        let mut body = json!({"model": "m-1", "instructions": "Be brief.", "tools": [tool],
            "tool_choice": "auto", "max_output_tokens": 300,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]});
        if let Some(p) = &previous {
            body["previous_response_id"] = json!(p);
        }
        let r = client.post(&url).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{kind}");
        let answer: Value = r.json().await.unwrap();
        if let Err((error, path)) = valid(&answer) {
            panic!("{kind}: not a valid Response: {error} at {path}\n{answer:#}");
        }
        assert_eq!(answer["object"], "response", "{kind}");
        if answer["status"] == "failed" {
            continue;
        }
        for field in [
            "instructions",
            "model",
            "tools",
            "tool_choice",
            "max_output_tokens",
        ] {
            assert_eq!(answer[field], body[field], "{kind}: {field} is echoed");
        }
        assert_eq!(
            answer["previous_response_id"],
            previous.as_deref().map_or(Value::Null, |p| json!(p)),
            "{kind}"
        );
        // Function calls leave the response waiting for their outputs: the next request
        // would have to answer them, so continue from a response without calls.
        if answer["output"][0]["type"] != "function_call" {
            previous = answer["id"].as_str().map(str::to_string);
        }
    }
}

/// Streamed, the fake writes events the document describes: every `data:` line of its stream
/// is a valid `ResponseStreamEvent`, for text and function call answers alike, and the stream
/// ends with `response.completed` carrying the whole response. Two things the live API writes
/// and the document does not allow are allowed here, as the recorded stream in the fixtures
/// has them: `"user": null` and, before the response completes, `"usage": null`.
#[tokio::test]
async fn the_fakes_streamed_events_are_valid_stream_events() {
    let h = harness(Setup::default()).await;
    let valid = crate::support::official_answer_check("ResponseStreamEvent");
    let client = crate::support::http_client();
    let url = format!("{}/responses", h.fake.base_url());
    for reply in [
        Reply::Text("a streamed answer in a few pieces".into()),
        Reply::Calls(vec![("lookup".into(), json!({"q": "x"}))]),
    ] {
        let kind = format!("{reply:?}");
        h.fake.push([reply]);
        let body = json!({"model": "m-1", "stream": true, "tools": [{"type": "function", "name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"], "additionalProperties": false},
            "strict": true}],
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]});
        let r = client.post(&url).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{kind}");
        let text = r.text().await.unwrap();
        let events: Vec<Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).expect("each data line is JSON"))
            .collect();
        assert!(events.len() > 3, "{kind}: {text}");
        for event in &events {
            if let Err((error, path)) = valid(event) {
                panic!("{kind}: not a valid stream event: {error} at {path}\n{event:#}");
            }
        }
        let last = events.last().expect("events");
        assert_eq!(last["type"], "response.completed", "{kind}");
        assert_eq!(last["response"]["status"], "completed", "{kind}");
        assert_eq!(last["response"]["model"], "m-1", "{kind}");
    }
}

/// A fake told to forget its requests (as `aptix fake-llm` is) keeps nothing per request.
#[tokio::test]
async fn a_forgetful_fake_keeps_nothing_per_request() {
    let h = harness(Setup {
        options: FakeOptions {
            forget_requests: true,
            ..Default::default()
        },
        ..Setup::default()
    })
    .await;
    h.fake.push([Reply::Text("one".into())]);
    let r = h
        .pipeline
        .run(&request(turn("s", "t1", "first")))
        .await
        .unwrap();
    assert_eq!(final_text(&r), "one");
    assert!(h.fake.requests().is_empty());
    assert!(h.fake.traceparents().is_empty());
    assert!(h.fake.arrivals().is_empty());
    assert_eq!(h.fake.peak_in_flight(), 1, "the request was answered");
}

#[tokio::test]
async fn a_replayed_turn_is_idempotent_and_conflicts_are_errors() {
    let h = harness(Setup::default()).await;
    h.fake.push([Reply::Text("once".into())]);
    let first = h.pipeline.run(&request(turn("s", "t", "x"))).await.unwrap();
    let again = h.pipeline.run(&request(turn("s", "t", "x"))).await.unwrap();
    assert_eq!(first, again, "the stored result is returned");
    assert_eq!(h.fake.requests().len(), 1, "the model is not called twice");
    let conflict = h
        .pipeline
        .run(&request(turn("s", "t", "something else")))
        .await
        .unwrap();
    assert_eq!(only_error(&conflict).0, ErrorCode::TurnConflict);
}

#[tokio::test]
async fn continuations_for_the_wrong_turn_are_errors() {
    let h = harness(Setup::default()).await;
    let r = h
        .pipeline
        .run(&request(
            json!({"sessionId": "s", "turnId": "nope", "toolResults": results_json(&["c"])}),
        ))
        .await
        .unwrap();
    assert_eq!(only_error(&r).0, ErrorCode::TurnNotFound);
    h.fake.push([Reply::Text("done".into())]);
    h.pipeline.run(&request(turn("s", "t", "x"))).await.unwrap();
    let r = h
        .pipeline
        .run(&request(
            json!({"sessionId": "s", "turnId": "t", "toolResults": results_json(&["c"])}),
        ))
        .await
        .unwrap();
    let (code, message) = only_error(&r);
    assert_eq!(code, ErrorCode::TurnNotAwaitingTools);
    assert!(message.contains("is completed"), "{message}");
}

#[tokio::test]
async fn unknown_contexts_are_validation_errors() {
    let h = harness(Setup::default()).await;
    let r = h.pipeline.run(&request(json!({"sessionId": "s", "turnId": "t", "instruction": "x", "conversationContextId": "nope"}))).await.unwrap();
    let (code, message) = only_error(&r);
    assert_eq!(code, ErrorCode::UnknownContext);
    assert!(message.starts_with("conversationContextId: "));
    let r = h
        .pipeline
        .run(&request(
            json!({"sessionId": "s", "turnId": "t2", "instruction": "x", "agentContextId": "nope"}),
        ))
        .await
        .unwrap();
    assert_eq!(only_error(&r).0, ErrorCode::UnknownContext);
    assert!(h.fake.requests().is_empty());
    // The failure is committed before anyone is told of it: pollers see the turn settle.
    for tid in ["t", "t2"] {
        let stored = h
            .store
            .get_turn(
                &SessionId::parse("s").unwrap(),
                &TurnId::parse(tid).unwrap(),
            )
            .await
            .unwrap()
            .expect("the failed turn is stored");
        assert_eq!(stored.status, TurnStatus::Failed, "{tid}");
        assert_eq!(
            stored.result.as_ref().map(|r| r.errors()[0].error_code),
            Some(ErrorCode::UnknownContext)
        );
    }
}

#[tokio::test]
async fn the_fake_serves_many_concurrent_requests() {
    let h = harness(Setup::default()).await;
    let client = crate::support::http_client();
    let url = format!("{}/responses", h.fake.base_url());
    let body = json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "[MODE: general]\n\n[INSTRUCTION]\nhi"}]}]});
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..1000 {
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        tasks.spawn(async move {
            client
                .post(url)
                .json(&body)
                .send()
                .await
                .map(|r| r.status().as_u16())
        });
    }
    let mut ok = 0;
    while let Some(r) = tasks.join_next().await {
        if r.expect("task").expect("request") == 200 {
            ok += 1;
        }
    }
    assert_eq!(ok, 1000);
}

/// What the worker is told to do with a job is a type, not an error code to interpret: a
/// result to publish, a job that is not its turn's, a busy session, or a failure to retry.
#[tokio::test]
async fn a_job_outcome_tells_the_worker_what_to_do() {
    use aptix_worker::pipeline::JobOutcome;
    let h = harness(Setup::default()).await;
    let deadline = Duration::from_secs(30);
    h.fake.push([Reply::Text("done".into())]);
    let done = h
        .pipeline
        .execute(&request(turn("s", "t", "x")), deadline)
        .await;
    let JobOutcome::Done(settled) = done else {
        panic!("{done:?}")
    };
    assert!(settled.result.is_successful(), "{settled:?}");
    // The run that stored the result hands over the status exactly as stored, so the worker
    // publishes it without reading the turn back.
    let stored = h
        .store
        .get_turn(
            &SessionId::parse("s").unwrap(),
            &TurnId::parse("t").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        serde_json::to_value(settled.status.as_ref().expect("stored by this run")).unwrap(),
        serde_json::to_value(TurnStatusView::from(&stored)).unwrap()
    );
    // The same job again finds the result stored: it has no status of its own to hand over
    // (the worker reads the turn's current one before publishing).
    let again = h
        .pipeline
        .execute(&request(turn("s", "t", "x")), deadline)
        .await;
    let JobOutcome::Done(again) = again else {
        panic!("{again:?}")
    };
    assert_eq!(again.result, settled.result);
    assert!(again.status.is_none());
    // The same ids with another payload: not this turn's job, nothing to publish.
    let conflict = h
        .pipeline
        .execute(&request(turn("s", "t", "another payload")), deadline)
        .await;
    let JobOutcome::NotTheTurns(reasons) = conflict else {
        panic!("{conflict:?}")
    };
    assert_eq!(reasons[0].error_code, ErrorCode::TurnConflict);
    let unknown = h
        .pipeline
        .execute(
            &request(
                json!({"sessionId": "s", "turnId": "nope", "toolResults": results_json(&["c"])}),
            ),
            deadline,
        )
        .await;
    assert!(matches!(unknown, JobOutcome::NotTheTurns(_)), "{unknown:?}");
    // Another holder has the session's lease: busy, to be run again at the same attempt.
    let sid = SessionId::parse("s").unwrap();
    let lease = h
        .store
        .acquire_lease(G, &sid, "someone else", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the session is free");
    let busy = h
        .pipeline
        .execute(&request(turn("s", "t2", "y")), deadline)
        .await;
    assert!(matches!(busy, JobOutcome::Busy), "{busy:?}");
    h.store.release_lease(G, &sid, &lease).await.unwrap();
    // A model that does not answer within the deadline: a failure to retry.
    h.fake.push([Reply::Delay(
        Duration::from_secs(5),
        Box::new(Reply::Text("late".into())),
    )]);
    let late = h
        .pipeline
        .execute(&request(turn("s", "t3", "z")), Duration::from_millis(200))
        .await;
    let JobOutcome::Retry(error) = late else {
        panic!("{late:?}")
    };
    assert_eq!(error.error_code, ErrorCode::LlmUnavailable);
    assert!(error.message.contains("deadline"), "{}", error.message);
}
