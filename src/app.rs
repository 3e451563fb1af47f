//! The composition root: one place that turns a [`Config`] into the running parts — the mode
//! catalog, the model client (or the built-in fake when no model is configured), the session
//! store and chunk index (Redis, or memory), the broker (RabbitMQ, or the embedded one), the
//! pipeline, and from them the worker, the front door and the HTTP state. The binary, the
//! benchmarks and the tests all build through [`App::build`].
//!
//! Owns: wiring. Must not: hold behaviour of its own (no turn logic, no request handling).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::catalog::ModeCatalog;
use crate::config::Config;
use crate::contexts::{AgentContext, Contexts, DEFAULT_CONTEXT};
use crate::delivery::ResultDelivery;
use crate::fake_llm::{FakeLlm, FakeOptions};
use crate::frontdoor::FrontDoor;
use crate::frontdoor::http::{HttpParts, HttpState, Reading, router, serve_with};
use crate::limiter::{CallLimiter, CallLimits, LimitStore, MemoryLimits, RedisLimits};
use crate::llm::LlmClient;
use crate::mcp::McpTools;
use crate::metrics::Metrics;
use crate::pipeline::{
    AgentBackend, Backends, Conversation, DEFAULT_BOOT_PROMPT, Pipeline, PipelineSettings,
};
use crate::queue::{Broker, MemoryBroker, RabbitBroker, Topology};
use crate::rag::{Bm25Retriever, ChunkIndex, ChunkOptions, MemoryIndex, RedisIndex};
use crate::store::redis::RedisOptions;
use crate::store::{MemoryStore, RedisStore, SessionStore};
use crate::tenants::Quotas;
use crate::webhooks::send::Sender;
use crate::worker::{Worker, WorkerSettings};

/// Why the parts could not be built: which part, and the cause (kept as the error's source).
#[derive(Debug, thiserror::Error)]
#[error("cannot set up {part}")]
pub struct BuildError {
    part: &'static str,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl BuildError {
    /// The part that could not be set up (`the mode catalog`, `RabbitMQ`, …).
    pub fn part(&self) -> &'static str {
        self.part
    }
}

