//! Volumes: named, thick, stripe-aligned ranges of a pool. The table that describes them lives
//! in the pool's own data area (so it is as redundant as the data and travels with the drives),
//! in two slots written alternately, each with a generation number and a CRC, so a crash while
//! the table is rewritten leaves the previous table intact.
//!
//! This layer sees the pool only as a [`BlockDevice`]: it knows nothing of parity or drives, and
//! nothing of exports. Exports keep their settings in a volume's free-form `props`, which this
//! layer stores without reading.

// Functions stay under 100 lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod alloc;
mod error;
mod table;
mod volume;

pub use error::VolumeError;
pub use table::{check_name, VolumeInfo, Volumes, TABLE_AREA_BYTES};
pub use volume::Volume;
