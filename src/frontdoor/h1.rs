//! An HTTP/1.1 connection of the API, served by a codec of our own: each request's head read
//! and handed to the router, its body read only as the handler reads it, the answer written as
//! its body comes (a length, or chunks for a stream such as Server-Sent Events).
//!
//! A connection waiting on its answer — a synchronous call or a long-poll, the front door's
//! common case under load — holds no buffer: the bytes of a request's head are copied out of
//! the read buffer (its header values share that one copy, its body too when it came with the
//! head), the buffer is let go, and an answer's head is made only once there is an answer.
//! (hyper's connection kept an 8 KiB read and an 8 KiB write buffer for its whole life.)
//!
//! While a request is answered the connection watches for the client going away, as hyper
//! did: the handler is then dropped (a waiting call stops waiting, a stream stops being fed).
//!
//! Owns: one HTTP/1.1 connection's requests, answers and end. Must not: know what a request
//! asks (the router's), accept or choose the protocol (`serve`).

mod fed;
mod head;

use std::io::Write as _;
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody as _};
use axum::http::{Method, Request, StatusCode, Version};
use futures_util::FutureExt as _;
use http_body_util::BodyExt as _;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use self::head::{AnswerFraming, RequestHead};
use crate::h1::{Framing, HEAD_READ, Peer, Reader};

/// How long a connection that will not carry another request goes on reading what its client
/// still sends (a body no handler read), so that closing it does not reset the answer just
/// written before the client reads it.
const LINGER: Duration = Duration::from_secs(2);
/// The most a lingering close reads before it closes anyway.
const LINGER_BYTES: usize = 1024 * 1024;

/// How a connection ended, for the log.
#[derive(Debug)]
pub(super) enum Ended {
    /// The client closed it, or either end chose not to carry another request.
    Closed,
    /// No request head came within the read timeout.
    TimedOut,
    /// Its client went away while a request was answered.
    ClientGone,
    /// A head that was not HTTP/1.1, refused with an answer.
    Refused(String),
    /// Reading or writing failed, or an answer's body broke off.
    Failed(String),
}

/// Serves `stream` until it ends: each request to `router`, each head within `timeout` of the
/// previous answer (or the connection's start); stops between requests once `shutdown` fires.
pub(super) async fn serve(
    stream: TcpStream,
    router: &Router,
    timeout: Duration,
    shutdown: &CancellationToken,
) -> Ended {
    let mut reader = Reader::new(stream, Peer::Client);
    loop {
        let deadline = Instant::now() + timeout;
        // The head first: a request that is there is served even when its deadline passed
        // while this task was not running (closing then would reset a request the client
        // already sent on a connection it had every reason to think open).
        let head = tokio::select! {
            biased;
            head = read_head(&mut reader) => head,
            () = tokio::time::sleep_until(deadline) => return Ended::TimedOut,
            () = shutdown.cancelled() => return Ended::Closed,
        };
        let (head, body) = match head {
            Ok(Some(head)) => head,
            Ok(None) => return Ended::Closed,
            Err(Err(e)) => return Ended::Failed(e.to_string()),
            Err(Ok(refused)) => {
                let answer = head::refusal(&refused);
                let _ = reader.wire_mut().write_all(&answer).await;
                linger(&mut reader).await;
                return Ended::Refused(refused.message);
            }
        };
        match answer(&mut reader, router, head, body, shutdown).await {
            Ok(true) => {}
            Ok(false) => {
                linger(&mut reader).await;
                return Ended::Closed;
            }
            Err(ended) => return ended,
        }
    }
}

/// A request's head and its body when that came whole with it; `Ok(None)` when the client
/// closed the connection between requests; `Err(Ok(_))` for a head to refuse.
async fn read_head(
    reader: &mut Reader<TcpStream>,
) -> Result<Option<(RequestHead, Option<Bytes>)>, Result<head::Refused, std::io::Error>> {
    loop {
        if !reader.buffered().is_empty()
            && let Some((head, len)) = head::parse(reader.buffered()).map_err(Ok)?
        {
            reader.consume(len);
            reader.begin(head.body);
            // A body that came with its head is copied out whole, the buffer let go.
            let whole = match head.body {
                Framing::Length(n) if n <= reader.buffered().len() as u64 => {
                    let n = n as usize;
                    let body = Bytes::copy_from_slice(&reader.buffered()[..n]);
                    reader.consume(n);
                    reader.begin(Framing::Empty);
                    Some(body)
                }
                _ => None,
            };
            return Ok(Some((head, whole)));
        }
        let held = reader.buffered().len();
        if reader.fill(HEAD_READ).await.map_err(Err)? == 0 {
            return if held == 0 {
                Ok(None)
            } else {
                Err(Err(std::io::ErrorKind::UnexpectedEof.into()))
            };
        }
    }
}

