//! One volume as an export sees it: a window onto the pool, checked on every I/O.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use millrace_block::{check_range, BlockDevice, BufResult, IoBuf, IoFuture};
use uuid::Uuid;

/// A volume opened for I/O. Growing the volume is seen at once by everyone holding it; deleting
/// it makes every later I/O fail instead of touching space that may be reused.
pub struct Volume {
    dev: Arc<dyn BlockDevice>,
    name: String,
    uuid: Uuid,
    offset: u64,
    size: AtomicU64,
    deleted: AtomicBool,
}

impl Volume {
    pub(crate) fn new(
        dev: Arc<dyn BlockDevice>,
        name: String,
        uuid: Uuid,
        offset: u64,
        size: u64,
    ) -> Self {
        Self {
            dev,
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
    fn block_bytes(&self) -> u32 {
        self.dev.block_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let at = self.check(offset, buf.len() as u64)?;
        self.dev.read_at(at, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let at = self.check(offset, data.len() as u64)?;
        self.dev.write_at(at, data)
    }
    fn flush(&self) -> io::Result<()> {
        self.check(0, 0)?;
        self.dev.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let at = self.check(offset, len)?;
        self.dev.discard(at, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let at = self.check(offset, len)?;
        self.dev.write_zeroes(at, len)
    }
    fn read_async(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, BufResult> {
        match self.check(offset, buf.len() as u64) {
            Ok(at) => self.dev.read_async(at, buf),
            Err(e) => Box::pin(std::future::ready((Err(e), buf))),
        }
    }
    fn write_async(&self, offset: u64, buf: IoBuf, fua: bool) -> IoFuture<'_, BufResult> {
        match self.check(offset, buf.len() as u64) {
            Ok(at) => self.dev.write_async(at, buf, fua),
            Err(e) => Box::pin(std::future::ready((Err(e), buf))),
        }
    }
    fn flush_async(&self) -> IoFuture<'_, io::Result<()>> {
        match self.check(0, 0) {
            Ok(_) => self.dev.flush_async(),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }
    fn discard_async(&self, offset: u64, len: u64) -> IoFuture<'_, io::Result<()>> {
        match self.check(offset, len) {
            Ok(at) => self.dev.discard_async(at, len),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }
    fn write_zeroes_async(&self, offset: u64, len: u64) -> IoFuture<'_, io::Result<()>> {
        match self.check(offset, len) {
            Ok(at) => self.dev.write_zeroes_async(at, len),
            Err(e) => Box::pin(std::future::ready(Err(e))),
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
        let v = Volume::new(pool.clone(), "v".into(), Uuid::new_v4(), 65536, 65536);
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
