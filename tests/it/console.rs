//! The console in a real browser: Debian's `chromium`, headless, driven through
//! `chromedriver` (both from Debian's packages; `.ci/run` installs them). The page is used as
//! a person would: the token typed in, a turn watched as it streams and then inspected, a batch
//! followed to 100 %, a running turn cancelled with its button, and another tenant's token
//! shown nothing. Screenshots of each page go to `target/tmp/console/`.

use std::time::{Duration, Instant};

use aptix_worker::fake_llm::{FakeOptions, Reply};
use serde_json::json;

use crate::app::{App, AppOptions, Backend, spawn};
use crate::support::browser::Browser;

async fn console_app() -> App {
    spawn(AppOptions {
        backend: Backend::Embedded,
        extra_env: vec![("APTIX_CONSOLE", "true".into())],
        fake: FakeOptions {
            stream_pieces: 16,
            stream_delay: Duration::from_millis(120),
            ..FakeOptions::default()
        },
        ..AppOptions::default()
    })
    .await
}

#[tokio::test]
async fn the_console_shows_a_turn_streaming_then_its_calls_and_a_batch_reaching_100_percent() {
    let app = console_app().await;
    let browser = Browser::start().await;
    browser.sign_in(&app.base, "tok-a").await;
    let instruction = "Which modes are there?\n#fake:call agent_list_modes {}";
    let body =
        json!({"sessionId": "ui", "turnId": "t1", "instruction": instruction, "streaming": true});
    assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
    browser.show(&app.base, "/turn/ui/t1").await;
    // The text appears while the turn still runs.
    browser
        .text_when("#live", Duration::from_secs(15), |t| !t.is_empty())
        .await;
    let running = browser
        .attr("#inspector .status", "data-status")
        .await
        .unwrap_or_default();
    assert_eq!(running, "running", "the text came before the turn settled");
    browser.shot("inspector-streaming").await;
    browser
        .text_when("#inspector .status", Duration::from_secs(20), |t| {
            t == "completed"
        })
        .await;
    let answer = browser
        .text_when("#answer", Duration::from_secs(5), |t| !t.is_empty())
        .await;
    let settled = app.settled("tok-a", "ui", "t1").await;
    assert_eq!(
        answer,
        settled["result"]["result"]["primaryOutputText"]
            .as_str()
            .unwrap()
    );
    assert_eq!(browser.count(".model-call").await, 2);
    let tool = browser
        .text_when(".tool-call", Duration::from_secs(5), |_| true)
        .await;
    assert!(tool.contains("agent_list_modes"), "{tool}");
    browser
        .text_when("#timeline", Duration::from_secs(5), |t| {
            t.contains("queued") && t.contains("run started") && t.contains("completed")
        })
        .await;
    browser.shot("inspector").await;

    // The session's turns.
    browser.show(&app.base, "/turns/ui").await;
    browser
        .text_when("#turns", Duration::from_secs(5), |t| t.contains("t1"))
        .await;
    browser.shot("turns").await;

    // A batch, followed to the end.
    let lines: Vec<String> = (0..6)
        .map(|i| json!({"customId": format!("doc-{i}"), "request": {"instruction": format!("review {i}")}}).to_string())
        .collect();
    let (status, accepted) = app
        .post_to(Some("tok-a"), "/v1/batches", lines.join("\n"))
        .await;
    assert_eq!(status, 202, "{accepted}");
    let id = accepted["result"]["batchId"].as_str().unwrap();
    browser.show(&app.base, &format!("/batches/{id}")).await;
    browser
        .text_when("#percent", Duration::from_secs(30), |t| {
            t.starts_with("100 %")
        })
        .await;
    let width = browser
        .attr("#bar > div", "style")
        .await
        .unwrap_or_default();
    assert!(width.contains("100%"), "{width}");
    browser.shot("batch").await;
}

