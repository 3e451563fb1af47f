//! One attempt of a model call: as a stream of the client's own HTTP/2 connection, on one of
//! its own HTTP/1.1 connections, or through reqwest's client, and the reading of its answer,
//! whole or as events.
//!
//! Owns: the request's bytes on the wire and the answer's status, headers and body. Must
//! not: retry, or decide what a failure means beyond its kind (`refusal.rs`).

use super::body::Body;
use super::parse::parse_bytes;
use super::refusal::refusal;
use super::{
    AttemptError, EventSink, LlmClient, ModelResponse, WireRequest, h1conn, h2conn, stream,
    without_url,
};
use crate::secret::Secret;

/// A call's body as it goes out: the request's pieces as made (never copied on a stream or
/// a connection of our own), with `"stream": true` as their first member when the answer is
/// to be streamed.
#[derive(Debug)]
pub(super) struct Payload {
    body: WireRequest,
    streamed: bool,
}

impl Payload {
    pub(super) fn new(body: WireRequest, streamed: bool) -> Self {
        Self { body, streamed }
    }

    /// The bytes to send, as a piece to put in front (empty unless streamed) and the body's
    /// own (views of them, the first past its opening brace when streamed).
    pub(super) fn pieces(&self) -> [bytes::Bytes; 3] {
        let (head, first, skip, second) = self.layout();
        [
            bytes::Bytes::from_static(head),
            first.slice(skip..),
            second.clone(),
        ]
    }

    /// [`Self::pieces`] borrowed: what a connection of our own writes (a call waiting on its
    /// write holds three slices, not three more handles).
    pub(super) fn slices(&self) -> [&[u8]; 3] {
        let (head, first, skip, second) = self.layout();
        [head, &first[skip..], second]
    }

    /// The piece in front, the body's piece holding its opening brace with how many of its
    /// bytes to pass over, and the other piece.
    fn layout(&self) -> (&'static [u8], &bytes::Bytes, usize, &bytes::Bytes) {
        let [first, second] = self.body.pieces();
        // The opening brace is in the first piece that has bytes.
        let (first, second) = match first.is_empty() {
            true => (second, first),
            false => (first, second),
        };
        if !self.streamed || first.first() != Some(&b'{') {
            return (b"", first, 0, second);
        }
        let next = [&first[1..], &second[..]]
            .into_iter()
            .find_map(|piece| piece.trim_ascii_start().first().copied());
        let head: &'static [u8] = if next == Some(b'}') {
            b"{\"stream\":true"
        } else {
            b"{\"stream\":true,"
        };
        (head, first, 1, second)
    }

    /// The bytes in one piece (a copy unless the body is one piece, not streamed), for a
    /// client that takes one.
    pub(super) fn joined(&self) -> bytes::Bytes {
        match self.pieces() {
            // The piece with the opening brace comes first: a body in one piece is that one.
            [head, one, rest] if head.is_empty() && rest.is_empty() => one,
            pieces => pieces.concat().into(),
        }
    }

    /// How many bytes go out.
    fn len(&self) -> usize {
        self.slices().iter().map(|piece| piece.len()).sum()
    }
}

impl LlmClient {
    pub(super) async fn send_once(
        &self,
        payload: &Payload,
        traceparent: Option<String>,
        sink: Option<EventSink<'_>>,
    ) -> Result<ModelResponse, AttemptError> {
        // Held until the answer is read: the connection counts this call until then.
        let lease = self.http.lease();
        // On our own connections the call's whole time is held here (reqwest holds its own).
        let timed_out = |_| AttemptError::transient(TIMED_OUT.to_string());
        let sent = if let Some(link) = lease.link() {
            let on_stream = self.on_stream(link, payload, traceparent.as_deref(), sink);
            tokio::time::timeout(self.timeout, on_stream)
                .await
                .map_err(timed_out)??
        } else if let Some(pool) = lease.pool() {
            let on_connection = self.on_connection(pool, payload, traceparent.as_deref(), sink);
            let sent = tokio::time::timeout(self.timeout, on_connection).await;
            Some(sent.map_err(timed_out)?)
        } else {
            None
        };
        let (status, headers, body) = match sent {
            Some(answered) => return answered,
            None => self.pooled(lease.client(), payload, traceparent).await?,
        };
        Box::pin(self.read(status, &headers, body, sink)).await
    }

