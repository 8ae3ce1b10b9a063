//! A drive file for crash schedules that go through io_uring: the engine reads and writes it
//! through its descriptor on the ring (merged stripe writes, the blocking engine's batches), as a
//! real member, while every flush reaches `flush` (`Drive::uring_flush` is false), which records
//! what the file holds as durable. A kill turns the descriptor the ring uses into /dev/null, so
//! every write submitted after it is lost, and makes the drive's own writes and flushes do
//! nothing. The crash image is then the last durable state with each 4 KiB sector changed since
//! independently kept or lost (`power_cut`).
//!
//! Why not intercept the ring's writes: they go from the kernel to the file with no hook on
//! the way; what was written since a flush is found instead by comparing the file with what that
//! flush recorded (a sector written twice since comes back as its first or its last content,
//! never an intermediate one: a subset of what a real drive may do).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Weak};

use millrace_array::drive::Drive;
use parking_lot::{Mutex, RwLock};

const SECTOR: usize = 4096;

/// The power and the process of one schedule, shared by its drives.
pub struct Power {
    /// A kill has begun (it runs once).
    killing: AtomicBool,
    killed: AtomicBool,
    /// Member flushes (and FUA writes) left before the kill (it happens in the flush that finds
    /// none left, which then does nothing).
    flushes_left: AtomicI64,
    drives: Mutex<Vec<Weak<CrashFile>>>,
    null: File,
    /// Called at the kill (a test notes where it landed).
    on_kill: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Power {
    pub fn new() -> Arc<Power> {
        Arc::new(Power {
            killing: AtomicBool::new(false),
            killed: AtomicBool::new(false),
            flushes_left: AtomicI64::new(i64::MAX),
            drives: Mutex::new(Vec::new()),
            null: OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
                .unwrap(),
            on_kill: Mutex::new(None),
        })
    }

    pub fn killed(&self) -> bool {
        self.killed.load(Ordering::Acquire)
    }

    /// The process dies at the `n`th member flush from now.
    pub fn kill_at_flush(&self, n: i64) {
        self.flushes_left.store(n, Ordering::Release);
    }

    /// A flush or a FUA write: the process dies here if this is the kill point.
    fn kill_point(&self) {
        if self.flushes_left.fetch_sub(1, Ordering::AcqRel) <= 1 {
            self.kill();
        }
    }

    /// Calls `f` at the kill.
    pub fn on_kill(&self, f: impl FnOnce() + Send + 'static) {
        *self.on_kill.lock() = Some(Box::new(f));
    }

    /// The process dies now: nothing written from here on reaches a drive.
    ///
    /// The descriptors turn to /dev/null before `killed` is set, with every drive's own writes
    /// and flushes held off meanwhile, so the kill is one instant for both paths. Set first (as
    /// it was), a request could see `killed`, skip its log record as a dead process would, and
    /// still send its data to the file on the ring before the descriptor turned: a stripe
    /// written in place without its record, which the crash tests then found torn (about one
    /// rebuild schedule in 2,000; an artefact of the test, not a path a real crash has).
    pub fn kill(&self) {
        if self.killing.swap(true, Ordering::AcqRel) {
            return;
        }
        let drives: Vec<Arc<CrashFile>> = self
            .drives
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let gates: Vec<_> = drives.iter().map(|d| d.gate.write()).collect();
        for d in &drives {
            // SAFETY: dup2 onto a descriptor this drive owns; the ring resolves descriptors at
            // submission, so what is submitted after this goes to /dev/null.
            let r = unsafe { libc::dup2(self.null.as_raw_fd(), d.io.as_raw_fd()) };
            assert!(r >= 0, "dup2: {}", io::Error::last_os_error());
        }
        self.killed.store(true, Ordering::Release);
        drop(gates);
        if let Some(f) = self.on_kill.lock().take() {
            f();
        }
    }
}

pub struct CrashFile {
    path: PathBuf,
    /// The descriptor the engine's ring uses (/dev/null after the kill).
    io: File,
    /// The same file, for this drive's own reads and writes and the snapshots.
    side: File,
    size: u64,
    durable: Mutex<Vec<u8>>,
    /// Held shared by this drive's own writes, exclusive while a flush records the file, so the
    /// record never holds half a write that went through `write_at`.
    gate: RwLock<()>,
    power: Arc<Power>,
}

impl CrashFile {
    /// Creates (or truncates) a drive file of `size` bytes, all durable zeroes.
    pub fn create(path: &Path, size: u64, power: &Arc<Power>) -> Arc<CrashFile> {
        File::create(path).unwrap().set_len(size).unwrap();
        Self::open(path, power)
    }

