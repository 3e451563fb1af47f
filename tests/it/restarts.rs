//! A front door that restarts mid-work, as its clients see it: the CLI's batch, submit and
//! watch, and a client of the synchronous endpoint sending its request again. `serve` is
//! killed (as a crash or a redeploy would) and comes back on the same port.

use std::io::BufRead as _;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::processes::Processes;
use crate::support::{Listening, aptix, http_client};

/// `serve` and one worker, on a fake model answering after `latency_ms` (kept alive by the
/// [`Listening`] returned with them).
async fn with_slow_model(latency_ms: u64) -> (Listening, Processes) {
    let llm = Listening::start(aptix().args([
        "fake-llm",
        "--listen",
        "127.0.0.1:0",
        "--latency-ms",
        &latency_ms.to_string(),
    ]));
    let url = format!("{}/v1", llm.url());
    let processes = Processes::start(vec![("APTIX_LLM_BASE_URL", url)], &[], 1).await;
    (llm, processes)
}

/// A CLI command a test runs, its stderr read line by line as it comes.
struct Cli {
    child: Child,
    lines: mpsc::Receiver<String>,
    reader: std::thread::JoinHandle<Vec<String>>,
}

impl Cli {
    fn start(cmd: &mut std::process::Command) -> Self {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the command starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, lines) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line.clone());
                all.push(line);
            }
            all
        });
        Self {
            child,
            lines,
            reader,
        }
    }

    /// Waits (up to 30 s) for a stderr line containing `needle`.
    fn wait_for(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) if line.contains(needle) => return,
                Ok(_) => {}
                Err(_) => panic!("no line with {needle:?} on the command's stderr"),
            }
        }
    }

    /// Waits (up to 60 s) for the command to end: its exit status, stdout and stderr lines.
    fn finish(mut self) -> (ExitStatus, String, Vec<String>) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the command did not end: {:?}", self.reader.join());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut stdout = String::new();
        std::io::Read::read_to_string(&mut self.child.stdout.take().unwrap(), &mut stdout).unwrap();
        (status, stdout, self.reader.join().unwrap())
    }
}

/// `aptix batch` rides out its front door going away while the batch's turns are with the
/// model: the command says it is waiting for the API, carries on when it answers, and every
/// document completes, each turn run once.
#[tokio::test]
async fn a_batch_rides_out_a_front_door_restart() {
    let (_llm, mut p) = with_slow_model(1500).await;
    let root = std::env::temp_dir().join(format!("aptix-ride-{}", uuid::Uuid::new_v4().simple()));
    let (input, out) = (root.join("in"), root.join("out"));
    std::fs::create_dir_all(&input).unwrap();
    for i in 0..4 {
        std::fs::write(
            input.join(format!("doc-{i}.md")),
            format!("# Doc {i}\n\nText {i}.\n"),
        )
        .unwrap();
    }
    let batch = Cli::start(
        aptix()
            .arg("batch")
            .arg(&input)
            .args(["--instruction", "Summarise", "--poll-ms", "100"])
            .args(["--retry-for-secs", "60", "--url", &p.serve.url(), "--out"])
            .arg(&out),
    );
    batch.wait_for("4 accepted");
    // The turns are with the model (1.5 s); the front door is gone for 3 s.
    p.restart_serve(Duration::from_secs(3));
    let (status, stdout, stderr) = batch.finish();
    assert!(status.success(), "{stdout}\n{stderr:#?}");
    assert!(stdout.contains("4 input(s): 4 completed now"), "{stdout}");
    let said = |needle: &str| stderr.iter().any(|l| l.contains(needle));
    assert!(
        said("cannot be reached") && said("trying again for up to 60 s") && said("answers again"),
        "{stderr:#?}"
    );
    for i in 0..4 {
        let saved = std::fs::read_to_string(out.join(format!("doc-{i}.md.json"))).unwrap();
        assert!(saved.contains("\"completed\""), "{saved}");
    }
    // One model call per document: nothing was submitted or run twice.
    assert_eq!(p.logged("turn completed").iter().sum::<usize>(), 4);
    std::fs::remove_dir_all(&root).unwrap();
}

