//! The API's edges: the OpenAPI document against every route, indexed documents reaching the model,
//! a broker that is down, a long-poll that ends with its wait.

use crate::app::{code, spawn_app};
use aptix_worker::catalog::ModeCatalog;
use aptix_worker::config::BatchLimits;
use aptix_worker::contract::RequestLimits;
use aptix_worker::fake_llm::Reply;
use aptix_worker::frontdoor::FrontDoor;
use aptix_worker::frontdoor::http::{HttpParts, HttpState, openapi, router, serve};
use aptix_worker::metrics::Metrics;
use aptix_worker::rag::ChunkOptions;
use aptix_worker::store::SessionStore;
use aptix_worker::tokens::ApiTokens;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn the_openapi_document_covers_every_route() {
    let app = spawn_app(RequestLimits::default()).await;
    let expected = [
        ("post", "/v1/turns"),
        ("get", "/v1/turns"),
        ("get", "/v1/sessions/{sessionId}/turns/{turnId}"),
        ("get", "/v1/sessions/{sessionId}"),
        ("get", "/v1/sessions/{sessionId}/events"),
        ("post", "/v1/batches"),
        ("get", "/v1/batches/{batchId}"),
        ("get", "/v1/batches/{batchId}/results"),
        ("post", "/api/ai/agent/execute"),
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/metrics"),
        ("get", "/openapi.json"),
        ("post", "/v1/index"),
        ("post", "/v1/sessions/{sessionId}/turns/{turnId}/cancel"),
        ("post", "/v1/batches/{batchId}/cancel"),
        ("post", "/v1/batches/{batchId}/retry"),
        ("get", "/v1/tenant/usage"),
        ("get", "/v1/sessions/{sessionId}/turns/{turnId}/inspect"),
        ("get", "/v1/batches"),
        ("get", "/v1/admin/system"),
        ("get", "/v1/admin/dead-letters"),
        ("post", "/v1/admin/dead-letters/requeue"),
        ("post", "/v1/admin/dead-letters/discard"),
        ("get", "/v1/admin/webhooks/dead"),
        ("post", "/v1/admin/webhooks/dead/replay"),
    ];
    let paths = app.api["paths"].as_object().unwrap();
    let mut documented: Vec<(String, String)> = paths
        .iter()
        .flat_map(|(p, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.clone(), p.clone()))
        })
        .collect();
    documented.sort();
    let mut wanted: Vec<(String, String)> = expected
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    wanted.sort();
    assert_eq!(documented, wanted);
    // The served document is the one the code generates, and every reference resolves.
    assert_eq!(app.api, openapi());
    let text = app.api.to_string();
    let schemas = app.api["components"]["schemas"].as_object().unwrap();
    for r in text.split("#/components/schemas/").skip(1) {
        let name: String = r
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        assert!(schemas.contains_key(&name), "dangling $ref {name}");
    }
    // Every documented route is really routed (no 404/405 from the router itself).
    for (method, path) in expected {
        let concrete = path
            .replace("{sessionId}", "s")
            .replace("{turnId}", "t")
            .replace("{batchId}", "b");
        let req = match method {
            "post" => app.http.post(format!("{}{concrete}", app.base)).body("{}"),
            _ => app.http.get(format!("{}{concrete}", app.base)),
        };
        let resp = req
            .bearer_auth("tok-a")
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if let Ok(resp) = resp {
            assert_ne!(resp.status().as_u16(), 405, "{method} {path}");
            let is_router_404 =
                resp.status().as_u16() == 404 && resp.headers().get("content-type").is_none();
            assert!(!is_router_404, "{method} {path} is not routed");
        }
    }
}

