//! Simulated drives: RAM-speed, storing nothing, each capped at a bandwidth and an IOPS rate
//! with a fixed latency, so that scaling over 16 or 24 drives shows on a 2-core machine.
//!
//! Pacing is by virtual time, not by sleeping inside each I/O: every drive keeps the instant it
//! is next free; an I/O books its service time there and raises the calling thread's deadline
//! to its completion. The bench's job loop sleeps once per request until that deadline (`wait`).
//! So a request that fans out to 16 drives costs one sleep, the drives' timelines (shared by all
//! jobs) cap the aggregate, and no CPU is burnt waiting. Reads leave buffers as they are: no
//! copy to pay for. Caveat: a read-modify-write's write phase books right after its read phase
//! rather than after its completion, so small-write latency is slightly optimistic.
//!
//! A flush books the drive from the end of everything it was given, plus its flush latency
//! (default 50 µs, a drive with a volatile write cache draining it; `/flush=` sets it); a FUA
//! write books its own service plus that latency, not waiting for writes booked after it. Both
//! return at once like any I/O, and the engine's batch runner (`millrace_array::io::execute`)
//! settles a batch holding one before returning, since what a flush orders (a log made durable
//! before the data goes in place) must have completed by then. So a batch's flushes on several
//! drives overlap as on real drives, and cost what they cost on a drive.

use std::cell::Cell;
use std::io;
use std::time::{Duration, Instant};

use millrace_array::drive::Drive;
use parking_lot::Mutex;

