//! HTTP/1.1 as both of our ends read it: the model client's own connections
//! (`llm::h1wire`) and the API's (`frontdoor::h1`). What they share is how bytes come off a
//! connection: a buffer that exists only while it holds something, and a body read as its
//! sender framed it (a length, chunks, or up to the close).
//!
//! Owns: the read buffer and body framing. Must not: parse a head (each end reads its own
//! kind), write, or decide what a message means.

mod read;

#[cfg(test)]
pub(crate) use read::MAX_LINE;
pub(crate) use read::{Framing, HEAD_READ, Peer, Reader};

/// What a connection reads from and writes to.
pub(crate) trait Wire: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {
    /// Resolves once bytes (or the end) can be read, so that no room is made for them before;
    /// a wire that cannot tell (TLS may hold bytes already read) resolves at once.
    fn readable(&self) -> impl Future<Output = std::io::Result<()>> + Send;
}

impl Wire for tokio::net::TcpStream {
    async fn readable(&self) -> std::io::Result<()> {
        tokio::net::TcpStream::readable(self).await
    }
}
