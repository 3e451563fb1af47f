//! Shared test helpers: the fake model on port 0 with the official schema, stores (in-memory or
//! real Redis under a fresh namespace), brokers, and pipelines wired to them; the `aptix` binary
//! run as a process in `support/binary.rs`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use aptix_worker::catalog::ModeCatalog;
use aptix_worker::contract::{AgentExecuteRequest, RequestLimits, parse_request};
use aptix_worker::fake_llm::{FakeLlm, FakeOptions, RequestCheck, create_response_validator};
use aptix_worker::llm::LlmClient;
use aptix_worker::pipeline::{Pipeline, PipelineSettings};
use aptix_worker::store::{MemoryStore, RedisStore, Retention, SessionStore};
use serde_json::Value;

#[path = "support/binary.rs"]
mod binary;
#[path = "support/browser.rs"]
pub mod browser;
pub use binary::*;

/// The official OpenAPI document of the Responses API (published data, copied into the repo).
const OFFICIAL_OPENAPI: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/openai/openapi.json"
);

/// The `CreateResponse` check, compiled once per test binary.
pub fn schema() -> RequestCheck {
    static SCHEMA: OnceLock<RequestCheck> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            create_response_validator(std::path::Path::new(OFFICIAL_OPENAPI))
                .expect("the official OpenAPI document loads")
        })
        .clone()
}

/// The check for one component schema of the official document (`Response`,
/// `ResponseStreamEvent`, …) of what the live API sends us, with the one place the live API
/// departs from its document allowed: it writes `"user": null` in a response (the recorded
/// answers in the fixtures do) where the document says a string. `usage: null` is allowed too
/// in a response still in progress, as the live API streams it.
pub fn official_answer_check(component: &str) -> impl Fn(&Value) -> Result<(), (String, String)> {
    let check = aptix_worker::fake_llm::component_validator(
        std::path::Path::new(OFFICIAL_OPENAPI),
        component,
    )
    .unwrap_or_else(|e| panic!("the official {component} schema compiles: {e}"));
    move |value: &Value| {
        let mut value = value.clone();
        let response = if value.get("response").is_some() {
            value.get_mut("response")
        } else {
            Some(&mut value)
        };
        if let Some(r) = response.and_then(Value::as_object_mut) {
            if r.get("user") == Some(&Value::Null) {
                r.remove("user");
            }
            if r.get("status") == Some(&Value::from("in_progress"))
                && r.get("usage") == Some(&Value::Null)
            {
                r.remove("usage");
            }
        }
        check(&value)
    }
}

/// Asserts that a request body is a valid `CreateResponse`.
#[track_caller]
pub fn assert_valid_create_response(body: &Value) {
    if let Err((error, path)) = schema()(body) {
        panic!("not a valid CreateResponse: {error} at {path}\n{body:#}");
    }
}

/// The Redis the integration tests use (they fail, not skip, when it is not there).
pub fn redis_url() -> String {
    std::env::var("APTIX_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

/// A plain connection to the tests' Redis, for looking at (or tampering with) keys as an
/// operator would.
pub async fn redis_connection() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .expect("the test Redis URL is valid")
        .get_multiplexed_async_connection()
        .await
        .expect("Redis is reachable")
}

/// A Redis store under a fresh namespace; its keys are deleted when the guard drops, even when
/// the test panics.
pub struct RedisGuard {
    pub store: Arc<RedisStore>,
}

impl Drop for RedisGuard {
    fn drop(&mut self) {
        let pattern = format!("{}:*", self.store.namespace());
        let Ok(client) = redis::Client::open(redis_url()) else {
            return;
        };
        let Ok(mut conn) = client.get_connection() else {
            return;
        };
        let mut cursor: u64 = 0;
        loop {
            let scanned: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query(&mut conn);
            let Ok((next, keys)) = scanned else { return };
            if !keys.is_empty() {
                let _: redis::RedisResult<u64> = redis::cmd("DEL").arg(&keys).query(&mut conn);
            }
            if next == 0 {
                return;
            }
            cursor = next;
        }
    }
}

/// A Redis store with its own namespace.
pub async fn redis_store() -> RedisGuard {
    redis_store_with(Retention::default()).await
}

/// A Redis store with its own namespace and retention.
pub async fn redis_store_with(retention: Retention) -> RedisGuard {
    let ns = format!("aptix-test-{}", uuid::Uuid::new_v4().simple());
    redis_store_at(&ns, retention).await
}

/// A Redis store in the namespace `ns` (an app's), removed with the guard.
pub async fn redis_store_in(ns: &str) -> RedisGuard {
    redis_store_at(ns, Retention::default()).await
}

async fn redis_store_at(ns: &str, retention: Retention) -> RedisGuard {
    let store = RedisStore::connect(&redis_url(), ns, retention)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "Redis must be running at {} for this test: {e}",
                redis_url()
            )
        });
    RedisGuard {
        store: Arc::new(store),
    }
}