thread_local! {
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// This thread's I/O now completes no earlier than `done`.
fn raise_deadline(done: Instant) {
    DEADLINE.with(|d| d.set(Some(d.get().map_or(done, |x| x.max(done)))));
}

/// Sleeps until every simulated I/O this thread issued has completed.
pub fn wait() {
    if let Some(t) = DEADLINE.with(|d| d.take()) {
        let now = Instant::now();
        if t > now {
            std::thread::sleep(t - now);
        }
    }
}

#[derive(Clone, Debug)]
pub struct SimSpec {
    pub drives: usize,
    pub bytes_per_sec: f64,
    pub iops: f64,
    pub latency: Duration,
    pub flush_latency: Duration,
    pub size: u64,
}

impl std::str::FromStr for SimSpec {
    type Err = String;
    /// "16x400M" (16 drives of 400 MB/s), optionally ":200k" for an IOPS cap, optionally
    /// "/flush=200u" for a flush latency (u: microseconds, m: milliseconds).
    fn from_str(s: &str) -> Result<SimSpec, String> {
        let bad = || {
            format!("'{s}' is not a simulated pool: write it as DRIVESxRATE, like 16x400M (16 drives of 400 MB/s each), optionally :IOPS, like 16x400M:200k, and /flush=LATENCY, like 16x400M/flush=200u")
        };
        let (s, flush_latency) = match s.split_once("/flush=") {
            Some((m, f)) => {
                // The unit is the last character, which need not be one byte (fuzzed input).
                let (digits, unit) = f.split_at(f.char_indices().last().map_or(0, |(i, _)| i));
                let n: u64 = digits.parse().map_err(|_| bad())?;
                let d = match unit {
                    "u" => Duration::from_micros(n),
                    "m" => Duration::from_millis(n),
                    _ => return Err(bad()),
                };
                (m, d)
            }
            None => (s, Duration::from_micros(50)),
        };
        let (main, iops) = match s.split_once(':') {
            Some((m, i)) => (m, Some(i)),
            None => (s, None),
        };
        let (n, rate) = main.split_once(['x', 'X']).ok_or_else(bad)?;
        let drives: usize = n.trim().parse().map_err(|_| bad())?;
        let num = |t: &str| -> Option<f64> {
            let t = t.trim();
            let (digits, mult) = match t.chars().last()? {
                'k' | 'K' => (&t[..t.len() - 1], 1e3),
                'm' | 'M' => (&t[..t.len() - 1], 1e6),
                'g' | 'G' => (&t[..t.len() - 1], 1e9),
                _ => (t, 1.0),
            };
            digits
                .parse::<f64>()
                .ok()
                .map(|v| v * mult)
                .filter(|v| *v > 0.0)
        };
        let bytes_per_sec = num(rate).ok_or_else(bad)?;
        let iops = match iops {
            Some(i) => num(i).ok_or_else(bad)?,
            None => 1e6,
        };
        if drives == 0 || drives > 64 {
            return Err(format!("a simulated pool has 1 to 64 drives, not {drives}"));
        }
        // Every drive's pacing becomes a Duration and a sleep: a rate near zero (or an endless
        // flush) would panic converting it, or hold the bench for centuries.
        if !(1e6..=1e12).contains(&bytes_per_sec) {
            return Err(format!(
                "a simulated drive moves 1M to 1000G bytes a second, not {bytes_per_sec}"
            ));
        }
        if !(1.0..=1e9).contains(&iops) {
            return Err(format!(
                "a simulated drive does 1 to 1000M I/Os a second, not {iops}"
            ));
        }
        if flush_latency > Duration::from_secs(1) {
            return Err(format!(
                "a simulated drive's flush takes at most 1 s, not {flush_latency:?}"
            ));
        }
        Ok(SimSpec {
            drives,
            bytes_per_sec,
            iops,
            latency: Duration::from_micros(80),
            flush_latency,
            size: 64 << 30,
        })
    }
}

pub struct SimDrive {
    name: String,
    size: u64,
    ns_per_byte: f64,
    min_op: Duration,
    latency: Duration,
    flush_latency: Duration,
    free_at: Mutex<Instant>,
}

impl SimDrive {
    pub fn new(name: String, spec: &SimSpec) -> SimDrive {
        SimDrive {
            name,
            size: spec.size,
            ns_per_byte: 1e9 / spec.bytes_per_sec,
            min_op: Duration::from_secs_f64(1.0 / spec.iops),
            latency: spec.latency,
            flush_latency: spec.flush_latency,
            free_at: Mutex::new(Instant::now()),
        }
    }

    /// Takes the drive for an I/O of `len` bytes after what it was already given; returns when
    /// the I/O completes.
    fn reserve(&self, len: usize) -> Instant {
        let service = Duration::from_nanos((len as f64 * self.ns_per_byte) as u64).max(self.min_op);
        let mut f = self.free_at.lock();
        let start = (*f).max(Instant::now());
        *f = start + service;
        *f + self.latency
    }

    fn book(&self, len: usize) {
        let done = self.reserve(len);
        raise_deadline(done);
    }
}

impl Drive for SimDrive {
    fn describe(&self) -> String {
        self.name.clone()
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], _offset: u64) -> io::Result<()> {
        self.book(buf.len());
        Ok(())
    }
    fn write_at(&self, buf: &[u8], _offset: u64) -> io::Result<()> {
        self.book(buf.len());
        Ok(())
    }
    // A flush or FUA write books its time like any I/O and returns; `millrace_array::io`
    // settles a batch holding one before it returns, so a batch's flushes on several drives
    // overlap as they do on real drives (waited for here one by one, they added up).
    fn flush(&self) -> io::Result<()> {
        let done = {
            let mut f = self.free_at.lock();
            let start = (*f + self.latency).max(Instant::now());
            *f = start + self.flush_latency;
            *f
        };
        raise_deadline(done);
        Ok(())
    }
    fn write_fua_at(&self, buf: &[u8], _offset: u64) -> io::Result<()> {
        let done = self.reserve(buf.len()) + self.flush_latency;
        raise_deadline(done);
        Ok(())
    }
    fn settle(&self) {
        wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_refuse() {
        let s: SimSpec = "16x400M".parse().unwrap();
        assert_eq!(s.drives, 16);
        assert_eq!(s.bytes_per_sec, 400e6);
        let s: SimSpec = "4x1G:50k".parse().unwrap();
        assert_eq!(s.iops, 50e3);
        assert!("16".parse::<SimSpec>().unwrap_err().contains("DRIVESxRATE"));
        assert!("0x1M".parse::<SimSpec>().is_err());
        let s: SimSpec = "8x1G/flush=2m".parse().unwrap();
        assert_eq!(s.flush_latency, Duration::from_millis(2));
        assert!("8x1G/flush=2s".parse::<SimSpec>().is_err());
        // A unit of more than one byte is refused, not a panic (a request body may hold it).
        assert!("8x1G/flush=2é".parse::<SimSpec>().is_err());
        assert!("8x1G/flush=é".parse::<SimSpec>().is_err());
    }

    /// Rates that would panic turning pacing into a Duration (or sleep for centuries), as an
    /// API bench request may send them, are refused with a sentence.
    #[test]
    fn impossible_rates_are_refused() {
        for bad in [
            "16x1e-300",
            "16x0.5",
            "16x1e300",
            "16xinf",
            "16x400M:1e-30",
            "16x400M:inf",
            "16x400M:1e300k",
            "1x1M/flush=18446744073709551615m",
            "1x1M/flush=2000m",
        ] {
            let e = bad.parse::<SimSpec>().expect_err(bad);
            assert!(e.contains("a simulated drive"), "{bad}: {e}");
        }
        for good in ["1x1M:1", "64x1000G:1000M/flush=1000m"] {
            let s: SimSpec = good.parse().unwrap();
            let _ = SimDrive::new("s".into(), &s);
        }
    }

    #[test]
    fn a_flush_waits_for_the_writes_before_it() {
        let spec: SimSpec = "1x100M/flush=1m".parse().unwrap();
        let d = SimDrive::new("s".into(), &spec);
        let t = Instant::now();
        d.write_at(&vec![0u8; 1 << 20], 0).unwrap();
        d.flush().unwrap();
        d.settle();
        // 1 MiB at 100 MB/s is about 10 ms, then 1 ms of flush.
        assert!(
            t.elapsed() >= Duration::from_millis(11),
            "{:?}",
            t.elapsed()
        );
    }

    /// The engine runs a batch's flushes one after another on simulated drives and settles
    /// once: they must overlap, as on real drives, not add up.
    #[test]
    fn flushes_of_several_drives_overlap() {
        let spec: SimSpec = "1x10M/flush=1m".parse().unwrap();
        let ds: Vec<SimDrive> = (0..3)
            .map(|i| SimDrive::new(format!("s{i}"), &spec))
            .collect();
        for d in &ds {
            d.write_at(&vec![0u8; 1 << 20], 0).unwrap();
        }
        let t = Instant::now();
        ds.iter().for_each(|d| d.flush().unwrap());
        ds[0].settle();
        // Each drive needs about 105 ms (1 MiB at 10 MB/s, then the flush): together, not 315.
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(100), "{took:?}");
        assert!(took < Duration::from_millis(250), "{took:?}");
    }

    #[test]
    fn a_capped_drive_keeps_its_cap() {
        let spec: SimSpec = "1x200M".parse().unwrap();
        let d = SimDrive::new("s".into(), &spec);
        let mut buf = vec![0u8; 1 << 20];
        let t = Instant::now();
        for _ in 0..40 {
            d.read_at(&mut buf, 0).unwrap();
            wait();
        }
        let rate = 40.0 * (1 << 20) as f64 / t.elapsed().as_secs_f64();
        // 200 MB/s cap; generous bounds so a loaded machine cannot make this flaky upward.
        assert!(rate < 230e6, "{rate}");
        assert!(rate > 50e6, "{rate}");
    }
}
