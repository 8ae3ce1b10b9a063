//! The allocation map: one bit per granule of the pool's volume space, set where a region may
//! hold data, clear where it reads as zeroes (never written since it was deallocated, trimmed
//! or zeroed). Reads of clear granules return zeroes without touching the drives; NBD's block
//! status and NVMe's deallocated-block answers come from it.
//!
//! The granule is the pool's full stripe (the unit the array deallocates without touching
//! parity), doubled until the map has at most `MAX_GRANULES` bits, so that the map of a huge
//! pool with small strips stays a few MiB in memory. The map lives at the start of the pool's
//! volume space (at its end in pools made before maps), where the volume table records it; it
//! is written through the pool like data, so it is as redundant as the data.
//!
//! A crash may only err towards "data", and the map is written without a journal:
//! - A bit is set in memory before the write that needs it is issued, and reaches the drives
//!   by the next flush (or before a FUA write to a fresh granule is acknowledged): a write not
//!   yet flushed may be lost anyway, and a write acknowledged as durable always has its bit.
//! - A bit is cleared on the drives only after the deallocation that zeroed its granule is
//!   durable (`commit` flushes the pool first), so a clear bit always means zeroes on the drives.
//!   That invariant is what lets a write to part of a fresh granule leave the rest unwritten.
//!
//! Concurrent overlapping writes and trims (which the protocols leave undefined) may leave a
//! granule's bit clear over data that was written: it then reads as zeroes, and, if a later
//! partial write sets the bit again, the earlier data may show through in the rest of that
//! granule. Only the same volume's own data can appear so; a new volume's extent is always
//! deallocated first (see `Volumes::create`).

use std::collections::BTreeSet;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use millrace_block::{BlockDevice, Extent, IoBuf};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Runs of a range: one or two for most requests, inline.
pub type Runs = smallvec::SmallVec<[Extent; 4]>;

/// Most granules one map holds (8 MiB of bits).
pub(crate) const MAX_GRANULES: u64 = 64 << 20;
const SECTOR: u64 = 4096;

/// Where a pool's map lives and what it covers, as the volume table records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MapArea {
    /// Pool offset of the first byte the map describes (the start of the volume space).
    pub base_bytes: u64,
    /// Pool offset of the map itself.
    pub offset_bytes: u64,
    /// Bytes reserved for the map (a multiple of the pool's full stripe).
    pub bytes: u64,
    pub granule_bytes: u64,
    pub granules: u64,
}

impl MapArea {
    /// The map for the volume space `[base, end)` of a pool whose full stripe is `align`,
    /// placed at the start of that space or at its end.
    pub fn plan(base: u64, end: u64, align: u64, at_start: bool) -> Option<MapArea> {
        let span = end.checked_sub(base)?;
        let mut granule = align;
        while span.div_ceil(granule) > MAX_GRANULES {
            granule = granule.checked_mul(2)?;
        }
        let granules = span.div_ceil(granule);
        let bytes = granules.div_ceil(8).div_ceil(SECTOR) * SECTOR;
        let bytes = bytes.div_ceil(align) * align;
        if bytes >= span {
            return None;
        }
        let offset = if at_start { base } else { end - bytes };
        Some(MapArea {
            base_bytes: base,
            offset_bytes: offset,
            bytes,
            granule_bytes: granule,
            granules,
        })
    }

    fn granule_of(&self, pool_off: u64) -> u64 {
        (pool_off - self.base_bytes) / self.granule_bytes
    }

    /// The granules that `[off, off + len)` touches.
    fn touched(&self, off: u64, len: u64) -> Range<u64> {
        if len == 0 {
            return 0..0;
        }
        self.granule_of(off)..self.granule_of(off + len - 1) + 1
    }

    /// The granules that lie wholly inside `[off, off + len)`.
    fn inside(&self, off: u64, len: u64) -> Range<u64> {
        let g = self.granule_bytes;
        let first = (off - self.base_bytes).div_ceil(g);
        let last = (off + len - self.base_bytes) / g;
        first..last.max(first)
    }

    fn start_of(&self, g: u64) -> u64 {
        self.base_bytes + g * self.granule_bytes
    }
}

struct State {
    /// What reads go by.
    mem: Vec<u8>,
    /// What the drives should hold at the next commit.
    disk: Vec<u8>,
    /// Sectors of `disk` not yet written.
    dirty: BTreeSet<u64>,
    /// Granules deallocated (not yet durably), to clear on the drives at the next commit.
    pending_clear: Vec<u64>,
}

