//! The `aptix` binary as a user runs it.

use std::process::Command;
use std::sync::{Arc, Mutex};

use crate::support::Listening;

pub(crate) use crate::support::aptix;

/// The arguments of the README's main command (the first `cargo run --release -- …` line).
fn readme_main_command() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let line = readme
        .lines()
        .find_map(|l| l.strip_prefix("cargo run --release -- "))
        .expect("the README shows the main command");
    // Split on spaces, keeping double-quoted arguments whole.
    let mut args = Vec::new();
    let mut quoted = false;
    let mut current = String::new();
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !current.is_empty() {
                    args.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        args.push(current);
    }
    args
}

#[test]
fn the_readme_main_command_runs_on_the_embedded_default() {
    let args = readme_main_command();
    assert_eq!(args[0], "batch", "{args:?}");
    let out_dir =
        std::env::temp_dir().join(format!("aptix-readme-{}", uuid::Uuid::new_v4().simple()));
    let run = || {
        aptix()
            .args(&args)
            .arg("--out")
            .arg(&out_dir)
            .output()
            .expect("runs")
    };
    let out = run();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inputs = std::fs::read_dir("examples/ddrs").unwrap().count();
    assert!(inputs >= 3, "a few sample DDRs");
    assert!(
        stdout.contains(&format!("{inputs} input(s): {inputs} completed now")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&out_dir.display().to_string()),
        "prints where results are"
    );
    for entry in std::fs::read_dir("examples/ddrs").unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let r: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out_dir.join(format!("{name}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(r["status"], "completed", "{r}");
        assert_eq!(r["result"]["result"]["kind"], "final");
        // The fake model reports how many [CONTEXT] chunks it saw: the document itself plus
        // sections of the other records retrieved from the index.
        let text = r["result"]["result"]["primaryOutputText"].as_str().unwrap();
        let seen: usize = text
            .split_once(" context chunk(s) seen")
            .and_then(|(before, _)| before.rsplit_once('('))
            .and_then(|(_, n)| n.parse().ok())
            .unwrap_or_else(|| panic!("{text}"));
        assert!(seen >= 2, "retrieved context reached the model: {text}");
    }
    assert!(out_dir.join("summary.json").exists());
    let again = run();
    assert!(again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stdout)
            .contains(&format!("0 completed now, {inputs} already done")),
        "resumes"
    );
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn run_still_runs_request_files_with_a_client_tool_round() {
    let out = aptix()
        .args([
            "run",
            "examples/requests/user-turn.json",
            "examples/requests/client-tool.json",
        ])
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\"kind\": \"final\""), "{stdout}");
    assert!(
        stdout.contains("Received 1 tool output(s); done."),
        "the client tool was answered: {stdout}"
    );
}

