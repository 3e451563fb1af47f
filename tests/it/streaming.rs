//! Streaming end to end (AGN-034 §4.7), on both backends: the model is called with
//! `stream: true`, its text crosses the queue as live events, and clients see it as NDJSON
//! lines of the synchronous endpoint and as SSE `delta` events, before the result.

use std::time::{Duration, Instant};

use aptix_worker::fake_llm::{FakeOptions, Reply};
use futures_util::StreamExt as _;
use serde_json::{Value, json};

use crate::app::{App, AppOptions, Backend, spawn};

pub(super) async fn app(
    backend: Backend,
    fake: FakeOptions,
    env: Vec<(&'static str, String)>,
) -> App {
    spawn(AppOptions {
        backend,
        fake,
        extra_env: env,
        ..AppOptions::default()
    })
    .await
}

pub(super) fn pieces(n: usize, delay_ms: u64) -> FakeOptions {
    FakeOptions {
        stream_pieces: n,
        stream_delay: Duration::from_millis(delay_ms),
        ..FakeOptions::default()
    }
}

pub(super) fn streaming_turn(session: &str, turn: &str, instruction: &str) -> String {
    json!({"sessionId": session, "turnId": turn, "instruction": instruction, "streaming": true})
        .to_string()
}

/// The NDJSON lines of a streamed synchronous answer, each with when it arrived.
pub(super) async fn stream_lines(app: &App, body: String) -> Vec<(Instant, Value)> {
    stream_lines_over(app, &app.http, body).await
}

/// [`stream_lines`] with the client `http`.
pub(super) async fn stream_lines_over(
    app: &App,
    http: &reqwest::Client,
    body: String,
) -> Vec<(Instant, Value)> {
    let resp = http
        .post(format!("{}/api/ai/agent/execute", app.base))
        .bearer_auth("tok-a")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "application/x-ndjson"
    );
    let mut bytes = resp.bytes_stream();
    let (mut buffer, mut lines) = (Vec::new(), Vec::new());
    while let Some(chunk) = bytes.next().await {
        buffer.extend_from_slice(&chunk.unwrap());
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            lines.push((Instant::now(), serde_json::from_slice(&line).unwrap()));
        }
    }
    assert!(buffer.is_empty(), "the body ends with a complete line");
    for (_, l) in &lines {
        app.matches_schema(
            &json!("#/components/schemas/StreamLine"),
            "an NDJSON line",
            l,
        );
    }
    lines
}

/// A line's keys, sorted.
pub(super) fn keys(line: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = line
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

pub(super) fn deltas(lines: &[(Instant, Value)]) -> Vec<&Value> {
    lines
        .iter()
        .map(|(_, l)| l)
        .filter(|l| l["kind"] == "delta")
        .collect()
}

pub(super) fn answer_of(lines: &[(Instant, Value)]) -> String {
    let (_, last) = lines.last().expect("a final line");
    assert_eq!(
        (&last["kind"], &last["index"]),
        (&json!("final"), &json!(99999))
    );
    last["final"]["result"]["primaryOutputText"]
        .as_str()
        .unwrap_or_else(|| panic!("a final answer: {last}"))
        .to_string()
}

pub(super) async fn deltas_come_in_order_before_the_final_line_and_make_up_the_answer(
    backend: Backend,
) {
    // A reply queue for every session, so the synchronous call's session has one to look at.
    let every = vec![("APTIX_REPLY_QUEUES", "every-session".to_string())];
    let app = app(backend, pieces(6, 10), every).await;
    let lines = stream_lines(&app, streaming_turn("s", "t", "tell me")).await;
    let shown = deltas(&lines);
    assert!(shown.len() >= 2, "{lines:?}");
    for (i, d) in shown.iter().enumerate() {
        assert_eq!(
            keys(d),
            ["index", "kind", "text"],
            "exactly these keys: {d}"
        );
        assert_eq!(d["index"], i as u64, "indices from 0, in order");
    }
    let text: String = shown.iter().map(|d| d["text"].as_str().unwrap()).collect();
    assert_eq!(text, answer_of(&lines), "the deltas make up the answer");
    assert_eq!(
        app.fake.requests()[0]["stream"],
        true,
        "the model was asked to stream"
    );
    // The durable reply queue got the result, and nothing of the stream.
    let mut replies = app
        .broker
        .subscribe_replies(&crate::support::sid_a("s"))
        .await
        .unwrap();
    let result: Value = serde_json::from_slice(
        &tokio::time::timeout(Duration::from_secs(5), replies.recv())
            .await
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(result["status"], "completed", "{result}");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), replies.recv())
            .await
            .is_err(),
        "a live event reached the reply queue"
    );
}

