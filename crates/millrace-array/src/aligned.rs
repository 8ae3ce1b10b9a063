//! Heap buffers aligned for O_DIRECT. A few lines of `std::alloc` do this; the crates that offer
//! it bring more than we need, so it is written here.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

pub const ALIGN: usize = 4096;

pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// The buffer owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes whose start is 4 KiB aligned.
    pub fn zeroed(len: usize) -> AlignedBuf {
        if len == 0 {
            return AlignedBuf {
                ptr: NonNull::dangling(),
                len: 0,
            };
        }
        let layout = Layout::from_size_align(len, ALIGN).expect("buffer size overflows");
        // SAFETY: layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    pub fn from_slice(data: &[u8]) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(data.len());
        b.copy_from_slice(data);
        b
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `zeroed` with this very layout.
            unsafe {
                dealloc(
                    self.ptr.as_ptr(),
                    Layout::from_size_align_unchecked(self.len, ALIGN),
                )
            }
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes (or dangling with len 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Whether a slice can go to an O_DIRECT member as it is.
pub fn is_aligned(buf: &[u8]) -> bool {
    (buf.as_ptr() as usize).is_multiple_of(ALIGN) && buf.len().is_multiple_of(ALIGN)
}

thread_local! {
    static SPARE: std::cell::RefCell<Vec<AlignedBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A buffer of `len` bytes for data about to be overwritten whole (a read target, a strip to be
/// rebuilt), reused from this thread's earlier requests: a degraded read at several GB/s spends
/// real CPU on allocating and zeroing fresh buffers. Its contents are left over, not zero.
pub fn scratch(len: usize) -> AlignedBuf {
    SPARE
        .with(|s| {
            let mut s = s.borrow_mut();
            s.iter()
                .position(|b| b.len() == len)
                .map(|i| s.swap_remove(i))
        })
        .unwrap_or_else(|| AlignedBuf::zeroed(len))
}

/// The most bytes of spare buffers one thread keeps for `scratch`. A rebuild's windows change
/// size with the load, so buffers of sizes no longer asked for would otherwise stay, up to 64
/// of them a thread, each up to a few MiB per member (an idle rebuild of 16 members held 417
/// MiB of anonymous memory at its peak, docs/PERFORMANCE.md).
pub const SPARE_BYTES: usize = 32 << 20;

/// Gives buffers back for `scratch` to reuse (a few per thread, at most [`SPARE_BYTES`]; the
/// oldest are freed first).
pub fn recycle(bufs: impl IntoIterator<Item = AlignedBuf>) {
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        let mut held: usize = s.iter().map(|b| b.len()).sum();
        for b in bufs {
            if b.len() > SPARE_BYTES {
                continue;
            }
            held += b.len();
            s.push(b);
            while s.len() > 64 || held > SPARE_BYTES {
                held -= s.remove(0).len();
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spare_bytes() -> usize {
        SPARE.with(|s| s.borrow().iter().map(|b| b.len()).sum())
    }

    #[test]
    fn spares_stay_within_their_bytes_and_keep_the_newest() {
        let mib = 1 << 20;
        // Windows that change size: 4 MiB buffers, then 2 MiB ones, as a rebuild's do.
        recycle((0..12).map(|_| AlignedBuf::zeroed(4 * mib)));
        assert!(spare_bytes() <= SPARE_BYTES, "{} bytes kept", spare_bytes());
        recycle((0..16).map(|_| AlignedBuf::zeroed(2 * mib)));
        assert_eq!(
            spare_bytes(),
            16 * 2 * mib,
            "the older 4 MiB buffers go first"
        );
        assert_eq!(scratch(2 * mib).len(), 2 * mib);
        assert_eq!(
            spare_bytes(),
            15 * 2 * mib,
            "a spare of the size asked is reused"
        );
        // Larger than all the spares may hold: freed at once.
        recycle([AlignedBuf::zeroed(SPARE_BYTES + ALIGN)]);
        assert_eq!(spare_bytes(), 15 * 2 * mib);
    }
}
