//! Configuration from `APTIX_*` environment variables (DESIGN.md §4).
//!
//! Every variable is read in one place, parsed into a typed value, and a bad value fails start-up
//! with a message that names the variable. Secrets are wrapped so they never print.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::contract::RequestLimits;
pub use crate::secret::Secret;

/// What one turn in flight may cost a worker, for sizing the default concurrency: measured
/// ~52–57 KiB at 10,000 in flight (`aptix bench --in-flight`), rounded up.
pub const MEMORY_PER_TURN: u64 = 64 << 10;
/// The default concurrency never goes below this or above [`MAX_DEFAULT_CONCURRENCY`].
pub const MIN_DEFAULT_CONCURRENCY: usize = 64;
/// See [`MIN_DEFAULT_CONCURRENCY`].
pub const MAX_DEFAULT_CONCURRENCY: usize = 8192;

/// Turns one worker runs at once unless `APTIX_CONCURRENCY` says otherwise, for a process that
/// may use `memory` bytes: a turn spends nearly all its time waiting on the model, so a worker
/// is bound by how many turns it holds, not by CPU. A quarter of the memory at
/// [`MEMORY_PER_TURN`] each, between 64 and 8,192 (8,192 keep a 2 s model busy at ~4,000
/// turns/s, more than a worker core runs); the model servers are protected by each agent
/// context's own limits, not by this number.
pub fn concurrency_for_memory(memory: u64) -> usize {
    let fits = memory / 4 / MEMORY_PER_TURN;
    usize::try_from(fits)
        .unwrap_or(usize::MAX)
        .clamp(MIN_DEFAULT_CONCURRENCY, MAX_DEFAULT_CONCURRENCY)
}

/// The memory this process may use: its cgroup's limit (a container's), else the machine's.
pub fn memory_limit() -> Option<u64> {
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|path| std::fs::read_to_string(path).ok())
    .filter_map(|text| text.trim().parse::<u64>().ok())
    // cgroup v1 says "no limit" with a number near u64::MAX.
    .find(|limit| *limit < 1 << 50);
    cgroup.or_else(|| {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib * 1024)
    })
}

/// The default concurrency on this machine or in this container ([`concurrency_for_memory`];
/// 1,024 where the memory cannot be read).
pub fn default_concurrency() -> usize {
    memory_limit().map_or(1024, concurrency_for_memory)
}