/// Which store a harness uses.
pub enum StoreKind {
    Memory,
    Redis,
}

pub struct Harness {
    pub fake: FakeLlm,
    pub store: Arc<dyn SessionStore>,
    pub pipeline: Pipeline,
    pub _redis: Option<RedisGuard>,
}

pub struct Setup {
    pub options: FakeOptions,
    pub settings: PipelineSettings,
    pub timeout: Duration,
    pub max_retries: usize,
    pub store: StoreKind,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            options: FakeOptions::default(),
            settings: PipelineSettings::new("gpt-test"),
            timeout: Duration::from_secs(10),
            max_retries: 2,
            store: StoreKind::Memory,
        }
    }
}

fn client(base_url: &str, timeout: Duration, max_retries: usize) -> LlmClient {
    LlmClient::new(base_url, None, Duration::from_secs(2), timeout, max_retries)
        .expect("client")
        .with_min_backoff(Duration::from_millis(10))
}

impl Harness {
    /// Another worker (its own id and client) over the same store and fake model.
    pub fn another_worker(&self, settings: PipelineSettings) -> Pipeline {
        let llm = client(&self.fake.base_url(), Duration::from_secs(10), 2);
        Pipeline::new(
            self.store.clone(),
            Arc::new(ModeCatalog::builtin()),
            llm,
            settings,
        )
        .expect("pipeline")
    }
}

pub async fn harness(setup: Setup) -> Harness {
    let fake = FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        setup.options,
        Some(schema()),
    )
    .await
    .expect("fake model starts");
    let (store, guard): (Arc<dyn SessionStore>, Option<RedisGuard>) = match setup.store {
        StoreKind::Memory => (Arc::new(MemoryStore::new()), None),
        StoreKind::Redis => {
            let g = redis_store().await;
            (g.store.clone(), Some(g))
        }
    };
    let llm = client(&fake.base_url(), setup.timeout, setup.max_retries);
    let pipeline = Pipeline::new(
        store.clone(),
        Arc::new(ModeCatalog::builtin()),
        llm,
        setup.settings,
    )
    .expect("pipeline");
    Harness {
        fake,
        store,
        pipeline,
        _redis: guard,
    }
}

/// Parses a request literal (panics on invalid test input).
pub fn request(v: Value) -> AgentExecuteRequest {
    parse_request(v.to_string().as_bytes(), &RequestLimits::default())
        .expect("test request is valid")
        .request
}

/// The RabbitMQ the integration tests use (they fail, not skip, when it is not there).
pub fn amqp_url() -> String {
    std::env::var("APTIX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// A RabbitMQ broker under a fresh namespace with short retry delays; its queues and exchange
/// are deleted when the guard drops (reply queues expire by themselves after 30 s unused).
pub struct RabbitGuard {
    pub broker: Arc<aptix_worker::queue::RabbitBroker>,
    pub topology: aptix_worker::queue::Topology,
}

impl Drop for RabbitGuard {
    fn drop(&mut self) {
        let topology = self.topology.clone();
        // The test's runtime may be shutting down: clean up from a thread with its own.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let b = aptix_worker::queue::RabbitBroker::new(
                    &amqp_url(),
                    topology,
                    "aptix-test-cleanup",
                );
                let _ = b.delete_topology().await;
            });
        })
        .join();
    }
}

/// A test topology: unique namespace, short retry delays.
pub fn test_topology() -> aptix_worker::queue::Topology {
    let mut t = aptix_worker::queue::Topology::new(&format!(
        "aptix-test-{}",
        uuid::Uuid::new_v4().simple()
    ));
    t.retry_delays = vec![Duration::from_millis(200), Duration::from_millis(400)];
    t.reply_queue_ttl = Duration::from_secs(30);
    // The lane of the tenant the conformance suite caps.
    t.with_lanes(["capped"])
}

pub async fn rabbit_broker(
    topology: &aptix_worker::queue::Topology,
    name: &str,
) -> Arc<aptix_worker::queue::RabbitBroker> {
    let b = aptix_worker::queue::RabbitBroker::new(&amqp_url(), topology.clone(), name);
    b.connect().await.unwrap_or_else(|e| {
        panic!(
            "RabbitMQ must be running at {} for this test: {e}",
            amqp_url()
        )
    });
    Arc::new(b)
}

pub async fn rabbit() -> RabbitGuard {
    let topology = test_topology();
    let broker = rabbit_broker(&topology, &format!("{}-test", topology.namespace)).await;
    RabbitGuard { broker, topology }
}

/// A plain AMQP connection for looking at queues from outside the product.
pub async fn amqp_peek() -> lapin::Connection {
    let props = lapin::ConnectionProperties::default();
    lapin::Connection::connect(&amqp_url(), props)
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ must be running at {}: {e}", amqp_url()))
}

