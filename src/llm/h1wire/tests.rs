//! Answers as servers frame them, arriving in pieces cut anywhere: every framing read to the
//! same body, the connection kept only when the answer allowed it, and answers that break
//! HTTP/1.1 refused with what broke.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Conn;
use crate::h1::Wire;

/// A server's bytes handed over in the given pieces, then the connection's end (or, `open`,
/// nothing more: a read waits). What the client writes is kept.
#[derive(Default)]
struct Scripted {
    reads: VecDeque<Vec<u8>>,
    open: bool,
    written: Vec<u8>,
}

impl Scripted {
    fn new(pieces: &[&[u8]], open: bool) -> Self {
        Self {
            reads: pieces.iter().map(|p| p.to_vec()).collect(),
            open,
            written: Vec::new(),
        }
    }
}

impl Wire for Scripted {
    /// As a socket's: waits while nothing more is there and the connection is open.
    async fn readable(&self) -> std::io::Result<()> {
        if self.reads.is_empty() && self.open {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

impl AsyncRead for Scripted {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        match me.reads.front_mut() {
            Some(piece) => {
                let n = piece.len().min(buf.remaining());
                buf.put_slice(&piece[..n]);
                piece.drain(..n);
                if piece.is_empty() {
                    me.reads.pop_front();
                }
                Poll::Ready(Ok(()))
            }
            None if me.open => Poll::Pending,
            None => Poll::Ready(Ok(())),
        }
    }
}

impl AsyncWrite for Scripted {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.get_mut().written.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// One call on a connection whose server sends `answer` cut into pieces at `cuts`: the
/// status, the body read to its end, and whether the connection may carry another call.
async fn read(answer: &[u8], cuts: &[usize], open: bool) -> Result<(u16, Vec<u8>, bool), String> {
    let mut pieces = Vec::new();
    let mut from = 0;
    for &cut in cuts.iter().chain([&answer.len()]) {
        pieces.push(&answer[from..cut]);
        from = cut;
    }
    let mut conn = Conn::new(Scripted::new(&pieces, open));
    conn.send(b"POST / HTTP/1.1\r\n\r\n", &[b"{", b"", b"}"])
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(conn.reader.wire().written, b"POST / HTTP/1.1\r\n\r\n{}");
    let (status, _) = conn.answer().await?;
    let mut body = Vec::new();
    while let Some(piece) = conn.piece().await? {
        assert!(!piece.is_empty(), "no empty pieces");
        body.extend_from_slice(&piece);
    }
    Ok((status, body, conn.between_calls()))
}

/// Every way to cut `answer` in two, and in bytes one by one: the same outcome each time.
async fn read_cut_anywhere(answer: &[u8], open: bool) -> Result<(u16, Vec<u8>, bool), String> {
    let whole = read(answer, &[], open).await;
    for cut in 1..answer.len() {
        assert_eq!(read(answer, &[cut], open).await, whole, "cut at {cut}");
    }
    let bytes: Vec<usize> = (1..answer.len()).collect();
    assert_eq!(read(answer, &bytes, open).await, whole, "byte by byte");
    whole
}

#[tokio::test]
async fn a_body_of_known_length_is_read_and_the_connection_kept() {
    let answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}";
    assert_eq!(
        read_cut_anywhere(answer, true).await,
        Ok((200, b"{\"ok\":true}".to_vec(), true))
    );
}

#[tokio::test]
async fn a_chunked_body_with_extensions_and_trailers_is_read_and_the_connection_kept() {
    let answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
        5;name=value\r\nhello\r\n1\r\n \r\nA\r\nevent: one\r\n0\r\nx-trailer: yes\r\n\r\n";
    assert_eq!(
        read_cut_anywhere(answer, true).await,
        Ok((200, b"hello event: one".to_vec(), true))
    );
}

#[tokio::test]
async fn a_body_up_to_the_close_is_read_and_the_connection_not_kept() {
    let answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it";
    assert_eq!(
        read_cut_anywhere(answer, false).await,
        Ok((200, b"all of it".to_vec(), false))
    );
}

#[tokio::test]
async fn informational_answers_are_passed_over_and_bodiless_ones_have_no_body() {
    let answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n";
    assert_eq!(
        read_cut_anywhere(answer, true).await,
        Ok((204, Vec::new(), true))
    );
}

#[tokio::test]
async fn a_server_that_says_it_closes_does_not_get_the_connection_again() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nconnection: keep-alive, close\r\ncontent-length: 2\r\n\r\nok"[..],
        b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
        // Both framings: the server closes after (RFC 9112 6.3).
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    ] {
        let (status, body, kept) = read(answer, &[], true).await.expect("read");
        assert_eq!((status, body.as_slice(), kept), (200, &b"ok"[..], false));
    }
    let keep = b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\ncontent-length: 2\r\n\r\nok";
    assert_eq!(read(keep, &[], true).await, Ok((200, b"ok".to_vec(), true)));
}

