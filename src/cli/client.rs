//! A client of the HTTP API for the CLI commands (`submit`, `status`, `watch`, `batch`,
//! `index --url`): what a remote user would use, nothing more.
//!
//! Owns: requests to a running front door and reading its answers (JSON, NDJSON, Server-Sent
//! Events). Must not: reach RabbitMQ or Redis directly.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use backon::{BackoffBuilder as _, ExponentialBuilder};
use futures_util::StreamExt as _;
use serde_json::Value;

/// A line on stderr about the connection, on a line of its own under a redrawn progress bar.
fn note(text: &str) {
    use std::io::IsTerminal as _;
    let lead = if std::io::stderr().is_terminal() {
        "\n"
    } else {
        ""
    };
    eprintln!("{lead}{text}");
}

/// A small client of the HTTP API.
#[derive(Debug, Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// How long a request keeps being sent again while the API cannot be reached or answers
    /// that it is unavailable (zero: once).
    patience: Duration,
}

/// The longest pause between two tries of an unavailable API, whatever its `Retry-After`.
pub const LONGEST_PAUSE: Duration = Duration::from_secs(10);

/// Pauses between tries of an API that is away: from a quarter of a second, growing, to
/// [`LONGEST_PAUSE`], with jitter so that many clients do not come back at once.
pub fn pauses() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(250))
        .with_max_delay(LONGEST_PAUSE)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Why a try of a request is worth another one: the API could not be reached (refused,
/// reset, timed out: a front door restarting, a proxy between deployments), or answered that it
/// or what it needs is unavailable for now. `None` for an answer, or a request that cannot be
/// sent at all.
fn transient(outcome: &reqwest::Result<reqwest::Response>) -> Option<String> {
    match outcome {
        Ok(resp) => matches!(resp.status().as_u16(), 502..=504)
            .then(|| format!("answers {}", resp.status())),
        Err(e) if e.is_builder() || e.is_redirect() => None,
        Err(e) => Some(format!("cannot be reached ({})", root_cause(e))),
    }
}

/// The innermost cause of an error: reqwest's own message ("error sending request") says
/// less than the refused connection under it.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    cause.to_string()
}

/// The pause an answer asks for in its `Retry-After` (seconds), if it does.
fn retry_after(outcome: &reqwest::Result<reqwest::Response>) -> Option<Duration> {
    let resp = outcome.as_ref().ok()?;
    let secs: u64 = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs))
}

impl ApiClient {
    /// A client of the API at `base` (e.g. `http://127.0.0.1:8080`).
    pub fn new(base: &str, token: Option<String>) -> Self {
        Self {
            http: {
                aptix_worker::tls::install_crypto_provider();
                reqwest::Client::new()
            },
            base: base.trim_end_matches('/').to_string(),
            token,
            patience: Duration::ZERO,
        }
    }

