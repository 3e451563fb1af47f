//! The console's home page in a real browser, on both backends: the latest turns of the
//! token's tenant, live while open; filtered to the failed one with the form, which shows why
//! it failed and opens in the inspector; another tenant's token sees none of them, an admin's
//! sees both tenants'.

use std::time::Duration;

use aptix_worker::fake_llm::Reply;
use fantoccini::Locator;
use serde_json::json;

use crate::app::{App, AppOptions, Backend, spawn};
use crate::support::browser::Browser;

async fn app(backend: Backend) -> App {
    spawn(AppOptions {
        backend,
        extra_env: vec![
            ("APTIX_CONSOLE", "true".into()),
            (
                "APTIX_API_TOKENS",
                "tok-a=tenant-a,tok-b=tenant-b,tok-root=ops:admin".into(),
            ),
        ],
        ..AppOptions::default()
    })
    .await
}

async fn run(app: &App, token: &str, session: &str, turn: &str) -> String {
    let body = json!({"sessionId": session, "turnId": turn, "instruction": "hello"});
    assert_eq!(app.post(Some(token), body.to_string()).await.0, 202);
    app.settled(token, session, turn).await["status"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn the_home_page_lists_turns_and_finds_the_failed_one(backend: Backend, name: &str) {
    let app = app(backend).await;
    assert_eq!(run(&app, "tok-a", "alpha", "t1").await, "completed");
    app.fake.push([Reply::Error {
        status: 400,
        message: "the request was refused".into(),
        retry_after_ms: None,
    }]);
    assert_eq!(run(&app, "tok-a", "alpha", "t2").await, "failed");
    assert_eq!(run(&app, "tok-a", "beta", "t1").await, "completed");
    assert_eq!(run(&app, "tok-b", "gamma", "t1").await, "completed");

    let browser = Browser::start().await;
    browser.sign_in(&app.base, "tok-a").await;
    // Home is the runs list: tenant-a's three turns, newest first.
    browser
        .text_when("#runs", Duration::from_secs(10), |t| t.contains("beta"))
        .await;
    assert_eq!(browser.count("tr.run").await, 3);
    let first = browser.attr("tr.run", "data-session").await;
    assert_eq!(first.as_deref(), Some("beta"), "newest first");
    assert!(
        !browser
            .text_when("#runs", Duration::ZERO, |_| true)
            .await
            .contains("gamma"),
        "another tenant's turn is not listed"
    );
    // Live: a turn accepted while the page is open shows without a reload.
    assert_eq!(run(&app, "tok-a", "delta", "t1").await, "completed");
    browser
        .text_when("#runs", Duration::from_secs(10), |t| t.contains("delta"))
        .await;
    assert_eq!(browser.count("tr.run").await, 4);

    // Filtered to failed turns with the form, as a person would.
    browser
        .client
        .find(Locator::Css("#f-status"))
        .await
        .expect("the status filter")
        .select_by_value("failed")
        .await
        .expect("failed is an option");
    browser.press(Some("#runs-filters"), "Show").await;
    browser
        .text_when("#runs", Duration::from_secs(10), |t| {
            t.contains("alpha") && !t.contains("beta")
        })
        .await;
    assert_eq!(browser.count("tr.run").await, 1);
    let why = browser
        .text_when("tr.run td.error-text", Duration::from_secs(5), |t| {
            !t.is_empty()
        })
        .await;
    assert!(why.starts_with("LLM_"), "{why}");
    browser.shot(&format!("runs-failed-{name}")).await;
    // Opened: the inspector of that turn.
    browser.click("tr.run td a").await;
    browser
        .text_when("#inspector h2", Duration::from_secs(10), |t| {
            t.contains("t2") && t.contains("failed")
        })
        .await;

    // An admin sees both tenants' turns; the tenant filter narrows them to one.
    browser.press(None, "Forget token").await;
    browser.sign_in(&app.base, "tok-root").await;
    browser.show(&app.base, "/runs").await;
    browser
        .text_when("#runs", Duration::from_secs(10), |t| {
            t.contains("gamma") && t.contains("alpha")
        })
        .await;
    browser.show(&app.base, "/runs?tenant=tenant-b").await;
    browser
        .text_when("#runs", Duration::from_secs(10), |t| {
            t.contains("gamma") && !t.contains("alpha")
        })
        .await;
    assert_eq!(browser.count("tr.run").await, 1);
}

#[tokio::test]
async fn the_home_page_lists_turns_on_the_services() {
    the_home_page_lists_turns_and_finds_the_failed_one(Backend::Services, "services").await;
}

#[tokio::test]
async fn the_home_page_lists_turns_embedded() {
    the_home_page_lists_turns_and_finds_the_failed_one(Backend::Embedded, "embedded").await;
}

/// Every script and style sheet the page names is served, as what it is: a page that names a
/// file the binary does not serve breaks in the browser without a word.
#[tokio::test]
async fn every_asset_the_page_names_is_served() {
    let app = app(Backend::Embedded).await;
    let page = app
        .http
        .get(format!("{}/console", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let named: Vec<&str> = page
        .split(['"', '\''])
        .filter(|p| p.starts_with("/console/"))
        .collect();
    assert!(named.len() >= 8, "{named:?}");
    for path in named {
        let resp = app
            .http
            .get(format!("{}{path}", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let kind = resp.headers()["content-type"].to_str().unwrap().to_string();
        let wanted = if path.ends_with(".js") {
            "text/javascript"
        } else {
            "text/css"
        };
        assert!(kind.starts_with(wanted), "{path}: {kind}");
    }
}

/// A tenant's own overview: its usage today, its open turns and its batches — and nothing of
/// another tenant's, whose turn waits and whose batch ran at the same time.
#[tokio::test]
async fn a_tenants_overview_shows_only_that_tenant() {
    let app = app(Backend::Embedded).await;
    let waits = || {
        Reply::Calls(vec![(
            "workspace_read_file".into(),
            json!({"path": "README.md"}),
        )])
    };
    let mut batches = Vec::new();
    for (token, session) in [("tok-a", "mine"), ("tok-b", "theirs")] {
        app.fake.push([waits()]);
        let body = json!({"sessionId": session, "turnId": "t1", "instruction": "read"});
        assert_eq!(app.post(Some(token), body.to_string()).await.0, 202);
        assert_eq!(
            app.settled(token, session, "t1").await["status"],
            "awaiting_client_tools"
        );
        let line = json!({"customId": "doc", "request": {"instruction": "review"}});
        let (status, accepted) = app
            .post_to(Some(token), "/v1/batches", line.to_string())
            .await;
        assert_eq!(status, 202, "{accepted}");
        batches.push(accepted["result"]["batchId"].as_str().unwrap().to_string());
    }
    let browser = Browser::start().await;
    browser.sign_in(&app.base, "tok-a").await;
    browser.show(&app.base, "/overview").await;
    let usage = browser
        .text_when("#tenant-usage", Duration::from_secs(10), |t| {
            t.contains("Tenant tenant-a today") && t.contains("default")
        })
        .await;
    assert!(usage.contains("Tokens:"), "{usage}");
    let open = browser
        .text_when("#tenant-running", Duration::from_secs(10), |t| {
            t.contains("mine / t1")
        })
        .await;
    assert!(!open.contains("theirs"), "{open}");
    let listed = browser
        .text_when("#tenant-batches", Duration::from_secs(10), |t| {
            t.contains(batches[0].as_str())
        })
        .await;
    assert!(!listed.contains(batches[1].as_str()), "{listed}");
    browser.shot("tenant-overview").await;
}