/// Names the part a failure belongs to.
trait Part<T> {
    fn part(self, part: &'static str) -> Result<T, BuildError>;
}

impl<T, E: Into<Box<dyn std::error::Error + Send + Sync>>> Part<T> for Result<T, E> {
    fn part(self, part: &'static str) -> Result<T, BuildError> {
        self.map_err(|e| BuildError {
            part,
            source: e.into(),
        })
    }
}

/// Everything a process needs, built from the configuration: embedded in-memory parts when no
/// URLs are set, RabbitMQ and Redis when they are.
pub struct App {
    pub catalog: Arc<ModeCatalog>,
    pub store: Arc<dyn SessionStore>,
    pub broker: Arc<dyn Broker>,
    pub pipeline: Pipeline,
    pub topology: Topology,
    pub metrics: Arc<Metrics>,
    pub index: Arc<dyn ChunkIndex>,
    pub quotas: Quotas,
    /// Sends the webhook deliveries (run beside every worker).
    pub webhooks: Sender,
    /// The MCP tool sources (`APTIX_TOOLS_FILE`), when there are any.
    pub mcp: Option<McpTools>,
    /// Stops keeping the MCP sources connected when the parts go.
    _stop_tools: tokio_util::sync::DropGuard,
    /// Keeps the built-in fake model alive when no model server is configured.
    _fake: Option<FakeLlm>,
}

impl App {
    pub async fn build(config: &Config) -> Result<Self, BuildError> {
        let catalog = Arc::new(
            ModeCatalog::load(config.worker.modes_file.as_deref()).part("the mode catalog")?,
        );
        // The embedded fake model stands in for the default context when nothing names a
        // model server for it.
        let fake = if config.model.server().is_none()
            && config.model.contexts.agent(DEFAULT_CONTEXT).is_none()
        {
            let fake = FakeLlm::start(
                std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
                FakeOptions::default(),
                None,
            )
            .await
            .part("the built-in fake model")?;
            tracing::info!(base_url = %fake.base_url(), "no model configured; using the built-in fake model");
            Some(fake)
        } else {
            None
        };
        let contexts = contexts_in_use(config, fake.as_ref().map(FakeLlm::base_url));
        let metrics = Arc::new(Metrics::new());
        // Shared by every process on the Redis: tenants' token counts are kept for all.
        let limits: Arc<dyn LimitStore> = match &config.store.url {
            Some(url) => Arc::new(
                RedisLimits::connect(url.expose(), &config.namespace, &redis_options(config))
                    .await
                    .part("the Redis limiter")?,
            ),
            None => Arc::new(MemoryLimits::new()),
        };
        check_tenant_webhooks(config)?;
        let quotas = Quotas::new(
            config.limits.tenants.clone(),
            limits.clone(),
            metrics.clone(),
            config.model.call_slot_ttl,
        );
        let backends = backends(config, &contexts, &limits, &metrics)?;
        let store: Arc<dyn SessionStore> = match &config.store.url {
            Some(url) => {
                tracing::info!(namespace = %config.namespace, "using the Redis session store");
                Arc::new(
                    RedisStore::connect_with(
                        url.expose(),
                        &config.namespace,
                        config.store.retention,
                        &redis_options(config),
                    )
                    .await
                    .part("the Redis session store")?,
                )
            }
            None => Arc::new(MemoryStore::new()),
        };
        let topology = config.topology();
        let broker: Arc<dyn Broker> = match &config.broker.url {
            Some(url) => {
                let name = format!("aptix-{}", uuid::Uuid::new_v4().simple());
                let rabbit = RabbitBroker::new(url.expose(), topology.clone(), &name)
                    .with_timeout(config.dependency_timeout)
                    .with_tls_ca(config.tls_ca.clone());
                rabbit.connect().await.part("RabbitMQ")?;
                tracing::info!(namespace = %config.namespace, "using RabbitMQ");
                Arc::new(rabbit)
            }
            None => Arc::new(MemoryBroker::default().with_reply_queues(&config.topology())),
        };
        let index: Arc<dyn ChunkIndex> = match &config.store.url {
            Some(url) => Arc::new(
                RedisIndex::connect_with(url.expose(), &config.namespace, &redis_options(config))
                    .await
                    .part("the Redis chunk index")?,
            ),
            None => Arc::new(MemoryIndex::new()),
        };
        let mut settings = PipelineSettings::new(config.model.name.clone());
        settings.max_iterations = config.worker.max_iterations;
        settings.replay = config.model.replay;
        settings.lease_ttl = config.store.lease;
        let default_llm = backends
            .agent(DEFAULT_CONTEXT)
            .map(|b| b.llm.clone())
            .ok_or_else(|| BuildError {
                part: "the model client",
                source: "no default agent context".into(),
            })?;
        let pipeline = Pipeline::new(store.clone(), catalog.clone(), default_llm, settings)
            .part("the pipeline")?
            .with_backends(backends)
            .with_metrics(metrics.clone())
            .with_quotas(quotas.clone())
            .with_live(
                Arc::new(ResultDelivery::new(store.clone(), broker.clone())),
                crate::live::LiveSettings::default(),
            )
            .with_rag(
                Arc::new(Bm25Retriever::new(index.clone())),
                config.rag.budget,
            );
        // The Redis index and limits are on the session store's server (the same URL and
        // namespace).
        let pipeline = match &config.store.url {
            Some(_) => pipeline.with_rag_on_store().with_quotas_on_store(),
            None => pipeline,
        };
        // MCP tool sources: kept connected by tasks of their own for as long as the parts live.
        let stop_tools = CancellationToken::new();
        let mcp = if config.tools.sources.sources.is_empty() {
            None
        } else {
            let reserved = catalog.tools().iter().map(|t| t.name.clone()).collect();
            let mcp = McpTools::start(
                config.tools.sources.clone(),
                config.tools.guard.clone(),
                config.tls_ca.as_ref(),
                reserved,
                metrics.clone(),
                stop_tools.clone(),
            );
            Some(mcp.part("the MCP tool sources")?)
        };
        // Each source's first try (bounded by its connect timeout) before any turn runs, so the
        // first turns are offered what the sources that answer have.
        if let Some(m) = &mcp {
            m.first_attempts().await;
            for s in m.status() {
                match s.problem {
                    None => tracing::info!(source = %s.name, tools = s.tools, "MCP tool source up"),
                    Some(why) => {
                        tracing::warn!(source = %s.name, %why, "MCP tool source down; its tools are offered once it answers")
                    }
                }
            }
        }
        let pipeline = match &mcp {
            Some(m) => pipeline.with_mcp(m.clone()),
            None => pipeline,
        };
        let webhooks = Sender::new(
            broker.clone(),
            (config.webhooks.guard(), config.webhooks.secrets.clone()),
            config.webhooks.send.clone(),
            metrics.clone(),
            config.tls_ca.as_ref(),
        )
        .part("the webhook sender")?
        .with_lines(Arc::new(crate::delivery::BatchLines::new(
            Arc::new(ResultDelivery::new(store.clone(), broker.clone())),
            config.limits.tenants.clone(),
        )));
        Ok(Self {
            webhooks,
            catalog,
            store,
            broker,
            pipeline,
            topology,
            metrics,
            index,
            quotas,
            mcp,
            _stop_tools: stop_tools.drop_guard(),
            _fake: fake,
        })
    }

