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
