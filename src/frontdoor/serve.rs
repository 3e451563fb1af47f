//! Serving the API's connections: HTTP/1.1, and HTTP/2 by prior knowledge (h2c) for a client
//! that holds many calls open at once — a waiting synchronous call or long-poll is then a
//! stream of a shared connection instead of a connection of its own, with its buffers.
//!
//! Which one a connection speaks is read from its first bytes (the HTTP/2 preface, or
//! anything else) under the read timeout, so a connection that sends nothing is closed as
//! before. HTTP/1.1 (served by a codec of our own, `h1.rs`) then waits for each request's
//! head as long; HTTP/2 (hyper's) has none, so a connection that carries no stream for the
//! read timeout is closed (`GOAWAY`), and pings find a peer that went away while its streams
//! were open. Both close gracefully when the server stops.
//!
//! Owns: accepting, choosing the protocol, each connection's deadlines and its end. Must not:
//! know what a request asks (that is the router's).

use std::convert::Infallible;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

use super::h1::Ended;
use crate::metrics::Metrics;

/// How long, by default, the API waits for a client's next bytes ([`crate::net::READ_TIMEOUT`]).
pub const HEADER_READ_TIMEOUT: Duration = crate::net::READ_TIMEOUT;

/// How long a stopping server waits for open connections (an SSE stream never ends by itself).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Streams one HTTP/2 connection may have open at once (calls past it wait in the client).
pub const HTTP2_STREAMS: u32 = 1000;

/// How often an HTTP/2 connection is pinged, and how long an answer may take before the
/// connection counts as dead (its streams, waiting calls among them, are then dropped).
const PING_EVERY: Duration = Duration::from_secs(20);
const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// What opens an HTTP/2 connection (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How a server reads its clients: how long it waits for their bytes, and where it counts the
/// connections it closed for waiting too long.
#[derive(Clone)]
pub struct Reading {
    /// The wait for a connection's first bytes and a request's headers (from the moment the
    /// connection is accepted, or the previous answer was sent), and the longest an HTTP/2
    /// connection stays open with no stream; a body's own wait is
    /// [`super::http::HttpParts::read_timeout`].
    pub timeout: Duration,
    /// Counts connections by protocol and those closed (`aptix_http_connections_total`,
    /// `aptix_http_connections_timed_out_total`).
    pub metrics: Arc<Metrics>,
}

/// Serves `router` on `listener` until `shutdown` fires, closing connections that do not send
/// their headers within [`HEADER_READ_TIMEOUT`] (slow or idle clients).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let reading = Reading {
        timeout: HEADER_READ_TIMEOUT,
        metrics: Arc::new(Metrics::new()),
    };
    serve_with(listener, router, shutdown, reading).await
}

/// [`serve`] reading clients as `reading` says.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
    reading: Reading,
) -> std::io::Result<()> {
    let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .max_concurrent_streams(HTTP2_STREAMS)
        .keep_alive_interval(PING_EVERY)
        .keep_alive_timeout(PING_TIMEOUT);
    let served = Arc::new(Served {
        http2,
        router,
        reading,
        shutdown: shutdown.clone(),
    });
    let connections = TaskTracker::new();
    loop {
        let (stream, _peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment, keep serving.
                    tracing::warn!(error = %e, "could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        crate::net::no_delay(&stream);
        connections.spawn(Arc::clone(&served).connection(stream));
    }
    drop(listener);
    connections.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown grace period; closing them");
    }
    Ok(())
}

/// What every connection of one server is served with.
struct Served {
    http2: hyper::server::conn::http2::Builder<TokioExecutor>,
    router: Router,
    reading: Reading,
    shutdown: CancellationToken,
}

/// The protocol a connection's first bytes speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spoken {
    Http1,
    Http2,
}

/// What `bytes`, the first a connection sent, say it speaks; `None` while they could still be
/// the start of the HTTP/2 preface.
fn spoken(bytes: &[u8]) -> Option<Spoken> {
    let n = bytes.len().min(PREFACE.len());
    if bytes[..n] != PREFACE[..n] {
        Some(Spoken::Http1)
    } else if n == PREFACE.len() {
        Some(Spoken::Http2)
    } else {
        None
    }
}

/// Reads, without taking them, a connection's first bytes until they tell what it speaks;
/// `Ok(None)` when `within` passed first, an error when it closed or failed.
async fn sniff(stream: &TcpStream, within: Duration) -> std::io::Result<Option<Spoken>> {
    let deadline = Instant::now() + within;
    let mut first = [0u8; PREFACE.len()];
    loop {
        let Ok(peeked) = tokio::time::timeout_at(deadline, stream.peek(&mut first)).await else {
            return Ok(None);
        };
        let n = peeked?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if let Some(spoken) = spoken(&first[..n]) {
            return Ok(Some(spoken));
        }
        // A beginning of the preface: the rest follows (a peek would answer at once again).
        if tokio::time::timeout_at(deadline, tokio::time::sleep(Duration::from_millis(10)))
            .await
            .is_err()
        {
            return Ok(None);
        }
    }
}