/// Answers one request; `Ok(true)` when the connection may carry another.
async fn answer(
    reader: &mut Reader<TcpStream>,
    router: &Router,
    head: RequestHead,
    whole: Option<Bytes>,
    shutdown: &CancellationToken,
) -> Result<bool, Ended> {
    let (body, mut feed) = match (whole, head.body) {
        (Some(bytes), _) => (Body::from(bytes), None),
        (None, Framing::Empty) => (Body::empty(), None),
        (None, framing) => {
            let length = match framing {
                Framing::Length(n) => Some(n),
                _ => None,
            };
            let (body, feed) = fed::channel(length);
            (Body::new(body), Some(feed))
        }
    };
    let mut request = Request::new(body);
    *request.method_mut() = head.method;
    *request.uri_mut() = head.uri;
    *request.version_mut() = head.version;
    *request.headers_mut() = head.headers;
    let bodiless = request.method() == Method::HEAD;
    let mut keep_alive = head.keep_alive;
    let mut continue_owed = head.expects_continue && feed.is_some();
    let mut watching = true;
    let mut handling = pin!(router.clone().oneshot(request));
    let response = loop {
        tokio::select! {
            biased;
            response = &mut handling => break response,
            side = beside(reader, feed.as_ref(), watching, &mut continue_owed) => match side? {
                Beside::Fed { more, whole } => {
                    keep_alive &= whole;
                    if !more {
                        feed = None;
                    }
                }
                // The handler let go of the body before its end: what is left of it is not
                // read, so the connection carries nothing more.
                Beside::Dropped => {
                    feed = None;
                    keep_alive = false;
                }
                Beside::Gone => return Err(Ended::ClientGone),
                Beside::Talking => watching = false,
            },
        }
    };
    let Ok(response) = response;
    let (parts, body) = response.into_parts();
    keep_alive &= reader.body_done() && !closes(&parts.headers) && !shutdown.is_cancelled();
    let status = parts.status;
    let framing = if bodiless
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        AnswerFraming::None
    } else if let Some(n) = body.size_hint().exact() {
        AnswerFraming::Length(n)
    } else if head.version == Version::HTTP_11 {
        AnswerFraming::Chunked
    } else {
        keep_alive = false;
        AnswerFraming::UntilClose
    };
    let mut out = Vec::with_capacity(256 + 64 * parts.headers.len());
    head::write_answer_head(
        &mut out,
        status,
        &parts.headers,
        framing,
        keep_alive,
        head.version,
    );
    drop(parts);
    if framing == AnswerFraming::None {
        drop(body);
        write(reader, &out).await?;
        return Ok(keep_alive);
    }
    write_body(reader, out, body, framing, watching).await?;
    Ok(keep_alive)
}

/// What happened beside the handler while it answered.
enum Beside {
    /// A piece of the body (or its end, `more` false) was handed over; `whole` false when the
    /// body broke off or was not valid.
    Fed { more: bool, whole: bool },
    /// The handler let go of the body before its end.
    Dropped,
    /// The client closed the connection.
    Gone,
    /// The client sent more (its next request).
    Talking,
}

/// While the handler works: feeds its body a piece when it asks (telling a client that
/// expects it to go on first), or, with the body read, watches for the client going away.
async fn beside(
    reader: &mut Reader<TcpStream>,
    feed: Option<&fed::Feed>,
    watching: bool,
    continue_owed: &mut bool,
) -> Result<Beside, Ended> {
    let Some(feed) = feed else {
        if !watching {
            return std::future::pending().await;
        }
        return Ok(if client_gone(reader).await {
            Beside::Gone
        } else {
            Beside::Talking
        });
    };
    if !feed.wanted().await {
        return Ok(Beside::Dropped);
    }
    if std::mem::take(continue_owed) {
        write(reader, b"HTTP/1.1 100 Continue\r\n\r\n").await?;
    }
    let piece = reader.piece().await;
    let fed = Beside::Fed {
        more: matches!(piece, Ok(Some(_))),
        whole: piece.is_ok(),
    };
    feed.give(piece);
    Ok(fed)
}