pub(super) async fn the_first_delta_reaches_the_client_while_the_model_still_streams(
    backend: Backend,
) {
    // Eight text pieces 250 ms apart: the model takes over two seconds to finish.
    let app = app(backend, pieces(8, 250), Vec::new()).await;
    let lines = stream_lines(&app, streaming_turn("s", "t", "slowly")).await;
    came_while_written(&lines);
}

/// The first delta of a model writing for over two seconds arrived more than a second before
/// the last line: the lines were not held back until the answer was whole.
pub(super) fn came_while_written(lines: &[(Instant, Value)]) {
    let first = lines.iter().find(|(_, l)| l["kind"] == "delta").unwrap().0;
    let last = lines.last().unwrap().0;
    assert!(
        last.duration_since(first) > Duration::from_millis(1000),
        "the first delta came {:?} before the end: it waited for the whole answer",
        last.duration_since(first)
    );
}

pub(super) async fn a_broken_stream_is_retried_and_the_answer_has_its_text_once(backend: Backend) {
    let app = app(
        backend,
        pieces(6, 20),
        vec![("APTIX_LLM_MAX_RETRIES", "1".into())],
    )
    .await;
    let text = "Alpha bravo charlie delta echo foxtrot";
    app.fake
        .push([Reply::BrokenStream(text.into()), Reply::Text(text.into())]);
    let lines = stream_lines(&app, streaming_turn("s", "t", "again")).await;
    assert_eq!(
        answer_of(&lines),
        text,
        "the final answer holds the text once"
    );
    let restart = lines
        .iter()
        .rposition(|(_, l)| l["kind"] == "progress")
        .expect("a progress line tells the client the call restarted");
    let progress = &lines[restart].1;
    assert_eq!(keys(progress), ["index", "kind", "message"], "{progress}");
    let before: String = deltas(&lines[..restart])
        .iter()
        .map(|d| d["text"].as_str().unwrap())
        .collect();
    let after: String = deltas(&lines[restart..])
        .iter()
        .map(|d| d["text"].as_str().unwrap())
        .collect();
    assert!(
        !before.is_empty() && text.starts_with(&before),
        "{before:?}"
    );
    assert_eq!(
        after, text,
        "after the restart, the deltas end with the text exactly once"
    );
    let indices: Vec<u64> = lines[..lines.len() - 1]
        .iter()
        .map(|(_, l)| l["index"].as_u64().unwrap())
        .collect();
    assert!(indices.windows(2).all(|w| w[0] < w[1]), "{indices:?}");
    assert_eq!(app.fake.requests().len(), 2);
}

pub(super) async fn a_turn_run_again_after_a_failed_run_keeps_its_indices_rising(backend: Backend) {
    // No retries inside the call: the broken stream fails the run, and the job runs again.
    let app = app(
        backend,
        pieces(6, 20),
        vec![("APTIX_LLM_MAX_RETRIES", "0".into())],
    )
    .await;
    let text = "One two three four five six seven";
    app.fake
        .push([Reply::BrokenStream(text.into()), Reply::Text(text.into())]);
    let lines = stream_lines(&app, streaming_turn("s", "t", "again")).await;
    assert_eq!(answer_of(&lines), text);
    let rerun = lines
        .iter()
        .rposition(|(_, l)| l["kind"] == "progress")
        .expect("a progress line says the turn runs again");
    assert!(
        lines[rerun].1["index"].as_u64().unwrap() >= 1 << 20,
        "{:?}",
        lines[rerun].1
    );
    let after: String = deltas(&lines[rerun..])
        .iter()
        .map(|d| d["text"].as_str().unwrap())
        .collect();
    assert_eq!(after, text);
    let indices: Vec<u64> = lines[..lines.len() - 1]
        .iter()
        .map(|(_, l)| l["index"].as_u64().unwrap())
        .collect();
    assert!(indices.windows(2).all(|w| w[0] < w[1]), "{indices:?}");
}

