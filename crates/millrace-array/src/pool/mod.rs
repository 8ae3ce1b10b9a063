//! Pools as an admin sees them: created from drives, found again from the drives alone.
//!
//! Each member's superblock carries the whole pool's description and a member table, so any
//! member tells which pool it belongs to and what the others are. Assembly trusts only members
//! whose event counter equals the newest one seen; an older one is stale (it missed updates
//! while away) and stays out. A small cache under MILLRACE_HOME remembers member paths by pool
//! name, the way mdadm.conf or zpool.cache do, so later commands can name the pool.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::aligned::AlignedBuf;
use crate::drive::{Drive, FileDrive};
pub use crate::error::PoolError;

use crate::engine::{Array, MissingDrive};
use crate::geometry::{Geometry, Level, MAX_STRIP};
use crate::superblock::{MemberState, SbError, Superblock, SLOT_BYTES};

pub type Result<T> = std::result::Result<T, PoolError>;

fn err<T>(msg: impl Into<String>) -> Result<T> {
    Err(PoolError(msg.into()))
}

const MIB: u64 = 1 << 20;
/// How much of a drive's start is checked for foreign content before it is claimed.
const BLANK_CHECK: usize = 64 << 10;

#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub name: String,
    pub level: Level,
    pub strip: u64,
    pub group: Option<usize>,
    /// Bytes reserved at each member's start for superblocks and metadata; default by size.
    pub data_offset: Option<u64>,
    /// Create missing drive files of this size (sparse).
    pub create_size: Option<u64>,
    /// Overwrite drives that hold other data or another pool.
    pub force: bool,
}

