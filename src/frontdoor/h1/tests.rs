//! The API's HTTP/1.1 connections driven over real sockets by a client that writes bytes: bodies
//! in every framing and arriving in pieces, answers whole and streamed, several requests on one
//! connection, a client that goes away, bodies a handler never reads, and heads refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use http_body_util::BodyExt as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::frontdoor::serve::{Reading, serve_with};
use crate::metrics::Metrics;

/// Drops its flag's value to `true` when dropped: a handler's future let go of.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

struct Server {
    addr: std::net::SocketAddr,
    stop: CancellationToken,
    metrics: Arc<Metrics>,
    dropped: Arc<AtomicBool>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn server(read_timeout: Duration) -> Server {
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&dropped);
    let router = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route("/echo", post(|body: axum::body::Bytes| async move { body }))
        .route(
            "/refuse",
            post(|| async { (axum::http::StatusCode::PAYLOAD_TOO_LARGE, "too large") }),
        )
        .route(
            "/stream",
            get(|| async {
                let pieces = futures_util::stream::iter(["one ", "two ", "three"]).then(
                    |piece| async move {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok::<_, std::io::Error>(piece)
                    },
                );
                Body::from_stream(pieces)
            }),
        )
        .route(
            "/wait",
            get(move || {
                let guard = SetOnDrop(Arc::clone(&flag));
                async move {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    drop(guard);
                    "waited"
                }
            }),
        )
        .route(
            "/read",
            post(|body: Body| async move {
                match body.collect().await {
                    Ok(_) => "whole".to_string(),
                    Err(e) => format!("broken: {e}"),
                }
            }),
        )
        .route(
            "/late",
            get(|| async {
                let never = futures_util::stream::once(async {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok::<_, std::io::Error>("late")
                });
                Body::from_stream(never)
            }),
        )
        .route(
            "/empty",
            get(|| async { axum::http::StatusCode::NO_CONTENT }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let stop = CancellationToken::new();
    let metrics = Arc::new(Metrics::new());
    let reading = Reading {
        timeout: read_timeout,
        metrics: Arc::clone(&metrics),
    };
    tokio::spawn(serve_with(listener, router, stop.clone(), reading));
    Server {
        addr,
        stop,
        metrics,
        dropped,
    }
}

use futures_util::StreamExt as _;

/// Writes `bytes` as the client.
async fn send(stream: &mut TcpStream, bytes: &[u8]) {
    stream
        .write_all(bytes)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

async fn connect(server: &Server) -> TcpStream {
    TcpStream::connect(server.addr)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Everything the server sends until it closes the connection.
async fn all_of(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
    assert!(matches!(read, Ok(Ok(_))), "{read:?}");
    String::from_utf8_lossy(&out).into_owned()
}

/// The answers in `text`, each its head and its body (length-framed answers only).
fn answers(mut text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while let Some(end) = text.find("\r\n\r\n") {
        let head = &text[..end];
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .map_or(0, |n| n.parse::<usize>().unwrap_or_else(|e| panic!("{e}")));
        let body_at = end + 4;
        out.push((
            head.to_string(),
            text[body_at..body_at + length].to_string(),
        ));
        text = &text[body_at + length..];
    }
    out
}

#[tokio::test]
async fn requests_one_after_another_and_pipelined_are_answered_in_order_on_one_connection() {
    let server = server(Duration::from_secs(30)).await;
    let mut stream = connect(&server).await;
    send(&mut stream, b"GET /hello HTTP/1.1\r\nhost: a\r\n\r\n").await;
    let mut first = [0u8; 256];
    let n = stream
        .read(&mut first)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let first = String::from_utf8_lossy(&first[..n]).into_owned();
    assert!(first.starts_with("HTTP/1.1 200 OK\r\n"), "{first}");
    assert!(
        first.ends_with("\r\n\r\nhello") && first.contains("date: "),
        "{first}"
    );
    // Three more in one write, the last asking to close.
    send(&mut stream, b"POST /echo HTTP/1.1\r\ncontent-length: 3\r\n\r\nabcGET /hello HTTP/1.1\r\n\r\nPOST /echo HTTP/1.1\r\nconnection: close\r\ncontent-length: 2\r\n\r\nxy",).await;
    let rest = answers(&all_of(&mut stream).await);
    let bodies: Vec<_> = rest.iter().map(|(_, body)| body.as_str()).collect();
    assert_eq!(bodies, ["abc", "hello", "xy"]);
    assert!(rest[2].0.contains("connection: close"), "{:?}", rest[2]);
}

#[tokio::test]
async fn a_body_arriving_in_pieces_is_read_in_either_framing_and_continue_is_said_when_it_is_read()
{
    let server = server(Duration::from_secs(30)).await;
    let mut stream = connect(&server).await;
    send(
        &mut stream,
        b"POST /echo HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 10\r\n\r\n",
    )
    .await;
    let mut said = [0u8; 25];
    stream
        .read_exact(&mut said)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&said, b"HTTP/1.1 100 Continue\r\n\r\n");
    for piece in [&b"01234"[..], b"56789"] {
        tokio::time::sleep(Duration::from_millis(30)).await;
        send(&mut stream, piece).await;
    }
    // Chunked, with an extension and a trailer, cut across writes.
    for piece in [
        &b"POST /echo HTTP/1.1\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n4;x=1\r\nab"[..],
        b"cd\r\n3\r\nefg\r\n0\r\ntrailer: 1\r\n\r\n",
    ] {
        tokio::time::sleep(Duration::from_millis(30)).await;
        send(&mut stream, piece).await;
    }
    let both = answers(&all_of(&mut stream).await);
    let bodies: Vec<_> = both.iter().map(|(_, body)| body.as_str()).collect();
    assert_eq!(bodies, ["0123456789", "abcdefg"]);
}

#[tokio::test]
async fn a_body_no_handler_reads_is_not_asked_for_and_its_answer_still_arrives() {
    let server = server(Duration::from_secs(30)).await;
    let mut stream = connect(&server).await;
    // The handler answers without reading: the client is never told to go on, and the
    // connection closes after the answer (the body's bytes were not read).
    send(
        &mut stream,
        b"POST /refuse HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 100000\r\n\r\n",
    )
    .await;
    // A client that sends anyway: the answer is not lost to a reset.
    let _ = stream.write_all(&vec![b'x'; 100_000]).await;
    let text = all_of(&mut stream).await;
    assert!(
        text.starts_with("HTTP/1.1 413 Payload Too Large\r\n"),
        "{text}"
    );
    assert!(!text.contains("100 Continue"), "{text}");
    assert!(
        text.contains("connection: close") && text.ends_with("too large"),
        "{text}"
    );
}

#[tokio::test]
async fn a_stream_goes_out_in_chunks_to_http_1_1_and_up_to_the_close_to_http_1_0() {
    let server = server(Duration::from_secs(30)).await;
    let mut stream = connect(&server).await;
    send(
        &mut stream,
        b"GET /stream HTTP/1.1\r\nconnection: close\r\n\r\n",
    )
    .await;
    let text = all_of(&mut stream).await;
    assert!(text.contains("transfer-encoding: chunked\r\n"), "{text}");
    assert!(
        text.ends_with("\r\n\r\n4\r\none \r\n4\r\ntwo \r\n5\r\nthree\r\n0\r\n\r\n"),
        "{text}"
    );
    let mut old = connect(&server).await;
    send(&mut old, b"GET /stream HTTP/1.0\r\n\r\n").await;
    let text = all_of(&mut old).await;
    assert!(
        !text.contains("transfer-encoding") && !text.contains("content-length"),
        "{text}"
    );
    assert!(text.ends_with("\r\n\r\none two three"), "{text}");
}

#[tokio::test]
async fn a_stream_whose_first_piece_is_not_there_has_its_head_sent_at_once() {
    let server = server(Duration::from_secs(30)).await;
    let mut stream = connect(&server).await;
    send(&mut stream, b"GET /late HTTP/1.1\r\n\r\n").await;
    let mut head = [0u8; 512];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut head)).await;
    let Ok(Ok(n)) = read else {
        panic!("the head did not come: {read:?}");
    };
    let head = String::from_utf8_lossy(&head[..n]).into_owned();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(
        head.ends_with("transfer-encoding: chunked\r\n") || head.ends_with("\r\n\r\n"),
        "{head}"
    );
    assert!(head.contains("transfer-encoding: chunked\r\n"), "{head}");
}

#[tokio::test]
async fn head_and_bodiless_answers_carry_no_body() {
    let server = server(Duration::from_secs(30)).await;
    let mut stream = connect(&server).await;
    send(
        &mut stream,
        b"HEAD /hello HTTP/1.1\r\n\r\nGET /empty HTTP/1.1\r\nconnection: close\r\n\r\n",
    )
    .await;
    let text = all_of(&mut stream).await;
    let heads: Vec<_> = text.split("\r\n\r\n").collect();
    assert_eq!(heads.len(), 3, "{text}");
    assert!(
        heads[0].starts_with("HTTP/1.1 200 OK") && heads[0].contains("content-length: 5"),
        "{text}"
    );
    assert!(
        heads[1].starts_with("HTTP/1.1 204 No Content") && !heads[1].contains("content-length"),
        "{text}"
    );
    assert_eq!(heads[2], "", "{text}");
}

#[tokio::test]
async fn a_client_that_goes_away_while_it_waits_lets_its_handler_go() {
    let server = server(Duration::from_secs(30)).await;
    let mut stream = connect(&server).await;
    send(&mut stream, b"GET /wait HTTP/1.1\r\n\r\n").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !server.dropped.load(Ordering::SeqCst),
        "the handler still waits"
    );
    drop(stream);
    let mut waited = Duration::ZERO;
    while !server.dropped.load(Ordering::SeqCst) && waited < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += Duration::from_millis(20);
    }
    assert!(
        server.dropped.load(Ordering::SeqCst),
        "the handler was let go of"
    );
}

