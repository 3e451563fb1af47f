//! Connections are bounded, tried from outside with raw sockets against the API as the
//! product serves it (`App::spawn_http`, `APTIX_HTTP_READ_TIMEOUT_SECS=1`): a connection that
//! sends nothing, one whose headers never finish, an idle keep-alive one and a request whose
//! body stops short of its `Content-Length` are each closed after the read timeout and
//! counted; an answer that takes longer than the timeout (a long-poll) is never cut.

use crate::support::metric;
use std::time::{Duration, Instant};

use aptix_worker::fake_llm::FakeOptions;
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::app::{AppOptions, Backend, spawn};

/// Reads until the server hangs up; what it sent, and when it hung up (`None`: it kept the
/// connection past `limit`).
async fn until_closed(mut conn: TcpStream, limit: Duration) -> (String, Option<Duration>) {
    let started = Instant::now();
    let mut seen = Vec::new();
    let closed = tokio::time::timeout(limit, conn.read_to_end(&mut seen)).await;
    let at = match closed {
        Ok(Ok(_)) | Ok(Err(_)) => Some(started.elapsed()),
        Err(_) => None,
    };
    (String::from_utf8_lossy(&seen).into_owned(), at)
}

#[tokio::test]
async fn silent_slow_idle_and_short_body_connections_are_closed_and_counted() {
    let app = spawn(AppOptions {
        backend: Backend::Embedded,
        extra_env: vec![("APTIX_HTTP_READ_TIMEOUT_SECS", "1".into())],
        fake: FakeOptions {
            latency: Duration::from_secs(2),
            ..FakeOptions::default()
        },
        ..AppOptions::default()
    })
    .await;
    let addr = app.base.trim_start_matches("http://").to_string();
    // Closed after the timeout, with room for a loaded machine; held past it means never.
    let limit = Duration::from_secs(8);

    // Nothing at all.
    let silent = TcpStream::connect(&addr).await.unwrap();
    // Headers that never finish.
    let mut half = TcpStream::connect(&addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // A body that stops short of its length, with a valid token (the headers were fine).
    let mut short = TcpStream::connect(&addr).await.unwrap();
    short
        .write_all(
            b"POST /v1/turns HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-a\r\n\
              Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        )
        .await
        .unwrap();
    // One answered request, then silence on the keep-alive connection.
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");

    let (silent, half, short, idle) = tokio::join!(
        until_closed(silent, limit),
        until_closed(half, limit),
        until_closed(short, limit),
        until_closed(idle, limit),
    );
    for (what, (_, at)) in [
        ("a connection that sends nothing", &silent),
        ("headers that never finish", &half),
        ("a body that stops short", &short),
        ("an idle keep-alive connection", &idle),
    ] {
        let at = at.unwrap_or_else(|| panic!("{what} was kept past {limit:?}"));
        assert!(
            at >= Duration::from_millis(900),
            "{what} closed early: {at:?}"
        );
    }
    // The short body is answered before it is closed: 408 with the code and a reason.
    let (answer, _) = short;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"REQUEST_TIMEOUT\""), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    assert!(silent.0.is_empty(), "{}", silent.0);

    // Counted by what the server waited for.
    let text = app.metrics_text().await;
    assert_eq!(
        metric(
            &text,
            "aptix_http_connections_timed_out_total{phase=\"body\"}"
        ),
        1.0
    );
    assert!(
        metric(
            &text,
            "aptix_http_connections_timed_out_total{phase=\"headers\"}"
        ) >= 3.0,
        "{text}"
    );

    // An answer slower than the read timeout still arrives: a long-poll on a turn whose
    // model call takes twice the timeout.
    let (status, body) = app
        .post(
            Some("tok-a"),
            json!({"sessionId": "s", "turnId": "t", "instruction": "hi"}).to_string(),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let started = Instant::now();
    let done = app.settled("tok-a", "s", "t").await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(
        started.elapsed() > Duration::from_secs(1),
        "the answer was not slow"
    );
}
