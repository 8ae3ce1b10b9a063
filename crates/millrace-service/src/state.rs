//! What the server holds: the open pools with their volumes, the export services, the jobs.
//! Every method is blocking (pools do disk I/O); the API calls them on the blocking pool.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use millrace_array::superblock::MemberState;
use millrace_array::{Cache, Pool};
use millrace_volume::{VolumeInfo, Volumes};
use parking_lot::RwLock;

use crate::error::ApiError;
use crate::jobs::Jobs;
use crate::metered::Meters;
use crate::model::{MemberIo, PoolStats, PoolView};
use crate::props::{self, NvmeExportConfig, NVME_PROP};

/// A listener of a transport the server runs beside the service layer (NVMe/RDMA): what
/// /metrics counts of it, and the listener kept alive while the state holds it.
pub trait QueueCounts: Send {
    /// Queues open now, opened in all, refused in all.
    fn queues(&self) -> (usize, u64, u64);
    /// Queues closed because their host missed a deadline, and commands in flight when their
    /// queue ended.
    fn hangups(&self) -> (u64, u64);
}

pub struct PoolEntry {
    pub pool: Pool,
    pub volumes: Volumes,
}

pub struct State {
    pub home: PathBuf,
    /// Exports are live (a server runs); otherwise they are only recorded.
    pub serving: bool,
    /// The NVMe/TCP port listens (not so under `millrace serve --no-nvme`).
    pub nvme_listening: std::sync::atomic::AtomicBool,
    pub(crate) pools: RwLock<BTreeMap<String, Arc<PoolEntry>>>,
    /// Pools the cache knows that could not be assembled, with the reason.
    pub unavailable: RwLock<BTreeMap<String, String>>,
    pub nvmf: millrace_nvmf::Target,
    /// The records of NVMe reservations that persist through power loss.
    pub(crate) resv_files: Arc<crate::nvme_resv::ResvFiles>,
    /// The NVMe/RDMA listeners `millrace serve --nvme-rdma` started, held here as counters so
    /// this crate does not link the RDMA binding (the server owns the transport).
    pub nvme_rdma: parking_lot::Mutex<Vec<Box<dyn QueueCounts>>>,
    pub nbd: Arc<millrace_nbd::NbdServer>,
    /// The cores and buffer pool of `millrace serve` (unset offline).
    pub data_path: std::sync::OnceLock<crate::datapath::DataPath>,
    pub jobs: Jobs,
    pub meters: Meters,
    /// Listeners of NBD exports that asked for their own socket or address, by export name.
    pub(crate) nbd_listeners: parking_lot::Mutex<
        std::collections::HashMap<String, Vec<tokio::task::JoinHandle<std::io::Result<()>>>>,
    >,
    pub started: Instant,
    /// When this server started, in seconds since the Unix epoch (for /metrics and the
    /// dashboard: a restart after a crash shows as a recent start).
    pub started_unix: u64,
    /// The server before this one on this home did not stop in order (it crashed or was
    /// killed): it left its server file behind.
    pub previous_stop_unclean: bool,
    /// Pools that were found recorded in use when this server took them into service (a
    /// server holding them ended without closing them), so their dirty regions were resynced.
    pub found_unclean: RwLock<Vec<String>>,
    /// The most memory one bench run may use for its requests' buffers.
    pub bench_memory: u64,
}

/// Props a client may give a volume at creation (an orchestrator's tags, such as the CSI
/// driver's `csi.name`): a few short ones, never the keys of the server's own layers (an
/// `export.*` or `share*` prop would make the server believe in an export that does not exist).
fn check_client_props(props: &BTreeMap<String, String>) -> Result<(), ApiError> {
    const MOST: usize = 16;
    if props.len() > MOST {
        return Err(bad(format!(
            "a volume takes at most {MOST} props at creation; {} were given",
            props.len()
        )));
    }
    for (k, v) in props {
        let ok_key = !k.is_empty()
            && k.len() <= 64
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b));
        if !ok_key || v.len() > 512 {
            return Err(bad(format!(
                "the prop '{k}' is not one a volume can carry: keys are 1 to 64 letters, digits, '.', '_', '-' or '/', values at most 512 bytes"
            )));
        }
        if k.starts_with("export.") || k.starts_with("share") {
            return Err(bad(format!(
                "the prop '{k}' belongs to the server's exports and shares; they set it through their own calls"
            )));
        }
    }
    Ok(())
}

pub(crate) fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(msg)
}

impl State {
    pub fn entry(&self, pool: &str) -> Result<Arc<PoolEntry>, ApiError> {
        self.pools.read().get(pool).cloned().ok_or_else(|| {
            match self.unavailable.read().get(pool) {
                Some(why) => ApiError::conflict(format!("pool {pool} could not be assembled: {why}")),
                None => ApiError::not_found(format!(
                    "no pool named '{pool}' is known here; `millrace pool list` shows the ones that are, and `millrace pool import DRIVES...` finds one on its drives"
                )),
            }
        })
    }

