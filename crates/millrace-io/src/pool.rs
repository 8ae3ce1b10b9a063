//! `BufPool`: one 4 KiB-aligned region mapped (and, by default, faulted in) at start-up, cut into
//! one slice per core. Each slice hands out power-of-two runs of pages from a buddy allocator, so
//! a request costs no allocation, no zeroing and no page fault. When a slice is empty, `get`
//! waits in line (first come, first served) and `try_get` says no at once.

use std::cell::Cell;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore};

use crate::buddy::Buddy;
use crate::buf::{Home, IoBuf};
use crate::region::{Inner, Pages, Slice, ALIGN};

/// The shape of a pool.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Bytes of the whole region (rounded down to whole pages per slice).
    pub bytes: usize,
    /// Slices: one per core that serves I/O.
    pub slices: usize,
    /// The largest buffer one request may take (rounded up to a power of two of pages); it
    /// must fit in a slice.
    pub max_buf: usize,
    /// Fault every page in at start-up (MAP_POPULATE), so no request ever page-faults.
    pub populate: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            bytes: 256 << 20,
            slices: 1,
            max_buf: 32 << 20,
            populate: true,
        }
    }
}

/// What the pool holds and has done, for metrics and for tests that assert a memory bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolUsage {
    /// Bytes of the region (the bound on buffer memory).
    pub capacity_bytes: u64,
    /// Bytes handed out now (whole power-of-two runs of pages).
    pub in_use_bytes: u64,
    /// The most ever handed out at once.
    pub peak_bytes: u64,
    /// Buffers handed out.
    pub gets: u64,
    /// Gets that found their slice empty (or others already waiting) and waited in line.
    pub waits: u64,
    /// Requests refused because they were larger than the largest buffer.
    pub refused: u64,
}

/// A bounded pool of aligned I/O buffers, cheap to clone (all clones share the region).
#[derive(Clone)]
pub struct BufPool {
    inner: Arc<Inner>,
}

static NEXT_SLICE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The slice this thread takes buffers from: its core's, or one given out in turn.
    static MY_SLICE: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Makes this thread take buffers from slice `i` (the per-core runtime calls it on each core).
pub fn set_thread_slice(i: usize) {
    MY_SLICE.with(|s| s.set(Some(i)));
}

fn thread_slice() -> usize {
    MY_SLICE.with(|s| match s.get() {
        Some(i) => i,
        None => {
            let i = NEXT_SLICE.fetch_add(1, Ordering::Relaxed);
            s.set(Some(i));
            i
        }
    })
}

fn order_for(len: usize) -> u8 {
    let pages = len.div_ceil(ALIGN).max(1);
    pages.next_power_of_two().trailing_zeros() as u8
}