    /// Opens an existing drive file; what it holds now counts as durable.
    pub fn open(path: &Path, power: &Arc<Power>) -> Arc<CrashFile> {
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .unwrap()
        };
        let (io, side) = (open(), open());
        let size = side.metadata().unwrap().len();
        let mut durable = vec![0u8; size as usize];
        side.read_exact_at(&mut durable, 0).unwrap();
        let d = Arc::new(CrashFile {
            path: path.to_path_buf(),
            io,
            side,
            size,
            durable: Mutex::new(durable),
            gate: RwLock::new(()),
            power: power.clone(),
        });
        power.drives.lock().push(Arc::downgrade(&d));
        d
    }

    /// Power is cut (after the kill): each 4 KiB sector that differs from the last durable
    /// state keeps its new content or goes back, as `keep` decides. Returns the sectors that
    /// differed.
    pub fn power_cut(&self, mut keep: impl FnMut() -> bool) -> usize {
        assert!(self.power.killed(), "power is cut only after the kill");
        let mut now = vec![0u8; self.size as usize];
        self.side.read_exact_at(&mut now, 0).unwrap();
        let durable = self.durable.lock();
        let mut changed = 0;
        for (i, (n, d)) in now.chunks(SECTOR).zip(durable.chunks(SECTOR)).enumerate() {
            if n != d {
                changed += 1;
                if !keep() {
                    self.side.write_all_at(d, (i * SECTOR) as u64).unwrap();
                }
            }
        }
        changed
    }

    /// What a flush records as durable: the file, each sector changed since the last record
    /// read again after a pause until two reads agree. A ring write in flight may be copying
    /// into a sector's page while it is read (the kernel's page-cache reads do not wait for a
    /// writer's copy: 200,000 reads of 16 pages being rewritten found 9,183 torn on ext4), so
    /// one read can catch a state no drive keeps (a drive writes a sector whole), which the
    /// power cut would then bring back: `crash_ring` failed so about once in 18,000 RAID6
    /// rebuild schedules with its drive files on ext4 and the machine loaded.
    fn record(&self, durable: &mut [u8]) -> io::Result<()> {
        let mut now = vec![0u8; durable.len()];
        self.side.read_exact_at(&mut now, 0)?;
        let mut moving: Vec<usize> = (now.chunks(SECTOR).zip(durable.chunks(SECTOR)))
            .enumerate()
            .filter(|(_, (n, d))| n != d)
            .map(|(i, _)| i)
            .collect();
        let mut again = vec![0u8; SECTOR];
        for _ in 0..10_000 {
            if moving.is_empty() {
                durable.copy_from_slice(&now);
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
            let mut still = Vec::new();
            for i in moving {
                let was = &mut now[i * SECTOR..(i + 1) * SECTOR];
                self.side.read_exact_at(&mut again, (i * SECTOR) as u64)?;
                if again[..] != was[..] {
                    was.copy_from_slice(&again);
                    still.push(i);
                }
            }
            moving = still;
        }
        Err(io::Error::other(
            "test drive: a sector kept changing through 10,000 reads at a flush",
        ))
    }
}

impl Drive for CrashFile {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.side.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let _g = self.gate.read();
        if self.power.killed() {
            return Ok(());
        }
        self.side.write_all_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.power.kill_point();
        let _g = self.gate.write();
        if self.power.killed() {
            return Ok(());
        }
        let mut d = self.durable.lock();
        self.record(&mut d)
    }
    /// Durable when it returns, and only this write: the drive's other writes since its last
    /// flush stay as undurable as they were. A kill point, like a flush.
    fn write_fua_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.power.kill_point();
        let _g = self.gate.read();
        if self.power.killed() {
            return Ok(());
        }
        self.side.write_all_at(buf, offset)?;
        let at = offset as usize;
        self.durable.lock()[at..at + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn uring_fd(&self) -> Option<RawFd> {
        Some(self.io.as_raw_fd())
    }
    fn uring_flush(&self) -> bool {
        false
    }
}
