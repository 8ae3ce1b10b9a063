//! NVMe/TCP's secure channel (TLS 1.3 with PSKs) for NVMe exports: the hosts' configured PSKs
//! (`NVMeTLSkey-1:HH:BASE64:`), kept in MILLRACE_HOME/tls-psk.json (mode 0600, replaced
//! atomically, never in the volume's props so they do not travel with the pool's drives), as
//! the DH-HMAC-CHAP secrets are (`nvme_auth`), handed to the target when an export's subsystem
//! is created and when a host's key is set. The API shows which hosts have one, never the key.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Whether the kernel lists kernel TLS (TLS connections need it).
pub use millrace_nvmf::tls::kernel_tls_listed;
use millrace_nvmf::tls::Psk;
/// Whether an NVMe/TCP listener requires TLS (`millrace serve --nvme-tls`).
pub use millrace_nvmf::tls::TlsMode;

use crate::error::ApiError;

static STORE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Per export (POOL/VOLUME), per host NQN, the key in the interchange form.
type Store = BTreeMap<String, BTreeMap<String, String>>;

pub fn store_path(home: &Path) -> PathBuf {
    home.join("tls-psk.json")
}

fn load(home: &Path) -> Result<Store, ApiError> {
    match std::fs::read_to_string(store_path(home)) {
        Ok(t) => serde_json::from_str(&t).map_err(|e| {
            ApiError::internal(format!(
                "{} is unreadable ({e}); the exports' TLS PSKs cannot be loaded",
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

fn save(home: &Path, s: &Store) -> Result<(), ApiError> {
    let path = store_path(home);
    let tmp = home.join(format!(".tls-psk.json.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(serde_json::to_string_pretty(s)?.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(home)?.sync_all()
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        ApiError::internal(format!("cannot write {}: {e}", path.display()))
    })
}

fn key(pool: &str, vol: &str) -> String {
    format!("{pool}/{vol}")
}

/// Checks a PSK in the interchange form; the error (a sentence) never quotes it.
pub fn check_psk(s: &str) -> Result<String, String> {
    Psk::parse(s).map(|_| s.trim().to_string())
}

/// Parses a host's PSK for the target (errors never quote it).
pub(crate) fn parse(s: &str) -> Result<Psk, ApiError> {
    Psk::parse(s).map_err(|e| ApiError::bad_request(format!("the TLS PSK is refused: {e}")))
}

/// The PSKs of an export's hosts, for creating its subsystem.
pub(crate) fn psks_of(home: &Path, pool: &str, vol: &str) -> Result<Vec<(String, Psk)>, ApiError> {
    let s = load(home)?;
    (s.get(&key(pool, vol)).into_iter().flatten())
        .map(|(h, k)| Ok((h.clone(), parse(k)?)))
        .collect()
}

/// Sets (Some) or forgets (None) one host's PSK, or (host None) every host's of the export.
pub(crate) fn set(
    home: &Path,
    pool: &str,
    vol: &str,
    host: Option<&str>,
    psk: Option<&str>,
) -> Result<(), ApiError> {
    let _one = STORE.lock().unwrap_or_else(|e| e.into_inner());
    let mut s = load(home)?;
    let k = key(pool, vol);
    let before = s.clone();
    match (host, psk) {
        (Some(h), Some(p)) => {
            s.entry(k).or_default().insert(h.into(), p.trim().into());
        }
        (Some(h), None) => {
            if let Some(e) = s.get_mut(&k) {
                e.remove(h);
                if e.is_empty() {
                    s.remove(&k);
                }
            }
        }
        (None, _) => {
            s.remove(&k);
        }
    }
    if s != before {
        save(home, &s)?;
    }
    Ok(())
}

/// The export's hosts that have a PSK, sorted.
pub(crate) fn hosts(home: &Path, pool: &str, vol: &str) -> Vec<String> {
    let s = load(home).unwrap_or_default();
    s.get(&key(pool, vol))
        .map(|e| e.keys().cloned().collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const KEY: &str = "NVMeTLSkey-1:01:EBESExQVFhcYGRobHB0eHyAhIiMkJSYnKCkqKywtLi9A/ow7:";

    #[test]
    fn psks_are_kept_private_and_forgotten() {
        let d = std::env::temp_dir().join(format!("millrace-tls-psk-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        set(&d, "tank", "v", Some("nqn.h1"), Some(&format!("{KEY}\n"))).unwrap();
        let mode = std::fs::metadata(store_path(&d))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(hosts(&d, "tank", "v"), vec!["nqn.h1".to_string()]);
        assert_eq!(psks_of(&d, "tank", "v").unwrap().len(), 1);
        let e = parse("NVMeTLSkey-1:01:AAAA:").unwrap_err().to_string();
        assert!(e.contains("TLS PSK is refused"), "{e}");
        set(&d, "tank", "v", Some("nqn.h1"), None).unwrap();
        assert!(hosts(&d, "tank", "v").is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
