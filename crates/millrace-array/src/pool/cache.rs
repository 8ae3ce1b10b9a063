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

    pub fn save(&self, home: &Path) -> Result<()> {
        std::fs::create_dir_all(home)
            .map_err(|e| PoolError(format!("cannot create {}: {e}", home.display())))?;
        let tmp = home.join("pools.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self).unwrap())
            .and_then(|_| std::fs::rename(&tmp, Self::file(home)))
            .map_err(|e| {
                PoolError(format!(
                    "cannot write the pool cache in {}: {e}",
                    home.display()
                ))
            })
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
