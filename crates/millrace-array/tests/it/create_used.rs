//! A pool created over drives that held something. Where every member zeroes its data area by
//! unmapping (a hole in a drive file, write-zeroes on a loop device with direct I/O), the pool
//! is consistent at once: it records a clean state, reads zeroes, its drive files give their
//! space back, and a scrub finds no row whose redundancy disagrees. Where a member offers no
//! such request, the pool is not marked clean, so the resync that creation runs then (in the
//! service) makes the parity right instead.

use crate::common;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use millrace_array::drive::{Drive, FileDrive};
use millrace_array::{CreateOptions, Level, Pool};
use rand::{Rng, SeedableRng};

const STRIP: u64 = 64 << 10;
const MEMBER_BYTES: u64 = 24 << 20;

fn opts(level: Level) -> CreateOptions {
    CreateOptions {
        name: "used".into(),
        level,
        strip: STRIP,
        group: None,
        data_offset: None,
        create_size: None,
        // The drives hold random bytes, which creation rightly refuses as "not blank" unless
        // the admin says to overwrite them.
        force: true,
    }
}

/// Fills each path (a file or a block device) with random bytes, as a drive that held
/// another filesystem would be.
fn fill(paths: &[PathBuf], seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut chunk = vec![0u8; 1 << 20];
    for p in paths {
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        for off in (0..MEMBER_BYTES).step_by(chunk.len()) {
            rng.fill(&mut chunk[..]);
            f.write_all_at(&chunk, off).unwrap();
        }
        f.sync_all().unwrap();
    }
}

fn used_files(dir: &Path, n: usize, seed: u64) -> Vec<PathBuf> {
    let paths: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("d{i}.img"))).collect();
    for p in &paths {
        std::fs::File::create(p).unwrap();
    }
    fill(&paths, seed);
    paths
}

/// Bytes the drive files hold on the filesystem under them.
fn allocated(paths: &[PathBuf]) -> u64 {
    paths
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().blocks() * 512)
        .sum()
}

/// The pool reads zeroes everywhere and a scrub that repairs nothing finds every row right.
fn check_zeroed_and_consistent(pool: &Pool, what: &str) {
    assert!(
        pool.superblock().clean,
        "{what}: the pool is not recorded clean"
    );
    let a = pool.array();
    let mut buf = vec![0xa5u8; 1 << 20];
    let mut off = 0;
    while off < a.size_bytes() {
        let n = (a.size_bytes() - off).min(buf.len() as u64) as usize;
        a.read_at(off, &mut buf[..n]).unwrap();
        assert!(
            buf[..n].iter().all(|&b| b == 0),
            "{what}: old bytes at {off}"
        );
        off += n as u64;
    }
    let report = pool.scrub(false, |_, _| {}).unwrap();
    assert!(report.rows_checked > 0, "{what}: the scrub checked nothing");
    assert_eq!(
        report.mismatches, 0,
        "{what}: rows whose redundancy disagrees"
    );
}

#[test]
fn drive_files_that_held_data_are_zeroed_by_holes() {
    for (i, (level, n)) in [(Level::Raid5, 4), (Level::Raid6, 6), (Level::Raid10, 4)]
        .into_iter()
        .enumerate()
    {
        let dir = tempfile::tempdir().unwrap();
        let paths = used_files(dir.path(), n, i as u64);
        let before = allocated(&paths);
        let pool = Pool::create(&opts(level), &paths).unwrap();
        check_zeroed_and_consistent(&pool, &format!("{level:?} on drive files"));
        let after = allocated(&paths);
        assert!(
            after < before / 4,
            "{level:?}: the data areas were not given back ({before} bytes allocated before, {after} after)"
        );
    }
}

#[test]
fn loop_devices_that_held_data_are_zeroed_by_write_zeroes() {
    let Some(loops) = common::loop_devices(5, MEMBER_BYTES as usize, 4096) else {
        return; // said by cannot_run (a failure under CI)
    };
    fill(&loops.devices, 7);
    let pool = Pool::create(&opts(Level::Raid6), &loops.devices).unwrap();
    check_zeroed_and_consistent(&pool, "raid6 on 4Kn loop devices");
    pool.close().unwrap();
}

/// A member that can only be written (the default `zero_by_unmap`): nothing may claim the
/// pool consistent, and the resync then makes it so, old bytes and all.
struct WriteOnly(FileDrive);

impl Drive for WriteOnly {
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.0.flush()
    }
    fn uring_fd(&self) -> Option<RawFd> {
        None
    }
    fn direct(&self) -> bool {
        self.0.direct()
    }
}

#[test]
fn a_member_that_cannot_unmap_leaves_the_pool_to_the_resync() {
    let dir = tempfile::tempdir().unwrap();
    let paths = used_files(dir.path(), 4, 11);
    let drives: Vec<Arc<dyn Drive>> = paths
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let d = FileDrive::open(p).unwrap();
            // One write-only member is enough to rule the shortcut out.
            if i == 2 {
                Arc::new(WriteOnly(d)) as Arc<dyn Drive>
            } else {
                Arc::new(d) as Arc<dyn Drive>
            }
        })
        .collect();
    let pool = Pool::create_on(&opts(Level::Raid5), &paths, drives, false).unwrap();
    assert!(
        !pool.superblock().clean,
        "a pool over a member that was not zeroed is recorded clean"
    );
    let report = pool.scrub(false, |_, _| {}).unwrap();
    assert!(
        report.mismatches > 0,
        "the old bytes should disagree with their parity before the resync"
    );
    pool.resync(|_, _| {}).unwrap();
    let report = pool.scrub(false, |_, _| {}).unwrap();
    assert_eq!(report.mismatches, 0, "rows still disagree after the resync");
}
