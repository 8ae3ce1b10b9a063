//! Workloads: jobs (threads) issuing requests of one size back to back for a fixed time, on the
//! array or on the raw drives, counting bytes, requests and the process's CPU time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use millrace_array::aligned::AlignedBuf;
use millrace_array::drive::Drive;
use millrace_array::Array;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    SeqRead,
    SeqWrite,
    RandRead,
    RandWrite,
    /// 70% random reads, 30% random writes.
    Mixed,
    /// Rebuild onto a replaced member (a rate, not a client workload).
    Rebuild,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::SeqRead => "seq read",
            Workload::SeqWrite => "seq write",
            Workload::RandRead => "rand read",
            Workload::RandWrite => "rand write",
            Workload::Mixed => "mixed 70/30",
            Workload::Rebuild => "rebuild",
        }
    }
    pub fn writes(self) -> bool {
        !matches!(self, Workload::SeqRead | Workload::RandRead)
    }
    pub fn sequential(self) -> bool {
        matches!(
            self,
            Workload::SeqRead | Workload::SeqWrite | Workload::Rebuild
        )
    }
}

/// What jobs run against.
pub trait Target: Sync {
    fn size(&self) -> u64;
    fn read(&self, job: usize, offset: u64, buf: &mut [u8]) -> std::io::Result<()>;
    fn write(&self, job: usize, offset: u64, buf: &[u8]) -> std::io::Result<()>;
}

pub struct ArrayTarget<'a> {
    pub array: &'a Array,
    pub simulated: bool,
}

impl Target for ArrayTarget<'_> {
    fn size(&self) -> u64 {
        self.array.size_bytes()
    }
    fn read(&self, _: usize, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.array.read_at(offset, buf)?;
        if self.simulated {
            crate::sim::wait();
        }
        Ok(())
    }
    fn write(&self, _: usize, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.array.write_at(offset, buf)?;
        if self.simulated {
            crate::sim::wait();
        }
        Ok(())
    }
}

/// The raw drives, read or written directly at their data areas: job j uses drive j mod n, so
/// with at least as many jobs as drives every drive is busy, as every drive of the array is.
pub struct RawTarget {
    pub drives: Vec<Arc<dyn Drive>>,
    pub data_offset: u64,
    pub member_bytes: u64,
    pub simulated: bool,
}

impl Target for RawTarget {
    fn size(&self) -> u64 {
        self.member_bytes
    }
    fn read(&self, job: usize, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let d = &self.drives[job % self.drives.len()];
        d.read_at(buf, self.data_offset + offset)?;
        if self.simulated {
            crate::sim::wait();
        }
        Ok(())
    }
    fn write(&self, job: usize, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        let d = &self.drives[job % self.drives.len()];
        d.write_at(buf, self.data_offset + offset)?;
        if self.simulated {
            crate::sim::wait();
        }
        Ok(())
    }
}

pub struct Measured {
    pub bytes: u64,
    pub ops: u64,
    pub seconds: f64,
    pub cpu_seconds: f64,
}

impl Measured {
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e9
    }
    pub fn iops(&self) -> f64 {
        self.ops as f64 / self.seconds
    }
    pub fn cpu_per_gb(&self) -> f64 {
        self.cpu_seconds / (self.bytes as f64 / 1e9).max(1e-9)
    }
}

pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Runs `jobs` threads of `workload` with requests of `bs` bytes for `secs` seconds (and
/// each for one request at least). A job that hits an error stops, and the error is returned.
pub fn run(
    target: &dyn Target,
    workload: Workload,
    bs: u64,
    jobs: usize,
    secs: f64,
) -> std::io::Result<Measured> {
    let size = target.size() / bs * bs;
    if size == 0 {
        return Err(std::io::Error::other(format!(
            "the target ({} bytes) is smaller than one {bs} byte request",
            target.size()
        )));
    }
    let stop = AtomicBool::new(false);
    let bytes = AtomicU64::new(0);
    let ops = AtomicU64::new(0);
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let err: parking_lot::Mutex<Option<std::io::Error>> = parking_lot::Mutex::new(None);
    std::thread::scope(|s| {
        for job in 0..jobs {
            let (stop, bytes, ops, err) = (&stop, &bytes, &ops, &err);
            s.spawn(move || {
                let mut buf = AlignedBuf::zeroed(bs as usize);
                for (i, b) in buf.iter_mut().enumerate() {
                    *b = (i as u8) ^ (job as u8);
                }
                let slots = size / bs;
                // Sequential jobs each walk their own share of the target; random ones roam.
                let share = (slots / jobs as u64).max(1);
                let mut next = (job as u64 * share) % slots;
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (job as u64 + 1);
                // Every job measures at least one request: on a loaded machine a short point
                // can end before a job's thread has run at all, which would read as no speed.
                loop {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let slot = if workload.sequential() {
                        let s = next;
                        next = if (next + 1).is_multiple_of(share) || next + 1 >= slots {
                            job as u64 * share % slots
                        } else {
                            next + 1
                        };
                        s
                    } else {
                        x % slots
                    };
                    let write = match workload {
                        Workload::SeqWrite | Workload::RandWrite => true,
                        Workload::Mixed => x % 10 < 3,
                        _ => false,
                    };
                    let r = if write {
                        target.write(job, slot * bs, &buf)
                    } else {
                        target.read(job, slot * bs, &mut buf)
                    };
                    if let Err(e) = r {
                        *err.lock() = Some(e);
                        stop.store(true, Ordering::Relaxed);
                        break;
                    }
                    bytes.fetch_add(bs, Ordering::Relaxed);
                    ops.fetch_add(1, Ordering::Relaxed);
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
    });
    if let Some(e) = err.into_inner() {
        return Err(e);
    }
    Ok(Measured {
        bytes: bytes.into_inner(),
        ops: ops.into_inner(),
        seconds: t0.elapsed().as_secs_f64(),
        cpu_seconds: cpu_seconds() - cpu0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A target whose every request takes 20 ms, far longer than the point.
    struct Slow;
    impl Target for Slow {
        fn size(&self) -> u64 {
            1 << 20
        }
        fn read(&self, _: usize, _: u64, _: &mut [u8]) -> std::io::Result<()> {
            std::thread::sleep(Duration::from_millis(20));
            Ok(())
        }
        fn write(&self, _: usize, _: u64, _: &[u8]) -> std::io::Result<()> {
            std::thread::sleep(Duration::from_millis(20));
            Ok(())
        }
    }

    #[test]
    fn a_point_shorter_than_one_request_still_measures_one_per_job() {
        // More jobs than cores and a point of no length: most jobs have not run when it ends.
        let m = run(&Slow, Workload::SeqRead, 4096, 64, 0.0).unwrap();
        assert!(m.ops >= 64, "{} requests", m.ops);
        assert!(m.bytes >= 64 * 4096);
        assert!(m.gbps() > 0.0);
    }
}
