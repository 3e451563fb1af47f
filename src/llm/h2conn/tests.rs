//! The connection's life against an HTTP/2 server written here on `h2`'s server half: shared
//! by calls, opened again when the server closed it or stopped answering its pings, and one
//! failed opening shared by the calls that waited for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;

use super::super::target::{Alpn, Target};
use super::super::test_listener::counting;
use super::{Link, Ready};

/// What the test server does with a connection after answering its first request.
#[derive(Clone, Copy)]
enum After {
    /// Goes on answering.
    Serving,
    /// Closes the connection (`GOAWAY`, then the socket).
    Closing,
    /// Stops reading it at the next request: no answer, no pong.
    Stalling,
}

/// An HTTP/2 server echoing each request's body; counts the connections it accepted.
async fn server(after: After) -> (String, Arc<AtomicUsize>) {
    let (addr, accepted) = counting(move |socket| serve(socket, after)).await;
    (format!("http://{addr}/v1/responses"), accepted)
}

async fn serve(socket: tokio::net::TcpStream, after: After) {
    let Ok(mut connection) = h2::server::handshake(socket).await else {
        return;
    };
    let mut answered = 0;
    while let Some(Ok((request, mut respond))) = connection.accept().await {
        if matches!(after, After::Stalling) && answered == 1 {
            // Held with its connection, which is never polled again.
            let _held = (request, respond);
            let never: std::convert::Infallible = std::future::pending().await;
            match never {}
        }
        let mut body = request.into_body();
        let mut echo = Vec::new();
        while let Some(Ok(piece)) = body.data().await {
            let _ = body.flow_control().release_capacity(piece.len());
            echo.extend_from_slice(&piece);
        }
        let head = http::Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(())
            .expect("a response head");
        if let Ok(mut out) = respond.send_response(head, false) {
            let _ = out.send_data(Bytes::from(echo), true);
        }
        answered += 1;
        match after {
            After::Serving | After::Stalling => {}
            After::Closing => {
                connection.graceful_shutdown();
                // Polled to its end: the GOAWAY goes out and the socket closes.
                while let Some(Ok(_)) = connection.accept().await {}
                return;
            }
        }
    }
}

fn target(url: &str) -> Target {
    let url = reqwest::Url::parse(url).expect("a URL");
    Target::new(
        &url,
        crate::tls::client_config(None),
        Alpn::H2,
        Duration::from_millis(500),
    )
    .expect("a target")
}

/// One call on `link`: the body sent comes back.
async fn call(link: &Link, text: &'static str) -> Result<Bytes, String> {
    let Ready::Stream(mut sender) = link.ready().await? else {
        return Err("HTTP/1.1 was chosen".into());
    };
    let request = link.target().request(text.len(), Some("sk-test"), None)?;
    let (answer, mut body) = sender
        .send_request(request, false)
        .map_err(|e| e.to_string())?;
    body.send_data(Bytes::from_static(text.as_bytes()), true)
        .map_err(|e| e.to_string())?;
    let stream = answer.await.map_err(|e| e.to_string())?.into_body();
    super::super::body::Body::Stream(stream)
        .whole()
        .await
        .map_err(|cut| cut.message)
}

#[tokio::test]
async fn calls_at_once_are_streams_of_one_connection() {
    let (url, accepted) = server(After::Serving).await;
    let link = Link::new(Arc::new(target(&url)));
    let calls = (0..10).map(|_| call(&link, r#"{"n":1}"#));
    for answer in futures_util::future::join_all(calls).await {
        assert_eq!(answer.as_deref(), Ok(&br#"{"n":1}"#[..]));
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "ten calls, one connection"
    );
}

#[tokio::test]
async fn a_connection_the_server_closed_is_opened_again_by_the_next_call() {
    let (url, accepted) = server(After::Closing).await;
    let link = Link::new(Arc::new(target(&url)));
    assert_eq!(call(&link, "{}").await.as_deref(), Ok(&b"{}"[..]));
    // The GOAWAY and the close reach the client's connection task.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(call(&link, "[1]").await.as_deref(), Ok(&b"[1]"[..]));
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// A call waiting on a connection that stopped answering fails once a ping goes unanswered,
/// rather than waiting for its own timeout, and the next call opens another connection.
#[tokio::test]
async fn a_connection_that_stops_answering_its_pings_is_dropped_and_replaced() {
    let (url, accepted) = server(After::Stalling).await;
    let pinging = target(&url).pinging(Duration::from_millis(50), Duration::from_millis(200));
    let link = Link::new(Arc::new(pinging));
    assert_eq!(call(&link, "{}").await.as_deref(), Ok(&b"{}"[..]));
    let stuck = tokio::time::timeout(Duration::from_secs(30), call(&link, "[2]")).await;
    let failed = stuck.expect("the stalled call ends by the ping, not this test's limit");
    assert!(failed.is_err(), "the stalled call failed: {failed:?}");
    assert_eq!(call(&link, "[3]").await.as_deref(), Ok(&b"[3]"[..]));
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "the dead connection was replaced"
    );
}

/// A server that takes the connection and never answers the TLS handshake: the calls that
/// waited for one opening share its failure instead of each opening (and timing out) in turn.
#[tokio::test]
async fn calls_waiting_for_an_opening_that_fails_share_its_failure() {
    // Held, never answered: the handshake times out.
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (addr, accepted) = counting(move |socket| {
        let held = Arc::clone(&held);
        async move { held.lock().expect("not poisoned").push(socket) }
    })
    .await;
    let link = Link::new(Arc::new(target(&format!(
        "https://localhost:{}/v1/responses",
        addr.port()
    ))));
    let calls = (0..20).map(|_| call(&link, "{}"));
    for answer in futures_util::future::join_all(calls).await {
        let e = answer.expect_err("no handshake, no call");
        assert!(e.contains("TLS handshake timed out"), "{e}");
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "twenty calls waited for one opening and got its error"
    );
    // A later call tries again.
    let _ = call(&link, "{}").await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}
