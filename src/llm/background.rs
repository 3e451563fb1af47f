//! Background calls (`"background": true`): the model server keeps working on the response
//! whatever happens to the connection or to this process, and anyone holding its id can
//! follow it to the end — by its event stream, resumed after the last sequence number seen
//! (`GET /responses/{id}?stream=true&starting_after=N`), or by polling
//! (`GET /responses/{id}`) — or cancel it (`POST /responses/{id}/cancel`).
//!
//! A call is made in two steps, so the caller can record the response id before it waits:
//! [`LlmClient::start_background`], then [`LlmClient::follow_background`] (also what a worker
//! re-attaching after a crash calls, with the id it found).
//!
//! Owns: the HTTP of these calls. Must not: record the id (the pipeline does).

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable as _};
use serde_json::Value;

use super::connections::Lease;
use super::stream::Frames;
use super::{AttemptError, EventSink, LlmClient, LlmError, LlmEvent, ModelResponse, WireRequest};

/// The first pause between polls of a response in progress; it doubles up to [`POLL_MAX`].
const POLL_MIN: Duration = Duration::from_millis(250);
/// The longest pause between polls.
const POLL_MAX: Duration = Duration::from_secs(2);
/// Times a broken event stream is resumed in a row without any event coming through.
const RESUMES_WITHOUT_PROGRESS: u32 = 8;

/// A background response being followed: its id, and the open event stream of a streamed call
/// that was just made (read from where it stands).
#[derive(Debug)]
pub struct BackgroundCall {
    /// The response id.
    pub id: String,
    /// The create call's own event stream, past `response.created`.
    open: Option<(reqwest::Response, Frames, Vec<Value>, Lease)>,
    /// The last sequence number read from the stream.
    after: Option<u64>,
    /// The answer, when the create call gave the response already finished (a server that
    /// ignores `background`, as a gateway's bridge onto a chat model does).
    done: Option<Result<ModelResponse, LlmError>>,
    /// The agent context's call permit, held while the call this worker made runs (one it
    /// re-attached to runs on a permit its maker held).
    _permit: Option<crate::limiter::CallPermit>,
}

impl BackgroundCall {
    /// Re-attaches to response `id`, whose events up to sequence number `after` were relayed
    /// already (`None`: from its start).
    pub fn attach(id: String, after: Option<u64>) -> Self {
        Self {
            id,
            open: None,
            after,
            done: None,
            _permit: None,
        }
    }
}

impl LlmClient {
    /// `POST /responses` of a body made for background mode (`background` and `store` set),
    /// streamed when `streamed` (and streaming is on), with the retry policy of every call;
    /// returns once the server has given the response its id.
    pub async fn start_background(
        &self,
        body: &WireRequest,
        streamed: bool,
    ) -> Result<BackgroundCall, LlmError> {
        let streamed = streamed && self.streaming;
        let payload = super::send::Payload::new(body.clone(), streamed).joined();
        let mut attempts = 0usize;
        let started = (|| {
            attempts += 1;
            self.start_once(&payload, streamed)
        })
        .retry(self.backoff())
        .when(|e: &AttemptError| e.retryable)
        .adjust(|e: &AttemptError, dur| dur.map(|d| e.retry_after.unwrap_or(d)))
        .notify(|e: &AttemptError, dur| {
            self.metrics.model_retry();
            tracing::warn!(error = %e.error, retry_in_ms = dur.as_millis() as u64, "starting a background model call failed; retrying");
        })
        .await;
        started.map_err(|e| e.into_error(attempts))
    }

