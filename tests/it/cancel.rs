//! Cancelling turns through the HTTP API, on both backends: a queued turn at once (its job is
//! dropped), a running one at its next safe point with the model call in flight abandoned, a
//! turn waiting for client tools (a later continuation is refused), and the refusals.

use std::time::{Duration, Instant};

use aptix_worker::fake_llm::Reply;
use serde_json::{Value, json};

use crate::app::{App, AppOptions, Backend, code, spawn};

fn turn(session: &str, turn: &str, instruction: &str) -> String {
    json!({"sessionId": session, "turnId": turn, "instruction": instruction}).to_string()
}

async fn cancel(app: &App, token: &str, session: &str, turn: &str) -> (u16, Value) {
    app.post_to(
        Some(token),
        &format!("/v1/sessions/{session}/turns/{turn}/cancel"),
        Vec::new(),
    )
    .await
}

async fn settled(app: &App, session: &str, turn: &str) -> Value {
    app.settled("tok-a", session, turn).await
}

/// Makes the model's next answer take `delay`, and starts turn `first` of session `s`, which
/// holds the session (in a model call) until then.
async fn hold_the_model(app: &App, delay: Duration, first: &str) {
    app.fake
        .push([Reply::Delay(delay, Box::new(Reply::Text("held".into())))]);
    assert_eq!(
        app.post(Some("tok-a"), turn("s", first, "hold")).await.0,
        202
    );
    app.wait_for_model_calls(1).await;
}

async fn app(backend: Backend) -> App {
    spawn(AppOptions {
        backend,
        ..AppOptions::default()
    })
    .await
}

async fn a_queued_turn_is_cancelled_at_once_and_its_job_dropped(backend: Backend) {
    let app = app(backend).await;
    // t1 holds the session for a while; t2 waits behind it, queued.
    hold_the_model(&app, Duration::from_millis(1500), "t1").await;
    assert_eq!(app.post(Some("tok-a"), turn("s", "t2", "two")).await.0, 202);
    let (status, body) = cancel(&app, "tok-a", "s", "t2").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["status"], "cancelled", "{body}");
    assert_eq!(
        body["result"]["result"]["errors"][0]["errorCode"],
        "TURN_CANCELLED"
    );
    // Idempotent.
    let (status, again) = cancel(&app, "tok-a", "s", "t2").await;
    assert_eq!(
        (status, &again["result"]["status"]),
        (200, &json!("cancelled"))
    );
    assert_eq!(settled(&app, "s", "t1").await["status"], "completed");
    // The session goes on from t1: t2 never reached the model, t3 continues after t1.
    assert_eq!(
        app.post(Some("tok-a"), turn("s", "t3", "three")).await.0,
        202
    );
    assert_eq!(settled(&app, "s", "t3").await["status"], "completed");
    let sent = app.fake.requests();
    assert_eq!(sent.len(), 2, "t1 and t3 only: {sent:?}");
    assert!(sent[1]["previous_response_id"].is_string(), "{}", sent[1]);
    assert_eq!(settled(&app, "s", "t2").await["status"], "cancelled");
}

async fn a_running_turn_stops_and_its_model_call_is_abandoned(backend: Backend) {
    let app = app(backend).await;
    hold_the_model(&app, Duration::from_secs(20), "t").await;
    let asked = Instant::now();
    let (status, body) = cancel(&app, "tok-a", "s", "t").await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["result"]["status"], "running");
    let result = settled(&app, "s", "t").await;
    assert_eq!(result["status"], "cancelled", "{result}");
    assert_eq!(result["result"]["errors"][0]["errorCode"], "TURN_CANCELLED");
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "stopped within about a second, not after the 20 s call: {:?}",
        asked.elapsed()
    );
    // The next turn of the session runs, from the state before the cancelled one.
    assert_eq!(
        app.post(Some("tok-a"), turn("s", "t2", "again")).await.0,
        202
    );
    assert_eq!(settled(&app, "s", "t2").await["status"], "completed");
    assert!(app.fake.requests()[1]["previous_response_id"].is_null());
}

