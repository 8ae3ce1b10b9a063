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
mod filled;
pub mod inline;
mod kept;
pub mod mapped;
pub mod pool;
mod region;
pub mod ring;
mod scratch;
pub mod share;

pub use buf::{lend_reads, lent_send_failed, IoBuf, Lent, ALIGN};
pub use cores::{current_core, CoreTask, Cores, CoresConfig};
pub use pool::{BufPool, PoolConfig, PoolUsage};
pub use ring::{on_ring, place_repaired, write_inline, Batch, OpKind, Results, SharedBuf};
pub use scratch::scratch;
pub use share::{Share, Shares};
