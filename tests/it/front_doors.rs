//! Two front doors (`aptix serve` processes) behind haproxy, round robin, the way a team runs
//! several: one is SIGKILLed while a client streams a turn's text over SSE and another waits on
//! the synchronous endpoint. The streaming client reconnects through the balancer with
//! `Last-Event-ID` and sees every character of the turn once, then the result; the waiting
//! client sends its request again and gets the answer of the one run of its turn.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aptix_worker::fake_llm::{FakeLlm, FakeOptions};
use futures_util::StreamExt as _;
use serde_json::{Value, json};

use crate::processes::Processes;
use crate::support::{Listening, http_client};

/// haproxy in front of the front doors: round robin, `/readyz` checked, the serving door named
/// in `x-served-by`.
struct Balancer {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Balancer {
    fn start(doors: &[&Listening]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let dir = std::env::temp_dir().join(format!("aptix-lb-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let servers: String = doors
            .iter()
            .enumerate()
            .map(|(i, d)| {
                format!(
                    "  server door{i} 127.0.0.1:{} check inter 200ms fall 1 rise 1\n",
                    d.port
                )
            })
            .collect();
        let conf = dir.join("haproxy.cfg");
        std::fs::write(
            &conf,
            format!(
                "defaults\n  mode http\n  timeout connect 1s\n  timeout client 120s\n  timeout server 120s\n\
                 \x20 option redispatch\n  retries 3\n\
                 frontend api\n  bind 127.0.0.1:{port}\n  default_backend doors\n\
                 backend doors\n  balance roundrobin\n  option httpchk GET /readyz\n\
                 \x20 http-response set-header x-served-by %[srv_name]\n{servers}"
            ),
        )
        .unwrap();
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("haproxy starts (apt-get install haproxy; .ci/run does)");
        Self { child, port, dir }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One SSE event: its `event:`, `id:` and parsed `data:`.
#[derive(Debug)]
struct SseEvent {
    kind: String,
    id: String,
    data: Value,
}

/// Reads SSE events from `resp` into `tx` until the stream ends.
async fn read_events(resp: reqwest::Response, tx: tokio::sync::mpsc::UnboundedSender<SseEvent>) {
    let mut body = resp.bytes_stream();
    let mut buffer = String::new();
    while let Some(Ok(chunk)) = body.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let (mut kind, mut id, mut data) = (String::from("message"), String::new(), None);
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    kind = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data = serde_json::from_str(v.trim()).ok();
                }
            }
            if let Some(data) = data
                && tx.send(SseEvent { kind, id, data }).is_err()
            {
                return;
            }
        }
    }
}

#[tokio::test]
async fn a_front_door_killed_behind_the_balancer_costs_a_streaming_client_no_character() {
    // A turn whose text streams for about four seconds, in forty pieces.
    let fake = FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        FakeOptions {
            stream_pieces: 40,
            stream_delay: Duration::from_millis(100),
            ..Default::default()
        },
        None,
    )
    .await
    .unwrap();
    let mut p = Processes::start(
        vec![
            ("APTIX_LLM_BASE_URL", fake.base_url()),
            ("APTIX_API_TOKENS", "tok-a=tenant-a".into()),
        ],
        &[],
        1,
    )
    .await;
    let mut other = p.start_serve();
    let lb = Balancer::start(&[&p.serve, &other]);
    let http = http_client();
    let base = lb.url();
    let deadline = Instant::now() + Duration::from_secs(10);
    while http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .map_or(true, |r| !r.status().is_success())
    {
        assert!(
            Instant::now() < deadline,
            "the balancer never reached a front door"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sid = format!("lb-{}", uuid::Uuid::new_v4().simple());
    let events_url = format!("{base}/v1/sessions/{sid}/events");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let first = http
        .get(&events_url)
        .bearer_auth("tok-a")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let streaming_door = first
        .headers()
        .get("x-served-by")
        .and_then(|v| v.to_str().ok())
        .expect("haproxy names the door")
        .to_string();
    let reader = tokio::spawn(read_events(first, tx.clone()));
    // The streaming turn, and a synchronous call of another session, both through the balancer.
    let (status, body) = {
        let r = http
            .post(format!("{base}/v1/turns"))
            .bearer_auth("tok-a")
            .body(
                json!({"sessionId": sid, "turnId": "t", "instruction": "tell", "streaming": true})
                    .to_string(),
            )
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    assert_eq!(status, 202, "{body}");
    let sync_sid = format!("lb-sync-{}", uuid::Uuid::new_v4().simple());
    let sync_body =
        json!({"sessionId": sync_sid, "turnId": "t", "instruction": "answer-me-once"}).to_string();
    let waiting = {
        let (http, base, body) = (http.clone(), base.clone(), sync_body.clone());
        tokio::spawn(async move {
            http.post(format!("{base}/api/ai/agent/execute"))
                .bearer_auth("tok-a")
                .timeout(Duration::from_secs(60))
                .body(body)
                .send()
                .await
                .ok()
                .map(|r| r.status().as_u16())
        })
    };
    // A few pieces of text arrive; then the door serving the stream is killed.
    let mut seen: Vec<SseEvent> = Vec::new();
    while seen.iter().filter(|e| e.kind == "delta").count() < 3 {
        let e = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("text streams")
            .expect("the stream is open");
        seen.push(e);
    }
    let victim = if streaming_door == "door0" {
        &mut p.serve.child
    } else {
        &mut other.child
    };
    victim.kill().expect("SIGKILL the front door");
    let _ = victim.wait();
    reader.abort();
    // Whatever the dead stream had delivered is in `rx`; then reconnect through the balancer.
    while let Ok(e) = rx.try_recv() {
        seen.push(e);
    }
    let last_id = seen.last().map(|e| e.id.clone()).unwrap();
    let again = {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let r = http
                .get(&events_url)
                .bearer_auth("tok-a")
                .header("last-event-id", &last_id)
                .send()
                .await;
            if let Ok(r) = r
                && r.status() == 200
            {
                break r;
            }
            assert!(
                Instant::now() < deadline,
                "no front door took the stream back"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert_ne!(
        again
            .headers()
            .get("x-served-by")
            .and_then(|v| v.to_str().ok()),
        Some(streaming_door.as_str()),
        "the stream moved to the other front door"
    );
    let _reader = tokio::spawn(read_events(again, tx));
    let result = loop {
        let e = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("the turn's text and result arrive")
            .expect("the stream is open");
        let done = e.kind == "turn";
        seen.push(e);
        if done {
            break seen.last().unwrap().data.clone();
        }
    };
    assert_eq!(result["status"], "completed", "{result}");
    let answer = result["result"]["result"]["primaryOutputText"]
        .as_str()
        .unwrap_or_else(|| panic!("{result}"));
    let deltas: Vec<&SseEvent> = seen.iter().filter(|e| e.kind == "delta").collect();
    let indices: Vec<u64> = deltas
        .iter()
        .map(|e| e.data["index"].as_u64().unwrap())
        .collect();
    assert_eq!(
        indices,
        (0..indices.len() as u64).collect::<Vec<_>>(),
        "every piece once, in order"
    );
    let text: String = deltas
        .iter()
        .map(|e| e.data["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, answer, "each character once");
    // The waiting client: cut if its door died; sent again, it gets its turn's answer.
    let first_try = waiting.await.unwrap();
    if first_try != Some(200) {
        let r = http
            .post(format!("{base}/api/ai/agent/execute"))
            .bearer_auth("tok-a")
            .timeout(Duration::from_secs(60))
            .body(sync_body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let calls_for_sync = fake
        .requests()
        .iter()
        .filter(|r| r.to_string().contains("answer-me-once"))
        .count();
    assert_eq!(calls_for_sync, 1, "the synchronous turn ran once");
}