/// Whether a queue exists, asked of `rabbitmqctl` so that asking does not count as using the
/// queue (a declare, even a passive one, or a get would restart its expiry).
pub async fn queue_exists(queue: &str) -> bool {
    let queue = queue.to_string();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("rabbitmqctl")
            .args(["list_queues", "-q", "--no-table-headers", "name"])
            .output()
            .expect("rabbitmqctl runs");
        assert!(out.status.success(), "rabbitmqctl list_queues failed");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.trim() == queue)
    })
    .await
    .expect("rabbitmqctl task")
}

/// How many consumers queue `queue` has (`None`: there is no such queue), as RabbitMQ says.
pub async fn queue_consumers(queue: &str) -> Option<u32> {
    let queue = queue.to_string();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("rabbitmqctl")
            .args([
                "list_queues",
                "-q",
                "--no-table-headers",
                "name",
                "consumers",
            ])
            .output()
            .expect("rabbitmqctl runs");
        assert!(out.status.success(), "rabbitmqctl list_queues failed");
        String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
            let mut cols = l.split_whitespace();
            (cols.next()? == queue).then(|| cols.next()?.parse().ok())?
        })
    })
    .await
    .expect("rabbitmqctl task")
}

/// Takes every message waiting in a queue (a get: it restarts the queue's expiry).
pub async fn take_all(conn: &lapin::Connection, queue: &str) -> Vec<Vec<u8>> {
    let ch = conn.create_channel().await.expect("channel");
    let mut out = Vec::new();
    while let Ok(Some(m)) = ch
        .basic_get(
            queue.into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
    {
        out.push(m.delivery.data);
    }
    out
}

/// A TCP proxy in front of a service that can be told to stop forwarding bytes while keeping
/// every connection open: a network partition, or a server that stalls, as its clients see it.
pub struct StallProxy {
    /// Where clients connect.
    pub addr: std::net::SocketAddr,
    stalled: Arc<std::sync::atomic::AtomicBool>,
    /// Chunks read from one side and not yet written to the other.
    in_transit: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl StallProxy {
    /// A proxy to `target` (`host:port`).
    pub async fn start(target: &str) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stalled = Arc::new(AtomicBool::new(false));
        let in_transit = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let target = target.to_string();
        let flag = stalled.clone();
        let moving = in_transit.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                for (mut from, mut to) in [
                    (
                        Box::new(cr) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                        Box::new(sw) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
                    ),
                    (Box::new(sr), Box::new(cw)),
                ] {
                    let (flag, moving) = (flag.clone(), moving.clone());
                    tokio::spawn(async move {
                        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match from.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            moving.fetch_add(1, Ordering::SeqCst);
                            while flag.load(Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                            let written = to.write_all(&buf[..n]).await;
                            moving.fetch_sub(1, Ordering::SeqCst);
                            if written.is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        Self {
            addr,
            stalled,
            in_transit,
            task,
        }
    }

    /// Forwards again, and returns once every byte held by the stall has been passed on (in
    /// order, to the side it was going to).
    pub async fn resume(&self) {
        use std::sync::atomic::Ordering;
        self.stall(false);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.in_transit.load(Ordering::SeqCst) > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the proxy still holds bytes"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops (or resumes) forwarding bytes in both directions.
    pub fn stall(&self, on: bool) {
        self.stalled.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A session's `prompt_cache_key`, as the README documents it: `aptix-` and the first 32 hex
/// digits of the SHA-256 of the session id within its tenant (`<tenant>/<id>`; the id alone
/// for the local tenant), computed here, not by the product's code.
pub fn prompt_cache_key(session: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(session.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("aptix-{}", &hex[..32])
}

/// Tenant A's session `id` as the store and the broker name it: the test apps give `tok-a` to
/// `tenant-a`, and a session id names a session within its tenant.
pub fn sid_a(id: &str) -> aptix_worker::contract::SessionId {
    aptix_worker::contract::SessionId::parse(id)
        .unwrap()
        .within("tenant-a")
}

/// Submitting a request body as the local tenant's, the way `aptix run` and `aptix turns`
/// do: parsed against the front door's limits, then the one way in.
pub trait SubmitLocal {
    async fn submit_local(
        &self,
        body: &[u8],
    ) -> Result<aptix_worker::store::TurnStatusView, aptix_worker::frontdoor::SubmitError>;
}

impl SubmitLocal for aptix_worker::frontdoor::FrontDoor {
    async fn submit_local(
        &self,
        body: &[u8],
    ) -> Result<aptix_worker::store::TurnStatusView, aptix_worker::frontdoor::SubmitError> {
        let request = self.parse(body)?;
        let trace = aptix_worker::trace::TraceContext::new_root();
        let pickup = aptix_worker::frontdoor::Pickup::later(None);
        self.submit(aptix_worker::config::LOCAL_TENANT, &request, &trace, pickup)
            .await
    }
}

/// The value of one series (`name{labels}`, exactly as `/metrics` writes it) in a Prometheus
/// text; `None` when the series is not there (yet).
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The value of one series in a Prometheus text (a panic showing the text when it is absent).
pub fn metric(text: &str, series: &str) -> f64 {
    metric_value(text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"))
}
