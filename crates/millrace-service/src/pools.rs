//! Pools coming into and going out of service: opening the ones the cache knows (and starting
//! the exports their volumes record), creating, importing and destroying. Above `exports` and
//! `shares`, because a pool taken into service brings its exports and shares back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use millrace_array::{Cache, CreateOptions, Level, Pool};
use millrace_volume::Volumes;
use parking_lot::RwLock;

use crate::error::ApiError;
use crate::jobs::Jobs;
use crate::metered::Meters;
use crate::model::{CreatePool, PoolView, MAX_RAW_IO};
use crate::props::{self, NbdExportConfig, NvmeExportConfig, NBD_PROP, NVME_PROP};
use crate::state::{bad, PoolEntry, State};

impl State {
    /// Opens every pool the cache knows and starts the exports they record.
    pub fn open(home: &Path) -> anyhow::Result<State> {
        Self::open_with(home, true, None)
    }

    /// Opens the pools to change them with no server running (the CLI offline): exports are
    /// checked and recorded in the volumes, and served when `millrace serve` next starts.
    pub fn open_offline(home: &Path) -> anyhow::Result<State> {
        Self::open_with(home, false, None)
    }

    /// As `open_offline`, opening only the pools named (a command about one pool leaves the
    /// others' drives alone, and is not stopped by one that cannot be assembled).
    pub fn open_offline_only(home: &Path, names: &[&str]) -> anyhow::Result<State> {
        Self::open_with(home, false, Some(names))
    }

    fn open_with(home: &Path, serving: bool, only: Option<&[&str]>) -> anyhow::Result<State> {
        let cache = Cache::load(home)?;
        let nvmf = millrace_nvmf::Target::new(millrace_nvmf::TargetConfig::default());
        let resv_files = crate::nvme_resv::ResvFiles::new(home);
        if serving {
            nvmf.set_reservation_store(resv_files.store())?;
        }
        let state = State {
            serving,
            nvme_listening: Default::default(),
            nvme_rdma: Default::default(),
            home: home.to_path_buf(),
            pools: RwLock::new(BTreeMap::new()),
            unavailable: RwLock::new(BTreeMap::new()),
            nvmf,
            resv_files,
            nbd: Arc::new(millrace_nbd::NbdServer::new()),
            data_path: Default::default(),
            jobs: Jobs::default(),
            meters: Meters::default(),
            nbd_listeners: Default::default(),
            started: Instant::now(),
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            previous_stop_unclean: false,
            found_unclean: Default::default(),
            bench_memory: crate::DEFAULT_BENCH_MEMORY,
        };
        let wanted = |n: &String| only.is_none_or(|o| o.contains(&n.as_str()));
        for name in cache.pools.keys().filter(|n| wanted(n)) {
            // A server logs why; the CLI without one says it where the pool is asked for.
            let (what, why) = match cache.open(name) {
                Ok(pool) => match state.adopt(pool) {
                    Ok(()) => continue,
                    Err(e) => ("serve", e.message),
                },
                Err(e) => ("assemble", e.to_string()),
            };
            if serving {
                tracing::error!(pool = %name, "cannot {what} the pool: {why}");
            }
            state.unavailable.write().insert(name.clone(), why);
        }
        Ok(state)
    }

    /// Takes an open pool into service and starts the exports its volumes record.
    fn adopt(&self, pool: Pool) -> Result<(), ApiError> {
        let name = pool.name();
        // A server logs them; the CLI without one prints them from the pool's view.
        for n in pool.notes.iter().filter(|_| self.serving) {
            tracing::warn!(pool = %name, "{n}");
        }
        if self.serving && pool.found_unclean {
            self.found_unclean.write().push(name.clone());
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

    /// Creates a pool and records it, with the pool cache locked throughout: two creates of
    /// one name (here, or one here and one by the CLI) cannot both succeed, and none loses the
    /// other's entry. A create that fails after it wrote superblocks erases them again.
    pub fn create_pool(&self, req: CreatePool) -> Result<PoolView, ApiError> {
        let level: Level = req.level.parse().map_err(|e: String| bad(e))?;
        let internal = |e: millrace_array::PoolError| ApiError::internal(e.to_string());
        let _lock = Cache::lock(&self.home).map_err(internal)?;
        let mut cache = Cache::load(&self.home).map_err(internal)?;
        if self.pools.read().contains_key(&req.name) || cache.pools.contains_key(&req.name) {
            return Err(ApiError::conflict(format!(
                "a pool named '{name}' already exists; pick another name, or destroy it first with `millrace pool destroy {name} --yes`",
                name = req.name
            )));
        }
        let opts = CreateOptions {
            name: req.name.clone(),
            level,
            strip: req.strip_bytes.unwrap_or(64 << 10),
            group: req.group,
            data_offset: req.data_offset_bytes,
            create_size: req.create_size_bytes,
            force: req.force,
        };
        // Its notes are logged (or, without a server, printed) when it is adopted below.
        let pool = Pool::create(&opts, &req.drives).map_err(|e| bad(e.to_string()))?;
        let recorded = match pool.superblock().clean {
            true => Ok(()),
            // Parity of drives that held something else is made consistent before any use.
            false => pool
                .resync(|_, _| {})
                .map_err(|e| ApiError::internal(format!("cannot initialise the parity: {e}"))),
        }
        .and_then(|_| {
            cache.remember(&pool);
            cache.save(&self.home).map_err(internal)
        });
        if let Err(e) = recorded {
            // Nothing may be left on the drives that a later import would take for a pool.
            if let Err(undo) = pool.destroy() {
                tracing::error!(pool = %req.name, "cannot erase the superblocks of a failed create: {undo}");
            }
            return Err(e);
        }
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
        let internal = |e: millrace_array::PoolError| ApiError::internal(e.to_string());
        let _lock = Cache::lock(&self.home).map_err(internal)?;
        let mut cache = Cache::load(&self.home).map_err(internal)?;
        let mut names = Vec::new();
        for p in pools {
            let name = p.name();
            if self.pools.read().contains_key(&name) {
                notes.push(format!("pool '{name}' is already served; left as it is"));
                continue;
            }
            notes.extend(p.notes.iter().cloned());
            cache.remember(&p);
            // A pool found offline is remembered and reported, and does not hide what was
            // found on the other drives (the notes say why it is offline).
            match self.adopt(p) {
                Ok(()) => names.push(name),
                Err(e) => {
                    notes.push(format!(
                        "pool '{name}' was found but cannot be used: {}",
                        e.message
                    ));
                    self.unavailable.write().insert(name, e.message);
                }
            }
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
        if let Some(v) = volumes.iter().find(|v| props::is_exported(v)) {
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
        let names: Vec<String> = volumes.iter().map(|v| v.name.clone()).collect();
        self.requests_out(name, &names)?;
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
        Cache::update(&self.home, |c| {
            c.pools.remove(name);
            Ok(())
        })
        .map_err(|e| ApiError::internal(e.to_string()))
    }
}
