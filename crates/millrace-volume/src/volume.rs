//! One volume as an export sees it: a window onto the pool, checked on every I/O.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use millrace_block::{check_range, BlockDevice, BufResult, Extent, IoBuf, IoFuture};
use uuid::Uuid;

use crate::alloc::AllocMap;

/// A volume opened for I/O. Growing the volume is seen at once by everyone holding it; deleting
/// it makes every later I/O fail instead of touching space that may be reused.
///
/// With the pool's allocation map (alloc.rs), reads of regions that hold no data return zeroes
/// without touching the drives, writes mark their regions, and discard and write-zeroes
/// deallocate (skipping regions that already hold none).
pub struct Volume {
    dev: Arc<dyn BlockDevice>,
    map: Option<Arc<AllocMap>>,
    name: String,
    uuid: Uuid,
    offset: u64,
    size: AtomicU64,
    deleted: AtomicBool,
}

impl Volume {
    pub(crate) fn new(
        dev: Arc<dyn BlockDevice>,
        map: Option<Arc<AllocMap>>,
        name: String,
        uuid: Uuid,
        offset: u64,
        size: u64,
    ) -> Self {
        Self {
            dev,
            map,
            name,
            uuid,
            offset,
            size: AtomicU64::new(size),
            deleted: AtomicBool::new(false),
        }
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn uuid(&self) -> Uuid {
        self.uuid
    }
    /// Where the volume starts in the pool, in bytes (a multiple of the full stripe).
    pub fn offset(&self) -> u64 {
        self.offset
    }
    pub(crate) fn set_size(&self, size: u64) {
        self.size.store(size, Ordering::Release);
    }
    pub(crate) fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::Release);
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<u64> {
        if self.deleted.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("volume {} has been deleted", self.name),
            ));
        }
        check_range(self.size_bytes(), offset, len)?;
        Ok(self.offset + offset)
    }
}

impl BlockDevice for Volume {
    fn size_bytes(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }
    fn preferred_io_bytes(&self) -> u64 {
        self.dev.preferred_io_bytes()
    }
    fn min_io_bytes(&self) -> u64 {
        self.dev.min_io_bytes()
    }
    fn write_granule_bytes(&self) -> u64 {
        self.dev.write_granule_bytes()
    }
    fn block_bytes(&self) -> u32 {
        self.dev.block_bytes()
    }
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let at = self.check(offset, len)?;
        Ok(match &self.map {
            Some(m) => m.runs(at, len).into_vec(),
            None => vec![Extent { len, zero: false }],
        })
    }
    fn zeroes_fast(&self, offset: u64, len: u64) -> bool {
        let Ok(at) = self.check(offset, len) else {
            return false;
        };
        // Holes need nothing; what holds data must be whole stripes the pool deallocates.
        self.data_runs(at, len)
            .into_iter()
            .all(|(o, l)| self.dev.zeroes_fast(o, l))
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let at = self.check(offset, buf.len() as u64)?;
        match self.holes(at, buf.len() as u64) {
            Holes::None => self.dev.read_at(at, buf),
            Holes::All => {
                buf.fill(0);
                Ok(())
            }
            Holes::Mixed(runs) => {
                self.dev.read_at(at, buf)?;
                zero_holes(buf, &runs);
                Ok(())
            }
        }
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let at = self.check(offset, data.len() as u64)?;
        if let Some(m) = &self.map {
            m.note_write(at, data.len() as u64);
        }
        self.dev.write_at(at, data)
    }
    fn flush(&self) -> io::Result<()> {
        self.check(0, 0)?;
        match &self.map {
            Some(m) if m.needs_commit() => m.commit(),
            _ => self.dev.flush(),
        }
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let at = self.check(offset, len)?;
        self.deallocate(at, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let at = self.check(offset, len)?;
        self.deallocate(at, len)
    }
    fn read_async(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, BufResult> {
        let at = match self.check(offset, buf.len() as u64) {
            Ok(at) => at,
            Err(e) => return Box::pin(std::future::ready((Err(e), buf))),
        };
        match self.holes(at, buf.len() as u64) {
            Holes::None => self.dev.read_async(at, buf),
            Holes::All => {
                let mut buf = buf;
                buf.fill(0);
                Box::pin(std::future::ready((Ok(()), buf)))
            }
            Holes::Mixed(runs) => Box::pin(async move {
                let (r, mut buf) = self.dev.read_async(at, buf).await;
                if r.is_ok() {
                    zero_holes(&mut buf, &runs);
                }
                (r, buf)
            }),
        }
    }
    fn write_async(&self, offset: u64, buf: IoBuf, fua: bool) -> IoFuture<'_, BufResult> {
        let at = match self.check(offset, buf.len() as u64) {
            Ok(at) => at,
            Err(e) => return Box::pin(std::future::ready((Err(e), buf))),
        };
        let Some(m) = &self.map else {
            return self.dev.write_async(at, buf, fua);
        };
        let fresh = m.note_write(at, buf.len() as u64);
        if !(fua && fresh) {
            return self.dev.write_async(at, buf, fua);
        }
        // A FUA write to a fresh region is durable only once the map says it holds data.
        Box::pin(async move {
            let (mut r, buf) = self.dev.write_async(at, buf, fua).await;
            if r.is_ok() {
                r = m.commit_async().await;
            }
            (r, buf)
        })
    }
    fn flush_async(&self) -> IoFuture<'_, io::Result<()>> {
        if let Err(e) = self.check(0, 0) {
            return Box::pin(std::future::ready(Err(e)));
        }
        match &self.map {
            Some(m) if m.needs_commit() => Box::pin(m.commit_async()),
            _ => self.dev.flush_async(),
        }
    }
    fn discard_async(&self, offset: u64, len: u64) -> IoFuture<'_, io::Result<()>> {
        match self.check(offset, len) {
            Ok(at) => Box::pin(self.deallocate_async(at, len)),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }
    fn write_zeroes_async(&self, offset: u64, len: u64) -> IoFuture<'_, io::Result<()>> {
        match self.check(offset, len) {
            Ok(at) => Box::pin(self.deallocate_async(at, len)),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }
}

