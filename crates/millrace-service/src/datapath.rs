//! The data path's shared machinery, made once by `millrace serve` and handed to every export
//! (NVMe/TCP, NBD): one aligned buffer pool, the bound on all request payload memory, and the
//! cores (one thread per core, each a tokio current-thread runtime with its own io_uring and
//! slice of the pool) that connections run on. docs/DATAPATH.md says how an export uses them.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use millrace_io::{BufPool, Cores, CoresConfig, PoolConfig, PoolUsage};

/// Most cores `serve` starts when none are asked for: past this a server is better served by
/// pinning (`--cpus`) than by one thread per hardware thread.
pub const DEFAULT_MAX_CORES: usize = 16;
/// Most cores that may be asked for at all.
pub const MAX_CORES: usize = 256;
/// The buffer pool's default size.
pub const DEFAULT_POOL_BYTES: u64 = 256 << 20;
/// The largest single request the pool serves (NBD's maximum block size, NVMe's MDTS are
/// capped by it), unless a pool slice is smaller. 32 MiB is what NBD has always allowed:
/// clients such as nbdsh send 16 MiB reads without asking for the advertised maximum.
pub const DEFAULT_MAX_BUF: usize = 32 << 20;
/// Each core's slice must hold at least this much (one 1 MiB NVMe transfer).
const MIN_SLICE_BYTES: u64 = 1 << 20;
/// The pool may not exceed this (the machine's memory is the real limit; this catches typos).
const MAX_POOL_BYTES: u64 = 1 << 40;

/// What `millrace serve --cores/--cpus/--buffer-pool` asked for; `None` takes the default.
#[derive(Clone, Debug, Default)]
pub struct DataPathConfig {
    /// Threads serving connections (default: the CPUs this process may use, at most 16).
    pub cores: Option<usize>,
    /// Pin core i to `cpus[i % len]`.
    pub cpus: Option<Vec<usize>>,
    /// Bytes of the buffer pool (default 256 MiB).
    pub buffer_pool_bytes: Option<u64>,
    /// Fault the pool in at start-up (what `serve` does; tests may skip it to start faster).
    pub populate: Option<bool>,
}

/// The pool and the cores, cheap to clone; every export takes a clone.
#[derive(Clone)]
pub struct DataPath {
    pub pool: BufPool,
    pub cores: Arc<Cores>,
}

fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Parses a CPU list as taskset and /sys write them: `0-3,8,10-11`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let bad = || {
        format!("'{s}' is not a CPU list: give numbers and ranges separated by commas, like 0-3,8")
    };
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let a: usize = a.parse().map_err(|_| bad())?;
        let b: usize = b.parse().map_err(|_| bad())?;
        if a > b || b >= 4096 {
            return Err(bad());
        }
        out.extend(a..=b);
        if out.len() > MAX_CORES {
            return Err(format!(
                "the CPU list '{s}' names more than {MAX_CORES} CPUs; name at most {MAX_CORES}"
            ));
        }
    }
    Ok(out)
}

impl DataPathConfig {
    /// The cores and pool bytes to use, or a sentence saying what is wrong with the request.
    pub fn resolve(&self) -> Result<(usize, u64)> {
        let cores = match (self.cores, &self.cpus) {
            (Some(n), _) => n,
            (None, Some(c)) if !c.is_empty() => c.len(),
            _ => available_cpus().min(DEFAULT_MAX_CORES),
        };
        if cores == 0 || cores > MAX_CORES {
            bail!("--cores {cores} is out of range: give 1 to {MAX_CORES}");
        }
        if self.cpus.as_ref().is_some_and(|c| c.is_empty()) {
            bail!("--cpus names no CPU; give a list like 0-3 or leave it out");
        }
        let bytes = self.buffer_pool_bytes.unwrap_or(DEFAULT_POOL_BYTES);
        if bytes > MAX_POOL_BYTES {
            bail!("--buffer-pool {bytes} bytes is more than 1 TiB; give a size such as 256M or 4G");
        }
        let least = MIN_SLICE_BYTES * cores as u64;
        if bytes < least {
            bail!(
                "--buffer-pool {bytes} bytes is too small for {cores} cores: each core needs at least 1 MiB, so give at least {} MiB or fewer cores",
                least >> 20
            );
        }
        Ok((cores, bytes))
    }
}

impl DataPath {
    /// Maps the pool and starts the cores.
    pub fn start(cfg: &DataPathConfig) -> Result<DataPath> {
        let (cores, bytes) = cfg.resolve()?;
        let slice = bytes / cores as u64;
        // The largest power of two of the slice, so one buffer of max_buf always fits.
        let max_buf = DEFAULT_MAX_BUF.min(1usize << (63 - slice.leading_zeros()));
        let pool = BufPool::new(&PoolConfig {
            bytes: bytes as usize,
            slices: cores,
            max_buf,
            populate: cfg.populate.unwrap_or(true),
        })
        .with_context(|| format!("cannot map the buffer pool of {bytes} bytes"))?;
        let cores = Cores::start(CoresConfig {
            cores,
            cpus: cfg.cpus.clone(),
            ring_entries: 256,
            pool: Some(pool.clone()),
        })
        .context("cannot start the data path's cores")?;
        Ok(DataPath {
            pool,
            cores: Arc::new(cores),
        })
    }

    pub fn usage(&self) -> PoolUsage {
        self.pool.usage()
    }
}

/// This process's resident memory in bytes (VmRSS), where /proc says.
pub fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,8").unwrap(), vec![0, 1, 2, 3, 8]);
        assert_eq!(parse_cpu_list("5").unwrap(), vec![5]);
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").is_err());
        assert!(parse_cpu_list("0-100000").is_err());
    }

    #[test]
    fn sizes_are_bounded_with_sentences() {
        let c = DataPathConfig {
            cores: Some(4),
            buffer_pool_bytes: Some(2 << 20),
            ..Default::default()
        };
        let e = c.resolve().unwrap_err().to_string();
        assert!(e.contains("at least 4 MiB"), "{e}");
        let c = DataPathConfig {
            cores: Some(0),
            ..Default::default()
        };
        assert!(c.resolve().unwrap_err().to_string().contains("1 to"));
        let c = DataPathConfig {
            cpus: Some(vec![0, 1]),
            ..Default::default()
        };
        assert_eq!(c.resolve().unwrap().0, 2);
    }

    #[test]
    fn starts_small() {
        let d = DataPath::start(&DataPathConfig {
            cores: Some(2),
            buffer_pool_bytes: Some(4 << 20),
            populate: Some(false),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(d.cores.len(), 2);
        assert_eq!(d.usage().capacity_bytes, 4 << 20);
        assert_eq!(d.pool.max_buf(), 2 << 20);
        assert!(rss_bytes().unwrap() > 0);
    }
}
