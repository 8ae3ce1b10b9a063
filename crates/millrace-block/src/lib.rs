//! The contract between the layers: exports (NVMe/TCP, NBD, shares) see a volume as a block
//! device with byte-addressed read/write/flush/discard. They know nothing about parity or drives;
//! the array layer knows nothing about networks. This crate is the only thing both sides share.

// Functions stay under 100 lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::RwLock;

pub use millrace_io::IoBuf;

/// The future of an async device call: boxed, so exports keep `Arc<dyn BlockDevice>`.
pub type IoFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The result of a call that was lent a buffer, with the buffer, which always comes back.
pub type BufResult = (io::Result<()>, IoBuf);

/// A run of a device's range: `len` bytes that hold data (or may) or read as zeroes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub len: u64,
    /// True where the run reads as zeroes and holds no space (a hole).
    pub zero: bool,
}

/// A block device as an export sees it. Offsets and lengths are in bytes and need not be
/// aligned; implementations handle any alignment (aligned I/O is simply faster).
///
/// Two faces (docs/DATAPATH.md): the `*_async` methods are the data path; they take and give
/// back owned buffers (from a `millrace_io::BufPool`), and a device on the data path (the array,
/// a volume) completes them on the calling core without parking a thread. Their default
/// implementations call the blocking methods inline, so every device works with either face;
/// a device whose blocking calls wait on drives should override them. The blocking methods are
/// the synchronous wrapper for the CLI, tests and tools.
pub trait BlockDevice: Send + Sync + 'static {
    /// Usable size in bytes.
    fn size_bytes(&self) -> u64;
    /// The I/O size that avoids read-modify-write (a full stripe for parity arrays).
    fn preferred_io_bytes(&self) -> u64 {
        4096
    }
    /// Writes that leave part of an aligned span of this many bytes unwritten cost the device a
    /// read-modify-write (a parity array's full stripe); 0 when no write does. A transport that
    /// receives writes continuing one another submits them together up to such a boundary, so
    /// the device can merge them into whole spans instead of writing each half alone.
    fn write_granule_bytes(&self) -> u64 {
        0
    }
    /// The smallest write that performs well: a parity array's strip. With
    /// [`BlockDevice::preferred_io_bytes`] it is what Linux md reports as io_min and io_opt, from
    /// which filesystems take their stripe unit and width (mkfs.xfs su and sw).
    fn min_io_bytes(&self) -> u64 {
        self.block_bytes() as u64
    }
    /// The smallest unit the device writes atomically with respect to itself.
    fn block_bytes(&self) -> u32 {
        4096
    }
    /// Which parts of `[offset, offset + len)` hold data and which read as zeroes, as runs in
    /// order that cover the range. A device that does not know says "data" throughout.
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        check_range(self.size_bytes(), offset, len)?;
        Ok(vec![Extent { len, zero: false }])
    }
    /// Whether zeroing `[offset, offset + len)` is cheap: done by deallocating, writing no
    /// data (what NBD's fast zero asks before it zeroes).
    fn zeroes_fast(&self, _offset: u64, _len: u64) -> bool {
        false
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Deallocates a range; later reads of it return zeroes.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.write_zeroes(offset, len)
    }
    /// Writes zeroes over a range.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let chunk = vec![0u8; len.min(1 << 20) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len() as u64) as usize;
            self.write_at(offset + done, &chunk[..n])?;
            done += n as u64;
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset` into `buf`.
    fn read_async(&self, offset: u64, mut buf: IoBuf) -> IoFuture<'_, BufResult> {
        Box::pin(async move {
            let r = self.read_at(offset, &mut buf);
            (r, buf)
        })
    }

    /// Writes `buf` at `offset`; with `fua`, the data is durable when the call completes.
    fn write_async(&self, offset: u64, buf: IoBuf, fua: bool) -> IoFuture<'_, BufResult> {
        Box::pin(async move {
            let mut r = self.write_at(offset, &buf);
            if fua && r.is_ok() {
                r = self.flush();
            }
            (r, buf)
        })
    }

    /// Makes every completed write durable.
    fn flush_async(&self) -> IoFuture<'_, io::Result<()>> {
        Box::pin(async move { self.flush() })
    }

    /// Deallocates a range; later reads of it return zeroes.
    fn discard_async(&self, offset: u64, len: u64) -> IoFuture<'_, io::Result<()>> {
        Box::pin(async move { self.discard(offset, len) })
    }

    /// Writes zeroes over a range.
    fn write_zeroes_async(&self, offset: u64, len: u64) -> IoFuture<'_, io::Result<()>> {
        Box::pin(async move { self.write_zeroes(offset, len) })
    }
}

/// Refuses a range that does not fit in a device of `size` bytes, with a sentence that says so.
pub fn check_range(size: u64, offset: u64, len: u64) -> io::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the range {offset}+{len} bytes lies past the end of the device ({size} bytes)"
            ),
        )),
    }
}

/// A RAM-backed block device, for tests of the layers above the array.
pub struct MemBlockDevice {
    data: RwLock<Vec<u8>>,
}

impl MemBlockDevice {
    pub fn new(size: u64) -> Self {
        Self {
            data: RwLock::new(vec![0; size as usize]),
        }
    }
}

impl BlockDevice for MemBlockDevice {
    fn size_bytes(&self) -> u64 {
        self.data.read().unwrap().len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let d = self.data.read().unwrap();
        check_range(d.len() as u64, offset, buf.len() as u64)?;
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut d = self.data.write().unwrap();
        check_range(d.len() as u64, offset, data.len() as u64)?;
        d[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_device_round_trip_and_refuses_past_end() {
        let d = MemBlockDevice::new(8192);
        d.write_at(4000, b"hello").unwrap();
        let mut b = [0u8; 5];
        d.read_at(4000, &mut b).unwrap();
        assert_eq!(&b, b"hello");
        assert!(d.read_at(8190, &mut b).is_err());
        d.write_zeroes(4000, 5).unwrap();
        d.read_at(4000, &mut b).unwrap();
        assert_eq!(b, [0; 5]);
    }

    #[tokio::test]
    async fn async_defaults_lend_and_return_the_buffer() {
        let d: std::sync::Arc<dyn BlockDevice> = std::sync::Arc::new(MemBlockDevice::new(8192));
        let (r, buf) = d.write_async(100, IoBuf::from_slice(b"owned"), true).await;
        r.unwrap();
        assert_eq!(&buf[..], b"owned");
        let (r, buf) = d.read_async(100, IoBuf::standalone(5)).await;
        r.unwrap();
        assert_eq!(&buf[..], b"owned");
        let (r, buf) = d.read_async(8190, buf).await;
        assert!(r.is_err(), "a read past the end is refused");
        assert_eq!(buf.len(), 5, "and the buffer still comes back");
        d.write_zeroes_async(100, 5).await.unwrap();
        d.flush_async().await.unwrap();
        let (_, buf) = d.read_async(100, buf).await;
        assert_eq!(&buf[..], &[0; 5]);
    }
}
