//! Boxing a turn's large futures where they will live.
//!
//! `Box::pin(f())` builds `f`'s future on the stack, then copies it into the heap: every byte
//! of its type's size, whatever state it is in (a future not yet polled holds only its
//! arguments, but its type is as large as its largest state). For a run (~11 KB) and a run's
//! opening step (~14 KB) that was ~25 KB copied on every turn (callgrind, 2026-11-29: `memcpy`
//! under `Box::new`, 5 % of the worker's instructions). Allocating the box first and writing
//! the future into it lets the compiler build the future in the box.

use std::future::Future;
use std::pin::Pin;

/// The future `make` returns, pinned in a box allocated before it is made.
#[inline(always)]
pub(crate) fn boxed<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    let slot = Box::new_uninit();
    Box::into_pin(Box::write(slot, make()))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn the_boxed_future_is_the_one_made_once() {
        let made = AtomicUsize::new(0);
        let big = [7_u8; 4096];
        let fut = super::boxed(|| {
            made.fetch_add(1, Ordering::Relaxed);
            async move { big.iter().map(|b| usize::from(*b)).sum::<usize>() }
        });
        assert_eq!(
            made.load(Ordering::Relaxed),
            1,
            "made before it is awaited, once"
        );
        assert_eq!(fut.await, 7 * 4096);
    }
}