    /// The call as a stream of the lease's own connection: its answer (on that connection as
    /// HTTP/1.1 if the server chose so), or `None` when the server chose HTTP/1.1 and there
    /// are no HTTP/1.1 connections of our own to take the call (it goes through reqwest's).
    async fn on_stream(
        &self,
        link: &h2conn::Link,
        payload: &Payload,
        traceparent: Option<&str>,
        sink: Option<EventSink<'_>>,
    ) -> Result<Option<Result<ModelResponse, AttemptError>>, AttemptError> {
        let mut sender = match link.ready().await.map_err(unreachable)? {
            h2conn::Ready::Stream(sender) => sender,
            h2conn::Ready::Http1Chosen(io) => {
                self.http.note_http1_chosen();
                // The call goes on the connection that learnt the choice.
                let Some(pool) = self.http.pool() else {
                    return Ok(None);
                };
                let connection = pool.adopt(io);
                let sent = self.send_on(pool, connection, payload, traceparent, sink);
                return Ok(Some(sent.await));
            }
        };
        let key = self.api_key.as_ref().map(Secret::expose);
        let traceparent = traceparent.map(str::to_owned);
        let request = link
            .target()
            .request(payload.len(), key, traceparent)
            .map_err(unreachable)?;
        let (answer, mut out) = sender
            .send_request(request, false)
            .map_err(|e| unreachable(e.to_string()))?;
        // The body's own pieces go out, `"stream": true` in a piece of its own before them.
        // (The stream ends with the last piece: empty, for a body in one piece.)
        let [head, first, second] = payload.pieces();
        for piece in [head, first].into_iter().filter(|piece| !piece.is_empty()) {
            out.send_data(piece, false)
                .map_err(|e| unreachable(e.to_string()))?;
        }
        out.send_data(second, true)
            .map_err(|e| unreachable(e.to_string()))?;
        let (head, stream) = answer
            .await
            .map_err(|e| unreachable(e.to_string()))?
            .into_parts();
        let body = Body::Stream(stream);
        Ok(Some(
            Box::pin(self.read(head.status.as_u16(), &head.headers, body, sink)).await,
        ))
    }

    /// The call on one of the HTTP/1.1 connections of our own (taken for the call, given back
    /// once its answer is read).
    async fn on_connection(
        &self,
        pool: &std::sync::Arc<h1conn::Pool>,
        payload: &Payload,
        traceparent: Option<&str>,
        sink: Option<EventSink<'_>>,
    ) -> Result<ModelResponse, AttemptError> {
        let connection = pool.checkout().await.map_err(unreachable)?;
        self.send_on(pool, connection, payload, traceparent, sink)
            .await
    }

    /// The call on `connection`, one of `pool`'s.
    async fn send_on(
        &self,
        pool: &h1conn::Pool,
        mut connection: h1conn::Checkout,
        payload: &Payload,
        traceparent: Option<&str>,
        sink: Option<EventSink<'_>>,
    ) -> Result<ModelResponse, AttemptError> {
        let key = self.api_key.as_ref().map(Secret::expose);
        // The head is let go once sent: a waiting call holds its connection alone.
        let head = pool
            .target()
            .http1_head(payload.len(), key, traceparent)
            .map_err(unreachable)?;
        connection
            .send(&head, &payload.slices())
            .await
            .map_err(unreachable)?;
        drop(head);
        let (status, headers) = connection.answer().await.map_err(unreachable)?;
        let body = Body::Connection(connection);
        Box::pin(self.read(status, &headers, body, sink)).await
    }

    /// The call through reqwest's client: the answer's status, headers and body.
    async fn pooled(
        &self,
        client: &reqwest::Client,
        payload: &Payload,
        traceparent: Option<String>,
    ) -> Result<(u16, reqwest::header::HeaderMap, Body), AttemptError> {
        let mut req = client
            .post(self.endpoint.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(payload.joined());
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key.expose());
        }
        // The turn's trace goes on to the model server: same trace id, a span of its own.
        if let Some(traceparent) = traceparent {
            req = req.header(crate::trace::TRACEPARENT, traceparent);
        }
        let resp = req.send().await.map_err(|e| {
            AttemptError::transient(if e.is_timeout() {
                TIMED_OUT.to_string()
            } else {
                format!("could not reach the model server ({})", without_url(&e))
            })
        })?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        Ok((status, headers, Body::Pooled(resp)))
    }

    /// Reads an answer: streamed to `sink` when it is an event stream, whole otherwise.
    async fn read(
        &self,
        status: u16,
        headers: &reqwest::header::HeaderMap,
        body: Body,
        sink: Option<EventSink<'_>>,
    ) -> Result<ModelResponse, AttemptError> {
        let event_stream = headers
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if let Some(sink) = sink
            && event_stream
            && (200..300).contains(&status)
        {
            return stream::read(body, sink).await;
        }
        let bytes = body.whole().await.map_err(|cut| {
            AttemptError::transient(if cut.timed_out {
                "the model call timed out while reading the answer".to_string()
            } else {
                format!("the answer was cut off ({})", cut.message)
            })
        })?;
        if (200..300).contains(&status) {
            return parse_bytes(&bytes);
        }
        Err(refusal(status, headers, &bytes, sink.is_some()))
    }
}

/// A call that could not reach the model server, and why.
fn unreachable(e: String) -> AttemptError {
    AttemptError::transient(format!("could not reach the model server ({e})"))
}

/// What a call that ran out of time says.
const TIMED_OUT: &str = "the model call timed out";
