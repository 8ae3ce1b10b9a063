//! A process killed while it copies writes into a mapped drive file in memory leaves every
//! sector whole, old or new, once the drive is opened again (`millrace_io::mapped::redo`).
//!
//! The writer is this test binary run again as a child (`writer`, ignored when run by
//! itself), which does nothing but copy 1 MiB writes into the mapping, so a kill nearly always
//! lands in the middle of a copy. Each write fills every byte with its generation, so a sector
//! that holds two values is torn.

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

/// Run by `a_kill_in_the_middle_of_a_copy_tears_no_sector` in a child process.
#[test]
#[ignore = "the writer child of a_kill_in_the_middle_of_a_copy_tears_no_sector"]
fn writer() {
    let Ok(path) = std::env::var("MILLRACE_KILLED_COPIES_DRIVE") else {
        return;
    };
    let path = Path::new(&path);
    let f = open(path);
    let redo = millrace_io::mapped::redo::Redo::open(path, &f, DRIVE as u64).unwrap();
    assert!(redo.is_some(), "a redo file beside a drive in /dev/shm");
    let _m = millrace_io::mapped::map(f.as_raw_fd(), DRIVE as u64, redo).unwrap();
    let mut buf = vec![0u8; WRITE];
    for generation in 1u64.. {
        buf.fill(generation as u8);
        let offset = (generation as usize * WRITE) % DRIVE;
        assert!(millrace_io::mapped::write_from(
            f.as_raw_fd(),
            offset as u64,
            &buf
        ));
    }
}

#[test]
fn a_kill_in_the_middle_of_a_copy_tears_no_sector() {
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        eprintln!("skipped: no /dev/shm here");
        return;
    };
    let path = dir.path().join("d0.img");
    std::fs::write(&path, vec![0u8; DRIVE]).unwrap();
    let me = std::env::current_exe().unwrap();
    for round in 0..12u64 {
        let mut child = std::process::Command::new(&me)
            .args(["--exact", "writer", "--ignored", "--nocapture"])
            .env("MILLRACE_KILLED_COPIES_DRIVE", &path)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(60 + round * 17));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(status.code().is_none(), "the writer ran until killed");
        let f = open(&path);
        // Opening the drive again writes again what the kill left part done.
        drop(millrace_io::mapped::redo::Redo::open(&path, &f, DRIVE as u64).unwrap());
        let mut sector = vec![0u8; SECTOR];
        for s in 0..DRIVE / SECTOR {
            f.read_exact_at(&mut sector, (s * SECTOR) as u64).unwrap();
            assert!(
                sector.iter().all(|&b| b == sector[0]),
                "round {round}: sector {s} is torn: {} bytes of {} then {}",
                sector.iter().take_while(|&&b| b == sector[0]).count(),
                sector[0],
                sector[SECTOR - 1]
            );
        }
    }
}