#[tokio::test]
async fn indexed_documents_reach_the_model_through_the_scope() {
    let app = spawn_app(RequestLimits::default()).await;
    let leases = "# AGN-202 Session leases\n\nOne turn per session at a time.\n\n## Decision\nWorkers hold a lease with a fencing token.";
    let queues = "# AGN-201 Queue retries\n\n## Decision\nRetries go through delay queues; the lease is not involved.";
    let body = json!({"repo": "aptix", "tags": ["design"], "files": [
        {"path": "docs/AGN-202.md", "contents": leases},
        {"path": "docs/AGN-201.md", "contents": queues},
        {"path": "src/main.rs", "contents": "fn main() { let lease = 1; }"},
    ]});
    let (status, report) = app
        .post_to(Some("tok-a"), "/v1/index", body.to_string())
        .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(
        (
            report["result"]["indexed"].as_u64(),
            report["result"]["chunks"].as_u64()
        ),
        (Some(3), Some(5))
    );
    // Bad input is a 400 naming the field; no token is a 401.
    let (status, body) = app
        .post_to(
            Some("tok-a"),
            "/v1/index",
            json!({"repo": "bad repo", "files": [{"path": "../x.md", "contents": ""}]}).to_string(),
        )
        .await;
    assert_eq!(status, 400);
    let codes: Vec<&str> = body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["errorCode"].as_str().unwrap())
        .collect();
    assert_eq!(codes, vec!["INVALID_ID", "INVALID_PATH"]);
    let (status, _) = app
        .post_to(None, "/v1/index", json!({"repo": "r"}).to_string())
        .await;
    assert_eq!(status, 401);

    app.fake.push([Reply::Text("seen".into())]);
    let turn = json!({"sessionId": "s", "turnId": "t", "instruction": "explain the session lease",
        "ragScope": {"conditions": [
            {"key": "docId", "operator": "==", "values": ["AGN-202"]},
            {"key": "tags", "operator": "contains", "values": ["design"]},
            {"key": "color", "operator": "==", "values": ["blue"]}]}});
    let (status, accepted) = app.post(Some("tok-a"), turn.to_string()).await;
    assert_eq!(status, 202);
    assert_eq!(accepted["warnings"][0]["errorCode"], "UNKNOWN_RAG_KEY");
    let (_, done) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t?wait=10")
        .await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    let reqs = app.fake.requests();
    let user = reqs[0]["input"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["role"] == "user")
        .unwrap()
        .clone();
    let block = user["content"][1]["text"].as_str().unwrap();
    let ids: Vec<String> = aptix_worker::rag::chunk_file(
        "aptix",
        "docs/AGN-202.md",
        leases,
        &["design".into()],
        ChunkOptions::default(),
    )
    .unwrap()
    .into_iter()
    .map(|c| c.id)
    .collect();
    assert_eq!(
        block,
        format!(
            "[CONTEXT]\n\n=== CHUNK 1 ===\nId: {}\nPath: docs/AGN-202.md\nLines: 1-3\nLanguage: markdown\n```markdown\n# AGN-202 Session leases\n\nOne turn per session at a time.\n```\n\n=== CHUNK 2 ===\nId: {}\nPath: docs/AGN-202.md\nLines: 5-6\nLanguage: markdown\n```markdown\n## Decision\nWorkers hold a lease with a fencing token.\n```\n\n",
            ids[0], ids[1]
        ),
        "only the scoped document; the chunk with the rarer term (session, twice) first"
    );
    // Another tenant's turns see nothing of tenant a's index.
    app.fake.push([Reply::Text("nothing".into())]);
    app.post(
        Some("tok-b"),
        json!({"sessionId": "sb", "turnId": "t", "instruction": "explain the lease"}).to_string(),
    )
    .await;
    app.get(Some("tok-b"), "/v1/sessions/sb/turns/t?wait=10")
        .await;
    let reqs = app.fake.requests();
    let user = reqs[1]["input"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["role"] == "user")
        .unwrap()
        .clone();
    assert_eq!(
        user["content"].as_array().unwrap().len(),
        1,
        "no [CONTEXT] for tenant b: {user}"
    );
}

