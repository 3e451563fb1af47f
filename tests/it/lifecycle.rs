//! Every accepted turn settles visibly, seen from outside over HTTP, on both backends: a
//! continuation leaves `awaiting_client_tools` the moment it is accepted, exactly one of two
//! different continuations wins, unknown contexts never get in, and a job the worker refuses
//! before running still settles its turn in the store.

use super::lifecycle_http::by_default_only_turns_submitted_to_be_read_later_keep_a_reply_queue;
use std::time::Duration;

use aptix_worker::contract::{TurnId, parse_request};
use aptix_worker::fake_llm::Reply;
use aptix_worker::pipeline::fingerprint;
use aptix_worker::store::{TurnRecord, TurnStatus};
use serde_json::{Value, json};

use crate::app::{App, AppOptions, Backend, code, spawn};

/// The right to write turn state directly, as these tests of the store do.
pub(super) const G: &aptix_worker::store::Grant = &aptix_worker::store::Grant::for_tests();

pub(super) async fn app_on(backend: Backend) -> App {
    spawn(AppOptions {
        backend,
        ..AppOptions::default()
    })
    .await
}

/// Runs a user turn whose model answer asks the client to read a file; returns the call id.
pub(super) async fn awaiting_tools(app: &App, sid: &str, tid: &str) -> String {
    app.fake.push([Reply::Calls(vec![(
        "workspace_read_file".into(),
        json!({"path": "README.md"}),
    )])]);
    let (status, body) = app
        .post(
            Some("tok-a"),
            json!({"sessionId": sid, "turnId": tid, "instruction": "read it"}).to_string(),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let (_, body) = app
        .get(
            Some("tok-a"),
            &format!("/v1/sessions/{sid}/turns/{tid}?wait=10"),
        )
        .await;
    assert_eq!(body["result"]["status"], "awaiting_client_tools", "{body}");
    body["result"]["result"]["result"]["toolCalls"][0]["toolCallId"]
        .as_str()
        .expect("a tool call id")
        .to_string()
}

pub(super) fn continuation(sid: &str, tid: &str, call: &str, contents: &str) -> String {
    json!({"sessionId": sid, "turnId": tid, "toolResults": [{
        "toolCallId": call, "executionMs": 3,
        "resultJson": json!({"contents": contents}).to_string()
    }]})
    .to_string()
}

pub(super) async fn a_continuation_reads_queued_as_soon_as_it_is_accepted(backend: Backend) {
    let app = app_on(backend).await;
    let call = awaiting_tools(&app, "s", "t").await;
    // The model takes a while on the continuation, so a stale status could not hide.
    app.fake.push([Reply::Delay(
        Duration::from_millis(800),
        Box::new(Reply::Text("read".into())),
    )]);
    let (status, body) = app
        .post(Some("tok-a"), continuation("s", "t", &call, "# hello"))
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        body["result"]["status"], "queued",
        "the 202 shows the new status"
    );
    // Read right after the 202: never the old `awaiting_client_tools`.
    let (_, now) = app.get(Some("tok-a"), "/v1/sessions/s/turns/t").await;
    let read = now["result"]["status"].as_str().unwrap_or_default();
    assert!(matches!(read, "queued" | "running"), "{now}");
    // A long-poll therefore waits for the continuation's own result.
    let (_, done) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t?wait=10")
        .await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["result"]["result"]["primaryOutputText"],
        "read"
    );
}

pub(super) async fn of_two_different_continuations_exactly_one_is_accepted(backend: Backend) {
    let app = app_on(backend).await;
    let call = awaiting_tools(&app, "s", "t").await;
    app.fake.push([Reply::Delay(
        Duration::from_millis(300),
        Box::new(Reply::Text("once".into())),
    )]);
    let bodies: Vec<String> = (0..4)
        .map(|i| continuation("s", "t", &call, &format!("version {i}")))
        .collect();
    let answers =
        futures_util::future::join_all(bodies.iter().map(|b| app.post(Some("tok-a"), b.clone())))
            .await;
    let accepted: Vec<usize> = answers
        .iter()
        .enumerate()
        .filter(|(_, (status, _))| *status == 202)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(accepted.len(), 1, "{answers:?}");
    for (status, body) in answers.iter().filter(|(s, _)| *s != 202) {
        assert_eq!(
            (*status, code(body)),
            (409, "TURN_NOT_AWAITING_TOOLS"),
            "{body}"
        );
    }
    // The winner sent again is still accepted (idempotent), a loser still refused.
    let winner = &bodies[accepted[0]];
    let (status, body) = app.post(Some("tok-a"), winner.clone()).await;
    assert_eq!(status, 202, "{body}");
    let loser = &bodies[(accepted[0] + 1) % bodies.len()];
    let (status, _) = app.post(Some("tok-a"), loser.clone()).await;
    assert_eq!(status, 409);
    let (_, done) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t?wait=10")
        .await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    // The model saw the winner's output, and was asked once per step.
    let requests = app.fake.requests();
    assert_eq!(
        requests.len(),
        2,
        "one call for the turn, one for the continuation"
    );
    let sent = requests[1].to_string();
    assert!(
        sent.contains(&format!("version {}", accepted[0])),
        "the accepted results reach the model: {sent}"
    );
    // After it ran, the winner sent again gets the settled status from the store; nothing is
    // enqueued again, so nothing runs again.
    let accepted = app.accepted_turns().await;
    let (status, again) = app.post(Some("tok-a"), winner.clone()).await;
    assert_eq!(
        (status, again["result"]["status"].as_str()),
        (202, Some("completed"))
    );
    assert_eq!(app.accepted_turns().await, accepted, "nothing was enqueued");
    assert_eq!(app.fake.requests().len(), 2);
}

