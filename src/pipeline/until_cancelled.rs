//! A future raced against a cancellation token, polled where it lies.
//!
//! `tokio::select!` moves its futures into a tuple of its own, and tokio-util's
//! `run_until_cancelled` is an `async fn` that keeps its argument beside the future it builds
//! from it: either way a future that waits long (a turn on its model, a worker's turn task)
//! is held twice. [`until_cancelled`] holds it once.
//!
//! Owns: the race. Must not: know what the work or the token stand for.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

pin_project_lite::pin_project! {
    /// `Some` of what the work gave, or `None` once the token is cancelled (the work is
    /// dropped unfinished).
    pub(crate) struct UntilCancelled<F> {
        #[pin]
        work: F,
        #[pin]
        stop: WaitForCancellationFutureOwned,
    }
}

/// Runs `work` until `token` is cancelled.
pub(crate) fn until_cancelled<F: Future>(token: CancellationToken, work: F) -> UntilCancelled<F> {
    UntilCancelled {
        work,
        stop: token.cancelled_owned(),
    }
}

impl<F: Future> Future for UntilCancelled<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // The work first: what it finished with is kept even if the stop came meanwhile.
        if let Poll::Ready(out) = this.work.poll(cx) {
            return Poll::Ready(Some(out));
        }
        this.stop.poll(cx).map(|()| None)
    }
}

/// For tests of what a combinator holds: a future that keeps 4 KiB across its await and gives
/// 4,096.
#[cfg(test)]
pub(crate) async fn holding_4_kib() -> usize {
    let big = [1_u8; 4096];
    tokio::task::yield_now().await;
    big.iter().map(|b| usize::from(*b)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_work_finishes_or_is_dropped_at_the_stop() {
        let token = CancellationToken::new();
        assert_eq!(until_cancelled(token.clone(), async { 7 }).await, Some(7));

        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let never = async move {
            let _held = tx;
            std::future::pending::<u32>().await
        };
        let race = until_cancelled(token.clone(), never);
        token.cancel();
        assert_eq!(race.await, None);
        assert!(rx.await.is_err(), "the unfinished work was dropped");
    }

    #[tokio::test]
    async fn work_that_is_ready_wins_over_a_stop_already_made() {
        let token = CancellationToken::new();
        token.cancel();
        assert_eq!(until_cancelled(token, async { 1 }).await, Some(1));
    }

    #[tokio::test]
    async fn the_work_is_held_once() {
        let work = holding_4_kib();
        let alone = std::mem::size_of_val(&work);
        assert!(alone >= 4096, "the work holds its 4 KiB: {alone} B");
        let race = until_cancelled(CancellationToken::new(), work);
        let size = std::mem::size_of_val(&race);
        assert!(size < alone + 256, "{size} B for a work of {alone}");
        assert_eq!(race.await, Some(4096));
    }
}
