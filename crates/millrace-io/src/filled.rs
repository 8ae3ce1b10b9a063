//! Which chunks of a mapped file in memory are known to hold no hole (`crate::mapped`): only
//! those are read through the mapping, because reading a hole of a tmpfs file through a
//! mapping allocates its page, where pread returns zeroes and allocates nothing.
//!
//! A chunk becomes known when a write through the mapping covers it whole, or when a check
//! (`mincore` over the mapping, at the first read that finds it unknown) finds all its pages
//! in memory; it is forgotten when a discard punches a hole that touches it. A chunk the check
//! found holey is not checked again until a write touches it, so reading a hole costs one system
//! call, as before. Two bits per 64 KiB: 8 KiB per 2 GiB of file.

use std::sync::atomic::{AtomicU64, Ordering};

const CHUNK: u64 = 64 * 1024;

pub(crate) struct Filled {
    /// Chunks known to hold no hole.
    bits: Box<[AtomicU64]>,
    /// Chunks a check found a hole in, since no write touched them.
    holey: Box<[AtomicU64]>,
    len: u64,
}

impl Filled {
    /// `len` bytes of file, all known filled when `all`.
    pub(crate) fn new(len: u64, all: bool) -> Filled {
        let chunks = len.div_ceil(CHUNK) as usize;
        let word = if all { u64::MAX } else { 0 };
        let words = chunks.div_ceil(64);
        Filled {
            bits: (0..words).map(|_| AtomicU64::new(word)).collect(),
            holey: (0..words).map(|_| AtomicU64::new(0)).collect(),
            len,
        }
    }

    fn bit(&self, c: u64) -> (&AtomicU64, u64) {
        (&self.bits[(c / 64) as usize], 1 << (c % 64))
    }

    fn holey_bit(&self, c: u64) -> (&AtomicU64, u64) {
        (&self.holey[(c / 64) as usize], 1 << (c % 64))
    }

    /// The chunks `offset..offset+len` touches (callers keep the range inside the file).
    fn touched(offset: u64, len: usize) -> std::ops::Range<u64> {
        offset / CHUNK..(offset + len.max(1) as u64).div_ceil(CHUNK)
    }

    pub(crate) fn all_known(&self, offset: u64, len: usize) -> bool {
        Self::touched(offset, len).all(|c| {
            let (w, b) = self.bit(c);
            w.load(Ordering::Acquire) & b != 0
        })
    }

    /// A write through the mapping filled `offset..offset+len`: the chunks it covers whole
    /// (or up to the end of the file) hold no hole.
    pub(crate) fn wrote(&self, offset: u64, len: usize) {
        let end = offset + len as u64;
        for c in Self::touched(offset, len) {
            let (w, b) = self.holey_bit(c);
            if w.load(Ordering::Relaxed) & b != 0 {
                w.fetch_and(!b, Ordering::Release);
            }
        }
        for c in offset.div_ceil(CHUNK)..Self::touched(offset, len).end {
            if (c + 1) * CHUNK <= end || end == self.len {
                let (w, b) = self.bit(c);
                w.fetch_or(b, Ordering::Release);
            }
        }
    }

    /// A hole is about to be punched in `offset..offset+len`.
    pub(crate) fn punching(&self, offset: u64, len: u64) {
        let end = offset.saturating_add(len).min(self.len);
        if offset >= end {
            return;
        }
        for c in Self::touched(offset, (end - offset) as usize) {
            let (w, b) = self.bit(c);
            w.fetch_and(!b, Ordering::Release);
            let (w, b) = self.holey_bit(c);
            w.fetch_or(b, Ordering::Release);
        }
    }

    /// Looks whether the chunks of `offset..offset+len` not known yet (and not found
    /// holey since their last write) hold a hole, and remembers the answer. Whether all are
    /// known filled now.
    /// `base`: the mapping's address; `page`: the system's page size.
    pub(crate) fn check(&self, base: usize, page: usize, offset: u64, len: usize) -> bool {
        let mut all = true;
        for c in Self::touched(offset, len) {
            let (w, b) = self.bit(c);
            if w.load(Ordering::Acquire) & b != 0 {
                continue;
            }
            let (hw, hb) = self.holey_bit(c);
            if hw.load(Ordering::Acquire) & hb != 0 {
                all = false;
                continue;
            }
            let (start, end) = (c * CHUNK, ((c + 1) * CHUNK).min(self.len));
            if resident(base + start as usize, (end - start) as usize, page) {
                w.fetch_or(b, Ordering::Release);
            } else {
                hw.fetch_or(hb, Ordering::Release);
                all = false;
            }
        }
        all
    }
}

/// Whether every page of the mapping at `addr..addr+len` (page-aligned) is in memory: a tmpfs
/// page that is not is a hole (or swapped out, which pread reads as well). mincore looks, and
/// faults nothing in; its cost is bounded by the range (lseek SEEK_HOLE on tmpfs walks the file
/// to the next hole). `page`: the system's page size (at least 4 KiB).
fn resident(addr: usize, len: usize, page: usize) -> bool {
    let mut vec = [0u8; (CHUNK / 4096) as usize];
    if page == 0 || len.div_ceil(page) > vec.len() {
        return false;
    }
    // SAFETY: the range lies inside a live mapping of ours; mincore writes one byte per page
    // into `vec`, which has room for them.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, len, vec.as_mut_ptr()) };
    r == 0 && vec[..len.div_ceil(page)].iter().all(|v| v & 1 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_mark_whole_chunks_and_punches_forget_them() {
        let f = Filled::new(10 * CHUNK + 100, false);
        assert!(!f.all_known(0, 1));
        f.wrote(100, CHUNK as usize);
        assert!(
            !f.all_known(0, 1),
            "a write covering no chunk whole marks none"
        );
        f.wrote(CHUNK, 2 * CHUNK as usize);
        assert!(f.all_known(CHUNK, 2 * CHUNK as usize));
        assert!(!f.all_known(CHUNK, 2 * CHUNK as usize + 1));
        f.wrote(10 * CHUNK, 100);
        assert!(f.all_known(10 * CHUNK + 50, 50), "the last, short chunk");
        f.punching(2 * CHUNK + 10, 1);
        assert!(f.all_known(CHUNK, CHUNK as usize));
        assert!(!f.all_known(2 * CHUNK, 1));
        let all = Filled::new(3 * CHUNK, true);
        assert!(all.all_known(0, 3 * CHUNK as usize));
    }
}