#[tokio::test]
async fn a_broker_that_is_down_is_503_and_nothing_is_accepted() {
    use aptix_worker::queue::{RabbitBroker, Topology};
    use aptix_worker::store::MemoryStore;
    // Nothing listens on port 1: every publish and readiness check fails.
    let broker = Arc::new(RabbitBroker::new(
        "amqp://guest:guest@127.0.0.1:1/%2f",
        Topology::new("aptix-test-down"),
        "aptix-test-down",
    ));
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let state = HttpState::new(HttpParts {
        door: FrontDoor::new(store.clone(), broker.clone(), RequestLimits::default()),
        store: store.clone(),
        broker,
        catalog: Arc::new(ModeCatalog::builtin()),
        tokens: ApiTokens::default(),
        limits: RequestLimits::default(),
        batch_limits: BatchLimits::default(),
        metrics: Arc::new(Metrics::new()),
        index: Arc::new(aptix_worker::rag::MemoryIndex::new()),
        chunk_options: ChunkOptions::default(),
        console: false,
        read_timeout: aptix_worker::frontdoor::http::HEADER_READ_TIMEOUT,
        mcp: None,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn({
        let s = stop.clone();
        async move { serve(listener, router(state), s).await }
    });
    let http = crate::support::http_client();
    let resp = http
        .post(format!("{base}/v1/turns"))
        .body(json!({"sessionId": "s", "turnId": "t", "instruction": "hi"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    // A client is told when to try again, and that trying again is safe.
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(code(&body), "SERVICE_UNAVAILABLE");
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("nothing was accepted"),
        "{body}"
    );
    // Nothing was accepted, so nothing is left behind waiting for a job, and the session
    // latched no contexts: the next first turn may name others.
    let sid = aptix_worker::contract::SessionId::parse("s").unwrap();
    assert!(store.list_turns(&sid).await.unwrap().is_empty());
    assert_eq!(store.latched_contexts(&sid).await.unwrap(), None);
    // A read that needs the broker (a session's events) is a 503 with Retry-After too, whose
    // message does not talk of accepting anything.
    let resp = http
        .get(format!("{base}/v1/sessions/s/events"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body["errors"][0]["message"], "the service is temporarily unavailable; try again",
        "{body}"
    );
    let resp = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("message broker:"),
        "{body}"
    );
    // A batch: each line says it was not enqueued, and the stored batch agrees.
    let lines = [
        json!({"customId": "a", "request": {"instruction": "x"}}).to_string(),
        json!({"customId": "b", "request": {"instruction": "y"}}).to_string(),
    ];
    let resp = http
        .post(format!("{base}/v1/batches"))
        .body(lines.join("\n"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["result"]["accepted"], 0, "{body}");
    let errors = body["result"]["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2);
    assert!(
        errors
            .iter()
            .all(|e| e["errors"][0]["errorCode"] == "SERVICE_UNAVAILABLE")
    );
    let id = body["result"]["batchId"].as_str().unwrap();
    let progress: Value = http
        .get(format!("{base}/v1/batches/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            progress["result"]["rejected"].as_u64(),
            progress["result"]["queued"].as_u64()
        ),
        (Some(2), Some(0))
    );
    let resp = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200, "alive even when not ready");
    stop.cancel();
}

#[tokio::test]
async fn a_long_poll_ends_when_its_wait_does() {
    let app = spawn_app(RequestLimits::default()).await;
    app.fake.push([Reply::Delay(
        Duration::from_secs(2),
        Box::new(Reply::Text("slow".into())),
    )]);
    app.post(
        Some("tok-a"),
        json!({"sessionId": "s", "turnId": "t", "instruction": "slow"}).to_string(),
    )
    .await;
    let started = std::time::Instant::now();
    let (status, body) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t?wait=0.5")
        .await;
    let waited = started.elapsed();
    assert_eq!(status, 200);
    assert!(
        matches!(
            body["result"]["status"].as_str(),
            Some("queued" | "running")
        ),
        "{body}"
    );
    assert!(
        waited >= Duration::from_millis(450) && waited < Duration::from_millis(1500),
        "{waited:?}"
    );
    assert!(body["result"].get("result").is_none(), "no result yet");
    let (_, body) = app
        .get(Some("tok-a"), "/v1/sessions/s/turns/t?wait=10")
        .await;
    assert_eq!(body["result"]["status"], "completed");
}