/// A configuration variable that could not be used.
#[derive(Debug, thiserror::Error)]
#[error("configuration variable {var}: {problem}")]
pub struct ConfigError {
    /// The variable's name.
    pub var: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

/// An error and its causes on one line (`outer: inner: …`), for messages that are text. A
/// cause whose text the line already ends with is not repeated: some clients' errors (lapin's,
/// redis-rs's) write their cause into their own message and also give it as their source.
/// (Ours do one or the other, never both: `tests/it/errors.rs`.)
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.ends_with(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
}

pub use crate::contract::ids::LOCAL_TENANT;

/// The whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `APTIX_NAMESPACE`: prefix of every queue, exchange and Redis key.
    pub namespace: String,
    /// `APTIX_AMQP_URL`: RabbitMQ; `None` = embedded in-memory queue.
    pub amqp_url: Option<Secret>,
    /// `APTIX_REDIS_URL`: Redis; `None` = embedded in-memory store.
    pub redis_url: Option<Secret>,
    /// `APTIX_REDIS_CLUSTER`: `APTIX_REDIS_URL` names nodes of a Redis Cluster
    /// (comma-separated).
    pub redis_cluster: bool,
    /// `APTIX_REDIS_MIN_REPLICAS`: replicas that must hold a settled turn (and a new fencing
    /// token) before its status is published and its job acknowledged (`WAIT`); 0: off.
    pub redis_min_replicas: u32,
    /// `APTIX_REDIS_REPLICA_TIMEOUT_MS`: how long to wait for them.
    pub redis_replica_timeout: Duration,
    /// `APTIX_LLM_BASE_URL`: Responses API base; `None` = the embedded fake model.
    pub llm_base_url: Option<String>,
    /// `OPENAI_API_KEY`: the model server's key.
    pub api_key: Option<Secret>,
    /// `APTIX_MODEL`: the model name sent on every call.
    pub model: String,
    /// `APTIX_LLM_TIMEOUT_SECS`: how long one model call may take.
    pub llm_timeout: Duration,
    /// `APTIX_LLM_CONNECT_TIMEOUT_SECS`: how long connecting to the model server may take.
    pub llm_connect_timeout: Duration,
    /// `APTIX_LLM_MAX_RETRIES`: retries of one model call after the first attempt.
    pub llm_max_retries: usize,
    /// `APTIX_MAX_ITERATIONS`: model calls one turn may make.
    pub max_iterations: usize,
    /// `APTIX_CONCURRENCY`: turns one worker runs at once ([`default_concurrency`]).
    pub concurrency: usize,
    /// `APTIX_CONTEXTS_FILE`: agent and conversation contexts (read and checked at start-up;
    /// the built-in `default`s are added where the file has none).
    pub contexts: crate::contexts::Contexts,
    /// `APTIX_TENANTS_FILE`: tenants' `maxRunningTurns` and `tokensPerDay` (read and checked
    /// at start-up; every process of a deployment must read the same file).
    pub tenants: crate::tenants::Tenants,
    /// `APTIX_RATE_WINDOW_MS`: the window `requestsPerMinute` counts in (a minute; shorter
    /// only for tests and demos).
    pub rate_window: Duration,
    /// `APTIX_CAPACITY_WAIT_MS`: how long a model call waits for its context's capacity
    /// before the turn goes back to the queue.
    pub capacity_wait: Duration,
    /// `APTIX_CALL_SLOT_TTL_MS`: how long a concurrency slot outlives a worker that died
    /// holding it (a live holder renews it).
    pub call_slot_ttl: Duration,
    /// `APTIX_MODES_FILE`: a mode catalog replacing the built-in one.
    pub modes_file: Option<String>,
    /// `APTIX_LEASE_SECS`: how long a session lease lasts without renewal.
    pub lease: Duration,
    /// `APTIX_RESULT_TTL_SECS` / `APTIX_SESSION_TTL_SECS`: how long turn records and idle
    /// sessions are kept.
    pub retention: crate::store::Retention,
    /// `APTIX_MAX_ATTEMPTS`: runs of a job before it is dead-lettered.
    pub max_attempts: u32,
    /// `APTIX_TURN_DEADLINE_SECS`: the longest one run of a turn may take.
    pub turn_deadline: Duration,
    /// `APTIX_SHUTDOWN_GRACE_SECS`: how long shutdown waits for in-flight turns.
    pub shutdown_grace: Duration,
    /// `APTIX_LANE_WAIT_MS`: how long a worker holds a capped tenant's job waiting for one of
    /// the tenant's running slots before giving it back to the lane.
    pub lane_wait: Duration,
    /// `APTIX_REPLY_QUEUE_TTL_SECS`: how long an unused reply queue lives.
    pub reply_queue_ttl: Duration,
    /// `APTIX_REPLY_QUEUE_MAX_LENGTH`: the most statuses a reply queue holds (the oldest are
    /// dropped beyond it).
    pub reply_queue_max_length: u32,
    /// `APTIX_REPLY_QUEUES`: `async-turns` (default), `every-session` or `on-subscribe`.
    pub reply_queues: crate::queue::ReplyQueues,
    /// `APTIX_RETRY_DELAYS_MS`: the wait before each retry of a failed job, in order (the
    /// last one repeats); one delay queue each.
    pub retry_delays: Vec<Duration>,
    /// `APTIX_TLS_CA_FILE`: a PEM bundle trusted in addition to the system's roots for
    /// RabbitMQ (`amqps://`), Redis (`rediss://`) and the model endpoint.
    pub tls_ca: Option<crate::tls::ExtraCa>,
    /// `APTIX_DEPENDENCY_TIMEOUT_MS`: the longest one Redis command or RabbitMQ operation
    /// (connect, declare, publish and its confirm) may take before it counts as failed.
    pub dependency_timeout: Duration,
    /// `APTIX_HTTP_READ_TIMEOUT_SECS` (fractions allowed): how long the API waits for a
    /// client's next bytes — a request's headers, the rest of its body, the next request on
    /// an idle keep-alive connection — before it closes the connection.
    pub http_read_timeout: Duration,
    /// `APTIX_API_TOKENS`: bearer token → tenant (`token=tenant,token=tenant`); an entry
    /// `token=tenant:admin` is an admin token of that tenant.
    pub api_tokens: ApiTokens,
    /// `APTIX_LLM_REPLAY`: send the stored conversation instead of `previous_response_id`
    /// (for model servers that do not store responses).
    pub llm_replay: bool,
    /// `APTIX_LLM_STREAMING`: call the model with `stream: true` for turns that ask for
    /// streaming (default on; off for servers without streaming).
    pub llm_streaming: bool,
    /// How the built-in `default` agent context's calls are made: `APTIX_LLM_BACKGROUND`
    /// (background mode, default off), `APTIX_LLM_SERVICE_TIER` (`auto`, `default`, `flex`,
    /// `priority`; default none sent), `APTIX_LLM_FLEX_FALLBACK_SECS` (seconds, or `never`;
    /// default 60), `APTIX_LLM_PRICES` (dollars per million input, cached input and output
    /// tokens: `2.00,0.50,8.00`; default none, no cost estimated). The contexts file sets
    /// these per context.
    pub llm_calls: crate::contexts::CallSettings,
    /// `APTIX_CONSOLE`: the front door serves the console at `/console` (default off; on in
    /// `aptix run`).
    pub console: bool,
    /// `APTIX_MAX_BODY_BYTES` and friends: request size limits.
    pub limits: RequestLimits,
    /// `APTIX_MAX_BATCH_BYTES` / `APTIX_MAX_BATCH_LINES`: the largest batch submission.
    pub batch_limits: BatchLimits,
    /// `APTIX_RAG_MAX_CHUNKS` / `APTIX_RAG_MAX_CHARS`: how much retrieved context a turn gets.
    pub rag_budget: crate::rag::RagBudget,
    /// `APTIX_RAG_CHUNK_LINES`: the most lines in one indexed chunk.
    pub chunk_lines: usize,
    /// `APTIX_WEBHOOK_*`: where webhooks may point and how they are sent.
    pub webhooks: WebhookConfig,
}