pub(super) async fn unknown_contexts_are_refused_at_the_front_door(backend: Backend) {
    let app = app_on(backend).await;
    for (field, id) in [
        ("agentContextId", "nope"),
        ("conversationContextId", "gone"),
    ] {
        let tid = format!("t-{field}");
        let (status, body) = app
            .post(
                Some("tok-a"),
                json!({"sessionId": "s", "turnId": tid, "instruction": "x", field: id}).to_string(),
            )
            .await;
        assert_eq!((status, code(&body)), (400, "UNKNOWN_CONTEXT"), "{body}");
        let message = body["errors"][0]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(&format!("{field}: ")), "{message}");
        assert!(
            message.contains("default"),
            "names what is configured: {message}"
        );
    }
    // Nothing was recorded or enqueued.
    let sid = crate::support::sid_a("s");
    assert!(app.store.list_turns(&sid).await.unwrap().is_empty());
    // A batch line is rejected, the synchronous endpoint fails the request.
    let lines = [
        json!({"customId": "bad", "request": {"instruction": "x", "agentContextId": "nope"}}),
        json!({"customId": "good", "request": {"instruction": "y"}}),
    ]
    .map(|l| l.to_string())
    .join("\n");
    app.fake.push([Reply::Text("fine".into())]);
    let (status, body) = app.post_to(Some("tok-a"), "/v1/batches", lines).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["result"]["accepted"], 1, "{body}");
    let rejected = &body["result"]["errors"][0];
    assert_eq!(rejected["customId"], "bad");
    assert_eq!(rejected["errors"][0]["errorCode"], "UNKNOWN_CONTEXT");
    assert!(
        rejected["errors"][0]["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("request.agentContextId: "),
        "{rejected}"
    );
    let resp = app
        .http
        .post(format!("{}/api/ai/agent/execute", app.base))
        .bearer_auth("tok-a")
        .body(
            json!({"sessionId": "s2", "turnId": "t", "instruction": "x", "conversationContextId": "nope"})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        (body["successful"].as_bool(), code(&body)),
        (Some(false), "UNKNOWN_CONTEXT")
    );
    let sid2 = crate::support::sid_a("s2");
    assert!(app.store.list_turns(&sid2).await.unwrap().is_empty());
}

pub(super) async fn a_job_the_worker_refuses_before_running_still_settles(backend: Backend) {
    let app = app_on(backend).await;
    // A front door configured with more contexts than this worker accepted the turn.
    let body =
        json!({"sessionId": "s", "turnId": "t", "instruction": "x", "agentContextId": "elsewhere"})
            .to_string();
    let parsed = parse_request(body.as_bytes(), &Default::default()).unwrap();
    let aptix_worker::contract::AgentExecuteRequest::UserTurn(turn) = &parsed.request else {
        panic!("a user turn");
    };
    let (sid, tid) = (crate::support::sid_a("s"), TurnId::parse("t").unwrap());
    app.store
        .create_turn(
            G,
            &TurnRecord::queued(sid.clone(), tid.clone(), fingerprint(turn), String::new()),
        )
        .await
        .unwrap();
    app.broker
        .enqueue(
            None,
            &serde_json::to_vec(&parsed.request).unwrap(),
            &aptix_worker::queue::JobMeta::new(None, Some("tenant-a")),
        )
        .await
        .unwrap();
    let (_, body) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t?wait=10")
        .await;
    assert_eq!(body["result"]["status"], "failed", "{body}");
    assert_eq!(
        body["result"]["result"]["errors"][0]["errorCode"],
        "UNKNOWN_CONTEXT"
    );
    assert_eq!(body["result"]["attempts"], 1);
    let stored = app.store.get_turn(&sid, &tid).await.unwrap().unwrap();
    assert_eq!(stored.status, TurnStatus::Failed);
    assert!(app.fake.requests().is_empty(), "the model was never called");
}

