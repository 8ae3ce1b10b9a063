//! Redo slots beside a drive file in memory, so that a write copied into its mapping
//! (the parent module) leaves every sector old or new even when the process is killed mid-copy.
//!
//! Why: a memcpy into the mapping that a kill cuts short leaves a sector part old and part new,
//! where a drive promises whole sectors (glibc's memcpy even stores a copy's first bytes last),
//! so such writes went by pwrite, whose kernel copy stops only between pages. A tmpfs pwrite
//! costs a system call, a page-cache lookup and LRU bookkeeping around its copy; two copies cost
//! less (docs/PERFORMANCE.md). So a write first goes whole into a slot of a small file beside
//! the drive file; one store then marks the slot with where the write goes; then the copy into
//! the mapping; then the mark is cleared, before the write is reported done. A kill before the
//! mark leaves the drive untouched; after it the slot holds the whole write, and opening the
//! drive again ([`Redo::open`]) writes it again, by pwrite, before anything reads the drive.
//! Only kills matter here: files in memory do not outlive a power cut.
//!
//! The file is `.<drive file name>.millrace-redo` in the drive file's directory (the real
//! file's, where the drive is named through a symbolic link) and names the drive's device and
//! inode. A file of that name that is not ours (not our magic) is neither used nor touched, and
//! one of ours that names another file (the drive file was replaced) is not replayed. Where no
//! such file can be kept the drive's writes go by pwrite as before.
//! Written by hand: this is a property of our own mapping, not something a crate offers.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::Watch;

const MAGIC: &[u8; 8] = b"MLRREDO1";
/// Slots per drive: writes copied at once into one drive (one per core, and the blocking
/// path's threads); a write that finds none free goes by pwrite.
pub const SLOTS: usize = 8;
/// The most a slot holds; a longer write goes through it in pieces, each whole or not at all
/// (a drive promises no more than whole sectors either).
pub const SLOT_BYTES: usize = 128 << 10;
/// Magic, identity and the slots' marks; the slots' data follow it.
const HEADER: usize = 4096;
const FILE_BYTES: usize = HEADER + SLOTS * SLOT_BYTES;
/// A slot's mark: 0 clear, MARKED when it holds a write that may not have reached the drive.
const MARKED: u64 = 0x4d41_524b_4544_0001;

/// A slot's mark in the header: (mark, drive offset, length), 64 bytes apart.
fn mark_at(i: usize) -> usize {
    64 + i * 64
}

/// The redo file of one drive file, mapped.
pub struct Redo {
    path: PathBuf,
    file: File,
    base: *mut u8,
    busy: [AtomicBool; SLOTS],
    /// Faults in the mapping (the file shrank under us) break it; then writes go by pwrite.
    /// Always Some until the drop, which ends the watch before it unmaps.
    watch: Option<Watch>,
}

// SAFETY: the mapping is shared memory reached through atomics and claimed slots only.
unsafe impl Send for Redo {}
unsafe impl Sync for Redo {}

impl std::fmt::Debug for Redo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redo").field("path", &self.path).finish()
    }
}

/// The redo file's path for the drive file `drive`.
pub fn path_for(drive: &Path) -> Option<PathBuf> {
    let name = drive.file_name()?.to_str()?;
    Some(drive.with_file_name(format!(".{name}.millrace-redo")))
}

/// Where the redo file of the drive file at `path` lies: beside the file itself, on its
/// filesystem in memory, where `path` is a link to it.
fn beside(path: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    path_for(&real)
}

/// How a redo file is opened: never through a link, private to this user when made.
fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    o
}

