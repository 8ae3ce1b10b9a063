//! A reference for checking the engine that shares no code with it: its own GF(2^8) arithmetic
//! (bit by bit), its own reading of md's left-symmetric layout, and direct reads of the drives.
#![allow(dead_code)]

use std::sync::Arc;

use millrace_array::drive::{Drive, MemDrive};
use millrace_array::superblock::MemberState;
use millrace_array::{Array, Geometry, Level};
pub use millrace_io::cannot_run;

/// Multiplication in GF(2^8) with polynomial 0x11d, one bit at a time.
pub fn gf_mul(mut a: u8, mut b: u8) -> u8 {
    let mut r = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            r ^= a;
        }
        let carry = a & 0x80 != 0;
        a <<= 1;
        if carry {
            a ^= 0x1d;
        }
        b >>= 1;
    }
    r
}

pub fn gf_pow2(i: usize) -> u8 {
    (0..i).fold(1u8, |acc, _| gf_mul(acc, 2))
}

pub struct Rig {
    pub mems: Vec<Arc<MemDrive>>,
    /// Drive files, where the rig runs on files (`file_rig`) instead of RAM drives.
    pub files: Vec<std::path::PathBuf>,
    pub _dir: Option<tempfile::TempDir>,
    pub array: Arc<Array>,
    /// Loop devices the rig's members are (`loop_rig`), detached when the rig is dropped,
    /// after the array (fields drop in order) has closed them.
    pub _loops: Option<Loops>,
    pub level: Level,
    pub n: usize,
    pub group: usize,
    pub strip: usize,
    pub rows: usize,
    pub data_offset: usize,
}

pub fn rig(level: Level, n: usize, group: Option<usize>, strip: usize, rows: usize) -> Rig {
    let data_offset = 8192;
    let size = data_offset + strip * rows;
    let mems: Vec<Arc<MemDrive>> = (0..n)
        .map(|i| Arc::new(MemDrive::new(format!("mem{i}"), size as u64)))
        .collect();
    let geo = Geometry::new(level, n, group, strip as u64, (strip * rows) as u64).unwrap();
    let drives: Vec<Arc<dyn Drive>> = mems.iter().map(|m| m.clone() as Arc<dyn Drive>).collect();
    let array = Array::new(
        geo,
        data_offset as u64,
        drives,
        &vec![MemberState::Online; n],
    );
    Rig {
        mems,
        files: Vec::new(),
        _dir: None,
        array: Arc::new(array),
        _loops: None,
        level,
        n,
        group: geo.group,
        strip,
        rows,
        data_offset,
    }
}

/// A rig on drive files in a temporary directory (io_uring can reach them).
pub fn file_rig(level: Level, n: usize, group: Option<usize>, strip: usize, rows: usize) -> Rig {
    file_rig_in(
        tempfile::tempdir().unwrap(),
        false,
        level,
        n,
        group,
        strip,
        rows,
    )
}

/// A rig on drive files in memory (/dev/shm, tmpfs: no O_DIRECT there, so buffered I/O
/// through the same rings), with a write-intent bitmap; None where this machine has no
/// /dev/shm (see `cannot_run`).
pub fn memory_rig(
    level: Level,
    n: usize,
    group: Option<usize>,
    strip: usize,
    rows: usize,
) -> Option<Rig> {
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        cannot_run("a tmpfs at /dev/shm");
        return None;
    };
    Some(file_rig_in(dir, true, level, n, group, strip, rows))
}

/// Loop devices attached (`losetup --direct-io=on`) to files of a temporary folder on disk;
/// detached when dropped.
pub struct Loops {
    pub devices: Vec<std::path::PathBuf>,
    pub _dir: tempfile::TempDir,
}

impl Drop for Loops {
    fn drop(&mut self) {
        for d in &self.devices {
            let _ = std::process::Command::new("losetup")
                .arg("-d")
                .arg(d)
                .status();
        }
    }
}