#[tokio::test]
async fn a_silent_or_slow_client_is_closed_at_the_read_timeout_and_counted() {
    let server = server(Duration::from_millis(300)).await;
    let mut silent = connect(&server).await;
    // A head begun and never finished.
    let mut slow = connect(&server).await;
    send(&mut slow, b"GET /hello HTTP/1.1\r\nhost").await;
    for stream in [&mut silent, &mut slow] {
        let text = all_of(stream).await;
        assert_eq!(text, "", "closed without an answer");
    }
    let text = server.metrics.encode();
    assert!(
        text.contains("aptix_http_connections_timed_out_total{phase=\"headers\"} 2"),
        "{text}"
    );
}

/// A request sent on an idle connection while the server could not run (a stalled runtime)
/// is answered, not reset, even though the connection's deadline passed meanwhile.
#[tokio::test]
async fn a_request_that_came_before_the_server_looked_is_served_though_its_deadline_passed() {
    let server = server(Duration::from_millis(100)).await;
    for round in 0..8 {
        let mut stream = connect(&server).await;
        send(&mut stream, b"GET /hello HTTP/1.1\r\n\r\n").await;
        let mut first = [0u8; 256];
        let n = stream
            .read(&mut first)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(first[..n].ends_with(b"hello"), "round {round}");
        // The next request goes out, and the runtime (the server's too) stalls past the
        // connection's deadline before anything runs.
        send(
            &mut stream,
            b"GET /hello HTTP/1.1\r\nconnection: close\r\n\r\n",
        )
        .await;
        std::thread::sleep(Duration::from_millis(300));
        let text = all_of(&mut stream).await;
        assert!(text.ends_with("\r\n\r\nhello"), "round {round}: {text:?}");
    }
}

