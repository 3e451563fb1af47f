//! Listening sockets with a backlog sized for bursts: tokio's `TcpListener::bind` asks for
//! 1,024 pending connections, and thousands of clients connecting at once (a batch starting, a
//! fleet reconnecting) overflow it — the kernel then drops their SYNs and each retries after
//! 1, 2, 4, 8, 16 s, a half-minute tail for connections that were never refused.
//!
//! Owns: binding. Must not: know what is served.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

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
}
