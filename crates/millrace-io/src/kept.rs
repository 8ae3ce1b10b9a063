//! The heap buffers each thread keeps for reuse as scratch (`crate::scratch`): taken when a
//! scratch buffer is asked for and the core's pool has none, given back when one is dropped.
//! Below `buf` and `scratch`, which both use it.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::RefCell;
use std::ptr::NonNull;

use crate::region::ALIGN;

/// Heap buffers one thread keeps for reuse, at most this many ...
pub(crate) const KEEP: usize = 16;
/// ... and at most this many bytes of them.
pub(crate) const KEEP_BYTES: usize = 16 << 20;

struct Kept {
    /// (address, capacity) of free buffers.
    free: Vec<(NonNull<u8>, usize)>,
    bytes: usize,
}

impl Drop for Kept {
    fn drop(&mut self) {
        for (p, cap) in self.free.drain(..) {
            // SAFETY: allocated in `take` with this layout and no longer referenced.
            unsafe { dealloc(p.as_ptr(), layout(cap)) };
        }
    }
}

thread_local! {
    static KEPT: RefCell<Kept> = const { RefCell::new(Kept { free: Vec::new(), bytes: 0 }) };
}

fn layout(cap: usize) -> Layout {
    Layout::from_size_align(cap, ALIGN).expect("a scratch buffer's size overflows")
}

/// A heap buffer of at least `len` bytes (address, capacity): one this thread kept if one is
/// large enough, else a new one, zeroed once so its bytes are never uninitialised.
pub(crate) fn take(len: usize) -> (NonNull<u8>, usize) {
    let cap = len.div_ceil(ALIGN).max(1) * ALIGN;
    let reused = KEPT
        .try_with(|k| {
            let mut k = k.borrow_mut();
            // The smallest kept buffer that is large enough, so large ones stay for large asks.
            let i = (0..k.free.len())
                .filter(|&i| k.free[i].1 >= cap)
                .min_by_key(|&i| k.free[i].1)?;
            let (p, c) = k.free.swap_remove(i);
            k.bytes -= c;
            Some((p, c))
        })
        .ok()
        .flatten();
    reused.unwrap_or_else(|| {
        let l = layout(cap);
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(l) };
        (
            NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(l)),
            cap,
        )
    })
}

/// Takes back a buffer from `take` being dropped, or frees it when this thread keeps enough.
pub(crate) fn give_back(ptr: NonNull<u8>, cap: usize) {
    let kept = KEPT
        .try_with(|k| {
            let mut k = k.borrow_mut();
            if k.free.len() >= KEEP || k.bytes + cap > KEEP_BYTES {
                return false;
            }
            k.free.push((ptr, cap));
            k.bytes += cap;
            true
        })
        .unwrap_or(false);
    if !kept {
        // SAFETY: allocated in `take` with this layout; its owner is done with it.
        unsafe { dealloc(ptr.as_ptr(), layout(cap)) };
    }
}

/// Buffers and bytes this thread keeps now.
#[cfg(test)]
pub(crate) fn kept() -> (usize, usize) {
    KEPT.with(|k| {
        let k = k.borrow();
        (k.free.len(), k.bytes)
    })
}
