//! `aptix batch`, `aptix index` and `aptix watch` driven as a user runs them: a folder as a batch
//! that resumes, a batch killed mid-run, incremental indexing, text split across reads.

use super::cli::*;
use crate::support::Listening;
use crate::support::metric;

pub(super) fn write(dir: &std::path::Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

pub(super) fn read_json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
pub(super) fn batch_processes_a_folder_and_resumes() {
    let root = std::env::temp_dir().join(format!("aptix-batch-{}", uuid::Uuid::new_v4().simple()));
    let input = root.join("docs");
    let out = root.join("out");
    std::fs::create_dir_all(&input).unwrap();
    write(&input, "a.md", "# DDR-1 Alpha\n\nFirst decision.\n");
    write(&input, "b.md", "# DDR-2 Beta\n\nSecond decision.\n");
    // The model asks the client for a file; the batch command answers from the input folder.
    write(
        &input,
        "c.md",
        "# DDR-3 Gamma\n\n#fake:call workspace_read_file {\"path\": \"a.md\"}\n",
    );
    write(
        &input,
        "big.md",
        &format!("# DDR-4 Big\n\n{}\n", "x".repeat(3000)),
    );
    write(&input, "notes.txt", "not a markdown file");
    let batch = |limit: Option<&str>| {
        let mut c = aptix();
        c.args(["batch"])
            .arg(&input)
            .args([
                "--instruction",
                "Summarise the decision",
                "--poll-ms",
                "50",
                "--out",
            ])
            .arg(&out);
        if let Some(l) = limit {
            c.env("APTIX_MAX_ARTIFACT_BYTES", l);
        }
        let o = c.output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };

    // First run: big.md is over the artifact limit, so it fails; the others complete.
    let (code, stdout, stderr) = batch(Some("2000"));
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("4 input(s): 3 completed now, 0 already done, 1 failed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("big.md: request.inputArtifacts[0]"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&out.display().to_string()),
        "says where results are"
    );
    assert!(stderr.contains("4/4 done, 1 failed"), "progress: {stderr}");
    for name in ["a.md", "b.md"] {
        let r = read_json(&out.join(format!("{name}.json")));
        assert_eq!(r["status"], "completed");
        assert_eq!(r["customId"], name);
        assert!(
            r["result"]["result"]["primaryOutputText"]
                .as_str()
                .unwrap()
                .contains("Summarise the decision"),
            "{r}"
        );
    }
    let c = read_json(&out.join("c.md.json"));
    assert_eq!(c["status"], "completed", "{c}");
    assert_eq!(
        c["result"]["result"]["primaryOutputText"],
        "Received 1 tool output(s); done."
    );
    let big = read_json(&out.join("big.md.json"));
    assert_eq!(big["status"], "rejected");
    assert_eq!(big["result"]["errors"][0]["errorCode"], "PAYLOAD_TOO_LARGE");
    assert!(!out.join("notes.txt.json").exists());
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(
        (summary["total"].as_u64(), summary["completed"].as_u64()),
        (Some(4), Some(3))
    );
    assert_eq!(summary["failed"][0]["customId"], "big.md");
    let a_before = std::fs::read_to_string(out.join("a.md.json")).unwrap();

    // Second run, limit lifted: completed inputs are skipped, the failed one runs again.
    let (code, stdout, stderr) = batch(None);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("4 input(s): 1 completed now, 3 already done, 0 failed"),
        "{stdout}"
    );
    assert_eq!(read_json(&out.join("big.md.json"))["status"], "completed");
    assert_eq!(read_json(&out.join("big.md.json"))["attempt"], 1);
    assert_eq!(
        std::fs::read_to_string(out.join("a.md.json")).unwrap(),
        a_before
    );

    // Third run: nothing to do.
    let (code, stdout, _) = batch(None);
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("0 completed now, 4 already done"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
pub(super) async fn index_writes_to_redis_and_reindexes_incrementally() {
    let guard = crate::support::redis_store().await;
    let root = std::env::temp_dir().join(format!("aptix-index-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(root.join("docs")).unwrap();
    write(
        &root.join("docs"),
        "AGN-301.md",
        "# AGN-301 Leases\n\n## Decision\nUse leases.\n",
    );
    write(&root, "main.rs", "fn main() {}\n");
    let index = || {
        let out = aptix()
            .arg("index")
            .arg(&root)
            .args(["--repo", "demo", "--tag", "t1"])
            .env("APTIX_REDIS_URL", crate::support::redis_url())
            .env("APTIX_NAMESPACE", guard.store.namespace())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let first = index();
    assert_eq!(
        (
            first["files"].as_u64(),
            first["indexed"].as_u64(),
            first["chunks"].as_u64()
        ),
        (Some(2), Some(2), Some(3))
    );
    let again = index();
    assert_eq!(
        (again["indexed"].as_u64(), again["unchanged"].as_u64()),
        (Some(0), Some(2))
    );
    std::fs::remove_file(root.join("main.rs")).unwrap();
    let after = index();
    assert_eq!(after["removed"].as_u64(), Some(1));
    // What the CLI wrote is what the pipeline reads.
    let idx = aptix_worker::rag::RedisIndex::connect(
        &crate::support::redis_url(),
        guard.store.namespace(),
    )
    .await
    .unwrap();
    use aptix_worker::rag::ChunkIndex as _;
    let files = idx.files("local", "demo").await.unwrap();
    assert_eq!(files.keys().collect::<Vec<_>>(), vec!["docs/AGN-301.md"]);
    // Nowhere to write: a clear error.
    let out = aptix().arg("index").arg(&root).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("APTIX_REDIS_URL"));
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
pub(super) async fn index_refuses_a_tenant_no_caller_could_read() {
    let guard = crate::support::redis_store().await;
    let root = std::env::temp_dir().join(format!("aptix-index-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&root).unwrap();
    write(&root, "DDR-1.md", "# DDR-1\n\nText.\n");
    let index = |tenant: Option<&str>| {
        let mut cmd = aptix();
        cmd.arg("index")
            .arg(&root)
            .args(["--repo", "demo"])
            .env("APTIX_REDIS_URL", crate::support::redis_url())
            .env("APTIX_NAMESPACE", guard.store.namespace())
            .env("APTIX_API_TOKENS", "tok-a=acme,tok-b=globex");
        if let Some(t) = tenant {
            cmd.args(["--tenant", t]);
        }
        cmd.output().unwrap()
    };
    let idx = aptix_worker::rag::RedisIndex::connect(
        &crate::support::redis_url(),
        guard.store.namespace(),
    )
    .await
    .unwrap();
    use aptix_worker::rag::ChunkIndex as _;
    for tenant in [None, Some("local"), Some("nobody")] {
        let out = index(tenant);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{tenant:?}: {stderr}");
        assert!(stderr.contains("--tenant"), "{tenant:?}: {stderr}");
        assert!(stderr.contains("acme, globex"), "{tenant:?}: {stderr}");
        assert!(idx.files("local", "demo").await.unwrap().is_empty());
    }
    let out = index(Some("acme"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files = idx.files("acme", "demo").await.unwrap();
    assert_eq!(files.keys().collect::<Vec<_>>(), vec!["DDR-1.md"]);
    let _ = std::fs::remove_dir_all(&root);
}

pub(super) fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
pub(super) fn a_batch_killed_mid_run_resumes_without_running_any_turn_twice() {
    use std::io::{BufRead as _, BufReader};
    // A slow model, and a server the batch talks to over HTTP (so it outlives the batch CLI).
    let llm = Listening::start(aptix().args([
        "fake-llm",
        "--listen",
        "127.0.0.1:0",
        "--latency-ms",
        "1500",
    ]));
    let server = Listening::start(
        aptix()
            .args(["run", "--listen", "127.0.0.1:0"])
            .env("APTIX_LLM_BASE_URL", format!("{}/v1", llm.url())),
    );
    let api_port = server.port;
    let root = std::env::temp_dir().join(format!("aptix-crash-{}", uuid::Uuid::new_v4().simple()));
    let (input, out) = (root.join("in"), root.join("out"));
    std::fs::create_dir_all(&input).unwrap();
    for i in 0..4 {
        write(
            &input,
            &format!("doc-{i}.md"),
            &format!("# Doc {i}\n\nText {i}.\n"),
        );
    }
    let batch = || {
        let mut c = aptix();
        c.arg("batch")
            .arg(&input)
            .args(["--instruction", "Summarise", "--poll-ms", "50", "--url"])
            .arg(format!("http://127.0.0.1:{api_port}"))
            .arg("--out")
            .arg(&out);
        c
    };
    // First run: killed as soon as the batch was accepted, long before the model answers.
    let mut first = batch()
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = first.stderr.take().unwrap();
    for line in BufReader::new(stderr).lines() {
        if line.unwrap().contains("4 accepted") {
            break;
        }
    }
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(
        !out.join("doc-0.md.json").exists(),
        "killed before any result"
    );

    // Second run: the same inputs map to the same turns, which finish once.
    let second = batch().output().unwrap();
    let stdout = String::from_utf8_lossy(&second.stdout);
    assert!(
        second.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(stdout.contains("4 input(s): 4 completed now"), "{stdout}");
    // Four model calls in all: the re-run found the turns the killed run had submitted
    // (a job re-sent for a turn still queued is harmless; it never calls the model again).
    let metrics = http_get(api_port, "/metrics");
    assert_eq!(
        metric(&metrics, "aptix_model_request_duration_seconds_count"),
        4.0,
        "{metrics}"
    );
    for i in 0..4 {
        let r: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.join(format!("doc-{i}.md.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(r["status"], "completed");
        assert_eq!(r["attempt"], 0, "the first attempt's turn, not a new one");
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// `aptix watch` against a server that writes its event stream one byte at a time, so every
/// multi-byte character is split across network reads: the characters must print whole.
#[test]
pub(super) fn watch_prints_characters_split_across_network_reads_whole() {
    use std::io::{Read as _, Write as _};
    let instruction = "Prüfe die Lease-Regeln — 检查租约 🔒";
    let view = serde_json::json!({"sessionId": "s", "turnId": "t", "status": "completed",
        "attempts": 1, "submittedAt": "2026-01-01T00:00:00Z",
        "result": {"successful": true, "result": {"kind": "final", "sessionId": "s", "turnId": "t",
            "modeDisplayName": "General", "primaryOutputText": instruction}, "errors": [],
            "warnings": [], "resultId": "R"}});
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        // The session's listing first (what settled before the watch is not news): none yet.
        let mut conn = loop {
            let (mut conn, _) = listener.accept().unwrap();
            conn.set_nodelay(true).unwrap();
            let mut request = [0u8; 4096];
            let n = conn.read(&mut request).unwrap();
            if request[..n].starts_with(b"GET /v1/sessions/s/events ") {
                break conn;
            }
            let body = r#"{"successful":false,"errors":[{"errorCode":"SESSION_NOT_FOUND","message":"no"}]}"#;
            let answer = format!(
                "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(answer.as_bytes()).unwrap();
        };
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
        conn.write_all(head.as_bytes()).unwrap();
        let body = format!(": keep-alive\n\nevent: turn\nid: t\ndata: {view}\n\n");
        for byte in body.as_bytes() {
            conn.write_all(std::slice::from_ref(byte)).unwrap();
            conn.flush().unwrap();
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    });
    let out = aptix()
        .args(["watch", "s", "--count", "1", "--url"])
        .arg(format!("http://127.0.0.1:{port}"))
        .output()
        .unwrap();
    server.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("aptix watch prints UTF-8");
    assert!(!stdout.contains('\u{FFFD}'), "{stdout}");
    let printed: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        printed["result"]["result"]["primaryOutputText"].as_str(),
        Some(instruction)
    );
}
