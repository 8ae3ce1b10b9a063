//! A drive that misbehaves on purpose, for tests: it fails reads or writes (everywhere or in a
//! range), returns silently corrupted data, and on a power cut drops or tears, at 4 KiB
//! granularity, any subset of the writes not yet covered by a flush. Drives can share a kill
//! budget: once that many writes have reached any of them, the process is as good as killed,
//! and every later write and flush silently does nothing.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::drive::{Drive, MemDrive};

const SECTOR: usize = 4096;

#[derive(Default)]
struct Faults {
    fail_reads: Option<Range<u64>>,
    fail_writes: Option<Range<u64>>,
    corrupt_reads: Option<Range<u64>>,
}

/// A write the drive has acknowledged but not yet made durable: what it overwrote.
struct Pending {
    offset: u64,
    old: Vec<u8>,
}

pub struct FaultyDrive {
    inner: MemDrive,
    faults: Mutex<Faults>,
    pending: Mutex<Vec<Pending>>,
    kill: Mutex<Option<Arc<AtomicI64>>>,
}

/// A kill budget drives share (see the module comment): writes left before the kill.
pub fn kill_budget() -> Arc<AtomicI64> {
    Arc::new(AtomicI64::new(i64::MAX))
}

fn hits(r: &Option<Range<u64>>, offset: u64, len: usize) -> bool {
    r.as_ref()
        .is_some_and(|r| offset < r.end && offset + len as u64 > r.start)
}

impl FaultyDrive {
    pub fn new(name: impl Into<String>, size: u64) -> FaultyDrive {
        FaultyDrive {
            inner: MemDrive::new(name, size),
            faults: Mutex::new(Faults::default()),
            pending: Mutex::new(Vec::new()),
            kill: Mutex::new(None),
        }
    }

    /// Counts this drive's writes against `budget` (see `kill_budget`).
    pub fn share_kill(&self, budget: Arc<AtomicI64>) {
        *self.kill.lock() = Some(budget);
    }

    /// Whether the shared budget is spent: the process has been killed.
    fn killed(&self, spend: bool) -> bool {
        self.kill.lock().as_ref().is_some_and(|b| {
            if spend {
                b.fetch_sub(1, Ordering::AcqRel) <= 0
            } else {
                b.load(Ordering::Acquire) <= 0
            }
        })
    }

    /// Reads touching `range` (None: everything) fail with EIO.
    pub fn fail_reads(&self, range: Option<Range<u64>>) {
        self.faults.lock().fail_reads = Some(range.unwrap_or(0..u64::MAX));
    }

    /// Writes touching `range` (None: everything) fail with EIO.
    pub fn fail_writes(&self, range: Option<Range<u64>>) {
        self.faults.lock().fail_writes = Some(range.unwrap_or(0..u64::MAX));
    }

    /// The whole drive dies: every read and write fails.
    pub fn die(&self) {
        self.fail_reads(None);
        self.fail_writes(None);
    }

    /// Reads touching `range` return wrong bytes there, without an error.
    pub fn corrupt_reads(&self, range: Range<u64>) {
        self.faults.lock().corrupt_reads = Some(range);
    }

    pub fn heal(&self) {
        *self.faults.lock() = Faults::default();
    }

    /// Power is cut: each 4 KiB sector of each write since the last flush independently keeps
    /// its new content or goes back to what it held before (`keep` decides, per sector, in order
    /// from the newest write to the oldest). Faults are cleared, as after a reboot.
    pub fn power_cut(&self, mut keep: impl FnMut() -> bool) {
        let pending = std::mem::take(&mut *self.pending.lock());
        for p in pending.iter().rev() {
            for (i, chunk) in p.old.chunks(SECTOR).enumerate() {
                if !keep() {
                    self.inner.corrupt(p.offset + (i * SECTOR) as u64, chunk);
                }
            }
        }
        self.heal();
    }