impl Served {
    /// Serves one connection to its end.
    async fn connection(self: Arc<Self>, stream: TcpStream) {
        let metrics = &self.reading.metrics;
        let sniffed = tokio::select! {
            sniffed = sniff(&stream, self.reading.timeout) => sniffed,
            // A stopping server does not wait for a client that has not spoken.
            _ = self.shutdown.cancelled() => return,
        };
        let spoken = match sniffed {
            Ok(Some(spoken)) => spoken,
            Ok(None) => {
                metrics.http_timed_out("headers");
                tracing::debug!("closed a connection that sent no request in time");
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "connection closed before its first request");
                return;
            }
        };
        if spoken == Spoken::Http1 {
            metrics.http_connection("http1");
            match super::h1::serve(stream, &self.router, self.reading.timeout, &self.shutdown).await
            {
                Ended::Closed => {}
                Ended::TimedOut => {
                    metrics.http_timed_out("headers");
                    tracing::debug!("closed a connection that sent no request in time");
                }
                Ended::ClientGone => {
                    tracing::debug!("the client went away while its request was answered");
                }
                Ended::Refused(why) => tracing::debug!(%why, "refused a request's head"),
                Ended::Failed(e) => tracing::debug!(error = %e, "connection closed with an error"),
            }
            return;
        }
        metrics.http_connection("http2");
        let streams = Arc::new(Streams::default());
        let service = CountedStreams {
            router: self.router.clone(),
            streams: Arc::clone(&streams),
        };
        let conn = pin!(self.http2.serve_connection(TokioIo::new(stream), service));
        match self
            .while_used(conn, &streams, |c| c.graceful_shutdown())
            .await
        {
            Ok(()) => {}
            Err(e) if e.is_timeout() => {
                metrics.http_timed_out("headers");
                tracing::debug!("closed a connection that sent no request in time");
            }
            Err(e) => tracing::debug!(error = %e, "connection closed with an error"),
        }
    }

    /// Drives an HTTP/2 connection to its end, asking it to close gracefully (`close`) when the
    /// server stops or it has carried no stream for the read timeout.
    async fn while_used<C>(
        &self,
        mut conn: Pin<&mut C>,
        streams: &Streams,
        close: impl FnOnce(Pin<&mut C>),
    ) -> hyper::Result<()>
    where
        C: Future<Output = hyper::Result<()>>,
    {
        let timeout = self.reading.timeout;
        let mut check_at = Instant::now() + timeout;
        let idle = loop {
            tokio::select! {
                ended = conn.as_mut() => return ended,
                _ = self.shutdown.cancelled() => break false,
                _ = tokio::time::sleep_until(check_at) => match streams.idle_since() {
                    Some(since) if since + timeout <= Instant::now() => break true,
                    Some(since) => check_at = since + timeout,
                    None => check_at = Instant::now() + timeout,
                },
            }
        };
        close(conn.as_mut());
        if !idle {
            return conn.await;
        }
        self.reading.metrics.http_timed_out("headers");
        tracing::debug!("closing an HTTP/2 connection that carried no stream in time");
        // A graceful close waits for the peer to answer a ping; one that does not is dropped.
        tokio::time::timeout(timeout, conn).await.unwrap_or(Ok(()))
    }
}

/// The streams an HTTP/2 connection has open (a stream is open until its answer's body
/// ends), and since when it has had none.
#[derive(Debug)]
struct Streams {
    open: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl Default for Streams {
    fn default() -> Self {
        Self {
            open: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        }
    }
}

impl Streams {
    /// Since when no stream has been open; `None` while one is.
    fn idle_since(&self) -> Option<Instant> {
        if self.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(match self.idle_since.lock() {
            Ok(since) => *since,
            Err(poisoned) => *poisoned.into_inner(),
        })
    }

