//! Dead webhook deliveries of the embedded deployment (`aptix run`, whose broker lives in its
//! own process) are listed and sent again through its API, with the same CLI an operator
//! uses against RabbitMQ: `aptix webhooks failed|replay --url`.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Listening, aptix};
use crate::webhooks::{Answer, Receiver, SECRET};

/// `aptix webhooks <args> --url <url>` with `token`: its stdout, or a panic with its stderr.
fn webhooks_cli(url: &str, token: &str, args: &[&str]) -> (bool, String, String) {
    let out = aptix()
        .arg("webhooks")
        .args(args)
        .args(["--url", url, "--token", token])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn aptix_run_lists_and_replays_its_dead_deliveries_through_the_api() {
    let receiver = Receiver::start([Answer::Status(503); 64]).await;
    let server = Listening::start(
        aptix()
            .args(["run", "--listen", "127.0.0.1:0"])
            .env("APTIX_API_TOKENS", "tok-root=ops:admin,tok-a=tenant-a")
            .env("APTIX_WEBHOOK_SECRET", SECRET)
            .env("APTIX_WEBHOOK_ALLOW_HTTP", "true")
            .env("APTIX_WEBHOOK_ALLOW", "127.0.0.0/8")
            .env("APTIX_WEBHOOK_RETRY_DELAYS_SECS", "1")
            .env("APTIX_WEBHOOK_GIVE_UP_SECS", "2"),
    );
    let url = server.url();
    let turn = json!({"sessionId": "s", "turnId": "t", "instruction": "hi",
        "webhook": {"url": receiver.url}});
    let accepted = crate::support::http_client()
        .post(format!("{url}/v1/turns"))
        .bearer_auth("tok-a")
        .header("content-type", "application/json")
        .body(turn.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status().as_u16(), 202);

    // Refused until the give-up age, then dead: listed, and still there after listing.
    let deadline = Instant::now() + Duration::from_secs(30);
    let listed = loop {
        let (ok, stdout, stderr) = webhooks_cli(&url, "tok-root", &["failed"]);
        assert!(ok, "{stderr}");
        if let Some(line) = stdout.lines().next() {
            break serde_json::from_str::<Value>(line).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "nothing was dead-lettered: {stderr}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let tried = receiver.got().len();
    let id = receiver.got()[0].headers["webhook-id"].clone();
    assert_eq!(listed["eventId"], id.as_str(), "{listed}");
    assert_eq!(listed["event"], "turn.completed");
    assert_eq!(listed["tenant"], "tenant-a");
    assert!(
        listed["lastError"].as_str().unwrap().contains("503"),
        "{listed}"
    );
    let (_, again, _) = webhooks_cli(&url, "tok-root", &["failed"]);
    assert_eq!(again.lines().count(), 1, "listing leaves it there: {again}");
    // Only an admin's token reads them.
    let (ok, _, stderr) = webhooks_cli(&url, "tok-a", &["failed"]);
    assert!(!ok && stderr.contains("403"), "{stderr}");

    // Replayed once the receiver is back: the same event, acknowledged, and none left dead.
    receiver.answer_from_now([]);
    let (ok, _, stderr) = webhooks_cli(&url, "tok-root", &["replay"]);
    assert!(
        ok && stderr.contains("1 webhook delivery(ies) sent again"),
        "{stderr}"
    );
    let got = receiver
        .until(Duration::from_secs(30), |got| {
            got.iter().any(|r| r.answered == 200)
        })
        .await;
    assert_eq!(got.len(), tried + 1);
    assert_eq!(got[tried].headers["webhook-id"], id, "the same event");
    let (_, left, _) = webhooks_cli(&url, "tok-root", &["failed"]);
    assert_eq!(left.trim(), "", "{left}");
}