async fn a_turn_waiting_for_client_tools_is_cancelled_and_refuses_its_continuation(
    backend: Backend,
) {
    let app = app(backend).await;
    let instruction = "#fake:call workspace_read_file {\"path\":\"README.md\"}";
    assert_eq!(
        app.post(Some("tok-a"), turn("s", "t", instruction)).await.0,
        202
    );
    let waiting = settled(&app, "s", "t").await;
    assert_eq!(waiting["status"], "awaiting_client_tools", "{waiting}");
    let call_id = waiting["result"]["result"]["toolCalls"][0]["toolCallId"].clone();
    let (status, body) = cancel(&app, "tok-a", "s", "t").await;
    assert_eq!(
        (status, &body["result"]["status"]),
        (200, &json!("cancelled")),
        "{body}"
    );
    let cont = json!({"sessionId": "s", "turnId": "t", "toolResults": [
        {"toolCallId": call_id, "executionMs": 1, "resultJson": "{}"}]});
    let (status, body) = app.post(Some("tok-a"), cont.to_string()).await;
    assert_eq!(
        (status, code(&body)),
        (409, "TURN_NOT_AWAITING_TOOLS"),
        "{body}"
    );
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("cancelled")
    );
}

async fn finished_missing_and_other_tenants_turns_are_refused(backend: Backend) {
    let app = app(backend).await;
    assert_eq!(app.post(Some("tok-a"), turn("s", "t", "hi")).await.0, 202);
    assert_eq!(settled(&app, "s", "t").await["status"], "completed");
    let (status, body) = cancel(&app, "tok-a", "s", "t").await;
    assert_eq!(
        (status, code(&body)),
        (409, "TURN_ALREADY_FINISHED"),
        "{body}"
    );
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("completed")
    );
    let (status, body) = cancel(&app, "tok-b", "s", "t").await;
    assert_eq!((status, code(&body)), (404, "TURN_NOT_FOUND"), "{body}");
    let (status, body) = cancel(&app, "tok-a", "s", "nope").await;
    assert_eq!((status, code(&body)), (404, "TURN_NOT_FOUND"), "{body}");
    let resp = app
        .http
        .post(format!("{}/v1/sessions/s/turns/t/cancel", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
}

fn busy_turn(session: &str, turn: &str, on_busy: &str) -> String {
    json!({"sessionId": session, "turnId": turn, "instruction": "again", "onBusy": on_busy})
        .to_string()
}

async fn on_busy_reject_refuses_a_second_turn_while_one_runs(backend: Backend) {
    let app = app(backend).await;
    hold_the_model(&app, Duration::from_millis(1500), "t1").await;
    let (status, body) = app
        .post(Some("tok-a"), busy_turn("s", "t2", "reject"))
        .await;
    assert_eq!((status, code(&body)), (409, "SESSION_BUSY"), "{body}");
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("t1")
    );
    let (status, _) = app.get(Some("tok-a"), "/v1/sessions/s/turns/t2").await;
    assert_eq!(status, 404, "nothing enqueued");
    assert_eq!(settled(&app, "s", "t1").await["status"], "completed");
    // Once the session is idle the same policy lets a turn in.
    assert_eq!(
        app.post(Some("tok-a"), busy_turn("s", "t3", "reject"))
            .await
            .0,
        202
    );
    assert_eq!(settled(&app, "s", "t3").await["status"], "completed");
    // A bad value is a validation error.
    let (status, body) = app.post(Some("tok-a"), busy_turn("s", "t4", "later")).await;
    assert_eq!((status, code(&body)), (400, "INVALID_ON_BUSY"), "{body}");
}

async fn on_busy_interrupt_cancels_the_running_turn_and_runs_next(backend: Backend) {
    let app = app(backend).await;
    hold_the_model(&app, Duration::from_secs(20), "t1").await;
    let started = Instant::now();
    let (status, body) = app
        .post(Some("tok-a"), busy_turn("s", "t2", "interrupt"))
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(settled(&app, "s", "t1").await["status"], "cancelled");
    assert_eq!(settled(&app, "s", "t2").await["status"], "completed");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "t2 ran after t1 stopped, not after its 20 s call: {:?}",
        started.elapsed()
    );
}

