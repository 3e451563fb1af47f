//! Bytes off an HTTP/1.1 connection: held in a buffer only while there are some, and a body
//! read as its sender framed it.
//!
//! A connection holds no buffer while it waits: room for the peer's bytes is made when they
//! are there to read, and let go once the last of them is handed on. (hyper kept an 8 KiB read
//! and an 8 KiB write buffer for a connection's whole life, on either end: most of what a
//! waiting call cost.)

use bytes::{Buf as _, Bytes, BytesMut};
use tokio::io::AsyncReadExt as _;

use super::Wire;

/// The most a chunk's size line, or the trailers after the last chunk, may take.
pub(crate) const MAX_LINE: usize = 8 * 1024;
/// How much room one read makes for a head or a line, and at most for a body.
pub(crate) const HEAD_READ: usize = 4 * 1024;
const BODY_READ: usize = 16 * 1024;

/// Who is at the other end, for what an error says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    /// We are the client: the peer answers.
    Server,
    /// We are the server: the peer asks.
    Client,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Self::Server => "the server",
            Self::Client => "the client",
        }
    }

    fn body(self) -> &'static str {
        match self {
            Self::Server => "the answer's body",
            Self::Client => "the request's body",
        }
    }
}

/// How a message's body is framed (RFC 9112 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body.
    Empty,
    /// This many bytes.
    Length(u64),
    /// Chunks, up to the last (empty) one and the trailers after it.
    Chunked,
    /// Up to the connection's close (an answer only).
    UntilClose,
}

/// Where a body's reading is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// Read to its end (or there was none).
    Done,
    /// This many bytes more.
    Length(u64),
    /// The next chunk's size line; this many bytes of a chunk, then the line end after it;
    /// the trailers after the last chunk.
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailers,
    /// Until the peer closes the connection.
    UntilClose,
}

/// A connection's reading side: the bytes read and not yet handed on, and the body being read.
pub(crate) struct Reader<W> {
    wire: W,
    /// No allocation while there are none.
    buf: BytesMut,
    body: Progress,
    peer: Peer,
}

impl<W> std::fmt::Debug for Reader<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("body", &self.body)
            .field("buffered", &self.buf.len())
            .finish_non_exhaustive()
    }
}

impl<W: Wire> Reader<W> {
    pub(crate) fn new(wire: W, peer: Peer) -> Self {
        Self {
            wire,
            buf: BytesMut::new(),
            body: Progress::Done,
            peer,
        }
    }

    pub(crate) fn wire(&self) -> &W {
        &self.wire
    }

    pub(crate) fn wire_mut(&mut self) -> &mut W {
        &mut self.wire
    }

    /// The bytes read and not yet handed on.
    pub(crate) fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// The room the buffer holds (none while nothing is buffered).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Passes over the first `n` buffered bytes (a head parsed), letting the buffer go if
    /// nothing is left in it.
    pub(crate) fn consume(&mut self, n: usize) {
        self.buf.advance(n.min(self.buf.len()));
        self.let_go();
    }

    /// Reads what the peer sent, making room for up to `room` bytes once there is something
    /// to read; 0 at the connection's end.
    pub(crate) async fn fill(&mut self, room: usize) -> std::io::Result<usize> {
        if self.buf.capacity() == self.buf.len() {
            self.wire.readable().await?;
            self.buf.reserve(room);
        }
        self.wire.read_buf(&mut self.buf).await
    }

    /// Begins reading a body framed as `framing`.
    pub(crate) fn begin(&mut self, framing: Framing) {
        self.body = match framing {
            Framing::Empty | Framing::Length(0) => Progress::Done,
            Framing::Length(n) => Progress::Length(n),
            Framing::Chunked => Progress::ChunkSize,
            Framing::UntilClose => Progress::UntilClose,
        };
    }

    /// Whether the body begun was read to its end.
    pub(crate) fn body_done(&self) -> bool {
        self.body == Progress::Done
    }

    /// The body's next piece as it arrives, `None` at its end. After an error the body is not
    /// to be read further, nor the connection used again.
    pub(crate) async fn piece(&mut self) -> Result<Option<Bytes>, String> {
        loop {
            match self.body {
                Progress::Done => return Ok(None),
                Progress::Length(left) => {
                    let piece = self.take_up_to(left).await?;
                    let left = left - piece.len() as u64;
                    self.body = if left == 0 {
                        Progress::Done
                    } else {
                        Progress::Length(left)
                    };
                    return Ok(Some(piece));
                }
                Progress::ChunkSize => match httparse::parse_chunk_size(&self.buf) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        self.consume(used);
                        self.body = if size == 0 {
                            Progress::Trailers
                        } else {
                            Progress::ChunkData(size)
                        };
                    }
                    Ok(httparse::Status::Partial) => self.more("a chunk's size line").await?,
                    Err(_) => return Err("a chunk's size line is not valid".into()),
                },
                Progress::ChunkData(left) => {
                    let piece = self.take_up_to(left).await?;
                    let left = left - piece.len() as u64;
                    self.body = if left == 0 {
                        Progress::ChunkEnd
                    } else {
                        Progress::ChunkData(left)
                    };
                    return Ok(Some(piece));
                }
                Progress::ChunkEnd => {
                    if self.buf.len() < 2 {
                        self.more("a chunk's end").await?;
                    } else if self.buf.starts_with(b"\r\n") {
                        self.consume(2);
                        self.body = Progress::ChunkSize;
                    } else {
                        return Err("a chunk is longer than its size says".into());
                    }
                }
                Progress::Trailers => match self.buf.windows(2).position(|w| w == b"\r\n") {
                    Some(0) => {
                        self.consume(2);
                        self.body = Progress::Done;
                        return Ok(None);
                    }
                    // A trailer carries nothing either end needs.
                    Some(end) => self.consume(end + 2),
                    None => self.more("the trailers").await?,
                },
                Progress::UntilClose => {
                    if self.buf.is_empty()
                        && self.fill(BODY_READ).await.map_err(|e| e.to_string())? == 0
                    {
                        self.body = Progress::Done;
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
                return Err(format!(
                    "{} closed the connection within {}",
                    self.peer.name(),
                    self.peer.body()
                ));
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
            0 => Err(format!(
                "{} closed the connection within {what}",
                self.peer.name()
            )),
            _ => Ok(()),
        }
    }

    /// Lets go of the buffer once every byte of it was handed on or passed over (the pieces
    /// keep what they hold; the room after them is not kept while the connection waits).
    fn let_go(&mut self) {
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
        }
    }
}