fn bit(v: &[u8], g: u64) -> bool {
    v[(g / 8) as usize] & (1 << (g % 8)) != 0
}

fn set(v: &mut [u8], g: u64, on: bool) {
    let b = &mut v[(g / 8) as usize];
    if on {
        *b |= 1 << (g % 8);
    } else {
        *b &= !(1 << (g % 8));
    }
}

/// The allocation map of one pool.
pub(crate) struct AllocMap {
    dev: Arc<dyn BlockDevice>,
    area: MapArea,
    state: Mutex<State>,
    /// One commit at a time: two writing the same sector could land in the wrong order.
    committing: AtomicBool,
}

impl AllocMap {
    /// A new map with the granules of `[off, off + len)` ranges marked as data.
    pub fn new(dev: Arc<dyn BlockDevice>, area: MapArea, data: &[(u64, u64)]) -> AllocMap {
        let n = (area.granules.div_ceil(8)) as usize;
        let mut mem = vec![0u8; n];
        for &(off, len) in data {
            for g in area.touched(off, len) {
                set(&mut mem, g, true);
            }
        }
        let sectors = (n as u64).div_ceil(SECTOR);
        AllocMap {
            dev,
            area,
            state: Mutex::new(State {
                disk: mem.clone(),
                mem,
                dirty: (0..sectors).collect(),
                pending_clear: Vec::new(),
            }),
            committing: AtomicBool::new(false),
        }
    }

    /// Reads a map from the pool.
    pub fn load(dev: Arc<dyn BlockDevice>, area: MapArea) -> io::Result<AllocMap> {
        let n = (area.granules.div_ceil(8)) as usize;
        let mut buf = vec![0u8; (n as u64).div_ceil(SECTOR) as usize * SECTOR as usize];
        dev.read_at(area.offset_bytes, &mut buf)?;
        buf.truncate(n);
        Ok(AllocMap {
            dev,
            area,
            state: Mutex::new(State {
                disk: buf.clone(),
                mem: buf,
                dirty: BTreeSet::new(),
                pending_clear: Vec::new(),
            }),
            committing: AtomicBool::new(false),
        })
    }

    /// The runs of `[off, off + len)` (pool offsets): data or zeroes.
    pub fn runs(&self, off: u64, len: u64) -> Runs {
        let st = self.state.lock();
        let mut out = Runs::new();
        let end = off + len;
        let mut at = off;
        for g in self.area.touched(off, len) {
            let next = end.min(self.area.start_of(g + 1));
            let zero = !bit(&st.mem, g);
            match out.last_mut() {
                Some(r) if r.zero == zero => r.len += next - at,
                _ => out.push(Extent {
                    len: next - at,
                    zero,
                }),
            }
            at = next;
        }
        out
    }

    /// The runs of `[off, off + len)` that may hold data, as (pool offset, bytes): only they
    /// need deallocating, since a clear granule already reads as zeroes on the drives.
    pub fn data_runs(&self, off: u64, len: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = off;
        for r in self.runs(off, len) {
            if !r.zero {
                out.push((at, r.len));
            }
            at += r.len;
        }
        out
    }

    /// Bytes of `[off, off + len)` that may hold data.
    pub fn data_bytes(&self, off: u64, len: u64) -> u64 {
        (self.runs(off, len).iter())
            .filter(|r| !r.zero)
            .map(|r| r.len)
            .sum()
    }

    /// Marks the granules a write touches as data, before it is issued. Returns whether any
    /// was fresh (a FUA write then commits the map before it is acknowledged).
    pub fn note_write(&self, off: u64, len: u64) -> bool {
        let mut st = self.state.lock();
        let mut fresh = false;
        for g in self.area.touched(off, len) {
            if !bit(&st.mem, g) {
                fresh = true;
                set(&mut st.mem, g, true);
            }
            if !bit(&st.disk, g) {
                set(&mut st.disk, g, true);
                st.dirty.insert(g / 8 / SECTOR);
            }
        }
        fresh
    }

