//! A batch's failed lines sent again over HTTP (`POST /v1/batches/{id}/retry`), on both
//! backends: only the failed and rejected lines run again, each as a new turn in its first
//! try's session; a file that does not match is refused whole; a batch is retried once, once
//! its lines have settled, and two retries at once start each turn once.

use std::time::Duration;

use aptix_worker::fake_llm::Reply;
use serde_json::{Value, json};

use crate::app::{App, AppOptions, Backend, code, spawn};
use crate::http_batches::ndjson;

fn refused() -> Reply {
    Reply::Error {
        status: 400,
        message: "the request was refused".into(),
        retry_after_ms: None,
    }
}

/// The batch's progress once nothing in it is queued or running.
async fn settled(app: &App, token: &str, id: &str) -> Value {
    for _ in 0..300 {
        let (status, body) = app.get(Some(token), &format!("/v1/batches/{id}")).await;
        assert_eq!(status, 200, "{body}");
        let p = &body["result"];
        if p["queued"] == 0 && p["running"] == 0 {
            return p.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("batch {id} did not settle");
}

/// The batch's result lines.
async fn results(app: &App, token: &str, id: &str) -> Vec<Value> {
    let resp = app
        .http
        .get(format!("{}/v1/batches/{id}/results", app.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    ndjson(&resp.text().await.unwrap())
}

async fn retry(app: &App, token: &str, id: &str, file: &str) -> (u16, Value) {
    app.post_to(
        Some(token),
        &format!("/v1/batches/{id}/retry"),
        file.to_string(),
    )
    .await
}

fn line(custom_id: &str, request: Value) -> String {
    json!({"customId": custom_id, "request": request}).to_string()
}

async fn only_the_failed_lines_run_again(backend: Backend) {
    let app = spawn(AppOptions {
        backend,
        ..AppOptions::default()
    })
    .await;
    // The first two model calls are refused: two of the four good lines fail.
    app.fake.push([refused(), refused()]);
    let mut file: Vec<String> = (0..4)
        .map(|i| {
            line(
                &format!("doc-{i}"),
                json!({"instruction": format!("review {i}")}),
            )
        })
        .collect();
    file.push(line("broken", json!({}))); // line 5: rejected (an empty turn)
    file.push("{not json".into()); // line 6: rejected, no customId to read
    file.push(line("doc-0", json!({"instruction": "again"}))); // line 7: a repeated customId
    let (status, body) = app
        .post_to(Some("tok-a"), "/v1/batches", file.join("\n"))
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["result"]["batchId"].as_str().unwrap().to_string();
    let first = settled(&app, "tok-a", &id).await;
    assert_eq!(
        (first["completed"].as_u64(), first["failed"].as_u64()),
        (Some(2), Some(2))
    );
    let before = results(&app, "tok-a", &id).await;
    let failed: Vec<&Value> = before.iter().filter(|l| l["status"] == "failed").collect();
    let failed_lines: Vec<u64> = failed.iter().map(|l| l["line"].as_u64().unwrap()).collect();

    // Another tenant cannot retry it: the batch does not exist for it.
    let (status, body) = retry(&app, "tok-b", &id, &file.join("\n")).await;
    assert_eq!((status, code(&body)), (404, "BATCH_NOT_FOUND"), "{body}");
    // A file whose failed line carries another customId is refused whole, naming the line.
    let mut swapped = file.clone();
    let at = usize::try_from(failed_lines[0]).unwrap() - 1;
    swapped[at] = line("someone-else", json!({"instruction": "x"}));
    let (status, body) = retry(&app, "tok-a", &id, &swapped.join("\n")).await;
    assert_eq!(
        (status, code(&body)),
        (409, "BATCH_FILE_MISMATCH"),
        "{body}"
    );
    let message = body["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("line {}: ", failed_lines[0]))
            && message.contains("someone-else"),
        "{message}"
    );
    // So is a file without the failed lines.
    let (status, body) = retry(&app, "tok-a", &id, &file[..1].join("\n")).await;
    assert_eq!(
        (status, code(&body)),
        (409, "BATCH_FILE_MISMATCH"),
        "{body}"
    );
    // Nothing was sent: the batch is not marked, and no model call was made.
    let calls = app.fake.requests().len();
    let (_, got) = app.get(Some("tok-a"), &format!("/v1/batches/{id}")).await;
    assert!(got["result"].get("retriedAs").is_none(), "{got}");

    // The file again, its empty line now mended: the failed lines and the rejected ones
    // (but not the repeated customId) are sent again, in a new batch that keeps their numbers.
    let mut mended = file.clone();
    mended[4] = line("broken", json!({"instruction": "mended"}));
    let (status, body) = retry(&app, "tok-a", &id, &mended.join("\n")).await;
    assert_eq!(status, 202, "{body}");
    let r = &body["result"];
    app.matches_schema(
        &json!("#/components/schemas/BatchAccepted"),
        "a retry's answer",
        r,
    );
    assert_eq!(r["retryOf"], json!(id));
    assert_eq!(
        (r["total"].as_u64(), r["accepted"].as_u64()),
        (Some(4), Some(3)),
        "{r}"
    );
    assert_eq!(r["errors"][0]["line"], 6, "{r}");
    assert_eq!(r["errors"][0]["errors"][0]["errorCode"], "MALFORMED_JSON");
    let retry_id = r["batchId"].as_str().unwrap().to_string();
    assert_ne!(retry_id, id);
    let again = settled(&app, "tok-a", &retry_id).await;
    assert_eq!(
        (
            again["total"].as_u64(),
            again["completed"].as_u64(),
            again["rejected"].as_u64()
        ),
        (Some(4), Some(3), Some(1)),
        "{again}"
    );
    assert_eq!(again["retryOf"], json!(id));
    // Three model calls more: one for each line sent again, none for the lines that completed.
    assert_eq!(app.fake.requests().len(), calls + 3);
    let after = results(&app, "tok-a", &retry_id).await;
    let numbers: Vec<u64> = after.iter().map(|l| l["line"].as_u64().unwrap()).collect();
    let mut expected = failed_lines.clone();
    expected.extend([5, 6]);
    assert_eq!(numbers, expected);
    for first_try in &failed {
        let now = after
            .iter()
            .find(|l| l["line"] == first_try["line"])
            .unwrap();
        assert_eq!(now["customId"], first_try["customId"]);
        assert_eq!(now["status"], "completed", "{now}");
        // The same session, a new turn.
        assert_eq!(now["sessionId"], first_try["sessionId"]);
        assert_ne!(now["turnId"], first_try["turnId"]);
    }
    let mended_line = after.iter().find(|l| l["line"] == 5).unwrap();
    assert_eq!(mended_line["customId"], "broken");
    assert_eq!(mended_line["status"], "completed");
    // The first batch names its retry, and is retried once.
    let (_, got) = app.get(Some("tok-a"), &format!("/v1/batches/{id}")).await;
    assert_eq!(got["result"]["retriedAs"], json!(retry_id), "{got}");
    let (status, body) = retry(&app, "tok-a", &id, &mended.join("\n")).await;
    assert_eq!(
        (status, code(&body)),
        (409, "BATCH_ALREADY_RETRIED"),
        "{body}"
    );
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains(&retry_id)
    );
    assert_eq!(app.fake.requests().len(), calls + 3, "nothing ran again");

    // A batch with nothing failed has nothing to retry.
    let whole = line("fine", json!({"instruction": "fine"}));
    let (_, body) = app
        .post_to(Some("tok-a"), "/v1/batches", whole.clone())
        .await;
    let fine = body["result"]["batchId"].as_str().unwrap().to_string();
    settled(&app, "tok-a", &fine).await;
    let (status, body) = retry(&app, "tok-a", &fine, &whole).await;
    assert_eq!((status, code(&body)), (409, "NO_LINES_TO_RETRY"), "{body}");
}

#[tokio::test]
async fn only_the_failed_lines_run_again_on_the_services() {
    only_the_failed_lines_run_again(Backend::Services).await;
}

#[tokio::test]
async fn only_the_failed_lines_run_again_embedded() {
    only_the_failed_lines_run_again(Backend::Embedded).await;
}

/// Two retries of one batch sent at once (an operator's double click, two consoles) start the
/// failed line's turn once: its id is derived from its first try.
async fn two_retries_at_once_run_a_line_once(backend: Backend) {
    let app = spawn(AppOptions {
        backend,
        ..AppOptions::default()
    })
    .await;
    app.fake.push([refused()]);
    let file = line("only", json!({"instruction": "count me once"}));
    let (_, body) = app
        .post_to(Some("tok-a"), "/v1/batches", file.clone())
        .await;
    let id = body["result"]["batchId"].as_str().unwrap().to_string();
    assert_eq!(settled(&app, "tok-a", &id).await["failed"], 1);
    let (a, b) = tokio::join!(
        retry(&app, "tok-a", &id, &file),
        retry(&app, "tok-a", &id, &file)
    );
    let answered: Vec<(u16, &str)> = [&a, &b].iter().map(|(s, v)| (*s, code(v))).collect();
    assert!(
        answered
            .iter()
            .all(|(s, c)| *s == 202 || (*s == 409 && *c == "BATCH_ALREADY_RETRIED")),
        "{a:?} {b:?}"
    );
    let accepted: Vec<&Value> = [&a, &b]
        .into_iter()
        .filter(|(s, _)| *s == 202)
        .map(|(_, v)| &v["result"])
        .collect();
    assert!(!accepted.is_empty(), "{a:?} {b:?}");
    let retry_id = accepted[0]["batchId"].as_str().unwrap().to_string();
    assert!(accepted.iter().all(|r| r["batchId"] == json!(retry_id)));
    settled(&app, "tok-a", &retry_id).await;
    let lines = results(&app, "tok-a", &retry_id).await;
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["status"], "completed", "{lines:?}");
    // Let any second run show itself, then count the line's model calls: the first try's
    // and one more.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ran = app
        .fake
        .requests()
        .iter()
        .filter(|r| r.to_string().contains("count me once"))
        .count();
    assert_eq!(ran, 2, "the first try and one retry");
}

#[tokio::test]
async fn two_retries_at_once_run_a_line_once_on_the_services() {
    two_retries_at_once_run_a_line_once(Backend::Services).await;
}

#[tokio::test]
async fn two_retries_at_once_run_a_line_once_embedded() {
    two_retries_at_once_run_a_line_once(Backend::Embedded).await;
}

/// While a line is still running its batch is not retried (a line failing after the retry
/// could not be retried: a batch is retried once); once it has failed, it is.
async fn a_batch_is_retried_once_its_lines_have_settled(backend: Backend) {
    let app = spawn(AppOptions {
        backend,
        ..AppOptions::default()
    })
    .await;
    app.fake.push([Reply::Delay(
        Duration::from_millis(1500),
        Box::new(refused()),
    )]);
    let file = line("slow", json!({"instruction": "fail slowly"}));
    let (_, body) = app
        .post_to(Some("tok-a"), "/v1/batches", file.clone())
        .await;
    let id = body["result"]["batchId"].as_str().unwrap().to_string();
    let (status, body) = retry(&app, "tok-a", &id, &file).await;
    assert_eq!((status, code(&body)), (409, "BATCH_NOT_SETTLED"), "{body}");
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("1 line(s) still queued or running"),
        "{body}"
    );
    assert_eq!(settled(&app, "tok-a", &id).await["failed"], 1);
    let (status, body) = retry(&app, "tok-a", &id, &file).await;
    assert_eq!(status, 202, "{body}");
    let retry_id = body["result"]["batchId"].as_str().unwrap().to_string();
    assert_eq!(settled(&app, "tok-a", &retry_id).await["completed"], 1);
}

#[tokio::test]
async fn a_batch_is_retried_once_its_lines_have_settled_on_the_services() {
    a_batch_is_retried_once_its_lines_have_settled(Backend::Services).await;
}

#[tokio::test]
async fn a_batch_is_retried_once_its_lines_have_settled_embedded() {
    a_batch_is_retried_once_its_lines_have_settled(Backend::Embedded).await;
}
