//! Drive files in memory (tmpfs, ramfs) mapped into the process, so that a core's inline I/O
//! on them is a memcpy instead of a pread or pwrite. A copy into the mapping cut short by a
//! killed process would leave a sector torn, so a write goes through a redo slot first
//! (`redo`), or by pwrite where the drive has none; only writes whose sectors the array
//! repairs after a crash anyway ([`Access::WriteRepaired`]: parity under a write-intent bitmap)
//! are copied straight into the mapping.
//!
//! Why: even inline (`crate::inline`), a 4 KiB pread of a tmpfs file costs a system call, a
//! page-cache lookup per page and LRU bookkeeping around the copy: 27% of the core in the 4K
//! NVMe/TCP rows of docs/PERFORMANCE.md, of which the copy itself is 7%. Through a mapping the
//! copy is all that is left (SPDK's malloc bdev copies the same way).
//!
//! Faults are not crashes. A mapped file that shrank under us (another process truncated the
//! drive file), or a tmpfs that is full when a never-written page is first touched, raises
//! SIGBUS where pread would have returned short or pwrite ENOSPC. A handler of SIGBUS finds
//! the fault in one of these mappings, marks the mapping broken, puts an anonymous page where
//! the faulting one was so the copy can finish, and returns; the copy then reports that it did
//! not happen, and the operation runs again with pread/pwrite, which give the error (or the
//! zeroes of a hole) the drive file really has. A broken mapping is never used again. A fault
//! anywhere else goes to the handler that was there before (Rust's own, or the default).
//!
//! Written by hand because no maintained crate turns a fault in a file mapping into an error:
//! memmap2 maps, and leaves SIGBUS to kill the process.
//!
//! Holes stay holes: reading a hole of a tmpfs file through a mapping would allocate its page,
//! so only ranges known to hold no hole are read through it (`crate::filled`); others go by
//! pread.

use std::os::fd::RawFd;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU16, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::OnceLock;

use crate::filled::Filled;
use crate::inline::MAX_FD;

pub mod redo;
use redo::Redo;

/// Mappings at once: two per drive file (its own and its redo file's).
const SLOTS: usize = 2048;

struct Slot {
    used: AtomicBool,
    base: AtomicUsize,
    len: AtomicUsize,
    broken: AtomicBool,
    /// The drive file's descriptor (-1 for a redo file's mapping), to look at its size.
    fd: AtomicI32,
    /// The mapping broke because its file shrank: see [`lost`].
    shrunk: AtomicBool,
    /// Which chunks hold no hole (a `Filled` owned by the `Mapping`, null when unused).
    filled: AtomicPtr<Filled>,
    /// The drive's redo slots (a `Redo` owned by the `Mapping`; null: writes by pwrite).
    redo: AtomicPtr<Redo>,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        used: AtomicBool::new(false),
        base: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        broken: AtomicBool::new(false),
        fd: AtomicI32::new(-1),
        shrunk: AtomicBool::new(false),
        filled: AtomicPtr::new(std::ptr::null_mut()),
        redo: AtomicPtr::new(std::ptr::null_mut()),
    }
}; SLOTS];

/// One past the highest slot ever used: where a search of the table by address may stop.
static HIGH: AtomicUsize = AtomicUsize::new(0);

/// Mappings broken so far in this process; while none is, every lent byte is intact.
static BREAKS: AtomicU64 = AtomicU64::new(0);

/// The watched slot whose mapping holds `addr`, and the mapping's start. Async-signal-safe
/// (atomics only): the SIGBUS handler finds its fault's mapping with it. A slot's index is
/// below HIGH before its base is published (`watch`).
fn slot_at(addr: usize) -> Option<(&'static Slot, usize)> {
    TABLE[..HIGH.load(Ordering::Acquire).min(SLOTS)]
        .iter()
        .find_map(|s| {
            let base = s.base.load(Ordering::SeqCst);
            let inside = base != 0 && addr >= base && addr - base < s.len.load(Ordering::SeqCst);
            inside.then_some((s, base))
        })
}

/// Whether lent bytes at `addr` are still their drive's: false once the mapping they lie in
/// broke, after which a copy of them may have read the zeroes put in place of a page that was
/// gone (the SIGBUS handler below) instead of the drive's data.
pub(crate) fn intact(addr: usize) -> bool {
    if BREAKS.load(Ordering::Acquire) == 0 {
        return true;
    }
    slot_at(addr).is_none_or(|(s, _)| !s.broken.load(Ordering::SeqCst))
}

/// For lent bytes `addr..addr+len` that the kernel could not read (a send from them failed with
/// EFAULT, which is what a fault in the kernel's copy gives instead of SIGBUS): whether they lie
/// past the end of their drive file, which shrank under its mapping. Then the mapping is broken,
/// as a fault in our own copy would break it, so the drive's reads go by pread from now on and
/// fail as the drive file really does.
pub(crate) fn shrank_under(addr: usize, len: usize) -> bool {
    let Some((s, base)) = slot_at(addr) else {
        return false;
    };
    let end = (addr - base).saturating_add(len) as u64;
    if file_size(s).is_none_or(|size| size >= end) {
        return false;
    }
    break_slot(s);
    true
}