/// The inspector lists an MCP tool call (our source) and a hosted one (run by the model
/// server) with the built-in calls, each saying where it ran.
#[tokio::test]
async fn the_inspector_shows_mcp_and_hosted_tool_calls() {
    let server = crate::mcp_support::HttpServer::start().await;
    let file = crate::mcp_support::ToolsFile::new(vec![
        server.source("calc", json!({"approval": ["add"]})),
    ]);
    let model = crate::contexts::fake("sk-console-0123456789", Duration::ZERO).await;
    let contexts = std::env::temp_dir().join(format!("aptix-console-{}.json", std::process::id()));
    let context = json!({"agentContexts": [{"id": "default", "baseUrl": model.base_url(),
        "apiKeyEnv": "CONSOLE_KEY", "model": "m", "hostedTools": [{"type": "web_search"}]}]});
    std::fs::write(&contexts, context.to_string()).unwrap();
    let mut env = file.env();
    env.extend([
        ("APTIX_CONSOLE", "true".to_string()),
        ("APTIX_CONTEXTS_FILE", contexts.display().to_string()),
        ("CONSOLE_KEY", "sk-console-0123456789".to_string()),
    ]);
    let app = spawn(AppOptions {
        backend: Backend::Embedded,
        extra_env: env,
        ..AppOptions::default()
    })
    .await;
    let _ = std::fs::remove_file(&contexts);
    app.wait_for_metric("aptix_tool_source_up{source=\"calc\"}", |v| v == 1.0)
        .await;
    for (turn, instruction) in [
        ("t1", "#fake:call lookup {\"city\": \"Oslo\"}"),
        ("t2", "#fake:hosted web_search aptix"),
    ] {
        let body = json!({"sessionId": "tools", "turnId": turn, "instruction": instruction});
        assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
        assert_eq!(
            app.settled("tok-a", "tools", turn).await["status"],
            "completed"
        );
    }
    // A call that needs a person's approval: asked, approved, run.
    let body = json!({"sessionId": "tools", "turnId": "t3", "instruction": "#fake:call add {\"amount\": 3}"});
    assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
    let asked = app.settled("tok-a", "tools", "t3").await;
    assert_eq!(asked["status"], "awaiting_client_tools", "{asked}");
    let question = asked["result"]["result"]["toolCalls"][0]["toolCallId"]
        .as_str()
        .expect("the approval question")
        .to_string();
    let approved = json!({"sessionId": "tools", "turnId": "t3", "toolResults": [{
        "toolCallId": question, "executionMs": 2, "resultJson": json!({"approved": true}).to_string()}]});
    assert_eq!(app.post(Some("tok-a"), approved.to_string()).await.0, 202);
    assert_eq!(
        app.settled("tok-a", "tools", "t3").await["status"],
        "completed"
    );
    let browser = Browser::start().await;
    browser.sign_in(&app.base, "tok-a").await;
    browser.show(&app.base, "/turn/tools/t3").await;
    let row = browser
        .text_when("#timeline tr.approval", Duration::from_secs(10), |t| {
            t.contains("approval · add · MCP calc")
        })
        .await;
    assert!(row.contains("approved"), "{row}");
    // The approval comes before the call it let run.
    let kinds: Vec<String> = {
        let mut kinds = Vec::new();
        for row in browser
            .client
            .find_all(fantoccini::Locator::Css("#timeline tr.step"))
            .await
            .unwrap()
        {
            kinds.push(row.attr("data-kind").await.unwrap().unwrap_or_default());
        }
        kinds
    };
    let approval = kinds.iter().position(|k| k == "approval");
    let tool = kinds.iter().position(|k| k == "tool");
    assert!(
        approval.is_some() && tool.is_some() && approval < tool,
        "{kinds:?}"
    );
    for (turn, expected) in [
        ("t1", "lookup · MCP calc"),
        ("t2", "web_search · hosted by openai"),
    ] {
        browser
            .show(&app.base, &format!("/turn/tools/{turn}"))
            .await;
        let row = browser
            .text_when(".tool-call", Duration::from_secs(10), |t| {
                t.contains(expected)
            })
            .await;
        assert!(row.contains(expected), "{row}");
    }
    browser.shot("inspector-tools").await;
}

