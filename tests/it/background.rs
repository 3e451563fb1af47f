//! Background model calls (`APTIX_LLM_BACKGROUND`, or `"background": true` per agent
//! context) and the service tier, on both backends, against the fake's background mode: a
//! call that outlives the worker that made it, one the server forgot, a cancel that reaches
//! the server, a server without background mode, and flex calls without capacity.

use std::time::Duration;

use aptix_worker::contract::{SessionId, TurnId};
use aptix_worker::fake_llm::{FakeOptions, Reply};
use aptix_worker::store::{StoreReader as _, TurnRecord};
use serde_json::{Value, json};

use crate::app::{App, AppOptions, Backend, spawn};
use crate::processes::Processes;
use crate::streaming::sse_at;

/// An answer long enough to stream in many pieces.
const LONG: &str = "The design record reads well: its context is stated, the options are weighed \
    against each other, and the decision follows from them; two consequences are missing.";

async fn app(backend: Backend, env: Vec<(&'static str, &str)>, fake: FakeOptions) -> App {
    let mut extra_env: Vec<(&'static str, String)> = vec![
        ("APTIX_LLM_BACKGROUND", "true".into()),
        // A worker that stops abandons its turns at once, as one that dies does.
        ("APTIX_SHUTDOWN_GRACE_SECS", "0".into()),
        ("APTIX_LEASE_SECS", "2".into()),
    ];
    extra_env.extend(env.into_iter().map(|(k, v)| (k, v.to_string())));
    spawn(AppOptions {
        backend,
        extra_env,
        fake,
        ..AppOptions::default()
    })
    .await
}

fn pieces(n: usize) -> FakeOptions {
    FakeOptions {
        stream_pieces: n,
        ..FakeOptions::default()
    }
}

async fn record(app: &App, session: &str, turn: &str) -> TurnRecord {
    app.store
        .get_turn(
            &crate::support::sid_a(session),
            &TurnId::parse(turn).unwrap(),
        )
        .await
        .unwrap()
        .expect("the turn's record")
}

/// The POSTs the fake got (each a model call made).
fn posts(app: &App) -> usize {
    app.fake.requests().len()
}

/// Waits until the turn's live output has kept `n` text events (what its clients can have
/// seen), up to ten seconds.
async fn kept_deltas(app: &App, session: &str, turn: &str, n: usize) {
    let (sid, tid) = (crate::support::sid_a(session), TurnId::parse(turn).unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let kept = app.store.kept_live(&sid, &tid).await.unwrap();
        let deltas = kept
            .iter()
            .filter_map(|e| serde_json::from_slice::<Value>(e).ok())
            .filter(|e| e["kind"] == "delta")
            .count();
        if deltas >= n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {deltas} deltas were kept"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of a counter of `/metrics` (0 when absent).
async fn counter(app: &App, series: &str) -> f64 {
    app.metrics_text()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The text a streaming client ends up showing: deltas in order, a progress note that says
/// the text is replaced starting it over.
fn shown(events: &[(String, String, Value)]) -> (String, usize) {
    let (mut text, mut replaced) = (String::new(), 0);
    for (kind, _, data) in events {
        match kind.as_str() {
            "delta" => text.push_str(data["text"].as_str().unwrap_or_default()),
            "progress"
                if data["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("replaced") =>
            {
                text.clear();
                replaced += 1;
            }
            _ => {}
        }
    }
    (text, replaced)
}

fn turn_seen(events: &[(String, String, Value)]) -> bool {
    events
        .iter()
        .any(|(k, _, d)| k == "turn" && d["status"] != "running" && d["status"] != "queued")
}

/// A slow background call, its worker gone mid-call (the client has seen part of the text;
/// the embedded broker gives the job back when its worker lets go of it, as RabbitMQ does
/// when a worker process dies, tested below with `aptix worker` processes): the next worker
/// re-attaches instead of calling again — the fake got one POST — resumes the
/// stream after the last event the client could have seen, and the turn completes once with
/// the text the client saw, nothing missing and nothing twice.
async fn a_background_call_outlives_the_worker_that_made_it(backend: Backend) {
    outlives_its_worker(backend, "http1").await;
}

/// [`a_background_call_outlives_the_worker_that_made_it`] with the model's calls over `http`
/// (`APTIX_LLM_HTTP`): over HTTP/2 the create call's stream and the next worker's re-attached
/// one are streams on shared connections.
async fn outlives_its_worker(backend: Backend, http: &str) {
    let app = app(backend, vec![("APTIX_LLM_HTTP", http)], pieces(24)).await;
    app.fake.push([Reply::Delay(
        Duration::from_secs(4),
        Box::new(Reply::Text(LONG.into())),
    )]);
    let (ready, wait) = tokio::sync::oneshot::channel();
    let body =
        json!({"sessionId": "bg", "turnId": "t", "instruction": "review", "streaming": true});
    let (events, ()) = tokio::join!(
        sse_at((&app.base, Some("tok-a")), "bg", None, ready, turn_seen),
        async {
            let _ = wait.await;
            assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
            kept_deltas(&app, "bg", "t", 3).await;
            app.replace_worker();
        }
    );
    let (_, _, last) = events
        .iter()
        .rfind(|(k, _, _)| k == "turn")
        .expect("the turn's status");
    assert_eq!(last["status"], "completed", "{last}");
    let answer = last["result"]["result"]["primaryOutputText"]
        .as_str()
        .unwrap();
    assert_eq!(answer, LONG);
    let (text, replaced) = shown(&events);
    assert_eq!(replaced, 0, "nothing was replaced: {events:?}");
    assert_eq!(text, answer, "the client saw the answer once, whole");
    assert_eq!(posts(&app), 1, "one model call, followed by two workers");
    assert!(app.fake.background_retrievals() >= 1);
    let rec = record(&app, "bg", "t").await;
    assert_eq!(rec.attempts, 2, "the turn ran twice");
    assert_eq!(rec.calls.len(), 1, "{:?}", rec.calls);
    assert!(rec.calls[0].background && rec.calls[0].reattached);
    let series = "aptix_model_background_calls_total{event=\"reattached\"}";
    assert_eq!(counter(&app, series).await, 1.0);
    assert_eq!(app.fake.http2_requests(), u64::from(http == "http2"));
}

/// The same, but the server forgot the response meanwhile (`404`, as an expired one): the
/// next worker makes the call once more — two POSTs in all — says so to the client (the text
/// so far is replaced) and in a metric, and the turn completes once with the new answer.
async fn a_background_call_the_server_forgot_is_made_again_once(backend: Backend) {
    let app = app(backend, Vec::new(), pieces(24)).await;
    app.fake.push([
        Reply::Delay(Duration::from_secs(4), Box::new(Reply::Text(LONG.into()))),
        Reply::Text("A second look: fine.".into()),
    ]);
    let (ready, wait) = tokio::sync::oneshot::channel();
    let body =
        json!({"sessionId": "bx", "turnId": "t", "instruction": "review", "streaming": true});
    let (events, ()) = tokio::join!(
        sse_at((&app.base, Some("tok-a")), "bx", None, ready, turn_seen),
        async {
            let _ = wait.await;
            assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
            kept_deltas(&app, "bx", "t", 2).await;
            app.replace_worker();
            app.fake.expire_background();
        }
    );
    let (_, _, last) = events.iter().rfind(|(k, _, _)| k == "turn").unwrap();
    assert_eq!(
        last["result"]["result"]["primaryOutputText"],
        "A second look: fine."
    );
    let (text, replaced) = shown(&events);
    assert_eq!(
        replaced, 1,
        "one note says the call is made again: {events:?}"
    );
    assert_eq!(text, "A second look: fine.");
    assert_eq!(posts(&app), 2, "made again once");
    let series = "aptix_model_background_calls_total{event=\"recalled\"}";
    assert_eq!(counter(&app, series).await, 1.0);
}

/// Cancelling a turn whose background call runs cancels the response on the server too.
async fn cancelling_a_turn_cancels_its_background_call_on_the_server(backend: Backend) {
    let app = app(backend, Vec::new(), FakeOptions::default()).await;
    app.fake.push([Reply::Delay(
        Duration::from_secs(10),
        Box::new(Reply::Text("never seen".into())),
    )]);
    let body = json!({"sessionId": "bc", "turnId": "t", "instruction": "slow"});
    assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
    // Running, its call's id recorded.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let response_id = loop {
        if let Some(mark) = record(&app, "bc", "t").await.model_call {
            break mark.response_id;
        }
        assert!(std::time::Instant::now() < deadline, "no call was recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (status, _) = app
        .post_to(Some("tok-a"), "/v1/sessions/bc/turns/t/cancel", Vec::new())
        .await;
    assert_eq!(status, 202);
    assert_eq!(app.settled("tok-a", "bc", "t").await["status"], "cancelled");
    assert_eq!(app.fake.cancels(), vec![response_id]);
    let series = "aptix_model_background_calls_total{event=\"cancelled\"}";
    assert_eq!(counter(&app, series).await, 1.0);
}

/// A turn whose deadline comes during its background call stops the call on the server
/// before the run is dropped; the job runs again, finds that response cancelled and makes the
/// call once more.
async fn a_turn_deadline_cancels_its_background_call_on_the_server(backend: Backend) {
    let env = vec![("APTIX_TURN_DEADLINE_SECS", "2")];
    let app = app(backend, env, FakeOptions::default()).await;
    app.fake.push([
        Reply::Delay(Duration::from_secs(8), Box::new(Reply::Text("late".into()))),
        Reply::Text("in time".into()),
    ]);
    let body = json!({"sessionId": "bd", "turnId": "t", "instruction": "slow"});
    assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let done = loop {
        let (_, now) = app
            .get(Some("tok-a"), "/v1/sessions/bd/turns/t?wait=5")
            .await;
        if now["result"]["status"] == "completed" {
            break now["result"].clone();
        }
        assert!(std::time::Instant::now() < deadline, "{now}");
    };
    assert_eq!(done["result"]["result"]["primaryOutputText"], "in time");
    assert_eq!(app.fake.cancels().len(), 1, "the first call was stopped");
    assert_eq!(posts(&app), 2);
    let cancelled = "aptix_model_background_calls_total{event=\"cancelled\"}";
    assert_eq!(counter(&app, cancelled).await, 1.0);
}

/// A background response that ends `failed` with an error of the server's (`server_error`)
/// is made again as a new call, under the call retry policy, and the turn completes: two
/// POSTs, the record on the new response, a streaming client told its text is replaced, and
/// `event="remade"` counted. One the request is at fault for (`invalid_prompt`) is not made
/// again: the turn fails at once with `LLM_REJECTED`.
async fn a_background_call_that_failed_on_the_server_is_made_again(backend: Backend) {
    let app = app(backend, vec![("APTIX_LLM_MAX_RETRIES", "2")], pieces(4)).await;
    app.fake.push([
        Reply::Failed("server_error".into()),
        Reply::Text("Second time lucky.".into()),
    ]);
    let (ready, wait) = tokio::sync::oneshot::channel();
    let body =
        json!({"sessionId": "bf", "turnId": "t", "instruction": "review", "streaming": true});
    let (events, ()) = tokio::join!(
        sse_at((&app.base, Some("tok-a")), "bf", None, ready, turn_seen),
        async {
            let _ = wait.await;
            assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
        }
    );
    let (_, _, last) = events.iter().rfind(|(k, _, _)| k == "turn").unwrap();
    assert_eq!(last["status"], "completed", "{last}");
    assert_eq!(
        last["result"]["result"]["primaryOutputText"],
        "Second time lucky."
    );
    let (text, replaced) = shown(&events);
    assert_eq!(
        replaced, 1,
        "one note says the call is made again: {events:?}"
    );
    assert_eq!(text, "Second time lucky.");
    assert_eq!(posts(&app), 2, "made again once, as a new call");
    assert_eq!(
        last["attempts"], 1,
        "within the run, not by a retry of the job"
    );
    let rec = record(&app, "bf", "t").await;
    assert_eq!(rec.calls.len(), 1, "one answered call: {:?}", rec.calls);
    assert!(rec.calls[0].background && !rec.calls[0].reattached);
    let series = "aptix_model_background_calls_total{event=\"remade\"}";
    assert_eq!(counter(&app, series).await, 1.0);

    app.fake.push([Reply::Failed("invalid_prompt".into())]);
    let body = json!({"sessionId": "bf", "turnId": "t2", "instruction": "again"});
    assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
    let done = app.settled("tok-a", "bf", "t2").await;
    assert_eq!(done["status"], "failed", "{done}");
    let error = &done["result"]["errors"][0];
    assert_eq!(error["errorCode"], "LLM_REJECTED", "{done}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("invalid_prompt"),
        "{done}"
    );
    assert_eq!(posts(&app), 3, "not made again");
    assert_eq!(counter(&app, series).await, 1.0);
}

/// A model server without background mode: the turn fails with a message naming the setting.
async fn a_server_without_background_mode_names_the_setting(backend: Backend) {
    let fake = FakeOptions {
        no_background: true,
        ..FakeOptions::default()
    };
    let app = app(backend, Vec::new(), fake).await;
    let body = json!({"sessionId": "bn", "turnId": "t", "instruction": "x"});
    assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
    let done = app.settled("tok-a", "bn", "t").await;
    assert_eq!(done["status"], "failed", "{done}");
    let error = &done["result"]["errors"][0];
    assert_eq!(error["errorCode"], "LLM_REJECTED", "{done}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("\"background\": false"),
        "{done}"
    );
}

/// Flex calls the server has no capacity for (429 resource unavailable) are made again, and
/// at `default` once the configured wait is over; the tier the server reports is recorded.
async fn a_flex_call_without_capacity_falls_back_to_default_after_the_wait(backend: Backend) {
    let env = vec![
        ("APTIX_LLM_BACKGROUND", "false"),
        ("APTIX_LLM_SERVICE_TIER", "flex"),
        ("APTIX_LLM_FLEX_FALLBACK_SECS", "1"),
    ];
    let app = app(backend, env, FakeOptions::default()).await;
    app.fake.refuse_flex(1000);
    let body = json!({"sessionId": "fx", "turnId": "t", "instruction": "x"});
    assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
    let done = app.settled("tok-a", "fx", "t").await;
    assert_eq!(done["status"], "completed");
    // The tier served is in the turn's status, as the server reported it.
    assert_eq!(done["serviceTier"], "default", "{done}");
    let tiers: Vec<Value> = app
        .fake
        .requests()
        .iter()
        .map(|r| r["service_tier"].clone())
        .collect();
    let (last, flex) = tiers.split_last().unwrap();
    assert_eq!(last, "default", "{tiers:?}");
    assert!(
        flex.len() >= 2 && flex.iter().all(|t| t == "flex"),
        "flex tried again before the fallback: {tiers:?}"
    );
    let rec = record(&app, "fx", "t").await;
    assert_eq!(rec.calls.len(), 1);
    assert_eq!(rec.calls[0].service_tier.as_deref(), Some("default"));
    assert_eq!(counter(&app, "aptix_model_flex_fallbacks_total").await, 1.0);
}

/// With the fallback set to never, a flex call stays at flex: the turn goes back to the queue
/// and completes at flex once there is capacity.
async fn a_flex_call_set_to_never_fall_back_waits_for_flex(backend: Backend) {
    let env = vec![
        ("APTIX_LLM_BACKGROUND", "false"),
        ("APTIX_LLM_SERVICE_TIER", "flex"),
        ("APTIX_LLM_FLEX_FALLBACK_SECS", "never"),
    ];
    let app = app(backend, env, FakeOptions::default()).await;
    app.fake.refuse_flex(2);
    let body = json!({"sessionId": "fn", "turnId": "t", "instruction": "x"});
    assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
    assert_eq!(app.settled("tok-a", "fn", "t").await["status"], "completed");
    let tiers: Vec<Value> = app
        .fake
        .requests()
        .iter()
        .map(|r| r["service_tier"].clone())
        .collect();
    assert_eq!(tiers, vec![json!("flex"); 3], "never at another tier");
    let rec = record(&app, "fn", "t").await;
    assert_eq!(
        rec.calls.last().unwrap().service_tier.as_deref(),
        Some("flex")
    );
    assert_eq!(counter(&app, "aptix_model_flex_fallbacks_total").await, 0.0);
}

/// A wrong tier in the configuration stops the process, naming the variable.
#[test]
fn a_service_tier_that_does_not_exist_is_refused_at_start_up() {
    let e = aptix_worker::config::Config::from_lookup(|k| {
        (k == "APTIX_LLM_SERVICE_TIER").then(|| "cheap".to_string())
    })
    .unwrap_err();
    assert!(e.to_string().contains("APTIX_LLM_SERVICE_TIER"), "{e}");
}

#[tokio::test]
async fn embedded_a_background_call_outlives_the_worker_that_made_it() {
    a_background_call_outlives_the_worker_that_made_it(Backend::Embedded).await;
}

#[tokio::test]
async fn embedded_a_background_call_outlives_its_worker_over_http2() {
    outlives_its_worker(Backend::Embedded, "http2").await;
}

#[tokio::test]
async fn embedded_a_background_call_the_server_forgot_is_made_again_once() {
    a_background_call_the_server_forgot_is_made_again_once(Backend::Embedded).await;
}

/// `aptix serve` and one `aptix worker` on RabbitMQ and Redis, their model the test's fake in
/// background mode.
async fn processes(fake: &aptix_worker::fake_llm::FakeLlm) -> Processes {
    let env = vec![
        ("APTIX_LLM_BASE_URL", fake.base_url()),
        ("APTIX_LLM_BACKGROUND", "true".to_string()),
    ];
    Processes::start(env, &[], 1).await
}

async fn fake_model() -> aptix_worker::fake_llm::FakeLlm {
    aptix_worker::fake_llm::FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        pieces(24),
        Some(crate::support::schema()),
    )
    .await
    .unwrap()
}

/// The services backend: the worker process SIGKILLed mid-call while a client streams the
/// turn; a second worker process re-attaches. One POST, the turn completed once, and the text
/// the client saw is the answer, nothing missing and nothing twice.
#[tokio::test]
async fn services_a_background_call_outlives_a_sigkilled_worker() {
    let fake = fake_model().await;
    let mut procs = processes(&fake).await;
    fake.push([Reply::Delay(
        Duration::from_secs(4),
        Box::new(Reply::Text(LONG.into())),
    )]);
    let base = procs.serve.url();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = seen.clone();
    let until = move |events: &[(String, String, Value)]| {
        let deltas = events.iter().filter(|(k, _, _)| k == "delta").count();
        counted.store(deltas, std::sync::atomic::Ordering::SeqCst);
        turn_seen(events)
    };
    let (ready, wait) = tokio::sync::oneshot::channel();
    let body =
        json!({"sessionId": "bk", "turnId": "t", "instruction": "review", "streaming": true});
    let (events, ()) = tokio::join!(sse_at((&base, None), "bk", None, ready, until), async {
        let _ = wait.await;
        procs.submit(body.to_string()).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while seen.load(std::sync::atomic::Ordering::SeqCst) < 3 {
            assert!(std::time::Instant::now() < deadline, "no text came");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        procs.workers[0].child.kill().expect("SIGKILL the worker");
        procs.add_worker();
    });
    let (_, _, last) = events
        .iter()
        .rfind(|(k, _, _)| k == "turn")
        .expect("the turn's status");
    assert_eq!(last["status"], "completed", "{last}");
    assert_eq!(last["result"]["result"]["primaryOutputText"], LONG);
    let (text, replaced) = shown(&events);
    assert_eq!(replaced, 0, "nothing was replaced: {events:?}");
    assert_eq!(text, LONG, "the client saw the answer once, whole");
    assert_eq!(fake.requests().len(), 1, "one model call, two workers");
    assert!(fake.background_retrievals() >= 1);
    let status = procs.get_json("/v1/sessions/bk/turns/t").await;
    assert_eq!(status["result"]["attempts"], 2, "{status}");
    let metrics = crate::support::http_client()
        .get(format!("{}/metrics", procs.workers[1].url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("aptix_model_background_calls_total{event=\"reattached\"} 1"),
        "{metrics}"
    );
}

/// The services backend, the response forgotten by the server while no worker followed it:
/// made again once (two POSTs), the client told its text is replaced.
#[tokio::test]
async fn services_a_background_call_the_server_forgot_is_made_again_once() {
    let fake = fake_model().await;
    let mut procs = processes(&fake).await;
    fake.push([
        Reply::Delay(Duration::from_secs(4), Box::new(Reply::Text(LONG.into()))),
        Reply::Text("A second look: fine.".into()),
    ]);
    let base = procs.serve.url();
    let (ready, wait) = tokio::sync::oneshot::channel();
    let body =
        json!({"sessionId": "bf", "turnId": "t", "instruction": "review", "streaming": true});
    let (events, ()) = tokio::join!(sse_at((&base, None), "bf", None, ready, turn_seen), async {
        let _ = wait.await;
        procs.submit(body.to_string()).await;
        // The worker dies once it has recorded the call in the turn (what a run that takes
        // over finds), not after a guess at how long that takes.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let (sid, tid) = (SessionId::parse("bf").unwrap(), TurnId::parse("t").unwrap());
        loop {
            let record = procs.store().get_turn(&sid, &tid).await.unwrap();
            if record.is_some_and(|r| r.model_call.is_some()) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no call was recorded");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        procs.workers[0].child.kill().expect("SIGKILL the worker");
        fake.expire_background();
        procs.add_worker();
    });
    let (_, _, last) = events.iter().rfind(|(k, _, _)| k == "turn").unwrap();
    assert_eq!(
        last["result"]["result"]["primaryOutputText"], "A second look: fine.",
        "{last}"
    );
    let (text, replaced) = shown(&events);
    assert_eq!(replaced, 1, "{events:?}");
    assert_eq!(text, "A second look: fine.");
    assert_eq!(fake.requests().len(), 2, "made again once");
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [
        cancelling_a_turn_cancels_its_background_call_on_the_server,
        a_turn_deadline_cancels_its_background_call_on_the_server,
        a_server_without_background_mode_names_the_setting,
        a_background_call_that_failed_on_the_server_is_made_again,
        a_flex_call_without_capacity_falls_back_to_default_after_the_wait,
        a_flex_call_set_to_never_fall_back_waits_for_flex,
    ],
);
