//! The Responses API client (AGN-027 layer C): exactly one logical model call per invocation,
//! with the official SDKs' retry policy, and normalisation of the answer.
//!
//! Owns: HTTP to the model server, retry/backoff, error classification, output parsing. Must not:
//! build prompts, run tools or loop over calls. Raw vendor JSON never leaves this module except
//! as output items kept for replay; errors carry only the model's message.

use std::sync::Arc;
use std::time::Duration;

use backon::Retryable as _;

use crate::limiter::CallLimiter;

mod background;
mod body;
mod connections;
mod h1conn;
mod h1wire;
mod h2conn;
mod hosted;
mod parse;
mod refusal;
mod send;
mod skim;
mod stream;
mod target;
#[cfg(test)]
mod test_listener;
use crate::metrics::Metrics;
use crate::secret::Secret;
pub use crate::state::{ModelResponse, OutputItem, WireRequest};
pub use background::BackgroundCall;
use connections::Connections;
pub use connections::ModelHttp;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LlmError {
    /// Transient failures (429, 5xx, timeouts, connection errors) outlasted the retries.
    #[error("model server unavailable after {attempts} attempt(s): {message}")]
    Unavailable {
        /// Attempts made.
        attempts: usize,
        /// The last failure, with the model's message when it sent one.
        message: String,
    },
    /// The model server rejected the request (terminal 4xx).
    #[error("model server rejected the request (HTTP {status}): {message}")]
    Rejected {
        /// HTTP status.
        status: u16,
        /// The model's error message.
        message: String,
    },
    /// The server does not know `previous_response_id` (it does not store responses).
    #[error("model server does not know the previous response: {0}")]
    PreviousResponseNotFound(String),
    /// The answer could not be used (malformed body, `failed` status).
    #[error("model server gave an unusable answer: {0}")]
    BadResponse(String),
    /// A `flex` call the server had no capacity for (429 resource unavailable), after the
    /// retries: made again later, or at another tier.
    #[error("model server has no flex capacity after {attempts} attempt(s): {message}")]
    FlexUnavailable {
        /// Attempts made.
        attempts: usize,
        /// The server's message.
        message: String,
    },
    /// The server no longer has the background response being followed (it expired, was
    /// deleted or cancelled): the call has to be made again.
    #[error("the model server no longer has background response {0} (expired or cancelled)")]
    Expired(String),
    /// A background response ended `failed`. `retryable` when its error is the server's
    /// (`server_error`, `rate_limit_exceeded`, `vector_store_timeout`): the call is made again
    /// as a new one; otherwise the request is at fault (an invalid prompt or image, a policy
    /// violation) and making it again would fail the same way.
    #[error("background response {id} failed ({code}): {message}")]
    ResponseFailed {
        /// The response id.
        id: String,
        /// The error code the server gave.
        code: String,
        /// The server's message.
        message: String,
        /// Whether a new call may succeed.
        retryable: bool,
    },
    /// The server made a background response but cannot give it back (`GET
    /// /responses/{id}` is not supported: a gateway bridging onto a chat model): such a call
    /// can only be made in the foreground.
    #[error("the model server cannot retrieve background response {id}: {message}")]
    NotRetrievable {
        /// The response id.
        id: String,
        /// The server's message.
        message: String,
    },
    /// The agent context's limits left no room for the call within the wait bound: nothing
    /// was sent; the turn should run again later.
    #[error(transparent)]
    NoCapacity(#[from] crate::limiter::NoCapacity),
}

impl LlmError {
    /// Whether retrying the whole turn later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Unavailable { .. }
                | Self::FlexUnavailable { .. }
                | Self::ResponseFailed {
                    retryable: true,
                    ..
                }
        )
    }
}

/// What a streamed call reports while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LlmEvent {
    /// A piece of the answer's text (never function-call arguments).
    TextDelta(String),
    /// A piece of a background call's text, with the sequence number of the event that
    /// carried it (a follower that re-attaches resumes after the last one relayed).
    Delta {
        /// The text.
        text: String,
        /// The response.
        response_id: String,
        /// Its event's `sequence_number`.
        sequence: u64,
    },
    /// The call is made again after a failed attempt (text already reported from that attempt
    /// is not part of the answer).
    Retrying {
        /// The attempt starting now (2 for the first retry).
        attempt: usize,
    },
}

/// Receives a streamed call's events; it must not block.
pub type EventSink<'a> = &'a (dyn Fn(LlmEvent) + Send + Sync);

/// One attempt's failure, before the retry policy decides.
#[derive(Debug)]
struct AttemptError {
    retryable: bool,
    retry_after: Option<Duration>,
    /// The server answered 429.
    rate_limited: bool,
    /// The server answered 429 resource unavailable (flex capacity).
    flex_unavailable: bool,
    error: LlmError,
}

impl AttemptError {
    /// A failure worth another attempt (the connection, a timeout, a broken stream).
    fn transient(message: String) -> Self {
        Self {
            retryable: true,
            retry_after: None,
            rate_limited: false,
            flex_unavailable: false,
            error: LlmError::Unavailable {
                attempts: 1,
                message,
            },
        }
    }
}