    /// This client, sending a request again for up to `patience` while the API cannot be
    /// reached or answers 502, 503 or 504, with pauses growing from a quarter of a second to
    /// ten (or as its `Retry-After` asks), saying so on stderr. Only for requests that are
    /// safe to send twice: reads, and submissions whose turns are named by their ids (a turn
    /// sent again with the same ids and payload is recognised, not run twice).
    pub fn with_patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// Sends `req`, again while the failure is [`transient`] and the client's patience lasts;
    /// the last outcome. A request whose body cannot be copied is sent once.
    async fn respond(&self, req: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        let started = Instant::now();
        let mut pauses = pauses();
        let mut waiting_since: Option<Instant> = None;
        loop {
            let Some(attempt) = req.try_clone() else {
                return req
                    .send()
                    .await
                    .with_context(|| format!("cannot reach the API at {}", self.base));
            };
            let outcome = attempt.send().await;
            let Some(why) = transient(&outcome) else {
                if let Some(since) = waiting_since {
                    note(&format!(
                        "the API at {} answers again (after {:.0} s)",
                        self.base,
                        since.elapsed().as_secs_f64()
                    ));
                }
                return outcome.with_context(|| format!("cannot reach the API at {}", self.base));
            };
            let pause = retry_after(&outcome)
                .or_else(|| pauses.next())
                .unwrap_or(LONGEST_PAUSE)
                .min(LONGEST_PAUSE);
            if started.elapsed() + pause > self.patience {
                let gave_up = match waiting_since {
                    Some(_) => format!(" (gave up after {:.0} s)", started.elapsed().as_secs_f64()),
                    None => String::new(),
                };
                return outcome
                    .with_context(|| format!("cannot reach the API at {}{gave_up}", self.base));
            }
            if waiting_since.is_none() {
                waiting_since = Some(Instant::now());
                note(&format!(
                    "the API at {} {why}; trying again for up to {} s",
                    self.base,
                    self.patience.as_secs()
                ));
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// The API's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A request to `path` with the bearer token, if any.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Sends `req`; the HTTP status and the JSON answer.
    pub async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<(u16, Value)> {
        let resp = self.respond(req).await?;
        let status = resp.status().as_u16();
        let body = resp
            .json()
            .await
            .context("the API answered with something that is not JSON")?;
        Ok((status, body))
    }

    /// POSTs a JSON body; returns the HTTP status and the JSON answer.
    pub async fn post(&self, path: &str, body: Vec<u8>) -> anyhow::Result<(u16, Value)> {
        self.send(
            self.request(reqwest::Method::POST, path)
                .header("content-type", "application/json")
                .body(body),
        )
        .await
    }

    /// GETs a JSON answer.
    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, Value)> {
        self.send(self.request(reqwest::Method::GET, path)).await
    }

    /// POSTs `body` and calls `on_line` with each line of the NDJSON answer as it arrives.
    pub async fn post_ndjson(
        &self,
        path: &str,
        body: Vec<u8>,
        mut on_line: impl FnMut(Value),
    ) -> anyhow::Result<u16> {
        let resp = self
            .request(reqwest::Method::POST, path)
            .body(body)
            .send()
            .await
            .with_context(|| format!("cannot reach the API at {}", self.base))?;
        let status = resp.status().as_u16();
        let mut stream = resp.bytes_stream();
        let mut pending = Vec::new();
        while let Some(chunk) = stream.next().await {
            pending.extend_from_slice(&chunk.context("the answer stream broke")?);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                on_line(serde_json::from_slice(&line).context("an answer line is not JSON")?);
            }
        }
        if !pending.iter().all(u8::is_ascii_whitespace) {
            on_line(serde_json::from_slice(&pending).context("an answer line is not JSON")?);
        }
        Ok(status)
    }

    /// Subscribes to a session's Server-Sent Events, from after `last_event_id` when
    /// reconnecting. The server answers once it has subscribed, so nothing published
    /// afterwards is missed. `Err(Lost)` when the API cannot be reached or answers 502, 503 or
    /// 504 (worth trying again); any other refusal is an error.
    pub async fn subscribe(
        &self,
        session_id: &str,
        last_event_id: Option<&str>,
    ) -> anyhow::Result<Result<EventStream, Lost>> {
        let mut req = self
            .request(
                reqwest::Method::GET,
                &format!("/v1/sessions/{session_id}/events"),
            )
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let outcome = req.send().await;
        if let Some(why) = transient(&outcome) {
            return Ok(Err(Lost(why)));
        }
        let resp = outcome.with_context(|| format!("cannot reach the API at {}", self.base))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            bail!("the API refused the subscription ({status}): {body}");
        }
        Ok(Ok(EventStream {
            bytes: Box::pin(resp.bytes_stream()),
            decoder: SseDecoder::default(),
            ready: std::collections::VecDeque::new(),
        }))
    }

    /// GETs an NDJSON answer as one JSON value per line.
    pub async fn get_ndjson(&self, path: &str) -> anyhow::Result<Vec<Value>> {
        let resp = self
            .respond(self.request(reqwest::Method::GET, path))
            .await?;
        let status = resp.status();
        let text = resp.text().await.context("reading the answer")?;
        if !status.is_success() {
            bail!("GET {path} answered {status}: {text}");
        }
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).context("an answer line is not JSON"))
            .collect()
    }
}

/// Why a subscription ended, or could not start, in a way worth trying again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost(pub String);

/// A session's events as they arrive.
pub struct EventStream {
    bytes:
        std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    decoder: SseDecoder,
    ready: std::collections::VecDeque<SseEvent>,
}

impl EventStream {
    /// The next event; `Err(Lost)` when the stream broke or the server ended it (a front door
    /// shutting down ends its streams).
    pub async fn next(&mut self) -> Result<SseEvent, Lost> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Ok(event);
            }
            match self.bytes.next().await {
                Some(Ok(chunk)) => self.ready.extend(self.decoder.push(&chunk)),
                Some(Err(e)) => {
                    return Err(Lost(format!("the event stream broke ({})", root_cause(&e))));
                }
                None => return Err(Lost("the event stream ended".into())),
            }
        }
    }
}

/// One Server-Sent Event: its name (`message` when it has none), the stream's last event id
/// when it was dispatched, and its data (its `data:` lines joined by newlines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub name: String,
    pub id: Option<String>,
    pub data: String,
}

/// Reads Server-Sent Events from a byte stream that the network cuts anywhere, even inside a
/// multi-byte character: bytes are kept until a line is complete, and only whole lines are
/// decoded. Yields each event with the last event id seen so far (an `id:` line sets it until
/// the next one, as the standard says); other fields and comments (keep-alives) are skipped.
#[derive(Debug, Default)]
pub struct SseDecoder {
    pending: Vec<u8>,
    event: Option<String>,
    data: Option<String>,
    last_id: Option<String>,
}