/// Webhook settings (see [`crate::webhooks`]).
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// `APTIX_WEBHOOK_ALLOW_HTTP`: `http` URLs are accepted too (tests, internal receivers).
    pub allow_http: bool,
    /// `APTIX_WEBHOOK_ALLOW`: hosts and address ranges allowed although not public.
    pub allow: crate::webhooks::guard::Allowed,
    /// `APTIX_WEBHOOK_TIMEOUT_SECS`, `APTIX_WEBHOOK_CONCURRENCY`,
    /// `APTIX_WEBHOOK_RETRY_DELAYS_SECS`, `APTIX_WEBHOOK_GIVE_UP_SECS`.
    pub send: crate::webhooks::send::SendSettings,
    /// The signing secrets that are set, by variable: `APTIX_WEBHOOK_SECRET` and every
    /// variable the tenants file names (read once, at start-up).
    pub secrets: Arc<crate::webhooks::sign::Secrets>,
}

impl WebhookConfig {
    /// The URL policy of these settings.
    pub fn guard(&self) -> crate::webhooks::guard::Guard {
        crate::webhooks::guard::Guard::new(self.allow_http, self.allow.clone())
    }
}

/// The webhook signing secrets that are set: `APTIX_WEBHOOK_SECRET` and the variables the
/// tenants file names; one that is set but not a `whsec_` secret is an error naming it.
fn webhook_secrets(
    get: &impl Fn(&str) -> Option<String>,
    tenants: &crate::tenants::Tenants,
) -> Result<crate::webhooks::sign::Secrets, ConfigError> {
    let mut names = vec![crate::webhooks::DEFAULT_SECRET_ENV.to_string()];
    names.extend(tenants.secret_envs().map(str::to_string));
    let mut secrets = crate::webhooks::sign::Secrets::default();
    for name in names {
        if let Some(value) = get(&name) {
            let key =
                crate::webhooks::sign::SigningKey::parse(&value).map_err(|e| ConfigError {
                    var: crate::webhooks::DEFAULT_SECRET_ENV,
                    problem: format!("{name}: {e}"),
                })?;
            secrets.insert(name, key);
        }
    }
    Ok(secrets)
}

fn webhooks(get: &impl Fn(&str) -> Option<String>) -> Result<WebhookConfig, ConfigError> {
    let defaults = crate::webhooks::send::SendSettings::default();
    let delays = match get("APTIX_WEBHOOK_RETRY_DELAYS_SECS") {
        None => defaults.delays.clone(),
        Some(text) => {
            let delays = text
                .split(',')
                .map(|part| match part.trim().parse::<u64>() {
                    Ok(s) if s > 0 => Ok(Duration::from_secs(s)),
                    _ => Err(ConfigError {
                        var: "APTIX_WEBHOOK_RETRY_DELAYS_SECS",
                        problem: format!("{part:?} is not a positive number of seconds"),
                    }),
                })
                .collect::<Result<Vec<_>, _>>()?;
            if delays.len() > 20 {
                return Err(ConfigError {
                    var: "APTIX_WEBHOOK_RETRY_DELAYS_SECS",
                    problem: "at most 20 delays (each is a queue)".to_string(),
                });
            }
            delays
        }
    };
    Ok(WebhookConfig {
        allow_http: flag(get, "APTIX_WEBHOOK_ALLOW_HTTP")?,
        allow: match get("APTIX_WEBHOOK_ALLOW") {
            None => Default::default(),
            Some(v) => v.parse().map_err(|problem| ConfigError {
                var: "APTIX_WEBHOOK_ALLOW",
                problem,
            })?,
        },
        secrets: Arc::default(),
        send: crate::webhooks::send::SendSettings {
            timeout: Duration::from_secs(positive(get, "APTIX_WEBHOOK_TIMEOUT_SECS", 10)?),
            concurrency: positive(get, "APTIX_WEBHOOK_CONCURRENCY", 32u16)?,
            delays,
            give_up_after: Duration::from_secs(positive(
                get,
                "APTIX_WEBHOOK_GIVE_UP_SECS",
                24 * 3600,
            )?),
        },
    })
}