/// Writes the answer's head (`out`) and its body as it comes: the head with the body's first
/// piece when that is there at once (one write for a whole answer), alone before it when not.
async fn write_body(
    reader: &mut Reader<TcpStream>,
    mut out: Vec<u8>,
    body: Body,
    framing: AnswerFraming,
    mut watching: bool,
) -> Result<(), Ended> {
    let mut body = pin!(body);
    let mut left = match framing {
        AnswerFraming::Length(n) => n,
        _ => u64::MAX,
    };
    // A body whose first piece is not there yet (a stream's) has its head sent at once: the
    // client learns its answer began.
    let mut first = body.frame().now_or_never();
    if first.is_none() {
        write(reader, &out).await?;
        out.clear();
    }
    loop {
        let frame = match first.take() {
            Some(frame) => frame,
            None => tokio::select! {
                biased;
                frame = body.frame() => frame,
                gone = client_gone(reader), if watching => {
                    if gone {
                        return Err(Ended::ClientGone);
                    }
                    watching = false;
                    continue;
                }
            },
        };
        let data = match frame {
            None => break,
            Some(Err(e)) => {
                // What was written already cannot be taken back: the connection is closed
                // short, which the client sees as a broken answer.
                let _ = write(reader, &out).await;
                return Err(Ended::Failed(format!("an answer's body broke off: {e}")));
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                // Trailers: HTTP/1.1 answers here carry none.
                Err(_) => continue,
            },
        };
        if data.is_empty() {
            continue;
        }
        if framing == AnswerFraming::Length(0) || data.len() as u64 > left {
            return Err(Ended::Failed(
                "an answer's body is longer than its length said".into(),
            ));
        }
        left = left.saturating_sub(data.len() as u64);
        let end = body.is_end_stream();
        if framing == AnswerFraming::Chunked {
            let _ = write!(&mut out, "{:x}\r\n", data.len());
            let tail: &[u8] = if end { b"\r\n0\r\n\r\n" } else { b"\r\n" };
            write_parts(reader, &out, &data, tail).await?;
        } else {
            write_parts(reader, &out, &data, b"").await?;
        }
        out.clear();
        if end {
            return Ok(());
        }
    }
    if framing == AnswerFraming::Chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    if matches!(framing, AnswerFraming::Length(_)) && left != 0 {
        let _ = write(reader, &out).await;
        return Err(Ended::Failed(
            "an answer's body is shorter than its length said".into(),
        ));
    }
    write(reader, &out).await
}

/// Writes `bytes` and flushes.
async fn write(reader: &mut Reader<TcpStream>, bytes: &[u8]) -> Result<(), Ended> {
    write_parts(reader, bytes, b"", b"").await
}

/// Writes `a`, `b` and `c` as one (a vectored write where the kernel takes it).
async fn write_parts(
    reader: &mut Reader<TcpStream>,
    a: &[u8],
    b: &[u8],
    c: &[u8],
) -> Result<(), Ended> {
    if a.is_empty() && b.is_empty() && c.is_empty() {
        return Ok(());
    }
    let mut out = bytes::Buf::chain(bytes::Buf::chain(a, b), c);
    let wire = reader.wire_mut();
    let written = async {
        wire.write_all_buf(&mut out).await?;
        wire.flush().await
    };
    written
        .await
        .map_err(|e| Ended::Failed(format!("writing the answer failed: {e}")))
}

/// Resolves when the client closed the connection (`true`) or sent bytes (`false`: the next
/// request, kept in the socket until this answer is written). Holds no buffer while it waits.
async fn client_gone(reader: &Reader<TcpStream>) -> bool {
    let mut probe = [0u8; 1];
    !matches!(reader.wire().peek(&mut probe).await, Ok(n) if n > 0)
}

/// Whether the handler's answer asks for the connection's close.
fn closes(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::CONNECTION)
        .iter()
        .any(|v| {
            v.as_bytes()
                .split(|b| *b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
        })
}

/// Closes the sending side; then, if the client sent what was not read (a body no handler
/// read), reads and drops what it still sends for a moment, so that the answer is not lost to
/// the reset a close with bytes unread makes.
async fn linger(reader: &mut Reader<TcpStream>) {
    let unread = !reader.body_done() || !reader.buffered().is_empty();
    let wire = reader.wire_mut();
    if wire.shutdown().await.is_err() || !unread {
        return;
    }
    let until = Instant::now() + LINGER;
    let mut drained = 0;
    let mut sink = [0u8; 1024];
    while drained < LINGER_BYTES {
        match tokio::time::timeout_at(until, tokio::io::AsyncReadExt::read(wire, &mut sink)).await {
            Ok(Ok(n)) if n > 0 => drained += n,
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests;