pub(super) async fn a_client_tool_turn_streams_no_arguments_and_ends_with_its_continuation(
    backend: Backend,
) {
    let app = app(backend, pieces(4, 0), Vec::new()).await;
    let instruction = "#fake:call workspace_read_file {\"path\":\"docs/SECRET-PATH.md\"}";
    let lines = stream_lines(&app, streaming_turn("s", "t", instruction)).await;
    for d in deltas(&lines) {
        assert!(
            !d["text"].as_str().unwrap().contains("SECRET-PATH"),
            "function-call arguments appeared as text: {d}"
        );
    }
    let (_, last) = lines.last().unwrap();
    let response = &last["final"]["result"];
    assert_eq!(response["kind"], "client_tool_continuation", "{last}");
    let call_id = response["toolCalls"][0]["toolCallId"].clone();
    let cont = json!({"sessionId": "s", "turnId": "t", "toolResults": [
        {"toolCallId": call_id, "executionMs": 1, "resultJson": "{\"text\":\"# doc\"}"}]});
    // The continuation's run streams too (the turn asked for streaming): its text reaches a
    // session's SSE subscriber as deltas with indices above the first run's, before the result.
    let (ready, subscribed) = tokio::sync::oneshot::channel();
    let completed = |events: &[(String, String, Value)]| {
        events
            .iter()
            .any(|(kind, _, data)| kind == "turn" && data["status"] == "completed")
    };
    let (events, _) = tokio::join!(sse(&app, "s", None, ready, completed), async {
        subscribed.await.unwrap();
        assert_eq!(app.post(Some("tok-a"), cont.to_string()).await.0, 202);
    });
    let (_, _, result) = events
        .iter()
        .find(|(kind, _, _)| kind == "turn")
        .expect("the result event");
    let answer = result["result"]["result"]["primaryOutputText"]
        .as_str()
        .unwrap();
    let shown: Vec<&Value> = events
        .iter()
        .filter(|(kind, _, _)| kind == "delta")
        .map(|(_, _, data)| data)
        .collect();
    assert!(
        !shown.is_empty(),
        "the continuation streamed nothing: {events:?}"
    );
    assert!(
        shown
            .iter()
            .all(|d| d["index"].as_u64().unwrap() >= aptix_worker::live::RUN_STRIDE),
        "indices go on above the first run's: {shown:?}"
    );
    let text: String = shown.iter().map(|d| d["text"].as_str().unwrap()).collect();
    assert_eq!(text, answer, "the deltas make up the continuation's answer");
}

/// The SSE events of `session` (as tenant A) as `(event, id, data)`, read until `until` says
/// stop or thirty seconds pass.
pub(super) async fn sse(
    app: &App,
    session: &str,
    last_event_id: Option<&str>,
    ready: tokio::sync::oneshot::Sender<()>,
    until: impl Fn(&[(String, String, Value)]) -> bool,
) -> Vec<(String, String, Value)> {
    let at = (app.base.as_str(), Some("tok-a"));
    sse_at(at, session, last_event_id, ready, until).await
}

