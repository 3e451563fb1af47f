//! Configuration from `APTIX_*` environment variables (DESIGN.md §4).
//!
//! Every variable is read in one place, parsed into a typed value, and a bad value fails start-up
//! with a message that names the variable. Secrets are wrapped so they never print.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::causes::with_causes;
use crate::contract::RequestLimits;
pub use crate::secret::Secret;
use crate::sizing::default_concurrency;

/// A configuration variable that could not be used.
#[derive(Debug, thiserror::Error)]
#[error("configuration variable {var}: {problem}")]
pub struct ConfigError {
    /// The variable's name.
    pub var: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

pub use crate::contract::ids::LOCAL_TENANT;
use crate::tokens::ApiTokens;

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
    /// `APTIX_CONCURRENCY`: turns one worker runs at once ([`crate::sizing::default_concurrency`]).
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

fn tokens(get: &impl Fn(&str) -> Option<String>) -> Result<ApiTokens, ConfigError> {
    ApiTokens::parse(&get("APTIX_API_TOKENS").unwrap_or_default()).map_err(|problem| ConfigError {
        var: "APTIX_API_TOKENS",
        problem,
    })
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
mod tests;
