//! What the server holds: the open pools with their volumes, the export services, the jobs.
//! Every method is blocking (pools do disk I/O); the API calls them on the blocking pool.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use millrace_array::superblock::MemberState;
use millrace_array::{Cache, CreateOptions, Level, Pool, PoolInfo};
use millrace_volume::{VolumeInfo, Volumes};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use crate::api::ApiError;
use crate::exports::{self, NbdExportConfig, NvmeExportConfig, NBD_PROP, NVME_PROP};
use crate::jobs::Jobs;
use crate::metered::Meters;

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
    pools: RwLock<BTreeMap<String, Arc<PoolEntry>>>,
    /// Pools the cache knows that could not be assembled, with the reason.
    pub unavailable: RwLock<BTreeMap<String, String>>,
    pub nvmf: millrace_nvmf::Target,
    /// The NVMe/RDMA listeners `millrace serve --nvme-rdma` started.
    pub nvme_rdma: parking_lot::Mutex<Vec<millrace_nvmf_rdma::serve::RdmaListener>>,
    pub nbd: Arc<millrace_nbd::NbdServer>,
    pub jobs: Jobs,
    pub meters: Meters,
    /// Listeners of NBD exports that asked for their own socket or address, by export name.
    pub(crate) nbd_listeners: parking_lot::Mutex<
        std::collections::HashMap<String, Vec<tokio::task::JoinHandle<std::io::Result<()>>>>,
    >,
    pub started: Instant,
}

