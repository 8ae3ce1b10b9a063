//! Members as the engine sees them: something that reads and writes at byte offsets. Files and
//! block devices in production (O_DIRECT, io_uring), RAM in tests, wrappers for fault injection.

use parking_lot::RwLock;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Once;

use crate::aligned::AlignedBuf;

pub trait Drive: Send + Sync {
    /// A name for messages: the path for files.
    fn describe(&self) -> String;
    fn size_bytes(&self) -> u64;
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// A write that is durable when it returns (FUA on a drive that has it). Unlike
    /// `write_at` + `flush`, it need not wait for the drive's other writes to become durable,
    /// which is what the partial-parity log wants: its record durable, nothing else. The
    /// default is exactly that pair, so wrappers (fault injection, the crash tests' drives)
    /// see ordinary writes and flushes.
    fn write_fua_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)?;
        self.flush()
    }
    /// A file descriptor io_uring may read and write directly with the same meaning as
    /// `read_at`/`write_at`; None sends I/O through the methods above.
    fn uring_fd(&self) -> Option<RawFd> {
        None
    }
    /// Whether a flush may go to io_uring as an fdatasync of `uring_fd`. A drive that models
    /// durability itself (the crash tests' drive files, whose flush records what is durable)
    /// says no, so every flush reaches `flush` while reads and writes still use the ring.
    fn uring_flush(&self) -> bool {
        self.uring_fd().is_some()
    }
    /// Whether I/O needs 4 KiB aligned buffers (O_DIRECT).
    fn direct(&self) -> bool {
        false
    }
    /// Makes `[offset, offset + len)` read back as zeroes, giving its space back where the drive
    /// can (a hole in a drive file, an unmapped range of an SSD). Durable on the next `flush`.
    /// The default writes zeroes, so wrappers (fault injection) see ordinary writes.
    fn deallocate(&self, offset: u64, len: u64) -> io::Result<()> {
        write_zeroes(self, offset, len)
    }
    /// Makes `[offset, offset + len)` read back as zeroes in one request, where the drive offers
    /// one that does not write every block: a hole punched in a drive file, or write-zeroes by
    /// unmapping on a device that guarantees zeroes after it. `Ok(false)`: the drive offers no
    /// such request and nothing changed. Durable on the next `flush`. The default says no, so
    /// wrappers (fault injection, the crash tests' drives) keep seeing only ordinary writes.
    fn zero_by_unmap(&self, offset: u64, len: u64) -> io::Result<bool> {
        let _ = (offset, len);
        Ok(false)
    }
    /// Blocks until the I/O this thread gave the drive has completed. A drive whose calls
    /// return on completion (every real one) has nothing to wait for. The bench's simulated
    /// drives book an I/O's service time (flushes and FUA writes too) and return at once, so
    /// whoever must not run ahead of its I/O calls this: the rebuild's reader and writer threads
    /// after each batch, and whoever flushes or writes with FUA (`crate::io::execute`, the
    /// bitmap, the failure record) before relying on it being durable.
    fn settle(&self) {}
}

/// Writes zeroes over a range in 1 MiB pieces, from an aligned buffer (fine for O_DIRECT).
fn write_zeroes<D: Drive + ?Sized>(d: &D, offset: u64, len: u64) -> io::Result<()> {
    let zeros = AlignedBuf::zeroed(len.min(1 << 20) as usize);
    let mut done = 0;
    while done < len {
        let n = (len - done).min(zeros.len() as u64) as usize;
        d.write_at(&zeros[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

static BUFFERED_NOTICE: Once = Once::new();

/// A drive file or block device.
pub struct FileDrive {
    path: PathBuf,
    file: File,
    size: u64,
    direct: bool,
}

impl FileDrive {
    /// Opens a member for exclusive use by this process: O_DIRECT where the filesystem allows
    /// it, buffered I/O with fdatasync on flush where it does not (tmpfs, 9p), said once.
    pub fn open(path: &Path) -> io::Result<FileDrive> {
        let mut direct = true;
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                direct = false;
                OpenOptions::new().read(true).write(true).open(path)?
            }
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        let size = if meta.file_type().is_file() {
            meta.len()
        } else {
            use std::io::Seek;
            (&file).seek(io::SeekFrom::End(0))?
        };
        if meta.file_type().is_block_device() {
            check_logical_block(&file, path)?;
        }
        // Some filesystems accept O_DIRECT at open and refuse it at the first I/O: probe once.
        if direct && size >= 4096 {
            let mut probe = AlignedBuf::zeroed(4096);
            if let Err(e) = file.read_exact_at(&mut probe, 0) {
                if e.raw_os_error() == Some(libc::EINVAL) {
                    direct = false;
                } else {
                    return Err(e);
                }
            }
        }
        let file = if direct {
            file
        } else {
            BUFFERED_NOTICE.call_once(|| {
                tracing::warn!(
                    "the filesystem under {} refuses O_DIRECT; members there use buffered I/O with fdatasync on flush",
                    path.display()
                )
            });
            OpenOptions::new().read(true).write(true).open(path)?
        };
        // One process owns a member at a time: a second `millrace` (or a server) must not write
        // the same drive behind this one's back.
        // A process that just exited can hold its lock a moment longer: with io_uring, its
        // files are released only when the kernel has torn its rings down. So wait a little.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        // SAFETY: flock on a valid descriptor we own.
        while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
                continue;
            }
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{} is in use by another process (a running `millrace serve`?); stop it or use the server's API",
                        path.display()
                    ),
                ));
            }
            return Err(e);
        }
        Ok(FileDrive {
            path: path.to_path_buf(),
            file,
            size,
            direct,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// (device, inode): two paths naming the same drive have the same identity.
    pub fn identity(path: &Path) -> io::Result<(u64, u64)> {
        let m = std::fs::metadata(path)?;
        if m.file_type().is_block_device() {
            Ok((m.rdev(), 0))
        } else {
            Ok((m.dev(), m.ino()))
        }
    }
}

use std::os::unix::fs::FileTypeExt;

impl Drive for FileDrive {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    /// RWF_DSYNC: the kernel sends an O_DIRECT write to an NVMe drive as a FUA write, and
    /// syncs just this range of a buffered file.
    fn write_fua_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        millrace_io::ring::write_all_durable(self.fd(), buf, offset)
    }
    fn uring_fd(&self) -> Option<RawFd> {
        Some(self.fd())
    }
    fn direct(&self) -> bool {
        self.direct
    }
    fn zero_by_unmap(&self, offset: u64, len: u64) -> io::Result<bool> {
        self.punch(offset, len)
    }
    /// A drive file gets a hole (`fallocate` PUNCH_HOLE, KEEP_SIZE: its blocks go back to the
    /// filesystem and read as zeroes). On a block device the same call asks the kernel to
    /// write zeroes by unmapping, and only where the device guarantees that unmapped blocks read
    /// back as zeroes (REQ_OP_WRITE_ZEROES without fallback; plain BLKDISCARD promises nothing
    /// about what a later read returns, so it is not used). Where neither is offered, zeroes
    /// are written: BLKZEROOUT on a block device, plain writes on a file.
    fn deallocate(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.zero_by_unmap(offset, len)? {
            return Ok(());
        }
        if self.file.metadata()?.file_type().is_block_device() {
            let range: [u64; 2] = [offset, len];
            // SAFETY: BLKZEROOUT reads two u64s (start, length) from the pointer given.
            let r = unsafe { libc::ioctl(self.fd(), BLKZEROOUT, range.as_ptr()) };
            if r == 0 {
                return Ok(());
            }
        }
        write_zeroes(self, offset, len)
    }
}

