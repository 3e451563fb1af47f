//! Every accepted turn settles visibly, seen from outside over HTTP, on both backends: a
//! continuation leaves `awaiting_client_tools` the moment it is accepted, exactly one of two
//! different continuations wins, unknown contexts never get in, and a job the worker refuses
//! before running still settles its turn in the store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aptix_worker::contract::{TurnId, parse_request};
use aptix_worker::fake_llm::Reply;
use aptix_worker::pipeline::fingerprint;
use aptix_worker::store::{TurnRecord, TurnStatus};
use serde_json::{Value, json};

use crate::app::{App, AppOptions, Backend, code, spawn};

/// The right to write turn state directly, as these tests of the store do.
const G: &aptix_worker::store::Grant = &aptix_worker::store::Grant::for_tests();

async fn app_on(backend: Backend) -> App {
    spawn(AppOptions {
        backend,
        ..AppOptions::default()
    })
    .await
}

/// Runs a user turn whose model answer asks the client to read a file; returns the call id.
async fn awaiting_tools(app: &App, sid: &str, tid: &str) -> String {
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

fn continuation(sid: &str, tid: &str, call: &str, contents: &str) -> String {
    json!({"sessionId": sid, "turnId": tid, "toolResults": [{
        "toolCallId": call, "executionMs": 3,
        "resultJson": json!({"contents": contents}).to_string()
    }]})
    .to_string()
}

async fn a_continuation_reads_queued_as_soon_as_it_is_accepted(backend: Backend) {
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

async fn of_two_different_continuations_exactly_one_is_accepted(backend: Backend) {
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
    // After it ran, the winner sent again gets the settled status; nothing runs again.
    let (status, again) = app.post(Some("tok-a"), winner.clone()).await;
    assert_eq!(
        (status, again["result"]["status"].as_str()),
        (202, Some("completed"))
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.fake.requests().len(), 2);
}

async fn unknown_contexts_are_refused_at_the_front_door(backend: Backend) {
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

async fn a_job_the_worker_refuses_before_running_still_settles(backend: Backend) {
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

async fn a_long_poll_answers_as_soon_as_the_result_is_published(backend: Backend) {
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

async fn every_error_is_an_invoke_result_naming_the_parameter(backend: Backend) {
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

async fn every_answer_carries_a_request_id(backend: Backend) {
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

async fn boom() -> &'static str {
    panic!("a handler bug")
}

/// A handler that panics is answered with a JSON `InvokeResult` (`INTERNAL`, 500) that names
/// the request id, and the server goes on serving.
#[tokio::test]
async fn a_panicking_handler_gets_an_internal_invoke_result() {
    use aptix_worker::frontdoor::http::{serve, with_http_layers};
    let metrics = Arc::new(aptix_worker::metrics::Metrics::new());
    let router = with_http_layers(
        axum::Router::new()
            .route("/boom", axum::routing::get(boom))
            .route("/fine", axum::routing::get(|| async { "fine" })),
        metrics.clone(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(serve(listener, router, stop.clone()));
    let http = crate::support::http_client();
    let resp = http.get(format!("{base}/boom")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 500);
    assert!(resp.headers().contains_key("x-request-id"));
    let body: Value = resp.json().await.unwrap();
    assert_eq!(code(&body), "INTERNAL");
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("x-request-id")
    );
    let resp = http.get(format!("{base}/fine")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    // The panic is counted as the 500 it was answered with.
    let text = metrics.encode();
    assert!(
        text.contains("aptix_http_requests_total{route=\"/boom\",method=\"GET\",status=\"500\"} 1"),
        "{text}"
    );
    stop.cancel();
}

/// A request whose client gives up before the answer still shows in the metrics, as 499.
#[tokio::test]
async fn a_request_the_client_abandons_is_counted_as_499() {
    use aptix_worker::frontdoor::http::{serve, with_http_layers};
    let metrics = Arc::new(aptix_worker::metrics::Metrics::new());
    let router = with_http_layers(
        axum::Router::new().route(
            "/slow/{id}",
            axum::routing::get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        ),
        metrics.clone(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(serve(listener, router, stop.clone()));
    let gave_up = crate::support::http_client()
        .get(format!("{base}/slow/1"))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(gave_up.is_err(), "the client timed out");
    let line = "aptix_http_requests_total{route=\"/slow/{id}\",method=\"GET\",status=\"499\"} 1";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !metrics.encode().contains(line) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not counted: {}",
            metrics.encode()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
}

/// Reply queues expire when unused; publishing to one does not keep it alive. A session that
/// comes back after its queue expired must find its results in the queue again, whether the
/// front door had its event consumer bound for the session (synchronous endpoint, long-poll)
/// or not (plain polling) — with `APTIX_REPLY_QUEUES=every-session`, which keeps a queue for
/// every status. RabbitMQ only: the embedded broker's queues do not expire.
#[tokio::test]
async fn a_session_whose_reply_queue_expired_gets_its_results_there_again() {
    let ttl = Duration::from_millis(1500);
    let app = spawn(AppOptions {
        reply_queue_ttl: Some(ttl),
        extra_env: vec![("APTIX_REPLY_QUEUES", "every-session".into())],
        ..AppOptions::default()
    })
    .await;
    let peek = crate::support::amqp_peek().await;
    let queue = app.topology.reply_queue(&crate::support::sid_a("s"));
    let until_expired = || async {
        for _ in 0..30 {
            if !crate::support::queue_exists(&queue).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("the reply queue {queue} did not expire");
    };
    // The turn ids of the replies waiting in the session's queue. A reply reaches the queue a
    // moment after the publish completes at the front door's event consumer (each queue takes
    // the message on its own), so wait up to two seconds for it to show.
    let turn_ids_in_queue = || async {
        let mut found = Vec::new();
        for _ in 0..20 {
            found.extend(
                crate::support::take_all(&peek, &queue)
                    .await
                    .iter()
                    .filter_map(|b| serde_json::from_slice::<Value>(b).ok())
                    .filter_map(|v| v["turnId"].as_str().map(str::to_string)),
            );
            if !found.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        found
    };
    // First turn: the queue is created and gets the result.
    app.fake.push([Reply::Text("one".into())]);
    app.post(
        Some("tok-a"),
        json!({"sessionId": "s", "turnId": "t1", "instruction": "x"}).to_string(),
    )
    .await;
    let (_, body) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t1?wait=10")
        .await;
    assert_eq!(body["result"]["status"], "completed");
    assert_eq!(turn_ids_in_queue().await, ["t1"]);
    until_expired().await;
    // Second turn through the synchronous endpoint: the front door's event queue is bound for
    // the session, so a publish would not be returned even with the reply queue gone.
    app.fake.push([Reply::Text("two".into())]);
    let resp = app
        .http
        .post(format!("{}/api/ai/agent/execute", app.base))
        .bearer_auth("tok-a")
        .body(json!({"sessionId": "s", "turnId": "t2", "instruction": "x"}).to_string())
        .send()
        .await
        .unwrap();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["result"]["primaryOutputText"], "two", "{body}");
    assert_eq!(turn_ids_in_queue().await, ["t2"]);
    until_expired().await;
    // Third turn, polled without waiting (no event consumer bound).
    app.fake.push([Reply::Text("three".into())]);
    app.post(
        Some("tok-a"),
        json!({"sessionId": "s", "turnId": "t3", "instruction": "x"}).to_string(),
    )
    .await;
    let mut status = String::new();
    for _ in 0..100 {
        let (_, body) = app.get(Some("tok-a"), "/v1/sessions/s/turns/t3").await;
        status = body["result"]["status"].as_str().unwrap_or_default().into();
        if status == "completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, "completed");
    // The reply is published after the result is stored.
    assert_eq!(turn_ids_in_queue().await, ["t3"]);
}

/// At the default `APTIX_REPLY_QUEUES=async-turns`, a turn submitted with `POST /v1/turns`
/// leaves its status in the session's reply queue for a client that subscribes later
/// (`aptix watch`); a synchronous call and a batch line, whose answers are read from the HTTP
/// response and the batch, do not make the broker keep a queue for their sessions.
async fn by_default_only_turns_submitted_to_be_read_later_keep_a_reply_queue(backend: Backend) {
    let app = app_on(backend).await;
    // Read later: submitted, settled, then subscribed to.
    app.post(
        Some("tok-a"),
        json!({"sessionId": "later", "turnId": "t", "instruction": "x"}).to_string(),
    )
    .await;
    app.settled("tok-a", "later", "t").await;
    // Answered in the response.
    let resp = app
        .http
        .post(format!("{}/api/ai/agent/execute", app.base))
        .bearer_auth("tok-a")
        .body(json!({"sessionId": "sync", "turnId": "t", "instruction": "x"}).to_string())
        .send()
        .await
        .unwrap();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["successful"], true, "{body}");
    // A batch line, read from the batch.
    let line = json!({"customId": "doc", "request": {"sessionId": "line", "instruction": "x"}});
    let (status, body) = app
        .post_to(Some("tok-a"), "/v1/batches", line.to_string())
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["result"]["batchId"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = app.get(Some("tok-a"), &format!("/v1/batches/{id}")).await;
        if body["result"]["completed"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the batch did not finish: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first_status = |session: &'static str| {
        let broker = app.broker.clone();
        async move {
            let sid = crate::support::sid_a(session);
            let mut replies = broker.subscribe_replies(&sid).await.unwrap();
            tokio::time::timeout(Duration::from_millis(800), replies.recv())
                .await
                .ok()
                .flatten()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        }
    };
    let kept = first_status("later")
        .await
        .expect("the status waits in the queue");
    assert_eq!(kept["status"], "completed", "{kept}");
    for session in ["sync", "line"] {
        assert_eq!(first_status(session).await, None, "{session} kept a queue");
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

/// Redis stops answering (a proxy in front of it holds every byte, connections stay open):
/// `POST /v1/turns` answers 503 within a bound instead of hanging, `/readyz` answers within a
/// second naming the store, nothing is left half-accepted, and all recovers when Redis does.
#[tokio::test]
async fn a_stalled_redis_is_a_prompt_503_and_nothing_is_half_accepted() {
    let proxy = crate::support::StallProxy::start("127.0.0.1:6379").await;
    let app = spawn(AppOptions {
        redis_url: Some(format!("redis://{}/", proxy.addr)),
        dependency_timeout: Some(Duration::from_millis(700)),
        ..AppOptions::default()
    })
    .await;
    app.fake.push([Reply::Text("before".into())]);
    let turn = |tid: &str| json!({"sessionId": "s", "turnId": tid, "instruction": "x"}).to_string();
    let (status, _) = app.post(Some("tok-a"), turn("t1")).await;
    assert_eq!(status, 202);
    let (_, done) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t1?wait=10")
        .await;
    assert_eq!(done["result"]["status"], "completed");

    proxy.stall(true);
    let started = Instant::now();
    let (status, body) = app.post(Some("tok-a"), turn("t2")).await;
    assert_eq!(
        (status, code(&body)),
        (503, "SERVICE_UNAVAILABLE"),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    // A read is refused as promptly, without claiming anything about acceptance.
    let (status, body) = app.get(Some("tok-a"), "/v1/sessions/s/turns/t1").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body["errors"][0]["message"],
        "the service is temporarily unavailable; try again"
    );
    let started = Instant::now();
    let (status, body) = app.get(None, "/readyz").await;
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status, 503);
    let named = body["errors"].as_array().unwrap().iter().any(|e| {
        e["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("session store:")
    });
    assert!(named, "{body}");

    proxy.stall(false);
    // The writes held by the stall arrive now, in order: the turn's record and then its
    // removal. What is left is what was accepted.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sid = crate::support::sid_a("s");
    let turns: Vec<String> = app
        .store
        .list_turns(&sid)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(turns, ["t1"], "the refused turn left nothing behind");
    app.fake.push([Reply::Text("after".into())]);
    let (status, body) = app.post(Some("tok-a"), turn("t3")).await;
    assert_eq!(status, 202, "{body}");
    let (_, done) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t3?wait=10")
        .await;
    assert_eq!(done["result"]["status"], "completed");
    let (status, _) = app.get(None, "/readyz").await;
    assert_eq!(status, 200);
}

/// RabbitMQ stops answering: the front door does not wait for a confirm without end; the turn
/// is refused with 503 and taken back, `/readyz` names the broker within a second.
#[tokio::test]
async fn a_stalled_broker_is_a_prompt_503_and_the_turn_is_taken_back() {
    let proxy = crate::support::StallProxy::start("127.0.0.1:5672").await;
    let app = spawn(AppOptions {
        amqp_url: Some(format!("amqp://guest:guest@{}/%2f", proxy.addr)),
        dependency_timeout: Some(Duration::from_millis(700)),
        ..AppOptions::default()
    })
    .await;
    let turn = |tid: &str| json!({"sessionId": "s", "turnId": tid, "instruction": "x"}).to_string();
    app.fake.push([Reply::Text("before".into())]);
    let (status, _) = app.post(Some("tok-a"), turn("t1")).await;
    assert_eq!(status, 202);
    proxy.stall(true);
    let started = Instant::now();
    let (status, body) = app.post(Some("tok-a"), turn("t2")).await;
    assert_eq!(
        (status, code(&body)),
        (503, "SERVICE_UNAVAILABLE"),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let sid = crate::support::sid_a("s");
    let t2 = TurnId::parse("t2").unwrap();
    assert!(
        app.store.get_turn(&sid, &t2).await.unwrap().is_none(),
        "a turn whose job was not confirmed is not left queued"
    );
    let started = Instant::now();
    let (status, body) = app.get(None, "/readyz").await;
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status, 503);
    let named = body["errors"].as_array().unwrap().iter().any(|e| {
        e["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("message broker:")
    });
    assert!(named, "{body}");
    proxy.stall(false);
}

/// A cancel decided at the front door whose status the broker does not take is stored, but
/// the client is not told it went well: 503 saying the turn is cancelled and to cancel again.
/// Cancelling again once the broker is back answers 200 and puts the status in the session's
/// reply queue (where a stored-but-untold cancel would never have gone).
#[tokio::test]
async fn a_cancel_the_broker_does_not_take_is_a_503_and_cancelling_again_tells_of_it() {
    let proxy = crate::support::StallProxy::start("127.0.0.1:5672").await;
    let app = spawn(AppOptions {
        amqp_url: Some(format!("amqp://guest:guest@{}/%2f", proxy.addr)),
        dependency_timeout: Some(Duration::from_millis(700)),
        ..AppOptions::default()
    })
    .await;
    let instruction = "#fake:call workspace_read_file {\"path\":\"README.md\"}";
    let body = json!({"sessionId": "s", "turnId": "t", "instruction": instruction}).to_string();
    assert_eq!(app.post(Some("tok-a"), body).await.0, 202);
    let waiting = app.settled("tok-a", "s", "t").await;
    assert_eq!(waiting["status"], "awaiting_client_tools", "{waiting}");
    let cancel = || app.post_to(Some("tok-a"), "/v1/sessions/s/turns/t/cancel", Vec::new());
    let peek = crate::support::amqp_peek().await;
    let queue = app.topology.reply_queue(&crate::support::sid_a("s"));
    crate::support::take_all(&peek, &queue).await;

    proxy.stall(true);
    let (status, body) = cancel().await;
    assert_eq!(
        (status, code(&body)),
        (503, "SERVICE_UNAVAILABLE"),
        "{body}"
    );
    let message = body["errors"][0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("is cancelled") && message.contains("cancel it again"),
        "{body}"
    );
    let record = app
        .store
        .get_turn(&crate::support::sid_a("s"), &TurnId::parse("t").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status.as_str(), "cancelled");
    proxy.stall(false);
    // What the stalled connection held may still arrive; only what the next cancel tells
    // counts from here on.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    crate::support::take_all(&peek, &queue).await;

    let (status, body) = cancel().await;
    assert_eq!(
        (status, &body["result"]["status"]),
        (200, &json!("cancelled")),
        "{body}"
    );
    let mut told = Vec::new();
    for _ in 0..30 {
        told.extend(
            crate::support::take_all(&peek, &queue)
                .await
                .iter()
                .filter_map(|b| serde_json::from_slice::<Value>(b).ok())
                .filter(|v| v["turnId"] == "t" && v["status"] == "cancelled"),
        );
        if !told.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(told.len(), 1, "the second cancel tells of the turn once");
}