    /// A write may go ahead: the pending list, locked, or None if the process is already dead
    /// (the write silently does nothing); an error where writes are failed there.
    fn writable(
        &self,
        offset: u64,
        len: usize,
    ) -> io::Result<Option<parking_lot::MutexGuard<'_, Vec<Pending>>>> {
        if hits(&self.faults.lock().fail_writes, offset, len) {
            return Err(eio("write", &self.describe()));
        }
        if self.killed(true) {
            return Ok(None);
        }
        Ok(Some(self.pending.lock()))
    }

    pub fn snapshot(&self) -> Vec<u8> {
        self.inner.snapshot()
    }

    /// Changes bytes behind everyone's back, durably (a bit flip at rest).
    pub fn scribble(&self, offset: u64, bytes: &[u8]) {
        self.inner.corrupt(offset, bytes);
    }
}

fn eio(what: &str, name: &str) -> io::Error {
    io::Error::other(format!("injected {what} error on {name}"))
}

impl Drive for FaultyDrive {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let (fail, corrupt) = {
            let f = self.faults.lock();
            (
                hits(&f.fail_reads, offset, buf.len()),
                f.corrupt_reads
                    .clone()
                    .filter(|_| hits(&f.corrupt_reads, offset, buf.len())),
            )
        };
        if fail {
            return Err(eio("read", &self.describe()));
        }
        self.inner.read_at(buf, offset)?;
        if let Some(r) = corrupt {
            let from = r.start.max(offset);
            let to = r.end.min(offset + buf.len() as u64);
            for b in &mut buf[(from - offset) as usize..(to - offset) as usize] {
                *b = !*b;
            }
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let Some(mut pending) = self.writable(offset, buf.len())? else {
            return Ok(());
        };
        let mut old = vec![0u8; buf.len()];
        self.inner.read_at(&mut old, offset)?;
        self.inner.write_at(buf, offset)?;
        pending.push(Pending { offset, old });
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        if self
            .faults
            .lock()
            .fail_writes
            .as_ref()
            .is_some_and(|r| r.start == 0 && r.end == u64::MAX)
        {
            return Err(eio("flush", &self.describe()));
        }
        if self.killed(false) {
            return Ok(());
        }
        self.pending.lock().clear();
        Ok(())
    }
    /// Durable at once, and only this write: the writes still pending stay droppable, except
    /// where this one covers them (a power cut puts back this write's bytes there, never older
    /// ones).
    fn write_fua_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let Some(mut pending) = self.writable(offset, buf.len())? else {
            return Ok(());
        };
        self.inner.write_at(buf, offset)?;
        let end = offset + buf.len() as u64;
        for p in pending.iter_mut() {
            let (from, to) = (
                p.offset.max(offset),
                (p.offset + p.old.len() as u64).min(end),
            );
            if from < to {
                p.old[(from - p.offset) as usize..(to - p.offset) as usize]
                    .copy_from_slice(&buf[(from - offset) as usize..(to - offset) as usize]);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FUA write survives a power cut that drops every undurable write, and wins over an
    /// older undurable write it covers; what it does not cover is still dropped.
    #[test]
    fn fua_write_is_durable_alone() {
        let d = FaultyDrive::new("d", 4 * SECTOR as u64);
        d.write_at(&[1u8; 2 * SECTOR], 0).unwrap();
        d.write_fua_at(&[2u8; SECTOR], SECTOR as u64).unwrap();
        d.write_fua_at(&[3u8; SECTOR], 3 * SECTOR as u64).unwrap();
        d.power_cut(|| false);
        let got = d.snapshot();
        assert_eq!(
            &got[..SECTOR],
            &[0u8; SECTOR][..],
            "the plain write was dropped"
        );
        assert_eq!(&got[SECTOR..2 * SECTOR], &[2u8; SECTOR][..]);
        assert_eq!(&got[2 * SECTOR..3 * SECTOR], &[0u8; SECTOR][..]);
        assert_eq!(&got[3 * SECTOR..], &[3u8; SECTOR][..]);
    }

    /// A plain write after a FUA write to the same sector goes back to the FUA write's bytes.
    #[test]
    fn later_plain_write_falls_back_to_the_fua_bytes() {
        let d = FaultyDrive::new("d", SECTOR as u64);
        d.write_fua_at(&[5u8; SECTOR], 0).unwrap();
        d.write_at(&[6u8; SECTOR], 0).unwrap();
        d.power_cut(|| false);
        assert_eq!(d.snapshot(), vec![5u8; SECTOR]);
    }
}