    /// The worker of these parts, with the configuration's settings.
    pub fn worker(&self, config: &Config) -> Worker {
        self.worker_with(WorkerSettings {
            concurrency: u16::try_from(config.worker.concurrency).unwrap_or(u16::MAX),
            max_attempts: config.broker.max_attempts,
            turn_deadline: config.worker.turn_deadline,
            shutdown_grace: config.worker.shutdown_grace,
            lane_wait: config.worker.lane_wait,
            limits: config.limits.request,
            ..WorkerSettings::default()
        })
    }

    /// The worker of these parts with `settings` of the caller's (benchmarks, tests).
    pub fn worker_with(&self, settings: WorkerSettings) -> Worker {
        Worker::new(
            self.broker.clone(),
            self.pipeline.clone(),
            self.topology.clone(),
            settings,
        )
        .with_metrics(self.metrics.clone())
        .with_quotas(self.quotas.clone())
        .with_webhooks(self.webhooks.clone())
    }

    pub fn front_door(&self, config: &Config) -> FrontDoor {
        FrontDoor::new(
            self.store.clone(),
            self.broker.clone(),
            config.limits.request,
        )
        .with_contexts(self.pipeline.known_contexts())
        .with_metrics(self.metrics.clone())
        .with_quotas(self.quotas.clone())
        .with_webhooks(config.webhooks.guard(), config.webhooks.secrets.clone())
    }

    pub fn http_state(&self, config: &Config) -> HttpState {
        HttpState::new(HttpParts {
            door: self.front_door(config),
            store: self.store.clone(),
            broker: self.broker.clone(),
            catalog: self.catalog.clone(),
            tokens: config.http.api_tokens.clone(),
            limits: config.limits.request,
            batch_limits: config.limits.batch,
            metrics: self.metrics.clone(),
            index: self.index.clone(),
            chunk_options: ChunkOptions {
                max_lines: config.rag.chunk_lines,
            },
            console: config.http.console_on(),
            read_timeout: config.http.read_timeout,
            mcp: self.mcp.clone(),
        })
    }

