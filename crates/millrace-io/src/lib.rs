//! Millrace's data-path foundation, below both the array engine and the exports; it knows
//! nothing of RAID or of protocols (docs/ARCHITECTURE.md, "4. The data path").
//!
//! - [`BufPool`] / [`IoBuf`]: one 4 KiB-aligned region mapped at start-up, sliced per core,
//!   bounded, with back-pressure. A request takes an owned buffer, receives its payload into it,
//!   lends it to the drives and sends its reply from it: no allocation, no zeroing and no bounce
//!   copy per request.
//! - [`Cores`]: one thread per core, each a tokio current-thread runtime whose connections,
//!   io_uring and pool slice belong to it alone; [`Cores::spawn_on`] places a connection.
//! - [`scratch`]: buffers for the engine's own bytes (parity, old data), from the core's pool
//!   slice or recycled per thread, never allocated and zeroed per request.
//! - [`ring`]: batches of member I/O submitted to the current core's io_uring and completed
//!   there, sound against dropped futures; synchronous where no core runs.
//!
//! - [`admission`]: bounds on connections in all and per client, rate-limited log lines and
//!   the accept loop's back-off, shared by the NVMe/TCP and NBD servers.
//!
//! docs/DATAPATH.md is the guide for export authors.

// Functions stay under 100 lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod admission;
mod buddy;
pub mod buf;
pub mod cores;
mod kept;
pub mod pool;
mod region;
pub mod ring;
mod scratch;
pub mod share;

pub use buf::{IoBuf, ALIGN};
pub use cores::{current_core, CoreTask, Cores, CoresConfig};
pub use pool::{BufPool, PoolConfig, PoolUsage};
pub use ring::{io_wq_workers, on_ring, Batch, OpKind, Results, SharedBuf};
pub use scratch::scratch;
pub use share::{Share, Shares};

/// A test that needs what this machine lacks (`needs`, e.g. a tmpfs at /dev/shm) and so cannot
/// run: where the variable CI is set (CI sets CI=true) that fails the test, saying what is
/// missing; elsewhere it says "skipped: ..." on stderr, adds the line to the file named by
/// MILLRACE_SKIPS (scripts/test.sh counts them in its summary) and the test returns. For
/// tests only; it lives here, at the bottom of the crate graph, so every crate's tests share it.
#[doc(hidden)]
pub fn cannot_run(needs: &str) {
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    let why = format!("{test}: needs {needs}, which this machine lacks");
    assert!(
        std::env::var_os("CI").is_none(),
        "{why}; CI runs every test (scripts/setup.sh installs what they need)"
    );
    eprintln!("skipped: {why}");
    if let Some(list) = std::env::var_os("MILLRACE_SKIPS") {
        use std::io::Write;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(list);
        let _ = file.and_then(|mut f| writeln!(f, "{why}"));
    }
}