#[tokio::test]
async fn bytes_after_the_answer_keep_the_connection_from_another_call() {
    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n";
    assert_eq!(
        read(answer, &[], true).await,
        Ok((200, b"ok".to_vec(), false))
    );
}

#[tokio::test]
async fn an_answer_cut_off_or_not_http_is_an_error_and_the_connection_not_kept() {
    let cases: [(&[u8], &str); 8] = [
        (b"", "closed the connection without answering"),
        (b"HTTP/1.1 200 OK\r\ncontent-le", "within the answer's head"),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nab",
            "within the answer's body",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab",
            "within the answer's body",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            "size line is not valid",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nabc\r\n",
            "longer than its size",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab",
            "two different content-lengths",
        ),
        (b"SMTP ready\r\n\r\n", "not valid HTTP/1.1"),
    ];
    for (answer, expected) in cases {
        let mut conn = Conn::new(Scripted::new(&[answer], false));
        conn.send(b"POST / HTTP/1.1\r\n\r\n", &[b"", b"", b""])
            .await
            .expect("sent");
        let read = async {
            conn.answer().await?;
            while conn.piece().await?.is_some() {}
            Ok::<_, String>(())
        };
        let error = read.await.expect_err("an error");
        assert!(error.contains(expected), "{error:?} for {answer:?}");
        assert!(!conn.between_calls(), "not kept after {answer:?}");
    }
}

#[tokio::test]
async fn an_endless_head_or_chunk_line_is_refused_at_its_bound() {
    let mut head = b"HTTP/1.1 200 OK\r\nx-filler: ".to_vec();
    head.resize(super::MAX_HEAD + 10, b'x');
    let mut conn = Conn::new(Scripted::new(&[&head], true));
    conn.send(b"", &[b"", b"", b""]).await.expect("sent");
    let error = conn.answer().await.expect_err("too long");
    assert!(error.contains("head is over 65536 bytes"), "{error}");

    let mut line = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1;".to_vec();
    line.resize(line.len() + crate::h1::MAX_LINE + 10, b'x');
    let mut conn = Conn::new(Scripted::new(&[&line], true));
    conn.send(b"", &[b"", b"", b""]).await.expect("sent");
    conn.answer().await.expect("the head");
    let error = conn.piece().await.expect_err("too long");
    assert!(error.contains("a chunk's size line is over"), "{error}");
}

#[tokio::test]
async fn a_connection_waiting_for_its_answer_holds_no_buffer() {
    // The server has sent nothing yet: the read waits with no room made.
    let mut conn = Conn::new(Scripted::new(&[], true));
    conn.send(b"POST / HTTP/1.1\r\n\r\n", &[b"", b"", b""])
        .await
        .expect("sent");
    let waiting = futures_util::FutureExt::now_or_never(conn.answer());
    assert!(waiting.is_none(), "still waiting");
    assert_eq!(conn.reader.capacity(), 0, "no read buffer while waiting");
    // Once an answer was read whole, nothing is kept either.
    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let mut conn = Conn::new(Scripted::new(&[answer], true));
    conn.send(b"", &[b"", b"", b""]).await.expect("sent");
    conn.answer().await.expect("the head");
    let piece = conn.piece().await.expect("a piece");
    assert_eq!(piece.as_deref(), Some(&b"ok"[..]));
    assert_eq!(conn.reader.capacity(), 0, "the room after the body let go");
    assert_eq!(conn.piece().await, Ok(None));
    assert!(conn.between_calls());
}

#[tokio::test]
async fn an_idle_connection_the_server_closed_is_seen_closed() {
    let mut open = Conn::new(Scripted::new(&[], true));
    assert!(open.still_open());
    let mut closed = Conn::new(Scripted::new(&[], false));
    assert!(!closed.still_open(), "the end was read");
    let mut talking = Conn::new(Scripted::new(&[b"HTTP/1.1 408"], true));
    assert!(!talking.still_open(), "bytes no call asked for");
}

#[tokio::test]
async fn a_stream_waiting_for_its_next_chunk_holds_no_buffer() {
    let answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n";
    let mut conn = Conn::new(Scripted::new(&[answer], true));
    conn.send(b"", &[b"", b"", b""]).await.expect("sent");
    conn.answer().await.expect("the head");
    assert_eq!(
        conn.piece().await.expect("a piece").as_deref(),
        Some(&b"hello"[..])
    );
    let next = futures_util::FutureExt::now_or_never(conn.piece());
    assert!(next.is_none(), "waiting for the next chunk");
    assert_eq!(conn.reader.capacity(), 0, "no read buffer between chunks");
}