impl AttemptError {
    /// The call's error after `attempts` attempts, this one the last.
    fn into_error(self, attempts: usize) -> LlmError {
        match self.error {
            LlmError::Unavailable { message, .. } if self.flex_unavailable => {
                LlmError::FlexUnavailable { attempts, message }
            }
            LlmError::Unavailable { message, .. } => LlmError::Unavailable { attempts, message },
            other => other,
        }
    }
}

/// Why a model client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The base URL does not make an http(s) endpoint URL.
    #[error("the model server's base URL {url:?} is not an http(s) URL with a host: {reason}")]
    BaseUrl {
        /// The base URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The HTTP client could not be set up (e.g. its TLS roots); reqwest's error is written
    /// into the message, not returned as the source.
    #[error("the HTTP client could not be built: {0}")]
    Http(reqwest::Error),
}

impl From<reqwest::Error> for ClientError {
    fn from(e: reqwest::Error) -> Self {
        Self::Http(e)
    }
}

/// A small Responses API client on reqwest.
#[derive(Debug, Clone)]
pub struct LlmClient {
    /// The connections calls go out on (`model.http`).
    http: Connections,
    /// `<base URL>/responses`, parsed once: each call sends a copy.
    endpoint: reqwest::Url,
    /// A call's whole time, from sending to the answer's last byte (`model.timeout`).
    timeout: Duration,
    api_key: Option<Secret>,
    max_retries: usize,
    min_backoff: Duration,
    metrics: Arc<Metrics>,
    limiter: Option<CallLimiter>,
    streaming: bool,
    /// Set once a call continuing from a response was answered without its conversation:
    /// this server (this agent context) does not keep it, and every session replays.
    forgets_history: Arc<std::sync::atomic::AtomicBool>,
    /// Set once the server could not give back a background response: this context's calls
    /// are made in the foreground from then on.
    no_background: Arc<std::sync::atomic::AtomicBool>,
}

impl LlmClient {
    /// A client for `base_url` (e.g. `https://api.openai.com/v1`), over the versions the
    /// server offers (`model.http`'s default).
    pub fn new(
        base_url: &str,
        api_key: Option<Secret>,
        connect_timeout: Duration,
        timeout: Duration,
        max_retries: usize,
    ) -> Result<Self, ClientError> {
        Self::with_ca(
            base_url,
            api_key,
            connect_timeout,
            timeout,
            max_retries,
            None,
            ModelHttp::default(),
        )
    }

    /// Like [`LlmClient::new`], trusting `ca` in addition to the system's roots and calling
    /// over `http`.
    pub fn with_ca(
        base_url: &str,
        api_key: Option<Secret>,
        connect_timeout: Duration,
        timeout: Duration,
        max_retries: usize,
        ca: Option<&crate::tls::ExtraCa>,
        http: ModelHttp,
    ) -> Result<Self, ClientError> {
        let endpoint = responses_endpoint(base_url)?;
        let trusted = ca.cloned();
        let http = Connections::build(
            http,
            endpoint.scheme() == "https",
            Arc::new(move || {
                Ok(crate::tls::client_builder(trusted.as_ref())?
                    .connect_timeout(connect_timeout)
                    .timeout(timeout))
            }),
            |alpn| {
                let tls = if endpoint.scheme() == "https" {
                    crate::tls::client_config(ca)
                } else {
                    crate::tls::client_config(None)
                };
                target::Target::new(&endpoint, tls, alpn, connect_timeout)
            },
        )?;
        Ok(Self {
            http,
            endpoint,
            timeout,
            api_key,
            max_retries,
            min_backoff: Duration::from_millis(500),
            metrics: Arc::default(),
            limiter: None,
            streaming: true,
            forgets_history: Arc::default(),
            no_background: Arc::default(),
        })
    }

    /// Whether calls with an event sink ask the server to stream (`APTIX_LLM_STREAMING`; on
    /// by default). Off, they are made as plain calls and report no deltas.
    pub fn with_streaming(mut self, streaming: bool) -> Self {
        self.streaming = streaming;
        self
    }

    /// Sets the first backoff delay (tests shorten it; the SDK default is 0.5 s).
    pub fn with_min_backoff(mut self, d: Duration) -> Self {
        self.min_backoff = d;
        self
    }

    /// Holds every call to `limiter`'s limits (each attempt takes its own permit; a 429 slows
    /// the whole context down).
    pub fn with_limiter(mut self, limiter: CallLimiter) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// At most how many calls of this client's context run at once, if limited.
    pub fn max_concurrent_calls(&self) -> Option<u32> {
        self.limiter
            .as_ref()
            .and_then(|l| l.limits().max_concurrent)
    }