impl Redo {
    /// Opens (or makes) the redo file of the drive file at `path`, open as `drive` and `len`
    /// bytes long, and first writes again what a killed process left marked in it. Call it for
    /// every drive file in memory, whatever else is turned off, before anything reads the
    /// drive: a mark left in place would be written again at a later open, over newer data.
    /// Ok(None) where none can be kept (a file of that name that is not ours, a directory that
    /// refuses a new file, no room, no mapping): the drive's writes then go by pwrite. An
    /// error: a redo file of ours could not be read, or a marked write could not be written
    /// again, so the drive may hold a torn sector.
    pub fn open(path: &Path, drive: &File, len: u64) -> io::Result<Option<Redo>> {
        let Some(at) = beside(path) else {
            return Ok(None);
        };
        let meta = drive.metadata()?;
        let file = match options().create_new(true).open(&at) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                match Redo::replayed(&at, path, drive, len)? {
                    Some(f) => f,
                    None => return Ok(None),
                }
            }
            // Nothing of that name, and the directory takes no new file: writes by pwrite.
            Err(_) => return Ok(None),
        };
        let made = file.metadata().map(|m| (m.dev(), m.ino()))?;
        match Redo::prepare(at.clone(), file, meta.dev(), meta.ino()) {
            Some(redo) => Ok(Some(redo)),
            None => {
                // Ours, but of no use: a filesystem without fallocate (ramfs), or no room. The
                // marks are cleared already.
                remove_if_still(&at, made);
                Ok(None)
            }
        }
    }

    /// What [`Redo::open`] does first, for a drive file in memory whose writes will not go
    /// through a mapping (`MILLRACE_INLINE_MEMORY_FILES=0`): writes again what a killed process
    /// left marked in its redo file and removes the file, but makes none.
    pub fn replay_only(path: &Path, drive: &File, len: u64) -> io::Result<()> {
        let Some(at) = beside(path) else {
            return Ok(());
        };
        match std::fs::symlink_metadata(&at) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            _ => {}
        }
        if let Some(f) = Redo::replayed(&at, path, drive, len)? {
            let m = f.metadata()?;
            remove_if_still(&at, (m.dev(), m.ino()));
        }
        Ok(())
    }

    /// The existing redo file `at` of the drive file at `path`, once what it holds marked for
    /// this drive (open as `drive`, `len` bytes) is written again. None: not ours, left alone.
    fn replayed(at: &Path, path: &Path, drive: &File, len: u64) -> io::Result<Option<File>> {
        let Some(f) = Redo::existing(at, path)? else {
            return Ok(None);
        };
        let meta = drive.metadata()?;
        let mut head = vec![0u8; HEADER];
        let n = read_up_to(&f, &mut head)?;
        if n > 0 && (n < 64 || &head[..8] != MAGIC) {
            tracing::warn!(
                "{} is not a redo file of Millrace's; left alone, and writes to {} go by pwrite",
                at.display(),
                path.display()
            );
            return Ok(None);
        }
        // Only marks made for this very file are written again: a drive file replaced since
        // (another inode) gets nothing.
        if n > 0 && get(&head, 8) == meta.dev() && get(&head, 16) == meta.ino() {
            replay(&f, &head, drive, len, at)?;
        }
        Ok(Some(f))
    }

    /// The existing file `at`, opened, if it can be ours: a plain file of this user's that
    /// no one else may read or write, with no other name. None: someone else's, left alone
    /// (said once). An error: ours, but it cannot be opened, so marks in it cannot be read.
    fn existing(at: &Path, drive: &Path) -> io::Result<Option<File>> {
        let m = std::fs::symlink_metadata(at)?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if !m.file_type().is_file() || m.uid() != me || m.nlink() != 1 || m.mode() & 0o077 != 0 {
            tracing::warn!(
                "{} is not a redo file this server made (not a private file of its user); left alone, and writes to {} go by pwrite",
                at.display(),
                drive.display()
            );
            return Ok(None);
        }
        let f = options().open(at).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "{} may hold writes a killed server left part done in {}, and cannot be opened ({e}); make it readable and writable by this user, or remove it if that drive's content does not matter",
                    at.display(),
                    drive.display()
                ),
            )
        })?;
        let same = f
            .metadata()
            .is_ok_and(|o| o.dev() == m.dev() && o.ino() == m.ino());
        Ok(same.then_some(f))
    }

    /// Writes a clear header naming the drive, gives the file its full size in memory (so a
    /// copy into it never meets a full tmpfs) and maps it.
    fn prepare(path: PathBuf, file: File, dev: u64, ino: u64) -> Option<Redo> {
        let mut head = vec![0u8; HEADER];
        head[..8].copy_from_slice(MAGIC);
        head[8..16].copy_from_slice(&dev.to_le_bytes());
        head[16..24].copy_from_slice(&ino.to_le_bytes());
        head[24..28].copy_from_slice(&(SLOTS as u32).to_le_bytes());
        head[28..32].copy_from_slice(&(SLOT_BYTES as u32).to_le_bytes());
        file.set_len(FILE_BYTES as u64).ok()?;
        file.write_all_at(&head, 0).ok()?;
        // SAFETY: fallocate on a descriptor we own; no memory is passed.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, FILE_BYTES as libc::off_t) } != 0 {
            return None;
        }
        let p = super::map_shared(file.as_raw_fd(), FILE_BYTES)?;
        let Some(watch) = super::watch(p as usize, FILE_BYTES) else {
            // SAFETY: unmaps what was mapped just above and never published.
            unsafe { libc::munmap(p, FILE_BYTES) };
            return None;
        };
        Some(Redo {
            path,
            file,
            base: p.cast(),
            busy: [const { AtomicBool::new(false) }; SLOTS],
            watch: Some(watch),
        })
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is a multiple of 8 within the header page of our mapping, which lives
        // as long as `self`; every access to the marks is atomic.
        unsafe { &*self.base.add(at).cast::<AtomicU64>() }
    }

    fn broken(&self) -> bool {
        self.watch.as_ref().is_none_or(Watch::broken)
    }

    /// A free slot of this drive's, held until the claim is dropped; None: all in use (or the
    /// redo file's mapping broke).
    pub(crate) fn claim(&self) -> Option<Claim<'_>> {
        if self.broken() {
            return None;
        }
        let i = self.busy.iter().position(|b| {
            b.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })?;
        Some(Claim { redo: self, i })
    }
}

