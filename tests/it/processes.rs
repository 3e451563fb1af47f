//! `aptix serve` and `aptix worker` as processes, the way an operator runs them, for tests that
//! need more than one process.

use std::time::Duration;

use crate::support::{
    Listening, RabbitGuard, RedisGuard, amqp_url, http_client, rabbit_broker, redis_store_in,
    redis_url, test_topology,
};

/// `aptix serve` and `aptix worker` processes on the local RabbitMQ and Redis, under a fresh
/// namespace removed afterwards, configured by the environment given plus test defaults
/// (short retry delays and leases, no in-call model retries, eight turns per worker).
pub struct Processes {
    pub namespace: String,
    env: Vec<(String, String)>,
    pub serve: Listening,
    pub workers: Vec<Listening>,
    _redis: RedisGuard,
    _rabbit: RabbitGuard,
}

impl Processes {
    /// Starts `serve` and `workers` workers; `lanes` are the capped tenants of a tenants file
    /// in `env` (their queues are removed afterwards too).
    pub async fn start(env: Vec<(&'static str, String)>, lanes: &[&str], workers: usize) -> Self {
        let topology = test_topology().with_lanes(lanes.iter().copied());
        let namespace = topology.namespace.clone();
        let rabbit = RabbitGuard {
            broker: rabbit_broker(&topology, &format!("{namespace}-test")).await,
            topology,
        };
        let redis = redis_store_in(&namespace).await;
        let defaults = [
            ("APTIX_AMQP_URL", amqp_url()),
            ("APTIX_REDIS_URL", redis_url()),
            ("APTIX_NAMESPACE", namespace.clone()),
            ("APTIX_RETRY_DELAYS_MS", "200,400".into()),
            ("APTIX_LLM_MAX_RETRIES", "0".into()),
            ("APTIX_LEASE_SECS", "2".into()),
            ("APTIX_CONCURRENCY", "8".into()),
            // A turn's start and its publish are logged at debug; the tests count them.
            (
                "RUST_LOG",
                "info,aptix_worker::worker=debug,aptix_worker::pipeline=debug".into(),
            ),
            ("NO_COLOR", "1".into()),
        ];
        let env: Vec<(String, String)> = defaults
            .into_iter()
            .chain(env)
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let serve =
            Listening::start(Self::command(&env).args(["serve", "--listen", "127.0.0.1:0"]));
        let mut p = Self {
            namespace,
            env,
            serve,
            workers: Vec::new(),
            _redis: redis,
            _rabbit: rabbit,
        };
        for _ in 0..workers {
            p.add_worker();
        }
        p
    }

    fn command(env: &[(String, String)]) -> std::process::Command {
        let mut c = crate::support::aptix();
        c.envs(env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// Starts one more worker and waits until it consumes.
    pub fn add_worker(&mut self) {
        let worker =
            Listening::start(Self::command(&self.env).args(["worker", "--listen", "127.0.0.1:0"]));
        assert!(
            worker.wait_for_line("consuming turn jobs", Duration::from_secs(20)),
            "the worker did not start"
        );
        self.workers.push(worker);
    }

    /// Stops `serve` (killed, as a crash or a redeploy would) and, after `down`, starts it
    /// again on the same port.
    pub fn restart_serve(&mut self, down: Duration) {
        let port = self.serve.port;
        let _ = self.serve.child.kill();
        let _ = self.serve.child.wait();
        std::thread::sleep(down);
        self.serve = Listening::start(Self::command(&self.env).args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ]));
    }

    /// Submits a turn (as the local tenant); it must be accepted.
    pub async fn submit(&self, body: String) {
        let resp = http_client()
            .post(format!("{}/v1/turns", self.serve.url()))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status().as_u16(),
            202,
            "{}",
            resp.text().await.unwrap()
        );
    }