    /// Whether this server answered a continued call without its conversation (see
    /// [`LlmClient::note_forgets_history`]).
    pub fn forgets_history(&self) -> bool {
        self.forgets_history
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Notes that this server answered a call continuing from a response without that
    /// response's conversation; true the first time (for a one-time warning).
    pub fn note_forgets_history(&self) -> bool {
        !self
            .forgets_history
            .swap(true, std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether this server could not give back a background response (see
    /// [`LlmError::NotRetrievable`]).
    pub fn refuses_background(&self) -> bool {
        self.no_background
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Notes that this server cannot give back background responses; true the first time.
    pub fn note_refuses_background(&self) -> bool {
        !self
            .no_background
            .swap(true, std::sync::atomic::Ordering::Relaxed)
    }

    /// Records latency, tokens and retries in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// `POST /responses` with retries; returns the normalised answer. `model` names the
    /// model the body asks for (for the call's span).
    pub async fn create_response(
        &self,
        model: &str,
        body: &WireRequest,
    ) -> Result<ModelResponse, LlmError> {
        self.create_response_streamed(model, body, None).await
    }

    /// [`LlmClient::create_response`], streamed when `sink` is given (and streaming is on):
    /// the text arrives at `sink` as the model writes it; the answer is the same.
    pub async fn create_response_streamed(
        &self,
        model: &str,
        body: &WireRequest,
        sink: Option<EventSink<'_>>,
    ) -> Result<ModelResponse, LlmError> {
        let sink = sink.filter(|_| self.streaming);
        // Each attempt sends the body's own bytes (with `"stream": true` in front if streamed).
        let payload = send::Payload::new(body.clone(), sink.is_some());
        let backoff = self.backoff();
        let mut attempts = 0usize;
        let started = std::time::Instant::now();
        let result = (|| {
            attempts += 1;
            if let Some(sink) = sink
                && attempts > 1
            {
                sink(LlmEvent::Retrying { attempt: attempts });
            }
            self.attempt(model, &payload, sink)
        })
        .retry(backoff)
        .when(|e: &AttemptError| e.retryable)
        .adjust(|e: &AttemptError, dur| dur.map(|d| e.retry_after.unwrap_or(d)))
        .notify(|e: &AttemptError, dur| {
            self.metrics.model_retry();
            tracing::warn!(error = %e.error, retry_in_ms = dur.as_millis() as u64, "model call failed; retrying");
        })
        .await;
        self.metrics.observe_model_latency(started.elapsed());
        if let Ok(r) = &result {
            let u = &r.usage;
            self.metrics.add_tokens([
                u.prompt_tokens,
                u.completion_tokens,
                u.cached_tokens,
                u.reasoning_tokens,
            ]);
        }
        result.map_err(|e| e.into_error(attempts))
    }

    /// One call, in a `model_call` span of its own (exported as a child of the turn's `job`
    /// span); the model server gets that span as its parent in `traceparent`.
    async fn attempt(
        &self,
        model: &str,
        payload: &send::Payload,
        sink: Option<EventSink<'_>>,
    ) -> Result<ModelResponse, AttemptError> {
        use tracing::Instrument as _;
        let span = tracing::info_span!("model_call", model);
        let traceparent = crate::trace::TraceContext::current().map(|t| t.within(&span).header());
        let permit = self.permit().await?;
        let mut sent = self
            .send_once(payload, traceparent, sink)
            .instrument(span)
            .await;
        if let (Ok(answer), Some(permit)) = (&mut sent, &permit) {
            answer.capacity_waited = permit.waited();
        }
        if let (Err(e), Some(limiter)) = (&sent, &self.limiter)
            && e.rate_limited
        {
            limiter
                .slow_down(e.retry_after.unwrap_or(Duration::from_secs(1)))
                .await;
        }
        sent
    }

    /// The agent context's permit for one attempt (none for a context without limits);
    /// no capacity within the wait bound is an error no retry of this call mends.
    async fn permit(&self) -> Result<Option<crate::limiter::CallPermit>, AttemptError> {
        let Some(limiter) = &self.limiter else {
            return Ok(None);
        };
        limiter.acquire().await.map(Some).map_err(|e| AttemptError {
            retryable: false,
            retry_after: None,
            rate_limited: false,
            flex_unavailable: false,
            error: e.into(),
        })
    }
}

/// `<base_url>/responses`, the base checked to be an http(s) URL with a host.
fn responses_endpoint(base_url: &str) -> Result<reqwest::Url, ClientError> {
    let refuse = |reason: String| ClientError::BaseUrl {
        url: base_url.to_string(),
        reason,
    };
    let mut endpoint = crate::contexts::model_base_url(base_url).map_err(refuse)?;
    // An http(s) URL with a host always has path segments.
    endpoint
        .path_segments_mut()
        .map_err(|()| refuse("it cannot have a path".to_string()))?
        .pop_if_empty()
        .push("responses");
    Ok(endpoint)
}

/// A reqwest error's text without the URL (which may carry credentials in a query string).
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(url) = e.url() {
        s = s.replace(url.as_str(), "<model server>");
    }
    s
}

#[cfg(test)]
mod tests;
