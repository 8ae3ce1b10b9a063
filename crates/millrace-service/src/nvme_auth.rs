//! In-band authentication (DH-HMAC-CHAP) of NVMe exports: the hosts' secrets, kept in
//! MILLRACE_HOME/dhchap.json (mode 0600, replaced atomically, never in the volume's props so
//! they do not travel with the pool's drives), handed to the target when an export's subsystem
//! is created and when a host's secrets are set or rotated. The API never returns them: it
//! shows, per host, whether it authenticates (`host`) and the controller too
//! (`bidirectional`).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use millrace_nvmf::dhchap::{HostKeys, Secret};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// Serialises reading, changing and writing the store.
static STORE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One host's secrets in the `DHHC-1` form.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct StoredKeys {
    host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ctrl: Option<String>,
}

/// Per export (POOL/VOLUME), per host NQN.
type Store = BTreeMap<String, BTreeMap<String, StoredKeys>>;

pub fn store_path(home: &Path) -> PathBuf {
    home.join("dhchap.json")
}

fn load(home: &Path) -> Result<Store, ApiError> {
    match std::fs::read_to_string(store_path(home)) {
        Ok(t) => serde_json::from_str(&t).map_err(|e| {
            ApiError::internal(format!(
                "{} is unreadable ({e}); the exports' DH-HMAC-CHAP secrets cannot be loaded",
                store_path(home).display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Store::new()),
        Err(e) => Err(ApiError::internal(format!(
            "cannot read {}: {e}",
            store_path(home).display()
        ))),
    }
}

/// Writes the store to a temporary file created 0600, then renames it over the old one.
fn save(home: &Path, s: &Store) -> Result<(), ApiError> {
    let path = store_path(home);
    let tmp = home.join(format!(".dhchap.json.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(serde_json::to_string_pretty(s).unwrap().as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(home)?.sync_all()
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        ApiError::internal(format!("cannot write {}: {e}", path.display()))
    })
}

/// Reads, changes and writes the store as one step; returns what `change` returned.
fn update<T>(home: &Path, change: impl FnOnce(&mut Store) -> T) -> Result<T, ApiError> {
    let _one = STORE.lock().unwrap_or_else(|e| e.into_inner());
    let mut s = load(home)?;
    let t = change(&mut s);
    save(home, &s)?;
    Ok(t)
}

fn key(pool: &str, vol: &str) -> String {
    format!("{pool}/{vol}")
}

fn parse(what: &str, s: &str) -> Result<Secret, ApiError> {
    Secret::parse(s).map_err(|e| ApiError::bad_request(format!("the {what} is refused: {e}")))
}

/// Checks a secret in the `DHHC-1` form and gives it back as the target will keep it; the
/// error (a sentence) never quotes it. For clients (the CLI) that check before sending.
pub fn check_secret(s: &str) -> Result<String, String> {
    Secret::parse(s).map(|s| s.encode())
}

/// Parses a host's secret and optional controller secret (errors never quote them).
pub fn parse_keys(host: &str, ctrl: Option<&str>) -> Result<HostKeys, ApiError> {
    Ok(HostKeys {
        host: parse("DH-HMAC-CHAP secret", host)?,
        ctrl: ctrl
            .map(|c| parse("DH-HMAC-CHAP controller secret", c))
            .transpose()?,
    })
}

fn to_keys(k: &StoredKeys) -> Result<HostKeys, ApiError> {
    parse_keys(&k.host, k.ctrl.as_deref())
}

fn stored(k: &HostKeys) -> StoredKeys {
    StoredKeys {
        host: k.host.encode(),
        ctrl: k.ctrl.as_ref().map(Secret::encode),
    }
}

/// The secrets of an export's hosts, for creating its subsystem.
pub(crate) fn keys_of(
    home: &Path,
    pool: &str,
    vol: &str,
) -> Result<Vec<(String, HostKeys)>, ApiError> {
    let s = load(home)?;
    (s.get(&key(pool, vol)).into_iter().flatten())
        .map(|(h, k)| Ok((h.clone(), to_keys(k)?)))
        .collect()
}

/// Records `keys` for `hosts` of a new export (before its subsystem is created).
pub(crate) fn record(
    home: &Path,
    pool: &str,
    vol: &str,
    hosts: &[String],
    keys: &HostKeys,
) -> Result<(), ApiError> {
    update(home, |s| {
        let e = s.entry(key(pool, vol)).or_default();
        for h in hosts {
            e.insert(h.clone(), stored(keys));
        }
    })
}

/// Records (sets or replaces) the secrets of one host of an export.
pub(crate) fn set(
    home: &Path,
    pool: &str,
    vol: &str,
    host: &str,
    keys: &HostKeys,
) -> Result<(), ApiError> {
    update(home, |s| {
        s.entry(key(pool, vol))
            .or_default()
            .insert(host.to_string(), stored(keys));
    })
}

/// Forgets the secrets of one host (Some) or of the whole export (None).
pub(crate) fn forget(
    home: &Path,
    pool: &str,
    vol: &str,
    host: Option<&str>,
) -> Result<(), ApiError> {
    let _one = STORE.lock().unwrap_or_else(|e| e.into_inner());
    let mut s = load(home)?;
    let k = key(pool, vol);
    let changed = match host {
        None => s.remove(&k).is_some(),
        Some(h) => {
            let c = s.get_mut(&k).is_some_and(|e| e.remove(h).is_some());
            if s.get(&k).is_some_and(|e| e.is_empty()) {
                s.remove(&k);
            }
            c
        }
    };
    if changed {
        save(home, &s)?;
    }
    Ok(())
}

/// What the export view shows of each allowed host's authentication: none, host or
/// bidirectional.
pub(crate) fn modes(
    home: &Path,
    pool: &str,
    vol: &str,
    hosts: &[String],
) -> BTreeMap<String, String> {
    let s = load(home).unwrap_or_default();
    let e = s.get(&key(pool, vol));
    let keyed = e.into_iter().flat_map(|e| e.keys());
    (hosts.iter().chain(keyed))
        .map(|h| {
            let m = match e.and_then(|e| e.get(h)) {
                None => "none",
                Some(StoredKeys { ctrl: None, .. }) => "host",
                Some(_) => "bidirectional",
            };
            (h.clone(), m.to_string())
        })
        .collect()
}