/// The size of the drive file behind a slot; None for a redo file's, or where fstat fails.
fn file_size(s: &Slot) -> Option<u64> {
    let fd = s.fd.load(Ordering::SeqCst);
    if fd < 0 {
        return None;
    }
    u64::try_from(fstat(fd)?.st_size).ok()
}

/// fstat of `fd`; None where it fails.
fn fstat(fd: RawFd) -> Option<libc::stat> {
    // SAFETY: fstat writes only into `st`, a zeroed struct of the right type.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
}

/// Whether a broken mapping's drive file is shorter than the mapping: the drive lost data
/// (truncated behind the pool's back). Then its reads and writes fail (EIO) instead of going
/// by pread and pwrite, and the array takes the member out of service: a pwrite past the
/// file's new end would grow it back with holes, which read as zeroes, and the member would
/// stay in service serving them as its data. Looked at only once the mapping broke.
fn lost(s: &Slot) -> bool {
    if s.shrunk.load(Ordering::SeqCst) {
        return true;
    }
    if !s.broken.load(Ordering::SeqCst) {
        return false;
    }
    let len = s.len.load(Ordering::SeqCst) as u64;
    let Some(size) = file_size(s).filter(|&size| size < len) else {
        return false;
    };
    if !s.shrunk.swap(true, Ordering::SeqCst) {
        tracing::warn!(
            "a drive file in memory shrank from {len} to {size} bytes behind the pool's back; its reads and writes fail from now on"
        );
    }
    true
}

/// [`lost`] for the mapping of `fd`, if it has one.
fn lost_fd(fd: RawFd) -> bool {
    let Some(i) = fd_index(fd) else { return false };
    let Some(slot) = SLOT_OF[i].load(Ordering::Acquire).checked_sub(1) else {
        return false;
    };
    lost(&TABLE[slot as usize])
}

/// What an operation on a drive that lost data ([`lost`]) returns: EIO, as a system call would.
const LOST: i64 = -(libc::EIO as i64);

/// Marks a mapping broken: it is never used again. Async-signal-safe (atomics only).
fn break_slot(s: &Slot) {
    s.broken.store(true, Ordering::SeqCst);
    BREAKS.fetch_add(1, Ordering::SeqCst);
}

/// Whether the first `len` bytes of `fd` are all allocated (no holes).
fn allocated(fd: RawFd, len: usize) -> bool {
    fstat(fd).is_some_and(|st| {
        u64::try_from(st.st_blocks).is_ok_and(|b| b.saturating_mul(512) >= len as u64)
    })
}

/// Slot index + 1 of the mapping of each descriptor; 0: none.
static SLOT_OF: [AtomicU16; MAX_FD] = [const { AtomicU16::new(0) }; MAX_FD];

/// The system's page size and the SIGBUS action found before ours, once ours is in place.
struct Handler {
    page: usize,
    previous: libc::sigaction,
}

// SAFETY: `previous` is plain data (a handler address, flags and a mask) only read.
unsafe impl Sync for Handler {}
unsafe impl Send for Handler {}

static HANDLER: OnceLock<Option<Handler>> = OnceLock::new();

/// A drive file mapped for inline I/O; unmapped (and forgotten) when dropped. Drop it before
/// the descriptor closes, so its number is never taken for this mapping again.
pub struct Mapping {
    fd: RawFd,
    /// Its slot in the table, which the SIGBUS handler watches; always Some until the drop,
    /// which ends the watch before it unmaps.
    watch: Option<Watch>,
    base: usize,
    len: usize,
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("fd", &self.fd)
            .field("len", &self.len)
            .finish()
    }
}

fn fd_index(fd: RawFd) -> Option<usize> {
    usize::try_from(fd).ok().filter(|&i| i < MAX_FD)
}

/// Maps `len` bytes of `fd` (a file in memory, open for reading and writing) for inline I/O;
/// writes go through `redo`'s slots, or by pwrite where it is None. None where it cannot be
/// (the descriptor number is too high, no slot is free, the SIGBUS handler could not be
/// installed, mmap refused, or `MILLRACE_MAP_MEMORY_FILES=0`): the file's I/O then runs with
/// pread/pwrite as before.
pub fn map(fd: RawFd, len: u64, redo: Option<Redo>) -> Option<Mapping> {
    static OFF: OnceLock<bool> = OnceLock::new();
    if *OFF.get_or_init(|| std::env::var("MILLRACE_MAP_MEMORY_FILES").is_ok_and(|v| v == "0")) {
        return None;
    }
    let i = fd_index(fd)?;
    let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
    let p = map_shared(fd, len)?;
    let base = p as usize;
    let Some(watch) = watch(base, len) else {
        // SAFETY: unmaps what was mapped just above and never published.
        unsafe { libc::munmap(p, len) };
        return None;
    };
    let s = &TABLE[watch.slot];
    s.fd.store(fd, Ordering::SeqCst);
    let known = Box::new(Filled::new(len as u64, allocated(fd, len)));
    s.filled.store(Box::into_raw(known), Ordering::SeqCst);
    if let Some(r) = redo {
        s.redo.store(Box::into_raw(Box::new(r)), Ordering::SeqCst);
    }
    // Copies find the mapping through its descriptor: published last, when all is in place.
    SLOT_OF[i].store(watch.slot as u16 + 1, Ordering::Release);
    Some(Mapping {
        fd,
        watch: Some(watch),
        base,
        len,
    })
}