/// Limits of one batch submission (each line is also held to [`RequestLimits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// The largest NDJSON body, in bytes.
    pub max_bytes: usize,
    /// The most lines.
    pub max_lines: usize,
}

impl Default for BatchLimits {
    fn default() -> Self {
        Self {
            max_bytes: 64 * 1024 * 1024,
            max_lines: 10_000,
        }
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads configuration through `lookup` (tests pass a map instead of the environment).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |k: &str| {
            lookup(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let defaults = RequestLimits::default();
        let namespace = get("APTIX_NAMESPACE").unwrap_or_else(|| "aptix".to_string());
        if let Err(e) = crate::contract::ids::check_id(&namespace) {
            return Err(ConfigError {
                var: "APTIX_NAMESPACE",
                problem: e.to_string(),
            });
        }
        let mut config = Self {
            namespace,
            amqp_url: get("APTIX_AMQP_URL").map(Secret::new),
            redis_url: get("APTIX_REDIS_URL").map(Secret::new),
            redis_cluster: flag(&get, "APTIX_REDIS_CLUSTER")?,
            redis_min_replicas: match get("APTIX_REDIS_MIN_REPLICAS") {
                None => 0,
                Some(v) => v.trim().parse().map_err(|_| ConfigError {
                    var: "APTIX_REDIS_MIN_REPLICAS",
                    problem: format!("{v:?} is not a number of replicas (0 turns it off)"),
                })?,
            },
            redis_replica_timeout: Duration::from_millis(positive(
                &get,
                "APTIX_REDIS_REPLICA_TIMEOUT_MS",
                crate::store::redis::DEFAULT_REPLICA_TIMEOUT.as_millis() as u64,
            )?),
            llm_base_url: get("APTIX_LLM_BASE_URL").map(|u| u.trim_end_matches('/').to_string()),
            api_key: get("OPENAI_API_KEY").map(Secret::new),
            model: get("APTIX_MODEL").unwrap_or_else(|| "gpt-4o-mini".to_string()),
            llm_timeout: Duration::from_secs(number(&get, "APTIX_LLM_TIMEOUT_SECS", 120)?),
            llm_connect_timeout: Duration::from_secs(number(
                &get,
                "APTIX_LLM_CONNECT_TIMEOUT_SECS",
                10,
            )?),
            llm_max_retries: number(&get, "APTIX_LLM_MAX_RETRIES", 2)?,
            max_iterations: positive(&get, "APTIX_MAX_ITERATIONS", 8)?,
            concurrency: match get("APTIX_CONCURRENCY") {
                None => default_concurrency(),
                Some(_) => positive(&get, "APTIX_CONCURRENCY", 1)?,
            },
            modes_file: get("APTIX_MODES_FILE"),
            contexts: match get("APTIX_CONTEXTS_FILE") {
                None => crate::contexts::Contexts::empty(),
                Some(path) => {
                    crate::contexts::Contexts::load(Path::new(&path), &lookup).map_err(|e| {
                        ConfigError {
                            var: "APTIX_CONTEXTS_FILE",
                            problem: with_causes(&e),
                        }
                    })?
                }
            },
            tenants: match get("APTIX_TENANTS_FILE") {
                None => crate::tenants::Tenants::default(),
                Some(path) => {
                    crate::tenants::Tenants::load(Path::new(&path)).map_err(|e| ConfigError {
                        var: "APTIX_TENANTS_FILE",
                        problem: with_causes(&e),
                    })?
                }
            },
            rate_window: Duration::from_millis(positive(&get, "APTIX_RATE_WINDOW_MS", 60_000)?),
            capacity_wait: Duration::from_millis(number(&get, "APTIX_CAPACITY_WAIT_MS", 30_000)?),
            call_slot_ttl: Duration::from_millis(positive(&get, "APTIX_CALL_SLOT_TTL_MS", 30_000)?),
            tls_ca: match get("APTIX_TLS_CA_FILE").filter(|p| !p.trim().is_empty()) {
                None => None,
                Some(path) => Some(
                    crate::tls::ExtraCa::load(std::path::Path::new(path.trim())).map_err(|e| {
                        ConfigError {
                            var: "APTIX_TLS_CA_FILE",
                            problem: with_causes(&e),
                        }
                    })?,
                ),
            },
            lease: Duration::from_secs(positive(&get, "APTIX_LEASE_SECS", 30)?),
            llm_replay: flag(&get, "APTIX_LLM_REPLAY")?,
            llm_streaming: get("APTIX_LLM_STREAMING").is_none()
                || flag(&get, "APTIX_LLM_STREAMING")?,
            llm_calls: llm_calls(&get)?,
            console: flag(&get, "APTIX_CONSOLE")?,
            api_tokens: tokens(&get)?,
            http_read_timeout: Duration::from_secs_f64(positive(
                &get,
                "APTIX_HTTP_READ_TIMEOUT_SECS",
                crate::net::READ_TIMEOUT.as_secs_f64(),
            )?),
            max_attempts: positive(&get, "APTIX_MAX_ATTEMPTS", 5)?,
            turn_deadline: Duration::from_secs(positive(&get, "APTIX_TURN_DEADLINE_SECS", 600)?),
            shutdown_grace: Duration::from_secs(number(&get, "APTIX_SHUTDOWN_GRACE_SECS", 30)?),
            lane_wait: Duration::from_millis(positive(&get, "APTIX_LANE_WAIT_MS", 60_000)?),
            dependency_timeout: Duration::from_millis(positive(
                &get,
                "APTIX_DEPENDENCY_TIMEOUT_MS",
                3000,
            )?),
            reply_queue_ttl: Duration::from_secs(positive(
                &get,
                "APTIX_REPLY_QUEUE_TTL_SECS",
                3600,
            )?),
            reply_queue_max_length: positive(&get, "APTIX_REPLY_QUEUE_MAX_LENGTH", 1000u32)?,
            reply_queues: match get("APTIX_REPLY_QUEUES") {
                None => crate::queue::ReplyQueues::AsyncTurns,
                Some(v) => v.trim().parse().map_err(|why: String| ConfigError {
                    var: "APTIX_REPLY_QUEUES",
                    problem: why,
                })?,
            },
            retry_delays: retry_delays(&get)?,
            webhooks: webhooks(&get)?,
            retention: crate::store::Retention {
                turns: Duration::from_secs(positive(&get, "APTIX_RESULT_TTL_SECS", 7 * 24 * 3600)?),
                sessions: Duration::from_secs(positive(
                    &get,
                    "APTIX_SESSION_TTL_SECS",
                    30 * 24 * 3600,
                )?),
            },
            limits: RequestLimits {
                max_body_bytes: positive(&get, "APTIX_MAX_BODY_BYTES", defaults.max_body_bytes)?,
                max_instruction_bytes: positive(
                    &get,
                    "APTIX_MAX_INSTRUCTION_BYTES",
                    defaults.max_instruction_bytes,
                )?,
                max_artifact_bytes: positive(
                    &get,
                    "APTIX_MAX_ARTIFACT_BYTES",
                    defaults.max_artifact_bytes,
                )?,
                max_image_bytes: positive(&get, "APTIX_MAX_IMAGE_BYTES", defaults.max_image_bytes)?,
            },
            rag_budget: crate::rag::RagBudget {
                max_chunks: number(
                    &get,
                    "APTIX_RAG_MAX_CHUNKS",
                    crate::rag::RagBudget::default().max_chunks,
                )?,
                max_chars: number(
                    &get,
                    "APTIX_RAG_MAX_CHARS",
                    crate::rag::RagBudget::default().max_chars,
                )?,
            },
            chunk_lines: positive(
                &get,
                "APTIX_RAG_CHUNK_LINES",
                crate::rag::ChunkOptions::default().max_lines,
            )?,
            batch_limits: BatchLimits {
                max_bytes: positive(
                    &get,
                    "APTIX_MAX_BATCH_BYTES",
                    BatchLimits::default().max_bytes,
                )?,
                max_lines: positive(
                    &get,
                    "APTIX_MAX_BATCH_LINES",
                    BatchLimits::default().max_lines,
                )?,
            },
        };
        config.webhooks.secrets = Arc::new(webhook_secrets(&get, &config.tenants)?);
        Ok(config)
    }
}

/// Bearer tokens and whom they stand for; debug output shows tenants only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ApiTokens(std::collections::HashMap<String, Caller>);

/// Whom a bearer token stands for: a tenant, and whether it is an admin token (written
/// `token=tenant:admin`), which may also read every tenant's sessions, turns and batches and
/// the system's state (the console's system pages, `/v1/admin/…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The tenant whose turns the token submits.
    pub tenant: String,
    /// May read every tenant's work and the system's.
    pub admin: bool,
}

/// The mark after a tenant that makes its token an admin token.
const ADMIN_MARK: &str = ":admin";

impl ApiTokens {
    /// Tokens from `(token, tenant)` pairs (none of them admin).
    pub fn new(pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        Self(
            pairs
                .into_iter()
                .map(|(token, tenant)| {
                    (
                        token,
                        Caller {
                            tenant,
                            admin: false,
                        },
                    )
                })
                .collect(),
        )
    }
    /// These tokens and `token`, an admin token of `tenant`.
    pub fn with_admin(mut self, token: impl Into<String>, tenant: impl Into<String>) -> Self {
        self.0.insert(
            token.into(),
            Caller {
                tenant: tenant.into(),
                admin: true,
            },
        );
        self
    }
    /// The tenant a token stands for.
    pub fn tenant(&self, token: &str) -> Option<&str> {
        self.0.get(token).map(|c| c.tenant.as_str())
    }
    /// Whom a token stands for.
    pub fn caller(&self, token: &str) -> Option<&Caller> {
        self.0.get(token)
    }
    /// Whether no tokens are configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The tenants the tokens stand for, sorted, each once.
    pub fn tenants(&self) -> Vec<&str> {
        let set: std::collections::BTreeSet<&str> =
            self.0.values().map(|c| c.tenant.as_str()).collect();
        set.into_iter().collect()
    }
}

impl std::fmt::Debug for ApiTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut tenants: Vec<&String> = self.0.values().map(|c| &c.tenant).collect();
        tenants.sort();
        write!(f, "ApiTokens(tenants: {tenants:?})")
    }
}

