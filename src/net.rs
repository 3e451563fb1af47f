//! Listening sockets with a backlog sized for bursts: tokio's `TcpListener::bind` asks for
//! 1,024 pending connections, and thousands of clients connecting at once (a batch starting, a
//! fleet reconnecting) overflow it — the kernel then drops their SYNs and each retries after
//! 1, 2, 4, 8, 16 s, a half-minute tail for connections that were never refused.
//!
//! Accepted connections send small writes at once (`TCP_NODELAY`), and a server waits for a
//! client's bytes only so long ([`READ_TIMEOUT`]).
//!
//! Owns: binding, readying accepted sockets, how long a client may keep one silent. Must not:
//! know what is served.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// How long, by default, a server waits for a client's next bytes (a request's headers, the
/// rest of its body, the next request on an idle keep-alive connection) before it closes the
/// connection (`APTIX_HTTP_READ_TIMEOUT_SECS`). Answers are not bounded by it: a long-poll, an
/// SSE stream or the synchronous endpoint may take as long as the route allows.
pub const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Pending connections asked of the kernel (which caps it at `net.core.somaxconn`).
pub const LISTEN_BACKLOG: u32 = 8192;

/// Binds `addr` (address reuse on, as `TcpListener::bind` does) and listens with
/// [`LISTEN_BACKLOG`].
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Readies an accepted connection: small writes (a streamed line, an event, the end of a
/// response) leave at once instead of waiting, under Nagle's algorithm, for the peer to
/// acknowledge the previous segment — which a peer delaying its ACKs holds for up to 40 ms.
pub fn no_delay(stream: &TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY on a connection");
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn listens_on_the_address_asked_for() {
        let listener = super::listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(addr.ip().is_loopback() && addr.port() != 0);
        let (connected, accepted) =
            tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        assert!(connected.is_ok() && accepted.is_ok());
    }

    #[tokio::test]
    async fn accepted_connections_send_small_writes_at_once() {
        let listener = super::listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let (_client, accepted) =
            tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        let (stream, _) = accepted.unwrap();
        assert!(!stream.nodelay().unwrap(), "the kernel's default is Nagle");
        super::no_delay(&stream);
        assert!(stream.nodelay().unwrap());
    }
}