impl FileDrive {
    /// `Drive::zero_by_unmap` for files and block devices: `fallocate` PUNCH_HOLE (KEEP_SIZE),
    /// which a block device serves as write-zeroes by unmapping, without the kernel's fallback
    /// of writing the zeroes itself.
    fn punch(&self, offset: u64, len: u64) -> io::Result<bool> {
        if len == 0 {
            return Ok(true);
        }
        let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the range {offset}+{len} does not fit a file offset"),
            ));
        };
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: fallocate on a descriptor this drive owns; no memory is passed.
        if unsafe { libc::fallocate(self.fd(), mode, off, n) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => Ok(false),
            _ => Err(e),
        }
    }
}

/// `_IO(0x12, 104)` from linux/fs.h: a block device's logical block size.
const BLKSSZGET: libc::c_ulong = 0x1268;

/// The engine reads and writes members in 4 KiB-aligned units (`geometry::SECTOR`), which a
/// device with 512-byte or 4096-byte logical blocks takes under O_DIRECT; a larger logical
/// block would refuse them, so such a device is refused here with a sentence rather than
/// falling back to buffered I/O.
fn check_logical_block(file: &File, path: &Path) -> io::Result<()> {
    let mut lbs: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer given.
    if unsafe { libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut lbs) } != 0 {
        return Ok(());
    }
    if lbs > 4096 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} has {lbs}-byte logical blocks; members need 512- or 4096-byte logical blocks (reformat the drive's namespace to one of those, e.g. with nvme format --lbaf)",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// `_IO(0x12, 127)` from linux/fs.h: write zeroes over a range of a block device.
const BLKZEROOUT: libc::c_ulong = 0x127f;

/// A RAM drive, for tests and simulations.
pub struct MemDrive {
    name: String,
    data: RwLock<Vec<u8>>,
}

impl MemDrive {
    pub fn new(name: impl Into<String>, size: u64) -> MemDrive {
        MemDrive {
            name: name.into(),
            data: RwLock::new(vec![0; size as usize]),
        }
    }

    /// A copy of the drive's bytes, as a test reference reads them.
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.read().clone()
    }

    /// Changes bytes behind the engine's back, as a lying drive would.
    pub fn corrupt(&self, offset: u64, bytes: &[u8]) {
        self.data.write()[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
    }
}

fn check(size: usize, offset: u64, len: usize, name: &str) -> io::Result<usize> {
    let off = offset as usize;
    if off.checked_add(len).is_none_or(|end| end > size) {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("I/O at {offset}+{len} lies past the end of {name} ({size} bytes)"),
        ));
    }
    Ok(off)
}

impl Drive for MemDrive {
    fn describe(&self) -> String {
        self.name.clone()
    }
    fn size_bytes(&self) -> u64 {
        self.data.read().len() as u64
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let d = self.data.read();
        let off = check(d.len(), offset, buf.len(), &self.name)?;
        buf.copy_from_slice(&d[off..off + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut d = self.data.write();
        let off = check(d.len(), offset, buf.len(), &self.name)?;
        d[off..off + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FUA write on a drive file (O_DIRECT where the filesystem takes it, so aligned) reads
    /// back, and leaves its neighbours alone.
    #[test]
    fn file_drive_fua_write_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.img");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let d = FileDrive::open(&path).unwrap();
        let mut data = AlignedBuf::zeroed(8192);
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        d.write_fua_at(&data, 4096).unwrap();
        let mut got = AlignedBuf::zeroed(16384);
        d.read_at(&mut got, 0).unwrap();
        assert!(got[..4096].iter().all(|&b| b == 0));
        assert_eq!(&got[4096..12288], &data[..]);
        assert!(got[12288..].iter().all(|&b| b == 0));
    }
}