fn tokens(get: &impl Fn(&str) -> Option<String>) -> Result<ApiTokens, ConfigError> {
    let mut out = std::collections::HashMap::new();
    for pair in get("APTIX_API_TOKENS").unwrap_or_default().split(',') {
        let pair = pair.trim();
        if pair.is_empty() {
            continue;
        }
        match pair.split_once('=') {
            Some((token, tenant)) if !token.trim().is_empty() && !tenant.trim().is_empty() => {
                let tenant = tenant.trim();
                let (tenant, admin) = match tenant.strip_suffix(ADMIN_MARK) {
                    Some(t) => (t.trim(), true),
                    None => (tenant, false),
                };
                if tenant.is_empty() {
                    return Err(ConfigError {
                        var: "APTIX_API_TOKENS",
                        problem: "an admin entry must name its tenant: token=tenant:admin".into(),
                    });
                }
                // A tenant's name scopes its session ids in keys and queue names.
                if let Err(e) = crate::contract::ids::check_tenant(tenant) {
                    return Err(ConfigError {
                        var: "APTIX_API_TOKENS",
                        problem: format!("tenant {tenant:?}: {e}"),
                    });
                }
                let caller = Caller {
                    tenant: tenant.to_string(),
                    admin,
                };
                out.insert(token.trim().to_string(), caller);
            }
            // The entry is not echoed: it holds a secret.
            _ => {
                return Err(ConfigError {
                    var: "APTIX_API_TOKENS",
                    problem: "every entry must be token=tenant".into(),
                });
            }
        }
    }
    Ok(ApiTokens(out))
}