/// A new shared mapping, for reading and writing, of the first `len` bytes of `fd`.
fn map_shared(fd: RawFd, len: usize) -> Option<*mut libc::c_void> {
    // SAFETY: a new mapping of a file the caller holds open; nothing else is at that address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p)
}

/// A mapping of ours (a drive file's or its redo file's) in the table, watched for faults: one
/// there breaks it (and fills the page with zeroes) instead of killing the process. Dropping it
/// stops the watch and frees the slot; unmap after that.
pub(crate) struct Watch {
    slot: usize,
}

/// Watches `base..base+len`; None where the handler could not be installed or no slot is free.
pub(crate) fn watch(base: usize, len: usize) -> Option<Watch> {
    HANDLER.get_or_init(install).as_ref()?;
    let slot = TABLE.iter().position(|s| {
        s.used
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })?;
    HIGH.fetch_max(slot + 1, Ordering::AcqRel);
    let s = &TABLE[slot];
    s.broken.store(false, Ordering::SeqCst);
    s.fd.store(-1, Ordering::SeqCst);
    s.shrunk.store(false, Ordering::SeqCst);
    s.len.store(len, Ordering::SeqCst);
    s.base.store(base, Ordering::SeqCst);
    Some(Watch { slot })
}

impl Watch {
    pub(crate) fn broken(&self) -> bool {
        TABLE[self.slot].broken.load(Ordering::SeqCst)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let s = &TABLE[self.slot];
        s.base.store(0, Ordering::SeqCst);
        s.len.store(0, Ordering::SeqCst);
        s.used.store(false, Ordering::Release);
    }
}

impl Mapping {
    /// Where `len` bytes at `offset` of the file lie in the mapping, for a caller that sends
    /// them from there instead of copying them out (`IoBuf::lent`); valid while the mapping
    /// lives. None where a copy must be made: the mapping is broken, the range lies past it or
    /// may hold a hole (reading a hole through the mapping would allocate its page). A fault
    /// while the kernel reads them (the file shrank under us) fails that system call with
    /// EFAULT: no signal is raised for a fault in the kernel's copy.
    pub fn lend(&self, offset: u64, len: usize) -> Option<std::ptr::NonNull<u8>> {
        let w = self.watch.as_ref()?;
        let start = usize::try_from(offset).ok()?;
        if w.broken() || start.checked_add(len)? > self.len {
            return None;
        }
        let f = TABLE[w.slot].filled.load(Ordering::Acquire);
        // SAFETY: set in `map` and freed only in this mapping's drop.
        let known = unsafe { f.as_ref() }?;
        if !known.all_known(offset, len) {
            // As a copy's read: a look at the pages, once per chunk until a write touches it.
            let page = HANDLER.get().and_then(|h| h.as_ref()).map_or(0, |h| h.page);
            if !known.check(self.base, page, offset, len) {
                return None;
            }
        }
        std::ptr::NonNull::new((self.base + start) as *mut u8)
    }

