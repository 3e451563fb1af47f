//! The HTTP API on port 0 over real RabbitMQ and Redis with an in-process worker.

use std::time::Duration;

use aptix_worker::contract::RequestLimits;
use aptix_worker::fake_llm::Reply;
use serde_json::{Value, json};

use crate::app::{code, spawn_app};

#[tokio::test]
pub(super) async fn a_turn_is_accepted_then_long_polled_to_completion() {
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
pub(super) async fn invalid_requests_are_400_with_every_violation_and_nothing_enqueued() {
    let app = spawn_app(RequestLimits::default()).await;
    let accepted = app.accepted_turns().await;
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
    // Refused before anything was enqueued: the front door accepted no turn, so none can run.
    assert_eq!(app.accepted_turns().await, accepted, "nothing was enqueued");
    assert!(app.fake.requests().is_empty(), "nothing ran");
}

#[tokio::test]
pub(super) async fn an_oversized_body_is_413() {
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
pub(super) fn with_bom(text: &str) -> Vec<u8> {
    [&b"\xEF\xBB\xBF"[..], text.as_bytes()].concat()
}

#[tokio::test]
pub(super) async fn a_body_behind_a_byte_order_mark_is_read_on_every_route() {
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
pub(super) async fn a_compressed_body_is_415_on_every_route_and_nothing_runs() {
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
pub(super) async fn a_body_sent_as_another_media_type_is_415_and_nothing_runs() {
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
pub(super) async fn every_answer_is_counted_by_route_template_not_by_path() {
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
pub(super) async fn conflicts_and_wrong_continuations() {
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
pub(super) async fn auth_missing_wrong_and_other_tenant() {
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
pub(super) async fn the_session_view_shows_mode_history_and_turns() {
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
pub(super) async fn the_synchronous_endpoint_answers_like_the_original() {
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
pub(super) async fn every_sse_subscriber_gets_every_event() {
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
