//! Admin tokens (`token=tenant:admin`) and the admin routes, on both backends, through HTTP:
//! the system view adds up what the workers report in their heartbeats and what the broker
//! holds; an admin reads and cancels any tenant's turn and lists every tenant's batches while a
//! tenant's token sees its own only; dead letters are listed and requeued. Every answer is
//! checked against `/openapi.json`.

use std::time::{Duration, Instant};

use aptix_worker::fake_llm::Reply;
use serde_json::{Value, json};

use crate::app::{App, AppOptions, Backend, code, spawn};

const TOKENS: &str = "tok-a=tenant-a,tok-b=tenant-b,tok-root=ops:admin";

async fn admin_app(backend: Backend, extra: Vec<(&'static str, String)>) -> App {
    let mut extra_env = vec![("APTIX_API_TOKENS", TOKENS.to_string())];
    extra_env.extend(extra);
    spawn(AppOptions {
        backend,
        extra_env,
        ..AppOptions::default()
    })
    .await
}

fn turn(session: &str, turn: &str, instruction: &str) -> String {
    json!({"sessionId": session, "turnId": turn, "instruction": instruction}).to_string()
}

async fn the_system_view_adds_up_what_the_workers_did(backend: Backend) {
    let services = matches!(backend, Backend::Services);
    let app = admin_app(backend, vec![]).await;
    for i in 0..5 {
        let body = turn(&format!("sys-{i}"), "t", "hello");
        assert_eq!(app.post(Some("tok-a"), body).await.0, 202);
    }
    for i in 0..5 {
        app.settled("tok-a", &format!("sys-{i}"), "t").await;
    }
    // The worker reports its slots every 5 s.
    let deadline = Instant::now() + Duration::from_secs(15);
    let view = loop {
        let (status, body) = app.get(Some("tok-root"), "/v1/admin/system").await;
        assert_eq!(status, 200, "{body}");
        app.conforms("get", "/v1/admin/system", 200, &body);
        let view = body["result"].clone();
        let completed: u64 = view["load"]["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["completed"].as_u64().unwrap())
            .sum();
        assert!(completed <= 5, "counted once each: {view}");
        if completed == 5 {
            break view;
        }
        assert!(Instant::now() < deadline, "never reported: {view}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let points = view["load"]["points"].as_array().unwrap();
    assert_eq!(points.len(), 60, "five minutes of 5 s slots");
    assert!(
        points.iter().any(|p| p["p50Ms"].as_u64().is_some()),
        "{view}"
    );
    let workers = view["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 1, "{view}");
    assert_eq!(workers[0]["running"], 0);
    assert_eq!(workers[0]["pid"], std::process::id());
    // The entry of `list` whose `key` is `value`.
    let entry = |list: &str, key: &str, value: &str| {
        view[list]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e[key] == value)
            .cloned()
            .unwrap_or_else(|| panic!("no {list} entry with {key} {value}: {view}"))
    };
    let queue = |role: &str| entry("queues", "role", role);
    assert_eq!(queue("jobs")["messages"], 0);
    assert_eq!(queue("dead")["messages"], 0);
    if services {
        assert!(
            queue("jobs")["consumers"].as_u64().unwrap() >= 1,
            "the worker consumes the job queue: {view}"
        );
        assert!(
            view["queues"]
                .as_array()
                .unwrap()
                .iter()
                .any(|q| q["role"] == "retry"),
            "{view}"
        );
    }
    let tenant = |name: &str| entry("tenants", "tenant", name);
    let spent: u64 = app
        .fake
        .usages()
        .iter()
        .map(|u| u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(tenant("tenant-a")["tokensToday"], spent);
    assert_eq!(tenant("tenant-b")["tokensToday"], 0);
    assert_eq!(view["load"]["contexts"][0]["context"], "default");
    assert_eq!(view["load"]["contexts"][0]["inFlight"], 0);

    // Only for admins.
    let (status, body) = app.get(Some("tok-a"), "/v1/admin/system").await;
    assert_eq!((status, code(&body)), (403, "FORBIDDEN"));
    app.conforms("get", "/v1/admin/system", 403, &body);
    assert_eq!(app.get(None, "/v1/admin/system").await.0, 401);
}

async fn an_admin_reads_and_cancels_any_tenants_turn_and_lists_every_tenants_batches(
    backend: Backend,
) {
    let app = admin_app(backend, vec![]).await;
    app.fake.push([Reply::Delay(
        Duration::from_secs(20),
        Box::new(Reply::Text("never".into())),
    )]);
    assert_eq!(
        app.post(Some("tok-b"), turn("of-b", "t", "slow")).await.0,
        202
    );
    app.wait_for_model_calls(1).await;
    assert_eq!(app.get(Some("tok-a"), "/v1/sessions/of-b").await.0, 404);
    let (status, session) = app
        .get(Some("tok-root"), "/v1/sessions/of-b?tenant=tenant-b")
        .await;
    assert_eq!(status, 200, "{session}");
    assert_eq!(session["result"]["turns"][0]["status"], "running");
    let (status, _) = app
        .get(
            Some("tok-root"),
            "/v1/sessions/of-b/turns/t/inspect?tenant=tenant-b",
        )
        .await;
    assert_eq!(status, 200);
    let (status, cancelled) = app
        .post_to(
            Some("tok-root"),
            "/v1/sessions/of-b/turns/t/cancel?tenant=tenant-b",
            "",
        )
        .await;
    assert!(status == 202 || status == 200, "{status} {cancelled}");
    assert_eq!(
        app.settled("tok-b", "of-b", "t").await["status"],
        "cancelled"
    );
    // A tenant's token may not cancel another's turn.
    let (status, _) = app
        .post_to(Some("tok-a"), "/v1/sessions/of-b/turns/t/cancel", "")
        .await;
    assert_eq!(status, 404);

    let mut ids = Vec::new();
    for token in ["tok-a", "tok-b"] {
        let line = json!({"customId": "c", "request": {"instruction": "hi"}}).to_string();
        let (status, accepted) = app.post_to(Some(token), "/v1/batches", line).await;
        assert_eq!(status, 202, "{accepted}");
        ids.push(accepted["result"]["batchId"].as_str().unwrap().to_string());
    }
    let listed = |body: &Value| -> Vec<String> {
        body["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["progress"]["batchId"].as_str().unwrap().to_string())
            .collect()
    };
    let (status, mine) = app.get(Some("tok-a"), "/v1/batches").await;
    assert_eq!(status, 200, "{mine}");
    app.conforms("get", "/v1/batches", 200, &mine);
    assert_eq!(listed(&mine), vec![ids[0].clone()]);
    assert_eq!(mine["result"][0]["tenant"], "tenant-a");
    let (_, theirs) = app.get(Some("tok-b"), "/v1/batches").await;
    assert_eq!(listed(&theirs), vec![ids[1].clone()]);
    let (_, all) = app.get(Some("tok-root"), "/v1/batches").await;
    let mut every = listed(&all);
    every.sort();
    let mut both = ids.clone();
    both.sort();
    assert_eq!(every, both);
    let (_, one) = app
        .get(Some("tok-root"), "/v1/batches?tenant=tenant-b&limit=5")
        .await;
    assert_eq!(listed(&one), vec![ids[1].clone()]);
    // A tenant's token may name its own tenant (what the console sends), not another.
    let (status, own) = app.get(Some("tok-a"), "/v1/batches?tenant=tenant-a").await;
    assert_eq!(status, 200, "{own}");
    assert_eq!(listed(&own), vec![ids[0].clone()]);
    let (status, refused) = app.get(Some("tok-a"), "/v1/batches?tenant=tenant-b").await;
    assert_eq!((status, code(&refused)), (403, "FORBIDDEN"));
    let (status, bad) = app.get(Some("tok-a"), "/v1/batches?limit=0").await;
    assert_eq!((status, code(&bad)), (400, "INVALID_PARAMETER"));
    // The admin reads a tenant's batch; another tenant does not.
    let path = format!("/v1/batches/{}", ids[1]);
    assert_eq!(app.get(Some("tok-root"), &path).await.0, 200);
    assert_eq!(app.get(Some("tok-a"), &path).await.0, 404);
}

async fn listed(app: &App) -> Value {
    let (status, body) = app.get(Some("tok-root"), "/v1/admin/dead-letters").await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn requeue(app: &App, ask: Value) -> (u16, Value) {
    app.post_to(
        Some("tok-root"),
        "/v1/admin/dead-letters/requeue",
        ask.to_string(),
    )
    .await
}

async fn dead_letters_are_listed_and_requeued_through_the_api(backend: Backend) {
    // One attempt: a model that is down dead-letters the turn's job at once.
    let app = admin_app(backend, vec![("APTIX_MAX_ATTEMPTS", "1".into())]).await;
    app.fake.push([Reply::Error {
        status: 500,
        message: "down".into(),
        retry_after_ms: None,
    }]);
    assert_eq!(
        app.post(Some("tok-a"), turn("dead", "t", "hello")).await.0,
        202
    );
    assert_eq!(app.settled("tok-a", "dead", "t").await["status"], "failed");
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        let body = listed(&app).await;
        if body["result"].as_array().is_some_and(|a| !a.is_empty()) {
            break body;
        }
        assert!(Instant::now() < deadline, "never dead-lettered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    app.conforms("get", "/v1/admin/dead-letters", 200, &body);
    let letter = &body["result"][0];
    assert_eq!(
        (&letter["sessionId"], &letter["turnId"], &letter["tenant"]),
        (&json!("dead"), &json!("t"), &json!("tenant-a"))
    );
    assert_eq!(letter["attempt"], 1);
    assert!(
        letter["reason"]
            .as_str()
            .unwrap()
            .contains("LLM_UNAVAILABLE"),
        "{letter}"
    );
    // Listing it again finds it again: reading keeps it.
    assert_eq!(listed(&app).await["result"].as_array().unwrap().len(), 1);

    let (status, body) = requeue(
        &app,
        json!({"turns": [{"sessionId": "other", "turnId": "t"}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    app.conforms("post", "/v1/admin/dead-letters/requeue", 200, &body);
    assert_eq!(
        body["result"],
        json!({"requeued": 0, "alreadySettled": 0, "kept": 1})
    );
    let (status, bad) = requeue(&app, json!({})).await;
    assert_eq!((status, code(&bad)), (400, "MALFORMED_JSON"));
    let (status, bad) = requeue(&app, json!({"everything": true})).await;
    assert_eq!((status, code(&bad)), (400, "MALFORMED_JSON"));
    let (status, refused) = app
        .post_to(
            Some("tok-a"),
            "/v1/admin/dead-letters/requeue",
            json!({"all": true}).to_string(),
        )
        .await;
    assert_eq!((status, code(&refused)), (403, "FORBIDDEN"));

    let calls = app.fake.requests().len();
    let repeats = "aptix_duplicates_suppressed_total{stage=\"worker\"}";
    let before = crate::support::metric_value(&app.metrics_text().await, repeats).unwrap_or(0.0);
    let (status, body) = requeue(
        &app,
        json!({"turns": [{"sessionId": "dead", "turnId": "t"}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["result"],
        json!({"requeued": 1, "alreadySettled": 1, "kept": 0}),
        "the answer says the turn had settled already"
    );
    // The requeued job ran: its turn had failed, so the worker answered it from the stored
    // result (a repeat it counts) and delivered its status again — the model was not called,
    // nothing went back to the dead letters, and the turn is still failed.
    app.wait_for_metric(repeats, |n| n > before).await;
    assert_eq!(listed(&app).await["result"], json!([]));
    assert_eq!(app.fake.requests().len(), calls);
    assert_eq!(app.settled("tok-a", "dead", "t").await["status"], "failed");
}

/// Dead letters discarded by name, then all of them: gone from the queue, their turns as
/// they were, nothing run again.
async fn dead_letters_are_discarded_through_the_api(backend: Backend) {
    let app = admin_app(backend, vec![("APTIX_MAX_ATTEMPTS", "1".into())]).await;
    for session in ["d1", "d2", "d3"] {
        app.fake.push([Reply::Error {
            status: 500,
            message: "down".into(),
            retry_after_ms: None,
        }]);
        assert_eq!(
            app.post(Some("tok-a"), turn(session, "t", "hi")).await.0,
            202
        );
        assert_eq!(app.settled("tok-a", session, "t").await["status"], "failed");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while listed(&app).await["result"].as_array().map_or(0, Vec::len) < 3 {
        assert!(Instant::now() < deadline, "never dead-lettered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let calls = app.fake.requests().len();
    let discard = |ask: Value| {
        app.post_to(
            Some("tok-root"),
            "/v1/admin/dead-letters/discard",
            ask.to_string(),
        )
    };
    let (status, body) = discard(json!({"turns": [{"sessionId": "d2", "turnId": "t"}]})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"], json!({"discarded": 1, "kept": 2}));
    let left: Vec<Value> = listed(&app).await["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["sessionId"].clone())
        .collect();
    assert_eq!(left, [json!("d1"), json!("d3")]);
    let (status, body) = discard(json!({"all": true})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"], json!({"discarded": 2, "kept": 0}));
    assert_eq!(listed(&app).await["result"], json!([]));
    let (status, bad) = discard(json!({})).await;
    assert_eq!((status, code(&bad)), (400, "MALFORMED_JSON"));
    let (status, refused) = app
        .post_to(
            Some("tok-a"),
            "/v1/admin/dead-letters/discard",
            json!({"all": true}).to_string(),
        )
        .await;
    assert_eq!((status, code(&refused)), (403, "FORBIDDEN"));
    // Nothing ran again; the turns are as they were.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.fake.requests().len(), calls);
    assert_eq!(app.settled("tok-a", "d2", "t").await["status"], "failed");
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [
        dead_letters_are_discarded_through_the_api,
        the_system_view_adds_up_what_the_workers_did,
        an_admin_reads_and_cancels_any_tenants_turn_and_lists_every_tenants_batches,
        dead_letters_are_listed_and_requeued_through_the_api,
    ],
);
