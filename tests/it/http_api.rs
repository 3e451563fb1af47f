//! The HTTP API on port 0 over real RabbitMQ and Redis with an in-process worker.

use std::sync::Arc;
use std::time::Duration;

use aptix_worker::catalog::ModeCatalog;
use aptix_worker::config::BatchLimits;
use aptix_worker::contract::RequestLimits;
use aptix_worker::fake_llm::Reply;
use aptix_worker::frontdoor::FrontDoor;
use aptix_worker::frontdoor::http::{HttpState, openapi, router, serve};
use aptix_worker::metrics::Metrics;
use aptix_worker::rag::ChunkOptions;
use aptix_worker::store::SessionStore;
use aptix_worker::tokens::ApiTokens;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::app::{code, spawn_app, spawn_app_with};

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

/// `text` as a Windows editor or PowerShell 5 saves it: behind a UTF-8 byte order mark.
fn with_bom(text: &str) -> Vec<u8> {
    [&b"\xEF\xBB\xBF"[..], text.as_bytes()].concat()
}

#[tokio::test]
async fn a_body_behind_a_byte_order_mark_is_read_on_every_route() {
    let app = spawn_app(RequestLimits::default()).await;
    app.fake
        .push([Reply::Text("one".into()), Reply::Text("two".into())]);
    let turn = json!({"sessionId": "bom", "turnId": "t", "instruction": "hi"}).to_string();
    let (status, body) = app.post(Some("tok-a"), with_bom(&turn)).await;
    assert_eq!(status, 202, "{body}");
    // Only one mark, and only first: a second one is not JSON.
    let (status, body) = app
        .post(
            Some("tok-a"),
            with_bom(&String::from_utf8(with_bom(&turn)).unwrap()),
        )
        .await;
    assert_eq!((status, code(&body)), (400, "MALFORMED_JSON"));
    // The mark is not part of the payload: the same turn without it is the same turn.
    let (status, body) = app.post(Some("tok-a"), turn).await;
    assert_eq!(status, 202, "the same payload, not a conflict: {body}");
    assert_eq!(
        app.settled("tok-a", "bom", "t").await["status"],
        "completed"
    );
    let sync = json!({"sessionId": "bom", "turnId": "t2", "instruction": "again"}).to_string();
    let (status, body) = app
        .post_to(Some("tok-a"), "/api/ai/agent/execute", with_bom(&sync))
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["successful"], true, "{body}");
    let line = json!({"customId": "a", "request": {"instruction": "x"}}).to_string();
    let (status, body) = app
        .post_to(Some("tok-a"), "/v1/batches", with_bom(&line))
        .await;
    assert_eq!(status, 202);
    assert_eq!(body["result"]["accepted"], 1, "{body}");
    let index = json!({"repo": "bom", "files": [{"path": "a.md", "contents": "# A\ntext"}]});
    let (status, body) = app
        .post_to(Some("tok-a"), "/v1/index", with_bom(&index.to_string()))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["indexed"], 1);
}

