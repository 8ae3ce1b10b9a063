//! `IoBuf`: an owned, 4 KiB-aligned I/O buffer. It comes from a [`crate::BufPool`] slice (and
//! goes back there when dropped) or, for tests and the CLI, stands alone on the heap.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fmt;
use std::io;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::region::Inner;
pub use crate::region::ALIGN;

pub(crate) enum Home {
    /// Pages `page..page + 2^order` of slice `slice` of a pool.
    Pool {
        pool: Arc<Inner>,
        slice: u32,
        page: u32,
        order: u8,
    },
    /// A heap allocation of `cap` bytes (a standalone buffer).
    Heap,
    /// A heap scratch buffer that goes back to the dropping thread's keep (`crate::kept`).
    Kept,
}

/// An owned I/O buffer: Send, derefs to `[u8]` of its current length, which may be set to
/// anything up to its capacity. Ownership moves into a device call and comes back with its
/// result, so a dropped future never leaves the kernel writing into memory someone else owns.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
    home: Home,
}

// An IoBuf owns its bytes exclusively, like a Vec<u8>; the pool it returns to is shared safely.
unsafe impl Send for IoBuf {}
unsafe impl Sync for IoBuf {}

impl IoBuf {
    pub(crate) fn from_pool(ptr: NonNull<u8>, len: usize, cap: usize, home: Home) -> IoBuf {
        IoBuf {
            ptr,
            len,
            cap,
            home,
        }
    }

    /// A zeroed buffer of `len` bytes outside any pool, for tests, the CLI and other paths that
    /// are not bounded by the pool (it allocates and zeroes; the data path's own bytes come from
    /// [`crate::scratch`] instead).
    pub fn standalone(len: usize) -> IoBuf {
        let cap = len.div_ceil(ALIGN).max(1) * ALIGN;
        let layout = Layout::from_size_align(cap, ALIGN).expect("buffer size overflows");
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        IoBuf {
            ptr,
            len,
            cap,
            home: Home::Heap,
        }
    }

    /// A standalone buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> IoBuf {
        let mut b = IoBuf::standalone(data.len());
        b.copy_from_slice(data);
        b
    }

    /// The current length (without forming a slice over the bytes, which the kernel may be
    /// writing while the buffer is lent to it).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The start of the bytes, without forming a slice over them (for I/O submission).
    pub fn raw_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes the buffer can hold.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Sets the length. Bytes between the old and the new length are whatever the buffer held
    /// (a pool never zeroes); refused past the capacity.
    pub fn set_len(&mut self, len: usize) -> io::Result<()> {
        if len > self.cap {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a buffer of {} bytes cannot be given a length of {len} bytes; ask the pool for a larger one",
                    self.cap
                ),
            ));
        }
        self.len = len;
        Ok(())
    }

    /// The pool slice and registered-buffer index this buffer belongs to, if it came from a pool
    /// with identity `pool_id` (see [`crate::BufPool::id`]).
    pub fn registered_index(&self, pool_id: usize) -> Option<u16> {
        match &self.home {
            Home::Pool { pool, slice, .. } if Arc::as_ptr(pool) as usize == pool_id => {
                Some(*slice as u16)
            }
            _ => None,
        }
    }

    /// Whether the buffer came from a pool (false: a standalone buffer).
    pub fn is_pooled(&self) -> bool {
        matches!(self.home, Home::Pool { .. })
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        match &self.home {
            Home::Pool {
                pool,
                slice,
                page,
                order,
            } => pool.give_back(*slice, *page, *order),
            Home::Kept => crate::kept::give_back(self.ptr, self.cap),
            Home::Heap => {
                // SAFETY: allocated in `standalone` with this very layout.
                unsafe {
                    dealloc(
                        self.ptr.as_ptr(),
                        Layout::from_size_align_unchecked(self.cap, ALIGN),
                    )
                }
            }
        }
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len bytes, owned by this buffer.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBuf")
            .field("len", &self.len)
            .field("capacity", &self.cap)
            .field("pooled", &self.is_pooled())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_is_aligned_zeroed_and_resizable() {
        let mut b = IoBuf::standalone(5000);
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        assert_eq!(b.len(), 5000);
        assert_eq!(b.capacity(), 8192);
        assert!(b.iter().all(|&x| x == 0));
        b.set_len(8192).unwrap();
        let e = b.set_len(8193).unwrap_err().to_string();
        assert!(e.contains("8192 bytes"), "{e}");
        assert!(!b.is_pooled());
        let c = IoBuf::from_slice(b"hello");
        assert_eq!(&c[..], b"hello");
    }
}