impl Drop for Redo {
    fn drop(&mut self) {
        // The watch first: once unmapped, the range may be another mapping's.
        self.watch = None;
        // SAFETY: our own mapping; no claim outlives `self`.
        unsafe { libc::munmap(self.base.cast(), FILE_BYTES) };
        // Every mark is clear once no write runs, so nothing is left to replay.
        if let Ok(m) = self.file.metadata() {
            remove_if_still(&self.path, (m.dev(), m.ino()));
        }
    }
}

/// Removes `path` if the name still leads to the file `(device, inode)`, ours.
fn remove_if_still(path: &Path, file: (u64, u64)) {
    let there = std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()));
    if there == Some(file) {
        let _ = std::fs::remove_file(path);
    }
}

/// One slot, held by one writer.
pub(crate) struct Claim<'a> {
    redo: &'a Redo,
    i: usize,
}

impl Claim<'_> {
    /// Copies `len` (at most [`SLOT_BYTES`]) bytes from `src` into the slot and marks it as
    /// bound for `offset` of the drive. False: the redo file's mapping broke, nothing marked.
    ///
    /// # Safety
    /// `src..src+len` is valid for reads.
    pub(crate) unsafe fn mark(&self, offset: u64, src: *const u8, len: usize) -> bool {
        debug_assert!(len <= SLOT_BYTES);
        let data = self.redo.base.add(HEADER + self.i * SLOT_BYTES);
        std::ptr::copy_nonoverlapping(src, data, len);
        let m = mark_at(self.i);
        self.redo.word(m + 8).store(offset, Ordering::Relaxed);
        self.redo.word(m + 16).store(len as u64, Ordering::Relaxed);
        if self.redo.broken() {
            return false;
        }
        // After the data and where it goes, in program order: a kill stops between
        // instructions, and every store made before it reaches the file's pages.
        self.redo.word(m).store(MARKED, Ordering::Release);
        // Nor may a later store (the copy into the drive) be moved above the mark: a kill is
        // an asynchronous signal, and what it stops must be in program order.
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        true
    }

    /// The marked write reached the drive: nothing to replay.
    pub(crate) fn clear(&self) {
        self.redo.word(mark_at(self.i)).store(0, Ordering::Release);
        // The next piece's copy into the slot stays below the clear.
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.clear();
        self.redo.busy[self.i].store(false, Ordering::Release);
    }
}

