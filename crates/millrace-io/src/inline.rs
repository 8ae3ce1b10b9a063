//! Descriptors of files that live in memory (tmpfs, ramfs), whose I/O a core runs inline.
//!
//! Why: a read or write of a tmpfs file cannot be issued to io_uring without blocking, so the
//! kernel hands every such entry to an io-wq worker thread; for a 4 KiB copy the hand-off (a
//! wake-up and two context switches, on the core the server is pinned to) costs several times
//! the copy itself (31% of the core in docs/PERFORMANCE.md's 4K rows). A plain pread/pwrite on
//! the core thread does the same copy with none of that. Drives on real devices never go here.
//!
//! A fixed bitmap over descriptor numbers: one relaxed load per operation to ask, no lock; the
//! drive that marked a descriptor unmarks it before closing it, so a reused number is never
//! taken for a memory file.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

/// Descriptors above this are never inline (their I/O goes to the ring as usual).
pub(crate) const MAX_FD: usize = 1 << 16;
static BITS: [AtomicU64; MAX_FD / 64] = [const { AtomicU64::new(0) }; MAX_FD / 64];

fn slot(fd: RawFd) -> Option<(usize, u64)> {
    let i = usize::try_from(fd).ok().filter(|&i| i < MAX_FD)?;
    Some((i / 64, 1u64 << (i % 64)))
}

/// Marks (or unmarks) `fd` as a file in memory.
pub fn set(fd: RawFd, on: bool) {
    if let Some((w, b)) = slot(fd) {
        if on {
            BITS[w].fetch_or(b, Ordering::Release);
        } else {
            BITS[w].fetch_and(!b, Ordering::Release);
        }
    }
}

/// Whether `fd` was marked as a file in memory.
pub fn is_set(fd: RawFd) -> bool {
    slot(fd).is_some_and(|(w, b)| BITS[w].load(Ordering::Acquire) & b != 0)
}

/// Whether `fd` is a file on tmpfs or ramfs, whose I/O should run inline. Set
/// `MILLRACE_INLINE_MEMORY_FILES=0` to send it to the ring like any other (to compare the two).
pub fn in_memory(fd: RawFd) -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *OFF.get_or_init(|| std::env::var("MILLRACE_INLINE_MEMORY_FILES").is_ok_and(|v| v == "0")) {
        return false;
    }
    on_memory_fs(fd)
}

/// Whether `fd` is a file on tmpfs or ramfs, whatever `MILLRACE_INLINE_MEMORY_FILES` says.
pub fn on_memory_fs(fd: RawFd) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    // SAFETY: fstatfs writes only into `s`, a zeroed struct of the right type.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(fd, &mut s) } != 0 {
        return false;
    }
    let t = s.f_type as i64;
    t == TMPFS_MAGIC || t == RAMFS_MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn marks_and_unmarks() {
        set(60_000, true);
        assert!(is_set(60_000));
        assert!(!is_set(60_001));
        set(60_000, false);
        assert!(!is_set(60_000));
        set(-1, true);
        assert!(!is_set(-1));
        set(1 << 20, true);
        assert!(!is_set(1 << 20));
    }

    #[test]
    fn dev_shm_is_in_memory_and_a_pipe_is_not() {
        match tempfile::tempfile_in("/dev/shm") {
            Ok(f) => assert!(in_memory(f.as_raw_fd())),
            Err(_) => crate::cannot_run("a tmpfs at /dev/shm"),
        }
        let (r, _w) = std::io::pipe().unwrap();
        assert!(!in_memory(r.as_raw_fd()));
    }
}