    async fn start_once(
        &self,
        payload: &bytes::Bytes,
        streamed: bool,
    ) -> Result<BackgroundCall, AttemptError> {
        let permit = self.permit().await?;
        let lease = self.http.lease();
        let req = self
            .authorized(lease.client().post(self.endpoint.clone()))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(payload.clone());
        let mut resp = req.send().await.map_err(|e| {
            AttemptError::transient(format!(
                "could not reach the model server ({})",
                super::without_url(&e)
            ))
        })?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            let headers = resp.headers().clone();
            let bytes = resp.bytes().await.unwrap_or_default();
            let refused = super::refusal::refusal(status, &headers, &bytes, streamed);
            if let (Some(limiter), true) = (&self.limiter, refused.rate_limited) {
                limiter
                    .slow_down(refused.retry_after.unwrap_or(Duration::from_secs(1)))
                    .await;
            }
            return Err(refused);
        }
        // A server that ignores `stream` answers with the response object.
        if !streamed || is_json(&resp) {
            let bytes = resp.bytes().await.map_err(|e| {
                AttemptError::transient(format!(
                    "the answer was cut off ({})",
                    super::without_url(&e)
                ))
            })?;
            let object: Value = serde_json::from_slice(&bytes).map_err(|e| {
                AttemptError::transient(format!("the background call's answer is not JSON ({e})"))
            })?;
            let id = response_id(&object).ok_or_else(|| {
                AttemptError::transient("the background call's answer has no id".into())
            })?;
            // Already finished (the server ignored `background`): that is the answer.
            return Ok(BackgroundCall {
                done: finished(&object),
                _permit: permit,
                ..BackgroundCall::attach(id, None)
            });
        }
        // Streamed: read up to the event that names the response (`response.created`).
        let mut frames = Frames::default();
        let mut after = None;
        loop {
            let chunk = resp.chunk().await.map_err(|e| {
                AttemptError::transient(format!(
                    "the background call's stream broke off before it named the response ({})",
                    super::without_url(&e)
                ))
            })?;
            let Some(chunk) = chunk else {
                return Err(AttemptError::transient(
                    "the background call's stream ended before it named the response".into(),
                ));
            };
            let mut events = frames.push(&chunk).into_iter();
            while let Some(event) = events.next() {
                if let Some(n) = event.get("sequence_number").and_then(Value::as_u64) {
                    after = Some(n);
                }
                if let Some(id) = event.get("response").and_then(response_id) {
                    // Events that came in the same chunk are handled by the follower.
                    let rest: Vec<Value> = events.collect();
                    return Ok(BackgroundCall {
                        id,
                        open: Some((resp, frames, rest, lease)),
                        after,
                        done: None,
                        _permit: permit,
                    });
                }
            }
        }
    }

    /// Follows background response `call` to its end: its text to `sink` as it comes (each
    /// delta with its sequence number) when given and streaming is on, else by polling.
    /// [`LlmError::Expired`]: the server no longer has the response.
    pub async fn follow_background(
        &self,
        mut call: BackgroundCall,
        sink: Option<EventSink<'_>>,
    ) -> Result<ModelResponse, LlmError> {
        let started = std::time::Instant::now();
        let sink = sink.filter(|_| self.streaming);
        let result = match (call.done.take(), sink) {
            (Some(done), _) => done,
            (None, Some(sink)) => self.follow_stream(&mut call, sink).await,
            (None, None) => self.poll(&call.id).await,
        };
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
        result
    }

    /// `POST /responses/{id}/cancel`. A response the server no longer has is as good as
    /// cancelled.
    pub async fn cancel_background(&self, id: &str) -> Result<(), LlmError> {
        let url = self.response_url(id, "cancel");
        let resp = self
            .authorized(self.http.lease().client().post(url))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .map_err(|e| unreachable(&e))?;
        let status = resp.status().as_u16();
        if (200..300).contains(&status) || status == 404 {
            return Ok(());
        }
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.unwrap_or_default();
        Err(super::refusal::refusal(status, &headers, &bytes, false).error)
    }

    async fn poll(&self, id: &str) -> Result<ModelResponse, LlmError> {
        let mut pause = POLL_MIN;
        let mut failures = 0usize;
        loop {
            match self.retrieve(id).await {
                Ok(object) => {
                    failures = 0;
                    if let Some(done) = finished(&object) {
                        return done;
                    }
                }
                Err(e @ (LlmError::Expired(_) | LlmError::NotRetrievable { .. })) => {
                    return Err(e);
                }
                Err(e) => {
                    failures += 1;
                    if failures > self.max_retries {
                        return Err(e);
                    }
                    tracing::warn!(response_id = id, error = %e, "polling a background model call failed; trying again");
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(POLL_MAX);
        }
    }

    async fn follow_stream(
        &self,
        call: &mut BackgroundCall,
        sink: EventSink<'_>,
    ) -> Result<ModelResponse, LlmError> {
        let mut idle_resumes = 0u32;
        loop {
            // The lease is held while the stream is read: its connection counts the call.
            let (mut resp, mut frames, pending, _lease) = match call.open.take() {
                Some(open) => open,
                None => {
                    let mut url = self.response_url(&call.id, "");
                    {
                        let mut query = url.query_pairs_mut();
                        query.append_pair("stream", "true");
                        if let Some(n) = call.after {
                            query.append_pair("starting_after", &n.to_string());
                        }
                    }
                    let lease = self.http.lease();
                    let sent = self.authorized(lease.client().get(url)).send().await;
                    match sent {
                        Ok(r) if r.status().as_u16() == 404 => {
                            return Err(LlmError::Expired(call.id.clone()));
                        }
                        // A server that drops `stream` answers with the response object: a
                        // finished one is the answer; else it is followed by polling.
                        Ok(r) if r.status().is_success() && is_json(&r) => {
                            // No stream to read: polling takes a lease per request.
                            drop(lease);
                            let object = match r.bytes().await {
                                Ok(bytes) => serde_json::from_slice::<Value>(&bytes).ok(),
                                Err(_) => None,
                            };
                            match object.as_ref().and_then(finished) {
                                Some(done) => return done,
                                None => return self.poll(&call.id).await,
                            }
                        }
                        Ok(r) if r.status().is_success() => {
                            (r, Frames::default(), Vec::new(), lease)
                        }
                        Ok(r) => {
                            let status = r.status().as_u16();
                            let headers = r.headers().clone();
                            let bytes = r.bytes().await.unwrap_or_default();
                            if let Some(e) = not_retrievable(&call.id, status, &bytes) {
                                return Err(e);
                            }
                            let refused = super::refusal::refusal(status, &headers, &bytes, true);
                            if !refused.retryable {
                                return Err(refused.error);
                            }
                            idle_resumes = self.pause_before_resume(idle_resumes).await?;
                            continue;
                        }
                        Err(_) => {
                            idle_resumes = self.pause_before_resume(idle_resumes).await?;
                            continue;
                        }
                    }
                }
            };
            let before = call.after;
            let mut handle = |event: Value| -> Option<Result<ModelResponse, LlmError>> {
                if let Some(n) = event.get("sequence_number").and_then(Value::as_u64) {
                    if call.after.is_some_and(|a| n <= a) {
                        return None;
                    }
                    call.after = Some(n);
                }
                match event.get("type").and_then(Value::as_str) {
                    Some("response.output_text.delta" | "response.refusal.delta") => {
                        if let Some(text) = event.get("delta").and_then(Value::as_str)
                            && !text.is_empty()
                        {
                            sink(LlmEvent::Delta {
                                text: text.to_string(),
                                response_id: call.id.clone(),
                                sequence: call.after.unwrap_or_default(),
                            });
                        }
                        None
                    }
                    Some(
                        "response.completed"
                        | "response.incomplete"
                        | "response.failed"
                        | "response.cancelled",
                    ) => {
                        let response = event.get("response").cloned().unwrap_or(Value::Null);
                        finished(&response)
                    }
                    _ => None,
                }
            };
            for event in pending {
                if let Some(done) = handle(event) {
                    return done;
                }
            }
            // Read to the end of this stream.
            while let Ok(Some(chunk)) = resp.chunk().await {
                for event in frames.push(&chunk) {
                    if let Some(done) = handle(event) {
                        return done;
                    }
                }
            }
            // The stream ended without a terminal event: the server may have ended it (a
            // cancelled response), or the connection broke. The response says which.
            // Whatever its end (completed, incomplete, failed or cancelled), that is the
            // answer.
            match self.retrieve(&call.id).await {
                Ok(object) => {
                    if let Some(done) = finished(&object) {
                        return done;
                    }
                }
                Err(e @ (LlmError::Expired(_) | LlmError::NotRetrievable { .. })) => return Err(e),
                Err(_) => {}
            }
            let progressed = call.after != before;
            if progressed {
                idle_resumes = 0;
            } else {
                idle_resumes = self.pause_before_resume(idle_resumes).await?;
            }
            tracing::debug!(response_id = %call.id, after = ?call.after, "resuming a background call's event stream");
        }
    }

    /// Waits before resuming a stream that gave nothing; too many in a row is a failure.
    async fn pause_before_resume(&self, idle: u32) -> Result<u32, LlmError> {
        let idle = idle + 1;
        if idle > RESUMES_WITHOUT_PROGRESS {
            return Err(LlmError::Unavailable {
                attempts: idle as usize,
                message: "the background call's event stream gave nothing when resumed".into(),
            });
        }
        tokio::time::sleep((POLL_MIN * idle).min(POLL_MAX)).await;
        Ok(idle)
    }

    /// `GET /responses/{id}`: the response object as it stands.
    async fn retrieve(&self, id: &str) -> Result<Value, LlmError> {
        let url = self.response_url(id, "");
        let resp = self
            .authorized(self.http.lease().client().get(url))
            .send()
            .await
            .map_err(|e| unreachable(&e))?;
        let status = resp.status().as_u16();
        if status == 404 {
            return Err(LlmError::Expired(id.to_string()));
        }
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.map_err(|e| LlmError::Unavailable {
            attempts: 1,
            message: format!("the answer was cut off ({})", super::without_url(&e)),
        })?;
        if !(200..300).contains(&status) {
            if let Some(e) = not_retrievable(id, status, &bytes) {
                return Err(e);
            }
            return Err(super::refusal::refusal(status, &headers, &bytes, false).error);
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| LlmError::BadResponse(format!("the response object is not JSON ({e})")))
    }

    /// `<endpoint>/{id}` or `<endpoint>/{id}/{action}`.
    fn response_url(&self, id: &str, action: &str) -> reqwest::Url {
        let mut url = self.endpoint.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.push(id);
            if !action.is_empty() {
                path.push(action);
            }
        }
        url
    }

    fn authorized(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(key) => req.bearer_auth(key.expose()),
            None => req,
        }
    }

    /// The pauses before each new call made in place of a background response that failed
    /// (the retry policy of every call: `APTIX_LLM_MAX_RETRIES` pauses, growing, jittered).
    pub fn remake_delays(&self) -> impl Iterator<Item = Duration> + Send + use<> {
        use backon::BackoffBuilder as _;
        self.backoff().build()
    }

    pub(super) fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.min_backoff)
            .with_max_delay(Duration::from_secs(8))
            .with_factor(2.0)
            .with_jitter()
            .with_max_times(self.max_retries)
    }
}

