//! Counting the process's heap allocations, for the bench: an allocator that wraps another and
//! counts every allocation (and reallocation), the bytes asked for, and the bytes held (asked
//! for and not yet given back) with their highest mark.
//!
//! The `aptix` binary installs it only when built with the `count-allocations` feature (the
//! product as shipped does not pay for the counting: a few relaxed atomic operations an
//! allocation); `/metrics` then shows `aptix_allocations_total`,
//! `aptix_allocated_bytes_total`, `aptix_heap_held_bytes` and `aptix_heap_held_peak_bytes`,
//! which `aptix-bench turns --closed-loop --processes` reads before and after its turns to
//! report allocations per turn, and the heap each turn in flight holds, for serve and worker.
//!
//! Owns: the counts. Must not: allocate (it is the allocator).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a counting allocator has counted since the process started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Allocations and reallocations.
    pub allocations: u64,
    /// Bytes asked for by them (a reallocation counts its new size).
    pub bytes: u64,
    /// Bytes held now: asked for and not given back (a reallocation holds its new size).
    pub held: u64,
    /// The most bytes held at once since the process started.
    pub held_peak: u64,
}

/// An allocator that counts what it hands out, then asks `A` for it.
#[derive(Debug)]
pub struct Counting<A> {
    inner: A,
    allocations: AtomicU64,
    bytes: AtomicU64,
    held: AtomicU64,
    held_peak: AtomicU64,
}

impl<A> Counting<A> {
    /// Counts in front of `inner`, from zero.
    pub const fn new(inner: A) -> Self {
        Self {
            inner,
            allocations: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            held: AtomicU64::new(0),
            held_peak: AtomicU64::new(0),
        }
    }

    /// What it has counted so far.
    pub fn counts(&self) -> Counts {
        Counts {
            allocations: self.allocations.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            held: self.held.load(Ordering::Relaxed),
            held_peak: self.held_peak.load(Ordering::Relaxed),
        }
    }

    /// An allocation of `size` bytes, or a reallocation to `size` of a block of `freed`.
    fn note(&self, size: usize, freed: usize) {
        self.allocations.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(size as u64, Ordering::Relaxed);
        let (size, freed) = (size as u64, freed as u64);
        if size >= freed {
            // `held` only moves by blocks handed out and given back, and a block is given
            // back after it was handed out, so it never goes below zero: no wrapping.
            let now = self
                .held
                .fetch_add(size - freed, Ordering::Relaxed)
                .wrapping_add(size - freed);
            self.held_peak.fetch_max(now, Ordering::Relaxed);
        } else {
            self.held.fetch_sub(freed - size, Ordering::Relaxed);
        }
    }
}

// SAFETY: every method hands the caller's arguments to `inner` unchanged and returns what it
// returns; the counting touches only atomics, and allocates nothing. A block is counted once
// `inner` has handed it out (a null answer holds nothing, and a failed reallocation leaves
// the old block held).
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `alloc`'s contract for `layout`.
        let block = unsafe { self.inner.alloc(layout) };
        if !block.is_null() {
            self.note(layout.size(), 0);
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let block = unsafe { self.inner.alloc_zeroed(layout) };
        if !block.is_null() {
            self.note(layout.size(), 0);
        }
        block
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.held.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `inner` (through this wrapper) with `layout`.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`, and the caller upholds `realloc`'s contract for `new_size`.
        let block = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if !block.is_null() {
            self.note(new_size, layout.size());
        }
        block
    }
}

/// Something that counts allocations: the installed [`Counting`] allocator.
pub trait CountsAllocations: Sync {
    /// What it has counted so far.
    fn counts(&self) -> Counts;
}

impl<A: Sync> CountsAllocations for Counting<A> {
    fn counts(&self) -> Counts {
        Counting::counts(self)
    }
}

static INSTALLED: OnceLock<&'static dyn CountsAllocations> = OnceLock::new();

/// Tells the library that `counter` is the process's global allocator, so its counts are
/// shown (`/metrics`). Once per process, before the metrics are made; a second call is
/// ignored.
pub fn install(counter: &'static dyn CountsAllocations) {
    let _ = INSTALLED.set(counter);
}

/// The installed counter's counts; `None` in a build that does not count.
pub fn counted() -> Option<Counts> {
    INSTALLED.get().map(|c| c.counts())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_allocation_and_reallocation_is_counted_with_its_size() {
        let counting = Counting::new(std::alloc::System);
        let layout = Layout::from_size_align(24, 8).unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: a non-zero layout, and each pointer goes back with the layout it has.
        unsafe {
            let a = counting.alloc(layout);
            assert!(!a.is_null());
            let b = counting.alloc_zeroed(layout);
            assert_eq!(*b, 0);
            let a = counting.realloc(a, layout, 100);
            counting.dealloc(a, Layout::from_size_align_unchecked(100, 8));
            counting.dealloc(b, layout);
        }
        // Freeing counts no allocation; it gives the bytes back, and the peak stays.
        assert_eq!(
            counting.counts(),
            Counts {
                allocations: 3,
                bytes: 24 + 24 + 100,
                held: 0,
                held_peak: 100 + 24,
            }
        );
    }

    #[test]
    fn the_bytes_held_follow_each_block_and_the_peak_keeps_the_most() {
        let counting = Counting::new(std::alloc::System);
        let big = Layout::from_size_align(1000, 8).unwrap_or_else(|e| panic!("{e}"));
        let small = Layout::from_size_align(10, 8).unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: non-zero layouts, and each pointer goes back with the layout it has.
        unsafe {
            let a = counting.alloc(big);
            assert_eq!(counting.counts().held, 1000);
            // Shrinking gives bytes back without raising the peak.
            let a = counting.realloc(a, big, 10);
            assert_eq!(
                (counting.counts().held, counting.counts().held_peak),
                (10, 1000)
            );
            let b = counting.alloc(big);
            assert_eq!(
                (counting.counts().held, counting.counts().held_peak),
                (1010, 1010)
            );
            counting.dealloc(b, big);
            counting.dealloc(a, small);
        }
        assert_eq!(
            (counting.counts().held, counting.counts().held_peak),
            (0, 1010)
        );
    }

    #[test]
    fn nothing_is_counted_until_a_counter_is_installed() {
        // The test binary's allocator is the system's: nothing installed one.
        assert_eq!(counted(), None);
    }
}
