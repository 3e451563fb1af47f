//! `batch.completed` comes after every line's event, even to a receiver that accepts
//! connections slowly (a listen backlog of one, a pause before each accept — as a small
//! threaded server does), on both backends: the batch counts a line only once its event was
//! delivered or given up on, so no concurrency of the sender can make the batch's event
//! overtake a line's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::app::{AppOptions, Backend, spawn};
use crate::webhooks::webhook_env;

/// A receiver that takes one connection at a time, slowly: each request's event type and
/// turn, in the order the receiver got them.
struct SlowReceiver {
    url: String,
    got: Arc<Mutex<Vec<Value>>>,
}

impl SlowReceiver {
    async fn start(pause: Duration) -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = socket.local_addr().unwrap();
        let listener = socket.listen(1).unwrap();
        let got: Arc<Mutex<Vec<Value>>> = Arc::default();
        let seen = got.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(pause).await;
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                // One request per connection, answered before the next is accepted.
                if let Some(body) = read_request(&mut conn).await
                    && let Ok(event) = serde_json::from_slice::<Value>(&body)
                {
                    seen.lock().unwrap().push(event);
                }
                let _ = conn
                    .write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
                    .await;
            }
        });
        Self {
            url: format!("http://{addr}/hooks"),
            got,
        }
    }

    fn got(&self) -> Vec<Value> {
        self.got.lock().unwrap().clone()
    }
}

/// The body of one HTTP/1.1 request (by its `content-length`).
async fn read_request(conn: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())?;
    while buf.len() < head_end + length {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(buf[head_end..head_end + length].to_vec())
}

async fn batch_completed_follows_every_lines_event(backend: Backend) {
    let receiver = SlowReceiver::start(Duration::from_millis(50)).await;
    let app = spawn(AppOptions {
        backend,
        extra_env: webhook_env(&[]),
        ..AppOptions::default()
    })
    .await;
    let lines: Vec<String> = (0..20)
        .map(|i| json!({"customId": format!("doc-{i}"), "request": {"instruction": format!("review {i}")}}).to_string())
        .collect();
    let path = format!(
        "/v1/batches?webhook={}",
        receiver.url.replace(':', "%3A").replace('/', "%2F")
    );
    let (status, body) = app.post_to(Some("tok-a"), &path, lines.join("\n")).await;
    assert_eq!(status, 202, "{body}");
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while receiver
        .got()
        .iter()
        .all(|e| e["type"] != "batch.completed")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no batch.completed; got {:#?}",
            receiver.got()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = receiver.got();
    let kinds: Vec<&str> = got.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let at = kinds.iter().position(|k| *k == "batch.completed").unwrap();
    let line = |e: &Value| e["data"]["turnId"].as_str().unwrap().to_string();
    let before: std::collections::HashSet<String> = got[..at]
        .iter()
        .filter(|e| e["type"] == "turn.completed")
        .map(line)
        .collect();
    assert_eq!(
        before.len(),
        20,
        "every line's event came before batch.completed: {kinds:?}"
    );
    // Delivery is at least once: what comes after can only be an event told already (a
    // redelivered line's settle sends its event again, with the same id), never a new one.
    for e in &got[at + 1..] {
        assert!(
            e["type"] == "turn.completed" && before.contains(&line(e)),
            "after batch.completed: {kinds:?}"
        );
    }
    assert_eq!(got[at]["data"]["completed"], 20, "{}", got[at]);
}

for_each_backend!(
    backends: [services => super::Backend::Services, embedded => super::Backend::Embedded],
    tests: [batch_completed_follows_every_lines_event],
);
