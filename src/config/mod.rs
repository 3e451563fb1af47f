//! Configuration (DESIGN.md §4): typed sections read once, in one place, from environment
//! variables over an optional TOML file (`APTIX_CONFIG_FILE`).
//!
//! Every setting is declared once ([`setting::Setting`]: its variable, file key, older names,
//! default and meaning) in the file of its section; the same declarations drive the reading, the
//! errors (which name the variable), `aptix config` (the effective values and where each came
//! from, secrets masked) and the generated reference in `docs/configuration.md`
//! ([`reference`](mod@reference)). Durations have one spelling (`30s`, `500ms`, `5m`); the
//! older `_SECS` and `_MS` variables still work, with their bare numbers in their unit.
//!
//! Owns: what can be configured and how it is read. Must not: hold anything that is not
//! configuration (tenants, tokens, the error chain and the memory probe live elsewhere).

use std::time::Duration;

pub mod broker;
pub mod deployment;
pub mod http;
pub mod limits;
pub mod model;
pub mod rag;
pub mod reference;
pub mod setting;
pub mod source;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod webhooks;
pub mod worker;

pub use crate::contract::ids::LOCAL_TENANT;
pub use crate::secret::Secret;
pub use limits::BatchLimits;
pub use setting::{Effective, Origin, Setting};
pub use source::Sources;
pub use webhooks::WebhookConfig;

/// A configuration value that could not be used.
#[derive(Debug, thiserror::Error)]
#[error("configuration variable {var}: {problem}")]
pub struct ConfigError {
    /// The variable's name (`APTIX_CONFIG_FILE` for a problem with the file itself).
    pub var: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

/// Every setting, by section, in the order the reference lists them.
pub static ALL: &[&[&Setting]] = &[
    deployment::SETTINGS,
    broker::SETTINGS,
    store::SETTINGS,
    model::SETTINGS,
    worker::SETTINGS,
    http::SETTINGS,
    limits::SETTINGS,
    rag::SETTINGS,
    webhooks::SETTINGS,
    tools::SETTINGS,
    telemetry::SETTINGS,
];

/// The setting under a file key.
pub fn setting_by_key(key: &str) -> Option<&'static Setting> {
    ALL.iter()
        .flat_map(|s| s.iter())
        .copied()
        .find(|s| s.key == key)
}

/// The whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Prefix of every queue, exchange and Redis key.
    pub namespace: String,
    /// Extra trusted roots for RabbitMQ, Redis and the model endpoint.
    pub tls_ca: Option<crate::tls::ExtraCa>,
    /// The longest one Redis command or RabbitMQ operation may take.
    pub dependency_timeout: Duration,
    /// `[broker]`: RabbitMQ.
    pub broker: broker::Broker,
    /// `[store]`: Redis.
    pub store: store::Store,
    /// `[model]`: the model server and the agent contexts.
    pub model: model::Model,
    /// `[worker]`: turns in flight and their deadlines.
    pub worker: worker::Worker,
    /// `[http]`: the front door.
    pub http: http::Http,
    /// `[limits]`: request and batch sizes, tenants' quotas.
    pub limits: limits::Limits,
    /// `[rag]`: retrieval.
    pub rag: rag::Rag,
    /// `[webhooks]`.
    pub webhooks: WebhookConfig,
    /// `[tools]`: MCP server tools.
    pub tools: tools::Tools,
    /// `[telemetry]`: logs.
    pub telemetry: telemetry::Telemetry,
    /// Every setting's effective value and where it came from, for `aptix config`.
    effective: Vec<Effective>,
}

impl Config {
    /// Reads the process environment and the file it names.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::read(&Sources::from_env()?)
    }

    /// Reads variables through `lookup` (tests pass a map instead of the environment), over the
    /// file `APTIX_CONFIG_FILE` names there.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String> + Send + Sync,
    ) -> Result<Self, ConfigError> {
        Self::read(&Sources::from_lookup(lookup)?)
    }

    /// Reads every section from `sources`.
    pub fn read(sources: &Sources) -> Result<Self, ConfigError> {
        let r = setting::Reader::new(sources);
        let top = deployment::Deployment::read(&r)?;
        let broker = broker::Broker::read(&r)?;
        let store = store::Store::read(&r)?;
        let model = model::Model::read(&r)?;
        let worker = worker::Worker::read(&r)?;
        let http = http::Http::read(&r)?;
        let limits = limits::Limits::read(&r)?;
        let rag = rag::Rag::read(&r)?;
        let webhooks = WebhookConfig::read(&r, &limits.tenants)?;
        let tools = tools::Tools::read(&r)?;
        let telemetry = telemetry::Telemetry::read(&r)?;
        Ok(Self {
            namespace: top.namespace,
            tls_ca: top.tls_ca,
            dependency_timeout: top.dependency_timeout,
            broker,
            store,
            model,
            worker,
            http,
            limits,
            rag,
            webhooks,
            tools,
            telemetry,
            effective: r.into_effective(),
        })
    }

    /// Every setting's effective value and where it came from, in the reference's order.
    pub fn effective(&self) -> &[Effective] {
        &self.effective
    }

    /// The queue names and delays of this configuration.
    pub fn topology(&self) -> crate::queue::Topology {
        let mut topology = crate::queue::Topology::new(&self.namespace);
        topology.reply_queue_ttl = self.broker.reply_queue_ttl;
        topology.reply_queue_max_length = self.broker.reply_queue_max_length;
        topology.reply_queues = self.broker.reply_queues;
        topology.retry_delays = self.broker.retry_delays.clone();
        topology.hook_delays = self.webhooks.send.delays.clone();
        topology.with_lanes(self.limits.tenants.capped().map(|(id, _)| id))
    }
}

/// What the binary needs before its runtime starts: how to log, the CPU scheduling class and
/// the CA bundle for span export. Read from the same layers, with the same errors.
#[derive(Debug)]
pub struct Process {
    /// How log lines are written.
    pub log_format: crate::telemetry::LogFormat,
    /// The long-running processes' CPU scheduling class.
    pub cpu_scheduling: crate::sched::CpuScheduling,
    /// Extra trusted roots for the span exporter (read only when span export is asked for).
    pub tls_ca: Option<crate::tls::ExtraCa>,
}

impl Process {
    /// Reads the process settings; the CPU scheduling class only for a `long_running` command
    /// (the others keep the class they were started in, whatever the setting says).
    pub fn read(sources: &Sources, long_running: bool) -> Result<Self, ConfigError> {
        let r = setting::Reader::new(sources);
        Ok(Self {
            log_format: telemetry::Telemetry::read(&r)?.log_format,
            cpu_scheduling: match long_running {
                true => worker::read_cpu_scheduling(&r)?,
                false => crate::sched::CpuScheduling::Normal,
            },
            // Read here only for the span exporter, when it is asked for: the commands that
            // use the bundle otherwise read it (and report it) with the rest.
            tls_ca: match crate::telemetry::EXPORT_VARS
                .iter()
                .any(|v| sources.env(v).is_some())
            {
                true => deployment::read_ca(&r)?,
                false => None,
            },
        })
    }
}

#[cfg(test)]
mod layer_tests;
#[cfg(test)]
mod tests;
