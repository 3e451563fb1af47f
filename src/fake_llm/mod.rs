//! A faithful fake of the OpenAI Responses API, for tests, demos and benchmarks.
//!
//! A real HTTP server (`POST /v1/responses`) that checks requests the way the real API does
//! (content part types, tool shapes, `tool_choice`, unanswered function calls, unknown
//! `previous_response_id`; and, given the official OpenAPI document, the full `CreateResponse`
//! schema), stores responses so `previous_response_id` works (or runs stateless), and answers
//! with real `Response` objects. Tests script it reply by reply; with no script it answers
//! deterministically, and an instruction line `#fake:call <tool> <json>` makes it call a tool
//! (`#fake:hosted …` one of OpenAI's hosted tools: see `hosted`).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};

mod background;
mod chat;
mod check;
mod hosted;
mod reply;
mod response;
mod stored;
mod stream;
mod wire;

use check::check_request;
pub use check::{component_validator, create_response_validator};
pub use hosted::HostedUse;
pub use reply::Reply;
use reply::default_reply;
use stored::{Stored, StoredResponses};

/// Options of a fake server.
#[derive(Debug, Clone, Default)]
pub struct FakeOptions {
    /// Added to every answer.
    pub latency: Duration,
    /// Store nothing: every `previous_response_id` is unknown.
    pub stateless: bool,
    /// Answer 401 `invalid_api_key` (as the real API does) unless the request carries
    /// `Authorization: Bearer <this key>`.
    pub api_key: Option<String>,
    /// Pieces a streamed text (or function-call arguments) is cut into (0: four).
    pub stream_pieces: usize,
    /// Pause before each streamed event after the first.
    pub stream_delay: Duration,
    /// Answer `stream: true` with a 400, as a server without streaming does.
    pub no_streaming: bool,
    /// Answer `background: true` with a 400 naming the parameter, as a server without
    /// background mode does.
    pub no_background: bool,
    /// Break the first this many streamed answers halfway (see [`Reply::BrokenStream`]).
    pub break_streams: usize,
    /// Keep no record of the requests (`requests()`, `traceparents()`, `arrivals()` and
    /// `first_delta_times()` stay empty), so a long benchmark's memory is the product's, not
    /// the fake's, and a server left running does not grow with its traffic.
    pub forget_requests: bool,
    /// End every text answer with its response id in brackets (`… [resp_…]`), so a test can
    /// tell which of several answers a client was given.
    pub stamp_answers: bool,
    /// Remember at most this many responses for `previous_response_id`, forgetting the oldest
    /// first (a forgotten one is `previous_response_not_found`, as an expired one is on the real
    /// API); `None` remembers every one.
    pub keep_responses: Option<usize>,
}

struct Inner {
    options: FakeOptions,
    script: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Value>>,
    traceparents: Mutex<Vec<Option<String>>>,
    stored: Mutex<StoredResponses>,
    counter: AtomicU64,
    schema: Option<RequestCheck>,
    /// Requests being answered now, and the most there ever were at once.
    in_flight: AtomicU64,
    peak_in_flight: AtomicU64,
    /// The `usage` of every answer given, in order.
    usages: Mutex<Vec<Value>>,
    /// The input tokens of the latest request of each `prompt_cache_key` (what a repeated
    /// prefix finds in the prompt cache).
    cache: Mutex<HashMap<String, u64>>,
    /// When each request arrived (since the server started).
    arrivals: Mutex<Vec<Duration>>,
    /// When each streamed answer's first text delta was handed to the connection.
    first_deltas: Mutex<Vec<std::time::Instant>>,
    /// Streamed answers given so far.
    streamed: AtomicU64,
    started: std::time::Instant,
    /// Responses made in background mode.
    background: background::Background,
    /// `flex` requests still to be refused with 429 resource unavailable.
    flex_unavailable: AtomicU64,
    wire: wire::Wire,
}

/// A full check of a request body against the API's schema: `Err((message, path))` names the
/// first violation. Built by [`create_response_validator`] (feature `schema-check`, on in
/// tests), so the production binary does not carry a JSON Schema engine.
pub type RequestCheck = Arc<dyn Fn(&Value) -> Result<(), (String, String)> + Send + Sync>;

/// A handle to a running fake server.
#[derive(Clone)]
pub struct FakeLlm {
    inner: Arc<Inner>,
    addr: SocketAddr,
}