fn get(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads the start of `f` into `buf`, as much as there is; how much that was.
fn read_up_to(f: &File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64)? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Writes every marked slot of `file`, whose header is `head`, to `drive` (`len` bytes long)
/// again. The slots' number and size are the header's own, so a file another build made is
/// read as that build wrote it. The marks stay: the caller writes a clear header next.
fn replay(file: &File, head: &[u8], drive: &File, len: u64, at: &Path) -> io::Result<()> {
    let slots = u32::from_le_bytes(head[24..28].try_into().expect("4 bytes")) as usize;
    let slot_bytes = u32::from_le_bytes(head[28..32].try_into().expect("4 bytes")) as u64;
    if mark_at(slots) > HEADER || slot_bytes > 64 << 20 {
        tracing::warn!(
            "{} has a header no build of Millrace writes ({slots} slots of {slot_bytes} bytes); nothing in it is written again",
            at.display()
        );
        return Ok(());
    }
    let file_len = file.metadata()?.len();
    let mut again = 0;
    for i in 0..slots {
        let m = mark_at(i);
        if get(head, m) != MARKED {
            continue;
        }
        let (offset, n) = (get(head, m + 8), get(head, m + 16));
        let data_at = HEADER as u64 + i as u64 * slot_bytes;
        // A mark that does not fit the drive, or whose slot the file does not hold, is not one
        // we made for it: skip it.
        if n > slot_bytes
            || offset.checked_add(n).is_none_or(|end| end > len)
            || data_at + n > file_len
        {
            continue;
        }
        let mut data = vec![0u8; n as usize];
        file.read_exact_at(&mut data, data_at)?;
        write_again(drive, &data, offset).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "could not write again the {n} bytes at {offset} that a killed process left in {}: {e}",
                    at.display()
                ),
            )
        })?;
        again += 1;
    }
    if again > 0 {
        tracing::info!(
            "wrote again {again} write(s) a killed process had under way, from {}",
            at.display()
        );
    }
    Ok(())
}