impl BufPool {
    /// Maps the region and slices it. Refused (with a sentence) when the largest buffer would
    /// not fit in a slice, or the memory cannot be had.
    pub fn new(cfg: &PoolConfig) -> io::Result<BufPool> {
        let slices = cfg.slices.max(1);
        let slice_pages = cfg.bytes / slices / ALIGN;
        let max_order = order_for(cfg.max_buf.max(1));
        if slice_pages < 1 << max_order || slice_pages > u32::MAX as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a buffer pool of {} bytes in {slices} slices cannot hold a {}-byte buffer in each slice; give the pool at least {} bytes or lower the largest I/O size",
                    cfg.bytes,
                    ALIGN << max_order,
                    (ALIGN << max_order) * slices
                ),
            ));
        }
        let slice_bytes = slice_pages * ALIGN;
        let bytes = slice_bytes * slices;
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        if cfg.populate {
            flags |= libc::MAP_POPULATE;
        }
        // SAFETY: an anonymous private mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "could not map a buffer pool of {bytes} bytes: {e}; give the pool less memory"
                ),
            ));
        }
        let slices = (0..slices)
            .map(|_| Slice {
                alloc: Mutex::new(Pages {
                    buddy: Buddy::new(slice_pages as u32, max_order),
                    gets: 0,
                }),
                turnstile: Semaphore::new(1),
                freed: Notify::new(),
                waiting: AtomicUsize::new(0),
            })
            .collect();
        Ok(BufPool {
            inner: Arc::new(Inner {
                base: NonNull::new(p.cast()).expect("mmap returned a non-null mapping"),
                bytes,
                slice_bytes,
                max_order,
                slices,
                peak: AtomicU64::new(0),
                in_use: AtomicU64::new(0),
                waits: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            }),
        })
    }

    /// An identity for this pool (stable while any clone lives), to match buffers to rings
    /// that registered it.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    pub fn slices(&self) -> usize {
        self.inner.slices.len()
    }

    /// The largest buffer a request may take.
    pub fn max_buf(&self) -> usize {
        ALIGN << self.inner.max_order
    }

    /// One iovec per slice, for io_uring buffer registration (the buffer index of a pooled
    /// IoBuf is its slice).
    pub fn iovecs(&self) -> Vec<libc::iovec> {
        (0..self.slices())
            .map(|i| libc::iovec {
                // SAFETY: inside the mapping.
                iov_base: unsafe { self.inner.base.as_ptr().add(i * self.inner.slice_bytes) }
                    .cast(),
                iov_len: self.inner.slice_bytes,
            })
            .collect()
    }

    /// Bytes free in each slice now.
    pub fn free_bytes(&self) -> Vec<u64> {
        self.inner
            .slices
            .iter()
            .map(|s| s.alloc.lock().buddy.free_pages() as u64 * ALIGN as u64)
            .collect()
    }

    pub fn usage(&self) -> PoolUsage {
        let i = &self.inner;
        PoolUsage {
            capacity_bytes: i.bytes as u64,
            in_use_bytes: i.in_use.load(Ordering::Relaxed),
            peak_bytes: i.peak.load(Ordering::Relaxed),
            gets: i.slices.iter().map(|s| s.alloc.lock().gets).sum(),
            waits: i.waits.load(Ordering::Relaxed),
            refused: i.refused.load(Ordering::Relaxed),
        }
    }

    fn check(&self, len: usize) -> io::Result<u8> {
        if len > self.max_buf() {
            self.inner.refused.fetch_add(1, Ordering::Relaxed);
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "an I/O of {len} bytes is larger than the largest buffer of the pool ({} bytes); split it into smaller requests",
                    self.max_buf()
                ),
            ));
        }
        Ok(order_for(len))
    }

    fn take(&self, slice: usize, order: u8, len: usize) -> Option<IoBuf> {
        let i = &self.inner;
        let s = &i.slices[slice];
        let page = {
            let mut pages = s.alloc.lock();
            let page = pages.buddy.alloc(order)?;
            pages.gets += 1;
            page
        };
        let n = (ALIGN as u64) << order;
        let now = i.in_use.fetch_add(n, Ordering::Relaxed) + n;
        if now > i.peak.load(Ordering::Relaxed) {
            i.peak.fetch_max(now, Ordering::Relaxed);
        }
        let at = slice * i.slice_bytes + page as usize * ALIGN;
        // SAFETY: inside the mapping; the buddy allocator gave these pages to this buffer alone.
        let ptr = unsafe { NonNull::new_unchecked(i.base.as_ptr().add(at)) };
        Some(IoBuf::from_pool(
            ptr,
            len,
            ALIGN << order,
            Home::Pool {
                pool: i.clone(),
                slice: slice as u32,
                page,
                order,
            },
        ))
    }

    /// A buffer of `len` bytes from this thread's slice, if one is free now and nobody is
    /// waiting in line for that slice. Err: larger than the largest buffer.
    pub fn try_get(&self, len: usize) -> io::Result<Option<IoBuf>> {
        let order = self.check(len)?;
        let slice = thread_slice() % self.slices();
        if self.inner.slices[slice].turnstile.available_permits() == 0 {
            return Ok(None);
        }
        Ok(self.take(slice, order, len))
    }

    /// A buffer of `len` bytes from this thread's slice, waiting in line while the slice is
    /// empty. Cancel-safe: a dropped wait leaves the line and takes nothing. Err: larger than
    /// the largest buffer.
    pub async fn get(&self, len: usize) -> io::Result<IoBuf> {
        let order = self.check(len)?;
        let slice = thread_slice() % self.slices();
        let s = &self.inner.slices[slice];
        if s.turnstile.available_permits() > 0 {
            if let Some(b) = self.take(slice, order, len) {
                return Ok(b);
            }
        }
        self.inner.waits.fetch_add(1, Ordering::Relaxed);
        let _turn = s
            .turnstile
            .acquire()
            .await
            .expect("the turnstile is never closed");
        s.waiting.fetch_add(1, Ordering::SeqCst);
        let _counted = Waiting(&s.waiting);
        loop {
            let freed = s.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(b) = self.take(slice, order, len) {
                return Ok(b);
            }
            freed.await;
        }
    }
}

