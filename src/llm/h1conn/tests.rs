//! The pool against an HTTP/1.1 server written here on plain TCP: a connection per call in
//! flight, each given back and taken again once its answer is read, and one the server closed
//! never taken again, nor one whose answer was not read to its end.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::super::body::Body;
use super::super::target::{Alpn, Target};
use super::super::test_listener::counting;
use super::Pool;

/// What the server does with a connection after each answer.
#[derive(Clone, Copy, PartialEq)]
enum After {
    /// Keeps it for the next request.
    Keep,
    /// Says `connection: close`, and closes it.
    SaysClose,
    /// Says nothing, and closes it.
    Closes,
}

/// A server answering each request with its body after `delay`, then doing with the
/// connection what `after` says. Counts the connections it accepted.
async fn server(delay: Duration, after: After) -> (Target, Arc<AtomicUsize>) {
    let (addr, accepted) = counting(move |socket| serve(socket, delay, after)).await;
    let url = reqwest::Url::parse(&format!("http://{addr}/v1/responses")).expect("a URL");
    let config = crate::tls::client_config(None);
    let target = Target::new(&url, config, Alpn::Http1, Duration::from_secs(1)).expect("a target");
    (target, accepted)
}

async fn serve(mut socket: TcpStream, delay: Duration, after: After) {
    let mut buffer = Vec::new();
    loop {
        // The head, then as many bytes as its content-length says.
        let head_end = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let mut piece = [0u8; 4096];
            match socket.read(&mut piece).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&piece[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_lowercase();
        assert!(
            head.starts_with("post /v1/responses http/1.1\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nhost: 127.0.0.1:"), "{head}");
        assert!(head.contains("\r\nauthorization: bearer sk\r\n"), "{head}");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            let mut piece = [0u8; 4096];
            match socket.read(&mut piece).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&piece[..n]),
            }
        }
        let body: Vec<u8> = buffer.drain(..head_end + length).skip(head_end).collect();
        tokio::time::sleep(delay).await;
        let connection = if after == After::SaysClose {
            "close"
        } else {
            "keep-alive"
        };
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: {connection}\r\n\r\n",
            body.len()
        );
        if socket.write_all(answer.as_bytes()).await.is_err()
            || socket.write_all(&body).await.is_err()
        {
            return;
        }
        if after != After::Keep {
            return;
        }
    }
}

/// One call through `pool`: the body sent comes back.
async fn call(pool: &Arc<Pool>, text: &'static str) -> Result<Bytes, String> {
    let mut connection = pool.checkout().await?;
    let head = pool.target().http1_head(text.len(), Some("sk"), None)?;
    connection.send(&head, &[b"", b"", text.as_bytes()]).await?;
    let (status, _) = connection.answer().await?;
    assert_eq!(status, 200);
    Body::Connection(connection)
        .whole()
        .await
        .map_err(|cut| cut.message)
}

#[tokio::test]
async fn calls_in_flight_take_a_connection_each_and_later_calls_take_them_again() {
    let (target, accepted) = server(Duration::from_millis(100), After::Keep).await;
    let pool = Arc::new(Pool::new(Arc::new(target)));
    let calls = (0..4).map(|_| call(&pool, "[1]"));
    for answer in futures_util::future::join_all(calls).await {
        assert_eq!(answer.as_deref(), Ok(&b"[1]"[..]));
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        4,
        "one connection per call in flight"
    );
    assert_eq!(pool.idle(), 4, "each given back once its answer was read");
    for _ in 0..3 {
        assert_eq!(call(&pool, "{}").await.as_deref(), Ok(&b"{}"[..]));
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        4,
        "calls one after another reuse them"
    );
}

#[tokio::test]
async fn a_connection_the_server_closes_is_not_taken_again() {
    let (target, accepted) = server(Duration::ZERO, After::SaysClose).await;
    let pool = Arc::new(Pool::new(Arc::new(target)));
    for text in ["[1]", "[2]", "[3]"] {
        assert_eq!(call(&pool, text).await.as_deref(), Ok(text.as_bytes()));
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

/// A call cut short (here by its time running out) takes its connection with it: the next
/// call does not wait behind an answer that belongs to no one.
#[tokio::test]
async fn a_connection_whose_call_was_cut_short_is_not_taken_again() {
    let (target, accepted) = server(Duration::from_millis(300), After::Keep).await;
    let pool = Arc::new(Pool::new(Arc::new(target)));
    let cut = tokio::time::timeout(Duration::from_millis(50), call(&pool, "[1]")).await;
    assert!(cut.is_err(), "the first call ran out of time");
    assert_eq!(pool.idle(), 0, "its connection was not given back");
    assert_eq!(call(&pool, "[2]").await.as_deref(), Ok(&b"[2]"[..]));
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// A server that closes an idle connection without a word (as one whose keep-alive ran out):
/// the pool sees it closed when the next call would take it, and that call goes on a new one
/// (sent on the closed one, it would have found no answer).
#[tokio::test]
async fn an_idle_connection_the_server_closed_unsaid_is_not_taken_again() {
    let (target, accepted) = server(Duration::ZERO, After::Closes).await;
    let pool = Arc::new(Pool::new(Arc::new(target)));
    for text in ["[1]", "[2]", "[3]"] {
        assert_eq!(call(&pool, text).await.as_deref(), Ok(text.as_bytes()));
        assert_eq!(pool.idle(), 1, "the server said nothing: kept");
        // The server's close reaches the client.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}