/// Writes `data` at `offset` a page at a time. A page the filesystem has no room for is
/// skipped: it holds no page yet, so the killed copy never reached it and it is whole (old).
fn write_again(drive: &File, data: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < data.len() {
        let at = offset + done as u64;
        let n = (4096 - (at % 4096) as usize).min(data.len() - done);
        match drive.write_all_at(&data[done..done + n], at) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {}
            r => r?,
        }
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A drive file of `len` patterned bytes in /dev/shm, in a directory of its own.
    fn drive(len: usize) -> Option<(tempfile::TempDir, PathBuf, File)> {
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
            crate::cannot_run("a tmpfs at /dev/shm");
            return None;
        };
        let path = dir.path().join("d0.img");
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, data).expect("write a drive file in /dev/shm");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        Some((dir, path, f))
    }

    fn at(f: &File, offset: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        f.read_exact_at(&mut b, offset).unwrap();
        b
    }

    /// Leaves `piece` marked for `offset` in a slot and the file behind, as a process killed
    /// between the mark and the copy into the drive does.
    fn killed_after_mark(path: &Path, f: &File, offset: u64, piece: &[u8]) {
        let redo = Redo::open(path, f, f.metadata().unwrap().len())
            .unwrap()
            .expect("a redo file beside a drive in /dev/shm");
        let claim = redo.claim().unwrap();
        assert!(unsafe { claim.mark(offset, piece.as_ptr(), piece.len()) });
        std::mem::forget(claim);
        std::mem::forget(redo);
    }

    #[test]
    fn a_write_marked_by_a_killed_process_is_written_again_at_the_next_open() {
        let Some((_dir, path, f)) = drive(1 << 20) else {
            return;
        };
        let piece = vec![0xC3u8; 12288];
        killed_after_mark(&path, &f, 40960, &piece);
        assert_ne!(
            at(&f, 40960, 12288),
            piece,
            "the drive itself was not written"
        );
        let redo = Redo::open(&path, &f, 1 << 20).unwrap().unwrap();
        assert_eq!(
            at(&f, 40960, 12288),
            piece,
            "the marked write was written again"
        );
        let before: Vec<u8> = (36864..40960).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(at(&f, 36864, 4096), before, "nothing else changed");
        // Replayed once: a later write to the same place is not undone at the next open.
        f.write_all_at(&[0x11u8; 4096], 40960).unwrap();
        drop(redo);
        assert!(
            !path_for(&path).unwrap().exists(),
            "a clean close leaves no file"
        );
        drop(Redo::open(&path, &f, 1 << 20).unwrap());
        assert_eq!(at(&f, 40960, 4096), vec![0x11u8; 4096]);
    }

    #[test]
    fn the_open_that_writes_a_mark_again_clears_it() {
        let Some((_dir, path, f)) = drive(1 << 20) else {
            return;
        };
        killed_after_mark(&path, &f, 40960, &[0xC3u8; 4096]);
        // Opened again, the mark written again, and killed once more before any write.
        std::mem::forget(Redo::open(&path, &f, 1 << 20).unwrap().unwrap());
        assert_eq!(at(&f, 40960, 4096), vec![0xC3u8; 4096]);
        // A newer write there, then a third open: the old slot must not come back over it.
        f.write_all_at(&[0x11u8; 4096], 40960).unwrap();
        drop(Redo::open(&path, &f, 1 << 20).unwrap());
        assert_eq!(at(&f, 40960, 4096), vec![0x11u8; 4096]);
    }

    /// A drive whose writes will not go through a mapping makes no redo file, but still writes
    /// again what a killed process left marked in one, and removes it.
    #[test]
    fn replay_only_writes_a_mark_again_and_leaves_no_file() {
        let Some((_dir, path, f)) = drive(1 << 20) else {
            return;
        };
        let file = path_for(&path).unwrap();
        Redo::replay_only(&path, &f, 1 << 20).unwrap();
        assert!(!file.exists(), "no redo file made where none was");
        killed_after_mark(&path, &f, 8192, &[0x5Au8; 4096]);
        assert!(file.exists());
        Redo::replay_only(&path, &f, 1 << 20).unwrap();
        assert_eq!(
            at(&f, 8192, 4096),
            vec![0x5Au8; 4096],
            "the mark written again"
        );
        assert!(!file.exists(), "the redo file removed once replayed");
        // Someone else's file of that name is left alone.
        std::fs::write(&file, b"not ours").unwrap();
        chmod(&file, 0o600);
        Redo::replay_only(&path, &f, 1 << 20).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"not ours");
    }

    /// A redo file with one marked slot, as `slots` slots of `slot_bytes` each, made by hand.
    fn hand_made(drive: &File, slots: u32, slot_bytes: u32, slot: usize, offset: u64) -> Vec<u8> {
        let m = drive.metadata().unwrap();
        let mut b = vec![0u8; HEADER + slots as usize * slot_bytes as usize];
        b[..8].copy_from_slice(MAGIC);
        b[8..16].copy_from_slice(&m.dev().to_le_bytes());
        b[16..24].copy_from_slice(&m.ino().to_le_bytes());
        b[24..28].copy_from_slice(&slots.to_le_bytes());
        b[28..32].copy_from_slice(&slot_bytes.to_le_bytes());
        let at = mark_at(slot);
        b[at..at + 8].copy_from_slice(&MARKED.to_le_bytes());
        b[at + 8..at + 16].copy_from_slice(&offset.to_le_bytes());
        b[at + 16..at + 24].copy_from_slice(&4096u64.to_le_bytes());
        let data = HEADER + slot * slot_bytes as usize;
        b[data..data + 4096].fill(0x77);
        b
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_redo_file_of_another_shape_is_read_as_its_header_says() {
        let Some((_dir, path, f)) = drive(1 << 20) else {
            return;
        };
        let name = path_for(&path).unwrap();
        std::fs::write(&name, hand_made(&f, 3, 16384, 2, 8192)).unwrap();
        chmod(&name, 0o600);
        let redo = Redo::open(&path, &f, 1 << 20).unwrap();
        assert!(redo.is_some());
        assert_eq!(at(&f, 8192, 4096), vec![0x77u8; 4096]);
    }

    #[test]
    fn a_redo_file_others_may_write_is_not_trusted() {
        let Some((_dir, path, f)) = drive(1 << 20) else {
            return;
        };
        let name = path_for(&path).unwrap();
        let planted = hand_made(&f, SLOTS as u32, SLOT_BYTES as u32, 0, 0);
        std::fs::write(&name, &planted).unwrap();
        chmod(&name, 0o666);
        assert!(Redo::open(&path, &f, 1 << 20).unwrap().is_none());
        assert_ne!(
            at(&f, 0, 4096),
            vec![0x77u8; 4096],
            "nothing written from it"
        );
        assert_eq!(
            std::fs::read(&name).unwrap(),
            planted,
            "and it is left as it was"
        );
    }

    #[test]
    fn a_cleared_slot_is_not_written_again() {
        let Some((_dir, path, f)) = drive(1 << 20) else {
            return;
        };
        let redo = Redo::open(&path, &f, 1 << 20).unwrap().unwrap();
        let piece = vec![0x5Au8; 4096];
        let claim = redo.claim().unwrap();
        assert!(unsafe { claim.mark(8192, piece.as_ptr(), 4096) });
        claim.clear();
        std::mem::forget(claim);
        std::mem::forget(redo);
        drop(Redo::open(&path, &f, 1 << 20).unwrap());
        assert_ne!(at(&f, 8192, 4096), piece);
    }

    #[test]
    fn a_redo_file_of_a_replaced_drive_is_not_replayed() {
        let Some((_dir, path, f)) = drive(1 << 20) else {
            return;
        };
        killed_after_mark(&path, &f, 0, &[0xEEu8; 4096]);
        // The drive file is replaced by another of the same name.
        drop(f);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let redo = Redo::open(&path, &f, 1 << 20).unwrap();
        assert!(redo.is_some(), "our file, made new for the new drive");
        assert_eq!(at(&f, 0, 4096), vec![0u8; 4096]);
    }

    #[test]
    fn a_file_of_that_name_that_is_not_ours_is_left_alone() {
        let Some((_dir, path, f)) = drive(1 << 20) else {
            return;
        };
        let other = path_for(&path).unwrap();
        for mode in [0o644, 0o600] {
            std::fs::write(&other, b"someone else's notes").unwrap();
            chmod(&other, mode);
            assert!(Redo::open(&path, &f, 1 << 20).unwrap().is_none());
            assert_eq!(std::fs::read(&other).unwrap(), b"someone else's notes");
        }
    }

    #[test]
    fn a_close_removes_only_the_file_it_opened() {
        let Some((dir, path, f)) = drive(1 << 20) else {
            return;
        };
        let redo = Redo::open(&path, &f, 1 << 20).unwrap().unwrap();
        let name = path_for(&path).unwrap();
        std::fs::rename(&name, dir.path().join("moved")).unwrap();
        std::fs::write(&name, b"put here since").unwrap();
        drop(redo);
        assert_eq!(std::fs::read(&name).unwrap(), b"put here since");
    }

    #[test]
    fn a_drive_named_through_a_link_keeps_its_redo_beside_the_file_itself() {
        let Some((dir, path, f)) = drive(1 << 20) else {
            return;
        };
        let elsewhere = tempfile::tempdir().unwrap();
        let link = elsewhere.path().join("disk0");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let redo = Redo::open(&link, &f, 1 << 20).unwrap().unwrap();
        assert!(path_for(&path).unwrap().exists());
        assert!(!path_for(&link).unwrap().exists());
        drop(redo);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "only the drive"
        );
    }

    #[test]
    fn claims_run_out_and_come_back() {
        let Some((_dir, path, f)) = drive(1 << 20) else {
            return;
        };
        let redo = Redo::open(&path, &f, 1 << 20).unwrap().unwrap();
        let all: Vec<_> = (0..SLOTS).map(|_| redo.claim().unwrap()).collect();
        assert!(redo.claim().is_none(), "a write then goes by pwrite");
        drop(all);
        assert!(redo.claim().is_some());
    }
}