/// `n` loop devices of `size` bytes with `sector`-byte logical blocks, using direct I/O on their
/// backing files, as block devices are used; None (said by `cannot_run`) where this machine
/// cannot make them (not root, no /dev/loop-control, no losetup).
pub fn loop_devices(n: usize, size: usize, sector: usize) -> Option<Loops> {
    let dir = tempfile::tempdir().unwrap();
    let mut loops = Loops {
        devices: Vec::new(),
        _dir: dir,
    };
    for i in 0..n {
        let f = loops._dir.path().join(format!("b{i}"));
        std::fs::File::create(&f)
            .unwrap()
            .set_len(size as u64)
            .unwrap();
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on", "--sector-size"])
            .arg(sector.to_string())
            .arg(&f)
            .output();
        match out {
            Ok(o) if o.status.success() => {
                let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
                loops.devices.push(dev.into());
            }
            _ => {
                cannot_run("loop devices (root, /dev/loop-control and losetup)");
                return None;
            }
        }
    }
    Some(loops)
}

/// A rig whose members are loop devices with `sector`-byte logical blocks (512, or 4096: a
/// 4Kn drive), opened O_DIRECT as NVMe drives are; None where loop devices cannot be made.
pub fn loop_rig(
    level: Level,
    n: usize,
    group: Option<usize>,
    strip: usize,
    rows: usize,
    sector: usize,
) -> Option<Rig> {
    let data_offset = 8192;
    let size = data_offset + strip * rows;
    let loops = loop_devices(n, size, sector)?;
    let drives: Vec<Arc<dyn Drive>> = loops
        .devices
        .iter()
        .map(|p| Arc::new(millrace_array::drive::FileDrive::open(p).unwrap()) as Arc<dyn Drive>)
        .collect();
    assert!(
        drives.iter().all(|d| d.direct()),
        "loop devices are opened O_DIRECT"
    );
    let geo = Geometry::new(level, n, group, strip as u64, (strip * rows) as u64).unwrap();
    let array = Array::new(
        geo,
        data_offset as u64,
        drives,
        &vec![MemberState::Online; n],
    );
    Some(Rig {
        mems: Vec::new(),
        files: loops.devices.clone(),
        _dir: None,
        array: Arc::new(array),
        _loops: Some(loops),
        level,
        n,
        group: geo.group,
        strip,
        rows,
        data_offset,
    })
}

fn file_rig_in(
    dir: tempfile::TempDir,
    memory: bool,
    level: Level,
    n: usize,
    group: Option<usize>,
    strip: usize,
    rows: usize,
) -> Rig {
    // In memory, room for a write-intent bitmap (what a crash-torn parity sector is repaired
    // from); on disk the pools have none.
    let data_offset = if memory {
        millrace_array::bitmap::BITMAP_OFFSET as usize + 64 * 1024
    } else {
        8192
    };
    let size = data_offset + strip * rows;
    let files: Vec<std::path::PathBuf> = (0..n).map(|i| dir.path().join(format!("d{i}"))).collect();
    let drives: Vec<Arc<dyn Drive>> = files
        .iter()
        .map(|p| {
            std::fs::File::create(p)
                .unwrap()
                .set_len(size as u64)
                .unwrap();
            Arc::new(millrace_array::drive::FileDrive::open(p).unwrap()) as Arc<dyn Drive>
        })
        .collect();
    let geo = Geometry::new(level, n, group, strip as u64, (strip * rows) as u64).unwrap();
    let array = Array::new(
        geo,
        data_offset as u64,
        drives,
        &vec![MemberState::Online; n],
    );
    Rig {
        mems: Vec::new(),
        files,
        _dir: Some(dir),
        array: Arc::new(array),
        _loops: None,
        level,
        n,
        group: geo.group,
        strip,
        rows,
        data_offset,
    }
}

impl Rig {
    /// Every drive's bytes, read straight off the drive (RAM or file).
    fn snaps(&self) -> Vec<Vec<u8>> {
        if self.files.is_empty() {
            self.mems.iter().map(|m| m.snapshot()).collect()
        } else {
            self.files
                .iter()
                .map(|p| std::fs::read(p).unwrap())
                .collect()
        }
    }

