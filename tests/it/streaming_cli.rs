//! Streaming seen from the CLI: `aptix submit --stream` and `aptix watch`, and the fake model's
//! pieces and broken streams.

use super::streaming::*;
use crate::app::Backend;
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Runs `aptix` with `args`, returning each stdout chunk with when it arrived, and stderr.
fn run_cli(args: &[&str]) -> (Vec<(Instant, String)>, String, bool) {
    run_cli_telling(args, None)
}

/// [`run_cli`], telling `told` once a line of stderr contains its text (what the command says
/// when it got somewhere: `aptix watch` once its stream is open).
fn run_cli_telling(
    args: &[&str],
    told: Option<(&'static str, std::sync::mpsc::Sender<()>)>,
) -> (Vec<(Instant, String)>, String, bool) {
    use std::io::{BufRead as _, Read as _};
    let mut child = crate::cli::aptix()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        for line in std::io::BufReader::new(&mut stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some((marker, tell)) = &told
                && line.contains(marker)
            {
                let _ = tell.send(());
            }
            s.push_str(&line);
            s.push('\n');
        }
        s
    });
    let mut chunks = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = stdout.read(&mut buf) {
        if n == 0 {
            break;
        }
        chunks.push((
            Instant::now(),
            String::from_utf8_lossy(&buf[..n]).into_owned(),
        ));
    }
    let ok = child.wait().unwrap().success();
    (chunks, err.join().unwrap(), ok)
}

#[tokio::test]
async fn aptix_submit_stream_and_watch_print_the_text_as_it_arrives() {
    let app = app(Backend::Embedded, pieces(6, 250), Vec::new()).await;
    let file = std::env::temp_dir().join(format!(
        "aptix-stream-{}.json",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(
        &file,
        json!({"sessionId": "cli", "turnId": "t1", "instruction": "go"}).to_string(),
    )
    .unwrap();
    let base = app.base.clone();
    let path = file.display().to_string();
    // `aptix watch` follows the session while `aptix submit --stream` runs a turn in it.
    let watch_base = base.clone();
    let (subscribed, watching) = std::sync::mpsc::channel();
    let watcher = tokio::task::spawn_blocking(move || {
        run_cli_telling(
            &[
                "watch",
                "cli",
                "--count",
                "1",
                "--url",
                &watch_base,
                "--token",
                "tok-a",
            ],
            Some(("watching session", subscribed)),
        )
    });
    // The turn is submitted once `aptix watch` says its stream is open.
    tokio::task::spawn_blocking(move || watching.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("aptix watch opened its stream");
    let (chunks, stderr, ok) = tokio::task::spawn_blocking(move || {
        run_cli(&[
            "submit", "--stream", &path, "--url", &base, "--token", "tok-a",
        ])
    })
    .await
    .unwrap();
    assert!(ok, "{stderr}");
    let out: String = chunks.iter().map(|(_, c)| c.as_str()).collect();
    let (text, result) = out.split_once('\n').unwrap();
    let result: Value = serde_json::from_str(result).unwrap();
    assert_eq!(result["result"]["primaryOutputText"], text, "{out}");
    let first = chunks.first().unwrap().0;
    let last = chunks.last().unwrap().0;
    assert!(
        last.duration_since(first) > Duration::from_millis(800),
        "the text was printed all at once at the end: {chunks:?}"
    );
    let (chunks, stderr, ok) = watcher.await.unwrap();
    assert!(ok, "{stderr}");
    let out: String = chunks.iter().map(|(_, c)| c.as_str()).collect();
    let (watched_text, status) = out.split_once('\n').unwrap();
    assert_eq!(watched_text, text, "{out}");
    let status: Value = serde_json::from_str(status.trim()).unwrap();
    assert_eq!(status["status"], "completed");
}

#[tokio::test]
async fn aptix_fake_llm_streams_in_pieces_and_breaks_the_streams_it_is_told_to() {
    let fake = crate::support::Listening::start(crate::cli::aptix().args([
        "fake-llm",
        "--listen",
        "127.0.0.1:0",
        "--stream-pieces",
        "3",
        "--break-streams",
        "1",
    ]));
    let call = || async {
        let resp = crate::support::http_client()
            .post(format!("{}/v1/responses", fake.url()))
            .json(&json!({"model": "m", "input": "hello there", "stream": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        let mut body = resp.bytes_stream();
        let mut text = String::new();
        let mut broke = false;
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(c) => text.push_str(&String::from_utf8_lossy(&c)),
                Err(_) => {
                    broke = true;
                    break;
                }
            }
        }
        (text, broke)
    };
    let (first, broke) = call().await;
    assert!(broke, "the first stream breaks");
    assert!(first.contains("response.output_text.delta") && !first.contains("response.completed"));
    let (second, broke) = call().await;
    assert!(!broke);
    let types: Vec<&str> = second
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(types.first(), Some(&"response.created"));
    assert_eq!(types.last(), Some(&"response.completed"));
    assert_eq!(
        types
            .iter()
            .filter(|t| **t == "response.output_text.delta")
            .count(),
        3
    );
}
