//! HTTP/1.1 on the wire for the model client's own connections (`h1conn.rs`): a request
//! written as its head and the body's pieces, an answer's head parsed and its body read as the
//! server framed it (a length, chunks, or up to the connection's close).
//!
//! A connection holds no buffer while it waits for its answer: room for the server's bytes is
//! made when they are there to read, and let go once the last of them is handed on. (hyper's
//! connection kept an 8 KiB read and an 8 KiB write buffer for its whole life, most of what a
//! turn waiting on its model cost the worker over HTTP/1.1.)
//!
//! Owns: framing and parsing. Must not: open, pool or choose connections; decide what an
//! answer means.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};

/// The most an answer's head (status line and headers) may take.
const MAX_HEAD: usize = 64 * 1024;
/// The most headers an answer may carry.
const MAX_HEADERS: usize = 100;
/// The most a chunk's size line, or the trailers after the last chunk, may take.
const MAX_LINE: usize = 8 * 1024;
/// How much room one read makes for a head, and at most for a body.
const HEAD_READ: usize = 4 * 1024;
const BODY_READ: usize = 16 * 1024;

/// What a connection reads from and writes to.
pub(super) trait Wire: AsyncRead + AsyncWrite + Unpin + Send {
    /// Resolves once bytes (or the end) can be read, so that no room is made for them before;
    /// a wire that cannot tell (TLS may hold bytes already read) resolves at once.
    fn readable(&self) -> impl Future<Output = std::io::Result<()>> + Send;
}

/// One HTTP/1.1 connection: a call at a time, its answer read through it.
pub(super) struct Conn<W> {
    wire: W,
    /// Bytes read and not yet handed on; no allocation while there are none.
    buf: BytesMut,
    state: State,
    /// Whether the server lets the connection carry another call after this answer.
    keep_alive: bool,
}

impl<W> std::fmt::Debug for Conn<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("state", &self.state)
            .field("buffered", &self.buf.len())
            .field("keep_alive", &self.keep_alive)
            .finish_non_exhaustive()
    }
}

/// Where a connection is in its call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between calls: the last answer was read to its end (or none was asked for).
    Idle,
    /// A request went out (or began to); its answer's head is not read.
    Sent,
    /// The body: this many bytes more.
    Length(u64),
    /// A chunked body: the next chunk's size line; this many bytes of a chunk, then the line
    /// end after it; the trailers after the last chunk.
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailers,
    /// The body runs until the server closes the connection.
    UntilClose,
    /// Not to be used again: the answer broke off, or did not follow HTTP/1.1.
    Broken,
}

impl<W: Wire> Conn<W> {
    pub(super) fn new(wire: W) -> Self {
        Self {
            wire,
            buf: BytesMut::new(),
            state: State::Idle,
            keep_alive: true,
        }
    }

    /// Whether the connection may carry another call: its last answer was read to its end,
    /// nothing came after it, and the server did not say it would close.
    pub(super) fn between_calls(&self) -> bool {
        self.state == State::Idle && self.keep_alive && self.buf.is_empty()
    }

    /// Whether an idle connection is still open, looked at without waiting: a server that
    /// closed it (or sent bytes no call asked for) makes it useless.
    pub(super) fn still_open(&mut self) -> bool {
        let mut probe = [0u8; 1];
        let mut probe = ReadBuf::new(&mut probe);
        let mut cx = Context::from_waker(Waker::noop());
        matches!(
            Pin::new(&mut self.wire).poll_read(&mut cx, &mut probe),
            Poll::Pending
        )
    }