    /// Serves the HTTP API of these parts on `listener` until `shutdown` is cancelled (the
    /// embedded server of `aptix run --listen`, `aptix batch` without `--url`, the tests).
    /// Builds the router (the OpenAPI document with it) before it returns, so a request that
    /// comes once it returned is served at once.
    pub fn spawn_http(
        &self,
        config: &Config,
        listener: tokio::net::TcpListener,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<std::io::Result<()>> {
        let router = router(self.http_state(config));
        let reading = Reading {
            timeout: config.http.read_timeout,
            metrics: self.metrics.clone(),
        };
        tokio::spawn(serve_with(listener, router, shutdown, reading))
    }
}

/// The contexts of a deployment: the contexts file's, plus the built-in `default`s made from
/// `APTIX_LLM_BASE_URL` (or `fallback_url`, the embedded fake's), `OPENAI_API_KEY` and
/// `APTIX_MODEL` unless the file defines its own.
pub fn contexts_in_use(config: &Config, fallback_url: Option<String>) -> Contexts {
    let default = AgentContext {
        id: DEFAULT_CONTEXT.to_string(),
        base_url: config.model.server().or(fallback_url),
        api_key_env: config
            .model
            .api_key
            .as_ref()
            .map(|_| "OPENAI_API_KEY".to_string()),
        api_key: config.model.api_key.clone(),
        model: config.model.name.clone(),
        max_concurrent_calls: None,
        requests_per_minute: None,
        timeout: None,
        replay: None,
        prompt_caching: None,
        calls: config.model.calls.clone(),
    };
    config
        .model
        .contexts
        .clone()
        .with_defaults(default, DEFAULT_BOOT_PROMPT)
}

/// One model client per agent context (its URL, key, timeout and limiter) and the
/// conversation contexts' prompts.
fn backends(
    config: &Config,
    contexts: &Contexts,
    limits: &Arc<dyn LimitStore>,
    metrics: &Arc<Metrics>,
) -> Result<Backends, BuildError> {
    let mut backends = Backends::empty();
    for agent in contexts.agents() {
        metrics.register_context(&agent.id);
        let Some(base_url) = agent.base_url.as_deref() else {
            return Err(BuildError {
                part: "the model client",
                source: format!("agent context {:?} has no base URL", agent.id).into(),
            });
        };
        let mut llm = LlmClient::with_ca(
            base_url,
            agent.api_key.clone(),
            config.model.connect_timeout,
            agent.timeout.unwrap_or(config.model.timeout),
            config.model.max_retries,
            config.tls_ca.as_ref(),
            config.model.http,
        )
        .part("the model client")?
        .with_metrics(metrics.clone())
        .with_streaming(config.model.streaming);
        if agent.is_limited() {
            let call_limits = CallLimits {
                max_concurrent: agent.max_concurrent_calls,
                per_window: agent.requests_per_minute,
                window: config.model.rate_window,
                wait: config.model.capacity_wait,
                slot_ttl: config.model.call_slot_ttl,
            };
            llm = llm.with_limiter(CallLimiter::new(
                limits.clone(),
                &agent.id,
                call_limits,
                metrics.clone(),
            ));
        }
        let backend = AgentBackend {
            llm,
            model: agent.model.clone(),
            replay: agent.replay.unwrap_or(config.model.replay),
            prompt_caching: agent.prompt_caching.unwrap_or(true),
            calls: agent.calls.clone(),
        };
        backends = backends.with_agent(&agent.id, backend);
    }
    for c in contexts.conversations() {
        backends = backends.with_conversation(
            &c.id,
            Conversation {
                boot_prompt: c.boot_prompt.as_str().into(),
                model: c.model.clone(),
            },
        );
    }
    Ok(backends)
}

/// The tenants file's webhooks, checked before anything starts: each URL held to the policy
/// (without DNS: names are resolved at every delivery) and each signing secret set (a set one
/// that is not a secret stopped the configuration already).
fn check_tenant_webhooks(config: &Config) -> Result<(), BuildError> {
    let guard = config.webhooks.guard();
    for (tenant, hook) in config.limits.tenants.all_webhooks() {
        let bad = |problem: String| BuildError {
            part: "the tenants file's webhooks",
            source: format!("tenant {tenant:?}, webhook {}: {problem}", hook.target.url).into(),
        };
        guard
            .parse(&hook.target.url)
            .map_err(|e| bad(e.to_string()))?;
        let env = &hook.target.secret_env;
        if !config.webhooks.secrets.contains_key(env) {
            return Err(bad(format!("the signing secret variable {env} is not set")));
        }
    }
    Ok(())
}

/// How this process connects to Redis.
pub fn redis_options(config: &Config) -> RedisOptions {
    RedisOptions {
        timeout: config.dependency_timeout,
        ca: config.tls_ca.clone(),
        cluster: config.store.cluster,
        min_replicas: config.store.min_replicas,
        replica_timeout: config.store.replica_timeout,
    }
}