    /// Call before punching a hole in `offset..offset+len` of the file: reads there go by
    /// pread until it is known filled again. (A read through the mapping racing with the punch
    /// can still allocate a page of the hole: memory, never wrong data, since a hole reads as
    /// zeroes either way.)
    pub fn punching_hole(&self, offset: u64, len: u64) {
        let Some(w) = &self.watch else { return };
        let f = TABLE[w.slot].filled.load(Ordering::Acquire);
        // SAFETY: set in `map` and freed only in this mapping's drop.
        if let Some(f) = unsafe { f.as_ref() } {
            f.punching(offset, len);
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Some(i) = fd_index(self.fd) {
            SLOT_OF[i].store(0, Ordering::Release);
        }
        if let Some(w) = self.watch.take() {
            let s = &TABLE[w.slot];
            let f = s.filled.swap(std::ptr::null_mut(), Ordering::SeqCst);
            if !f.is_null() {
                // SAFETY: made by Box::into_raw in `map`, unpublished just above.
                drop(unsafe { Box::from_raw(f) });
            }
            let r = s.redo.swap(std::ptr::null_mut(), Ordering::SeqCst);
            if !r.is_null() {
                // SAFETY: as `f`; no write runs once the drive is being dropped.
                drop(unsafe { Box::from_raw(r) });
            }
            // The watch ends before the unmap: once unmapped, the range may be another's.
            drop(w);
        }
        // SAFETY: our own mapping, no longer published; the drive that owns it runs no I/O
        // once it is being dropped.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// Which way [`copy`] goes, and how a write may land.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// From the file into the buffer.
    Read,
    /// Into the file, every sector whole or untouched even if the process is killed meanwhile:
    /// through a redo slot (`redo`), or by pwrite.
    Write,
    /// Into the file, where a sector torn by a kill is repaired before anything reads it: the
    /// array's parity under a write-intent bitmap, which marks the row before the write and
    /// recomputes its parity from the data after a crash. A memcpy into the mapping, which
    /// costs less than the kernel's page-cache write (docs/PERFORMANCE.md).
    WriteRepaired,
}

/// The slot of `fd`'s mapping, its base and where `offset` lies in it, when the mapping is
/// whole and holds `len` bytes there.
fn mapped_range(fd: RawFd, offset: u64, len: usize) -> Option<(&'static Slot, usize, usize)> {
    let i = fd_index(fd)?;
    let slot = SLOT_OF[i].load(Ordering::Acquire).checked_sub(1)? as usize;
    let s = &TABLE[slot];
    if s.broken.load(Ordering::SeqCst) {
        return None;
    }
    let (base, maplen) = (
        s.base.load(Ordering::Acquire),
        s.len.load(Ordering::Acquire),
    );
    let start = usize::try_from(offset).ok()?;
    if base == 0 || start.checked_add(len)? > maplen {
        return None;
    }
    Some((s, base, start))
}

/// Copies `len` bytes between the mapping of `fd` at `offset` and `buf` (into `buf` for a
/// read). Some(len) when done; None when the operation must run by pread/pwrite instead: no
/// mapping, a range past it, or a fault during (or before) the copy.
///
/// # Safety
/// `buf..buf+len` is valid for the copy's direction and nothing else touches it meanwhile.
pub(crate) unsafe fn copy(
    fd: RawFd,
    offset: u64,
    buf: *mut u8,
    len: usize,
    access: Access,
) -> Option<i64> {
    let read = access == Access::Read;
    let Some((s, base, start)) = mapped_range(fd, offset, len) else {
        return lost_fd(fd).then_some(LOST);
    };
    // SAFETY: set in `map`, freed only when the mapping is dropped (no I/O runs then).
    let known = unsafe { s.filled.load(Ordering::Acquire).as_ref() }?;
    if read && !known.all_known(offset, len) {
        // A mapping exists, so the handler (and with it the page size) is in place.
        let page = HANDLER.get().and_then(|h| h.as_ref()).map_or(0, |h| h.page);
        if !known.check(base, page, offset, len) {
            return None;
        }
    }
    if access == Access::Write {
        // SAFETY: set in `map`, freed only when the mapping is dropped (no I/O runs then).
        let redo = unsafe { s.redo.load(Ordering::Acquire).as_ref() };
        // SAFETY: `buf..buf+len` is valid for reads (the caller's contract).
        let src = unsafe { std::slice::from_raw_parts(buf.cast_const(), len) };
        if !write_whole(fd, redo, s, base + start, src, offset) {
            return lost(s).then_some(LOST);
        }
        known.wrote(offset, len);
        return Some(len as i64);
    }
    let at = (base + start) as *mut u8;
    // The drive file is this process's alone (FileDrive opens members for exclusive use), so
    // nothing writes these pages while we copy.
    if read {
        std::ptr::copy_nonoverlapping(at, buf, len);
    } else {
        // A fault part way (the file shrank, or tmpfs is full at a page never written) breaks
        // the mapping below; the caller then writes all of it again by pwrite.
        stream_copy(at, buf.cast_const(), len);
    }
    if s.broken.load(Ordering::SeqCst) {
        return lost(s).then_some(LOST);
    }
    if !read {
        known.wrote(offset, len);
    }
    Some(len as i64)
}

/// A range of a mapped drive file's pages, handed to its writer to write in place on the terms
/// of [`Access::WriteRepaired`] (a sector torn by a kill is repaired before anything reads it):
/// the array computes parity straight into its members, which saves computing it into a buffer
/// and copying that in (6-10% of the core in 128K RAID6 writes). Finish it with [`Place::finish`].
pub struct Place {
    fd: RawFd,
    offset: u64,
    at: *mut u8,
    len: usize,
    slot: &'static Slot,
}

// SAFETY: a range of a shared mapping that only its holder writes (see `place`).
unsafe impl Send for Place {}

/// The pages of `len` bytes at `offset` of the mapped `fd`, for a write in place on
/// [`Access::WriteRepaired`]'s terms. None where the write must go from a buffer instead: no
/// mapping, a range past it, or a broken one. The caller holds the range for itself (the
/// array's row lock) until it finishes; the drive file is this process's alone.
pub fn place(fd: RawFd, offset: u64, len: usize) -> Option<Place> {
    let (s, base, start) = mapped_range(fd, offset, len)?;
    Some(Place {
        fd,
        offset,
        at: (base + start) as *mut u8,
        len,
        slot: s,
    })
}

impl Place {
    /// The range's pages, to be written whole: what they held before is the file's old data.
    /// A fault while they are written (the file shrank, or tmpfs is full at a page never
    /// written) puts an anonymous page in the faulting one's place, so the write finishes in
    /// memory and `finish` then writes it to the file by pwrite.
    pub fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: within the mapping (checked in `place`), which outlives every operation on
        // its drive; only this holder writes the range meanwhile (`place`'s contract).
        unsafe { std::slice::from_raw_parts_mut(self.at, self.len) }
    }

    /// Bytes in the range.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The range is written: Ok(len) once the file has it (in its pages, or by pwrite from
    /// them where the mapping broke meanwhile); Err where the file took no write.
    pub fn finish(self) -> std::io::Result<usize> {
        if lost(self.slot) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        if self.slot.broken.load(Ordering::SeqCst) {
            // SAFETY: the range is readable, anonymous pages where faults were.
            let bytes = unsafe { std::slice::from_raw_parts(self.at.cast_const(), self.len) };
            if pwrite_all(self.fd, bytes, self.offset) {
                return Ok(self.len);
            }
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(0) | None => std::io::ErrorKind::WriteZero.into(),
                Some(_) => e,
            });
        }
        // SAFETY: set in `map`, freed only when the mapping is dropped (no I/O runs then).
        if let Some(known) = unsafe { self.slot.filled.load(Ordering::Acquire).as_ref() } {
            known.wrote(self.offset, self.len);
        }
        Ok(self.len)
    }
}

