//! Replay and the fake model's faithfulness: the conversation resent, the fallback when a response
//! is not found, the fake's memory, answers and streamed events, idempotent replays.

use super::pipeline_scenarios::*;
use crate::conversation::{pairs, said};
use crate::support::{Setup, StoreKind, harness, request};
use aptix_worker::contract::{ErrorCode, SessionId, TurnId};
use aptix_worker::fake_llm::{FakeOptions, Reply};
use aptix_worker::pipeline::{PipelineSettings, SettledAs};
use aptix_worker::store::{TurnStatus, TurnStatusView};
use serde_json::{Value, json};
use std::time::Duration;

/// A replaying context sends the whole conversation on every call, in order and once each, on
/// either store (through the whole product: `conversation.rs`).
async fn replay_mode_resends_the_conversation(store: StoreKind) {
    let mut settings = PipelineSettings::new("gpt-test");
    settings.replay = true;
    let h = harness(Setup {
        settings,
        options: FakeOptions {
            stateless: true,
            ..Default::default()
        },
        store,
        ..Setup::default()
    })
    .await;
    h.fake.push([
        Reply::Text("one".into()),
        Reply::Text("two".into()),
        Reply::Text("three".into()),
    ]);
    for (t, asked) in [("t1", "first"), ("t2", "second")] {
        h.pipeline.run(&request(turn("s", t, asked))).await.unwrap();
    }
    let r = h
        .pipeline
        .run(&request(turn("s", "t3", "third")))
        .await
        .unwrap();
    assert_eq!(final_text(&r), "three");
    let reqs = h.fake.requests();
    assert!(reqs.iter().all(|r| r.get("previous_response_id").is_none()));
    assert_eq!(
        said(&reqs[1]),
        pairs(&[("user", "first"), ("assistant", "one"), ("user", "second")])
    );
    assert_eq!(
        said(&reqs[2]),
        pairs(&[
            ("user", "first"),
            ("assistant", "one"),
            ("user", "second"),
            ("assistant", "two"),
            ("user", "third")
        ])
    );
}

#[tokio::test]
async fn replay_mode_resends_the_conversation_from_memory() {
    replay_mode_resends_the_conversation(StoreKind::Memory).await;
}

#[tokio::test]
async fn replay_mode_resends_the_conversation_from_redis() {
    replay_mode_resends_the_conversation(StoreKind::Redis).await;
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

/// Turn `turn` of session `session` as the harness's store holds it.
async fn stored_turn(
    h: &crate::support::Harness,
    session: &str,
    turn: &str,
) -> aptix_worker::store::TurnRecord {
    (h.store)
        .get_turn(
            &SessionId::parse(session).unwrap(),
            &TurnId::parse(turn).unwrap(),
        )
        .await
        .unwrap()
        .expect("the turn is stored")
}

/// A worker reads a user turn's fingerprint from the job's bytes when they are the front
/// door's serialisation of the turn (no second serialisation), and from the turn itself when
/// they are not: a job published with other spacing or field order is still its turn's, and
/// another payload under the same ids is still refused, whichever way it came.
#[tokio::test]
async fn a_jobs_bytes_name_its_turn_however_they_were_written() {
    use aptix_worker::pipeline::{JobOutcome, Origin};
    let h = harness(Setup::default()).await;
    let deadline = Duration::from_secs(30);
    let run = |job: Vec<u8>| {
        let pipeline = &h.pipeline;
        async move {
            let parsed = request(serde_json::from_slice(&job).unwrap());
            let origin = Origin {
                job: Some(&job),
                ..Origin::default()
            };
            pipeline.execute_as(origin, &parsed, deadline).await
        }
    };
    h.fake.push([Reply::Text("once".into())]);
    let asked = request(turn("s", "t", "x"));
    let front_doors = serde_json::to_vec(&asked).unwrap();
    let JobOutcome::Done(first) = run(front_doors.clone()).await else {
        panic!("the first run settles")
    };
    assert!(first.stored_here(), "the first run stored the turn");
    // The record's fingerprint is the one a front door computes from its job.
    let stored = stored_turn(&h, "s", "t").await;
    assert_eq!(
        stored.fingerprint,
        aptix_worker::pipeline::job_fingerprint(&front_doors)
    );
    for same in [
        front_doors,
        serde_json::to_vec_pretty(&turn("s", "t", "x")).unwrap(),
        br#"{ "instruction" : "x", "turnId": "t", "sessionId": "s" }"#.to_vec(),
    ] {
        let JobOutcome::Done(again) = run(same.clone()).await else {
            panic!("{} is the same turn", String::from_utf8_lossy(&same))
        };
        assert_eq!(again.result(), first.result(), "the stored result");
    }
    for other in [
        serde_json::to_vec(&request(turn("s", "t", "y"))).unwrap(),
        br#"{ "instruction" : "y", "turnId": "t", "sessionId": "s" }"#.to_vec(),
    ] {
        let conflict = run(other).await;
        let JobOutcome::NotTheTurns(reasons) = conflict else {
            panic!("{conflict:?}")
        };
        assert_eq!(reasons[0].error_code, ErrorCode::TurnConflict);
    }
    assert_eq!(h.fake.requests().len(), 1, "the model was called once");
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
    assert!(settled.result().is_successful(), "{settled:?}");
    // The run that stored the result hands over the status exactly as stored, so the worker
    // publishes it without reading the turn back.
    let stored = stored_turn(&h, "s", "t").await;
    let result = settled.result().clone();
    let SettledAs::Stored(status) = settled.into_status() else {
        panic!("stored by this run")
    };
    assert_eq!(
        serde_json::to_value(&status).unwrap(),
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
    assert_eq!(again.result(), &result);
    assert!(!again.stored_here());
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
