//! A process killed while it copies writes into a mapped drive file in memory leaves every
//! sector whole, old or new, once the drive is opened again (`millrace_io::mapped::redo`).
//!
//! The writers are this test binary run again as a child (`writer`, ignored when run by
//! itself): two threads, each copying 1 MiB writes into its half of the mapping and nothing
//! else, so a kill nearly always lands in the middle of a copy. Every 8-byte word of a write's
//! sector holds the write's generation and the sector's own number, so a sector that is torn,
//! written again at the wrong place, or put back to an older write than it already held
//! shows.

use millrace_io::cannot_run;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

const DRIVE: usize = 8 << 20;
const WRITE: usize = 1 << 20;
const SECTOR: usize = 4096;

fn open(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

fn word(generation: u64, sector: usize) -> u64 {
    generation << 32 | sector as u64
}

/// Run by `a_kill_in_the_middle_of_a_copy_tears_no_sector` in a child process.
#[test]
#[ignore = "the writer child of a_kill_in_the_middle_of_a_copy_tears_no_sector"]
fn writer() {
    let (Ok(path), Ok(first)) = (
        std::env::var("MILLRACE_KILLED_COPIES_DRIVE"),
        std::env::var("MILLRACE_KILLED_COPIES_FIRST"),
    ) else {
        return;
    };
    let first: u64 = first.parse().unwrap();
    let path = Path::new(&path);
    let f = open(path);
    let redo = millrace_io::mapped::redo::Redo::open(path, &f, DRIVE as u64).unwrap();
    assert!(redo.is_some(), "a redo file beside a drive in /dev/shm");
    let _m = millrace_io::mapped::map(f.as_raw_fd(), DRIVE as u64, redo).unwrap();
    let fd = f.as_raw_fd();
    std::thread::scope(|s| {
        for half in 0..2 {
            s.spawn(move || {
                let mut buf = vec![0u8; WRITE];
                for generation in first.. {
                    let n = (generation as usize) % (DRIVE / 2 / WRITE);
                    let offset = half * DRIVE / 2 + n * WRITE;
                    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
                        let sector = (offset + i * 8) / SECTOR;
                        w.copy_from_slice(&word(generation, sector).to_le_bytes());
                    }
                    assert!(millrace_io::mapped::write_from(fd, offset as u64, &buf));
                }
            });
        }
    });
}

#[test]
fn a_kill_in_the_middle_of_a_copy_tears_no_sector() {
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        return cannot_run("a tmpfs at /dev/shm");
    };
    let path = dir.path().join("d0.img");
    let mut seen: Vec<u64> = (0..DRIVE / SECTOR).map(|s| word(0, s)).collect();
    let mut drive = vec![0u8; DRIVE];
    for (s, sector) in drive.chunks_exact_mut(SECTOR).enumerate() {
        for w in sector.chunks_exact_mut(8) {
            w.copy_from_slice(&seen[s].to_le_bytes());
        }
    }
    std::fs::write(&path, drive).unwrap();
    let me = std::env::current_exe().unwrap();
    for round in 0..12u64 {
        let mut child = std::process::Command::new(&me)
            .args(["--exact", "writer", "--ignored", "--nocapture"])
            .env("MILLRACE_KILLED_COPIES_DRIVE", &path)
            // Each round's generations above all before, so an older write coming back shows.
            .env(
                "MILLRACE_KILLED_COPIES_FIRST",
                ((round + 1) << 20).to_string(),
            )
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(60 + round * 17));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(status.code().is_none(), "the writers ran until killed");
        let f = open(&path);
        // Opening the drive again writes again what the kill left part done.
        drop(millrace_io::mapped::redo::Redo::open(&path, &f, DRIVE as u64).unwrap());
        let mut sector = vec![0u8; SECTOR];
        for (s, before) in seen.iter_mut().enumerate() {
            f.read_exact_at(&mut sector, (s * SECTOR) as u64).unwrap();
            let first = u64::from_le_bytes(sector[..8].try_into().unwrap());
            let whole = sector
                .chunks_exact(8)
                .all(|w| u64::from_le_bytes(w.try_into().unwrap()) == first);
            assert!(
                whole,
                "round {round}: sector {s} is torn: it begins with write {} and ends with write {}",
                first >> 32,
                u64::from_le_bytes(sector[SECTOR - 8..].try_into().unwrap()) >> 32
            );
            assert_eq!(
                first & 0xffff_ffff,
                s as u64,
                "round {round}: sector {s} holds another sector's data"
            );
            assert!(
                first >= *before,
                "round {round}: sector {s} went back from write {} to write {}",
                *before >> 32,
                first >> 32
            );
            *before = first;
        }
    }
}