    pub fn entries(&self) -> Vec<Arc<PoolEntry>> {
        self.pools.read().values().cloned().collect()
    }

    pub fn pool_view(&self, e: &PoolEntry) -> PoolView {
        let s = &e.pool.array().stats;
        use std::sync::atomic::Ordering::Relaxed;
        PoolView {
            info: e.pool.info(),
            volumes: e.volumes.list(),
            free_bytes: e.volumes.free_bytes(),
            largest_free_bytes: e.volumes.largest_free_bytes(),
            allocated_bytes: e.volumes.allocated_bytes(),
            member_allocated_bytes: files_allocated(&e.pool),
            stats: PoolStats {
                read_bytes: s.read_bytes.load(Relaxed),
                write_bytes: s.write_bytes.load(Relaxed),
                read_ops: s.read_ops.load(Relaxed),
                write_ops: s.write_ops.load(Relaxed),
            },
            member_stats: (e.pool.array().member_stats.iter().enumerate())
                .map(|(index, m)| MemberIo {
                    index,
                    read_bytes: m.read_bytes.load(Relaxed),
                    write_bytes: m.write_bytes.load(Relaxed),
                    read_ops: m.read_ops.load(Relaxed),
                    write_ops: m.write_ops.load(Relaxed),
                    errors: m.errors.load(Relaxed),
                })
                .collect(),
            notes: e.pool.notes.clone(),
        }
    }

    pub fn fail(self: &Arc<Self>, pool: &str, path: &Path) -> Result<String, ApiError> {
        let e = self.entry(pool)?;
        let msg = e.pool.fail(path).map_err(|e| bad(e.to_string()))?;
        self.start_rebuild_if_needed(pool, &e, None);
        Ok(msg)
    }

    pub fn add_spare(
        self: &Arc<Self>,
        pool: &str,
        path: &Path,
        force: bool,
    ) -> Result<String, ApiError> {
        let e = self.entry(pool)?;
        let msg = e
            .pool
            .add_spare(path, force)
            .map_err(|e| bad(e.to_string()))?;
        self.remember(&e);
        self.start_rebuild_if_needed(pool, &e, None);
        Ok(msg)
    }

    pub fn replace(
        self: &Arc<Self>,
        pool: &str,
        old: &Path,
        new: &Path,
        force: bool,
        rate: Option<u64>,
    ) -> Result<(String, Option<u64>), ApiError> {
        let e = self.entry(pool)?;
        let msg = e
            .pool
            .replace(old, new, force)
            .map_err(|e| bad(e.to_string()))?;
        self.remember(&e);
        Ok((msg, self.start_rebuild_if_needed(pool, &e, rate)))
    }

    pub(crate) fn remember(&self, e: &PoolEntry) {
        if let Err(err) = Cache::update(&self.home, |c| {
            c.remember(&e.pool);
            Ok(())
        }) {
            tracing::warn!("{err}");
        }
    }

    /// Starts a rebuild job when a member waits to be rebuilt and none runs; returns its id.
    pub fn start_rebuild_if_needed(
        self: &Arc<Self>,
        pool: &str,
        e: &Arc<PoolEntry>,
        rate: Option<u64>,
    ) -> Option<u64> {
        let waiting = e
            .pool
            .array()
            .member_states()
            .contains(&MemberState::Rebuilding);
        if !waiting {
            return None;
        }
        if let Some(id) = self.jobs.running_id(pool, "rebuild") {
            return Some(id);
        }
        // The rebuild's buffers are bounded by the data path's pool size, as its requests are.
        if let Some(dp) = self.data_path.get() {
            let bytes = dp.pool.usage().capacity_bytes;
            e.pool.array().set_rebuild_memory(bytes);
        }
        let entry = e.clone();
        Some(self.jobs.spawn(pool, "rebuild", move |job| {
            entry
                .pool
                .rebuild(rate, |d, t| job.progress(d, t))
                .map(|did| {
                    if did {
                        "rebuilt".to_string()
                    } else {
                        "nothing to rebuild".to_string()
                    }
                })
                .map_err(|e| e.to_string())
        }))
    }

    pub fn start_pending_rebuilds(self: &Arc<Self>) {
        for (name, e) in self.pools.read().clone() {
            self.start_rebuild_if_needed(&name, &e, None);
        }
    }

    pub fn rebuild(
        self: &Arc<Self>,
        pool: &str,
        rate: Option<u64>,
    ) -> Result<Option<u64>, ApiError> {
        let e = self.entry(pool)?;
        Ok(self.start_rebuild_if_needed(pool, &e, rate))
    }

    pub fn scrub(self: &Arc<Self>, pool: &str, repair: bool) -> Result<u64, ApiError> {
        let e = self.entry(pool)?;
        if let Some(id) = self.jobs.running_id(pool, "scrub") {
            return Err(ApiError::conflict(format!(
                "a scrub of pool {pool} is already running (job {id})"
            )));
        }
        Ok(self.jobs.spawn(pool, "scrub", move |job| {
            let r = e
                .pool
                .scrub(repair, |d, t| job.progress(d, t))
                .map_err(|e| e.to_string())?;
            job.set_result(serde_json::to_value(&r).unwrap_or_default());
            Ok(format!(
                "{} rows checked, {} mismatches, {} located, {} repaired",
                r.rows_checked, r.mismatches, r.located, r.repaired
            ))
        }))
    }

