//! One way to start the product for HTTP tests: the front door on port 0 with an in-process
//! worker, over real RabbitMQ and Redis (fresh names, removed afterwards) or over the embedded
//! in-memory broker and store, and a client that checks every JSON answer against the served
//! `/openapi.json`.

use std::sync::Arc;
use std::time::Duration;

use aptix_worker::config::{BatchLimits, Config};
use aptix_worker::contract::RequestLimits;
use aptix_worker::fake_llm::{FakeLlm, FakeOptions};
use aptix_worker::queue::{Broker, Topology};
use aptix_worker::store::SessionStore;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::{
    RabbitGuard, RedisGuard, rabbit_broker, redis_store_in, schema, test_topology,
};

pub struct App {
    pub base: String,
    pub http: reqwest::Client,
    pub fake: FakeLlm,
    pub store: Arc<dyn SessionStore>,
    pub broker: Arc<dyn Broker>,
    pub topology: Topology,
    pub stop: CancellationToken,
    /// Stops the in-process worker alone ([`App::replace_worker`]).
    pub worker_stop: CancellationToken,
    pub config: Config,
    pub api: Value,
    pub _app: aptix_worker::app::App,
    pub _rabbit: Option<RabbitGuard>,
    pub _redis: Option<RedisGuard>,
}

/// Which broker and store an app runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The local RabbitMQ and Redis.
    Services,
    /// The in-memory broker and store.
    Embedded,
}

