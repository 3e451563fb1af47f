//! The HTTP API on port 0 over real RabbitMQ and Redis with an in-process worker.

use std::sync::Arc;
use std::time::Duration;

use aptix_worker::catalog::ModeCatalog;
use aptix_worker::config::ApiTokens;
use aptix_worker::contract::RequestLimits;
use aptix_worker::fake_llm::{FakeLlm, FakeOptions, Reply};
use aptix_worker::frontdoor::FrontDoor;
use aptix_worker::frontdoor::http::{HttpState, serve};
use aptix_worker::llm::LlmClient;
use aptix_worker::pipeline::{Pipeline, PipelineSettings};
use aptix_worker::store::SessionStore;
use aptix_worker::worker::{Worker, WorkerSettings};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::{RabbitGuard, RedisGuard, rabbit, redis_store, schema};

struct App {
    base: String,
    http: reqwest::Client,
    fake: FakeLlm,
    store: Arc<dyn SessionStore>,
    stop: CancellationToken,
    _rabbit: RabbitGuard,
    _redis: RedisGuard,
}

impl Drop for App {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn spawn_app(limits: RequestLimits) -> App {
    let fake = FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        FakeOptions::default(),
        Some(schema()),
    )
    .await
    .unwrap();
    let redis = redis_store().await;
    let store: Arc<dyn SessionStore> = redis.store.clone();
    let rabbit = rabbit().await;
    let catalog = Arc::new(ModeCatalog::builtin());
    let llm = LlmClient::new(
        &fake.base_url(),
        None,
        Duration::from_secs(2),
        Duration::from_secs(30),
        0,
    )
    .unwrap();
    let pipeline = Pipeline::new(
        store.clone(),
        catalog.clone(),
        llm,
        PipelineSettings::new("m"),
    )
    .unwrap();
    let stop = CancellationToken::new();
    let worker = Worker::new(
        rabbit.broker.clone(),
        pipeline,
        rabbit.topology.clone(),
        WorkerSettings::default(),
    );
    worker.spawn(stop.clone());
    let state = HttpState {
        door: FrontDoor::new(store.clone(), rabbit.broker.clone(), limits),
        store: store.clone(),
        broker: rabbit.broker.clone(),
        catalog,
        tokens: ApiTokens::new([
            ("tok-a".to_string(), "tenant-a".to_string()),
            ("tok-b".to_string(), "tenant-b".to_string()),
        ]),
        limits,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn({
        let s = stop.clone();
        async move { serve(listener, state, s).await }
    });
    App {
        base,
        http: reqwest::Client::new(),
        fake,
        store,
        stop,
        _rabbit: rabbit,
        _redis: redis,
    }
}

impl App {
    async fn post(&self, token: Option<&str>, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let mut req = self.http.post(format!("{}/v1/turns", self.base)).body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap())
    }

    async fn get(&self, token: Option<&str>, path: &str) -> (u16, Value) {
        let mut req = self.http.get(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap())
    }
}

fn code(v: &Value) -> &str {
    v["errors"][0]["errorCode"].as_str().unwrap_or("")
}

#[tokio::test]
async fn a_turn_is_accepted_then_long_polled_to_completion() {
    let app = spawn_app(RequestLimits::default()).await;
    app.fake.push([Reply::Text("Done.".into())]);
    let (status, body) = app
        .post(
            Some("tok-a"),
            json!({"sessionId": "s", "turnId": "t", "instruction": "hi", "conversationId": "old"})
                .to_string(),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["result"]["status"], "queued");
    assert_eq!(body["warnings"][0]["errorCode"], "UNKNOWN_FIELD");
    let (status, body) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t?wait=10")
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["result"]["status"], "completed", "{body}");
    assert_eq!(body["result"]["attempts"], 1);
    assert_eq!(
        body["result"]["result"]["result"]["primaryOutputText"],
        "Done."
    );
    // The same turn again: nothing new is run, its status comes back.
    let (status, again) = app
        .post(
            Some("tok-a"),
            json!({"sessionId": "s", "turnId": "t", "instruction": "hi", "conversationId": "old"})
                .to_string(),
        )
        .await;
    assert_eq!(
        (status, again["result"]["status"].as_str()),
        (202, Some("completed"))
    );
    assert_eq!(app.fake.requests().len(), 1);
}

