//! The `aptix` binary as a user runs it.

use std::process::Command;

fn aptix() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_aptix"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    for var in [
        "APTIX_LLM_BASE_URL",
        "OPENAI_API_KEY",
        "APTIX_AMQP_URL",
        "APTIX_REDIS_URL",
        "APTIX_MODES_FILE",
    ] {
        c.env_remove(var);
    }
    c
}

#[test]
fn the_readme_main_command_runs_on_the_embedded_default() {
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
        stdout.contains("\"kind\": \"client_tool_continuation\""),
        "{stdout}"
    );
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

#[tokio::test]
async fn dlq_lists_and_requeues_dead_jobs() {
    use aptix_worker::queue::Broker as _;
    let guard = crate::support::rabbit().await;
    guard
        .broker
        .publish_dead(b"{\"sessionId\":\"s\"}", 3, "gave up after 3 attempts")
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
    use std::io::{BufRead as _, BufReader};
    let guard = crate::support::rabbit().await;
    let mut child = aptix()
        .arg("worker")
        .env("APTIX_AMQP_URL", crate::support::amqp_url())
        .env("APTIX_REDIS_URL", crate::support::redis_url())
        .env("APTIX_NAMESPACE", &guard.topology.namespace)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starts");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let started = std::time::Instant::now();
    loop {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("worker logs");
        if line.contains("consuming turn jobs") {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "worker did not start"
        );
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "worker did not stop after SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(exit.code(), Some(0));
    let logs: Vec<String> = rx.try_iter().collect();
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
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn submit_and_status_talk_to_the_http_api() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let _server = Child(
        aptix()
            .args([
                "serve",
                "--worker",
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .env("APTIX_API_TOKENS", "tok-cli=tenant-cli")
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("serve starts"),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
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
