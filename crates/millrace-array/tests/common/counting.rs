//! A global allocator that counts allocations (the system allocator does the work), for the
//! binaries that measure allocations per request: `tests/allocations.rs` and
//! `examples/datapath_cost.rs` include this file by path. Not part of `common/mod.rs`: every
//! test binary includes that, and this installs itself as the binary's allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
// SAFETY: the system allocator does the work; this only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}
#[global_allocator]
static A: Counting = Counting;

/// Allocations made by every thread of this process so far.
pub fn allocations() -> u64 {
    ALLOCS.load(Ordering::Relaxed)
}