    pub fn create_volume(
        &self,
        pool: &str,
        name: &str,
        size: u64,
        force: bool,
        props: BTreeMap<String, String>,
    ) -> Result<VolumeInfo, ApiError> {
        let e = self.entry(pool)?;
        check_client_props(&props)?;
        if force && e.volumes.holds_foreign_data() {
            e.volumes
                .claim()
                .map_err(|e| ApiError::internal(e.to_string()))?;
        }
        e.volumes
            .create_with_props(name, size, props)
            .map_err(vol_err)
    }

    pub fn delete_volume(&self, pool: &str, name: &str) -> Result<(), ApiError> {
        let e = self.entry(pool)?;
        let v = e.volumes.get(name).ok_or_else(|| no_volume(pool, name))?;
        if props::is_exported(&v) {
            return Err(ApiError::conflict(format!(
                "volume {pool}/{name} is exported ({}); remove the export first",
                props::describe(&v)
            )));
        }
        self.requests_out(pool, &[name.to_string()])?;
        e.volumes.delete(name).map_err(vol_err)
    }

    /// Refuses to go on while requests of a removed export are still inside `volumes` of
    /// `pool` after waiting for them (`Meters::wait_out`); blocks, so call it off the runtime.
    pub(crate) fn requests_out(&self, pool: &str, volumes: &[String]) -> Result<(), ApiError> {
        match self.meters.wait_out(pool, volumes) {
            None => Ok(()),
            Some(n) => Err(ApiError::conflict(format!(
                "{n} requests of a removed export are still being answered from pool {pool} (a \
                 client that does not take its replies is closed within 30 s); try again in a minute"
            ))),
        }
    }

    pub fn grow_volume(&self, pool: &str, name: &str, size: u64) -> Result<VolumeInfo, ApiError> {
        let e = self.entry(pool)?;
        let v = e.volumes.grow(name, size).map_err(vol_err)?;
        let nqn = v
            .props
            .get(NVME_PROP)
            .and_then(|c| serde_json::from_str::<NvmeExportConfig>(c).ok())
            .map(|c| c.nqn);
        if let Some(nqn) = nqn {
            // Tell connected hosts the namespace changed size (an async event).
            if let Err(e) = self.nvmf.resize_namespace(&nqn, 1) {
                tracing::warn!("cannot tell hosts of {nqn} that it grew: {e}");
            }
        }
        Ok(v)
    }

    pub fn volume(&self, pool: &str, name: &str) -> Result<(Arc<PoolEntry>, VolumeInfo), ApiError> {
        let e = self.entry(pool)?;
        let v = e.volumes.get(name).ok_or_else(|| no_volume(pool, name))?;
        Ok((e, v))
    }

    pub fn close(&self) -> anyhow::Result<()> {
        // Rebuilds and scrubs stop at their next batch (a rebuild records its checkpoint), so
        // no job writes to a pool after it is recorded clean.
        for e in self.entries() {
            e.pool.stop_work();
        }
        let t0 = Instant::now();
        while self.jobs.list().iter().any(|j| j.state == "running") {
            if t0.elapsed() > std::time::Duration::from_secs(60) {
                tracing::error!("a job did not stop within 60 s; closing the pools anyway");
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let pools = std::mem::take(&mut *self.pools.write());
        for (name, e) in pools {
            // The allocation map first: it is written through the pool, which is then closed.
            if let Err(err) = e.volumes.close() {
                tracing::error!(pool = %name, "closing its volumes: {err}");
            }
            if let Err(err) = e.pool.close() {
                tracing::error!(pool = %name, "closing: {err}");
            }
        }
        Ok(())
    }
}

/// Bytes the pool's members take on their filesystems (st_blocks), where every member is a
/// file; None where one is a block device or missing (its allocation is not the pool's to see).
pub(crate) fn files_allocated(pool: &millrace_array::Pool) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    for p in pool.member_paths() {
        let m = std::fs::metadata(p?).ok()?;
        if !m.is_file() {
            return None;
        }
        total = total.saturating_add(m.blocks().saturating_mul(512));
    }
    Some(total)
}

pub fn no_volume(pool: &str, name: &str) -> ApiError {
    ApiError::not_found(format!(
        "pool {pool} has no volume named {name}; `millrace volume list` shows the ones it has"
    ))
}

fn vol_err(e: millrace_volume::VolumeError) -> ApiError {
    let m = e.to_string();
    if m.contains("no volume named") {
        ApiError::not_found(m)
    } else if m.contains("already exists") {
        ApiError::conflict(m)
    } else {
        match e {
            millrace_volume::VolumeError::Refused(_) => bad(m),
            millrace_volume::VolumeError::Io { .. } => ApiError::internal(m),
        }
    }
}
