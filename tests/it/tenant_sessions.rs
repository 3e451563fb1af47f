//! A session id names a session within its tenant (DESIGN §10), on both backends: whatever
//! tenant B does with the ids tenant A uses — subscribing, reading, inspecting, cancelling,
//! submitting turns and continuations, before and after A's first turn — A's session is
//! untouched and B's answers are those it gets for ids nobody uses. An admin names the
//! tenant it reads; path ids are checked like body ids.

use std::time::Duration;

use serde_json::{Value, json};

use crate::app::{App, AppOptions, Backend, code, spawn};

const TOKENS: &str = "tok-a=tenant-a,tok-b=tenant-b,tok-root=ops:admin";

async fn app(backend: Backend) -> App {
    spawn(AppOptions {
        backend,
        extra_env: vec![("APTIX_API_TOKENS", TOKENS.into())],
        ..AppOptions::default()
    })
    .await
}

fn turn(session: &str, turn: &str, instruction: &str) -> String {
    json!({"sessionId": session, "turnId": turn, "instruction": instruction}).to_string()
}

/// An answer with what differs between any two calls taken out: the result id, timestamps,
/// and the session id named in it (so answers about two ids can be compared).
fn normalized(mut body: Value, session: &str) -> Value {
    if let Some(o) = body.as_object_mut() {
        o.remove("resultId");
    }
    let text = body.to_string().replace(session, "<sid>");
    let mut v: Value = serde_json::from_str(&text).unwrap();
    if let Some(r) = v.get_mut("result").and_then(Value::as_object_mut) {
        for stamp in ["submittedAt", "completedAt"] {
            r.remove(stamp);
        }
    }
    v
}

/// Status of opening the session's event stream (then closed).
async fn subscribe_once(app: &App, token: &str, session: &str) -> u16 {
    let resp = app
        .http
        .get(format!("{}/v1/sessions/{session}/events", app.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    resp.status().as_u16()
}

/// Everything tenant B can learn of `session` through every route that takes a session id
/// (with turn `t1`), normalized: subscribing, reading the session, a turn, its inspection,
/// cancelling it and sending a continuation for it.
async fn probe(app: &App, session: &str) -> Vec<(String, u16, Value)> {
    let mut seen = Vec::new();
    let events = subscribe_once(app, "tok-b", session).await;
    seen.push(("events".into(), events, Value::Null));
    for path in [
        format!("/v1/sessions/{session}"),
        format!("/v1/sessions/{session}/turns/t1"),
        format!("/v1/sessions/{session}/turns/t1?wait=0.2"),
        format!("/v1/sessions/{session}/turns/t1/inspect"),
    ] {
        let (status, body) = app.get(Some("tok-b"), &path).await;
        seen.push((
            path.replace(session, "<sid>"),
            status,
            normalized(body, session),
        ));
    }
    let (status, body) = app
        .post_to(
            Some("tok-b"),
            &format!("/v1/sessions/{session}/turns/t1/cancel"),
            String::new(),
        )
        .await;
    seen.push(("cancel".into(), status, normalized(body, session)));
    let cont = json!({"sessionId": session, "turnId": "t1", "toolResults": [
        {"toolCallId": "c", "executionMs": 1, "resultJson": "{}"}]});
    let (status, body) = app.post(Some("tok-b"), cont.to_string()).await;
    seen.push(("continuation".into(), status, normalized(body, session)));
    seen
}

async fn one_tenants_ids_are_not_anothers(backend: Backend) {
    let app = app(backend).await;

    // Before A has used "sA1", B probes it — subscribing included — exactly as an unused id.
    let unused = probe(&app, "never-1").await;
    let theirs = probe(&app, "sA1").await;
    assert_eq!(
        theirs, unused,
        "B tells A's future session from an unused one"
    );
    assert!(
        unused
            .iter()
            .all(|(_, status, _)| [200, 404].contains(status)),
        "{unused:?}"
    );

    // A's first turn on it is accepted and runs: nothing B did claimed it.
    let (status, body) = app.post(Some("tok-a"), turn("sA1", "t1", "mine")).await;
    assert_eq!(status, 202, "{body}");
    let a_done = app.settled("tok-a", "sA1", "t1").await;
    assert_eq!(a_done["status"], "completed", "{a_done}");
    assert_eq!(a_done["sessionId"], "sA1", "clients see their own id");
    let calls = app.fake.requests().len();

    // After it, B still learns nothing: A's session reads as an unused id does.
    let unused = probe(&app, "never-2").await;
    let theirs = probe(&app, "sA1").await;
    assert_eq!(theirs, unused, "B tells A's session from an unused one");

    // B's own turn with A's ids (another payload) is B's: accepted as a fresh turn is (no
    // conflict with A's), run, and A's turn is as it was.
    let (status, fresh) = app
        .post(Some("tok-b"), turn("never-3", "t1", "other"))
        .await;
    let (status_on_a, on_a) = app.post(Some("tok-b"), turn("sA1", "t1", "other")).await;
    assert_eq!((status, status_on_a), (202, 202), "{fresh} {on_a}");
    assert_eq!(
        normalized(on_a, "sA1"),
        normalized(fresh, "never-3"),
        "a submission tells B nothing"
    );
    let b_done = app.settled("tok-b", "sA1", "t1").await;
    assert_eq!(b_done["status"], "completed", "{b_done}");
    assert_eq!(
        app.fake.requests().len(),
        calls + 2,
        "B's two turns ran; A's did not run again"
    );
    assert_eq!(app.settled("tok-a", "sA1", "t1").await, a_done);
    let (_, a_session) = app.get(Some("tok-a"), "/v1/sessions/sA1").await;
    assert_eq!(
        a_session["result"]["turns"],
        json!([{"turnId": "t1", "status": "completed"}]),
        "{a_session}"
    );

    // B subscribed to "sA1" hears its own turns there, never A's.
    let mut b_events = app
        .http
        .get(format!("{}/v1/sessions/sA1/events", app.base))
        .bearer_auth("tok-b")
        .send()
        .await
        .unwrap();
    assert_eq!(b_events.status().as_u16(), 200);
    assert_eq!(
        app.post(Some("tok-a"), turn("sA1", "a2", "again")).await.0,
        202
    );
    assert_eq!(
        app.settled("tok-a", "sA1", "a2").await["status"],
        "completed"
    );
    assert_eq!(
        app.post(Some("tok-b"), turn("sA1", "b2", "mine too"))
            .await
            .0,
        202
    );
    let mut seen = String::new();
    let heard = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(chunk) = b_events.chunk().await.unwrap() {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains("id: b2\n") {
                return;
            }
        }
    })
    .await;
    assert!(heard.is_ok(), "B's own turn never came; saw {seen:?}");
    assert!(!seen.contains("id: a2\n"), "B heard A's turn: {seen}");

    // An admin names the tenant whose session it reads; a tenant's token may not.
    let (status, admin) = app
        .get(Some("tok-root"), "/v1/sessions/sA1?tenant=tenant-a")
        .await;
    assert_eq!(status, 200, "{admin}");
    assert_eq!(admin["result"]["turns"].as_array().unwrap().len(), 2);
    let (status, admin_b) = app
        .get(
            Some("tok-root"),
            "/v1/sessions/sA1/turns/t1?tenant=tenant-b",
        )
        .await;
    assert_eq!(status, 200, "{admin_b}");
    assert_eq!(admin_b["result"], b_done);
    let (status, refused) = app
        .get(Some("tok-b"), "/v1/sessions/sA1?tenant=tenant-a")
        .await;
    assert_eq!((status, code(&refused)), (403, "FORBIDDEN"), "{refused}");
}