/// What an admin or a script sees of a pool.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PoolInfo {
    pub name: String,
    pub uuid: Uuid,
    pub level: Level,
    pub strip_bytes: u64,
    pub group_size: usize,
    pub groups: usize,
    pub data_drives_per_group: usize,
    pub size_bytes: u64,
    pub full_stripe_bytes: u64,
    pub state: String,
    pub clean: bool,
    pub events: u64,
    pub data_offset_bytes: u64,
    pub member_data_bytes: u64,
    pub members: Vec<MemberInfo>,
    /// Hot spares waiting for a member to fail.
    pub spares: Vec<String>,
    /// Progress of a rebuild, when one is under way or interrupted.
    pub rebuild: Option<RebuildInfo>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RebuildInfo {
    pub rows_done: u64,
    pub rows_total: u64,
    pub percent: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemberInfo {
    pub index: usize,
    pub path: Option<String>,
    pub uuid: Uuid,
    pub state: MemberState,
    pub data_offset_bytes: u64,
    pub group: usize,
}

mod cache;
mod create;
mod import;
mod members;
mod meta;
mod work;

pub use cache::{Cache, CachedPool};
pub use create::read_superblock;
use meta::Meta;

pub struct Pool {
    meta: Arc<Meta>,
    array: Arc<Array>,
    dirty: AtomicBool,
    /// Set by [`Pool::stop_work`]: a rebuild or scrub under way stops at its next batch.
    stopping: AtomicBool,
    /// Things worth telling the admin (unequal sizes, stale members, ...).
    pub notes: Vec<String>,
    /// The pool was found recorded in use when it was assembled (whoever held it did not
    /// close it: a crash or a kill) and its dirty rows were resynced.
    pub found_unclean: bool,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['-', '.'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        err(format!(
            "'{name}' is not a usable pool name: use 1 to 64 letters, digits, '-', '_' or '.', not starting with '-' or '.'"
        ))
    }
}

impl Pool {
    pub fn array(&self) -> &Arc<Array> {
        &self.array
    }

    pub fn name(&self) -> String {
        self.meta.sb.lock().name.clone()
    }

    pub fn uuid(&self) -> Uuid {
        self.meta.sb.lock().pool_uuid
    }

    pub fn member_paths(&self) -> Vec<Option<PathBuf>> {
        self.meta.paths.lock().clone()
    }

    pub fn spare_paths(&self) -> Vec<PathBuf> {
        self.meta
            .spares
            .lock()
            .iter()
            .map(|s| s.1.clone())
            .collect()
    }

    pub fn superblock(&self) -> Superblock {
        self.meta.sb.lock().clone()
    }

    /// Records the pool as in use before writes reach it by a path other than [`Pool::write_at`]
    /// (a server's volumes write to the array directly), so a crash is noticed at the next
    /// import and the write-intent bitmap's regions are resynced.
    pub fn mark_in_use(&self) -> Result<()> {
        self.mark_dirty()
    }

    /// Records the pool as dirty before its first write, so a crash is noticed at the next import.
    fn mark_dirty(&self) -> Result<()> {
        if self.dirty.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let mut sb = self.meta.sb.lock();
        if !sb.clean {
            return Ok(());
        }
        sb.clean = false;
        let mut copy = sb.clone();
        self.meta
            .commit(&mut copy)
            .map_err(|e| PoolError(format!("cannot mark the pool in use: {e}")))?;
        *sb = copy;
        Ok(())
    }

    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.mark_dirty()?;
        Ok(self.array.write_at(offset, data)?)
    }

    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        Ok(self.array.read_at(offset, buf)?)
    }

    /// Recomputes redundancy over the whole pool (after creation over used drives, or a crash),
    /// reporting progress as (rows done, rows total).
    pub fn resync(&self, mut progress: impl FnMut(u64, u64)) -> Result<()> {
        self.mark_dirty()?;
        let rows = self.array.geometry().rows();
        for r in 0..rows {
            self.array.resync_row(r)?;
            if r % 64 == 0 || r + 1 == rows {
                progress(r + 1, rows);
            }
        }
        self.array.flush()?;
        Ok(())
    }

    /// Flushes and records a clean shutdown.
    pub fn close(&self) -> Result<()> {
        self.array.settle()?;
        let mut sb = self.meta.sb.lock();
        if sb.clean && !self.dirty.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut copy = sb.clone();
        copy.clean = true;
        for (i, s) in self.array.member_states().into_iter().enumerate() {
            copy.table[i].1 = s;
        }
        if self
            .array
            .member_states()
            .contains(&MemberState::Rebuilding)
        {
            copy.rebuild_checkpoint = self.rebuild_checkpoint();
        }
        self.meta
            .commit(&mut copy)
            .map_err(|e| PoolError(format!("cannot record a clean shutdown: {e}")))?;
        *sb = copy;
        self.dirty.store(false, Ordering::Release);
        Ok(())
    }

    /// Erases the superblocks of every member, so the drives no longer form a pool.
    pub fn destroy(self) -> Result<()> {
        let zero = AlignedBuf::zeroed(2 * SLOT_BYTES);
        let spares: Vec<Arc<dyn Drive>> = self
            .meta
            .spares
            .lock()
            .iter()
            .map(|s| s.0.clone())
            .collect();
        for d in self.array.drives().iter().chain(spares.iter()) {
            if d.size_bytes() > 0 {
                d.write_at(&zero, 0)
                    .and_then(|_| d.flush())
                    .map_err(|e| PoolError(format!("cannot erase {}: {e}", d.describe())))?;
            }
        }
        Ok(())
    }

    pub fn state(&self) -> String {
        if self.array.offline_group().is_some() {
            return "offline".into();
        }
        let states = self.array.member_states();
        if states
            .iter()
            .all(|s| matches!(s, MemberState::Online | MemberState::Spare))
        {
            "online".into()
        } else if states.contains(&MemberState::Rebuilding) {
            "rebuilding".into()
        } else {
            "degraded".into()
        }
    }

    pub fn info(&self) -> PoolInfo {
        let sb = self.meta.sb.lock().clone();
        let geo = *self.array.geometry();
        let states = self.array.member_states();
        let paths = self.member_paths();
        PoolInfo {
            name: sb.name.clone(),
            uuid: sb.pool_uuid,
            level: geo.level,
            strip_bytes: geo.strip,
            group_size: geo.group,
            groups: geo.groups(),
            data_drives_per_group: geo.group_data(),
            size_bytes: geo.size_bytes(),
            full_stripe_bytes: geo.full_stripe_bytes(),
            state: self.state(),
            clean: sb.clean,
            events: sb.events,
            data_offset_bytes: sb.data_offset,
            member_data_bytes: geo.member_data_bytes,
            members: (0..geo.members)
                .map(|i| MemberInfo {
                    index: i,
                    path: paths[i].as_ref().map(|p| p.display().to_string()),
                    uuid: sb.table[i].0,
                    state: states[i],
                    data_offset_bytes: sb.data_offset,
                    group: i / geo.group,
                })
                .collect(),
            spares: self
                .spare_paths()
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
            rebuild: states.contains(&MemberState::Rebuilding).then(|| {
                let done = self.rebuild_checkpoint();
                RebuildInfo {
                    rows_done: done,
                    rows_total: geo.rows(),
                    percent: 100.0 * done as f64 / geo.rows().max(1) as f64,
                }
            }),
        }
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}