/// The default agent context's call settings (see [`Config::llm_calls`]).
fn llm_calls(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<crate::contexts::CallSettings, ConfigError> {
    use crate::contexts::ServiceTier;
    let service_tier = match get("APTIX_LLM_SERVICE_TIER").filter(|v| !v.trim().is_empty()) {
        None => None,
        Some(t) => Some(ServiceTier::parse(t.trim()).ok_or_else(|| ConfigError {
            var: "APTIX_LLM_SERVICE_TIER",
            problem: format!("{t:?} is not auto, default, flex or priority"),
        })?),
    };
    let flex_fallback = match get("APTIX_LLM_FLEX_FALLBACK_SECS")
        .as_deref()
        .map(str::trim)
    {
        None | Some("") => Some(crate::contexts::FLEX_FALLBACK_AFTER),
        Some("never") => None,
        Some(v) => Some(Duration::from_secs(v.parse().map_err(|_| ConfigError {
            var: "APTIX_LLM_FLEX_FALLBACK_SECS",
            problem: format!("{v:?} is not a number of seconds or \"never\""),
        })?)),
    };
    let prices = match get("APTIX_LLM_PRICES").filter(|v| !v.trim().is_empty()) {
        None => None,
        Some(v) => {
            Some(
                crate::contexts::Prices::parse_list(&v).map_err(|problem| ConfigError {
                    var: "APTIX_LLM_PRICES",
                    problem,
                })?,
            )
        }
    };
    Ok(crate::contexts::CallSettings {
        background: flag(get, "APTIX_LLM_BACKGROUND")?,
        service_tier,
        flex_fallback,
        prices,
    })
}

fn flag(get: &impl Fn(&str) -> Option<String>, var: &'static str) -> Result<bool, ConfigError> {
    match get(var).as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("0" | "false" | "no" | "off") => Ok(false),
        Some("1" | "true" | "yes" | "on") => Ok(true),
        Some(other) => Err(ConfigError {
            var,
            problem: format!("{other:?} is not a boolean (use true or false)"),
        }),
    }
}