impl FakeLlm {
    /// Starts a server on `addr` (port 0 for any free port).
    pub async fn start(
        addr: SocketAddr,
        options: FakeOptions,
        schema: Option<RequestCheck>,
    ) -> std::io::Result<Self> {
        let stored = StoredResponses::bounded(options.keep_responses);
        let inner = Arc::new(Inner {
            options,
            script: Mutex::new(VecDeque::new()),
            requests: Mutex::new(Vec::new()),
            traceparents: Mutex::new(Vec::new()),
            stored: Mutex::new(stored),
            counter: AtomicU64::new(1),
            schema,
            in_flight: AtomicU64::new(0),
            peak_in_flight: AtomicU64::new(0),
            cache: Mutex::new(HashMap::new()),
            usages: Mutex::new(Vec::new()),
            arrivals: Mutex::new(Vec::new()),
            first_deltas: Mutex::new(Vec::new()),
            streamed: AtomicU64::new(0),
            started: std::time::Instant::now(),
            background: background::Background::default(),
            flex_unavailable: AtomicU64::new(0),
            wire: wire::Wire::default(),
        });
        let app = Router::new()
            .route("/v1/responses", post(create_response))
            .route(
                "/v1/responses/{id}",
                axum::routing::get(background::retrieve),
            )
            .route("/v1/responses/{id}/cancel", post(background::cancel))
            .route("/v1/chat/completions", post(chat::create))
            .with_state(inner.clone());
        let listener = crate::net::listen(addr)?;
        let addr = listener.local_addr()?;
        let counted = inner.clone();
        tokio::spawn(async move {
            use axum::serve::ListenerExt as _;
            let listener = listener.tap_io(move |tcp| {
                counted.wire.connected();
                crate::net::no_delay(tcp)
            });
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "fake model server stopped");
            }
        });
        Ok(Self { inner, addr })
    }

    /// The base URL to configure as `APTIX_LLM_BASE_URL`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queues scripted replies, answered in order.
    pub fn push(&self, replies: impl IntoIterator<Item = Reply>) {
        if let Ok(mut s) = self.inner.script.lock() {
            s.extend(replies);
        }
    }

    /// The `traceparent` header of every request received, in order.
    pub fn traceparents(&self) -> Vec<Option<String>> {
        self.inner
            .traceparents
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default()
    }

    /// The most requests this server was answering at one moment.
    pub fn peak_in_flight(&self) -> u64 {
        self.inner.peak_in_flight.load(Ordering::SeqCst)
    }

    /// When each request arrived, measured from the server's start, in arrival order.
    pub fn arrivals(&self) -> Vec<Duration> {
        self.inner
            .arrivals
            .lock()
            .map(|a| a.clone())
            .unwrap_or_default()
    }

    /// When each streamed answer's first text delta was handed to the connection, in order
    /// (for measuring what the product adds on the way to its client).
    pub fn first_delta_times(&self) -> Vec<std::time::Instant> {
        self.inner
            .first_deltas
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default()
    }

    /// Every request body received so far (valid or not).
    pub fn requests(&self) -> Vec<Value> {
        self.inner
            .requests
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Forgets every background response: retrieving one is `404`, as on the live API once
    /// it expired.
    pub fn expire_background(&self) {
        self.inner.background.expire();
    }

    /// The ids of the background responses a cancel was sent for, in order.
    pub fn cancels(&self) -> Vec<String> {
        self.inner.background.cancels()
    }

    /// How many times a background response was retrieved (polled, or its stream resumed).
    pub fn background_retrievals(&self) -> u64 {
        self.inner.background.retrievals()
    }

    /// Refuses the next `n` requests made at the `flex` service tier with `429` resource
    /// unavailable, as the live API does when flex capacity runs out.
    pub fn refuse_flex(&self, n: u64) {
        self.inner.flex_unavailable.store(n, Ordering::SeqCst);
    }

    /// The `usage` object of every answer given so far, in order.
    pub fn usages(&self) -> Vec<Value> {
        self.inner
            .usages
            .lock()
            .map(|u| u.clone())
            .unwrap_or_default()
    }
}

fn error_response(
    status: StatusCode,
    message: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    let body = json!({"error": {
        "message": message, "type": "invalid_request_error", "param": param, "code": code
    }});
    (status, Json(body)).into_response()
}

