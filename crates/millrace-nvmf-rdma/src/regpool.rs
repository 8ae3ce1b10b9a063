//! The data path's buffer pool as RDMA sees it: the pool's one region registered once per
//! protection domain (per device), so any pooled `IoBuf` is a local buffer for RDMA READ and
//! WRITE without a copy and without a registration per I/O.

use millrace_io::{BufPool, IoBuf};
use millrace_rdma::verbs::{MemoryRegion, ProtectionDomain, Sge};
use std::sync::Arc;

pub struct RegisteredPool {
    pool: BufPool,
    mr: MemoryRegion,
    base: u64,
    len: u64,
}

impl RegisteredPool {
    /// Registers the whole region of `pool` (its slices are contiguous) with `pd`.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        pool: &BufPool,
    ) -> Result<RegisteredPool, millrace_rdma::Error> {
        let iov = pool.iovecs();
        let base = iov.first().map_or(0, |v| v.iov_base as u64);
        let len: usize = iov.iter().map(|v| v.iov_len).sum();
        let contiguous = iov
            .windows(2)
            .all(|w| w[0].iov_base as u64 + w[0].iov_len as u64 == w[1].iov_base as u64);
        if iov.is_empty() || !contiguous {
            return Err(millrace_rdma::Error::Invalid(
                "the buffer pool's slices are not one contiguous region".into(),
            ));
        }
        // SAFETY: the region is the pool's mapping, which lives as long as any clone of the
        // pool; the memory region keeps one clone as its owner.
        let mr = unsafe { pd.register_raw(base as *mut u8, len, Arc::new(pool.clone()))? };
        Ok(RegisteredPool {
            pool: pool.clone(),
            mr,
            base,
            len: len as u64,
        })
    }

    pub fn pool(&self) -> &BufPool {
        &self.pool
    }

    /// The local buffer of `buf`'s first `len` bytes, when `buf` lies in the registered region.
    pub fn sge(&self, buf: &IoBuf, len: usize) -> Option<Sge> {
        let a = buf.as_ptr() as u64;
        let end = a.checked_add(len as u64)?;
        (len <= buf.capacity() && a >= self.base && end <= self.base + self.len).then(|| Sge {
            addr: a,
            len: len as u32,
            lkey: self.mr.lkey(),
        })
    }
}