impl Config {
    /// The queue names and delays of this configuration.
    pub fn topology(&self) -> crate::queue::Topology {
        let mut topology = crate::queue::Topology::new(&self.namespace);
        topology.reply_queue_ttl = self.reply_queue_ttl;
        topology.reply_queue_max_length = self.reply_queue_max_length;
        topology.reply_queues = self.reply_queues;
        topology.retry_delays = self.retry_delays.clone();
        topology.hook_delays = self.webhooks.send.delays.clone();
        topology.with_lanes(self.tenants.capped().map(|(id, _)| id))
    }

    /// The model server to use: `APTIX_LLM_BASE_URL`, else OpenAI when `OPENAI_API_KEY` is
    /// set, else `None` (the caller starts the embedded fake model).
    pub fn model_base_url(&self) -> Option<String> {
        self.llm_base_url.clone().or_else(|| {
            self.api_key
                .as_ref()
                .map(|_| "https://api.openai.com/v1".to_string())
        })
    }
}

/// `APTIX_RETRY_DELAYS_MS`: comma-separated milliseconds, each above zero, at most 20.
fn retry_delays(get: &impl Fn(&str) -> Option<String>) -> Result<Vec<Duration>, ConfigError> {
    const VAR: &str = "APTIX_RETRY_DELAYS_MS";
    let Some(text) = get(VAR).filter(|v| !v.trim().is_empty()) else {
        return Ok(crate::queue::Topology::new("").retry_delays);
    };
    let delays = text
        .split(',')
        .map(|part| match part.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
            _ => Err(ConfigError {
                var: VAR,
                problem: format!("{part:?} is not a positive number of milliseconds"),
            }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if delays.len() > 20 {
        return Err(ConfigError {
            var: VAR,
            problem: "at most 20 delays (each is a queue)".to_string(),
        });
    }
    Ok(delays)
}

fn number<T: std::str::FromStr>(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    default: T,
) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    match get(var) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|e| ConfigError {
            var,
            problem: format!("{v:?} is not a valid number ({e})"),
        }),
    }
}

