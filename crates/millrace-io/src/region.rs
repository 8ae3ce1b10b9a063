//! The memory behind a `BufPool`: the mapped region, its per-core slices and the counters. A
//! buffer gives its pages back here when dropped, so `buf` and `pool` both depend on this module
//! and not on each other.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore};

use crate::buddy::Buddy;

/// The alignment of every buffer: O_DIRECT members and registered buffers need 4 KiB.
pub const ALIGN: usize = 4096;

pub(crate) struct Slice {
    pub(crate) alloc: Mutex<Pages>,
    /// One permit: the waiter at the head of the line. Tokio's semaphore queues fairly, so the
    /// others wait behind it in arrival order and a stream of small requests cannot starve a
    /// large one.
    pub(crate) turnstile: Semaphore,
    /// Rung when pages come back while someone waits for them.
    pub(crate) freed: Notify,
    /// Takers waiting on `freed` (at most the one at the head of the line): a buffer given
    /// back rings only then, not once per request.
    pub(crate) waiting: AtomicUsize,
}

/// A slice's pages and what is counted under the same lock (no atomic of its own per take).
pub(crate) struct Pages {
    pub(crate) buddy: Buddy,
    pub(crate) gets: u64,
}

pub(crate) struct Inner {
    pub(crate) base: NonNull<u8>,
    pub(crate) bytes: usize,
    pub(crate) slice_bytes: usize,
    pub(crate) max_order: u8,
    pub(crate) slices: Vec<Slice>,
    pub(crate) peak: AtomicU64,
    pub(crate) in_use: AtomicU64,
    pub(crate) waits: AtomicU64,
    pub(crate) refused: AtomicU64,
}

// The region is plain memory owned by the pool; every access goes through IoBufs, each of which
// owns a disjoint run of pages.
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `BufPool::new`; no IoBuf is left (each holds an Arc).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes) };
    }
}

impl Inner {
    pub(crate) fn give_back(&self, slice: u32, page: u32, order: u8) {
        let s = &self.slices[slice as usize];
        s.alloc.lock().buddy.free(page, order);
        self.in_use
            .fetch_sub((ALIGN as u64) << order, Ordering::Relaxed);
        // After the free, so a taker that counted itself waiting either finds the pages or is
        // rung (its count and this look are both SeqCst, each beside the slice's lock).
        if s.waiting.load(Ordering::SeqCst) > 0 {
            s.freed.notify_one();
        }
    }
}
