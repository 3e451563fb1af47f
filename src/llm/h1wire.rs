//! HTTP/1.1 on the wire for the model client's own connections (`h1conn.rs`): a request
//! written as its head and the body's pieces, an answer's head parsed and its body read as the
//! server framed it (a length, chunks, or up to the connection's close).
//!
//! A connection holds no buffer while it waits for its answer (the reading is
//! [`crate::h1`]'s, shared with the API's own connections). (hyper's connection kept an 8 KiB
//! read and an 8 KiB write buffer for its whole life, most of what a turn waiting on its model
//! cost the worker over HTTP/1.1.)
//!
//! Owns: writing a request, parsing an answer's head. Must not: open, pool or choose connections; decide what an
//! answer means.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue};
use tokio::io::{AsyncWriteExt as _, ReadBuf};

use crate::h1::{Framing, Peer, Reader, Wire};

/// The most an answer's head (status line and headers) may take.
const MAX_HEAD: usize = 64 * 1024;
/// The most headers an answer may carry.
const MAX_HEADERS: usize = 100;

/// One HTTP/1.1 connection: a call at a time, its answer read through it.
pub(super) struct Conn<W> {
    reader: Reader<W>,
    state: State,
    /// Whether the server lets the connection carry another call after this answer.
    keep_alive: bool,
}

impl<W> std::fmt::Debug for Conn<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("state", &self.state)
            .field("reader", &self.reader)
            .field("keep_alive", &self.keep_alive)
            .finish()
    }
}

/// Where a connection is in its call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between calls: the last answer was read to its end (or none was asked for).
    Idle,
    /// A request went out (or began to); its answer's head is not read.
    Sent,
    /// The answer's body is being read.
    Body,
    /// Not to be used again: the answer broke off, or did not follow HTTP/1.1.
    Broken,
}

impl<W: Wire> Conn<W> {
    pub(super) fn new(wire: W) -> Self {
        Self {
            reader: Reader::new(wire, Peer::Server),
            state: State::Idle,
            keep_alive: true,
        }
    }

    /// Whether the connection may carry another call: its last answer was read to its end,
    /// nothing came after it, and the server did not say it would close.
    pub(super) fn between_calls(&self) -> bool {
        self.state == State::Idle && self.keep_alive && self.reader.buffered().is_empty()
    }

    /// Whether an idle connection is still open, looked at without waiting: a server that
    /// closed it (or sent bytes no call asked for) makes it useless.
    pub(super) fn still_open(&mut self) -> bool {
        let mut probe = [0u8; 1];
        let mut probe = ReadBuf::new(&mut probe);
        let mut cx = Context::from_waker(Waker::noop());
        matches!(
            Pin::new(self.reader.wire_mut()).poll_read(&mut cx, &mut probe),
            Poll::Pending
        )
    }

    /// Writes a request: its `head` (ending in the blank line), then the body's pieces.
    pub(super) async fn send(&mut self, head: &[u8], body: &[&[u8]; 3]) -> std::io::Result<()> {
        self.state = State::Sent;
        let [a, b, c] = *body;
        let mut out = bytes::Buf::chain(bytes::Buf::chain(bytes::Buf::chain(head, a), b), c);
        let wire = self.reader.wire_mut();
        wire.write_all_buf(&mut out).await?;
        wire.flush().await
    }

    /// Reads the answer's head: its status and headers (an informational `1xx` answer before
    /// it is passed over).
    pub(super) async fn answer(&mut self) -> Result<(u16, HeaderMap), String> {
        let read = self.read_head().await;
        if read.is_err() {
            self.state = State::Broken;
        }
        read
    }

    async fn read_head(&mut self) -> Result<(u16, HeaderMap), String> {
        loop {
            let head = loop {
                if let Some(head) = parse_head(self.reader.buffered())? {
                    break head;
                }
                let held = self.reader.buffered().len();
                if held >= MAX_HEAD {
                    return Err(format!("the answer's head is over {MAX_HEAD} bytes"));
                }
                let read = self.reader.fill(crate::h1::HEAD_READ).await;
                if read.map_err(|e| e.to_string())? == 0 {
                    return Err(if held == 0 {
                        "the server closed the connection without answering".to_string()
                    } else {
                        "the server closed the connection within the answer's head".to_string()
                    });
                }
            };
            self.reader.consume(head.len);
            if head.status == 101 {
                return Err("the server switched protocols, which no call asked for".into());
            }
            if head.status < 200 {
                continue;
            }
            self.keep_alive = head.keep_alive;
            self.reader.begin(head.body);
            self.state = if self.reader.body_done() {
                State::Idle
            } else {
                State::Body
            };
            return Ok((head.status, head.headers));
        }
    }

    /// The body's next piece as it arrives, `None` at its end.
    pub(super) async fn piece(&mut self) -> Result<Option<Bytes>, String> {
        if self.state != State::Body {
            return Ok(None);
        }
        match self.reader.piece().await {
            Ok(None) => {
                self.state = State::Idle;
                Ok(None)
            }
            Ok(piece) => Ok(piece),
            Err(e) => {
                self.state = State::Broken;
                Err(e)
            }
        }
    }
}

/// An answer's head, parsed.
struct Head {
    status: u16,
    headers: HeaderMap,
    /// How many bytes it took.
    len: usize,
    /// How its body is framed.
    body: Framing,
    keep_alive: bool,
}

/// The head at the start of `buf`, `None` while it is not all there.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, String> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut fields);
    let len = match response.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("the answer's head is not valid HTTP/1.1 ({e})")),
    };
    let status = response.code.unwrap_or_default();
    let mut headers = HeaderMap::with_capacity(response.headers.len());
    let mut length: Option<u64> = None;
    let mut chunked = None;
    // HTTP/1.0 closes unless the server says otherwise; HTTP/1.1 keeps the connection unless.
    let mut keep_alive = response.version == Some(1);
    for field in response.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| format!("the answer's header {:?} is not valid", field.name))?;
        let value = HeaderValue::from_bytes(field.value)
            .map_err(|_| format!("the answer's header {:?} has a value not valid", field.name))?;
        if name == CONTENT_LENGTH {
            let n = value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or("the answer's content-length is not a number")?;
            if length.is_some_and(|l| l != n) {
                return Err("the answer has two different content-lengths".into());
            }
            length = Some(n);
        } else if name == TRANSFER_ENCODING {
            // Chunked only when it is the last coding; a body coded otherwise runs to the close.
            let last = value
                .as_bytes()
                .rsplit(|b| *b == b',')
                .next()
                .unwrap_or(b"");
            chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name == CONNECTION {
            for token in value.as_bytes().split(|b| *b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && response.version == Some(0) {
                    keep_alive = true;
                }
            }
        }
        headers.append(name, value);
    }
    // RFC 9112 §6.3: no body for 1xx, 204 and 304; then transfer-encoding over content-length
    // (a server that sends both closes after); else up to the close.
    let body = if status < 200 || status == 204 || status == 304 {
        Framing::Empty
    } else if let Some(chunked) = chunked {
        keep_alive &= chunked && length.is_none();
        if chunked {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else if let Some(length) = length {
        Framing::Length(length)
    } else {
        keep_alive = false;
        Framing::UntilClose
    };
    Ok(Some(Head {
        status,
        headers,
        len,
        body,
        keep_alive,
    }))
}

#[cfg(test)]
mod tests;