/// What the map says of a read's range.
enum Holes {
    None,
    All,
    /// Some runs are holes: read it all, then zero those.
    Mixed(crate::alloc::Runs),
}

fn zero_holes(buf: &mut [u8], runs: &[Extent]) {
    let mut at = 0usize;
    for r in runs {
        let n = r.len as usize;
        if r.zero {
            buf[at..at + n].fill(0);
        }
        at += n;
    }
}

impl Volume {
    fn holes(&self, at: u64, len: u64) -> Holes {
        let Some(m) = &self.map else {
            return Holes::None;
        };
        let runs = m.runs(at, len);
        if runs.iter().all(|r| !r.zero) {
            Holes::None
        } else if runs.iter().all(|r| r.zero) {
            Holes::All
        } else {
            Holes::Mixed(runs)
        }
    }

    /// The runs of `[at, at + len)` (pool offsets) that may hold data: only those need
    /// deallocating (a hole already reads as zeroes on the drives).
    fn data_runs(&self, at: u64, len: u64) -> Vec<(u64, u64)> {
        match &self.map {
            Some(m) => m.data_runs(at, len),
            None => vec![(at, len)],
        }
    }

    fn deallocate(&self, at: u64, len: u64) -> io::Result<()> {
        for (o, l) in self.data_runs(at, len) {
            let cleared = self.map.as_ref().map(|m| m.begin_clear(o, l));
            let r = self.dev.discard(o, l);
            self.after_clear(cleared, &r);
            r?;
        }
        Ok(())
    }

    async fn deallocate_async(&self, at: u64, len: u64) -> io::Result<()> {
        for (o, l) in self.data_runs(at, len) {
            let cleared = self.map.as_ref().map(|m| m.begin_clear(o, l));
            let r = self.dev.discard_async(o, l).await;
            self.after_clear(cleared, &r);
            r?;
        }
        Ok(())
    }

    fn after_clear(&self, cleared: Option<Vec<u64>>, r: &io::Result<()>) {
        if let (Some(m), Some(c)) = (&self.map, cleared) {
            if r.is_ok() {
                m.end_clear(c);
            } else {
                m.restore(&c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_block::MemBlockDevice;

    #[tokio::test]
    async fn async_calls_land_at_the_volume_offset_and_stop_when_deleted() {
        let pool: Arc<dyn BlockDevice> = Arc::new(MemBlockDevice::new(1 << 20));
        let v = Volume::new(pool.clone(), None, "v".into(), Uuid::new_v4(), 65536, 65536);
        let (r, buf) = v.write_async(10, IoBuf::from_slice(b"there"), false).await;
        r.unwrap();
        let mut under = [0u8; 5];
        pool.read_at(65536 + 10, &mut under).unwrap();
        assert_eq!(&under, b"there");
        let (r, buf) = v.read_async(65536 - 2, buf).await;
        assert!(r.unwrap_err().to_string().contains("past the end"));
        v.mark_deleted();
        let (r, _) = v.read_async(10, buf).await;
        assert!(r.unwrap_err().to_string().contains("deleted"));
        assert!(v.flush_async().await.is_err());
    }
}