    /// GETs a path of the front door as JSON.
    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        http_client()
            .get(format!("{}{path}", self.serve.url()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Waits (up to 40 s) until turn `t` of `session` has completed.
    pub async fn wait_completed(&self, session: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(40);
        loop {
            let body = self
                .get_json(&format!("/v1/sessions/{session}/turns/t?wait=10"))
                .await;
            if body["result"]["status"] == "completed" {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{session} did not complete: {body}"
            );
        }
    }

    /// How many lines of each worker's log contain `needle`.
    pub fn logged(&self, needle: &str) -> Vec<usize> {
        self.workers
            .iter()
            .map(|w| w.lines().iter().filter(|l| l.contains(needle)).count())
            .collect()
    }
}

/// Each thread of process `pid`: its name and its scheduling policy as the kernel reports it
/// (`/proc/<pid>/task/<tid>/stat`, field 41: 0 normal, 3 batch).
#[cfg(target_os = "linux")]
fn thread_policies(pid: u32) -> Vec<(String, u32)> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        // A thread that ended since the directory was read (an idle blocking-pool thread,
        // say) has no files left to read: it is not one of the process's threads any more.
        let (Ok(name), Ok(stat)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("stat")),
        ) else {
            continue;
        };
        // The fields after the name, which ends with the last ')': field 3 is the first.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        threads.push((name.trim().to_string(), fields[41 - 3].parse().unwrap()));
    }
    threads
}

/// `APTIX_CPU_SCHEDULING=batch` puts every thread of `aptix serve` and `aptix worker` in
/// SCHED_BATCH — the runtime's and lapin's I/O thread included, as the kernel reports them —
/// and says so in the log; the processes run turns as before. Without it, every thread keeps
/// the normal class. A class it does not know stops a long-running process, naming the
/// variable; a client command does not read it.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn cpu_scheduling_batch_reaches_every_thread_of_serve_and_worker() {
    const BATCH: u32 = 3;
    const NORMAL: u32 = 0;
    let turn = |session: &str| {
        format!(r#"{{"sessionId": "{session}", "turnId": "t", "instruction": "hello"}}"#)
    };
    let batch = Processes::start(vec![("APTIX_CPU_SCHEDULING", "batch".into())], &[], 1).await;
    batch.submit(turn("sched-batch")).await;
    batch.wait_completed("sched-batch").await;
    for process in [&batch.serve, &batch.workers[0]] {
        let threads = thread_policies(process.child.id());
        assert!(
            threads.iter().any(|(name, _)| name == "lapin-io-loop"),
            "{threads:?}"
        );
        assert!(
            threads.iter().all(|(_, policy)| *policy == BATCH),
            "{threads:?}"
        );
        assert!(
            process
                .lines()
                .iter()
                .any(|l| l.contains("CPU scheduling: SCHED_BATCH")),
            "{:?}",
            process.lines()
        );
    }
    drop(batch);

    let normal = Processes::start(Vec::new(), &[], 1).await;
    normal.submit(turn("sched-normal")).await;
    normal.wait_completed("sched-normal").await;
    for process in [&normal.serve, &normal.workers[0]] {
        let threads = thread_policies(process.child.id());
        assert!(
            threads.iter().all(|(_, policy)| *policy == NORMAL),
            "{threads:?}"
        );
    }
    drop(normal);

    let out = crate::support::aptix()
        .arg("worker")
        .env("APTIX_CPU_SCHEDULING", "fifo")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("APTIX_CPU_SCHEDULING") && stderr.contains("fifo"),
        "{stderr}"
    );
    let out = crate::support::aptix()
        .arg("modes")
        .env("APTIX_CPU_SCHEDULING", "fifo")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// When the kernel refuses `APTIX_CPU_SCHEDULING=batch` the process says so and works on in