    fn parity(&self) -> usize {
        match self.level {
            Level::Raid5 | Level::Raid50 => 1,
            Level::Raid6 | Level::Raid60 => 2,
            _ => 0,
        }
    }

    /// Members of a group in a row, in syndrome order (data..., P, Q), from md's rules:
    /// P sits at (g-1) - row mod g; RAID5 data follows P, RAID6 data follows Q = P+1.
    fn layout(&self, row: usize, group: usize) -> Vec<usize> {
        let g = self.group;
        let base = group * g;
        let np = self.parity();
        if np == 0 {
            return vec![base];
        }
        let pd = g - 1 - row % g;
        let mut v: Vec<usize> = (0..g - np).map(|i| base + (pd + np + i) % g).collect();
        v.push(base + pd);
        if np == 2 {
            v.push(base + (pd + 1) % g);
        }
        v
    }

    fn strip_of(&self, snaps: &[Vec<u8>], member: usize, row: usize) -> Vec<u8> {
        let at = self.data_offset + row * self.strip;
        snaps[member][at..at + self.strip].to_vec()
    }

    /// The pool's logical content, read straight off the drives with the reference layout.
    pub fn logical_from_drives(&self) -> Vec<u8> {
        let snaps = self.snaps();
        let groups = self.n / self.group;
        let np = self.parity();
        let per_group = if np > 0 { self.group - np } else { 1 };
        let mut out = Vec::new();
        for row in 0..self.rows {
            for g in 0..groups {
                let lay = self.layout(row, g);
                for &m in lay.iter().take(per_group) {
                    out.extend(self.strip_of(&snaps, m, row));
                }
            }
        }
        out
    }

    /// Checks every row's redundancy with the reference arithmetic. Returns the first problem.
    pub fn check_redundancy(&self) -> Result<(), String> {
        let snaps = self.snaps();
        let groups = self.n / self.group;
        let np = self.parity();
        for row in 0..self.rows {
            for g in 0..groups {
                if np == 0 {
                    let first = self.strip_of(&snaps, g * self.group, row);
                    for m in g * self.group..(g + 1) * self.group {
                        if self.strip_of(&snaps, m, row) != first {
                            return Err(format!("row {row}: mirror copy on member {m} differs"));
                        }
                    }
                    continue;
                }
                let lay = self.layout(row, g);
                let k = self.group - np;
                let mut p = vec![0u8; self.strip];
                let mut q = vec![0u8; self.strip];
                for (j, &m) in lay.iter().take(k).enumerate() {
                    let d = self.strip_of(&snaps, m, row);
                    let c = gf_pow2(j);
                    for b in 0..self.strip {
                        p[b] ^= d[b];
                        q[b] ^= gf_mul(c, d[b]);
                    }
                }
                if self.strip_of(&snaps, lay[k], row) != p {
                    return Err(format!(
                        "row {row} group {g}: P on member {} is wrong",
                        lay[k]
                    ));
                }
                if np == 2 && self.strip_of(&snaps, lay[k + 1], row) != q {
                    return Err(format!(
                        "row {row} group {g}: Q on member {} is wrong",
                        lay[k + 1]
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Deterministic bytes for a write, so a failing case can be replayed.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `n` cores sharing a buffer pool of `bytes` (a slice each), for the async engine's tests.
pub fn start_cores(n: usize, bytes: usize) -> (millrace_io::BufPool, millrace_io::Cores) {
    let pool = millrace_io::BufPool::new(&millrace_io::PoolConfig {
        bytes,
        slices: n,
        max_buf: 1 << 20,
        populate: false,
    })
    .unwrap();
    let cores = millrace_io::Cores::start(millrace_io::CoresConfig {
        cores: n,
        pool: Some(pool.clone()),
        ..Default::default()
    })
    .unwrap();
    (pool, cores)
}
