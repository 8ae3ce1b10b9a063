//! Millrace's array layer: members, geometry, parity, superblocks and pools. It knows nothing
//! about networks; exports reach it through `millrace_block::BlockDevice`.

pub mod aligned;
pub mod bitmap;
pub mod drive;
pub mod engine;
pub mod error;
pub mod fault;
pub mod geometry;
pub mod io;
pub mod journal;
pub mod ppl;
pub mod superblock;

pub use engine::{Array, ArrayError, MemberStats};
pub use geometry::{Geometry, Level};
pub mod pool;

pub use pool::{Cache, CreateOptions, Pool, PoolError, PoolInfo};