    /// Before a deallocation of `[off, off + len)`: the granules wholly inside it that hold
    /// data read as zeroes from now on. Returns them, for `end_clear` or `restore`.
    pub fn begin_clear(&self, off: u64, len: u64) -> Vec<u64> {
        let mut st = self.state.lock();
        let mut cleared = Vec::new();
        for g in self.area.inside(off, len) {
            if bit(&st.mem, g) || bit(&st.disk, g) {
                set(&mut st.mem, g, false);
                cleared.push(g);
            }
        }
        cleared
    }

    /// The deallocation failed: the granules may still hold data.
    pub fn restore(&self, granules: &[u64]) {
        let mut st = self.state.lock();
        for &g in granules {
            set(&mut st.mem, g, true);
        }
    }

    /// The deallocation completed: clear the granules on the drives at the next commit.
    pub fn end_clear(&self, granules: Vec<u64>) {
        self.state.lock().pending_clear.extend(granules);
    }

    /// Whether the drives' copy lags (a flush must commit).
    pub fn needs_commit(&self) -> bool {
        let st = self.state.lock();
        !st.dirty.is_empty() || !st.pending_clear.is_empty()
    }

    /// Takes the pending clears (the caller flushes the pool before applying them).
    fn take_clears(&self) -> Vec<u64> {
        std::mem::take(&mut self.state.lock().pending_clear)
    }

    /// Applies clears whose granules were not written since, and copies the dirty sectors out
    /// as runs of consecutive sectors: (pool offset, bytes).
    fn snapshot(&self, clears: &[u64]) -> Vec<(u64, Vec<u8>)> {
        let mut st = self.state.lock();
        for &g in clears {
            if !bit(&st.mem, g) && bit(&st.disk, g) {
                set(&mut st.disk, g, false);
                st.dirty.insert(g / 8 / SECTOR);
            }
        }
        let dirty = std::mem::take(&mut st.dirty);
        let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut prev: Option<u64> = None;
        for s in dirty {
            let from = (s * SECTOR) as usize;
            let to = (from + SECTOR as usize).min(st.disk.len());
            let mut bytes = st.disk[from..to].to_vec();
            bytes.resize(SECTOR as usize, 0);
            match out.last_mut() {
                Some(last) if prev.is_some_and(|p| p + 1 == s) => last.1.extend_from_slice(&bytes),
                _ => out.push((self.area.offset_bytes + s * SECTOR, bytes)),
            }
            prev = Some(s);
        }
        out
    }

    /// A commit failed: its sectors are dirty again, its clears pending again.
    fn redo(&self, writes: &[(u64, Vec<u8>)], clears: Vec<u64>) {
        let mut st = self.state.lock();
        for (off, bytes) in writes {
            let first = (off - self.area.offset_bytes) / SECTOR;
            for s in first..first + bytes.len() as u64 / SECTOR {
                st.dirty.insert(s);
            }
        }
        st.pending_clear.extend(clears);
    }

    fn try_begin(&self) -> bool {
        self.committing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Makes the map on the drives match memory (and everything written before it durable).
    pub fn commit(&self) -> io::Result<()> {
        while !self.try_begin() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let _done = Done(&self.committing);
        let clears = self.take_clears();
        if !clears.is_empty() {
            if let Err(e) = self.dev.flush() {
                self.redo(&[], clears);
                return Err(e);
            }
        }
        let writes = self.snapshot(&clears);
        let r = writes
            .iter()
            .try_for_each(|(off, b)| self.dev.write_at(*off, b))
            .and_then(|_| self.dev.flush());
        if r.is_err() {
            self.redo(&writes, Vec::new());
        }
        r
    }

    /// `commit` on the data path.
    pub async fn commit_async(&self) -> io::Result<()> {
        while !self.try_begin() {
            tokio_yield().await;
        }
        let _done = Done(&self.committing);
        let clears = self.take_clears();
        if !clears.is_empty() {
            if let Err(e) = self.dev.flush_async().await {
                self.redo(&[], clears);
                return Err(e);
            }
        }
        let writes = self.snapshot(&clears);
        let mut r = Ok(());
        for (off, b) in &writes {
            let (w, _) = self
                .dev
                .write_async(*off, IoBuf::from_slice(b), false)
                .await;
            if w.is_err() {
                r = w;
                break;
            }
        }
        if r.is_ok() {
            r = self.dev.flush_async().await;
        }
        if r.is_err() {
            self.redo(&writes, Vec::new());
        }
        r
    }
}

struct Done<'a>(&'a AtomicBool);
impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Lets the task holding the commit run (it may be on this same core).
async fn tokio_yield() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}