#[test]
fn validate_reports_every_violation_and_exits_non_zero() {
    let out = aptix()
        .args(["validate", "examples/requests/invalid.json"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for code in [
        "FORBIDDEN_FIELD",
        "INVALID_ID",
        "MISSING_FIELD",
        "INVALID_PATH",
        "INVALID_ARTIFACT",
    ] {
        assert!(stdout.contains(code), "{code} missing: {stdout}");
    }
}

#[test]
fn validate_reads_a_request_file_saved_behind_a_byte_order_mark() {
    let file =
        std::env::temp_dir().join(format!("aptix-bom-{}.json", uuid::Uuid::new_v4().simple()));
    let request = std::fs::read("examples/requests/user-turn.json").unwrap();
    std::fs::write(&file, [&b"\xEF\xBB\xBF"[..], &request].concat()).unwrap();
    let out = aptix().arg("validate").arg(&file).output().expect("runs");
    let _ = std::fs::remove_file(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("\"successful\": true"), "{stdout}");
}

#[test]
fn a_bad_modes_file_stops_start_up_naming_the_entry() {
    let dir = std::env::temp_dir().join(format!("aptix-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("modes.json");
    std::fs::write(&file, r#"{"modes": [], "tools": []}"#).unwrap();
    let out = aptix()
        .arg("modes")
        .env("APTIX_MODES_FILE", &file)
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("invalid mode catalog: the catalog defines no modes")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_model_url_that_is_no_http_url_stops_start_up_naming_it() {
    let mut child = aptix()
        .args(["serve", "--worker", "--listen", "127.0.0.1:0"])
        .env("APTIX_LLM_BASE_URL", "ftp://models.example/v1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs");
    // A server that starts anyway would never exit: give it a bounded time to refuse.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().expect("waits").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("aptix serve started with an ftp: model URL instead of refusing it");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("exits");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the model server's base URL \"ftp://models.example/v1\"")
            && stderr.contains("its scheme is ftp:"),
        "{stderr}"
    );
}

/// A worker that cannot reach RabbitMQ stops with one line that says so, naming the cause
/// once (lapin and our own error both spell it out and also hand it on as their source).
#[test]
fn a_worker_without_its_broker_says_why_once() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let out = aptix()
        .arg("worker")
        .env(
            "APTIX_AMQP_URL",
            format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
        )
        .env("APTIX_REDIS_URL", crate::support::redis_url())
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in {stderr}"));
    assert!(line.contains("cannot set up RabbitMQ"), "{line}");
    assert_eq!(
        line.matches("Connection refused").count(),
        1,
        "the cause once: {line}"
    );
}

#[tokio::test]
async fn dlq_lists_and_requeues_dead_jobs() {
    use aptix_worker::queue::JobQueue as _;
    let guard = crate::support::rabbit().await;
    guard
        .broker
        .publish_dead(
            b"{\"sessionId\":\"s\"}",
            &aptix_worker::queue::JobMeta::default().at_attempt(3),
            "gave up after 3 attempts",
        )
        .await
        .unwrap();
    let run = |args: &[&str]| {
        aptix()
            .args(args)
            .env("APTIX_AMQP_URL", crate::support::amqp_url())
            .env("APTIX_NAMESPACE", &guard.topology.namespace)
            .output()
            .expect("runs")
    };
    let out = run(&["dlq", "list"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains("gave up after 3 attempts") && listed.contains("sessionId"),
        "{listed}"
    );
    let out = run(&["dlq", "requeue"]);
    assert!(out.status.success());
    assert!(
        guard.broker.drain_dead(10).await.unwrap().is_empty(),
        "moved out of the DLQ"
    );
    let mut jobs = guard.broker.consume(1).await.unwrap();
    let job = tokio::time::timeout(std::time::Duration::from_secs(5), jobs.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(job.body, b"{\"sessionId\":\"s\"}");
    job.ack().await.unwrap();
    // The command declared the namespace's default retry queues too: remove them.
    let defaults = aptix_worker::queue::RabbitBroker::new(
        &crate::support::amqp_url(),
        aptix_worker::queue::Topology::new(&guard.topology.namespace),
        "aptix-test-cleanup",
    );
    defaults.delete_topology().await.unwrap();
}

#[tokio::test]
async fn a_worker_process_drains_and_exits_0_on_sigterm() {
    let guard = crate::support::rabbit().await;
    let mut worker = Listening::start(
        aptix()
            .args(["worker", "--listen", "127.0.0.1:0"])
            .env("APTIX_AMQP_URL", crate::support::amqp_url())
            .env("APTIX_REDIS_URL", crate::support::redis_url())
            .env("APTIX_NAMESPACE", &guard.topology.namespace)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1"),
    );
    assert!(
        worker.wait_for_line("consuming turn jobs", std::time::Duration::from_secs(20)),
        "worker did not start"
    );
    // The worker serves its health and metrics.
    let port = worker.port;
    let get = |path: &str| http_get(port, path);
    assert!(get("/healthz").starts_with("HTTP/1.1 200"));
    assert!(get("/readyz").starts_with("HTTP/1.1 200"));
    let metrics = get("/metrics");
    assert!(metrics.contains("aptix_turns_in_flight 0"), "{metrics}");
    assert!(
        get("/v1/turns").starts_with("HTTP/1.1 404"),
        "a worker serves no API"
    );
    let status = Command::new("kill")
        .args(["-TERM", &worker.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let exit = loop {
        if let Some(s) = worker.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "worker did not stop after SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(exit.code(), Some(0));
    let logs = worker.lines_after_exit();
    assert!(
        logs.iter().any(|l| l.contains("worker stopped")),
        "{logs:?}"
    );
    // The worker's own topology under this namespace (default retry delays) is removed too.
    let defaults = aptix_worker::queue::RabbitBroker::new(
        &crate::support::amqp_url(),
        aptix_worker::queue::Topology::new(&guard.topology.namespace),
        "aptix-test-cleanup",
    );
    defaults.delete_topology().await.unwrap();
}

/// Kills the child process when the test ends, however it ends.
#[test]
fn submit_status_and_watch_talk_to_aptix_run_over_http() {
    let server = Listening::start(
        aptix()
            .args(["run", "--listen", "127.0.0.1:0"])
            .env("APTIX_API_TOKENS", "tok-cli=tenant-cli"),
    );
    let url = server.url();
    let out = aptix()
        .args(["submit", "examples/requests/user-turn.json", "--url", &url])
        .env("APTIX_TOKEN", "tok-cli")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\"kind\": \"final\""), "{stdout}");
    let out = aptix()
        .args([
            "status",
            "demo-session-1",
            "turn-1",
            "--url",
            &url,
            "--token",
            "tok-cli",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"status\": \"completed\""));
    // `aptix watch` follows the session over SSE and sees the next turn's result.
    let watch = aptix()
        .args([
            "watch",
            "demo-session-1",
            "--count",
            "1",
            "--url",
            &url,
            "--token",
            "tok-cli",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut watch = watch;
    {
        use std::io::BufRead as _;
        let mut line = String::new();
        std::io::BufReader::new(watch.stderr.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("watching session demo-session-1"), "{line}");
    }
    let second =
        std::env::temp_dir().join(format!("aptix-turn-{}.json", uuid::Uuid::new_v4().simple()));
    std::fs::write(
        &second,
        serde_json::json!({"sessionId": "demo-session-1", "turnId": "turn-2", "instruction": "again"}).to_string(),
    )
    .unwrap();
    let out = aptix()
        .arg("submit")
        .arg(&second)
        .args(["--url", &url, "--token", "tok-cli"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let watched = watch.wait_with_output().unwrap();
    assert!(watched.status.success());
    let event: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&watched.stdout).trim()).unwrap();
    assert_eq!(
        (event["turnId"].as_str(), event["status"].as_str()),
        (Some("turn-2"), Some("completed"))
    );
    let _ = std::fs::remove_file(&second);
    // The wrong token is refused, and the command says so by its exit code.
    let out = aptix()
        .args([
            "status",
            "demo-session-1",
            "turn-1",
            "--url",
            &url,
            "--token",
            "wrong",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("UNAUTHORIZED"));
}

fn write(dir: &std::path::Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

fn read_json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn batch_processes_a_folder_and_resumes() {
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
async fn index_writes_to_redis_and_reindexes_incrementally() {
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
async fn index_refuses_a_tenant_no_caller_could_read() {
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

fn http_get(port: u16, path: &str) -> String {
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

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[test]
fn a_batch_killed_mid_run_resumes_without_running_any_turn_twice() {
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
fn watch_prints_characters_split_across_network_reads_whole() {
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

/// `APTIX_LOG_FORMAT=json`: every stderr line is a JSON object with timestamp, level, target and
/// message; each HTTP request leaves one access-log line with its method, route, status,
/// latency and request id (the client's, echoed on the answer); a turn's lines carry its
/// session and turn ids. Text logs sent to a pipe carry no colour codes.
#[tokio::test]
async fn json_logs_carry_the_request_id_and_an_access_line_per_request() {
    let mut server = Listening::start(
        aptix()
            .args(["run", "--listen", "127.0.0.1:0"])
            .env("APTIX_LOG_FORMAT", "json")
            .env("RUST_LOG", "info"),
    );
    let port = server.port;
    let client = crate::support::http_client();
    let resp = client
        .post(format!("http://127.0.0.1:{port}/api/ai/agent/execute"))
        .header("x-request-id", "req-from-client-1")
        .body(r#"{"sessionId": "log-s", "turnId": "log-t", "instruction": "hello"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["x-request-id"], "req-from-client-1");
    let resp = client
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .await
        .unwrap();
    let generated = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(
        uuid::Uuid::parse_str(&generated).map(|_| ()),
        Ok(()),
        "{generated}"
    );
    // SIGTERM: the server drains and exits, closing its stderr.
    sigterm(server.child.id());
    let _ = server.child.wait();
    let stderr = server.lines_after_exit().join("\n");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(!lines.is_empty());
    for line in &lines {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(line.get(key).is_some(), "{key} missing: {line}");
        }
    }
    let access = lines
        .iter()
        .find(|l| l["message"] == "request" && l["span"]["request_id"] == "req-from-client-1")
        .unwrap_or_else(|| panic!("no access line for the request:\n{stderr}"));
    assert_eq!(access["span"]["method"], "POST");
    assert_eq!(access["span"]["route"], "/api/ai/agent/execute");
    assert_eq!(access["status"], 200);
    assert!(access["latency_ms"].as_f64().is_some());
    assert!(
        lines.iter().any(|l| l["message"] == "request"
            && l["span"]["route"] == "/healthz"
            && l["span"]["request_id"] == generated.as_str()),
        "{stderr}"
    );
    let turn_line = lines
        .iter()
        .find(|l| l["message"] == "turn completed")
        .unwrap_or_else(|| panic!("no turn line:\n{stderr}"));
    let spans = turn_line["spans"].to_string();
    assert!(
        spans.contains("log-s") && spans.contains("log-t"),
        "{turn_line}"
    );

    // Text logs into a pipe: no ANSI escape codes.
    let out = aptix()
        .args(["run", "examples/requests/user-turn.json"])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("INFO"), "{text}");
    assert!(!text.contains('\u{1b}'), "colour codes in a pipe: {text:?}");
    // A format that does not exist is refused, naming the variable.
    let out = aptix()
        .args(["modes"])
        .env("APTIX_LOG_FORMAT", "xml")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("APTIX_LOG_FORMAT"));
}

fn sigterm(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

/// One span as an OTLP collector received it.
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
#[derive(Debug, Clone)]
struct ExportedSpan {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
}

/// The part of OTLP's protobuf messages the collector below reads (field numbers from
/// `opentelemetry/proto/collector/trace/v1` and `trace/v1`); prost skips every other field.
mod otlp {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExportTraceServiceRequest {
        #[prost(message, repeated, tag = "1")]
        pub resource_spans: Vec<ResourceSpans>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResourceSpans {
        #[prost(message, optional, tag = "1")]
        pub resource: Option<Resource>,
        #[prost(message, repeated, tag = "2")]
        pub scope_spans: Vec<ScopeSpans>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Resource {
        #[prost(message, repeated, tag = "1")]
        pub attributes: Vec<KeyValue>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<AnyValue>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AnyValue {
        #[prost(string, optional, tag = "1")]
        pub string_value: Option<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ScopeSpans {
        #[prost(message, repeated, tag = "2")]
        pub spans: Vec<Span>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Span {
        #[prost(bytes = "vec", tag = "1")]
        pub trace_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub span_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "4")]
        pub parent_span_id: Vec<u8>,
        #[prost(string, tag = "5")]
        pub name: String,
    }
}

/// A minimal OpenTelemetry collector: `POST /v1/traces` with an OTLP/HTTP protobuf body.
async fn otlp_receiver() -> (String, Arc<Mutex<Vec<ExportedSpan>>>) {
    use prost::Message as _;
    let spans: Arc<Mutex<Vec<ExportedSpan>>> = Arc::default();
    let seen = spans.clone();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let seen = seen.clone();
            async move {
                let Ok(request) = otlp::ExportTraceServiceRequest::decode(body) else {
                    return axum::http::StatusCode::BAD_REQUEST;
                };
                for resource in request.resource_spans {
                    let service = resource
                        .resource
                        .iter()
                        .flat_map(|r| &r.attributes)
                        .find(|kv| kv.key == "service.name")
                        .and_then(|kv| kv.value.as_ref())
                        .and_then(|v| v.string_value.clone())
                        .unwrap_or_default();
                    for scope in resource.scope_spans {
                        for span in scope.spans {
                            seen.lock().unwrap().push(ExportedSpan {
                                service: service.clone(),
                                name: span.name,
                                trace_id: hex(&span.trace_id),
                                span_id: hex(&span.span_id),
                                parent_span_id: hex(&span.parent_span_id),
                            });
                        }
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, spans)
}

/// The spans of `trace_id` at the collector form one tree: the caller's span → `http` (serve)
/// → `job` (worker) → … → `model_call`, whose id the model got as its parent.
#[cfg(feature = "otel")]
async fn assert_one_exported_tree(
    exported: &Arc<Mutex<Vec<ExportedSpan>>>,
    trace_id: &str,
    model_parent: &str,
    logs: &dyn Fn() -> String,
) {
    let find = |name: &str| {
        exported
            .lock()
            .unwrap()
            .iter()
            .find(|s| s.name == name && s.trace_id == trace_id)
            .cloned()
    };
    // Both processes export every 100 ms; the deadline only bounds a loaded machine.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while ["http", "job", "model_call"]
        .iter()
        .any(|n| find(n).is_none())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "spans exported: {:#?}\nthe processes' logs (an export that failed is logged):\n{}",
            exported.lock().unwrap(),
            logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (http, job, call) = (
        find("http").unwrap(),
        find("job").unwrap(),
        find("model_call").unwrap(),
    );
    assert!(http.service.contains("aptix-serve"), "{http:?}");
    assert!(job.service.contains("aptix-worker"), "{job:?}");
    assert_eq!(http.parent_span_id, "b7ad6b7169203331", "{http:?}");
    assert_eq!(job.parent_span_id, http.span_id, "{job:?} under {http:?}");
    assert_eq!(
        model_parent, call.span_id,
        "the model's parent is the exported call span"
    );
    // model_call hangs below job, through the pipeline's spans.
    let all = exported.lock().unwrap().clone();
    let mut at = call.clone();
    while at.span_id != job.span_id {
        at = all
            .iter()
            .find(|s| s.span_id == at.parent_span_id)
            .unwrap_or_else(|| panic!("{at:?} has no exported parent in {all:#?}"))
            .clone();
    }
}

/// Trace context across the queue, between two processes: a `traceparent` sent to `aptix serve`
/// travels on the job message to `aptix worker`, whose log lines of the turn carry its trace id
/// and whose model call sends it on (same trace id, a new span id). With
/// `OTEL_EXPORTER_OTLP_ENDPOINT` set, both processes export their spans to the collector as one
/// tree: caller → `http` (serve) → `job` (worker) → … → `model_call`, whose id the model got.
#[tokio::test]
async fn trace_context_crosses_the_queue_from_serve_to_worker_to_the_model() {
    #[cfg_attr(not(feature = "otel"), allow(unused_variables))]
    let (collector, exported) = otlp_receiver().await;
    use aptix_worker::fake_llm::{FakeLlm, FakeOptions, Reply};
    let fake = FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        FakeOptions::default(),
        Some(crate::support::schema()),
    )
    .await
    .unwrap();
    fake.push([Reply::Text("traced".into())]);
    let guard = crate::support::rabbit().await;
    let env = |cmd: &mut Command| {
        cmd.env("APTIX_AMQP_URL", crate::support::amqp_url())
            .env("APTIX_REDIS_URL", crate::support::redis_url())
            .env("APTIX_NAMESPACE", &guard.topology.namespace)
            .env("APTIX_LLM_BASE_URL", fake.base_url())
            .env("APTIX_REPLY_QUEUE_TTL_SECS", "30")
            .env("APTIX_LOG_FORMAT", "json")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            // The turn's start and publish lines (debug) too: every line must carry the trace.
            .env(
                "RUST_LOG",
                "info,aptix_worker::pipeline=debug,aptix_worker::worker=debug",
            );
    };
    let mut serve = aptix();
    serve.args(["serve", "--listen", "127.0.0.1:0"]);
    env(&mut serve);
    let serve = Listening::start(&mut serve);
    let port = serve.port;
    let mut worker = aptix();
    worker.args(["worker", "--listen", "127.0.0.1:0"]);
    env(&mut worker);
    // Its log is read as it is written (a pipe left unread would stall the worker once full).
    let mut worker = Listening::start(&mut worker);
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let answer: serde_json::Value = crate::support::http_client()
        .post(format!("http://127.0.0.1:{port}/api/ai/agent/execute"))
        .header("traceparent", format!("00-{trace_id}-b7ad6b7169203331-01"))
        .body(r#"{"sessionId": "trace-s", "turnId": "trace-t", "instruction": "follow me"}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["result"]["primaryOutputText"], "traced", "{answer}");
    // The model got the trace: same trace id, a span id of the worker's own.
    let sent = fake.traceparents();
    assert_eq!(sent.len(), 1);
    let header = sent[0].clone().expect("the model call carries traceparent");
    let parts: Vec<&str> = header.split('-').collect();
    assert_eq!(
        (parts[0], parts[1], parts[3]),
        ("00", trace_id, "01"),
        "{header}"
    );
    assert_ne!(parts[2], "b7ad6b7169203331", "a new span id");
    // With span export built in (feature `otel`, which the README's test command turns on),
    // the collector holds one tree of that trace, across both processes.
    #[cfg(feature = "otel")]
    assert_one_exported_tree(&exported, trace_id, parts[2], &|| {
        format!(
            "serve:\n{}\nworker:\n{}",
            serve.lines().join("\n"),
            worker.lines().join("\n")
        )
    })
    .await;
    // Every log line of the turn in the worker carries the trace id.
    sigterm(worker.child.id());
    let _ = worker.child.wait();
    let lines = worker.lines_after_exit();
    let stderr = lines.join("\n");
    let turn_lines: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["spans"].to_string().contains("trace-t"))
        .collect();
    assert!(turn_lines.len() >= 2, "{stderr}");
    for line in &turn_lines {
        assert!(line["spans"].to_string().contains(trace_id), "{line}");
    }
    let keys = aptix_worker::store::RedisStore::connect(
        &crate::support::redis_url(),
        &guard.topology.namespace,
        Default::default(),
    )
    .await
    .unwrap();
    keys.delete_namespace().await.unwrap();
    // The worker's default retry queues under this namespace.
    let defaults = aptix_worker::queue::RabbitBroker::new(
        &crate::support::amqp_url(),
        aptix_worker::queue::Topology::new(&guard.topology.namespace),
        "aptix-test-cleanup",
    );
    defaults.delete_topology().await.unwrap();
}

/// A collector that refuses the spans does not fail silently: the exporting process logs the
/// failed export, at error level and with the collector's answer, and keeps serving.
#[cfg(feature = "otel")]
#[tokio::test]
async fn a_collector_that_refuses_spans_is_reported_in_the_log() {
    let refusals = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = refusals.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { axum::http::StatusCode::BAD_REQUEST }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut serve = aptix();
    serve
        .args(["serve", "--worker", "--listen", "127.0.0.1:0"])
        .env("APTIX_LOG_FORMAT", "json")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("RUST_LOG", "info");
    let serve = Listening::start(&mut serve);
    let health = crate::support::http_client()
        .get(format!("{}/healthz", serve.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let failed = loop {
        let found = serve
            .lines()
            .into_iter()
            .find(|l| l.contains("BatchSpanProcessor.ExportError"));
        if let Some(line) = found {
            break line;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no failed export logged ({} refused):\n{}",
            refusals.load(std::sync::atomic::Ordering::SeqCst),
            serve.lines().join("\n")
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let line: serde_json::Value = serde_json::from_str(&failed).expect("a JSON log line");
    assert_eq!(line["level"], "ERROR", "{line}");
    assert!(line["error"].to_string().contains("400"), "{line}");
    assert!(refusals.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    // Still serving.
    let again = crate::support::http_client()
        .get(format!("{}/healthz", serve.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
}