async fn cancelling_a_batch_cancels_its_unfinished_turns(backend: Backend) {
    let app = app(backend).await;
    let hang = || {
        Reply::Delay(
            Duration::from_secs(20),
            Box::new(Reply::Text("never".into())),
        )
    };
    app.fake.push([hang(), hang(), hang()]);
    let lines: Vec<String> = (0..3)
        .map(|i| {
            json!({"customId": format!("doc-{i}"), "request": {"instruction": "review"}})
                .to_string()
        })
        .collect();
    let (status, body) = app
        .post_to(Some("tok-a"), "/v1/batches", lines.join("\n"))
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["result"]["batchId"].as_str().unwrap().to_string();
    app.wait_for_model_calls(3).await;
    let started = Instant::now();
    let (status, body) = app
        .post_to(
            Some("tok-a"),
            &format!("/v1/batches/{id}/cancel"),
            Vec::new(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    loop {
        let (_, body) = app.get(Some("tok-a"), &format!("/v1/batches/{id}")).await;
        if body["result"]["cancelled"] == 3 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _) = app
        .post_to(
            Some("tok-b"),
            &format!("/v1/batches/{id}/cancel"),
            Vec::new(),
        )
        .await;
    assert_eq!(status, 404, "another tenant's batch");
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [
        a_queued_turn_is_cancelled_at_once_and_its_job_dropped,
        a_running_turn_stops_and_its_model_call_is_abandoned,
        a_turn_waiting_for_client_tools_is_cancelled_and_refuses_its_continuation,
        finished_missing_and_other_tenants_turns_are_refused,
        on_busy_reject_refuses_a_second_turn_while_one_runs,
        on_busy_interrupt_cancels_the_running_turn_and_runs_next,
        cancelling_a_batch_cancels_its_unfinished_turns,
    ],
);

/// `aptix serve` and `aptix worker` as separate processes on RabbitMQ and Redis; the turn is
/// cancelled with `aptix cancel`, and the worker process learns of it through Redis.
#[tokio::test]
async fn aptix_cancel_stops_a_turn_running_in_another_process() {
    let fake = aptix_worker::fake_llm::FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        Default::default(),
        Some(crate::support::schema()),
    )
    .await
    .unwrap();
    fake.push([Reply::Delay(
        Duration::from_secs(20),
        Box::new(Reply::Text("never".into())),
    )]);
    let topology = crate::support::test_topology();
    let ns = topology.namespace.clone();
    let _rabbit = crate::support::RabbitGuard {
        broker: crate::support::rabbit_broker(&topology, &format!("{ns}-test")).await,
        topology,
    };
    let _redis = crate::support::redis_store_in(&ns).await;
    let command = |args: &[&str]| {
        let mut c = crate::cli::aptix();
        c.args(args)
            .env("APTIX_AMQP_URL", crate::support::amqp_url())
            .env("APTIX_REDIS_URL", crate::support::redis_url())
            .env("APTIX_NAMESPACE", &ns)
            .env("APTIX_LLM_BASE_URL", fake.base_url())
            .env("APTIX_LLM_MAX_RETRIES", "0")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1");
        c
    };
    let serve =
        crate::support::Listening::start(&mut command(&["serve", "--listen", "127.0.0.1:0"]));
    let worker =
        crate::support::Listening::start(&mut command(&["worker", "--listen", "127.0.0.1:0"]));
    assert!(worker.wait_for_line("consuming turn jobs", Duration::from_secs(20)));
    let http = crate::support::http_client();
    let resp = http
        .post(format!("{}/v1/turns", serve.url()))
        .body(turn("s", "t", "slow"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fake.requests().is_empty() {
        assert!(Instant::now() < deadline, "the model got no call");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let out = command(&["cancel", "s", "t", "--url", &serve.url()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\"running\""), "{stdout}");
    let asked = Instant::now();
    let body: Value = http
        .get(format!("{}/v1/sessions/s/turns/t?wait=10", serve.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["result"]["status"], "cancelled", "{body}");
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}",
        asked.elapsed()
    );
    assert!(worker.wait_for_line("turn cancelled on request", Duration::from_secs(5)));
}