#[tokio::test]
async fn invalid_requests_are_400_with_every_violation_and_nothing_enqueued() {
    let app = spawn_app(RequestLimits::default()).await;
    let (status, body) = app
        .post(
            Some("tok-a"),
            json!({"sessionId": "bad id", "mode": "x"}).to_string(),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(body["successful"], false);
    assert!(body.get("result").is_none());
    let codes: Vec<&str> = body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["errorCode"].as_str().unwrap())
        .collect();
    for c in [
        "FORBIDDEN_FIELD",
        "INVALID_ID",
        "MISSING_FIELD",
        "EMPTY_TURN",
    ] {
        assert!(codes.contains(&c), "{codes:?}");
    }
    let (status, body) = app.post(Some("tok-a"), "not json").await;
    assert_eq!((status, code(&body)), (400, "MALFORMED_JSON"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(app.fake.requests().is_empty(), "nothing ran");
}

#[tokio::test]
async fn an_oversized_body_is_413() {
    let limits = RequestLimits {
        max_body_bytes: 200,
        ..RequestLimits::default()
    };
    let app = spawn_app(limits).await;
    let (status, body) = app
        .post(
            Some("tok-a"),
            json!({"sessionId": "s", "turnId": "t", "instruction": "x".repeat(500)}).to_string(),
        )
        .await;
    assert_eq!((status, code(&body)), (413, "PAYLOAD_TOO_LARGE"));
}

#[tokio::test]
async fn conflicts_and_wrong_continuations() {
    let app = spawn_app(RequestLimits::default()).await;
    app.fake.push([Reply::Text("a".into())]);
    app.post(
        Some("tok-a"),
        json!({"sessionId": "s", "turnId": "t", "instruction": "one"}).to_string(),
    )
    .await;
    let (status, body) = app
        .post(
            Some("tok-a"),
            json!({"sessionId": "s", "turnId": "t", "instruction": "two"}).to_string(),
        )
        .await;
    assert_eq!((status, code(&body)), (409, "TURN_CONFLICT"));
    app.get(Some("tok-a"), "/v1/sessions/s/turns/t?wait=10")
        .await;
    let cont = json!({"sessionId": "s", "turnId": "t", "toolResults": [{"toolCallId": "c", "executionMs": 1, "resultJson": "{}"}]});
    let (status, body) = app.post(Some("tok-a"), cont.to_string()).await;
    assert_eq!((status, code(&body)), (409, "TURN_NOT_AWAITING_TOOLS"));
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("is completed")
    );
    let cont = json!({"sessionId": "s", "turnId": "nope", "toolResults": [{"toolCallId": "c", "executionMs": 1, "resultJson": "{}"}]});
    let (status, body) = app.post(Some("tok-a"), cont.to_string()).await;
    assert_eq!((status, code(&body)), (404, "TURN_NOT_FOUND"));
}

#[tokio::test]
async fn auth_missing_wrong_and_other_tenant() {
    let app = spawn_app(RequestLimits::default()).await;
    let turn = json!({"sessionId": "s", "turnId": "t", "instruction": "hi"}).to_string();
    let (status, body) = app.post(None, turn.clone()).await;
    assert_eq!((status, code(&body)), (401, "UNAUTHORIZED"));
    let (status, _) = app.post(Some("nope"), turn.clone()).await;
    assert_eq!(status, 401);
    let (status, _) = app.post(Some("tok-a"), turn.clone()).await;
    assert_eq!(status, 202);
    app.get(Some("tok-a"), "/v1/sessions/s/turns/t?wait=10")
        .await;
    // Another tenant sees the session exactly as if it did not exist.
    let (s1, mut other) = app.get(Some("tok-b"), "/v1/sessions/s/turns/t").await;
    let (s2, mut absent) = app.get(Some("tok-b"), "/v1/sessions/zz/turns/t").await;
    assert_eq!((s1, s2), (404, 404));
    for v in [&mut other, &mut absent] {
        v.as_object_mut().unwrap().remove("resultId");
        v["errors"][0]["message"] = json!("");
    }
    assert_eq!(other, absent);
    let (status, _) = app.get(Some("tok-b"), "/v1/sessions/s").await;
    assert_eq!(status, 404);
    let (status, body) = app
        .post(
            Some("tok-b"),
            json!({"sessionId": "s", "turnId": "t9", "instruction": "hijack"}).to_string(),
        )
        .await;
    assert_eq!((status, code(&body)), (404, "TURN_NOT_FOUND"));
    // A turn id that exists only in another session is 404 too.
    let (status, _) = app.get(Some("tok-a"), "/v1/sessions/s2/turns/t").await;
    assert_eq!(status, 404);
    let (status, _) = app.get(None, "/healthz").await;
    assert_eq!(status, 200, "health needs no token");
}

#[tokio::test]
async fn the_session_view_shows_mode_history_and_turns() {
    let app = spawn_app(RequestLimits::default()).await;
    app.fake.push([
        Reply::Calls(vec![(
            "agent_change_mode".into(),
            json!({"mode": "ddr_authoring", "branch": false, "reason": "DDR"}),
        )]),
        Reply::Text("switched".into()),
    ]);
    app.post(
        Some("tok-a"),
        json!({"sessionId": "s", "turnId": "t1", "instruction": "switch"}).to_string(),
    )
    .await;
    app.get(Some("tok-a"), "/v1/sessions/s/turns/t1?wait=10")
        .await;
    let (status, body) = app.get(Some("tok-a"), "/v1/sessions/s").await;
    assert_eq!(status, 200);
    let r = &body["result"];
    assert_eq!(
        (
            r["sessionId"].as_str(),
            r["modeKey"].as_str(),
            r["modeDisplayName"].as_str()
        ),
        (Some("s"), Some("ddr_authoring"), Some("DDR Authoring"))
    );
    let h = &r["modeHistory"][0];
    assert_eq!(
        (
            h["previousMode"].as_str(),
            h["newMode"].as_str(),
            h["reason"].as_str(),
            h["turnId"].as_str()
        ),
        (
            Some("general"),
            Some("ddr_authoring"),
            Some("DDR"),
            Some("t1")
        )
    );
    assert!(h["timestamp"].as_str().unwrap().ends_with('Z'));
    assert_eq!(r["turns"], json!([{"turnId": "t1", "status": "completed"}]));
    let (status, body) = app.get(None, "/readyz").await;
    assert_eq!(
        (status, body["result"]["status"].as_str()),
        (200, Some("ready"))
    );
    assert!(
        app.store
            .owner(&aptix_worker::contract::SessionId::parse("s").unwrap())
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn the_synchronous_endpoint_answers_like_the_original() {
    let app = spawn_app(RequestLimits::default()).await;
    app.fake.push([
        Reply::Text("sync answer".into()),
        Reply::Text("streamed".into()),
    ]);
    let url = format!("{}/api/ai/agent/execute", app.base);
    let resp = app
        .http
        .post(&url)
        .bearer_auth("tok-a")
        .body(json!({"SessionId": "s", "TurnId": "t1", "Instruction": "hi"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["successful"], true, "{body}");
    assert_eq!(body["result"]["kind"], "final");
    assert_eq!(body["result"]["primaryOutputText"], "sync answer");
    // invalid: still 200, a failed InvokeResult
    let resp = app
        .http
        .post(&url)
        .bearer_auth("tok-a")
        .body(json!({"sessionId": "s"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["successful"], false);
    assert!(body.get("result").is_none());
    // no token: 401
    let resp = app.http.post(&url).body("{}").send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    // streaming: NDJSON whose last line is the final envelope
    let resp = app.http.post(&url).bearer_auth("tok-a").body(json!({"sessionId": "s", "turnId": "t2", "instruction": "stream it", "streaming": true}).to_string()).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let text = resp.text().await.unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(
        (last["kind"].as_str(), last["index"].as_u64()),
        (Some("final"), Some(99999))
    );
    assert_eq!(last["final"]["result"]["primaryOutputText"], "streamed");
}

#[tokio::test]
async fn every_sse_subscriber_gets_every_event() {
    let app = spawn_app(RequestLimits::default()).await;
    let url = format!("{}/v1/sessions/s/events", app.base);
    let mut streams = Vec::new();
    for _ in 0..2 {
        let resp = app
            .http
            .get(&url)
            .bearer_auth("tok-a")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        streams.push(resp);
    }
    // Another tenant cannot listen in.
    let resp = app
        .http
        .get(&url)
        .bearer_auth("tok-b")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    app.fake.push([Reply::Text("to both".into())]);
    app.post(
        Some("tok-a"),
        json!({"sessionId": "s", "turnId": "t", "instruction": "hi"}).to_string(),
    )
    .await;
    for resp in streams.iter_mut() {
        let mut seen = String::new();
        let got = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(chunk) = resp.chunk().await.unwrap() {
                seen.push_str(&String::from_utf8_lossy(&chunk));
                if seen.contains("\n\n") && seen.contains("event: turn") {
                    return;
                }
            }
        })
        .await;
        assert!(got.is_ok(), "no event; saw {seen:?}");
        assert!(seen.contains("event: turn\n"), "{seen}");
        assert!(seen.contains("id: t\n"), "{seen}");
        let data = seen.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
        let view: Value = serde_json::from_str(data).unwrap();
        assert_eq!(view["status"], "completed");
    }
}