/// `aptix watch` follows a session through its front door restarting: the stream is lost, the
/// command says so, subscribes again when the front door is back, prints the result that
/// settled while it was away, then the next one as it is published — each once, and none from
/// before it started.
#[tokio::test]
async fn watch_follows_a_session_through_a_front_door_restart() {
    let (_llm, mut p) = with_slow_model(1000).await;
    let turn = |tid: &str| {
        format!(r#"{{"sessionId": "followed", "turnId": "{tid}", "instruction": "hello"}}"#)
    };
    // A result from before the watch starts is not news.
    p.submit(turn("t0")).await;
    p.get_json("/v1/sessions/followed/turns/t0?wait=20").await;
    let watch = Cli::start(
        aptix()
            .args([
                "watch",
                "followed",
                "--count",
                "3",
                "--retry-for-secs",
                "60",
            ])
            .args(["--url", &p.serve.url()]),
    );
    watch.wait_for("watching session followed");
    // One result heard live.
    p.submit(turn("t1")).await;
    p.get_json("/v1/sessions/followed/turns/t1?wait=20").await;
    // One that settles while the front door is down (the model takes a second, the front
    // door is away for three).
    p.submit(turn("t2")).await;
    p.restart_serve(Duration::from_secs(3));
    watch.wait_for("watching session followed again");
    // One after it came back.
    p.submit(turn("t3")).await;
    let (status, stdout, stderr) = watch.finish();
    assert!(status.success(), "{stdout}\n{stderr:#?}");
    let printed: Vec<(String, String)> = stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["turnId"].as_str().unwrap().to_string(),
                v["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected = |t: &str| (t.to_string(), "completed".to_string());
    assert_eq!(
        printed,
        [expected("t1"), expected("t2"), expected("t3")],
        "{stdout}\n{stderr:#?}"
    );
    assert!(
        stderr
            .iter()
            .any(|l| l.contains("trying again for up to 60 s")),
        "{stderr:#?}"
    );
}

/// `aptix submit` waits out its front door restarting while it waits for the result: the turn
/// runs on, and the command prints its result once the front door answers again.
#[tokio::test]
async fn submit_waits_out_a_front_door_restart() {
    let (_llm, mut p) = with_slow_model(2000).await;
    let file = std::env::temp_dir().join(format!(
        "aptix-submit-{}.json",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(
        &file,
        r#"{"sessionId": "submitted", "turnId": "t", "instruction": "hello"}"#,
    )
    .unwrap();
    let submit = Cli::start(aptix().arg("submit").arg(&file).args([
        "--retry-for-secs",
        "60",
        "--url",
        &p.serve.url(),
    ]));
    // Accepted, and with the model: the command is waiting on the front door.
    p.wait_running("submitted", "t").await;
    p.restart_serve(Duration::from_secs(3));
    let (status, stdout, stderr) = submit.finish();
    assert!(status.success(), "{stdout}\n{stderr:#?}");
    let result: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(result["successful"], true, "{stdout}");
    assert_eq!(result["result"]["turnId"], "t", "{stdout}");
    let said = |needle: &str| stderr.iter().any(|l| l.contains(needle));
    assert!(
        said("trying again for up to 60 s") && said("answers again"),
        "{stderr:#?}"
    );
    assert_eq!(p.logged("turn completed").iter().sum::<usize>(), 1);
    std::fs::remove_file(&file).unwrap();
}

/// A client of the synchronous endpoint (the IDE) whose front door restarts mid-turn sends the
/// same request again, to the front door that is back: it gets the turn's result as soon as
/// the turn settles (its job named the front door that went away), and the turn ran once.
#[tokio::test]
async fn the_synchronous_endpoint_sent_again_after_a_front_door_restart_answers_the_same_turn() {
    let (_llm, mut p) = with_slow_model(2000).await;
    let body = r#"{"sessionId": "ide", "turnId": "t", "instruction": "hello"}"#;
    let execute = |url: String| async move {
        http_client()
            .post(format!("{url}/api/ai/agent/execute"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
    };
    let first = tokio::spawn(execute(p.serve.url()));
    p.wait_running("ide", "t").await;
    p.restart_serve(Duration::from_millis(500));
    // The first wait ended with its front door.
    assert!(first.await.unwrap().is_err());
    let sent = Instant::now();
    let resp = execute(p.serve.url()).await.unwrap();
    assert_eq!(resp.status(), 200);
    // Heard of as it settled (the model answers within two seconds of the turn's start), not
    // found in the store at the wait's next recheck, fifteen seconds on.
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "{:?}",
        sent.elapsed()
    );
    let answer: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(answer["successful"], true, "{answer}");
    assert_eq!(answer["result"]["kind"], "final", "{answer}");
    assert_eq!(answer["result"]["turnId"], "t", "{answer}");
    assert_eq!(p.logged("turn completed").iter().sum::<usize>(), 1);
}
