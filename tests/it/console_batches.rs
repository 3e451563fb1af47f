//! A batch's page in a real browser, on both backends: a batch with completed, failed,
//! waiting and rejected lines shows a bar in segments whose counts add up to its line count
//! (a line waiting for its client's tools is not counted done), each failed or rejected line
//! with why, and a link to its failed turns in the runs list; its failed lines are sent again
//! from the file it was made from, and the retry's page and the batch's link to each other.

use std::time::Duration;

use aptix_worker::fake_llm::Reply;
use fantoccini::Locator;
use serde_json::json;

use crate::app::{AppOptions, Backend, spawn};
use crate::support::browser::Browser;

async fn a_batch_page_adds_up(backend: Backend, name: &str) {
    let app = spawn(AppOptions {
        backend,
        extra_env: vec![("APTIX_CONSOLE", "true".into())],
        ..AppOptions::default()
    })
    .await;
    // The first three model calls: two refused, one asking the client to read a file; the
    // other two lines complete.
    let refused = || Reply::Error {
        status: 400,
        message: "the request was refused".into(),
        retry_after_ms: None,
    };
    app.fake.push([
        refused(),
        refused(),
        Reply::Calls(vec![(
            "workspace_read_file".into(),
            json!({"path": "README.md"}),
        )]),
    ]);
    let mut lines: Vec<String> = (0..5)
        .map(|i| json!({"customId": format!("doc-{i}"), "request": {"instruction": format!("review {i}")}}).to_string())
        .collect();
    lines.push(json!({"customId": "broken", "request": {}}).to_string());
    let (status, accepted) = app
        .post_to(Some("tok-a"), "/v1/batches", lines.join("\n"))
        .await;
    assert_eq!(status, 202, "{accepted}");
    let id = accepted["result"]["batchId"].as_str().unwrap().to_string();

    let browser = Browser::start().await;
    browser.sign_in(&app.base, "tok-a").await;
    browser.show(&app.base, &format!("/batches/{id}")).await;
    let legend = browser
        .text_when("ul.legend", Duration::from_secs(30), |t| {
            t.contains("2 completed")
                && t.contains("2 failed")
                && t.contains("1 rejected")
                && t.contains("1 waiting for client tools")
        })
        .await;
    // The segments' counts add up to the lines submitted.
    let mut sum = 0;
    for item in browser
        .client
        .find_all(Locator::Css("ul.legend li"))
        .await
        .unwrap()
    {
        let text = item.text().await.unwrap();
        sum += text
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("a count first: {text}"));
    }
    assert_eq!(sum, 6, "{legend}");
    // Five of six done (the waiting line is not); the bar has a segment per status present.
    let percent = browser
        .text_when("#percent", Duration::from_secs(5), |_| true)
        .await;
    assert!(percent.starts_with("83 % · 5 of 6 lines done"), "{percent}");
    assert_eq!(browser.count("#bar > div").await, 4);
    // Failed and rejected lines say why.
    browser
        .text_when("#batch-lines", Duration::from_secs(10), |t| {
            t.contains("broken")
        })
        .await;
    let mut why = Vec::new();
    for row in browser
        .client
        .find_all(Locator::Css("tr.batch-line"))
        .await
        .unwrap()
    {
        let status = row.attr("data-status").await.unwrap().unwrap_or_default();
        let error = row
            .find(Locator::Css("td.error-text"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if matches!(status.as_str(), "failed" | "rejected") {
            assert!(!error.is_empty(), "a {status} line says why");
            why.push(error);
        }
    }
    assert_eq!(why.len(), 3, "{why:?}");
    // The page's heading counts the lines it shows: six, not "1–50".
    let heading = browser
        .client
        .find(Locator::XPath("//section[.//div[@id='batch-lines']]/h2"))
        .await
        .expect("the lines' heading")
        .text()
        .await
        .unwrap_or_default();
    assert_eq!(heading, "Lines 1–6 of 6");
    assert_eq!(
        browser.count("tr.batch-line").await,
        6,
        "every line on one page"
    );
    assert!(why.iter().any(|w| w.starts_with("LLM_REJECTED")), "{why:?}");
    assert!(why.iter().any(|w| w.starts_with("EMPTY_TURN")), "{why:?}");
    browser.shot(&format!("batch-segments-{name}")).await;
    // Its failed turns, in the runs list.
    browser.press(None, "Its failed turns").await;
    browser
        .text_when("#runs", Duration::from_secs(10), |t| {
            t.contains("LLM_REJECTED")
        })
        .await;
    assert_eq!(browser.count("tr.run").await, 2);

    // Its failed lines sent again: the operator picks the batch's file; the two failed lines
    // and the rejected one go as a new batch, which opens.
    browser.show(&app.base, &format!("/batches/{id}")).await;
    browser.press(None, "Retry failed lines").await;
    let file = std::env::temp_dir().join(format!(
        "aptix-retry-{}.ndjson",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&file, lines.join("\n")).unwrap();
    browser.attach("was made from", &file).await;
    browser.press(None, "Send the failed lines again").await;
    // The retry's page, or why the batch page could not send.
    let shown = browser
        .text_when("#view", Duration::from_secs(30), |t| {
            t.contains("Sends again the failed lines of batch") || t.contains("Not sent:")
        })
        .await;
    assert!(!shown.contains("Not sent:"), "{shown}");
    let origin = browser
        .text_when("#retry-of", Duration::from_secs(5), |t| t.contains(&id))
        .await;
    assert!(
        origin.starts_with("Sends again the failed lines of batch"),
        "{origin}"
    );
    // The browser reads the file once the button is pressed: it goes only after the retry's
    // page shows (removed sooner, a loaded machine's browser found it gone).
    let _ = std::fs::remove_file(&file);
    let retried = browser
        .text_when("ul.legend", Duration::from_secs(30), |t| {
            t.contains("2 completed") && t.contains("1 rejected")
        })
        .await;
    assert_eq!(browser.count("ul.legend li").await, 2, "{retried}");
    let percent = browser
        .text_when("#percent", Duration::from_secs(5), |_| true)
        .await;
    assert!(
        percent.starts_with("100 % · 3 of 3 lines done"),
        "{percent}"
    );
    browser
        .text_when("#batch-lines", Duration::from_secs(10), |t| {
            t.contains("broken")
        })
        .await;
    browser.shot(&format!("batch-retried-{name}")).await;
    // The first batch links to its retry and offers no second one.
    browser.show(&app.base, &format!("/batches/{id}")).await;
    let outcome = browser
        .text_when("#retry-outcome", Duration::from_secs(10), |t| !t.is_empty())
        .await;
    assert!(
        outcome.starts_with("Its failed lines were sent again as batch batch-"),
        "{outcome}"
    );
    let retry_id = browser
        .attr("#retried-as", "href")
        .await
        .unwrap_or_default();
    assert!(retry_id.starts_with("#/batches/batch-"), "{retry_id}");
    let open = browser
        .client
        .find(Locator::Css("#retry-open"))
        .await
        .unwrap()
        .is_displayed()
        .await
        .unwrap();
    assert!(!open, "a batch is retried once");
}

#[tokio::test]
async fn a_batch_page_adds_up_on_the_services() {
    a_batch_page_adds_up(Backend::Services, "services").await;
}

#[tokio::test]
async fn a_batch_page_adds_up_embedded() {
    a_batch_page_adds_up(Backend::Embedded, "embedded").await;
}