/// How to start an app.
pub struct AppOptions {
    pub backend: Backend,
    pub limits: RequestLimits,
    pub batch_limits: BatchLimits,
    /// Overrides the test topology's reply queue expiry.
    pub reply_queue_ttl: Option<Duration>,
    /// Reach Redis at this URL instead (a proxy in front of the local one).
    pub redis_url: Option<String>,
    /// Reach RabbitMQ at this URL instead.
    pub amqp_url: Option<String>,
    /// Bound on each Redis command and broker operation (default: the product's).
    pub dependency_timeout: Option<Duration>,
    /// More configuration variables (they win over the defaults above).
    pub extra_env: Vec<(&'static str, String)>,
    /// How the fake model answers.
    pub fake: FakeOptions,
}

impl Default for AppOptions {
    fn default() -> Self {
        Self {
            backend: Backend::Services,
            limits: RequestLimits::default(),
            batch_limits: BatchLimits::default(),
            reply_queue_ttl: None,
            redis_url: None,
            amqp_url: None,
            dependency_timeout: None,
            extra_env: Vec::new(),
            fake: FakeOptions::default(),
        }
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn spawn_app(limits: RequestLimits) -> App {
    spawn_app_with(limits, BatchLimits::default()).await
}

pub async fn spawn_app_with(limits: RequestLimits, batch_limits: BatchLimits) -> App {
    spawn(AppOptions {
        limits,
        batch_limits,
        ..AppOptions::default()
    })
    .await
}

/// Starts an app with `options`, built the way the binary builds one: a configuration, then
/// [`aptix_worker::app::App::build`], a worker and the HTTP API on port 0.
pub async fn spawn(options: AppOptions) -> App {
    let AppOptions {
        backend,
        limits,
        batch_limits,
        reply_queue_ttl,
        redis_url,
        amqp_url,
        dependency_timeout,
        extra_env,
        fake,
    } = options;
    let fake = FakeLlm::start("127.0.0.1:0".parse().unwrap(), fake, Some(schema()))
        .await
        .unwrap();
    let mut topology = test_topology();
    if let Some(ttl) = reply_queue_ttl {
        topology.reply_queue_ttl = ttl;
    }
    let ns = topology.namespace.clone();
    let mut env = vec![
        ("APTIX_NAMESPACE", ns.clone()),
        ("APTIX_LLM_BASE_URL", fake.base_url()),
        ("APTIX_MODEL", "m".to_string()),
        ("APTIX_LLM_MAX_RETRIES", "0".to_string()),
        ("APTIX_LLM_CONNECT_TIMEOUT_SECS", "2".to_string()),
        ("APTIX_LLM_TIMEOUT_SECS", "30".to_string()),
        (
            "APTIX_API_TOKENS",
            "tok-a=tenant-a,tok-b=tenant-b".to_string(),
        ),
    ];
    let (mut rabbit, redis) = match backend {
        Backend::Services => {
            // Direct connections that declare the topology first and remove everything under
            // the test's namespace afterwards; the app itself may go through a proxy.
            let rabbit = RabbitGuard {
                broker: rabbit_broker(&topology, &format!("{ns}-test")).await,
                topology: topology.clone(),
            };
            let redis = redis_store_in(&ns).await;
            env.push((
                "APTIX_AMQP_URL",
                amqp_url.unwrap_or_else(crate::support::amqp_url),
            ));
            env.push((
                "APTIX_REDIS_URL",
                redis_url.unwrap_or_else(crate::support::redis_url),
            ));
            (Some(rabbit), Some(redis))
        }
        Backend::Embedded => (None, None),
    };
    env.splice(0..0, extra_env);
    let mut config = Config::from_lookup(|k| {
        env.iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| v.clone())
    })
    .unwrap();
    config.limits.request = limits;
    config.limits.batch = batch_limits;
    config.broker.reply_queue_ttl = topology.reply_queue_ttl;
    config.broker.retry_delays = topology.retry_delays.clone();
    if let Some(timeout) = dependency_timeout {
        config.dependency_timeout = timeout;
    }
    if let Some(r) = rabbit.as_mut() {
        // The app declares the lanes of its tenants file; they go with the rest.
        r.topology.lanes.extend(config.topology().lanes);
        // And the webhook retry queues of its schedule.
        r.topology.hook_delays = config.topology().hook_delays;
    }
    let app = aptix_worker::app::App::build(&config).await.unwrap();
    let stop = CancellationToken::new();
    let worker_stop = stop.child_token();
    app.worker(&config).spawn(worker_stop.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    app.spawn_http(&config, listener, stop.clone());
    let http = crate::support::http_client();
    let api: Value = http
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    App {
        base,
        http,
        fake,
        store: app.store.clone(),
        broker: app.broker.clone(),
        topology: app.topology.clone(),
        stop,
        worker_stop,
        config,
        api,
        _app: app,
        _rabbit: rabbit,
        _redis: redis,
    }
}

impl App {
    /// Stops the in-process worker (its turns abandoned after `APTIX_SHUTDOWN_GRACE_SECS`,
    /// as a worker that dies leaves them: nothing of theirs runs to its end) and starts
    /// another in its place.
    pub fn replace_worker(&self) {
        self.worker_stop.cancel();
        self._app
            .worker(&self.config)
            .spawn(self.stop.child_token());
    }

    pub async fn post(&self, token: Option<&str>, body: impl Into<reqwest::Body>) -> (u16, Value) {
        self.post_to(token, "/v1/turns", body).await
    }

    pub async fn post_to(
        &self,
        token: Option<&str>,
        path: &str,
        body: impl Into<reqwest::Body>,
    ) -> (u16, Value) {
        self.post_with(token, path, &[], body).await
    }

    /// A POST with extra request headers; the answer is checked against the API document.
    pub async fn post_with(
        &self,
        token: Option<&str>,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<reqwest::Body>,
    ) -> (u16, Value) {
        let mut req = self.http.post(format!("{}{path}", self.base)).body(body);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap();
        self.conforms("post", path, status, &body);
        (status, body)
    }

    pub async fn get(&self, token: Option<&str>, path: &str) -> (u16, Value) {
        let mut req = self.http.get(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap();
        self.conforms("get", path, status, &body);
        (status, body)
    }

    /// The turn's status once it leaves queued/running (long-polls up to 30 s).
    pub async fn settled(&self, token: &str, session: &str, turn: &str) -> Value {
        let (status, body) = self
            .get(
                Some(token),
                &format!("/v1/sessions/{session}/turns/{turn}?wait=30"),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        body["result"].clone()
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics_text(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Waits (up to 10 s) until the series `series` of `/metrics` satisfies `until` (an absent
    /// series reads 0: counters appear with their first event), and returns its value: a test
    /// waits on what the product says happened, not on the clock.
    pub async fn wait_for_metric(&self, series: &str, until: impl Fn(f64) -> bool) -> f64 {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let text = self.metrics_text().await;
            let value = crate::support::metric_value(&text, series).unwrap_or(0.0);
            if until(value) {
                return value;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{series} stayed at {value}:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How many turns the front door has accepted (enqueued, broker-confirmed) so far: a
    /// request it refused left this where it was, so nothing can run for it.
    pub async fn accepted_turns(&self) -> f64 {
        crate::support::metric(&self.metrics_text().await, "aptix_turns_accepted_total")
    }

    /// Waits until the fake model has received `n` requests.
    pub async fn wait_for_model_calls(&self, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.fake.requests().len() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "the model got {} of {n} calls",
                self.fake.requests().len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Every JSON answer must match what /openapi.json says this route answers with this status.
    pub fn conforms(&self, method: &str, path: &str, status: u16, body: &Value) {
        let schema = response_schema(&self.api, method, path, status)
            .unwrap_or_else(|| panic!("/openapi.json documents no {status} for {method} {path}"));
        self.matches_schema(&schema["$ref"], &format!("{method} {path} {status}"), body);
    }

    /// `body` must match the documented schema `reference` (`#/components/schemas/...`).
    pub fn matches_schema(&self, reference: &Value, what: &str, body: &Value) {
        let root = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$ref": reference,
            "components": self.api["components"],
        });
        let validator = jsonschema::validator_for(&root).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(body)
            .map(|e| format!("{} at {}", e, e.instance_path))
            .collect();
        assert!(
            errors.is_empty(),
            "{what} does not match its documented schema: {errors:?}\n{body}"
        );
    }
}

/// The documented JSON schema of a route's answer, matching the path against the templates.
pub fn response_schema(api: &Value, method: &str, path: &str, status: u16) -> Option<Value> {
    let path = path.split('?').next().unwrap_or(path);
    let segments: Vec<&str> = path.split('/').collect();
    let (_, ops) = api["paths"].as_object()?.iter().find(|(template, _)| {
        let t: Vec<&str> = template.split('/').collect();
        t.len() == segments.len()
            && t.iter()
                .zip(&segments)
                .all(|(a, b)| a.starts_with('{') || a == b)
    })?;
    let content = &ops[method]["responses"][status.to_string()]["content"];
    content["application/json"]["schema"]
        .as_object()
        .map(|o| Value::Object(o.clone()))
}

/// The first error code of an answer.
pub fn code(v: &Value) -> &str {
    v["errors"][0]["errorCode"].as_str().unwrap_or("")
}
