//! The write-intent bitmap: before a region of rows is first written, its byte is set on every
//! member in service and made durable; a clean shutdown clears them. After a crash, resync
//! recomputes redundancy only in the regions marked, instead of the whole pool.
//!
//! On each member the bitmap is one byte per region at BITMAP_OFFSET, inside the metadata area
//! (after the two superblock slots and before the data). Every member carries the same copy, so
//! any one that survives tells what to resync.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::aligned::AlignedBuf;
use crate::drive::Drive;

pub const BITMAP_OFFSET: u64 = 64 << 10;
/// Most regions a bitmap holds; pools with more rows use larger regions.
pub const MAX_REGIONS: u64 = 256 << 10;
const PAGE: usize = 4096;

pub struct Bitmap {
    region_rows: u64,
    bits: Vec<AtomicU8>,
    /// Serialises page writes, so two writers never race on one page's on-disk copy.
    io: Mutex<()>,
}

/// Bytes of each member a region covers, at least: like md's default bitmap chunk, large enough
/// that marking (a synchronous write on every member) happens once per 64 MiB written, not once
/// per stripe, and small enough that a resync after a crash stays short.
pub const REGION_MEMBER_BYTES: u64 = 64 << 20;

/// Rows per region for a pool of `rows` rows of `strip` bytes whose metadata area ends at
/// `data_offset`.
pub fn region_rows(rows: u64, strip: u64, data_offset: u64) -> Option<u64> {
    let room = data_offset.checked_sub(BITMAP_OFFSET)?.min(MAX_REGIONS);
    if room == 0 {
        return None;
    }
    Some(rows.div_ceil(room).max(REGION_MEMBER_BYTES / strip).max(1))
}

impl Bitmap {
    pub fn new(rows: u64, region_rows: u64) -> Bitmap {
        let n = rows.div_ceil(region_rows) as usize;
        Bitmap {
            region_rows,
            bits: (0..n).map(|_| AtomicU8::new(0)).collect(),
            io: Mutex::new(()),
        }
    }

    pub fn regions(&self) -> usize {
        self.bits.len()
    }

    pub fn region_rows(&self) -> u64 {
        self.region_rows
    }

    /// Marks the regions of rows [r0, r1] and, if any was clean, writes and flushes the pages
    /// holding them on every drive given. Returns whether the marks are durable somewhere.
    pub fn mark(&self, r0: u64, r1: u64, drives: &[Arc<dyn Drive>]) -> bool {
        let (g0, g1) = (
            (r0 / self.region_rows) as usize,
            (r1 / self.region_rows) as usize,
        );
        if (g0..=g1).all(|g| self.bits[g].load(Ordering::Acquire) != 0) {
            return true;
        }
        let _io = self.io.lock();
        for g in g0..=g1 {
            self.bits[g].store(1, Ordering::Release);
        }
        self.write_pages(g0 / PAGE..=g1 / PAGE, drives, true)
    }

    fn page(&self, p: usize) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(PAGE);
        for (i, x) in b.iter_mut().enumerate() {
            if let Some(bit) = self.bits.get(p * PAGE + i) {
                *x = bit.load(Ordering::Acquire);
            }
        }
        b
    }

    fn write_pages(
        &self,
        pages: std::ops::RangeInclusive<usize>,
        drives: &[Arc<dyn Drive>],
        sync: bool,
    ) -> bool {
        let mut any = false;
        for d in drives {
            let mut ok = true;
            for p in pages.clone() {
                let buf = self.page(p);
                ok &= d.write_at(&buf, BITMAP_OFFSET + (p * PAGE) as u64).is_ok();
            }
            if sync {
                ok &= d.flush().is_ok();
            }
            any |= ok;
        }
        if sync {
            // A drive that only books its flushes (the bench's simulated ones) waits here.
            drives.iter().for_each(|d| d.settle());
        }
        any
    }

    /// Writes the whole current bitmap to a drive joining the pool, so its copy agrees with the
    /// others' (marks made before it joined are not written again).
    pub fn copy_to(&self, drive: &Arc<dyn Drive>) {
        let _io = self.io.lock();
        let pages = self.bits.len().div_ceil(PAGE).max(1);
        self.write_pages(0..=pages - 1, std::slice::from_ref(drive), true);
    }

    /// Clears every region on every drive given (after a flush, with no writes in flight).
    pub fn clear(&self, drives: &[Arc<dyn Drive>]) -> bool {
        let _io = self.io.lock();
        if self.bits.iter().all(|b| b.load(Ordering::Acquire) == 0) {
            return true;
        }
        for b in &self.bits {
            b.store(0, Ordering::Release);
        }
        let pages = self.bits.len().div_ceil(PAGE).max(1);
        self.write_pages(0..=pages - 1, drives, true)
    }

    /// The dirty regions recorded on these drives (the union of their copies), as row ranges.
    pub fn read_dirty(&self, drives: &[Arc<dyn Drive>]) -> Vec<std::ops::Range<u64>> {
        let len = self.bits.len().div_ceil(PAGE) * PAGE;
        let mut union = vec![0u8; self.bits.len()];
        for d in drives {
            let mut b = AlignedBuf::zeroed(len);
            if d.read_at(&mut b, BITMAP_OFFSET).is_ok() {
                for (u, x) in union.iter_mut().zip(b.iter()) {
                    *u |= *x;
                }
            }
        }
        union
            .iter()
            .enumerate()
            .filter(|(_, &x)| x != 0)
            .map(|(g, _)| g as u64 * self.region_rows..(g as u64 + 1) * self.region_rows)
            .collect()
    }
}