/// Writes `src` at `offset` of the drive `fd`, mapped at `at`, so that a kill meanwhile leaves
/// every sector old or new: each piece through a slot of `redo` and then into the mapping, or
/// by pwrite (no redo, no slot free, a mapping broken; a process killed in the middle of a
/// memcpy leaves a sector part old and part new, while the kernel's copy for pwrite stops only
/// between pages: crates/millrace-cli/tests/failures.rs,
/// killed_writers_on_memory_files_tear_no_sector). The pwrite goes to the mapping's own pages,
/// so reads through it see the write. False: not done (the caller's pwrite reports the error).
fn write_whole(
    fd: RawFd,
    redo: Option<&Redo>,
    s: &Slot,
    at: usize,
    src: &[u8],
    offset: u64,
) -> bool {
    let Some(claim) = redo.and_then(Redo::claim) else {
        return pwrite_all(fd, src, offset);
    };
    for (i, piece) in src.chunks(redo::SLOT_BYTES).enumerate() {
        let skip = i * redo::SLOT_BYTES;
        let off = offset + skip as u64;
        // SAFETY: `piece` is a valid slice of its length.
        if !unsafe { claim.mark(off, piece.as_ptr(), piece.len()) } {
            return pwrite_all(fd, &src[skip..], off);
        }
        // SAFETY: `at + skip..` lies within the mapping (checked by the caller), the drive
        // file is this process's alone and the range is this write's.
        unsafe { stream_copy((at + skip) as *mut u8, piece.as_ptr(), piece.len()) };
        if s.broken.load(Ordering::SeqCst) {
            if lost(s) {
                return false;
            }
            // The mapping broke part way: the rest by pwrite, while the slot still holds this
            // piece for a replay.
            let done = pwrite_all(fd, &src[skip..], off);
            claim.clear();
            return done;
        }
        claim.clear();
    }
    true
}

/// Copies `len` bytes from `src` to `dst` with non-temporal stores where the CPU has them:
/// parity is written once and not read again soon, and its pages are rarely in the cache, so
/// stores that bypass the cache skip reading each line in before overwriting it (the copy
/// cost 8.5% of the core in 128K RAID6 writes by glibc's memcpy, which streams only copies of
/// several MiB). Small writes gain too: 4 KiB copied to random pages of a 2 GiB tmpfs mapping
/// took 300 ns streamed against 575 ns by memcpy on this machine (2026-11-29), whose stores
/// first read each line in. Written by hand because no maintained crate offers a streaming copy.
///
/// # Safety
/// `src..src+len` is valid for reads, `dst..dst+len` for writes, and they do not overlap.
unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // SSE2, which every x86_64 CPU has: streaming stores of 16 bytes to aligned addresses.
        let head = dst.align_offset(16).min(len);
        std::ptr::copy_nonoverlapping(src, dst, head);
        let (mut d, mut s, mut left) = (dst.add(head), src.add(head), len - head);
        while left >= 64 {
            for i in 0..4 {
                let v = _mm_loadu_si128(s.add(i * 16).cast::<__m128i>());
                _mm_stream_si128(d.add(i * 16).cast::<__m128i>(), v);
            }
            (d, s, left) = (d.add(64), s.add(64), left - 64);
        }
        std::ptr::copy_nonoverlapping(s, d, left);
        // Streaming stores are weakly ordered: fence them before the write is reported done.
        _mm_sfence();
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::ptr::copy_nonoverlapping(src, dst, len);
}

/// Writes all of `buf` at `offset`; false on an error (the caller's own pwrite then reports
/// it). The same loop as `ring`'s whole transfers, which this module, below `ring`, cannot call.
fn pwrite_all(fd: RawFd, mut buf: &[u8], mut offset: u64) -> bool {
    while !buf.is_empty() {
        let Ok(off) = libc::off_t::try_from(offset) else {
            return false;
        };
        // SAFETY: `buf` is a valid slice for its length.
        let n = unsafe { libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), off) };
        match usize::try_from(n) {
            Ok(0) | Err(_) => return false,
            Ok(n) => {
                buf = &buf[n..];
                offset += n as u64;
            }
        }
    }
    true
}

/// Reads `buf.len()` bytes at `offset` of `fd` through its mapping; false: not done (read it
/// with pread).
pub fn read_into(fd: RawFd, offset: u64, buf: &mut [u8]) -> bool {
    // SAFETY: `buf` is an exclusive slice of its length.
    unsafe { copy(fd, offset, buf.as_mut_ptr(), buf.len(), Access::Read) }.is_some()
}