/// The live API's `401 invalid_api_key` when the server has a key and the request does not
/// carry it.
fn unauthorized(inner: &Inner, headers: &HeaderMap) -> Option<Response> {
    let key = inner.options.api_key.as_ref()?;
    let sent = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if sent == Some(key.as_str()) {
        return None;
    }
    let message = match sent {
        None => {
            "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        }
        Some(_) => {
            "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys."
        }
    };
    Some(error_response(
        StatusCode::UNAUTHORIZED,
        message,
        None,
        Some("invalid_api_key"),
    ))
}

async fn create_response(
    State(inner): State<Arc<Inner>>,
    version: axum::http::Version,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let _answering = wire::Answering::start(&inner, version);
    if let Some(refused) = unauthorized(&inner, &headers) {
        return refused;
    }
    if !inner.options.forget_requests
        && let Ok(mut t) = inner.traceparents.lock()
    {
        t.push(
            headers
                .get(crate::trace::TRACEPARENT)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
        );
    }
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "We could not parse the JSON body of your request.",
                None,
                None,
            );
        }
    };
    if !inner.options.forget_requests
        && let Ok(mut r) = inner.requests.lock()
    {
        r.push(request.clone());
    }
    if !inner.options.latency.is_zero() {
        tokio::time::sleep(inner.options.latency).await;
    }
    if let Err((message, param, code)) = check_request(&inner, &request) {
        return error_response(
            StatusCode::BAD_REQUEST,
            &message,
            param.as_deref(),
            code.as_deref(),
        );
    }
    if inner.options.no_streaming && streams(&request) {
        return error_response(
            StatusCode::BAD_REQUEST,
            "Streaming is not supported by this server.",
            Some("stream"),
            None,
        );
    }
    if background::asked(&request) {
        let refusal = if inner.options.no_background {
            Some("Unsupported parameter: 'background' is not supported by this server.")
        } else if request.get("store").and_then(Value::as_bool) == Some(false) {
            Some("Background mode requires 'store' to be true.")
        } else {
            None
        };
        if let Some(message) = refusal {
            return error_response(StatusCode::BAD_REQUEST, message, Some("background"), None);
        }
    }
    let scripted = inner.script.lock().ok().and_then(|mut s| s.pop_front());
    let reply = scripted.unwrap_or_else(|| default_reply(&request));
    answer(&inner, request, body.len(), reply).await
}

fn next_id(inner: &Inner, prefix: &str) -> String {
    format!(
        "{prefix}_{:016x}{:08x}",
        inner.counter.fetch_add(1, Ordering::Relaxed),
        fastrand::u32(..)
    )
}

/// Answers `req` (its body was `body_len` bytes) with `reply`. The request is taken: the
/// fields the response echoes (instructions, tools, …) move into it rather than being copied.
async fn answer(inner: &Arc<Inner>, req: Value, body_len: usize, mut reply: Reply) -> Response {
    let mut delay = Duration::ZERO;
    while let Reply::Delay(d, next) = reply {
        delay += d;
        reply = *next;
    }
    let stream = streams(&req);
    if background::asked(&req) {
        // Taken at once; the answer is ready after the delay (see `background`).
        return match answer_object(inner, req, body_len, reply) {
            Ok((object, _)) => inner.background.start(object, delay, stream, inner),
            Err(refused) => refused,
        };
    }
    tokio::time::sleep(delay).await;
    match answer_object(inner, req, body_len, reply) {
        Ok((object, broken)) => respond_as(inner, stream, object, broken),
        Err(refused) => refused,
    }
}