#[tokio::test]
async fn a_compressed_body_is_415_on_every_route_and_nothing_runs() {
    let app = spawn_app(RequestLimits::default()).await;
    let turn = json!({"sessionId": "gz", "turnId": "t", "instruction": "hi"}).to_string();
    let line = json!({"customId": "a", "request": {"instruction": "x"}}).to_string();
    let index = json!({"repo": "gz", "files": [{"path": "a.md", "contents": "# A"}]}).to_string();
    for (path, body) in [
        ("/v1/turns", &turn),
        ("/api/ai/agent/execute", &turn),
        ("/v1/batches", &line),
        ("/v1/index", &index),
    ] {
        for coding in ["gzip", "br", "identity, deflate"] {
            let (status, answer) = app
                .post_with(
                    Some("tok-a"),
                    path,
                    &[("content-encoding", coding)],
                    body.clone(),
                )
                .await;
            assert_eq!(
                (status, code(&answer)),
                (415, "UNSUPPORTED_CONTENT_ENCODING"),
                "{path} {coding}: {answer}"
            );
            let message = answer["errors"][0]["message"].as_str().unwrap();
            assert!(
                message.contains(&format!(
                    "Content-Encoding: {}",
                    coding.trim_start_matches("identity, ")
                )),
                "{message}"
            );
        }
    }
    // `identity` is no coding at all.
    let (status, body) = app
        .post_with(
            Some("tok-a"),
            "/v1/turns",
            &[("content-encoding", "identity")],
            turn,
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let (status, _) = app.get(Some("tok-a"), "/v1/sessions/gz/turns/t").await;
    assert_eq!(status, 200);
    // Only that one turn was accepted: the refused ones left nothing behind.
    let (status, body) = app.get(Some("tok-a"), "/v1/sessions/gz").await;
    assert_eq!(status, 200);
    assert_eq!(
        body["result"]["turns"].as_array().map(Vec::len),
        Some(1),
        "{body}"
    );
}

#[tokio::test]
async fn a_body_sent_as_another_media_type_is_415_and_nothing_runs() {
    let app = spawn_app(RequestLimits::default()).await;
    let turn = |t: &str| json!({"sessionId": "ct", "turnId": t, "instruction": "hi"}).to_string();
    let line = json!({"customId": "a", "request": {"instruction": "x"}}).to_string();
    let index = json!({"repo": "ct", "files": [{"path": "a.md", "contents": "# A"}]}).to_string();
    let refused = [
        ("/v1/turns", turn("r"), "text/plain", "application/json"),
        (
            "/v1/turns",
            turn("r"),
            "application/x-www-form-urlencoded",
            "application/json",
        ),
        (
            "/api/ai/agent/execute",
            turn("r"),
            "application/json; charset=iso-8859-1",
            "application/json",
        ),
        (
            "/api/ai/agent/execute",
            turn("r"),
            "application/x-ndjson",
            "application/json",
        ),
        (
            "/v1/index",
            index.clone(),
            "text/markdown",
            "application/json",
        ),
        (
            "/v1/index",
            index.clone(),
            "application/+json",
            "application/json",
        ),
        (
            "/v1/batches",
            line.clone(),
            "application/json",
            "application/x-ndjson",
        ),
        (
            "/v1/batches",
            line.clone(),
            "text/csv",
            "application/x-ndjson",
        ),
    ];
    for (path, body, sent, wanted) in refused {
        let (status, answer) = app
            .post_with(Some("tok-a"), path, &[("content-type", sent)], body)
            .await;
        assert_eq!(
            (status, code(&answer)),
            (415, "UNSUPPORTED_MEDIA_TYPE"),
            "{path} {sent}: {answer}"
        );
        let message = answer["errors"][0]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("Content-Type: {sent};"))
                && message.contains(&format!("Content-Type: {wanted})")),
            "{path} {sent}: {message}"
        );
    }
    // Nothing was accepted by the refused requests.
    let (status, _) = app.get(Some("tok-a"), "/v1/sessions/ct").await;
    assert_eq!(status, 404);

    // The route's own type in any spelling, a UTF-8 charset, or no (or an empty) Content-Type.
    for (t, sent) in [
        ("a", Some("application/json")),
        ("b", Some("Application/JSON; charset=\"UTF-8\"")),
        ("c", Some("application/problem+json")),
        ("d", Some("")),
        ("e", None),
    ] {
        let headers: Vec<(&str, &str)> = sent.map(|v| ("content-type", v)).into_iter().collect();
        let (status, body) = app
            .post_with(Some("tok-a"), "/v1/turns", &headers, turn(t))
            .await;
        assert_eq!(status, 202, "{sent:?}: {body}");
    }
    for sent in ["application/x-ndjson; charset=utf-8", "application/jsonl"] {
        let (status, body) = app
            .post_with(
                Some("tok-a"),
                "/v1/batches",
                &[("content-type", sent)],
                line.clone(),
            )
            .await;
        assert_eq!(status, 202, "{sent}: {body}");
    }
    let (status, body) = app
        .post_with(
            Some("tok-a"),
            "/v1/index",
            &[("content-type", "application/json; charset=utf-8")],
            index,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = app.get(Some("tok-a"), "/v1/sessions/ct").await;
    assert_eq!(status, 200);
    assert_eq!(
        body["result"]["turns"].as_array().map(Vec::len),
        Some(5),
        "{body}"
    );
}