/// Path ids follow the body's id rules: `400 INVALID_ID` naming the rule, never echoing the id.
async fn path_ids_are_checked_like_body_ids(backend: Backend) {
    let app = app(backend).await;
    let long = "x".repeat(10_000);
    for path in [
        "/v1/sessions/sA1%00".to_string(),
        format!("/v1/sessions/{long}"),
        format!("/v1/sessions/{long}/turns/t"),
        "/v1/sessions/s/turns/t%20t".to_string(),
        "/v1/sessions/s%7Bx%7D/turns/t/inspect".to_string(),
    ] {
        let (status, body) = app.get(Some("tok-a"), &path).await;
        assert_eq!((status, code(&body)), (400, "INVALID_ID"), "{path}: {body}");
        let message = body["errors"][0]["message"].as_str().unwrap();
        assert!(
            message.len() < 200 && !message.contains("xxxxxxxx"),
            "{message}"
        );
    }
    let (status, body) = app
        .post_to(
            Some("tok-a"),
            &format!("/v1/sessions/{long}/turns/t/cancel"),
            String::new(),
        )
        .await;
    assert_eq!((status, code(&body)), (400, "INVALID_ID"), "{body}");
    let status = subscribe_once(&app, "tok-a", "a%20b").await;
    assert_eq!(status, 400);
    // A tenant named in the query is held to the tenant rules too.
    let (status, body) = app
        .get(Some("tok-root"), "/v1/sessions/s?tenant=tenant-a%2Fx")
        .await;
    assert_eq!((status, code(&body)), (400, "INVALID_PARAMETER"), "{body}");
}

/// Only a bare id is claimed for its tenant: a scoped session's keys name their tenant, so its
/// first turn writes no owner; a bare id (the local tenant's) is still claimed, and one a
/// tenant owned from before ids were scoped stays out of the local tenant's reach.
async fn only_bare_ids_are_claimed(backend: Backend) {
    let app = app(backend).await;
    let t = aptix_worker::contract::TurnId::parse("t").unwrap();
    let (status, body) = app.post(Some("tok-a"), turn("s", "t", "hi")).await;
    assert_eq!(status, 202, "{body}");
    let scoped = crate::support::sid_a("s");
    assert!(app.store.get_turn(&scoped, &t).await.unwrap().is_some());
    assert_eq!(
        app.store.owner(&scoped).await.unwrap(),
        None,
        "nothing claimed"
    );

    let local = spawn(AppOptions {
        backend,
        extra_env: vec![("APTIX_API_TOKENS", String::new())],
        ..AppOptions::default()
    })
    .await;
    let bare = |id: &str| aptix_worker::contract::SessionId::parse(id).unwrap();
    let (status, body) = local.post(None, turn("mine", "t", "hi")).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        local.store.owner(&bare("mine")).await.unwrap().as_deref(),
        Some("local")
    );
    // As a version from before scoping left it: tenant-x owns the bare id "legacy".
    local
        .store
        .claim_owner(&bare("legacy"), "tenant-x")
        .await
        .unwrap();
    let (status, body) = local.post(None, turn("legacy", "t", "hi")).await;
    assert_eq!((status, code(&body)), (404, "TURN_NOT_FOUND"), "{body}");
    let recorded = local.store.get_turn(&bare("legacy"), &t).await.unwrap();
    assert!(recorded.is_none(), "nothing recorded: {recorded:?}");
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [
        one_tenants_ids_are_not_anothers,
        path_ids_are_checked_like_body_ids,
        only_bare_ids_are_claimed,
    ],
);
