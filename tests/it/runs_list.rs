//! The runs list (`GET /v1/turns`) from outside, on both backends: a tenant's token lists its
//! own turns newest first and never another tenant's; an admin's lists every tenant's, or
//! one's; filters by status, id, agent context, batch and time; pages that follow `next` see
//! every turn once; a parameter it cannot read is a 400 that names it.

use std::collections::BTreeSet;

use aptix_worker::fake_llm::Reply;
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

async fn run(app: &App, token: &str, session: &str, turn: &str) -> Value {
    let body = json!({"sessionId": session, "turnId": turn, "instruction": "hello"});
    assert_eq!(app.post(Some(token), body.to_string()).await.0, 202);
    app.settled(token, session, turn).await
}

/// `(session, turn)` of each line, in order.
fn lines(listing: &Value) -> Vec<(String, String)> {
    listing["turns"]
        .as_array()
        .unwrap_or_else(|| panic!("no turns in {listing}"))
        .iter()
        .map(|l| {
            (
                l["sessionId"].as_str().unwrap_or_default().to_string(),
                l["turnId"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

async fn list(app: &App, token: &str, query: &str) -> Value {
    let (status, body) = app.get(Some(token), &format!("/v1/turns{query}")).await;
    assert_eq!(status, 200, "{query}: {body}");
    body["result"].clone()
}

fn pair(s: &str, t: &str) -> (String, String) {
    (s.to_string(), t.to_string())
}

async fn the_runs_list_shows_a_tenants_turns_filtered_and_paged(backend: Backend) {
    let app = app(backend).await;
    // Unique ids per test run: the services keep other runs' turns.
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let (s1, s2) = (format!("one-{tag}"), format!("two-{tag}"));
    run(&app, "tok-a", &s1, "t1").await;
    app.fake.push([Reply::Error {
        status: 400,
        message: "the request was refused".into(),
        retry_after_ms: None,
    }]);
    assert_eq!(run(&app, "tok-a", &s1, "t2").await["status"], "failed");
    run(&app, "tok-a", &s2, "t1").await;
    run(&app, "tok-b", &s1, "t1").await;

    let mine = list(&app, "tok-a", "").await;
    assert_eq!(
        lines(&mine),
        [pair(&s2, "t1"), pair(&s1, "t2"), pair(&s1, "t1")],
        "newest first, only tenant-a's: {mine}"
    );
    assert!(mine.get("next").is_none(), "nothing more: {mine}");
    let first = &mine["turns"][2];
    assert_eq!(first["tenant"], "tenant-a");
    assert_eq!(first["status"], "completed");
    assert_eq!(first["modelCalls"], 1);
    assert_eq!(first["agentContext"], "default");
    assert!(
        first["usage"]["totalTokens"].as_u64().unwrap_or(0) > 0,
        "{first}"
    );
    assert!(first["durationMs"].is_u64(), "{first}");
    assert!(first.get("error").is_none(), "{first}");

    // By status: the failed one, with why.
    let failed = list(&app, "tok-a", "?status=failed").await;
    assert_eq!(lines(&failed), [pair(&s1, "t2")]);
    let why = failed["turns"][0]["error"].as_str().unwrap_or_default();
    assert!(why.starts_with("LLM_"), "{why}");
    // Empty parameters ask for nothing in particular.
    let empty = list(&app, "tok-a", "?status=&after=&q=&agentContext=&batch=").await;
    assert_eq!(lines(&empty), lines(&mine));
    let both = list(&app, "tok-a", "?status=failed,completed").await;
    assert_eq!(lines(&both).len(), 3);
    // By id text, any case; by agent context.
    let by_id = list(&app, "tok-a", &format!("?q=TWO-{tag}")).await;
    assert_eq!(lines(&by_id), [pair(&s2, "t1")]);
    assert_eq!(
        lines(&list(&app, "tok-a", "?agentContext=default").await).len(),
        3
    );
    assert!(lines(&list(&app, "tok-a", "?agentContext=elsewhere").await).is_empty());
    assert!(lines(&list(&app, "tok-a", "?batch=no-such-batch").await).is_empty());
    // By time: none accepted in the future, all since an hour ago.
    assert!(lines(&list(&app, "tok-a", "?since=2999-01-01T00:00:00Z").await).is_empty());
    let hour_ago = (time::OffsetDateTime::now_utc() - time::Duration::hours(1))
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let recent = list(&app, "tok-a", &format!("?since={}", urlencoding(&hour_ago))).await;
    assert_eq!(lines(&recent).len(), 3);
    assert!(lines(&list(&app, "tok-a", "?until=2000-01-01T00:00:00Z").await).is_empty());

    // Pages of one, each from the last one's `next`: every turn once, in order.
    let mut paged = Vec::new();
    let mut query = "?limit=1".to_string();
    for _ in 0..10 {
        let page = list(&app, "tok-a", &query).await;
        paged.extend(lines(&page));
        match page["next"].as_str() {
            Some(next) => query = format!("?limit=1&after={}", urlencoding(next)),
            None => break,
        }
    }
    assert_eq!(paged, lines(&mine));

    // Another tenant: its own only; naming tenant-a's is refused.
    let theirs = list(&app, "tok-b", "").await;
    assert_eq!(lines(&theirs), [pair(&s1, "t1")]);
    assert_eq!(theirs["turns"][0]["tenant"], "tenant-b");
    let (status, body) = app.get(Some("tok-b"), "/v1/turns?tenant=tenant-a").await;
    assert_eq!((status, code(&body)), (403, "FORBIDDEN"), "{body}");
    // An admin: every tenant's, or one's.
    let everyone = list(&app, "tok-root", "").await;
    let tenants: BTreeSet<&str> = everyone["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["sessionId"].as_str().is_some_and(|s| s.ends_with(&tag)))
        .map(|l| l["tenant"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(tenants, BTreeSet::from(["tenant-a", "tenant-b"]));
    let one = list(&app, "tok-root", &format!("?tenant=tenant-b&q={tag}")).await;
    assert_eq!(lines(&one), [pair(&s1, "t1")]);

    // Parameters it cannot read.
    for (query, names) in [
        ("?status=done", "status"),
        ("?since=yesterday", "since"),
        ("?after=nowhere", "after"),
        ("?limit=0", "limit"),
        ("?limit=201", "limit"),
    ] {
        let (status, body) = app.get(Some("tok-a"), &format!("/v1/turns{query}")).await;
        assert_eq!(
            (status, code(&body)),
            (400, "INVALID_PARAMETER"),
            "{query}: {body}"
        );
        let message = body["errors"][0]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(names), "{query}: {message}");
    }
    let (status, _) = app.get(None, "/v1/turns").await;
    assert_eq!(status, 401);
}

/// `s` as a query value.
fn urlencoding(s: &str) -> String {
    let pair = serde_urlencoded::to_string([("v", s)]).unwrap();
    pair["v=".len()..].to_string()
}

#[tokio::test]
async fn the_runs_list_on_the_services() {
    the_runs_list_shows_a_tenants_turns_filtered_and_paged(Backend::Services).await;
}

#[tokio::test]
async fn the_runs_list_embedded() {
    the_runs_list_shows_a_tenants_turns_filtered_and_paged(Backend::Embedded).await;
}
