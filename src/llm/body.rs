//! An answer's body as it arrives, whichever way the call went: through reqwest's client, as a
//! stream of the model client's own HTTP/2 connection (`h2conn.rs`), or on one of its own
//! HTTP/1.1 connections (`h1conn.rs`), which the body gives back once dropped.
//!
//! Owns: reading the pieces, and giving a stream's flow-control credit back as they are read.
//! Must not: parse them.

use bytes::Bytes;

/// The body of one answer.
pub(super) enum Body {
    /// Read through reqwest's client.
    Pooled(reqwest::Response),
    /// A stream of the model client's own HTTP/2 connection.
    Stream(h2::RecvStream),
    /// An answer on one of the model client's own HTTP/1.1 connections, which it holds until
    /// it is dropped (then the connection goes back to its pool if the answer was read to its
    /// end).
    Connection(super::h1conn::Checkout),
}

/// Why a body stopped before its end.
#[derive(Debug)]
pub(super) struct Cut {
    /// The call's time ran out (reqwest's own timeout; the stream's is the caller's).
    pub(super) timed_out: bool,
    /// What broke, without the URL.
    pub(super) message: String,
}

impl Body {
    /// The next piece, `None` at the end.
    pub(super) async fn chunk(&mut self) -> Result<Option<Bytes>, Cut> {
        match self {
            Self::Pooled(response) => response.chunk().await.map_err(|e| Cut {
                timed_out: e.is_timeout(),
                message: super::without_url(&e),
            }),
            Self::Stream(stream) => match stream.data().await {
                None => Ok(None),
                Some(Ok(piece)) => {
                    // Read is consumed: the server may send as much again. An error here
                    // means the stream is gone, which the next read reports.
                    let _ = stream.flow_control().release_capacity(piece.len());
                    Ok(Some(piece))
                }
                Some(Err(e)) => Err(Cut {
                    timed_out: false,
                    message: e.to_string(),
                }),
            },
            Self::Connection(checkout) => checkout.piece().await.map_err(|message| Cut {
                timed_out: false,
                message,
            }),
        }
    }

    /// Reads what is left of a body whose answer is complete (a stream's terminal event came)
    /// as far as it has arrived, without waiting: a body seen to its end lets its HTTP/1.1
    /// connection carry the next call.
    pub(super) fn finish(&mut self) {
        use futures_util::FutureExt as _;
        // The end usually comes with the last event; a few pieces more are skipped.
        for _ in 0..4 {
            match self.chunk().now_or_never() {
                Some(Ok(Some(_))) => {}
                Some(Ok(None) | Err(_)) | None => return,
            }
        }
    }

    /// The whole body: one piece as it came (no copy), several joined.
    pub(super) async fn whole(mut self) -> Result<Bytes, Cut> {
        if let Self::Pooled(response) = self {
            return response.bytes().await.map_err(|e| Cut {
                timed_out: e.is_timeout(),
                message: super::without_url(&e),
            });
        }
        let Some(first) = self.chunk().await? else {
            return Ok(Bytes::new());
        };
        let Some(second) = self.chunk().await? else {
            return Ok(first);
        };
        let mut joined = bytes::BytesMut::with_capacity(first.len() + second.len());
        joined.extend_from_slice(&first);
        joined.extend_from_slice(&second);
        while let Some(piece) = self.chunk().await? {
            joined.extend_from_slice(&piece);
        }
        Ok(joined.freeze())
    }
}
