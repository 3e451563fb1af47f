//! One source's connection, kept by a task of its own: connect (an HTTP session, or the
//! command started as a child process), `tools/list`, list again on
//! `notifications/tools/list_changed`, and on any end of the connection (the server gone, the
//! child dead, a call's transport failing) connect again after a growing pause. A source that
//! does not answer leaves the worker running: it is down in `/readyz` and in
//! `aptix_tool_source_up`, and its tools are absent until it first lists them; one that goes
//! away later keeps its last listing (the turns that call it fail retryably meanwhile).
//!
//! Owns: the connection's life and one call over it. Must not: know of turns or the ledger.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{NotificationContext, Peer, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ServiceExt as _};
use serde_json::{Map, Value};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::listing::McpTool;
use super::sources::{Source, Transport};
use crate::metrics::Metrics;
use crate::webhooks::guard::Guard;

/// The first pause before connecting again; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(200);
/// The longest pause between attempts to connect.
const MAX_PAUSE: Duration = Duration::from_secs(10);

/// Why a call did not run as a tool.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallFailure {
    /// Not connected: nothing was sent.
    #[error("the source {source_name} is not connected: {why}")]
    Down {
        /// The source.
        source_name: String,
        /// Its last connection error.
        why: String,
    },
    /// The server could not be reached for the call: nothing was sent.
    #[error("the source {source_name} cannot be reached: {why}")]
    Unreachable {
        /// The source.
        source_name: String,
        /// What the client said.
        why: String,
    },
    /// The server answered with a JSON-RPC error: the tool did not run.
    #[error("the source {source_name} refused the call: {why}")]
    Refused {
        /// The source.
        source_name: String,
        /// The error's code and message.
        why: String,
    },
    /// No answer within the call timeout: the tool may have run.
    #[error("the source {source_name} did not answer within {timeout:?}")]
    Timeout {
        /// The source.
        source_name: String,
        /// The call timeout.
        timeout: Duration,
    },
    /// Every place among the source's calls in flight (`maxInFlight`) stayed taken for the
    /// call timeout: nothing was sent.
    #[error(
        "the source {source_name} had {max_in_flight} calls in flight for {waited:?}; this one was not sent"
    )]
    Busy {
        /// The source.
        source_name: String,
        /// Its `maxInFlight`.
        max_in_flight: usize,
        /// How long the call waited.
        waited: Duration,
    },
    /// The connection failed during the call: the tool may have run.
    #[error("the call to {source_name} broke off: {why}")]
    Broken {
        /// The source.
        source_name: String,
        /// What the client said.
        why: String,
    },
}

impl CallFailure {
    /// Whether the tool may have run although no answer came.
    pub fn may_have_run(&self) -> bool {
        matches!(self, Self::Timeout { .. } | Self::Broken { .. })
    }
}

/// A place among a source's calls in flight (`maxInFlight`), taken before a call is marked
/// sent: a call that waits for one has not left, and a run that dies waiting leaves no mark.
pub struct Slot<'a> {
    link: &'a Link,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl Slot<'_> {
    /// Calls tool `remote` in this place; see [`Link::call`].
    pub async fn call(
        self,
        remote: &str,
        arguments: Map<String, Value>,
        meta: Map<String, Value>,
    ) -> Result<Value, CallFailure> {
        self.link.call_now(remote, arguments, meta).await
    }
}

/// The HTTP client's error inside `e`, if the failure was one. The SDK keeps it as a field
/// (of its initialize error, and of its HTTP error), not as a source, so the chain is walked
/// through those by hand.
fn http_client_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a reqwest::Error> {
    use rmcp::service::ClientInitializeError;
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    let mut at = Some(e);
    while let Some(err) = at {
        if let Some(ClientInitializeError::TransportError { error, .. }) = err.downcast_ref() {
            at = Some(error);
            continue;
        }
        match err.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
            Some(StreamableHttpError::Client(r)) => return Some(r),
            _ => {
                if let Some(r) = err.downcast_ref::<reqwest::Error>() {
                    return Some(r);
                }
            }
        }
        at = err.source();
    }
    None
}