/// The `Response` object answering `req` with `reply` (delays unwrapped), and whether a
/// streamed answer breaks off; or the error answer the reply scripts (kept whole: it is the
/// HTTP answer itself, made once per request of a test server).
#[allow(clippy::result_large_err)]
fn answer_object(
    inner: &Arc<Inner>,
    mut req: Value,
    body_len: usize,
    reply: Reply,
) -> Result<(Value, bool), Response> {
    let flex = req.get("service_tier").and_then(Value::as_str) == Some("flex");
    if flex
        && inner
            .flex_unavailable
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    {
        let body = json!({"error": {
            "message": "Resource unavailable: flex processing capacity is exhausted right now. Please try again later or use the default service tier.",
            "type": "invalid_request_error", "param": null, "code": "resource_unavailable"
        }});
        return Err((StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response());
    }
    let message = |inner: &Inner, part: Value| {
        json!({
            "id": next_id(inner, "msg"), "type": "message", "status": "completed", "role": "assistant", "content": [part]
        })
    };
    let id = next_id(inner, "resp");
    let text_part = |t: &str| {
        let text = if inner.options.stamp_answers {
            format!("{t} [{id}]")
        } else {
            t.to_string()
        };
        json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    };
    let (status, output, incomplete): (&str, Vec<Value>, Option<&str>) = match &reply {
        Reply::Text(t) => ("completed", vec![message(inner, text_part(t))], None),
        Reply::Refusal(r) => ("completed", vec![message(inner, json!({"type": "refusal", "refusal": r}))], None),
        Reply::Incomplete(t) => ("incomplete", vec![message(inner, text_part(t))], Some("max_output_tokens")),
        Reply::UnknownItemThenText(t) => ("completed", vec![json!({"type": "image_generation_call", "id": next_id(inner, "ig"), "status": "completed", "result": null}), message(inner, text_part(t))], None),
        Reply::Hosted(used) => {
            let (mut items, text) = hosted::output(inner, &req, used, |p| next_id(inner, p));
            items.extend(text.map(|t| message(inner, text_part(&t))));
            ("completed", items, None)
        }
        Reply::Empty => ("completed", vec![], None),
        Reply::Calls(calls) => ("completed", calls.iter().map(|(name, args)| json!({
            "type": "function_call", "id": next_id(inner, "fc"), "call_id": next_id(inner, "call"),
            "name": name, "arguments": args.to_string(), "status": "completed"
        })).collect(), None),
        Reply::Error { status, message, retry_after_ms } => {
            let code = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let kind = if *status == 429 { "rate_limit_exceeded" } else if *status >= 500 { "server_error" } else { "invalid_request_error" };
            let mut resp = (code, Json(json!({"error": {"message": message, "type": kind, "param": null, "code": null}}))).into_response();
            if let Some(ms) = retry_after_ms
                && let Ok(v) = HeaderValue::from_str(&ms.to_string())
            {
                resp.headers_mut().insert("retry-after-ms", v);
            }
            return Err(resp);
        }
        Reply::Malformed => {
            let mut headers = HeaderMap::new();
            headers.insert("content-type", HeaderValue::from_static("application/json"));
            return Err((StatusCode::OK, headers, "{\"id\": \"resp_trunc").into_response());
        }
        Reply::Failed(_) => ("failed", vec![], None),
        Reply::BrokenStream(t) => {
            if !streams(&req) {
                return Err(error_response(StatusCode::INTERNAL_SERVER_ERROR, "The server had an error while processing your request.", None, None));
            }
            ("completed", vec![message(inner, text_part(t))], None)
        }
        Reply::Delay(..) => unreachable!("delays are unwrapped above"),
    };
    let broken = matches!(reply, Reply::BrokenStream(_));
    let approvals = hosted::requests_in(&output);
    let pending_calls: Vec<String> = output
        .iter()
        .filter(|o| o["type"] == "function_call")
        .filter_map(|o| o["call_id"].as_str().map(str::to_string))
        .collect();
    let error = match &reply {
        Reply::Failed(code) => {
            json!({"code": code, "message": "The model failed to generate a response."})
        }
        _ => Value::Null,
    };
    // What the model reads: this request, and the conversation of the response it continues
    // (the live API counts that again in every follow-up's input).
    let carried = req
        .get("previous_response_id")
        .and_then(Value::as_str)
        .and_then(|prev| {
            inner
                .stored
                .lock()
                .ok()?
                .get(prev)
                .map(|s| s.context_tokens)
        })
        .unwrap_or(0);
    let input_tokens = response::input_tokens(body_len) + carried;
    let cached_tokens = req
        .get("prompt_cache_key")
        .and_then(Value::as_str)
        .and_then(|key| {
            let mut cache = inner.cache.lock().ok()?;
            let previous = cache.insert(key.to_string(), input_tokens);
            Some(response::cached_tokens(previous, input_tokens))
        })
        .unwrap_or(0);
    let reasoning = req
        .get("model")
        .and_then(Value::as_str)
        .is_some_and(response::reasons);
    let stores =
        !inner.options.stateless && req.get("store").and_then(Value::as_bool) != Some(false);
    let answered = response::Answered {
        id: id.clone(),
        status,
        error,
        incomplete,
        output,
        stored: !inner.options.stateless,
        input_tokens,
        cached_tokens,
        reasoning,
    };
    let object = answered.into_object(&mut req);
    if stores && let Ok(mut s) = inner.stored.lock() {
        let usage = &object["usage"];
        let count = |v: &Value| v.as_u64().unwrap_or(0);
        let context_tokens = (count(&usage["input_tokens"]) + count(&usage["output_tokens"]))
            .saturating_sub(count(&usage["output_tokens_details"]["reasoning_tokens"]));
        s.insert(
            id,
            Stored {
                pending_calls,
                approvals,
                context_tokens,
            },
        );
    }
    if let Ok(mut usages) = inner.usages.lock() {
        usages.push(object["usage"].clone());
    }
    Ok((object, broken))
}

/// Whether the request asked for a streamed answer.
fn streams(req: &Value) -> bool {
    req.get("stream").and_then(Value::as_bool) == Some(true)
}

/// The response object as JSON, or streamed as the API's events when `stream`.
fn respond_as(inner: &Arc<Inner>, stream: bool, response: Value, broken: bool) -> Response {
    if !stream {
        return Json(response).into_response();
    }
    let pieces = match inner.options.stream_pieces {
        0 => 4,
        n => n,
    };
    let delay = inner.options.stream_delay;
    let nth = inner.streamed.fetch_add(1, Ordering::SeqCst);
    let broken = broken || (nth as usize) < inner.options.break_streams;
    let inner = inner.clone();
    let on_first_delta = Box::new(move || {
        if !inner.options.forget_requests
            && let Ok(mut t) = inner.first_deltas.lock()
        {
            t.push(std::time::Instant::now());
        }
    });
    stream::events(response, pieces, delay, broken, on_first_delta)
}
