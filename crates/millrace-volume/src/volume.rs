//! One volume as an export sees it: a window onto the pool, checked on every I/O.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use millrace_block::{check_range, BlockDevice};
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
}