#[tokio::test]
async fn a_running_turn_is_cancelled_from_the_page_and_another_tenant_sees_nothing() {
    let app = console_app().await;
    let browser = Browser::start().await;
    app.fake.push([Reply::Delay(
        Duration::from_secs(20),
        Box::new(Reply::Text("never".into())),
    )]);
    let body = json!({"sessionId": "cx", "turnId": "t", "instruction": "slow"});
    assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
    app.wait_for_model_calls(1).await;
    browser.sign_in(&app.base, "tok-a").await;
    browser.show(&app.base, "/turn/cx/t").await;
    browser
        .text_when("#inspector .status", Duration::from_secs(10), |t| {
            t == "running"
        })
        .await;
    // Cancel asks first: dismissed, nothing happens; accepted, the turn stops.
    browser.press(None, "Cancel turn").await;
    let asked = browser.confirm(false).await;
    assert!(asked.starts_with("Cancel turn t?"), "{asked}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        browser
            .attr("#inspector .status", "data-status")
            .await
            .as_deref(),
        Some("running")
    );
    browser.press(None, "Cancel turn").await;
    browser.confirm(true).await;
    browser
        .text_when("#inspector .status", Duration::from_secs(10), |t| {
            t == "cancelled"
        })
        .await;
    assert_eq!(app.settled("tok-a", "cx", "t").await["status"], "cancelled");
    browser.shot("cancelled").await;

    // Tenant B: the page shows the API's refusal, and the API refuses it too.
    browser.press(None, "Forget token").await;
    browser.sign_in(&app.base, "tok-b").await;
    browser.show(&app.base, "/turn/cx/t").await;
    let refused = browser
        .text_when("#error", Duration::from_secs(10), |t| !t.is_empty())
        .await;
    assert!(refused.starts_with("TURN_NOT_FOUND"), "{refused}");
    assert_eq!(browser.count(".model-call").await, 0);
    let (status, _) = app
        .get(Some("tok-b"), "/v1/sessions/cx/turns/t/inspect")
        .await;
    assert_eq!(status, 404);
    browser.shot("other-tenant").await;

    // Tenant B looks up a session A has not used yet: the inspector opens its (B's) empty
    // session and writes nothing, so A's first turn there is A's as ever.
    browser.show(&app.base, "/turn/cy/t1").await;
    let refused = browser
        .text_when("#error", Duration::from_secs(10), |t| !t.is_empty())
        .await;
    assert!(refused.starts_with("TURN_NOT_FOUND"), "{refused}");
    let body = json!({"sessionId": "cy", "turnId": "t1", "instruction": "mine"});
    let (status, accepted) = app.post(Some("tok-a"), body.to_string()).await;
    assert_eq!(status, 202, "{accepted}");
    assert_eq!(
        app.settled("tok-a", "cy", "t1").await["status"],
        "completed"
    );
}

/// Off unless asked for: without `APTIX_CONSOLE` there is no `/console`.
#[tokio::test]
async fn the_console_is_off_unless_configured() {
    let app = spawn(AppOptions {
        backend: Backend::Embedded,
        ..AppOptions::default()
    })
    .await;
    let status = app
        .http
        .get(format!("{}/console", app.base))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 404);
    let on = console_app().await;
    let page = on
        .http
        .get(format!("{}/console", on.base))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let policy = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(policy.contains("default-src 'none'"), "{policy}");
}