/// A pool as the API shows it: what `pool show --json` prints, plus volumes and counters.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct PoolView {
    #[serde(flatten)]
    pub info: PoolInfo,
    pub volumes: Vec<VolumeInfo>,
    /// Bytes no volume holds, and the largest volume that could be created now (free space
    /// may lie in several ranges); what an orchestrator places volumes by.
    #[serde(default)]
    pub free_bytes: u64,
    #[serde(default)]
    pub largest_free_bytes: u64,
    pub stats: PoolStats,
    /// I/O of each member slot, in member order.
    #[serde(default)]
    pub member_stats: Vec<MemberIo>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct MemberIo {
    pub index: usize,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    pub errors: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct PoolStats {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_ops: u64,
    pub write_ops: u64,
}

#[derive(Deserialize, Debug)]
pub struct CreatePool {
    pub name: String,
    pub level: String,
    pub strip_bytes: Option<u64>,
    pub group: Option<usize>,
    pub drives: Vec<PathBuf>,
    pub create_size_bytes: Option<u64>,
    #[serde(default)]
    pub force: bool,
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

/// The most one raw read or write of a pool may move in one call: the CLI sends larger
/// transfers in pieces, and no request makes the server allocate without bound.
pub const MAX_RAW_IO: u64 = 64 << 20;

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(msg)
}

impl State {
    /// Opens every pool the cache knows and starts the exports they record.
    pub fn open(home: &Path) -> anyhow::Result<State> {
        Self::open_with(home, true)
    }

    /// Opens the pools to change them with no server running (the CLI offline): exports are
    /// checked and recorded in the volumes, and served when `millrace serve` next starts.
    pub fn open_offline(home: &Path) -> anyhow::Result<State> {
        Self::open_with(home, false)
    }

    fn open_with(home: &Path, serving: bool) -> anyhow::Result<State> {
        let cache = Cache::load(home)?;
        let state = State {
            serving,
            nvme_listening: Default::default(),
            nvme_rdma: Default::default(),
            home: home.to_path_buf(),
            pools: RwLock::new(BTreeMap::new()),
            unavailable: RwLock::new(BTreeMap::new()),
            nvmf: millrace_nvmf::Target::new(millrace_nvmf::TargetConfig::default()),
            nbd: Arc::new(millrace_nbd::NbdServer::new()),
            jobs: Jobs::default(),
            meters: Meters::default(),
            nbd_listeners: Default::default(),
            started: Instant::now(),
        };
        for name in cache.pools.keys() {
            match cache.open(name) {
                Ok(pool) => {
                    if let Err(e) = state.adopt(pool) {
                        tracing::error!(pool = %name, "cannot serve the pool: {e}");
                        state.unavailable.write().insert(name.clone(), e.message);
                    }
                }
                Err(e) => {
                    tracing::error!(pool = %name, "cannot assemble the pool: {e}");
                    state
                        .unavailable
                        .write()
                        .insert(name.clone(), e.to_string());
                }
            }
        }
        Ok(state)
    }

    /// Takes an open pool into service and starts the exports its volumes record.
    fn adopt(&self, pool: Pool) -> Result<(), ApiError> {
        let name = pool.name();
        for n in &pool.notes {
            tracing::warn!(pool = %name, "{n}");
        }
        // Volumes write to the array directly: record the pool in use now, so a crash while
        // serving is noticed at the next import and the dirty regions are resynced.
        pool.mark_in_use()
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let volumes = Volumes::open(pool.array().clone()).map_err(|e| bad(e.to_string()))?;
        let entry = Arc::new(PoolEntry { pool, volumes });
        for v in entry.volumes.list().into_iter().filter(|_| self.serving) {
            if let Some(c) = v.props.get(NVME_PROP) {
                match serde_json::from_str::<NvmeExportConfig>(c) {
                    Ok(c) => {
                        if let Err(e) = self.start_nvme(&name, &entry, &v, &c) {
                            tracing::error!(pool = %name, volume = %v.name, "cannot restore the NVMe/TCP export: {}", e.message);
                        }
                    }
                    Err(e) => {
                        tracing::error!(pool = %name, volume = %v.name, "the recorded NVMe/TCP export is unreadable: {e}")
                    }
                }
            }
            if let Some(c) = v.props.get(NBD_PROP) {
                match serde_json::from_str::<NbdExportConfig>(c) {
                    Ok(c) => {
                        if let Err(e) = self.start_nbd(&name, &entry, &v, &c) {
                            tracing::error!(pool = %name, volume = %v.name, "cannot restore the NBD export: {}", e.message);
                        }
                    }
                    Err(e) => {
                        tracing::error!(pool = %name, volume = %v.name, "the recorded NBD export is unreadable: {e}")
                    }
                }
            }
        }
        self.unavailable.write().remove(&name);
        self.pools.write().insert(name, entry);
        Ok(())
    }

    pub fn entry(&self, pool: &str) -> Result<Arc<PoolEntry>, ApiError> {
        self.pools.read().get(pool).cloned().ok_or_else(|| {
            match self.unavailable.read().get(pool) {
                Some(why) => ApiError::conflict(format!("pool {pool} could not be assembled: {why}")),
                None => ApiError::not_found(format!(
                    "no pool named {pool} is served here; `millrace pool list` shows the ones that are"
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
        }
    }

    pub fn create_pool(&self, req: CreatePool) -> Result<PoolView, ApiError> {
        if self.pools.read().contains_key(&req.name) {
            return Err(ApiError::conflict(format!(
                "a pool named {} is already served; pick another name",
                req.name
            )));
        }
        let level: Level = req.level.parse().map_err(|e: String| bad(e))?;
        let opts = CreateOptions {
            name: req.name.clone(),
            level,
            strip: req.strip_bytes.unwrap_or(64 << 10),
            group: req.group,
            data_offset: None,
            create_size: req.create_size_bytes,
            force: req.force,
        };
        let pool = Pool::create(&opts, &req.drives).map_err(|e| bad(e.to_string()))?;
        for n in &pool.notes {
            tracing::warn!(pool = %req.name, "{n}");
        }
        if !pool.superblock().clean {
            // Parity of drives that held something else is made consistent before any use.
            pool.resync(|_, _| {})
                .map_err(|e| ApiError::internal(format!("cannot initialise the parity: {e}")))?;
        }
        let mut cache = Cache::load(&self.home).map_err(|e| ApiError::internal(e.to_string()))?;
        cache.remember(&pool);
        cache
            .save(&self.home)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        self.adopt(pool)?;
        let e = self.entry(&req.name)?;
        Ok(self.pool_view(&e))
    }

    /// Assembles the pools found on these drives and serves them.
    pub fn import(
        &self,
        drives: &[PathBuf],
        force: bool,
    ) -> Result<(Vec<PoolView>, Vec<String>), ApiError> {
        let (pools, mut notes) =
            Pool::import_with(drives, force).map_err(|e| bad(e.to_string()))?;
        if pools.is_empty() {
            return Err(bad(format!(
                "no Millrace pool was found on the {} drives given{}",
                drives.len(),
                if notes.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", notes.join("; "))
                }
            )));
        }
        let mut cache = Cache::load(&self.home).map_err(|e| ApiError::internal(e.to_string()))?;
        let mut names = Vec::new();
        for p in pools {
            let name = p.name();
            if self.pools.read().contains_key(&name) {
                notes.push(format!("pool '{name}' is already served; left as it is"));
                continue;
            }
            notes.extend(p.notes.iter().cloned());
            cache.remember(&p);
            self.adopt(p)?;
            names.push(name);
        }
        cache
            .save(&self.home)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        // Their exports started with them; their shares come back on those now, as at startup.
        if self.serving && !names.is_empty() {
            notes.extend(self.restore_shares_of(Some(&names)));
        }
        let views = names
            .iter()
            .filter_map(|n| self.entry(n).ok())
            .map(|e| self.pool_view(&e))
            .collect();
        Ok((views, notes))
    }

    /// Raw bytes of a pool, for `millrace io` and scripts.
    pub fn read_pool(&self, pool: &str, offset: u64, len: u64) -> Result<Vec<u8>, ApiError> {
        let e = self.entry(pool)?;
        let size = e.pool.array().size_bytes();
        if len > MAX_RAW_IO {
            return Err(bad(format!(
                "at most {MAX_RAW_IO} bytes can be read in one call; read {len} bytes in several"
            )));
        }
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(bad(format!(
                "the range {offset}+{len} lies past the end of pool {pool} ({size} bytes)"
            )));
        }
        let mut buf = vec![0u8; len as usize];
        e.pool
            .read_at(offset, &mut buf)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        Ok(buf)
    }

    pub fn write_pool(&self, pool: &str, offset: u64, data: &[u8]) -> Result<(), ApiError> {
        let e = self.entry(pool)?;
        let size = e.pool.array().size_bytes();
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|end| end > size)
        {
            return Err(bad(format!(
                "{} bytes at offset {offset} run past the end of pool {pool} ({size} bytes)",
                data.len()
            )));
        }
        e.pool
            .write_at(offset, data)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        // What the API acknowledges is durable, as `millrace io write` without a server.
        e.pool
            .array()
            .flush()
            .map_err(|e| ApiError::internal(e.to_string()))
    }

    pub fn destroy_pool(&self, name: &str) -> Result<(), ApiError> {
        // A reference of our own would keep the entry shared and make the unwrap below fail.
        let volumes = self.entry(name)?.volumes.list();
        if let Some(v) = volumes.iter().find(|v| exports::is_exported(v)) {
            return Err(ApiError::conflict(format!(
                "pool {name} still exports volume {}; remove its exports first (`millrace export ... remove {name}/{}`)",
                v.name, v.name
            )));
        }
        if self.jobs.running_for(name) {
            return Err(ApiError::conflict(format!(
                "a rebuild or scrub of pool {name} is running; wait for it to finish"
            )));
        }
        let e = self.pools.write().remove(name).expect("checked above");
        let entry = match Arc::try_unwrap(e) {
            Ok(entry) => entry,
            Err(e) => {
                self.pools.write().insert(name.to_string(), e);
                return Err(ApiError::conflict(format!(
                    "pool {name} is in use by a request; try again"
                )));
            }
        };
        entry
            .pool
            .destroy()
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let mut cache = Cache::load(&self.home).map_err(|e| ApiError::internal(e.to_string()))?;
        cache.pools.remove(name);
        cache
            .save(&self.home)
            .map_err(|e| ApiError::internal(e.to_string()))
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

    fn remember(&self, e: &PoolEntry) {
        if let Ok(mut c) = Cache::load(&self.home) {
            c.remember(&e.pool);
            if let Err(err) = c.save(&self.home) {
                tracing::warn!("{err}");
            }
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
        if exports::is_exported(&v) {
            return Err(ApiError::conflict(format!(
                "volume {pool}/{name} is exported ({}); remove the export first",
                exports::describe(&v)
            )));
        }
        e.volumes.delete(name).map_err(vol_err)
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