#[tokio::test]
async fn a_head_that_is_not_http_1_1_is_answered_with_why_and_closed() {
    let server = server(Duration::from_secs(30)).await;
    for (sent, status) in [
        (
            &b"GET / HTTP/1.1\r\nbad header\r\n\r\n"[..],
            "400 Bad Request",
        ),
        (
            b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 1\r\n\r\n0\r\n\r\n",
            "400 Bad Request",
        ),
        (
            b"POST / HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n",
            "501 Not Implemented",
        ),
    ] {
        let mut stream = connect(&server).await;
        send(&mut stream, sent).await;
        let text = all_of(&mut stream).await;
        assert!(
            text.starts_with(&format!("HTTP/1.1 {status}\r\n")),
            "{text}"
        );
        assert!(text.contains("connection: close\r\n"), "{text}");
    }
}

#[tokio::test]
async fn a_body_that_breaks_off_reaches_the_handler_as_an_error() {
    let server = server(Duration::from_secs(30)).await;
    let mut stream = connect(&server).await;
    send(
        &mut stream,
        b"POST /read HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcdef\r\n",
    )
    .await;
    let text = all_of(&mut stream).await;
    assert!(text.contains("connection: close"), "{text}");
    assert!(
        text.ends_with("broken: a chunk is longer than its size says"),
        "{text}"
    );
}

/// What a waiting call costs: once its head is read, no read buffer is held — its body, come
/// with the head, is a copy of its own, and the head's bytes are shared by the header values.
#[tokio::test]
async fn a_request_read_leaves_no_read_buffer_behind() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let mut client = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (accepted, _) = listener.accept().await.unwrap_or_else(|e| panic!("{e}"));
    let mut reader = crate::h1::Reader::new(accepted, crate::h1::Peer::Client);
    send(&mut client, b"POST /v1/agent/execute HTTP/1.1\r\nauthorization: Bearer t\r\ncontent-length: 11\r\n\r\n{\"a\":\"b c\"}").await;
    let read = super::read_head(&mut reader).await;
    let Ok(Some((head, Some(body)))) = read else {
        panic!("the head and its body: {read:?}");
    };
    assert_eq!(body, &b"{\"a\":\"b c\"}"[..]);
    assert_eq!(head.headers["authorization"], "Bearer t");
    assert!(reader.body_done() && reader.buffered().is_empty());
    assert_eq!(
        reader.capacity(),
        0,
        "no read buffer held while the call waits"
    );
}
