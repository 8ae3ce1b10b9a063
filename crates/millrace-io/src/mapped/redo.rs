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
    watch: Watch,
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

impl Redo {
    /// Opens (or makes) the redo file of the drive file at `path`, open as `drive` and `len`
    /// bytes long, and first writes again what a killed process left marked in it. Ok(None)
    /// where none can be kept (a file of that name that is not ours, a directory that refuses
    /// a new file, no room, no mapping): the drive's writes then go by pwrite. An error: a
    /// marked write could not be written again, so the drive may hold a torn sector.
    pub fn open(path: &Path, drive: &File, len: u64) -> io::Result<Option<Redo>> {
        // Beside the file itself, on its filesystem in memory, where `path` is a link to it.
        let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let Some(at) = path_for(&real) else {
            return Ok(None);
        };
        let meta = drive.metadata()?;
        let Ok(file) = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&at)
        else {
            return Ok(None);
        };
        let mine = file.metadata()?;
        if !mine.file_type().is_file() {
            return Ok(None);
        }
        let mut head = [0u8; 64];
        let fresh = mine.len() == 0;
        if !fresh && (file.read_exact_at(&mut head, 0).is_err() || &head[..8] != MAGIC) {
            tracing::warn!(
                "{} is not a redo file of Millrace's; left alone, and writes to {} go by pwrite",
                at.display(),
                path.display()
            );
            return Ok(None);
        }
        let same_drive = get(&head, 8) == meta.dev() && get(&head, 16) == meta.ino();
        if !fresh && mine.len() as usize == FILE_BYTES && same_drive {
            replay(&file, drive, len, &at)?;
        }
        let made = (mine.dev(), mine.ino());
        match Redo::prepare(at.clone(), file, meta.dev(), meta.ino()) {
            Some(redo) => Ok(Some(redo)),
            None => {
                // Ours (made here, or of our magic) but of no use: a filesystem without
                // fallocate (ramfs), or no room.
                remove_if_still(&at, made);
                Ok(None)
            }
        }
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
            watch,
        })
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is a multiple of 8 within the header page of our mapping, which lives
        // as long as `self`; every access to the marks is atomic.
        unsafe { &*self.base.add(at).cast::<AtomicU64>() }
    }

    /// A free slot of this drive's, held until the claim is dropped; None: all in use.
    pub(crate) fn claim(&self) -> Option<Claim<'_>> {
        if self.watch.broken() {
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
        if self.redo.watch.broken() {
            return false;
        }
        // After the data and where it goes, in program order: a kill stops between
        // instructions, and every store made before it reaches the file's pages.
        self.redo.word(m).store(MARKED, Ordering::Release);
        true
    }

    /// The marked write reached the drive: nothing to replay.
    pub(crate) fn clear(&self) {
        self.redo.word(mark_at(self.i)).store(0, Ordering::Release);
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

/// Writes every marked slot of `file` to `drive` (`len` bytes long) again and clears it.
fn replay(file: &File, drive: &File, len: u64, at: &Path) -> io::Result<()> {
    let mut head = vec![0u8; HEADER];
    file.read_exact_at(&mut head, 0)?;
    let mut again = 0;
    for i in 0..SLOTS {
        let m = mark_at(i);
        if get(&head, m) != MARKED {
            continue;
        }
        let (offset, n) = (get(&head, m + 8), get(&head, m + 16));
        // A mark that does not fit the drive is not one we made for it: skip it.
        if n > SLOT_BYTES as u64 || offset.checked_add(n).is_none_or(|end| end > len) {
            continue;
        }
        let mut data = vec![0u8; n as usize];
        file.read_exact_at(&mut data, (HEADER + i * SLOT_BYTES) as u64)?;
        drive.write_all_at(&data, offset).map_err(|e| {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A drive file of `len` patterned bytes in /dev/shm, in a directory of its own.
    fn drive(len: usize) -> Option<(tempfile::TempDir, PathBuf, File)> {
        let dir = tempfile::tempdir_in("/dev/shm").ok()?;
        let path = dir.path().join("d0.img");
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, data).ok()?;
        let f = OpenOptions::new().read(true).write(true).open(&path).ok()?;
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
        std::fs::write(&other, b"someone else's notes").unwrap();
        assert!(Redo::open(&path, &f, 1 << 20).unwrap().is_none());
        assert_eq!(std::fs::read(&other).unwrap(), b"someone else's notes");
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