    fn opened(self: &Arc<Self>) -> OpenStream {
        self.open.fetch_add(1, Ordering::AcqRel);
        OpenStream(Arc::clone(self))
    }
}

/// One open stream, counted until dropped (with the answer's body).
#[derive(Debug)]
struct OpenStream(Arc<Streams>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        // The time first, so that a check that sees no stream open sees when the last ended.
        match self.0.idle_since.lock() {
            Ok(mut since) => *since = Instant::now(),
            Err(poisoned) => *poisoned.into_inner() = Instant::now(),
        }
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The router, with each request counted as an open stream of its connection until its
/// answer's body ends.
#[derive(Clone)]
struct CountedStreams {
    router: Router,
    streams: Arc<Streams>,
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for CountedStreams {
    type Response = hyper::Response<WhileOpen>;
    type Error = Infallible;
    type Future = Answering;

    fn call(&self, request: hyper::Request<hyper::body::Incoming>) -> Answering {
        Answering {
            open: Some(self.streams.opened()),
            answer: self.router.clone().oneshot(request),
        }
    }
}

pin_project_lite::pin_project! {
    /// A request being answered, its stream counted open (handed on to the answer's body).
    struct Answering {
        open: Option<OpenStream>,
        #[pin]
        answer: tower::util::Oneshot<Router, hyper::Request<hyper::body::Incoming>>,
    }
}

impl Future for Answering {
    type Output = Result<hyper::Response<WhileOpen>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = std::task::ready!(this.answer.poll(cx))?;
        let open = this.open.take();
        Poll::Ready(Ok(answer.map(|body| WhileOpen { body, _open: open })))
    }
}

/// An answer's body that keeps its stream counted as open until it ends or is dropped.
struct WhileOpen {
    body: Body,
    _open: Option<OpenStream>,
}

impl HttpBody for WhileOpen {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stopping server lets an HTTP/2 stream and an HTTP/1.1 call that are being answered
    /// finish, closes a connection that has not spoken and an idle one at once, and returns.
    #[tokio::test]
    async fn a_stopping_server_finishes_the_calls_it_answers_and_waits_for_no_silent_client() {
        use tokio::io::AsyncReadExt as _;
        let router = Router::new().route(
            "/slow",
            axum::routing::get(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                "done"
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let stop = CancellationToken::new();
        let reading = Reading {
            timeout: Duration::from_secs(30),
            metrics: Arc::new(Metrics::new()),
        };
        let server = tokio::spawn(serve_with(listener, router, stop.clone(), reading));
        let mut silent = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let client = |h2: bool| {
            let builder = crate::tls::client_builder(None).unwrap_or_else(|e| panic!("{e}"));
            let builder = if h2 {
                builder.http2_prior_knowledge()
            } else {
                builder.http1_only()
            };
            builder.build().unwrap_or_else(|e| panic!("{e}"))
        };
        let url = format!("http://{addr}/slow");
        let (h1, h2) = (client(false), client(true));
        let calls = tokio::spawn(async move {
            let (a, b) = tokio::join!(h1.get(&url).send(), h2.get(&url).send());
            let mut versions = Vec::new();
            for answer in [a, b] {
                let answer = answer.unwrap_or_else(|e| panic!("{e}"));
                versions.push(answer.version());
                let text = answer.text().await.unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(text, "done");
            }
            versions
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let stopping = Instant::now();
        stop.cancel();
        let served = tokio::time::timeout(Duration::from_secs(5), server).await;
        assert!(
            matches!(served, Ok(Ok(Ok(())))),
            "the server returned within the grace period: {served:?}"
        );
        assert!(
            stopping.elapsed() < Duration::from_secs(2),
            "{:?}",
            stopping.elapsed()
        );
        let versions = calls.await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            versions,
            [reqwest::Version::HTTP_11, reqwest::Version::HTTP_2]
        );
        let mut rest = Vec::new();
        let read = silent.read_to_end(&mut rest).await;
        assert!(
            matches!(read, Ok(0)) || read.is_err(),
            "the silent connection was closed: {read:?}"
        );
    }

    #[test]
    fn the_preface_is_told_from_a_request_line_by_as_few_bytes_as_it_takes() {
        assert_eq!(spoken(b"GET / HTTP/1.1\r\n"), Some(Spoken::Http1));
        assert_eq!(spoken(b"G"), Some(Spoken::Http1));
        // `POST`, `PUT`, `PATCH` and the preface all begin with `P`.
        assert_eq!(spoken(b"P"), None);
        assert_eq!(spoken(b"PO"), Some(Spoken::Http1));
        assert_eq!(spoken(b"PRI * HTTP/2.0\r\n"), None);
        assert_eq!(spoken(PREFACE), Some(Spoken::Http2));
        let mut more = PREFACE.to_vec();
        more.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        assert_eq!(spoken(&more), Some(Spoken::Http2));
        // Anything else is HTTP/1.1's to refuse.
        assert_eq!(spoken(b"PRI * HTTP/2.1"), Some(Spoken::Http1));
        assert_eq!(spoken(b"\x16\x03\x01"), Some(Spoken::Http1));
    }
}