fn positive<T>(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    default: T,
) -> Result<T, ConfigError>
where
    T: std::str::FromStr + PartialOrd + Default,
    T::Err: std::fmt::Display,
{
    let n = number(get, var, default)?;
    if n <= T::default() {
        return Err(ConfigError {
            var,
            problem: "must be greater than zero".to_string(),
        });
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    /// The line an operator reads names each cause once, however many layers repeat it.
    #[test]
    fn causes_already_in_the_message_are_not_repeated() {
        #[derive(Debug, thiserror::Error)]
        #[error("broker unavailable: {0}")]
        struct Repeats(#[source] std::io::Error);
        #[derive(Debug, thiserror::Error)]
        #[error("cannot set up RabbitMQ")]
        struct Names(#[source] Box<dyn std::error::Error>);
        let refused = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(
            with_causes(&Names(Box::new(Repeats(refused())))),
            "cannot set up RabbitMQ: broker unavailable: refused"
        );
        // A cause that adds something is kept.
        #[derive(Debug, thiserror::Error)]
        #[error("broker unavailable")]
        struct Hides(#[source] std::io::Error);
        assert_eq!(
            with_causes(&Names(Box::new(Hides(refused())))),
            "cannot set up RabbitMQ: broker unavailable: refused"
        );
    }

    #[test]
    fn defaults_need_no_environment() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.namespace, "aptix");
        assert!(c.amqp_url.is_none() && c.redis_url.is_none() && c.llm_base_url.is_none());
        assert_eq!(c.limits, RequestLimits::default());
        assert_eq!(c.concurrency, default_concurrency());
        assert!((MIN_DEFAULT_CONCURRENCY..=MAX_DEFAULT_CONCURRENCY).contains(&c.concurrency));
        assert_eq!(c.reply_queues, crate::queue::ReplyQueues::AsyncTurns);
        assert_eq!(
            c.topology().reply_queues,
            crate::queue::ReplyQueues::AsyncTurns
        );
    }

    #[test]
    fn the_default_concurrency_is_a_quarter_of_the_memory_within_bounds() {
        const MIB: u64 = 1 << 20;
        // 256 MiB: 64 MiB for turns at 64 KiB each.
        assert_eq!(concurrency_for_memory(256 * MIB), 1024);
        assert_eq!(concurrency_for_memory(1024 * MIB), 4096);
        assert_eq!(
            concurrency_for_memory(64 * 1024 * MIB),
            MAX_DEFAULT_CONCURRENCY
        );
        assert_eq!(concurrency_for_memory(8 * MIB), MIN_DEFAULT_CONCURRENCY);
        assert!(
            memory_limit().is_some_and(|m| m > 0),
            "this machine's memory is readable"
        );
        let c = cfg(&[("APTIX_CONCURRENCY", "7")]).unwrap();
        assert_eq!(c.concurrency, 7, "the setting wins");
    }

    #[test]
    fn reply_queue_settings_parse_and_say_which_statuses_declare_a_queue() {
        use crate::queue::ReplyQueues::{AsyncTurns, EverySession, OnSubscribe};
        for (text, mode, for_wanted, for_unwanted) in [
            ("every-session", EverySession, true, true),
            ("async-turns", AsyncTurns, true, false),
            ("on-subscribe", OnSubscribe, false, false),
        ] {
            let c = cfg(&[("APTIX_REPLY_QUEUES", text)]).unwrap();
            assert_eq!(c.reply_queues, mode);
            assert_eq!(mode.as_str(), text);
            assert_eq!(
                (mode.declared_for(true), mode.declared_for(false)),
                (for_wanted, for_unwanted),
                "{text}"
            );
        }
        let e = cfg(&[("APTIX_REPLY_QUEUES", "sometimes")]).unwrap_err();
        assert_eq!(e.var, "APTIX_REPLY_QUEUES");
        assert!(e.problem.contains("async-turns"), "{}", e.problem);
    }

    #[test]
    fn retry_delays_are_milliseconds_in_order() {
        let c = cfg(&[("APTIX_RETRY_DELAYS_MS", "200, 400,1000")]).unwrap();
        assert_eq!(
            c.topology().retry_delays,
            [200, 400, 1000].map(Duration::from_millis).to_vec()
        );
        assert_eq!(
            cfg(&[]).unwrap().retry_delays,
            crate::queue::Topology::new("x").retry_delays
        );
        for bad in ["0", "soon", "100,,200"] {
            let e = cfg(&[("APTIX_RETRY_DELAYS_MS", bad)]).unwrap_err();
            assert_eq!(e.var, "APTIX_RETRY_DELAYS_MS", "{bad}");
        }
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = cfg(&[("APTIX_MAX_BODY_BYTES", "lots")]).unwrap_err();
        assert_eq!(e.var, "APTIX_MAX_BODY_BYTES");
        let e = cfg(&[("APTIX_CONCURRENCY", "0")]).unwrap_err();
        assert_eq!(e.var, "APTIX_CONCURRENCY");
        let e = cfg(&[("APTIX_NAMESPACE", "a b")]).unwrap_err();
        assert_eq!(e.var, "APTIX_NAMESPACE");
        let e = cfg(&[("APTIX_REDIS_MIN_REPLICAS", "one")]).unwrap_err();
        assert_eq!(e.var, "APTIX_REDIS_MIN_REPLICAS");
        let e = cfg(&[("APTIX_REDIS_REPLICA_TIMEOUT_MS", "0")]).unwrap_err();
        assert_eq!(e.var, "APTIX_REDIS_REPLICA_TIMEOUT_MS");
        let c = cfg(&[("APTIX_REDIS_MIN_REPLICAS", "2")]).unwrap();
        assert_eq!(c.redis_min_replicas, 2);
        assert_eq!(cfg(&[]).unwrap().redis_min_replicas, 0, "off by default");
    }

    #[test]
    fn limits_are_configurable() {
        let c = cfg(&[("APTIX_MAX_INSTRUCTION_BYTES", "10")]).unwrap();
        assert_eq!(c.limits.max_instruction_bytes, 10);
    }

    #[test]
    fn secrets_do_not_print() {
        let c = cfg(&[
            ("OPENAI_API_KEY", "sk-very-secret"),
            ("APTIX_API_TOKENS", "tok-secret=tenant-a"),
        ])
        .unwrap();
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("sk-very-secret") && !shown.contains("tok-secret"),
            "{shown}"
        );
        assert!(shown.contains("tenant-a"));
        assert_eq!(c.api_tokens.tenant("tok-secret"), Some("tenant-a"));
        let e = cfg(&[("APTIX_API_TOKENS", "tok-secret")]).unwrap_err();
        assert!(!e.to_string().contains("tok-secret"));
    }

    #[test]
    fn an_admin_token_is_marked_after_its_tenant_and_plain_entries_mean_what_they_did() {
        let c = cfg(&[("APTIX_API_TOKENS", "t1=acme, t2=ops:admin ,t3=acme")]).unwrap();
        let caller = |t| c.api_tokens.caller(t).cloned();
        assert_eq!(
            caller("t1"),
            Some(super::Caller {
                tenant: "acme".into(),
                admin: false
            })
        );
        assert_eq!(
            caller("t2"),
            Some(super::Caller {
                tenant: "ops".into(),
                admin: true
            })
        );
        assert_eq!(c.api_tokens.tenants(), vec!["acme", "ops"]);
        assert!(cfg(&[("APTIX_API_TOKENS", "t1=:admin")]).is_err());
    }
}
