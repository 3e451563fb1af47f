//! Batches and metrics over HTTP: good and bad lines, limits, what the metrics count.

use crate::app::{code, spawn_app, spawn_app_with};
use crate::support::metric;
use aptix_worker::config::BatchLimits;
use aptix_worker::contract::RequestLimits;
use aptix_worker::fake_llm::Reply;
use serde_json::{Value, json};
use std::time::Duration;

pub(super) fn ndjson(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
pub(super) async fn a_batch_with_good_and_bad_lines() {
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
    // In pages (`from`, `limit`): each page of three in turn, across the accepted and the
    // rejected lines, reads the whole exactly once; past the end, nothing.
    let page = |query: String| {
        let (app, id) = (&app, &id);
        async move {
            let resp = app
                .http
                .get(format!("{}/v1/batches/{id}/results?{query}", app.base))
                .bearer_auth("tok-a")
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        }
    };
    let mut paged = Vec::new();
    for from in (0..9).step_by(3) {
        let (status, text) = page(format!("from={from}&limit=3")).await;
        assert_eq!(status, 200, "{text}");
        let lines = ndjson(&text);
        assert!(lines.len() <= 3);
        paged.extend(lines);
    }
    let line_of = |v: &Vec<serde_json::Value>| -> Vec<u64> {
        v.iter().map(|l| l["line"].as_u64().unwrap()).collect()
    };
    assert_eq!(line_of(&paged), line_of(&results));
    assert_eq!(page("from=8".into()).await, (200, String::new()));
    // Any whole number is a place to start, past the largest index too (the fuzzer's).
    assert_eq!(
        page("from=13573537163846151435190272".into()).await,
        (200, String::new())
    );
    for bad in ["from=-1", "limit=0", "limit=10001", "from=x"] {
        let (status, text) = page(bad.into()).await;
        assert_eq!(status, 400, "{bad}: {text}");
        assert!(text.contains("INVALID_PARAMETER"), "{bad}: {text}");
    }

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
pub(super) async fn a_batch_over_the_limits_is_413_and_nothing_runs() {
    let limits = BatchLimits {
        max_bytes: 1000,
        max_lines: 2,
    };
    let app = spawn_app_with(RequestLimits::default(), limits).await;
    let accepted = app.accepted_turns().await;
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
    // Refused whole before any line was enqueued: no turn accepted, none can run.
    assert_eq!(app.accepted_turns().await, accepted, "nothing was enqueued");
    assert!(app.fake.requests().is_empty());
}

#[tokio::test]
pub(super) async fn metrics_count_what_happened() {
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