/// An admin token's console: the System page charts the results the worker reports, lists
/// the worker, the queues and the tenants, and requeues a dead letter with its button; the
/// batch list follows a batch to 100 %; the admin may open another tenant's turn. A tenant's
/// token gets no System link, and the API refuses it the system (403).
#[tokio::test]
async fn an_admin_sees_the_system_charts_requeues_a_dead_letter_and_lists_batches() {
    let app = spawn(AppOptions {
        backend: Backend::Embedded,
        extra_env: vec![
            ("APTIX_CONSOLE", "true".into()),
            (
                "APTIX_API_TOKENS",
                "tok-a=tenant-a,tok-b=tenant-b,tok-root=ops:admin".into(),
            ),
            // One attempt: a model that is down dead-letters the turn's job at once.
            ("APTIX_MAX_ATTEMPTS", "1".into()),
        ],
        ..AppOptions::default()
    })
    .await;
    for session in ["dl", "dz"] {
        app.fake.push([Reply::Error {
            status: 500,
            message: "the model server is down".into(),
            retry_after_ms: None,
        }]);
        let body = json!({"sessionId": session, "turnId": "t1", "instruction": "hello"});
        assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
        assert_eq!(
            app.settled("tok-a", session, "t1").await["status"],
            "failed"
        );
    }
    // Their jobs are dead-lettered just after their status goes out.
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.get(Some("tok-root"), "/v1/admin/dead-letters").await.1["result"]
        .as_array()
        .map_or(0, Vec::len)
        < 2
    {
        assert!(Instant::now() < deadline, "never dead-lettered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..6 {
        let body = json!({"sessionId": format!("load-{i}"), "turnId": "t", "instruction": "hi"});
        assert_eq!(app.post(Some("tok-a"), body.to_string()).await.0, 202);
    }
    for i in 0..6 {
        app.settled("tok-a", &format!("load-{i}"), "t").await;
    }
    let lines: Vec<String> = (0..4)
        .map(|i| json!({"customId": format!("doc-{i}"), "request": {"instruction": format!("review {i}")}}).to_string())
        .collect();
    let (status, accepted) = app
        .post_to(Some("tok-a"), "/v1/batches", lines.join("\n"))
        .await;
    assert_eq!(status, 202, "{accepted}");
    let batch = accepted["result"]["batchId"].as_str().unwrap().to_string();

    // The API: a tenant's token may not read the system; an admin's may read any tenant's turn.
    let (status, refused) = app.get(Some("tok-a"), "/v1/admin/system").await;
    assert_eq!((status, crate::app::code(&refused)), (403, "FORBIDDEN"));
    assert_eq!(
        app.get(Some("tok-b"), "/v1/admin/dead-letters").await.0,
        403
    );
    let (status, _) = app
        .get(
            Some("tok-root"),
            "/v1/sessions/dl/turns/t1/inspect?tenant=tenant-a",
        )
        .await;
    assert_eq!(status, 200, "an admin reads another tenant's turn");

    let browser = Browser::start().await;
    browser.sign_in(&app.base, "tok-root").await;
    browser.show(&app.base, "/system").await;
    browser
        .text_when("#workers", Duration::from_secs(15), |t| {
            t.contains("Workers (1)")
        })
        .await;
    // The worker's next heartbeat (every 5 s) carries the slots the turns settled in.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let points = browser
            .attr(".charts", "data-points")
            .await
            .and_then(|p| p.parse::<usize>().ok())
            .unwrap_or(0);
        if points > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the charts never had a point");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(browser.count("#chart-rate canvas").await, 1);
    assert_eq!(browser.count("#chart-latency canvas").await, 1);
    assert!(
        browser.attr("#nav-system", "hidden").await.is_none(),
        "an admin sees the System link"
    );
    browser
        .text_when("#queues", Duration::from_secs(5), |t| t.contains("dead"))
        .await;
    browser
        .text_when("#tenants", Duration::from_secs(5), |t| {
            t.contains("tenant-a") && t.contains("ops")
        })
        .await;
    browser
        .text_when("#dead-letters", Duration::from_secs(15), |t| {
            t.contains("dl / t1") && t.contains("tenant-a")
        })
        .await;
    browser.shot("system").await;
    // The dead letter's turn opens in the inspector as its tenant's (an admin names it).
    browser.show(&app.base, "/turn/dl/t1/tenant-a").await;
    browser
        .text_when("#inspector .status", Duration::from_secs(10), |t| {
            t == "failed"
        })
        .await;
    browser.show(&app.base, "/system").await;
    // Refresh reads the queue again: the same two jobs.
    browser.press(Some("#dead-letters"), "Refresh").await;
    browser
        .text_when("#dead-letters", Duration::from_secs(10), |t| {
            t.contains("Dead letters (2)") && t.contains("dl / t1")
        })
        .await;
    // Discard asks first; dismissed, the job stays; accepted, it goes and the page says so.
    browser
        .press(Some("#dead-letters tr[data-session='dz']"), "Discard")
        .await;
    browser.confirm(false).await;
    browser.press(Some("#dead-letters"), "Refresh").await;
    browser
        .text_when("#dead-letters", Duration::from_secs(10), |t| {
            t.contains("Dead letters (2)")
        })
        .await;
    browser
        .press(Some("#dead-letters tr[data-session='dz']"), "Discard")
        .await;
    let asked = browser.confirm(true).await;
    assert!(
        asked.contains("Discard the job of turn t1 (session dz)"),
        "{asked}"
    );
    let told = browser
        .text_when("#dead-outcome", Duration::from_secs(10), |t| !t.is_empty())
        .await;
    assert!(told.starts_with("Discarded 1 job"), "{told}");
    browser
        .text_when("#dead-letters", Duration::from_secs(10), |t| {
            t.contains("Dead letters (1)") && !t.contains("dz / t1")
        })
        .await;
    let repeats = "aptix_duplicates_suppressed_total{stage=\"worker\"}";
    let before = crate::support::metric_value(&app.metrics_text().await, repeats).unwrap_or(0.0);
    browser.press(Some("#dead-letters"), "Requeue").await;
    browser.confirm(true).await;
    // The page says what a requeue of a settled turn does.
    let told = browser
        .text_when("#dead-outcome", Duration::from_secs(10), |t| {
            t.starts_with("Requeued")
        })
        .await;
    assert!(
        told.contains("1 of their turns had settled already"),
        "{told}"
    );
    browser
        .text_when("#dead-letters", Duration::from_secs(10), |t| {
            t.contains("None.")
        })
        .await;
    browser.shot("dead-letters-outcome").await;
    // Requeued, its job ran again: the turn had failed already, so the worker answered it from
    // the stored result (a repeat it counts), and nothing went back to the dead letters.
    app.wait_for_metric(repeats, |n| n > before).await;
    let (status, dead) = app.get(Some("tok-root"), "/v1/admin/dead-letters").await;
    assert_eq!(status, 200);
    assert_eq!(dead["result"], json!([]), "{dead}");

    // The batch list.
    browser.show(&app.base, "/batches").await;
    browser
        .text_when(
            &format!("tr[data-batch='{batch}']"),
            Duration::from_secs(30),
            |t| t.contains("100 %"),
        )
        .await;
    browser.shot("batches").await;
    browser.click(&format!("tr[data-batch='{batch}'] a")).await;
    browser
        .text_when("#batch-lines", Duration::from_secs(10), |t| {
            t.contains("doc-3") && t.contains("completed")
        })
        .await;
    assert_eq!(browser.count(".batch-line a").await, 4);
    browser.shot("batch-lines").await;

    // A tenant's token: no System link.
    browser.press(None, "Forget token").await;
    browser.sign_in(&app.base, "tok-b").await;
    browser.show(&app.base, "/batches").await;
    browser
        .text_when("#batch-list", Duration::from_secs(10), |t| {
            t.starts_with("No batches yet")
        })
        .await;
    let hidden = browser.attr("#nav-system", "hidden").await;
    assert!(hidden.is_some(), "a tenant's token sees no System link");
}
