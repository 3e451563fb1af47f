//! MCP server tools: the MCP servers operators plug in (the tools file, [`sources`]), kept
//! connected by each worker ([`link`]), their tools offered to the model like the built-in
//! server tools ([`listing`]) and their results given back as the model can take them
//! ([`output`]). Layer D (`pipeline::server_tools`) runs calls through [`McpTools`]; whether a
//! call may run again after a crash is decided there, from what [`McpTool`] says.
//!
//! Built on the official Rust SDK (`rmcp`): Streamable HTTP on the crate's own `reqwest`
//! client (which resolves names through the same SSRF guard as webhook deliveries, with its
//! own allow-list, `APTIX_TOOLS_ALLOW`), and stdio servers as child processes.
//!
//! Owns: the sources and their tools. Must not: know of turns, the ledger or the store.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

pub mod approval;
pub mod link;
pub mod listing;
pub mod output;
pub mod sources;
mod traced;

pub use link::CallFailure;
pub use listing::{Hints, McpTool};
pub use sources::{Source, ToolSources};

use crate::metrics::Metrics;
use crate::webhooks::guard::Guard;

/// One source's state, for `/readyz` and `aptix tools`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceStatus {
    /// Its name.
    pub name: String,
    /// Connected and listed.
    pub up: bool,
    /// The tools it offers.
    pub tools: usize,
    /// Why it is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// The MCP sources of a worker (cheap to clone).
#[derive(Clone)]
pub struct McpTools {
    links: Arc<Vec<Arc<link::Link>>>,
    /// Names the built-in tools take: an MCP tool of the same name is not offered.
    reserved: Arc<BTreeSet<String>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for McpTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTools")
            .field("sources", &self.links.len())
            .finish_non_exhaustive()
    }
}

impl McpTools {
    /// Starts keeping every source of `sources` connected (until `stop`); `reserved` are the
    /// names of the built-in tools. URLs are held to `guard`; HTTPS trusts `ca` too.
    pub fn start(
        sources: ToolSources,
        guard: Guard,
        ca: Option<&crate::tls::ExtraCa>,
        reserved: BTreeSet<String>,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) -> Result<Self, reqwest::Error> {
        let http = crate::tls::http_client_builder(ca)?
            .dns_resolver(Arc::new(guard.clone()))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(concat!("aptix-worker/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let links: Vec<Arc<link::Link>> = sources
            .sources
            .into_iter()
            .map(|s| Arc::new(link::Link::new(s)))
            .collect();
        for l in &links {
            metrics.tools.source(&l.source.name, false, 0);
            tokio::spawn(l.clone().keep(
                http.clone(),
                guard.clone(),
                metrics.clone(),
                stop.clone(),
            ));
        }
        Ok(Self {
            links: Arc::new(links),
            reserved: Arc::new(reserved),
            metrics,
        })
    }

    /// Whether any source is configured.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// Waits until every source has tried to connect once (either way).
    pub async fn first_attempts(&self) {
        for l in self.links.iter() {
            l.first_attempt().await;
        }
    }

    /// Each source's state.
    pub fn status(&self) -> Vec<SourceStatus> {
        self.links
            .iter()
            .map(|l| SourceStatus {
                name: l.source.name.clone(),
                up: l.is_up(),
                tools: l.tools().len(),
                problem: l.problem(),
            })
            .collect()
    }

    /// The tools a turn of `tenant` in mode `mode` is offered, in the sources' order; a name
    /// a built-in tool or an earlier source already gives is skipped.
    pub fn offered(&self, mode: &str, tenant: &str) -> Vec<Arc<McpTool>> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for l in self.links.iter() {
            if !l.source.in_mode(mode) || !l.source.for_tenant(tenant) {
                continue;
            }
            for t in l.tools().iter() {
                if !self.reserved.contains(&t.def.name) && seen.insert(t.def.name.clone()) {
                    out.push(t.clone());
                }
            }
        }
        out
    }

    /// Every tool of every source, with the modes and tenants that may use it (for
    /// `aptix tools`).
    pub fn catalog(&self) -> Vec<(Arc<McpTool>, &Source)> {
        self.links
            .iter()
            .flat_map(|l| {
                l.tools()
                    .iter()
                    .map(|t| (t.clone(), &l.source))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The source `name`, as configured.
    pub fn source(&self, name: &str) -> Option<&Source> {
        self.links
            .iter()
            .find(|l| l.source.name == name)
            .map(|l| &l.source)
    }

    /// Whether `tool`'s source is connected (a call can be sent now).
    pub fn connected(&self, tool: &McpTool) -> bool {
        self.links
            .iter()
            .any(|l| l.source.name == tool.source && l.is_connected())
    }

    /// A place among the calls in flight of `tool`'s source, waited for at most its call
    /// timeout (see [`link::Slot`]).
    pub async fn reserve(&self, tool: &McpTool) -> Result<link::Slot<'_>, CallFailure> {
        let Some(link) = self.links.iter().find(|l| l.source.name == tool.source) else {
            return Err(CallFailure::Down {
                source_name: tool.source.clone(),
                why: "no such source".into(),
            });
        };
        link.reserve().await
    }

    /// Calls `tool` with `arguments`; `meta` goes in the request's `_meta`.
    pub async fn call(
        &self,
        tool: &McpTool,
        arguments: Map<String, Value>,
        meta: Map<String, Value>,
    ) -> Result<Value, CallFailure> {
        let Some(link) = self.links.iter().find(|l| l.source.name == tool.source) else {
            return Err(CallFailure::Down {
                source_name: tool.source.clone(),
                why: "no such source".into(),
            });
        };
        link.call(&tool.remote, arguments, meta).await
    }

    /// The process's metrics (the tools' families are counted by layer D).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}