/// The model server could not be reached (the URL left out of the message).
fn unreachable(e: &reqwest::Error) -> LlmError {
    LlmError::Unavailable {
        attempts: 1,
        message: format!(
            "could not reach the model server ({})",
            super::without_url(e)
        ),
    }
}

/// Whether an answer is JSON (not an event stream).
fn is_json(resp: &reqwest::Response) -> bool {
    resp.headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

/// [`LlmError::NotRetrievable`] when a `GET /responses/{id}` answer says the server has no
/// such operation: `405`, `501`, or an error whose message says it is not supported (LiteLLM
/// answers `500` "GET responses is not supported for …").
fn not_retrievable(id: &str, status: u16, bytes: &[u8]) -> Option<LlmError> {
    let (message, _) = super::refusal::error_message(bytes, status);
    let said = message.to_ascii_lowercase();
    let unsupported = matches!(status, 405 | 501)
        || said.contains("not supported")
        || said.contains("not implemented");
    unsupported.then(|| LlmError::NotRetrievable {
        id: id.to_string(),
        message,
    })
}

fn response_id(object: &Value) -> Option<String> {
    object.get("id").and_then(Value::as_str).map(str::to_string)
}

/// The answer of a response object that has finished, parsed as any answer; `None` while it
/// is queued or in progress. An `incomplete` one is an answer (cut short, as in the
/// foreground); a `failed` one is [`LlmError::ResponseFailed`].
fn finished(object: &Value) -> Option<Result<ModelResponse, LlmError>> {
    match object.get("status").and_then(Value::as_str) {
        Some("queued" | "in_progress") => None,
        // Cancelled by someone else (a run stopped at its deadline): nothing to follow.
        Some("cancelled") => Some(Err(LlmError::Expired(
            response_id(object).unwrap_or_default(),
        ))),
        Some("failed") => Some(Err(failure(object))),
        _ => Some(super::parse::parse_response(object).map_err(|e| e.error)),
    }
}

/// What a `failed` response object says went wrong.
fn failure(object: &Value) -> LlmError {
    let error = object.get("error");
    let said = |key: &str| {
        error
            .and_then(|e| e.get(key))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let code = said("code").unwrap_or("unknown").to_string();
    LlmError::ResponseFailed {
        id: response_id(object).unwrap_or_default(),
        retryable: RETRYABLE_FAILURES.contains(&code.as_str()),
        message: said("message")
            .unwrap_or("the model reported a failure")
            .to_string(),
        code,
    }
}

/// The error codes of a `failed` response that are the server's, not the request's: a new
/// call may succeed.
const RETRYABLE_FAILURES: &[&str] = &[
    "server_error",
    "rate_limit_exceeded",
    "vector_store_timeout",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_without_retrieval_says_so_and_an_expiry_or_outage_does_not() {
        let litellm = br#"{"error": {"message": "litellm.APIConnectionError: GET responses is not supported for custom_openai", "code": "500"}}"#;
        assert!(matches!(
            not_retrievable("resp_1", 500, litellm),
            Some(LlmError::NotRetrievable { id, .. }) if id == "resp_1"
        ));
        assert!(not_retrievable("resp_1", 405, b"").is_some());
        assert!(not_retrievable("resp_1", 501, b"").is_some());
        let outage = br#"{"error": {"message": "The server had an error", "code": null}}"#;
        assert!(not_retrievable("resp_1", 500, outage).is_none());
        assert!(not_retrievable("resp_1", 404, b"").is_none());
    }

    #[test]
    fn a_finished_response_object_is_an_answer_and_an_unfinished_one_is_not() {
        let object = |status: &str| {
            serde_json::json!({"id": "resp_1", "status": status, "output": [
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}]})
        };
        assert!(finished(&object("queued")).is_none());
        assert!(finished(&object("in_progress")).is_none());
        assert!(matches!(finished(&object("completed")), Some(Ok(r)) if r.id == "resp_1"));
        assert!(matches!(
            finished(&object("cancelled")),
            Some(Err(LlmError::Expired(_)))
        ));
        assert!(matches!(
            finished(&object("failed")),
            Some(Err(LlmError::ResponseFailed { .. }))
        ));
    }
}