/// the class it started in. The refusal is made real: the process starts in `SCHED_IDLE`,
/// which an unprivileged thread may leave only within its `RLIMIT_NICE` (set to nothing here),
/// and without `CAP_SYS_NICE` (dropped from the bounding set when the tests run as root).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_refused_cpu_scheduling_class_is_a_warning_and_the_process_serves_on() {
    const IDLE: u32 = 5;
    let mut wrapped = std::process::Command::new("chrt");
    wrapped.args(["--idle", "0"]);
    // SAFETY: geteuid reads the calling process's effective user id; it cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        wrapped.args([
            "setpriv",
            "--inh-caps=-sys_nice",
            "--bounding-set=-sys_nice",
        ]);
    }
    wrapped
        .args(["prlimit", "--nice=0:0"])
        .arg(env!("CARGO_BIN_EXE_aptix"))
        .args(["serve", "--worker", "--listen", "127.0.0.1:0"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("APTIX_CPU_SCHEDULING", "batch")
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1");
    for var in ["APTIX_AMQP_URL", "APTIX_REDIS_URL", "APTIX_LLM_BASE_URL"] {
        wrapped.env_remove(var);
    }
    let serve = Listening::start(&mut wrapped);
    let warning = serve
        .lines()
        .into_iter()
        .find(|l| l.contains("CPU scheduling class left as it was"));
    let Some(warning) = warning else {
        panic!("no warning: {:?}", serve.lines());
    };
    assert!(
        warning.contains("WARN")
            && warning.contains("cannot apply APTIX_CPU_SCHEDULING=batch")
            && warning.contains("os error 1"),
        "{warning}"
    );
    assert!(
        !serve
            .lines()
            .iter()
            .any(|l| l.contains("CPU scheduling: SCHED_BATCH")),
        "{:?}",
        serve.lines()
    );
    let threads = thread_policies(serve.child.id());
    assert!(
        threads.iter().all(|(_, policy)| *policy == IDLE),
        "{threads:?}"
    );
    // It still runs turns: one, in the embedded queue and store, answered by the model.
    let resp = http_client()
        .post(format!("{}/api/ai/agent/execute", serve.url()))
        .body(r#"{"sessionId": "sched-refused", "turnId": "t", "instruction": "hello"}"#)
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.text().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"final\""), "{body}");
}