impl SseDecoder {
    /// Feeds bytes as they arrived; returns every event they completed.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let mut line: Vec<u8> = self.pending.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            // A line is whole, so it splits no character; invalid UTF-8 is the server's fault.
            let line = String::from_utf8_lossy(&line);
            if line.is_empty() {
                let event = self.event.take();
                if let Some(data) = self.data.take() {
                    events.push(SseEvent {
                        name: event.unwrap_or_else(|| "message".into()),
                        id: self.last_id.clone(),
                        data,
                    });
                }
            } else if let Some(value) = line.strip_prefix("event:") {
                self.event = Some(value.trim_start().to_string());
            } else if let Some(value) = line.strip_prefix("id:") {
                // An id with a NUL in it is ignored, as the standard says.
                let value = value.strip_prefix(' ').unwrap_or(value);
                if !value.contains('\0') {
                    self.last_id = Some(value.to_string());
                }
            } else if let Some(value) = line.strip_prefix("data:") {
                let value = value.strip_prefix(' ').unwrap_or(value);
                match &mut self.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(value);
                    }
                    None => self.data = Some(value.to_string()),
                }
            }
        }
        events
    }
}

#[cfg(test)]
mod sse_tests {
    use super::{SseDecoder, SseEvent};

    fn event(name: &str, id: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            name: name.into(),
            id: id.map(Into::into),
            data: data.into(),
        }
    }

    #[test]
    fn characters_split_across_chunks_arrive_whole() {
        let stream = "event: turn\nid: t1\ndata: {\"instruction\":\"Grüße, 你好 🚀\"}\n\n: keep-alive\n\ndata: a\ndata: b\r\n\r\n";
        let mut decoder = SseDecoder::default();
        let mut events = Vec::new();
        for byte in stream.as_bytes() {
            events.extend(decoder.push(std::slice::from_ref(byte)));
        }
        // The id stays the stream's last one until another `id:` line.
        assert_eq!(
            events,
            vec![
                event("turn", Some("t1"), "{\"instruction\":\"Grüße, 你好 🚀\"}"),
                event("message", Some("t1"), "a\nb")
            ]
        );
    }

    #[test]
    fn an_unfinished_event_is_not_yielded() {
        let mut decoder = SseDecoder::default();
        assert!(decoder.push(b"data: half").is_empty());
        assert!(decoder.push(b"\n").is_empty());
        assert_eq!(decoder.push(b"\n"), vec![event("message", None, "half")]);
        assert_eq!(
            decoder.push(b"id: t2:4\nevent: delta\ndata: x\n\n"),
            vec![event("delta", Some("t2:4"), "x")]
        );
    }
}

#[cfg(test)]
mod patience_tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use axum::http::StatusCode;
    use axum::response::IntoResponse as _;

    use super::ApiClient;

    /// An API whose first `unavailable` answers are `503` with `Retry-After: 1`, then `200`;
    /// its address and the count of requests it got.
    async fn flaky_api(unavailable: usize) -> (String, Arc<AtomicUsize>) {
        let seen = Arc::new(AtomicUsize::new(0));
        let count = seen.clone();
        let app = axum::Router::new().route(
            "/x",
            axum::routing::get(move || {
                let n = count.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < unavailable {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            [("retry-after", "1")],
                            r#"{"successful":false}"#,
                        )
                            .into_response()
                    } else {
                        (StatusCode::OK, r#"{"successful":true}"#).into_response()
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (base, seen)
    }

    #[tokio::test]
    async fn a_patient_client_waits_out_503s_as_retry_after_asks() {
        let (base, seen) = flaky_api(2).await;
        let client = ApiClient::new(&base, None).with_patience(Duration::from_secs(30));
        let started = Instant::now();
        let (status, body) = client.get("/x").await.unwrap();
        assert_eq!((status, body["successful"].as_bool()), (200, Some(true)));
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        // Two pauses of the one second each answer asked for, not the quarter second the
        // client's own backoff starts with.
        assert!(
            started.elapsed() >= Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn without_patience_or_past_it_the_503_is_the_answer() {
        let (base, seen) = flaky_api(usize::MAX).await;
        let (status, _) = ApiClient::new(&base, None).get("/x").await.unwrap();
        assert_eq!((status, seen.load(Ordering::SeqCst)), (503, 1));
        // A patience shorter than the pause asked for: tried once more at most, then given up.
        let client = ApiClient::new(&base, None).with_patience(Duration::from_millis(1500));
        let (status, _) = client.get("/x").await.unwrap();
        assert_eq!(status, 503);
        assert_eq!(seen.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_patient_client_gives_up_on_an_api_nobody_answers_for_saying_how_long_it_tried() {
        // A port nothing listens on: every try is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = ApiClient::new(&format!("http://127.0.0.1:{port}"), None)
            .with_patience(Duration::from_secs(1));
        let err = client.get("/x").await.unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("cannot reach the API") && text.contains("gave up after"),
            "{text}"
        );
    }
}
