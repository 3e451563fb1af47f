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
    redis: RedisGuard,
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
            redis,
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

    /// Starts one more front door on the same broker and store (for tests of several front
    /// doors behind a balancer).
    pub fn start_serve(&self) -> Listening {
        Listening::start(Self::command(&self.env).args(["serve", "--listen", "127.0.0.1:0"]))
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

    /// Waits (up to 20 s) until turn `turn` of `session` is running.
    pub async fn wait_running(&self, session: &str, turn: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let path = format!("/v1/sessions/{session}/turns/{turn}");
        while self.get_json(&path).await["result"]["status"] != "running" {
            assert!(
                std::time::Instant::now() < deadline,
                "{session}/{turn} never ran"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The deployment's store, as the tests look at it from outside the processes.
    pub fn store(&self) -> &aptix_worker::store::RedisStore {
        &self.redis.store
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