/// `aptix batch` rides out its front door going away: `serve` is killed while the batch's
/// turns are with the model and comes back on the same port seconds later. The command says it
/// is waiting for the API, carries on when it answers, and every document completes, each
/// turn run once.
#[tokio::test]
async fn a_batch_rides_out_a_front_door_restart() {
    use std::io::BufRead as _;
    let llm = Listening::start(crate::support::aptix().args([
        "fake-llm",
        "--listen",
        "127.0.0.1:0",
        "--latency-ms",
        "1500",
    ]));
    let mut p = Processes::start(
        vec![("APTIX_LLM_BASE_URL", format!("{}/v1", llm.url()))],
        &[],
        1,
    )
    .await;
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
    let mut batch = crate::support::aptix()
        .arg("batch")
        .arg(&input)
        .args(["--instruction", "Summarise", "--poll-ms", "100"])
        .args(["--retry-for-secs", "60", "--url", &p.serve.url(), "--out"])
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = batch.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("4 accepted") {
                let _ = tx.send(());
            }
            lines.push(line);
        }
        lines
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the batch was accepted");
    // The turns are with the model (1.5 s); the front door is gone for 3 s.
    p.restart_serve(Duration::from_secs(3));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = batch.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = batch.kill();
            panic!("the batch did not finish: {:?}", reader.join());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut batch.stdout.take().unwrap(), &mut stdout).unwrap();
    let stderr = reader.join().unwrap();
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
/// settled while it was away, then the next one as it is published — each once.
#[tokio::test]
async fn watch_follows_a_session_through_a_front_door_restart() {
    use std::io::BufRead as _;
    let llm = Listening::start(crate::support::aptix().args([
        "fake-llm",
        "--listen",
        "127.0.0.1:0",
        "--latency-ms",
        "1000",
    ]));
    let mut p = Processes::start(
        vec![("APTIX_LLM_BASE_URL", format!("{}/v1", llm.url()))],
        &[],
        1,
    )
    .await;
    let turn = |tid: &str| {
        format!(r#"{{"sessionId": "followed", "turnId": "{tid}", "instruction": "hello"}}"#)
    };
    // A result from before the watch starts is not news.
    p.submit(turn("t0")).await;
    p.get_json("/v1/sessions/followed/turns/t0?wait=20").await;
    let mut watch = crate::support::aptix()
        .args([
            "watch",
            "followed",
            "--count",
            "3",
            "--retry-for-secs",
            "60",
        ])
        .args(["--url", &p.serve.url()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = watch.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line.clone());
            lines.push(line);
        }
        lines
    });
    let wait_for = |needle: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return,
                Ok(_) => {}
                Err(_) => panic!("no line with {needle:?} on the watch's stderr"),
            }
        }
    };
    wait_for("watching session followed");
    // One result heard live.
    p.submit(turn("t1")).await;
    p.get_json("/v1/sessions/followed/turns/t1?wait=20").await;
    // One that settles while the front door is down (the model takes a second, the front
    // door is away for three).
    p.submit(turn("t2")).await;
    p.restart_serve(Duration::from_secs(3));
    wait_for("watching session followed again");
    // One after it came back.
    p.submit(turn("t3")).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = watch.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = watch.kill();
            panic!("the watch did not end: {:?}", reader.join());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut watch.stdout.take().unwrap(), &mut stdout).unwrap();
    let stderr = reader.join().unwrap();
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
    let llm = Listening::start(crate::support::aptix().args([
        "fake-llm",
        "--listen",
        "127.0.0.1:0",
        "--latency-ms",
        "2000",
    ]));
    let mut p = Processes::start(
        vec![("APTIX_LLM_BASE_URL", format!("{}/v1", llm.url()))],
        &[],
        1,
    )
    .await;
    let file = std::env::temp_dir().join(format!(
        "aptix-submit-{}.json",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(
        &file,
        r#"{"sessionId": "submitted", "turnId": "t", "instruction": "hello"}"#,
    )
    .unwrap();
    let submit = crate::support::aptix()
        .arg("submit")
        .arg(&file)
        .args(["--retry-for-secs", "60", "--url", &p.serve.url()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Accepted, and with the model: the command is waiting on the front door.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while p.get_json("/v1/sessions/submitted/turns/t").await["result"]["status"] != "running" {
        assert!(std::time::Instant::now() < deadline, "the turn never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    p.restart_serve(Duration::from_secs(3));
    let out = tokio::task::spawn_blocking(move || submit.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let result: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(result["successful"], true, "{stdout}");
    assert_eq!(result["result"]["turnId"], "t", "{stdout}");
    assert!(
        stderr.contains("trying again for up to 60 s") && stderr.contains("answers again"),
        "{stderr}"
    );
    assert_eq!(p.logged("turn completed").iter().sum::<usize>(), 1);
    std::fs::remove_file(&file).unwrap();
}

/// A client of the synchronous endpoint (the IDE) whose front door restarts mid-turn sends the
/// same request again, to the front door that is back: it gets the turn's result as soon as
/// the turn settles (its job named the front door that went away), and the turn ran once.
#[tokio::test]
async fn the_synchronous_endpoint_sent_again_after_a_front_door_restart_answers_the_same_turn() {
    let llm = Listening::start(crate::support::aptix().args([
        "fake-llm",
        "--listen",
        "127.0.0.1:0",
        "--latency-ms",
        "2000",
    ]));
    let mut p = Processes::start(
        vec![("APTIX_LLM_BASE_URL", format!("{}/v1", llm.url()))],
        &[],
        1,
    )
    .await;
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
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while p.get_json("/v1/sessions/ide/turns/t").await["result"]["status"] != "running" {
        assert!(std::time::Instant::now() < deadline, "the turn never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    p.restart_serve(Duration::from_millis(500));
    // The first wait ended with its front door.
    assert!(first.await.unwrap().is_err());
    let sent = std::time::Instant::now();
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