/// Writes `buf` at `offset` of a mapped `fd` (through a redo slot or by pwrite, see
/// [`copy`]) and notes the chunks it filled, so later reads of them go through the mapping;
/// false: not done (write it with pwrite).
pub fn write_from(fd: RawFd, offset: u64, buf: &[u8]) -> bool {
    // SAFETY: `buf` is a slice of its length, only read (the copy goes the other way).
    unsafe {
        copy(
            fd,
            offset,
            buf.as_ptr().cast_mut(),
            buf.len(),
            Access::Write,
        )
    }
    .is_some()
}

fn install() -> Option<Handler> {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|&p| p > 0)?;
    // SAFETY: zeroed sigaction structs are valid; sigaction reads `ours` and writes `previous`.
    unsafe {
        let mut ours: libc::sigaction = std::mem::zeroed();
        ours.sa_sigaction = on_sigbus as *const () as usize;
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut ours.sa_mask);
        let mut previous: libc::sigaction = std::mem::zeroed();
        // The handler reads HANDLER, which is set only after this returns: until then a
        // SIGBUS of ours cannot happen (nothing is mapped yet) and others are chained below.
        if libc::sigaction(libc::SIGBUS, &ours, &mut previous) != 0 {
            return None;
        }
        Some(Handler { page, previous })
    }
}

/// Async-signal-safe: atomics, mmap and sigaction only.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    let h = HANDLER.get().and_then(|h| h.as_ref());
    if let Some((h, (s, _))) = h.zip(slot_at(addr)) {
        break_slot(s);
        let page = addr & !(h.page - 1);
        // SAFETY: replaces one page of our own mapping with zeroes, so the faulting copy can
        // finish; the mapping is broken and no copy result from it is trusted again.
        let p = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                h.page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            return;
        }
    }
    chain(sig, info, ctx, h);
}

