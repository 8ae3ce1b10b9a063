//! The cache of known pools under MILLRACE_HOME, as mdadm.conf or zpool.cache.

use super::*;

/// The cache of known pools under MILLRACE_HOME: name -> member paths.
#[derive(Default, Serialize, Deserialize)]
pub struct Cache {
    pub pools: BTreeMap<String, CachedPool>,
}

#[derive(Clone, Serialize, Deserialize)]
pub struct CachedPool {
    pub uuid: Uuid,
    pub members: Vec<PathBuf>,
}

impl Cache {
    pub fn home() -> PathBuf {
        std::env::var_os("MILLRACE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("millrace-data"))
    }

    fn file(home: &Path) -> PathBuf {
        home.join("pools.json")
    }

    pub fn load(home: &Path) -> Result<Cache> {
        match std::fs::read(Self::file(home)) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                PoolError(format!(
                    "the pool cache {} is damaged ({e}); delete it and run `millrace pool import DRIVES...`",
                    Self::file(home).display()
                ))
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Cache::default()),
            Err(e) => err(format!("cannot read {}: {e}", Self::file(home).display())),
        }
    }

    /// Writes the cache atomically: a temporary file of this writer's own, synced, renamed
    /// over pools.json, then the folder synced, so a crash leaves the old cache or the new one,
    /// never half of one, and two writers never write into the same temporary file. Callers that
    /// read, change and write it hold [`Cache::lock`] across all three (or use [`Cache::update`]).
    pub fn save(&self, home: &Path) -> Result<()> {
        use std::io::Write;
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        std::fs::create_dir_all(home)
            .map_err(|e| PoolError(format!("cannot create {}: {e}", home.display())))?;
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = home.join(format!("pools.json.{}.{n}.tmp", std::process::id()));
        let body = serde_json::to_vec_pretty(self).expect("the cache is plain data");
        let written = std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(&body).and_then(|_| f.sync_all()))
            .and_then(|_| std::fs::rename(&tmp, Self::file(home)))
            .and_then(|_| std::fs::File::open(home)?.sync_all());
        written.map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            PoolError(format!(
                "cannot write the pool cache in {}: {e}",
                home.display()
            ))
        })
    }

    /// Takes the cache's lock (flock on MILLRACE_HOME/pools.lock), waiting for whoever holds
    /// it: a server and CLI processes then change the cache one after another, none losing
    /// another's entry. Released when the returned file is dropped.
    pub fn lock(home: &Path) -> Result<std::fs::File> {
        use std::os::fd::AsRawFd;
        std::fs::create_dir_all(home)
            .map_err(|e| PoolError(format!("cannot create {}: {e}", home.display())))?;
        let path = home.join("pools.lock");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| PoolError(format!("cannot open {}: {e}", path.display())))?;
        loop {
            // SAFETY: flock on a descriptor we own; closing it releases the lock.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(f);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return err(format!("cannot lock {}: {e}", path.display()));
            }
        }
    }

    /// Reads, changes and writes the cache under its lock; `f` refusing writes nothing.
    pub fn update<T>(home: &Path, f: impl FnOnce(&mut Cache) -> Result<T>) -> Result<T> {
        let _lock = Self::lock(home)?;
        let mut c = Self::load(home)?;
        let r = f(&mut c)?;
        c.save(home)?;
        Ok(r)
    }

    pub fn remember(&mut self, pool: &Pool) {
        self.pools.insert(
            pool.name(),
            CachedPool {
                uuid: pool.uuid(),
                // Spares too: they are found again the same way as members.
                members: pool
                    .member_paths()
                    .into_iter()
                    .flatten()
                    .chain(pool.spare_paths())
                    .map(|p| absolute(&p))
                    .collect(),
            },
        );
    }

    /// Opens a pool by name from its remembered member paths.
    pub fn open(&self, name: &str) -> Result<Pool> {
        let Some(c) = self.pools.get(name) else {
            let known: Vec<&str> = self.pools.keys().map(|s| s.as_str()).collect();
            return err(format!(
                "no pool named '{name}' is known here (known: {}); create it with `millrace pool create` or find it with `millrace pool import DRIVES...`",
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            ));
        };
        let (pools, notes) = Pool::import(&c.members)?;
        let mut pool = pools.into_iter().find(|p| p.uuid() == c.uuid).ok_or_else(|| {
            PoolError(format!(
                "the drives remembered for pool '{name}' no longer hold it ({}); run `millrace pool import DRIVES...`",
                notes.join("; ")
            ))
        })?;
        pool.notes.extend(notes);
        Ok(pool)
    }
}