/// `e` and its causes as one line, with the HTTP client's own causes (a refused address, a
/// connection refused) that the SDK's message leaves out.
fn described(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = crate::causes::with_causes(e);
    if let Some(r) = http_client_error(e) {
        let inner = crate::causes::with_causes(r);
        if let Some((_, causes)) = inner.split_once(": ") {
            out.push_str(": ");
            out.push_str(causes);
        }
    }
    out
}

/// Whether `e` is a failure to connect: a request that never left.
fn never_connected(e: &(dyn std::error::Error + 'static)) -> bool {
    http_client_error(e).is_some_and(reqwest::Error::is_connect)
}

/// The client side of a connection: it hears `tools/list_changed`.
#[derive(Clone)]
struct Listener {
    changed: Arc<Notify>,
}

impl ClientHandler for Listener {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        self.changed.notify_one();
        std::future::ready(())
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("aptix-worker", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// One source, its connection and its last listing.
pub struct Link {
    /// The source as configured.
    pub source: Source,
    peer: RwLock<Option<Peer<RoleClient>>>,
    tools: RwLock<Arc<Vec<Arc<McpTool>>>>,
    up: AtomicBool,
    listed_once: AtomicBool,
    last_error: Mutex<String>,
    slots: Semaphore,
    changed: Arc<Notify>,
    broken: Notify,
    attempted: Notify,
}

impl Link {
    /// A link for `source`, not yet connected.
    pub fn new(source: Source) -> Self {
        Self {
            slots: Semaphore::new(source.max_in_flight),
            source,
            peer: RwLock::default(),
            tools: RwLock::default(),
            up: AtomicBool::new(false),
            listed_once: AtomicBool::new(false),
            last_error: Mutex::new("not connected yet".into()),
            changed: Arc::new(Notify::new()),
            broken: Notify::new(),
            attempted: Notify::new(),
        }
    }

    /// Its tools as last listed.
    pub fn tools(&self) -> Arc<Vec<Arc<McpTool>>> {
        self.tools.read().map(|t| t.clone()).unwrap_or_default()
    }

    /// Whether a call can be sent now.
    pub fn is_connected(&self) -> bool {
        self.peer.read().is_ok_and(|p| p.is_some())
    }

    /// Whether it is connected and has listed its tools.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Why it is not up (the last error), or `None` when it is.
    pub fn problem(&self) -> Option<String> {
        if self.is_up() {
            return None;
        }
        Some(
            self.last_error
                .lock()
                .map(|e| e.clone())
                .unwrap_or_default(),
        )
    }

    /// Waits until the first attempt to connect has ended (either way).
    pub async fn first_attempt(&self) {
        let notified = self.attempted.notified();
        if self.listed_once.load(Ordering::Acquire) || self.problem_seen() {
            return;
        }
        notified.await;
    }

    fn problem_seen(&self) -> bool {
        self.last_error
            .lock()
            .map(|e| e.as_str() != "not connected yet")
            .unwrap_or(true)
    }

    /// A place among the source's calls in flight, waited for at most the call timeout.
    pub async fn reserve(&self) -> Result<Slot<'_>, CallFailure> {
        let waited = self.source.call_timeout;
        match tokio::time::timeout(waited, self.slots.acquire()).await {
            Err(_) => Err(CallFailure::Busy {
                source_name: self.source.name.clone(),
                max_in_flight: self.source.max_in_flight,
                waited,
            }),
            Ok(Err(_)) => Err(CallFailure::Down {
                source_name: self.source.name.clone(),
                why: "shutting down".into(),
            }),
            Ok(Ok(permit)) => Ok(Slot {
                link: self,
                _permit: permit,
            }),
        }
    }

    /// Calls tool `remote` with `arguments` and `meta` once a place is free; the result as
    /// JSON.
    pub async fn call(
        &self,
        remote: &str,
        arguments: Map<String, Value>,
        meta: Map<String, Value>,
    ) -> Result<Value, CallFailure> {
        self.reserve().await?.call(remote, arguments, meta).await
    }

    /// The call itself, in a place taken by [`Link::reserve`].
    async fn call_now(
        &self,
        remote: &str,
        arguments: Map<String, Value>,
        meta: Map<String, Value>,
    ) -> Result<Value, CallFailure> {
        let source_name = self.source.name.clone();
        let peer = self.peer.read().ok().and_then(|p| p.clone());
        let Some(peer) = peer else {
            return Err(CallFailure::Down {
                source_name,
                why: self.problem().unwrap_or_default(),
            });
        };
        let mut params = CallToolRequestParams::new(remote.to_string()).with_arguments(arguments);
        params.meta = Some(rmcp::model::RequestMetaObject(rmcp::model::MetaObject(
            meta,
        )));
        let timeout = self.source.call_timeout;
        match tokio::time::timeout(timeout, peer.call_tool(params)).await {
            Err(_) => Err(CallFailure::Timeout {
                source_name,
                timeout,
            }),
            Ok(Ok(result)) => serde_json::to_value(&result).map_err(|e| CallFailure::Broken {
                source_name,
                why: format!("the result cannot be read: {e}"),
            }),
            Ok(Err(rmcp::ServiceError::McpError(e))) => Err(CallFailure::Refused {
                source_name,
                why: format!("error {}: {}", e.code.0, e.message),
            }),
            Ok(Err(e)) => {
                self.broken.notify_one();
                let why = described(&e);
                Err(if never_connected(&e) {
                    CallFailure::Unreachable { source_name, why }
                } else {
                    CallFailure::Broken { source_name, why }
                })
            }
        }
    }

    /// Keeps the source connected until `stop`.
    pub async fn keep(
        self: Arc<Self>,
        http: reqwest::Client,
        guard: Guard,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) {
        let mut pause = FIRST_PAUSE;
        loop {
            let attempt = async {
                let service =
                    tokio::time::timeout(self.source.connect_timeout, self.connect(&http, &guard))
                        .await
                        .map_err(|_| {
                            format!("no answer within {:?}", self.source.connect_timeout)
                        })??;
                let peer = service.peer().clone();
                self.list(&peer, &metrics).await?;
                Ok::<_, String>((service, peer))
            };
            let attempt = tokio::select! {
                a = attempt => a,
                () = stop.cancelled() => return,
            };
            match attempt {
                Ok((service, peer)) => {
                    pause = FIRST_PAUSE;
                    if let Ok(mut p) = self.peer.write() {
                        *p = Some(peer.clone());
                    }
                    self.serve(service, &peer, &metrics, &stop).await;
                    if let Ok(mut p) = self.peer.write() {
                        *p = None;
                    }
                    if stop.is_cancelled() {
                        return;
                    }
                    self.down(&metrics, "the connection ended".into());
                }
                Err(why) => self.down(&metrics, why),
            }
            // A pause before the next attempt, growing while attempts fail.
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = stop.cancelled() => return,
            }
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// While connected: lists again when told the list changed; returns when the connection
    /// ends, a call found it broken, or at `stop`.
    async fn serve(
        &self,
        service: RunningService<RoleClient, Listener>,
        peer: &Peer<RoleClient>,
        metrics: &Metrics,
        stop: &CancellationToken,
    ) {
        let cancel = service.cancellation_token();
        let mut ended = std::pin::pin!(service.waiting());
        loop {
            tokio::select! {
                _ = &mut ended => return,
                () = self.changed.notified() => {
                    info!(source = %self.source.name, "the tool list changed; listing again");
                    if let Err(why) = self.list(peer, metrics).await {
                        warn!(source = %self.source.name, %why, "listing the tools again failed");
                    }
                }
                () = self.broken.notified() => break,
                () = stop.cancelled() => break,
            }
        }
        cancel.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), ended).await;
    }

    async fn connect(
        &self,
        http: &reqwest::Client,
        guard: &Guard,
    ) -> Result<RunningService<RoleClient, Listener>, String> {
        let listener = Listener {
            changed: self.changed.clone(),
        };
        match &self.source.transport {
            Transport::Http { url, headers } => {
                let url = guard
                    .parse(url)
                    .map_err(|e| format!("the url is refused: {e}"))?;
                let mut custom = std::collections::HashMap::new();
                for (name, value) in headers {
                    let name = reqwest::header::HeaderName::try_from(name.as_str())
                        .map_err(|e| format!("header {name:?}: {e}"))?;
                    let mut value = reqwest::header::HeaderValue::try_from(value.expose())
                        .map_err(|_| {
                            format!("header {name}: the value is not a valid header value")
                        })?;
                    value.set_sensitive(true);
                    custom.insert(name, value);
                }
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(custom)
                    .max_concurrent_requests(self.source.max_in_flight);
                let transport = StreamableHttpClientTransport::with_client(
                    super::traced::Traced(http.clone()),
                    config,
                );
                listener.serve(transport).await.map_err(|e| described(&e))
            }
            Transport::Stdio { command, args, env } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args)
                    .envs(env.iter().map(|(k, v)| (k, v.expose())))
                    .kill_on_drop(true);
                let (child, _stderr) = TokioChildProcess::builder(cmd)
                    .stderr(std::process::Stdio::inherit())
                    .spawn()
                    .map_err(|e| format!("{command} cannot be started: {e}"))?;
                listener
                    .serve(child)
                    .await
                    .map_err(|e| crate::causes::with_causes(&e))
            }
        }
    }

    /// `tools/list`, kept as this source's tools.
    async fn list(&self, peer: &Peer<RoleClient>, metrics: &Metrics) -> Result<(), String> {
        let listed = tokio::time::timeout(self.source.connect_timeout, peer.list_all_tools())
            .await
            .map_err(|_| "tools/list got no answer".to_string())?
            .map_err(|e| format!("tools/list failed: {}", crate::causes::with_causes(&e)))?;
        let mut tools = Vec::with_capacity(listed.len());
        for tool in &listed {
            let json = serde_json::to_value(tool).unwrap_or(Value::Null);
            match McpTool::from_listing(&self.source, &json) {
                Ok(t) => tools.push(Arc::new(t)),
                Err(super::listing::Skipped::NotAllowed) => {}
                Err(why) => {
                    warn!(source = %self.source.name, tool = %tool.name, %why, "a listed tool is not offered")
                }
            }
        }
        info!(source = %self.source.name, listed = listed.len(), offered = tools.len(), "MCP tools listed");
        metrics.tools.source(&self.source.name, true, tools.len());
        metrics
            .tools
            .listed(&self.source.name, tools.iter().map(|t| t.remote.as_str()));
        if let Ok(mut t) = self.tools.write() {
            *t = Arc::new(tools);
        }
        self.up.store(true, Ordering::Release);
        self.listed_once.store(true, Ordering::Release);
        self.attempted.notify_waiters();
        Ok(())
    }

    fn down(&self, metrics: &Metrics, why: String) {
        let was_up = self.up.swap(false, Ordering::AcqRel);
        if was_up || !self.problem_seen() {
            warn!(source = %self.source.name, %why, "MCP tool source is down");
        }
        if let Ok(mut e) = self.last_error.lock() {
            *e = why;
        }
        metrics
            .tools
            .source(&self.source.name, false, self.tools().len());
        self.attempted.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_waits_for_a_place_at_most_its_timeout_and_then_was_not_sent() {
        let file = r#"{"sources": [{"name": "a", "url": "http://127.0.0.1:9/mcp",
            "maxInFlight": 1, "callTimeoutMs": 500}]}"#;
        let source = crate::mcp::sources::ToolSources::parse(file, |_| None)
            .unwrap()
            .sources
            .remove(0);
        let link = Link::new(source);
        let held = link.reserve().await.expect("the one place is free");
        let started = tokio::time::Instant::now();
        let Err(failure) = link.reserve().await else {
            panic!("a second place while the only one is held");
        };
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        assert!(
            matches!(
                failure,
                CallFailure::Busy {
                    max_in_flight: 1,
                    ..
                }
            ),
            "{failure}"
        );
        assert!(!failure.may_have_run());
        drop(held);
        assert!(link.reserve().await.is_ok(), "free again once given back");
    }
}