/// [`sse`] from the front door at `base`, with `token` when one is needed.
pub(crate) async fn sse_at(
    (base, token): (&str, Option<&str>),
    session: &str,
    last_event_id: Option<&str>,
    ready: tokio::sync::oneshot::Sender<()>,
    until: impl Fn(&[(String, String, Value)]) -> bool,
) -> Vec<(String, String, Value)> {
    let mut req = crate::support::http_client().get(format!("{base}/v1/sessions/{session}/events"));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let _ = ready.send(());
    let mut bytes = resp.bytes_stream();
    let (mut buffer, mut events) = (String::new(), Vec::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !until(&events) {
        let Ok(Some(chunk)) = tokio::time::timeout_at(deadline, bytes.next()).await else {
            break;
        };
        buffer.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        while let Some(end) = buffer.find("\n\n") {
            let frame: String = buffer.drain(..end + 2).collect();
            let field = |name: &str| {
                frame
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim_start().to_string())
                    .unwrap_or_default()
            };
            if let Ok(data) = serde_json::from_str(&field("data:")) {
                events.push((field("event:"), field("id:"), data));
            }
        }
    }
    events
}

pub(super) async fn sse_shows_delta_events_before_the_turn_event_and_only_to_their_session(
    backend: Backend,
) {
    let app = app(backend, pieces(5, 20), Vec::new()).await;
    let (ready_a, wait_a) = tokio::sync::oneshot::channel();
    let (ready_b, wait_b) = tokio::sync::oneshot::channel();
    let turn_seen = |e: &[(String, String, Value)]| e.iter().any(|(k, _, _)| k == "turn");
    let (a, b, _) = tokio::join!(
        sse(&app, "sa", None, ready_a, turn_seen),
        // The other session's stream is read for as long (until its own timeout).
        sse(&app, "sb", None, ready_b, |_| false),
        async {
            let _ = (wait_a.await, wait_b.await);
            assert_eq!(
                app.post(Some("tok-a"), streaming_turn("sa", "t", "hi"))
                    .await
                    .0,
                202
            );
        }
    );
    let turn_at = a
        .iter()
        .position(|(k, _, _)| k == "turn")
        .expect("the turn event");
    let shown: Vec<&(String, String, Value)> = a.iter().filter(|(k, _, _)| k == "delta").collect();
    assert!(!shown.is_empty(), "{a:?}");
    // The first text names its model call (and a later one may again, a second on).
    let call = &shown[0].2["call"];
    assert_eq!(
        call,
        &json!({"model": "m", "agentContext": "default", "attempt": 1, "startMs": call["startMs"]}),
        "the first text names its call"
    );
    assert!(call["startMs"].is_u64(), "{call}");
    for (i, (_, id, data)) in shown.iter().enumerate() {
        let mut expected =
            json!({"sessionId": "sa", "turnId": "t", "index": data["index"], "text": data["text"]});
        if i == 0 || data.get("call").is_some() {
            expected["call"] = call.clone();
        }
        assert_eq!(data, &expected, "exactly these keys");
        assert_eq!(id, &format!("t:{}", data["index"]));
        app.matches_schema(
            &json!("#/components/schemas/SessionDeltaEvent"),
            "a delta event",
            data,
        );
        if i > 0 {
            assert!(
                data["index"].as_u64() > shown[i - 1].2["index"].as_u64(),
                "indices rise"
            );
        }
    }
    assert!(a.iter().rposition(|(k, _, _)| k == "delta").unwrap() < turn_at);
    let text: String = shown
        .iter()
        .map(|(_, _, d)| d["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, a[turn_at].2["result"]["result"]["primaryOutputText"]);
    assert!(b.is_empty(), "another session's subscriber got {b:?}");

    // Reconnecting after the turn settled, with the id of its first delta: the deltas after
    // it (kept by the process), then the result, at once.
    let (ready, _) = tokio::sync::oneshot::channel();
    let again = sse(&app, "sa", Some(&shown[0].1), ready, turn_seen).await;
    let kinds: Vec<&str> = again.iter().map(|(k, _, _)| k.as_str()).collect();
    let mut expected = vec!["delta"; shown.len() - 1];
    expected.push("turn");
    assert_eq!(kinds, expected, "{again:?}");
    let replayed: Vec<&Value> = again
        .iter()
        .take(shown.len() - 1)
        .map(|(_, _, d)| d)
        .collect();
    let originals: Vec<&Value> = shown.iter().skip(1).map(|(_, _, d)| d).collect();
    assert_eq!(replayed, originals);
}

pub(super) async fn a_server_without_streaming_gets_a_clear_error_or_plain_calls(backend: Backend) {
    let refusing = FakeOptions {
        no_streaming: true,
        ..FakeOptions::default()
    };
    let app_on = app(backend, refusing.clone(), Vec::new()).await;
    let lines = stream_lines(&app_on, streaming_turn("s", "t", "hi")).await;
    let (_, last) = lines.last().unwrap();
    let error = &last["final"]["errors"][0];
    assert_eq!(error["errorCode"], "LLM_REJECTED", "{last}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("APTIX_LLM_STREAMING=false"),
        "{error}"
    );
    let app_off = app(
        backend,
        refusing,
        vec![("APTIX_LLM_STREAMING", "false".into())],
    )
    .await;
    let lines = stream_lines(&app_off, streaming_turn("s", "t", "hi")).await;
    assert_eq!(lines.len(), 1, "no deltas, the final line: {lines:?}");
    assert!(answer_of(&lines).starts_with("Fake answer"));
    assert!(app_off.fake.requests()[0].get("stream").is_none());
}

pub(super) async fn an_sse_client_that_reconnects_mid_turn_gets_the_text_it_missed(
    backend: Backend,
) {
    let app = app(backend, pieces(10, 150), Vec::new()).await;
    let (ready, wait) = tokio::sync::oneshot::channel();
    let two_deltas =
        |e: &[(String, String, Value)]| e.iter().filter(|(k, _, _)| k == "delta").count() >= 2;
    let (before, _) = tokio::join!(sse(&app, "rc", None, ready, two_deltas), async {
        let _ = wait.await;
        assert_eq!(
            app.post(Some("tok-a"), streaming_turn("rc", "t", "long"))
                .await
                .0,
            202
        );
    });
    // Disconnected while the model goes on writing: reconnect once the turn kept more live
    // events than this client saw (text it missed), as the store holds them for any front door.
    let seen = before.len();
    let (sid, tid) = (
        crate::support::sid_a("rc"),
        aptix_worker::contract::TurnId::parse("t").unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.store.kept_live(&sid, &tid).await.unwrap().len() <= seen {
        assert!(Instant::now() < deadline, "the model wrote nothing more");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let last_id = before.last().unwrap().1.clone();
    let (ready, _) = tokio::sync::oneshot::channel();
    let turn_seen = |e: &[(String, String, Value)]| e.iter().any(|(k, _, _)| k == "turn");
    let after = sse(&app, "rc", Some(&last_id), ready, turn_seen).await;
    let all: Vec<&Value> = before
        .iter()
        .chain(after.iter())
        .filter(|(k, _, _)| k == "delta")
        .map(|(_, _, d)| d)
        .collect();
    let indices: Vec<u64> = all.iter().map(|d| d["index"].as_u64().unwrap()).collect();
    assert_eq!(
        indices,
        (0..indices.len() as u64).collect::<Vec<_>>(),
        "nothing missed, nothing twice"
    );
    let text: String = all.iter().map(|d| d["text"].as_str().unwrap()).collect();
    let (_, _, result) = after.iter().find(|(k, _, _)| k == "turn").unwrap();
    assert_eq!(text, result["result"]["result"]["primaryOutputText"]);
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [
        deltas_come_in_order_before_the_final_line_and_make_up_the_answer,
        the_first_delta_reaches_the_client_while_the_model_still_streams,
        a_broken_stream_is_retried_and_the_answer_has_its_text_once,
        a_turn_run_again_after_a_failed_run_keeps_its_indices_rising,
        a_client_tool_turn_streams_no_arguments_and_ends_with_its_continuation,
        sse_shows_delta_events_before_the_turn_event_and_only_to_their_session,
        a_server_without_streaming_gets_a_clear_error_or_plain_calls,
        an_sse_client_that_reconnects_mid_turn_gets_the_text_it_missed,
    ],
);
