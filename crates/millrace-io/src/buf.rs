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
    /// Bytes a device lends instead of copying them (a member's pages in memory, see
    /// [`IoBuf::lent`]); what keeps them valid is dropped with the buffer.
    Lent(#[allow(dead_code)] Box<dyn Send + Sync>),
}

/// A range's bytes as a device lends them (`IoBuf::lent`), in order: one buffer per place they
/// lie in (a piece of the range on each member it covers), their lengths summing to the
/// range's.
pub type Lent = smallvec::SmallVec<[IoBuf; 1]>;

/// Whether the exports send reads from a device's lent bytes where it offers them (see
/// `IoBuf::lent`): on, unless `MILLRACE_LEND_READS=0`, which makes every read copy into a pool
/// buffer first (to measure what lending saves, or to rule it out).
pub fn lend_reads() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MILLRACE_LEND_READS").map_or(true, |v| v != "0"))
}

/// What an export does when a send from `bufs` failed with `e`. Where it is EFAULT, the kernel
/// could not read bytes a drive file's mapping lent: the file shrank under the mapping (a drive
/// file truncated behind the pool's back), which a copy in the kernel reports this way instead
/// of by SIGBUS. Each lent buffer whose bytes now lie past its file's end breaks that mapping,
/// so the drive's reads go by pread from then on and fail as the drive really does: the array
/// takes the member out of service and serves the range from the others, instead of every
/// read of it ending its connection again. Returns how many such buffers were found.
pub fn lent_send_failed<'a>(e: &io::Error, bufs: impl IntoIterator<Item = &'a IoBuf>) -> usize {
    if e.raw_os_error() != Some(libc::EFAULT) {
        return 0;
    }
    bufs.into_iter()
        .filter(|b| b.is_lent() && crate::mapped::shrank_under(b.ptr.as_ptr() as usize, b.len))
        .count()
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

    /// A buffer over `len` bytes at `ptr` that are not its own: a device's bytes already in
    /// memory (a drive file's pages), lent to be sent from instead of copied into a pool
    /// buffer. `keep` holds what keeps them valid (the drive that maps them) until the buffer
    /// is dropped. The bytes may change meanwhile (a write to the same blocks), as a device's
    /// may under any read that runs beside a write to the same place. A lent buffer is for
    /// reading only: `deref_mut` panics, as writing into it would write the device behind its
    /// back.
    ///
    /// # Safety
    /// `ptr..ptr+len` stays valid for reads while `keep` lives.
    pub unsafe fn lent(ptr: NonNull<u8>, len: usize, keep: Box<dyn Send + Sync>) -> IoBuf {
        IoBuf {
            ptr,
            len,
            cap: len,
            home: Home::Lent(keep),
        }
    }

    /// Whether the bytes are still those of the device that lent them (always, for a buffer
    /// that is not lent). False once the drive file's mapping they lie in broke (the file
    /// shrank under it, see [`crate::mapped`]): then a copy made of them may hold zeroes where
    /// the drive file lost its pages, and the read must be made again (by pread now, which
    /// reports what the drive really has).
    pub fn lent_intact(&self) -> bool {
        !self.is_lent() || crate::mapped::intact(self.ptr.as_ptr() as usize)
    }

    /// Whether the bytes are lent by a device (see [`IoBuf::lent`]).
    pub fn is_lent(&self) -> bool {
        matches!(self.home, Home::Lent(_))
    }

    /// A lent buffer that also keeps `more` until it is dropped (a layer above the device that
    /// lent it counts the request as in flight meanwhile); any other buffer as it is, `more`
    /// dropped now.
    pub fn keeping(self, more: impl Send + Sync + 'static) -> IoBuf {
        let b = std::mem::ManuallyDrop::new(self);
        let (ptr, len, cap) = (b.ptr, b.len, b.cap);
        // SAFETY: `b` is never used or dropped again: its home is moved out exactly once.
        let home = unsafe { std::ptr::read(&b.home) };
        let home = match home {
            Home::Lent(k) => Home::Lent(Box::new((k, more))),
            other => other,
        };
        IoBuf {
            ptr,
            len,
            cap,
            home,
        }
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
            // The keep goes with the field, after this.
            Home::Lent(_) => {}
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
        // A device's own bytes, lent for sending: a write here would bypass the device.
        assert!(
            !self.is_lent(),
            "a lent buffer holds a device's bytes and is never written"
        );
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
            .field("lent", &self.is_lent())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lent_buffer_keeps_its_owners_until_dropped_and_refuses_writes() {
        let owner = Arc::new(vec![7u8; 8192]);
        let more = Arc::new(());
        let p = NonNull::new(owner.as_ptr().cast_mut()).unwrap();
        // SAFETY: `owner`'s bytes live while the buffer keeps a reference to it.
        let b = unsafe { IoBuf::lent(p, 4096, Box::new(owner.clone())) }.keeping(more.clone());
        assert!(b.is_lent() && !b.is_pooled());
        assert_eq!(&b[..], &[7u8; 4096][..]);
        assert_eq!(
            (Arc::strong_count(&owner), Arc::strong_count(&more)),
            (2, 2)
        );
        let w = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let mut b = b;
            b[0] = 1;
        }));
        assert!(w.is_err(), "a lent buffer is never written");
        assert_eq!(owner[0], 7);
        assert_eq!(
            (Arc::strong_count(&owner), Arc::strong_count(&more)),
            (1, 1)
        );
        // Any other buffer drops what it is asked to keep at once.
        let _s = IoBuf::standalone(16).keeping(more.clone());
        assert_eq!(Arc::strong_count(&more), 1);
    }

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