/// A taker counted as waiting for freed pages until it has them or gives up.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> BufPool {
        BufPool::new(&PoolConfig {
            bytes: 64 << 10,
            slices: 1,
            max_buf: 32 << 10,
            populate: false,
        })
        .unwrap()
    }

    #[test]
    fn buffers_are_aligned_disjoint_and_come_back() {
        let p = small();
        let a = p.try_get(4096).unwrap().unwrap();
        let mut b = p.try_get(10_000).unwrap().unwrap();
        assert_eq!(b.len(), 10_000);
        assert_eq!(b.capacity(), 16384);
        assert_eq!(a.as_ptr() as usize % ALIGN, 0);
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        b.fill(7);
        assert!(a.iter().all(|&x| x != 7) || a.is_empty());
        assert_eq!(p.usage().in_use_bytes, 4096 + 16384);
        drop(a);
        drop(b);
        let u = p.usage();
        assert_eq!(u.in_use_bytes, 0);
        assert_eq!(u.peak_bytes, 4096 + 16384);
        assert_eq!(u.gets, 2);
    }

    #[test]
    fn too_large_is_refused_with_a_sentence() {
        let p = small();
        let e = p.try_get(40 << 10).unwrap_err().to_string();
        assert!(e.contains("larger than the largest buffer"), "{e}");
        assert_eq!(p.usage().refused, 1);
        let e = BufPool::new(&PoolConfig {
            bytes: 64 << 10,
            slices: 4,
            max_buf: 32 << 10,
            populate: false,
        })
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("cannot hold"), "{e}");
    }

    #[test]
    fn try_get_says_no_when_empty() {
        let p = small();
        let a = p.try_get(32 << 10).unwrap().unwrap();
        let b = p.try_get(32 << 10).unwrap().unwrap();
        assert!(p.try_get(4096).unwrap().is_none());
        drop((a, b));
        assert!(p.try_get(4096).unwrap().is_some());
    }

    #[tokio::test]
    async fn get_waits_until_a_buffer_comes_back_in_arrival_order() {
        let p = small();
        let a = p.get(32 << 10).await.unwrap();
        let b = p.get(32 << 10).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let (p, order) = (p.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let big = p.get(if i == 0 { 32 << 10 } else { 4096 }).await.unwrap();
                order.lock().push(i);
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                drop(big);
            }));
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(
            order.lock().is_empty(),
            "nobody got a buffer from an empty pool"
        );
        drop(a);
        drop(b);
        for t in tasks {
            t.await.unwrap();
        }
        // The large request arrived first and was served first, though small ones would fit.
        assert_eq!(order.lock()[0], 0);
        assert!(p.usage().waits >= 3);
        assert_eq!(p.usage().in_use_bytes, 0);
    }

    #[tokio::test]
    async fn a_dropped_wait_takes_nothing() {
        let p = small();
        let a = p.get(32 << 10).await.unwrap();
        let b = p.get(32 << 10).await.unwrap();
        let r = tokio::time::timeout(std::time::Duration::from_millis(10), p.get(4096)).await;
        assert!(r.is_err());
        drop(a);
        let c = p.get(32 << 10).await.unwrap();
        drop((b, c));
        assert_eq!(p.usage().in_use_bytes, 0);
    }
}
