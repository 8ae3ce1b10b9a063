//! Scratch buffers for bytes the engine makes itself (parity, old data read back for a
//! read-modify-write): taken from this core's slice of the pool where the thread is a core with
//! one and the slice has room now, else a heap buffer this thread recycles. Either way a write
//! pays neither an allocation nor a zeroing per request.
//!
//! Why: parity bought with `IoBuf::standalone` per full-stripe write (a zeroed 128 KiB on a
//! four-drive RAID6 with a 64 KiB strip) held the 128K NVMe/TCP write row of docs/PERFORMANCE.md
//! at half its rate: the zeroing, and the page faults of an allocator that hands memory of that
//! size back to the kernel at each free and takes it again at the next allocation.
//!
//! A scratch buffer's bytes are whatever it last held (never uninitialised memory: heap ones are
//! zeroed once, when first made); the caller writes all it reads.

use std::cell::RefCell;

use crate::buf::{Home, IoBuf};
use crate::kept;
use crate::BufPool;

thread_local! {
    /// The pool of the core this thread runs, if any (set by `Cores`).
    static POOL: RefCell<Option<BufPool>> = const { RefCell::new(None) };
}

/// Makes this thread take scratch buffers from `pool` first (the core runtime calls it).
pub(crate) fn set_thread_pool(pool: Option<BufPool>) {
    POOL.with(|p| *p.borrow_mut() = pool);
}

/// A buffer of `len` bytes whose content is left over from an earlier use: the caller
/// overwrites every byte it later reads.
pub fn scratch(len: usize) -> IoBuf {
    let pooled = POOL
        .try_with(|p| {
            p.borrow()
                .as_ref()
                .and_then(|pool| pool.try_get(len).ok().flatten())
        })
        .ok()
        .flatten();
    pooled.unwrap_or_else(|| {
        let (ptr, cap) = kept::take(len);
        IoBuf::from_pool(ptr, len, cap, Home::Kept)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PoolConfig, ALIGN};

    #[test]
    fn heap_scratch_is_reused_by_its_thread_and_bounded() {
        let a = scratch(100_000);
        assert_eq!(a.len(), 100_000);
        assert_eq!(a.capacity() % ALIGN, 0);
        assert_eq!(a.as_ptr() as usize % ALIGN, 0);
        assert!(a.iter().all(|&b| b == 0), "a new heap buffer starts zeroed");
        let at = a.as_ptr();
        drop(a);
        let b = scratch(64 << 10);
        assert_eq!(b.as_ptr(), at, "a freed buffer large enough is reused");
        assert_eq!(b.len(), 64 << 10);
        drop(b);
        // More than the thread keeps: the extra ones are freed, not kept.
        let many: Vec<IoBuf> = (0..kept::KEEP + 4).map(|_| scratch(2 << 20)).collect();
        drop(many);
        let (n, bytes) = kept::kept();
        assert!(n <= kept::KEEP && bytes <= kept::KEEP_BYTES);
    }

    #[test]
    fn a_core_thread_takes_scratch_from_its_pool_first() {
        let pool = BufPool::new(&PoolConfig {
            bytes: 256 << 10,
            slices: 1,
            max_buf: 128 << 10,
            ..PoolConfig::default()
        })
        .unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                set_thread_pool(Some(pool.clone()));
                let a = scratch(128 << 10);
                let b = scratch(128 << 10);
                assert!(a.is_pooled() && b.is_pooled());
                let c = scratch(128 << 10);
                assert!(!c.is_pooled(), "an empty slice leaves scratch to the heap");
                drop((a, b, c));
                assert!(scratch(4096).is_pooled());
            });
        });
    }
}
