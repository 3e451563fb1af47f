//! A client of the HTTP API for the CLI commands (`submit`, `status`, `watch`, `batch`,
//! `index --url`): what a remote user would use, nothing more.
//!
//! Owns: requests to a running front door and reading its answers (JSON, NDJSON, Server-Sent
//! Events). Must not: reach RabbitMQ or Redis directly.

use anyhow::{Context as _, bail};
use futures_util::StreamExt as _;
use serde_json::Value;

/// A small client of the HTTP API.
#[derive(Debug, Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
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
        }
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
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach the API at {}", self.base))?;
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

    /// Follows a session's Server-Sent Events, calling `on_event` with each event's name and
    /// data until the stream ends or `on_event` returns `false`. `on_subscribed` runs once the
    /// server has subscribed (it answers only then), so nothing published afterwards is missed.
    pub async fn watch(
        &self,
        session_id: &str,
        on_subscribed: impl FnOnce(),
        mut on_event: impl FnMut(&str, &str) -> bool,
    ) -> anyhow::Result<()> {
        let resp = self
            .request(
                reqwest::Method::GET,
                &format!("/v1/sessions/{session_id}/events"),
            )
            .header("accept", "text/event-stream")
            .send()
            .await
            .with_context(|| format!("cannot reach the API at {}", self.base))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            bail!("the API refused the subscription ({status}): {body}");
        }
        on_subscribed();
        let mut stream = resp.bytes_stream();
        let mut decoder = SseDecoder::default();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.context("the event stream broke")?;
            for (event, data) in decoder.push(&chunk) {
                if !on_event(&event, &data) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// GETs an NDJSON answer as one JSON value per line.
    pub async fn get_ndjson(&self, path: &str) -> anyhow::Result<Vec<Value>> {
        let resp = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .with_context(|| format!("cannot reach the API at {}", self.base))?;
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

/// Reads Server-Sent Events from a byte stream that the network cuts anywhere, even inside a
/// multi-byte character: bytes are kept until a line is complete, and only whole lines are
/// decoded. Yields each event's name (`message` when it has none) and data (its `data:` lines
/// joined by newlines); other fields and comments (keep-alives) are skipped.
#[derive(Debug, Default)]
pub struct SseDecoder {
    pending: Vec<u8>,
    event: Option<String>,
    data: Option<String>,
}

impl SseDecoder {
    /// Feeds bytes as they arrived; returns the name and data of every event they completed.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<(String, String)> {
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
                    events.push((event.unwrap_or_else(|| "message".into()), data));
                }
            } else if let Some(value) = line.strip_prefix("event:") {
                self.event = Some(value.trim_start().to_string());
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
    use super::SseDecoder;

    #[test]
    fn characters_split_across_chunks_arrive_whole() {
        let stream = "event: turn\nid: t1\ndata: {\"instruction\":\"Grüße, 你好 🚀\"}\n\n: keep-alive\n\ndata: a\ndata: b\r\n\r\n";
        let mut decoder = SseDecoder::default();
        let mut events = Vec::new();
        for byte in stream.as_bytes() {
            events.extend(decoder.push(std::slice::from_ref(byte)));
        }
        assert_eq!(
            events,
            vec![
                (
                    "turn".to_string(),
                    "{\"instruction\":\"Grüße, 你好 🚀\"}".to_string()
                ),
                ("message".to_string(), "a\nb".to_string())
            ]
        );
    }

    #[test]
    fn an_unfinished_event_is_not_yielded() {
        let mut decoder = SseDecoder::default();
        assert!(decoder.push(b"data: half").is_empty());
        assert!(decoder.push(b"\n").is_empty());
        assert_eq!(
            decoder.push(b"\n"),
            vec![("message".to_string(), "half".to_string())]
        );
    }
}