pub(super) async fn a_long_poll_answers_as_soon_as_the_result_is_published(backend: Backend) {
    let app = app_on(backend).await;
    // Long enough that a store read once a second would answer hundreds of ms late.
    app.fake.push([Reply::Delay(
        Duration::from_millis(2600),
        Box::new(Reply::Text("late".into())),
    )]);
    let (status, _) = app
        .post(
            Some("tok-a"),
            json!({"sessionId": "s", "turnId": "t", "instruction": "x"}).to_string(),
        )
        .await;
    assert_eq!(status, 202);
    let (_, body) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t?wait=20")
        .await;
    let answered = time::OffsetDateTime::now_utc();
    assert_eq!(body["result"]["status"], "completed", "{body}");
    let completed = time::OffsetDateTime::parse(
        body["result"]["completedAt"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let lag = answered - completed;
    assert!(
        lag < time::Duration::milliseconds(250),
        "the long-poll answered {lag} after the turn completed"
    );
}

pub(super) async fn every_error_is_an_invoke_result_naming_the_parameter(backend: Backend) {
    let app = app_on(backend).await;
    app.fake.push([Reply::Text("ok".into())]);
    app.post(
        Some("tok-a"),
        json!({"sessionId": "s", "turnId": "t", "instruction": "x"}).to_string(),
    )
    .await;
    for (query, named) in [
        ("wait=abc", "wait: "),
        ("wait=-1", "wait: "),
        ("wait=NaN", "wait: "),
        ("wait=1&wait=2", "wait: "),
    ] {
        // `get` also checks the answer against the 400 that /openapi.json documents.
        let (status, body) = app
            .get(Some("tok-a"), &format!("/v1/sessions/s/turns/t?{query}"))
            .await;
        assert_eq!(
            (status, code(&body)),
            (400, "INVALID_PARAMETER"),
            "{query}: {body}"
        );
        let message = body["errors"][0]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(named), "{query}: {message}");
    }
    let (status, body) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t?wait=0.1&other=1")
        .await;
    assert_eq!(status, 200, "unknown parameters are ignored: {body}");
    // A path that is not UTF-8 once decoded, a path no route has, a method a route lacks:
    // JSON `InvokeResult`s too, never the framework's plain text or an empty body.
    for (method, path, status, expected) in [
        ("GET", "/v1/sessions/%FF%FE", 400, "INVALID_PARAMETER"),
        ("GET", "/v1/nothing-here", 404, "ROUTE_NOT_FOUND"),
        ("DELETE", "/v1/turns", 405, "METHOD_NOT_ALLOWED"),
    ] {
        let resp = app
            .http
            .request(method.parse().unwrap(), format!("{}{path}", app.base))
            .bearer_auth("tok-a")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), status, "{method} {path}");
        assert_eq!(resp.headers()["content-type"], "application/json");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(code(&body), expected, "{method} {path}: {body}");
        app.matches_schema(
            &json!("#/components/schemas/Failure"),
            &format!("{method} {path}"),
            &body,
        );
    }
}

pub(super) async fn every_answer_carries_a_request_id(backend: Backend) {
    let app = app_on(backend).await;
    for (method, path) in [
        ("GET", "/healthz"),
        ("GET", "/v1/nowhere"),
        ("POST", "/v1/turns"),
    ] {
        let resp = app
            .http
            .request(method.parse().unwrap(), format!("{}{path}", app.base))
            .bearer_auth("tok-a")
            .send()
            .await
            .unwrap();
        let id = resp.headers()["x-request-id"].to_str().unwrap();
        assert!(uuid::Uuid::parse_str(id).is_ok(), "{method} {path}: {id}");
        let resp = app
            .http
            .request(method.parse().unwrap(), format!("{}{path}", app.base))
            .bearer_auth("tok-a")
            .header("x-request-id", "client-chosen-7")
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.headers()["x-request-id"],
            "client-chosen-7",
            "{method} {path}"
        );
    }
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [
        by_default_only_turns_submitted_to_be_read_later_keep_a_reply_queue,
        a_continuation_reads_queued_as_soon_as_it_is_accepted,
        of_two_different_continuations_exactly_one_is_accepted,
        unknown_contexts_are_refused_at_the_front_door,
        a_job_the_worker_refuses_before_running_still_settles,
        a_long_poll_answers_as_soon_as_the_result_is_published,
        every_error_is_an_invoke_result_naming_the_parameter,
        every_answer_carries_a_request_id,
    ],
);