/// Hands a SIGBUS that is not ours to the action that was there before.
fn chain(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
    h: Option<&Handler>,
) {
    let prev = h.map(|h| h.previous);
    match prev {
        Some(p)
            if p.sa_sigaction != libc::SIG_DFL
                && p.sa_sigaction != libc::SIG_IGN
                && p.sa_flags & libc::SA_SIGINFO != 0 =>
        {
            // SAFETY: a SA_SIGINFO handler installed by someone else, called as the kernel would.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(p.sa_sigaction) };
            f(sig, info, ctx);
        }
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            // SAFETY: a plain handler installed by someone else.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
            f(sig);
        }
        _ => {
            // The default action: returning re-runs the faulting access, which then kills the
            // process as SIGBUS always did.
            // SAFETY: a zeroed sigaction with SIG_DFL is valid.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    fn shm_file(len: usize) -> Option<std::fs::File> {
        let mut f = match tempfile::tempfile_in("/dev/shm") {
            Ok(f) => f,
            Err(_) => {
                crate::cannot_run("a tmpfs at /dev/shm");
                return None;
            }
        };
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        f.write_all(&data).expect("write a file in /dev/shm");
        Some(f)
    }

    #[test]
    fn reads_and_writes_go_to_the_file() {
        let Some(f) = shm_file(64 * 1024) else { return };
        let m = map(f.as_raw_fd(), 64 * 1024, None).expect("a tmpfs file maps");
        let mut buf = vec![0u8; 4096];
        let n = unsafe { copy(f.as_raw_fd(), 8192, buf.as_mut_ptr(), 4096, Access::Read) };
        assert_eq!(n, Some(4096));
        let want: Vec<u8> = (8192..8192 + 4096).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(buf, want);
        let mut w = vec![0xA5u8; 4096];
        let n = unsafe { copy(f.as_raw_fd(), 4096, w.as_mut_ptr(), 4096, Access::Write) };
        assert_eq!(n, Some(4096));
        let mut back = vec![0u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, 4096).unwrap();
        assert_eq!(back, w, "a write through the mapping is in the file");
        // Past the mapping: left to pread/pwrite.
        let n = unsafe {
            copy(
                f.as_raw_fd(),
                62 * 1024,
                buf.as_mut_ptr(),
                4096,
                Access::Read,
            )
        };
        assert_eq!(n, None);
        drop(m);
        let n = unsafe { copy(f.as_raw_fd(), 0, buf.as_mut_ptr(), 4096, Access::Read) };
        assert_eq!(n, None, "an unmapped descriptor is not copied");
    }

    /// A drive file truncated behind our back under bytes it lent: the kernel's copy of them
    /// for a send fails with EFAULT (no SIGBUS is raised for it), `lent_send_failed` finds the
    /// buffer past its file's end and breaks that mapping, so nothing more is lent from it and
    /// a copy made of its bytes is known not to be the drive's. A buffer lent from a file that
    /// did not shrink, and any other error, are left alone.
    #[test]
    fn a_send_that_faults_on_a_shrunk_file_breaks_its_mapping() {
        let (Some(f), Some(g)) = (shm_file(64 * 1024), shm_file(64 * 1024)) else {
            return;
        };
        let m = map(f.as_raw_fd(), 64 * 1024, None).expect("a tmpfs file maps");
        let n = map(g.as_raw_fd(), 64 * 1024, None).expect("a tmpfs file maps");
        let lend = |m: &Mapping, at: u64| {
            let p = m.lend(at, 4096).expect("a filled range is lent");
            // SAFETY: the mappings outlive the buffers (dropped first, below).
            unsafe { crate::IoBuf::lent(p, 4096, Box::new(())) }
        };
        let (far, near) = (lend(&m, 32 * 1024), lend(&n, 32 * 1024));
        assert!(far.lent_intact() && near.lent_intact());
        f.set_len(16 * 1024).unwrap();
        let mut pipe = [0; 2];
        // SAFETY: pipe writes two descriptors into the array.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        // SAFETY: the range is mapped (its page gone from the file); the kernel checks it.
        let r = unsafe { libc::write(pipe[1], far.raw_ptr().cast(), 4096) };
        let e = std::io::Error::last_os_error();
        assert_eq!((r, e.raw_os_error()), (-1, Some(libc::EFAULT)));
        let epipe = std::io::Error::from_raw_os_error(libc::EPIPE);
        assert_eq!(crate::lent_send_failed(&epipe, [&far]), 0, "not a fault");
        assert_eq!(crate::lent_send_failed(&e, [&near, &far]), 1);
        assert!(!far.lent_intact(), "its mapping broke");
        assert!(near.lent_intact(), "the other file's mapping did not");
        assert!(m.lend(0, 4096).is_none(), "a broken mapping lends nothing");
        assert!(n.lend(0, 4096).is_some());
        // SAFETY: both descriptors are ours.
        unsafe {
            libc::close(pipe[0]);
            libc::close(pipe[1]);
        }
        drop((far, near));
    }

    #[test]
    fn lent_bytes_are_the_files_and_holes_are_not_lent() {
        let Some(f) = shm_file(64 * 1024) else { return };
        let m = map(f.as_raw_fd(), 64 * 1024, None).expect("a tmpfs file maps");
        let p = m.lend(8192, 4096).expect("a filled range is lent");
        // SAFETY: the mapping lives until the end of the test.
        let lent = unsafe { std::slice::from_raw_parts(p.as_ptr(), 4096) }.to_vec();
        let want: Vec<u8> = (8192..8192 + 4096).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(lent, want);
        let mut w = vec![0x5Au8; 4096];
        let n = unsafe { copy(f.as_raw_fd(), 8192, w.as_mut_ptr(), 4096, Access::Write) };
        assert_eq!(n, Some(4096));
        // SAFETY: as above.
        let now = unsafe { std::slice::from_raw_parts(p.as_ptr(), 4096) };
        assert_eq!(now, &w[..], "lent bytes are the file's, not a copy");
        assert!(m.lend(62 * 1024, 4096).is_none(), "past the mapping");
        assert!(
            m.lend(u64::MAX - 10, 4096).is_none(),
            "an offset that overflows"
        );
        drop(m);

        // A sparse file: nothing is lent until a write through the mapping fills the chunk.
        let Ok(f) = tempfile::tempfile_in("/dev/shm") else {
            return crate::cannot_run("a tmpfs at /dev/shm");
        };
        f.set_len(1 << 20).unwrap();
        let m = map(f.as_raw_fd(), 1 << 20, None).expect("a tmpfs file maps");
        assert!(m.lend(0, 4096).is_none(), "a range that holds a hole");
        let mut w = vec![0x11u8; 1 << 20];
        let n = unsafe {
            copy(
                f.as_raw_fd(),
                0,
                w.as_mut_ptr(),
                1 << 20,
                Access::WriteRepaired,
            )
        };
        assert_eq!(n, Some(1 << 20));
        let p = m.lend(4096, 4096).expect("written whole, so filled");
        // SAFETY: the mapping lives on.
        assert_eq!(unsafe { *p.as_ptr() }, 0x11);
    }

    #[test]
    fn a_place_written_in_the_mapping_is_the_files_and_fills_its_chunks() {
        use std::os::unix::fs::FileExt;
        let Ok(f) = tempfile::tempfile_in("/dev/shm") else {
            return crate::cannot_run("a tmpfs at /dev/shm");
        };
        let len = 256 * 1024;
        f.set_len(len as u64).unwrap();
        let fd = f.as_raw_fd();
        let m = map(fd, len as u64, None).expect("a tmpfs file maps");
        assert!(place(fd, 250 * 1024, 8192).is_none(), "past the mapping");
        assert!(
            place(fd, u64::MAX - 10, 4096).is_none(),
            "an offset that overflows"
        );
        assert!(m.lend(64 * 1024, 64 * 1024).is_none(), "a hole is not lent");
        let mut p = place(fd, 64 * 1024, 64 * 1024).expect("a range of the mapping");
        assert_eq!(p.len(), 64 * 1024);
        p.bytes().fill(0x5a);
        assert_eq!(p.finish().unwrap(), 64 * 1024);
        let mut got = vec![0u8; 64 * 1024];
        f.read_exact_at(&mut got, 64 * 1024).unwrap();
        assert!(got.iter().all(|&b| b == 0x5a), "the file has the bytes");
        assert!(
            m.lend(64 * 1024, 64 * 1024).is_some(),
            "the range written in place is known filled"
        );
    }

    #[test]
    fn repaired_writes_are_copied_into_the_mapping_and_fill_their_chunks() {
        let Ok(f) = tempfile::tempfile_in("/dev/shm") else {
            return crate::cannot_run("a tmpfs at /dev/shm");
        };
        let len = 256 * 1024;
        f.set_len(len as u64).unwrap();
        let fd = f.as_raw_fd();
        let _m = map(fd, len as u64, None).expect("a tmpfs file maps");
        let mut model = vec![0u8; len];
        // Aligned and odd offsets and lengths, from an unaligned source: the streaming copy's
        // head, body and tail, and nothing written outside the range.
        for (i, (off, n)) in [
            (0, 64 * 1024),
            (4096 + 3, 1000),
            (128 * 1024 + 5, 64 * 1024 + 17),
            (200 * 1024, 10),
        ]
        .into_iter()
        .enumerate()
        {
            let src: Vec<u8> = (0..=n).map(|j| (j * 13 + i * 7) as u8).collect();
            let src = &src[1..];
            let r = unsafe {
                copy(
                    fd,
                    off as u64,
                    src.as_ptr().cast_mut(),
                    n,
                    Access::WriteRepaired,
                )
            };
            assert_eq!(r, Some(n as i64), "write {i} is done");
            model[off..off + n].copy_from_slice(src);
        }
        let mut back = vec![1u8; len];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, 0).unwrap();
        assert!(back == model, "the file holds exactly what was written");
        let mut buf = vec![0u8; 4096];
        assert!(
            read_into(fd, 8192, &mut buf),
            "the chunk the first write filled reads through the mapping"
        );
        assert!(buf == model[8192..8192 + 4096]);
        // A fault in the middle (the file shrank): the write fails, rather than the caller's
        // pwrite growing the file back with holes where it lost data.
        f.set_len(4096).unwrap();
        let src = vec![9u8; 64 * 1024];
        let r = unsafe {
            copy(
                fd,
                64 * 1024,
                src.as_ptr().cast_mut(),
                src.len(),
                Access::WriteRepaired,
            )
        };
        assert_eq!(r, Some(LOST), "the fault fails the write");
        assert_eq!(
            f.metadata().unwrap().len(),
            4096,
            "the file is not grown back"
        );
    }

    fn blocks(f: &std::fs::File) -> u64 {
        std::os::unix::fs::MetadataExt::blocks(&f.metadata().unwrap())
    }

    #[test]
    fn reads_of_a_file_with_holes_allocate_nothing_until_it_fills_up() {
        let Ok(f) = tempfile::tempfile_in("/dev/shm") else {
            return crate::cannot_run("a tmpfs at /dev/shm");
        };
        f.set_len(64 * 1024).unwrap();
        let fd = f.as_raw_fd();
        let _m = map(fd, 64 * 1024, None).expect("a tmpfs file maps");
        let mut buf = vec![1u8; 4096];
        assert_eq!(
            unsafe { copy(fd, 0, buf.as_mut_ptr(), 4096, Access::Read) },
            None,
            "a sparse file reads by pread"
        );
        assert_eq!(blocks(&f), 0, "nothing was allocated by reading");
        let data = vec![7u8; 64 * 1024];
        assert!(write_from(fd, 0, &data), "a write of a mapped file is done");
        assert!(
            read_into(fd, 4096, &mut buf),
            "what a write filled reads through the mapping"
        );
        assert!(buf == data[..4096]);
        _m.punching_hole(0, 32 * 1024);
        // SAFETY: a descriptor this test owns.
        let r = unsafe {
            libc::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                32 * 1024,
            )
        };
        assert_eq!(r, 0);
        let before = blocks(&f);
        assert!(
            !read_into(fd, 0, &mut buf),
            "a punched file reads by pread again"
        );
        assert_eq!(blocks(&f), before, "and its hole stays a hole");
        // Filled behind the mapping's back (pwrite), then touched by a write through it.
        std::os::unix::fs::FileExt::write_all_at(&f, &data[..32 * 1024], 0).unwrap();
        assert!(
            !read_into(fd, 0, &mut buf),
            "a chunk found holey is not asked again before a write touches it"
        );
        assert!(write_from(fd, 0, &data[..4096]));
        assert!(
            read_into(fd, 0, &mut buf),
            "a range that filled up reads through the mapping again"
        );
    }

    #[test]
    fn a_file_truncated_under_the_mapping_is_an_error_not_a_crash() {
        let Some(f) = shm_file(64 * 1024) else { return };
        let _m = map(f.as_raw_fd(), 64 * 1024, None).expect("a tmpfs file maps");
        f.set_len(4096).unwrap();
        let mut buf = vec![0u8; 4096];
        let n = unsafe {
            copy(
                f.as_raw_fd(),
                32 * 1024,
                buf.as_mut_ptr(),
                4096,
                Access::Read,
            )
        };
        assert_eq!(
            n,
            Some(LOST),
            "the fault fails the read: the file lost data"
        );
        // Failed for good, also where the file still has its pages: the drive lost data.
        let n = unsafe { copy(f.as_raw_fd(), 0, buf.as_mut_ptr(), 4096, Access::Read) };
        assert_eq!(n, Some(LOST));
    }
}
