//! Webhooks end to end: a receiver on loopback (allowed by the allow-list setting, as the
//! policy refuses private addresses otherwise) that answers as a test scripts it. Signatures
//! are checked by an independent implementation, the Standard Webhooks package for Python
//! (`tests/webhook_verify.py`; `.ci/run` installs it).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::app::{AppOptions, Backend, code, spawn};

/// The specification's test secret (any `whsec_` secret of 24+ bytes does).
pub(crate) const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request the receiver got.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) headers: HashMap<String, String>,
    pub(crate) body: String,
    pub(crate) answered: u16,
}

/// What the receiver does with the next request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Answer {
    Status(u16),
    /// Never answers (the sender's POST hangs until it is killed or times out).
    Hang,
}

/// An HTTP endpoint that records every POST and answers from a script (200 once it is empty).
#[derive(Clone)]
pub(crate) struct Receiver {
    pub(crate) url: String,
    got: Arc<Mutex<Vec<Received>>>,
    script: Arc<Mutex<VecDeque<Answer>>>,
}

impl Receiver {
    pub(crate) async fn start(script: impl IntoIterator<Item = Answer>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks/aptix", listener.local_addr().unwrap());
        let receiver = Self {
            url,
            got: Arc::default(),
            script: Arc::new(Mutex::new(script.into_iter().collect())),
        };
        let state = receiver.clone();
        let app = axum::Router::new().route(
            "/hooks/aptix",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let state = state.clone();
                    async move {
                        let answer = state
                            .script
                            .lock()
                            .unwrap()
                            .pop_front()
                            .unwrap_or(Answer::Status(200));
                        let headers = headers
                            .iter()
                            .map(|(k, v)| {
                                (k.to_string(), v.to_str().unwrap_or_default().to_string())
                            })
                            .collect();
                        let body = String::from_utf8_lossy(&body).to_string();
                        let status = match answer {
                            Answer::Status(s) => s,
                            Answer::Hang => 0,
                        };
                        state.got.lock().unwrap().push(Received {
                            headers,
                            body,
                            answered: status,
                        });
                        if status == 0 {
                            std::future::pending::<()>().await;
                        }
                        axum::http::StatusCode::from_u16(status).unwrap()
                    }
                },
            ),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        receiver
    }

    pub(crate) fn got(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }

    /// Answers the next requests with `answers` (then 200) instead of what was scripted.
    pub(crate) fn answer_from_now(&self, answers: impl IntoIterator<Item = Answer>) {
        *self.script.lock().unwrap() = answers.into_iter().collect();
    }

    /// Waits until `enough` holds of what was received (up to `within`).
    pub(crate) async fn until(
        &self,
        within: Duration,
        enough: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = Instant::now() + within;
        loop {
            let got = self.got();
            if enough(&got) {
                return got;
            }
            assert!(Instant::now() < deadline, "the receiver got only {got:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Settings that let the receiver on loopback in, with a fast schedule.
pub(crate) fn webhook_env(extra: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("APTIX_WEBHOOK_SECRET", SECRET.to_string()),
        ("APTIX_WEBHOOK_ALLOW_HTTP", "true".to_string()),
        ("APTIX_WEBHOOK_ALLOW", "127.0.0.0/8".to_string()),
        ("APTIX_WEBHOOK_RETRY_DELAYS_SECS", "1".to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    env
}

pub(crate) fn turn_with_webhook(session: &str, turn: &str, url: &str) -> String {
    json!({"sessionId": session, "turnId": turn, "instruction": "hi", "webhook": {"url": url}})
        .to_string()
}

/// Verifies each delivery's signature with the Standard Webhooks package for Python (an
/// implementation that is not ours); panics naming the one that does not verify.
/// The test apps' `tok-a` is tenant-a's: its deliveries are signed with tenant-a's secret,
/// derived from the deployment's (the verifier derives it itself).
pub(super) fn verify_independently(deliveries: &[Received]) {
    assert_eq!(verify_with(SECRET, Some("tenant-a"), deliveries), Ok(()));
}

/// Verifies `deliveries` under `secret`, or under `tenant`'s secret derived from it; the
/// verifier's complaint when one does not verify.
pub(crate) fn verify_with(
    secret: &str,
    tenant: Option<&str>,
    deliveries: &[Received],
) -> Result<(), String> {
    let cases: Vec<Value> = deliveries
        .iter()
        .map(|d| {
            json!({
                "id": d.headers.get("webhook-id"),
                "timestamp": d.headers.get("webhook-timestamp"),
                "signature": d.headers.get("webhook-signature"),
                "body": d.body,
            })
        })
        .collect();
    let file = std::env::temp_dir().join(format!(
        "aptix-webhooks-{}.json",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(
        &file,
        json!({"secret": secret, "tenant": tenant, "cases": cases}).to_string(),
    )
    .unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/webhook_verify.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(&file)
        .output()
        .expect("python3 runs");
    let _ = std::fs::remove_file(&file);
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let broken = String::from_utf8_lossy(&out.stderr);
    assert!(
        !broken.contains("Traceback") && !broken.contains("ModuleNotFoundError"),
        "the verifier did not run (pip install standardwebhooks; .ci/run does): {broken}"
    );
    if out.status.success() && said == format!("{} verified", deliveries.len()) {
        Ok(())
    } else {
        Err(format!("{said}{broken}"))
    }
}

pub(super) async fn a_receiver_that_fails_twice_gets_one_acknowledged_delivery_per_event(
    backend: Backend,
) {
    let receiver = Receiver::start([Answer::Status(500), Answer::Status(503)]).await;
    let app = spawn(AppOptions {
        backend,
        extra_env: webhook_env(&[]),
        ..AppOptions::default()
    })
    .await;
    let (status, body) = app
        .post(Some("tok-a"), turn_with_webhook("s", "t1", &receiver.url))
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(app.settled("tok-a", "s", "t1").await["status"], "completed");
    let got = receiver
        .until(Duration::from_secs(30), |got| {
            got.iter().any(|r| r.answered == 200)
        })
        .await;
    // Nothing more comes once the receiver said 2xx.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got_later = receiver.got();
    assert_eq!(got_later.len(), got.len(), "{got_later:#?}");
    assert_eq!(
        got.iter().map(|r| r.answered).collect::<Vec<_>>(),
        [500, 503, 200],
        "two failures, then one acknowledged delivery"
    );
    let ids: Vec<&String> = got.iter().map(|r| &r.headers["webhook-id"]).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "one event id: {ids:?}");
    assert!(got.iter().all(|r| r.body == got[0].body), "the same body");
    let event: Value = serde_json::from_str(&got[0].body).unwrap();
    assert_eq!(event["type"], "turn.completed", "{event}");
    assert_eq!(event["data"]["turnId"], "t1");
    assert_eq!(event["data"]["status"], "completed");
    assert_eq!(
        event["data"]["result"]["result"]["primaryOutputText"],
        app.settled("tok-a", "s", "t1").await["result"]["result"]["primaryOutputText"],
        "data is the status view GET returns"
    );
    assert!(
        got[0].headers["traceparent"].starts_with("00-"),
        "{:?}",
        got[0].headers
    );
    // What the sender did, by event type and outcome.
    let metrics = app.metrics_text().await;
    for line in [
        r#"aptix_webhook_deliveries_total{event="turn.completed",outcome="retried"} 2"#,
        r#"aptix_webhook_deliveries_total{event="turn.completed",outcome="delivered"} 1"#,
        "aptix_webhook_attempt_duration_seconds_count 3",
        "aptix_webhook_delivery_age_seconds_count 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in\n{metrics}"
        );
    }
    assert!(metrics.contains("aptix_webhook_queue_depth "), "{metrics}");
    assert!(
        metrics.contains("aptix_webhook_send_lag_seconds "),
        "{metrics}"
    );
    assert_eq!(got[0].headers["content-type"], "application/json");
    verify_independently(&got);
}

pub(super) async fn a_private_address_is_refused_at_submission_and_at_delivery(backend: Backend) {
    let receiver = Receiver::start([]).await;
    // http is allowed, no address range is: loopback is not public.
    let app = spawn(AppOptions {
        backend,
        extra_env: vec![
            ("APTIX_WEBHOOK_SECRET", SECRET.to_string()),
            ("APTIX_WEBHOOK_ALLOW_HTTP", "true".to_string()),
        ],
        ..AppOptions::default()
    })
    .await;
    for url in [
        receiver.url.clone(),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://10.1.2.3/".to_string(),
        "http://localhost:9/".to_string(),
    ] {
        let (status, body) = app
            .post(Some("tok-a"), turn_with_webhook("s", "t", &url))
            .await;
        assert_eq!(
            (status, code(&body)),
            (400, "WEBHOOK_REFUSED"),
            "{url}: {body}"
        );
        assert!(
            body["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains("not a public address"),
            "{body}"
        );
    }
    let (status, body) = app
        .post(
            Some("tok-a"),
            turn_with_webhook("s", "t", "ftp://example.com/"),
        )
        .await;
    assert_eq!((status, code(&body)), (400, "INVALID_WEBHOOK"), "{body}");
    // Accepted while the name pointed elsewhere (a delivery queued before the DNS changed):
    // refused again when it is sent, and dead-lettered without reaching the receiver.
    let job = aptix_worker::webhooks::HookJob {
        id: "evt_rebound".into(),
        event: aptix_worker::webhooks::EventType::TurnCompleted,
        target: aptix_worker::webhooks::Target {
            url: receiver.url.replace("127.0.0.1", "localhost"),
            secret_env: "APTIX_WEBHOOK_SECRET".into(),
        },
        tenant: "tenant-a".into(),
        body: "{}".into(),
        traceparent: None,
        attempts: 0,
        first_at: 0,
        last_error: None,
        line: None,
    };
    app.broker
        .enqueue_hook(&serde_json::to_vec(&job).unwrap())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let dead = loop {
        let dead = app.broker.dead_hooks(10, false).await.unwrap();
        if !dead.is_empty() {
            break dead;
        }
        assert!(Instant::now() < deadline, "not dead-lettered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(dead[0].1.contains("not a public address"), "{dead:?}");
    assert!(receiver.got().is_empty(), "{:?}", receiver.got());
}

pub(super) async fn a_submission_whose_tenant_cannot_sign_is_refused(backend: Backend) {
    let app = spawn(AppOptions {
        backend,
        extra_env: vec![("APTIX_WEBHOOK_ALLOW_HTTP", "true".to_string())],
        ..AppOptions::default()
    })
    .await;
    let (status, body) = app
        .post(
            Some("tok-a"),
            turn_with_webhook("s", "t", "https://hooks.example.com/aptix"),
        )
        .await;
    assert_eq!(
        (status, code(&body)),
        (400, "WEBHOOK_SECRET_MISSING"),
        "{body}"
    );
    // Nothing was accepted.
    assert_eq!(
        app.get(Some("tok-a"), "/v1/sessions/s/turns/t").await.0,
        404
    );
}

/// A tenant's webhooks from the tenants file: each gets the events it lists (all when it lists
/// none), signed with the tenant's own secret.
pub(super) async fn a_tenants_webhooks_get_the_events_they_list(backend: Backend) {
    const TENANT_SECRET: &str = "whsec_dGVuYW50LWEncyBvd24gc2lnbmluZyBzZWNyZXQ=";
    let (failures_only, everything) = (Receiver::start([]).await, Receiver::start([]).await);
    let tenants = std::env::temp_dir().join(format!(
        "aptix-tenants-{}.json",
        uuid::Uuid::new_v4().simple()
    ));
    let file = json!({"tenants": [{"id": "tenant-a", "webhookSecretEnv": "TENANT_A_SECRET",
        "webhooks": [{"url": failures_only.url, "events": ["turn.failed"]}, {"url": everything.url}]}]});
    std::fs::write(&tenants, file.to_string()).unwrap();
    let app = spawn(AppOptions {
        backend,
        extra_env: webhook_env(&[
            ("APTIX_TENANTS_FILE", tenants.to_str().unwrap()),
            ("TENANT_A_SECRET", TENANT_SECRET),
        ]),
        ..AppOptions::default()
    })
    .await;
    let turn = json!({"sessionId": "s", "turnId": "t1", "instruction": "hi"}).to_string();
    assert_eq!(app.post(Some("tok-a"), turn).await.0, 202);
    let got = everything
        .until(Duration::from_secs(30), |got| !got.is_empty())
        .await;
    let event: Value = serde_json::from_str(&got[0].body).unwrap();
    assert_eq!(event["type"], "turn.completed");
    assert_eq!(verify_with(TENANT_SECRET, None, &got[..1]), Ok(()));
    // Another tenant's turns reach neither.
    let turn = json!({"sessionId": "s2", "turnId": "t1", "instruction": "hi"}).to_string();
    assert_eq!(app.post(Some("tok-b"), turn).await.0, 202);
    assert_eq!(
        app.settled("tok-b", "s2", "t1").await["status"],
        "completed"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(everything.got().len(), 1, "{:#?}", everything.got());
    assert!(failures_only.got().is_empty(), "{:#?}", failures_only.got());
}

/// The synchronous endpoint answers with the result as always, and the webhook gets it too.
pub(super) async fn the_synchronous_endpoint_answers_and_still_delivers(backend: Backend) {
    let receiver = Receiver::start([]).await;
    let app = spawn(AppOptions {
        backend,
        extra_env: webhook_env(&[]),
        ..AppOptions::default()
    })
    .await;
    let (status, answer) = app
        .post_to(
            Some("tok-a"),
            "/api/ai/agent/execute",
            turn_with_webhook("s", "t1", &receiver.url),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(answer["successful"], true, "{answer}");
    let got = receiver
        .until(Duration::from_secs(30), |got| !got.is_empty())
        .await;
    let event: Value = serde_json::from_str(&got[0].body).unwrap();
    assert_eq!(event["type"], "turn.completed");
    assert_eq!(
        event["data"]["result"]["result"]["primaryOutputText"],
        answer["result"]["primaryOutputText"]
    );
}

/// A batch with a webhook: every line's turn is an event there, and once the last line has
/// settled, one `batch.completed` whose data is the batch's progress.
pub(super) async fn a_batch_of_100_lines_gives_100_turn_events_and_one_batch_completed(
    backend: Backend,
) {
    let receiver = Receiver::start([]).await;
    let app = spawn(AppOptions {
        backend,
        extra_env: webhook_env(&[]),
        ..AppOptions::default()
    })
    .await;
    let lines: Vec<String> = (0..100)
        .map(|i| json!({"customId": format!("doc-{i}"), "request": {"instruction": format!("review {i}")}}).to_string())
        .collect();
    let path = format!(
        "/v1/batches?webhook={}",
        receiver.url.replace(':', "%3A").replace('/', "%2F")
    );
    let (status, body) = app.post_to(Some("tok-a"), &path, lines.join("\n")).await;
    assert_eq!(status, 202, "{body}");
    let batch_id = body["result"]["batchId"].as_str().unwrap().to_string();
    let got = receiver
        .until(Duration::from_secs(60), |got| got.len() >= 101)
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got_later = receiver.got();
    assert_eq!(got_later.len(), 101, "nothing more: {}", got_later.len());
    let events: Vec<Value> = got
        .iter()
        .map(|r| serde_json::from_str(&r.body).unwrap())
        .collect();
    let turns: std::collections::HashSet<String> = events
        .iter()
        .filter(|e| e["type"] == "turn.completed")
        .map(|e| e["data"]["turnId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(turns.len(), 100, "one event per line's turn");
    let completed: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "batch.completed")
        .collect();
    assert_eq!(completed.len(), 1, "{completed:?}");
    let progress = &completed[0]["data"];
    assert_eq!(progress["batchId"], batch_id.as_str());
    assert_eq!(
        (progress["total"].as_u64(), progress["completed"].as_u64()),
        (Some(100), Some(100)),
        "{progress}"
    );
    // Told of once the last turn had completed.
    let last_turn = events
        .iter()
        .filter(|e| e["type"] == "turn.completed")
        .map(|e| e["timestamp"].as_str().unwrap().to_string())
        .max()
        .unwrap();
    assert!(completed[0]["timestamp"].as_str().unwrap() >= last_turn.as_str());
    // The same body as GET answers.
    let (_, now) = app
        .get(Some("tok-a"), &format!("/v1/batches/{batch_id}"))
        .await;
    assert_eq!(&now["result"], progress);
    verify_independently(&got[..3]);
}

/// A batch whose line repeats a turn that completed before (same ids, same payload): no
/// worker settles that line again, and the batch is still told of once the others settle;
/// likewise with a line whose turn is refused when it is enqueued.
pub(super) async fn a_batch_with_a_line_that_settled_before_still_completes(backend: Backend) {
    let receiver = Receiver::start([]).await;
    let app = spawn(AppOptions {
        backend,
        extra_env: webhook_env(&[]),
        ..AppOptions::default()
    })
    .await;
    let earlier = json!({"sessionId": "s", "turnId": "t1", "instruction": "hi"});
    assert_eq!(app.post(Some("tok-a"), earlier.to_string()).await.0, 202);
    assert_eq!(app.settled("tok-a", "s", "t1").await["status"], "completed");
    // And a line refused only when its turn is enqueued (the ids of that turn, another
    // payload): the batch's line count is noted before enqueueing, and this line counts as
    // settled, since it never runs.
    let other = json!({"sessionId": "s", "turnId": "t2", "instruction": "hi"});
    assert_eq!(app.post(Some("tok-a"), other.to_string()).await.0, 202);
    assert_eq!(app.settled("tok-a", "s", "t2").await["status"], "completed");
    let clash = json!({"sessionId": "s", "turnId": "t2", "instruction": "other"});
    let lines = [
        json!({"customId": "again", "request": earlier}).to_string(),
        json!({"customId": "new", "request": {"instruction": "review"}}).to_string(),
        json!({"customId": "clash", "request": clash}).to_string(),
    ];
    let path = format!(
        "/v1/batches?webhook={}",
        receiver.url.replace(':', "%3A").replace('/', "%2F")
    );
    let (status, body) = app.post_to(Some("tok-a"), &path, lines.join("\n")).await;
    assert_eq!(
        (status, &body["result"]["accepted"]),
        (202, &json!(2)),
        "{body}"
    );
    assert_eq!(
        body["result"]["errors"][0]["errors"][0]["errorCode"], "TURN_CONFLICT",
        "{body}"
    );
    let got = receiver
        .until(Duration::from_secs(30), |got| {
            got.iter().any(|r| r.body.contains("batch.completed"))
        })
        .await;
    let done: Value = serde_json::from_str(
        &got.iter()
            .find(|r| r.body.contains("batch.completed"))
            .unwrap()
            .body,
    )
    .unwrap();
    assert_eq!(done["data"]["completed"], 2, "{done}");
}

/// A batch's webhook is held to the same rules as a turn's: nothing is accepted otherwise.
pub(super) async fn a_batch_with_a_refused_webhook_is_refused_whole(backend: Backend) {
    let app = spawn(AppOptions {
        backend,
        extra_env: vec![("APTIX_WEBHOOK_SECRET", SECRET.to_string())],
        ..AppOptions::default()
    })
    .await;
    let line = json!({"customId": "a", "request": {"instruction": "x"}}).to_string();
    for (url, expected) in [
        ("http%3A%2F%2Fhooks.example.com%2F", "WEBHOOK_REFUSED"),
        ("https%3A%2F%2F127.0.0.1%2F", "WEBHOOK_REFUSED"),
        ("not%20a%20url", "INVALID_WEBHOOK"),
    ] {
        let (status, body) = app
            .post_to(
                Some("tok-a"),
                &format!("/v1/batches?webhook={url}"),
                line.clone(),
            )
            .await;
        assert_eq!((status, code(&body)), (400, expected), "{url}: {body}");
    }
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [
        a_receiver_that_fails_twice_gets_one_acknowledged_delivery_per_event,
        a_private_address_is_refused_at_submission_and_at_delivery,
        a_submission_whose_tenant_cannot_sign_is_refused,
        a_tenants_webhooks_get_the_events_they_list,
        a_batch_of_100_lines_gives_100_turn_events_and_one_batch_completed,
        a_batch_with_a_refused_webhook_is_refused_whole,
        the_synchronous_endpoint_answers_and_still_delivers,
        a_batch_with_a_line_that_settled_before_still_completes,
    ],
);