    /// Writes a request: its `head` (ending in the blank line), then the body's pieces.
    pub(super) async fn send(&mut self, head: &[u8], body: &[&[u8]; 3]) -> std::io::Result<()> {
        self.state = State::Sent;
        let [a, b, c] = *body;
        let mut out = bytes::Buf::chain(bytes::Buf::chain(bytes::Buf::chain(head, a), b), c);
        self.wire.write_all_buf(&mut out).await?;
        self.wire.flush().await
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
                if let Some(head) = parse_head(&self.buf)? {
                    break head;
                }
                if self.buf.len() >= MAX_HEAD {
                    return Err(format!("the answer's head is over {MAX_HEAD} bytes"));
                }
                if self.fill(HEAD_READ).await.map_err(|e| e.to_string())? == 0 {
                    return Err(if self.buf.is_empty() {
                        "the server closed the connection without answering".to_string()
                    } else {
                        "the server closed the connection within the answer's head".to_string()
                    });
                }
            };
            self.buf.advance(head.len);
            self.let_go();
            if head.status == 101 {
                return Err("the server switched protocols, which no call asked for".into());
            }
            if head.status < 200 {
                continue;
            }
            self.keep_alive = head.keep_alive;
            self.state = head.body;
            return Ok((head.status, head.headers));
        }
    }

    /// The body's next piece as it arrives, `None` at its end.
    pub(super) async fn piece(&mut self) -> Result<Option<Bytes>, String> {
        let read = self.read_piece().await;
        if read.is_err() {
            self.state = State::Broken;
        }
        read
    }

    async fn read_piece(&mut self) -> Result<Option<Bytes>, String> {
        loop {
            match self.state {
                State::Idle | State::Sent | State::Broken => return Ok(None),
                State::Length(0) => {
                    self.state = State::Idle;
                    return Ok(None);
                }
                State::Length(left) => {
                    let piece = self.take_up_to(left).await?;
                    let left = left - piece.len() as u64;
                    self.state = if left == 0 {
                        State::Idle
                    } else {
                        State::Length(left)
                    };
                    return Ok(Some(piece));
                }
                State::ChunkSize => match httparse::parse_chunk_size(&self.buf) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        self.buf.advance(used);
                        self.let_go();
                        self.state = if size == 0 {
                            State::Trailers
                        } else {
                            State::ChunkData(size)
                        };
                    }
                    Ok(httparse::Status::Partial) => self.more("a chunk's size line").await?,
                    Err(_) => return Err("a chunk's size line is not valid".into()),
                },
                State::ChunkData(left) => {
                    let piece = self.take_up_to(left).await?;
                    let left = left - piece.len() as u64;
                    self.state = if left == 0 {
                        State::ChunkEnd
                    } else {
                        State::ChunkData(left)
                    };
                    return Ok(Some(piece));
                }
                State::ChunkEnd => {
                    if self.buf.len() < 2 {
                        self.more("a chunk's end").await?;
                    } else if self.buf.starts_with(b"\r\n") {
                        self.buf.advance(2);
                        self.let_go();
                        self.state = State::ChunkSize;
                    } else {
                        return Err("a chunk is longer than its size says".into());
                    }
                }
                State::Trailers => match self.buf.windows(2).position(|w| w == b"\r\n") {
                    Some(0) => {
                        self.buf.advance(2);
                        self.state = State::Idle;
                        self.let_go();
                        return Ok(None);
                    }
                    // A trailer carries nothing an answer needs.
                    Some(end) => {
                        self.buf.advance(end + 2);
                        self.let_go();
                    }
                    None => self.more("the trailers").await?,
                },
                State::UntilClose => {
                    if self.buf.is_empty()
                        && self.fill(BODY_READ).await.map_err(|e| e.to_string())? == 0
                    {
                        self.state = State::Idle;
                        self.keep_alive = false;
                        return Ok(None);
                    }
                    let piece = self.buf.split().freeze();
                    self.let_go();
                    return Ok(Some(piece));
                }
            }
        }
    }

    /// Up to `left` bytes of the body, reading first if none are held.
    async fn take_up_to(&mut self, left: u64) -> Result<Bytes, String> {
        if self.buf.is_empty() {
            let room = usize::try_from(left).map_or(BODY_READ, |left| left.min(BODY_READ));
            if self.fill(room).await.map_err(|e| e.to_string())? == 0 {
                return Err("the server closed the connection within the answer's body".into());
            }
        }
        let n = usize::try_from(left).map_or(self.buf.len(), |left| left.min(self.buf.len()));
        let piece = self.buf.split_to(n).freeze();
        self.let_go();
        Ok(piece)
    }

    /// Reads more of a line that `what` needs whole (bounded).
    async fn more(&mut self, what: &str) -> Result<(), String> {
        if self.buf.len() >= MAX_LINE {
            return Err(format!("{what} is over {MAX_LINE} bytes"));
        }
        match self.fill(HEAD_READ).await.map_err(|e| e.to_string())? {
            0 => Err(format!("the server closed the connection within {what}")),
            _ => Ok(()),
        }
    }

    /// Reads what the server sent, making room for up to `room` bytes once there is something
    /// to read; 0 at the connection's end.
    async fn fill(&mut self, room: usize) -> std::io::Result<usize> {
        if self.buf.capacity() == self.buf.len() {
            self.wire.readable().await?;
            self.buf.reserve(room);
        }
        self.wire.read_buf(&mut self.buf).await
    }

    /// Lets go of the read buffer once every byte of it was handed on or passed over (the
    /// pieces keep what they hold; the room after them is not kept while the connection waits,
    /// for its answer or, in a stream, for the next chunk).
    fn let_go(&mut self) {
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
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
    body: State,
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
        State::Idle
    } else if let Some(chunked) = chunked {
        keep_alive &= chunked && length.is_none();
        if chunked {
            State::ChunkSize
        } else {
            State::UntilClose
        }
    } else if let Some(length) = length {
        State::Length(length)
    } else {
        keep_alive = false;
        State::UntilClose
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