#[tokio::test]
async fn every_answer_is_counted_by_route_template_not_by_path() {
    let app = spawn_app(RequestLimits::default()).await;
    app.fake.push([Reply::Text("Done.".into())]);
    let turn = json!({"sessionId": "m", "turnId": "t", "instruction": "hi"}).to_string();
    assert_eq!(app.post(Some("tok-a"), turn.clone()).await.0, 202);
    assert_eq!(app.post(Some("tok-a"), "not json").await.0, 400);
    assert_eq!(app.post(None, turn).await.0, 401);
    app.settled("tok-a", "m", "t").await;
    let (status, _) = app.get(Some("tok-a"), "/v1/sessions/m/turns/other").await;
    assert_eq!(status, 404);
    for path in ["/no/such/1", "/no/such/2"] {
        let resp = app
            .http
            .get(format!("{}{path}", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 404);
    }
    let text = app.metrics_text().await;
    for line in [
        "aptix_http_requests_total{route=\"/v1/turns\",method=\"POST\",status=\"202\"} 1",
        "aptix_http_requests_total{route=\"/v1/turns\",method=\"POST\",status=\"400\"} 1",
        "aptix_http_requests_total{route=\"/v1/turns\",method=\"POST\",status=\"401\"} 1",
        "aptix_http_requests_total{route=\"/v1/sessions/{sessionId}/turns/{turnId}\",method=\"GET\",status=\"200\"} 1",
        "aptix_http_requests_total{route=\"/v1/sessions/{sessionId}/turns/{turnId}\",method=\"GET\",status=\"404\"} 1",
        "aptix_http_requests_total{route=\"unmatched\",method=\"GET\",status=\"404\"} 2",
        "aptix_http_request_duration_seconds_count{route=\"/v1/turns\"} 3",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
    // Paths with ids or unknown paths never become series of their own.
    assert!(!text.contains("/no/such"), "{text}");
    assert!(!text.contains("sessions/m/"), "{text}");
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
    // Another tenant's "s" is another session (every route: see `tenant_sessions`).
    let (status, _) = app.get(Some("tok-b"), "/v1/sessions/s/turns/t").await;
    assert_eq!(status, 404);
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
    // The session is stored as its tenant's: nothing under the bare id.
    let bare = aptix_worker::contract::SessionId::parse("s").unwrap();
    assert!(app.store.get_session(&bare).await.unwrap().is_none());
    let scoped = crate::support::sid_a("s");
    assert_eq!(scoped.as_str(), "tenant-a/s");
    assert!(app.store.get_session(&scoped).await.unwrap().is_some());
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
    let execute_result = json!("#/components/schemas/ExecuteResult");
    app.matches_schema(&execute_result, "the synchronous answer", &body);
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
    app.matches_schema(&execute_result, "a failed synchronous answer", &body);
    // no token: 401
    let resp = app.http.post(&url).body("{}").send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    // streaming: NDJSON whose last line is the final envelope
    let resp = app.http.post(&url).bearer_auth("tok-a").body(json!({"sessionId": "s", "turnId": "t2", "instruction": "stream it", "streaming": true}).to_string()).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let text = resp.text().await.unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    app.matches_schema(
        &json!("#/components/schemas/StreamFinalLine"),
        "the streaming final line",
        &last,
    );
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
    // (Another tenant subscribing to the same id hears its own session's events, never
    // these: see `tenant_sessions`.)
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
        app.matches_schema(
            &json!("#/components/schemas/TurnStatusView"),
            "an SSE event",
            &view,
        );
    }
}

fn ndjson(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn a_batch_with_good_and_bad_lines() {
    let app = spawn_app(RequestLimits::default()).await;
    // Another tenant uses session id "theirs": this tenant's "theirs" is its own.
    app.post(
        Some("tok-b"),
        json!({"sessionId": "theirs", "turnId": "t", "instruction": "mine"}).to_string(),
    )
    .await;
    let lines = [
        json!({"customId": "fresh", "request": {"instruction": "no ids"}}).to_string(),
        json!({"customId": "named", "request": {"sessionId": "bs", "turnId": "bt", "instruction": "with ids"}}).to_string(),
        "{not json".to_string(),
        String::new(), // blank lines are skipped, but still count for line numbers
        json!({"request": {"instruction": "no custom id"}}).to_string(),
        json!({"customId": "bad", "request": {"instruction": "x", "mode": "general", "sessionId": "bad id"}}).to_string(),
        json!({"customId": "fresh", "request": {"instruction": "repeat"}}).to_string(),
        json!({"customId": "hijack", "request": {"sessionId": "theirs", "turnId": "t2", "instruction": "x"}}).to_string(),
        // A valid line reusing the customId of an invalid one is still a duplicate.
        json!({"customId": "bad", "request": {"instruction": "valid now"}}).to_string(),
    ];
    let (status, body) = app
        .post_to(Some("tok-a"), "/v1/batches", lines.join("\n"))
        .await;
    assert_eq!(status, 202, "{body}");
    let r = &body["result"];
    assert_eq!(
        (r["total"].as_u64(), r["accepted"].as_u64()),
        (Some(8), Some(3))
    );
    let errors = r["errors"].as_array().unwrap();
    let by_line: Vec<(u64, Option<&str>, &str)> = errors
        .iter()
        .map(|e| {
            (
                e["line"].as_u64().unwrap(),
                e["customId"].as_str(),
                e["errors"][0]["errorCode"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        by_line,
        vec![
            (3, None, "MALFORMED_JSON"),
            (5, None, "MISSING_FIELD"),
            (6, Some("bad"), "FORBIDDEN_FIELD"),
            (7, Some("fresh"), "DUPLICATE_CUSTOM_ID"),
            (9, Some("bad"), "DUPLICATE_CUSTOM_ID"),
        ]
    );
    // Every violation of a line is listed, with the field path under `request`.
    let bad: Vec<&str> = errors[2]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    assert!(
        bad.iter().any(|m| m.starts_with("request.sessionId")),
        "{bad:?}"
    );
    assert!(bad.iter().any(|m| m.starts_with("request.mode")), "{bad:?}");
    let id = r["batchId"].as_str().unwrap().to_string();

    // Progress until nothing is queued or running.
    let mut progress = Value::Null;
    for _ in 0..100 {
        let (status, body) = app.get(Some("tok-a"), &format!("/v1/batches/{id}")).await;
        assert_eq!(status, 200);
        progress = body["result"].clone();
        if progress["queued"] == 0 && progress["running"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        progress,
        json!({"batchId": id, "total": 8, "rejected": 5, "queued": 0, "running": 0,
               "awaitingClientTools": 0, "completed": 3, "failed": 0, "cancelled": 0, "expired": 0})
    );

    // Results: one NDJSON line per submitted line.
    let resp = app
        .http
        .get(format!("{}/v1/batches/{id}/results", app.base))
        .bearer_auth("tok-a")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let results = ndjson(&resp.text().await.unwrap());
    assert_eq!(results.len(), 8);
    for line in &results {
        app.matches_schema(
            &json!("#/components/schemas/BatchResultLine"),
            "a batch result line",
            line,
        );
    }
    let fresh = &results[0];
    assert_eq!(fresh["customId"], "fresh");
    assert_eq!(fresh["status"], "completed");
    assert!(
        fresh["result"]["result"]["primaryOutputText"]
            .as_str()
            .unwrap()
            .contains("no ids"),
        "{fresh}"
    );
    // Fresh ids were assigned and are real turns of the caller.
    let (sid, tid) = (
        fresh["sessionId"].as_str().unwrap(),
        fresh["turnId"].as_str().unwrap(),
    );
    let (status, turn) = app
        .get(Some("tok-a"), &format!("/v1/sessions/{sid}/turns/{tid}"))
        .await;
    assert_eq!(
        (status, turn["result"]["status"].as_str()),
        (200, Some("completed"))
    );
    assert_eq!(
        (
            results[1]["sessionId"].as_str(),
            results[1]["turnId"].as_str()
        ),
        (Some("bs"), Some("bt"))
    );
    let mut rest: Vec<_> = results[2..]
        .iter()
        .map(|l| (l["line"].as_u64().unwrap(), l["status"].as_str().unwrap()))
        .collect();
    rest.sort();
    assert_eq!(
        rest,
        vec![
            (3, "rejected"),
            (5, "rejected"),
            (6, "rejected"),
            (7, "rejected"),
            // The other tenant's session id is this tenant's own session.
            (8, "completed"),
            (9, "rejected")
        ]
    );
    let line3 = results.iter().find(|l| l["line"] == 3).unwrap();
    assert_eq!(line3["result"]["successful"], false);

    // Other tenants and missing tokens see nothing.
    let (status, body) = app.get(Some("tok-b"), &format!("/v1/batches/{id}")).await;
    assert_eq!((status, code(&body)), (404, "BATCH_NOT_FOUND"));
    let (status, _) = app
        .get(Some("tok-b"), &format!("/v1/batches/{id}/results"))
        .await;
    assert_eq!(status, 404);
    let (status, _) = app.get(None, &format!("/v1/batches/{id}")).await;
    assert_eq!(status, 401);
    let (status, _) = app.post_to(None, "/v1/batches", lines[0].clone()).await;
    assert_eq!(status, 401);
    let (status, body) = app.post_to(Some("tok-a"), "/v1/batches", "\n\n").await;
    assert_eq!((status, code(&body)), (400, "MALFORMED_JSON"));
}

#[tokio::test]
async fn a_batch_over_the_limits_is_413_and_nothing_runs() {
    let limits = BatchLimits {
        max_bytes: 1000,
        max_lines: 2,
    };
    let app = spawn_app_with(RequestLimits::default(), limits).await;
    let line = json!({"customId": "a", "request": {"instruction": "x"}}).to_string();
    let (status, body) = app
        .post_to(
            Some("tok-a"),
            "/v1/batches",
            [line.clone(), line.clone(), line].join("\n"),
        )
        .await;
    assert_eq!((status, code(&body)), (413, "PAYLOAD_TOO_LARGE"));
    let big = json!({"customId": "a", "request": {"instruction": "x".repeat(2000)}}).to_string();
    let (status, _) = app.post_to(Some("tok-a"), "/v1/batches", big).await;
    assert_eq!(status, 413);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(app.fake.requests().is_empty());
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[tokio::test]
async fn metrics_count_what_happened() {
    let app = spawn_app(RequestLimits::default()).await;
    app.fake.push([Reply::Text("Done.".into())]);
    let turn = json!({"sessionId": "s", "turnId": "t", "instruction": "hi"}).to_string();
    app.post(Some("tok-a"), turn.clone()).await;
    app.get(Some("tok-a"), "/v1/sessions/s/turns/t?wait=10")
        .await;
    app.post(Some("tok-a"), turn).await; // a repeat: answered from the store
    // The worker counts a result once its publish is confirmed, which can be a moment after a
    // long-poll woken by that publish has answered.
    let mut text = String::new();
    for _ in 0..50 {
        let resp = app
            .http
            .get(format!("{}/metrics", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200, "no token needed");
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/plain")
        );
        text = resp.text().await.unwrap();
        if metric(&text, "aptix_turn_duration_seconds_count") >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&text, "aptix_turns_accepted_total"), 1.0);
    assert_eq!(
        metric(&text, "aptix_turns_total{status=\"completed\"}"),
        1.0
    );
    assert_eq!(
        metric(
            &text,
            "aptix_duplicates_suppressed_total{stage=\"frontdoor\"}"
        ),
        1.0
    );
    assert_eq!(metric(&text, "aptix_turn_queue_wait_seconds_count"), 1.0);
    assert_eq!(metric(&text, "aptix_turn_duration_seconds_count"), 1.0);
    assert_eq!(
        metric(&text, "aptix_model_request_duration_seconds_count"),
        1.0
    );
    assert!(metric(&text, "aptix_model_tokens_total{kind=\"input\"}") > 0.0);
    assert_eq!(metric(&text, "aptix_turns_in_flight"), 0.0);
    assert_eq!(metric(&text, "aptix_fenced_writes_rejected_total"), 0.0);
    for family in [
        "aptix_job_retries",
        "aptix_job_redeliveries",
        "aptix_model_retries",
        "aptix_jobs_dead_lettered",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} counter")),
            "{family} missing:\n{text}"
        );
    }
}

#[tokio::test]
async fn the_openapi_document_covers_every_route() {
    let app = spawn_app(RequestLimits::default()).await;
    let expected = [
        ("post", "/v1/turns"),
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
        ("get", "/v1/tenant/usage"),
        ("get", "/v1/sessions/{sessionId}/turns/{turnId}/inspect"),
        ("get", "/v1/batches"),
        ("get", "/v1/admin/system"),
        ("get", "/v1/admin/dead-letters"),
        ("post", "/v1/admin/dead-letters/requeue"),
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
    let state = HttpState {
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
    };
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
