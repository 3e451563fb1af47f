//! A request body that arrives after its head: handed to the router as a body that asks the
//! connection for each piece, one at a time, when the handler reads. Nothing is read off the
//! connection before a handler wants it, so a handler that refuses a body (too large, wrong
//! media type) has not had it read for nothing, and a client that sent `Expect: 100-continue`
//! is told to go on only then.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use axum::body::Bytes;

/// What the two ends share.
#[derive(Default)]
struct Slot {
    /// A piece handed over and not yet taken (or the error that ended the body).
    piece: Option<Result<Bytes, String>>,
    /// The body was read to its end.
    ended: bool,
    /// The handler asked for a piece that has not come yet.
    wanted: bool,
    /// The handler let go of the body.
    dropped: bool,
    handler: Option<Waker>,
    connection: Option<Waker>,
}

fn lock(slot: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    match slot.lock() {
        Ok(slot) => slot,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// A body of `remaining` bytes (or of unknown length, chunked), and the connection's end that
/// feeds it.
pub(super) fn channel(remaining: Option<u64>) -> (FedBody, Feed) {
    let slot = Arc::new(Mutex::new(Slot::default()));
    (
        FedBody {
            slot: Arc::clone(&slot),
            remaining,
        },
        Feed { slot },
    )
}

/// The connection's end.
pub(super) struct Feed {
    slot: Arc<Mutex<Slot>>,
}

impl Feed {
    /// Resolves once the handler wants the next piece (`true`), or let go of the body
    /// (`false`).
    pub(super) async fn wanted(&self) -> bool {
        std::future::poll_fn(|cx| {
            let mut slot = lock(&self.slot);
            if slot.dropped {
                return Poll::Ready(false);
            }
            if slot.wanted && slot.piece.is_none() {
                return Poll::Ready(true);
            }
            match &mut slot.connection {
                Some(waker) => waker.clone_from(cx.waker()),
                None => slot.connection = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
        .await
    }

    /// Hands the handler the next piece (`Ok(None)`: the body's end; an error ends it too).
    pub(super) fn give(&self, piece: Result<Option<Bytes>, String>) {
        let mut slot = lock(&self.slot);
        match piece {
            Ok(Some(piece)) => slot.piece = Some(Ok(piece)),
            Ok(None) => slot.ended = true,
            Err(e) => slot.piece = Some(Err(e)),
        }
        slot.wanted = false;
        if let Some(waker) = slot.handler.take() {
            waker.wake();
        }
    }
}

/// The handler's end: a body whose pieces the connection reads when asked.
pub(super) struct FedBody {
    slot: Arc<Mutex<Slot>>,
    /// What a declared length leaves to come.
    remaining: Option<u64>,
}

impl Drop for FedBody {
    fn drop(&mut self) {
        let mut slot = lock(&self.slot);
        slot.dropped = true;
        if let Some(waker) = slot.connection.take() {
            waker.wake();
        }
    }
}

/// Why a body could not be read to its end: the client broke it off, or framed it wrongly.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct BodyBroken(String);

impl http_body::Body for FedBody {
    type Data = Bytes;
    type Error = BodyBroken;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BodyBroken>>> {
        let me = self.get_mut();
        let mut slot = lock(&me.slot);
        match slot.piece.take() {
            Some(Ok(piece)) => {
                if let Some(remaining) = &mut me.remaining {
                    *remaining = remaining.saturating_sub(piece.len() as u64);
                }
                return Poll::Ready(Some(Ok(http_body::Frame::data(piece))));
            }
            Some(Err(e)) => {
                slot.ended = true;
                return Poll::Ready(Some(Err(BodyBroken(e))));
            }
            None if slot.ended => return Poll::Ready(None),
            None => {}
        }
        slot.wanted = true;
        match &mut slot.handler {
            Some(waker) => waker.clone_from(cx.waker()),
            None => slot.handler = Some(cx.waker().clone()),
        }
        if let Some(waker) = slot.connection.take() {
            waker.wake();
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        let slot = lock(&self.slot);
        slot.ended && slot.piece.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.remaining {
            Some(n) => http_body::SizeHint::with_exact(n),
            None => http_body::SizeHint::default(),
        }
    }
}
