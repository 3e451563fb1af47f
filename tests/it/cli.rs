//! The `aptix` binary as a user runs it.

use super::cli_batch::http_get;
use std::process::Command;

use crate::support::Listening;

pub(crate) use crate::support::aptix;

/// The arguments of the README's main command (the first `cargo run --release -- …` line).
pub(super) fn readme_main_command() -> Vec<String> {
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
pub(super) fn the_readme_main_command_runs_on_the_embedded_default() {
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
pub(super) fn run_still_runs_request_files_with_a_client_tool_round() {
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
pub(super) fn validate_reports_every_violation_and_exits_non_zero() {
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
pub(super) fn validate_reads_a_request_file_saved_behind_a_byte_order_mark() {
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
pub(super) fn a_bad_modes_file_stops_start_up_naming_the_entry() {
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
pub(super) fn a_model_url_that_is_no_http_url_stops_start_up_naming_it() {
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
pub(super) fn a_worker_without_its_broker_says_why_once() {
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
pub(super) async fn dlq_lists_and_requeues_dead_jobs() {
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
    // Discarded: out of the dead letters, and not on the job queue.
    guard
        .broker
        .publish_dead(
            b"{\"sessionId\":\"gone\"}",
            &aptix_worker::queue::JobMeta::default().at_attempt(3),
            "poison",
        )
        .await
        .unwrap();
    let out = run(&["dlq", "discard", "--max", "5"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 job(s) discarded"));
    assert!(guard.broker.drain_dead(10).await.unwrap().is_empty());
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
pub(super) async fn a_worker_process_drains_and_exits_0_on_sigterm() {
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
    // The product as built by default counts no allocations (that is a count-allocations
    // build's, for the bench).
    assert!(!metrics.contains("aptix_allocations"), "{metrics}");
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
pub(super) fn submit_status_and_watch_talk_to_aptix_run_over_http() {
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
