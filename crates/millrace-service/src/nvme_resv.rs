//! The NVMe reservations that persist through power loss (a host set PTPL), recorded in the
//! server's home, one file per exported volume (`nvme-reservations/VOLUME-UUID.json`), so they
//! survive `millrace serve` restarting: the NVMe-oF target calls the store this module gives
//! it before it completes a command that changed such a state, and an export coming into
//! service gets its record back. Each record is written whole (a temporary file, flushed,
//! renamed over the old one, the folder flushed): a crash leaves the old record or the new.
//! Never beside the members: a record is the server's, not the pool's. Below `state` and
//! `exports`; depends on no other module of the server.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use millrace_nvmf::{Registrant, ReservationState, ReservationStore, ReservationType};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// The folder under the home that holds the records.
pub const DIR: &str = "nvme-reservations";

/// Where the records of the exports in service are.
pub struct ResvFiles {
    dir: PathBuf,
    /// Each live subsystem's record, by NQN.
    by_nqn: Mutex<HashMap<String, Attached>>,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct Record {
    nqn: String,
    pool: String,
    volume: String,
    nsid: u32,
    generation: u32,
    ptpl: bool,
    #[serde(rename = "type")]
    rtype: Option<String>,
    /// The holder's host identifier (32 hex digits); none for the all-registrants types.
    holder: Option<String>,
    registrants: Vec<RecordedRegistrant>,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct RecordedRegistrant {
    hostid: String,
    /// 0x and 16 hex digits.
    key: String,
    hostnqn: String,
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex_id(s: &str) -> Result<[u8; 16], String> {
    let bad = || format!("'{s}' is not a host identifier of 32 hex digits");
    if s.len() != 32 || !s.is_ascii() {
        return Err(bad());
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(id)
}

/// A reservation key as the API and the records write it.
pub fn key_text(k: u64) -> String {
    format!("{k:#018x}")
}

fn unkey(s: &str) -> Result<u64, String> {
    let digits = s.strip_prefix("0x").unwrap_or(s);
    u64::from_str_radix(digits, 16).map_err(|_| format!("'{s}' is not a reservation key"))
}

impl Record {
    fn of(nqn: &str, at: (&str, &str), nsid: u32, st: &ReservationState) -> Record {
        Record {
            nqn: nqn.to_string(),
            pool: at.0.to_string(),
            volume: at.1.to_string(),
            nsid,
            generation: st.generation,
            ptpl: st.ptpl,
            rtype: st.rtype.map(|t| t.as_str().to_string()),
            holder: st.holder.map(|h| hex(&h)),
            registrants: (st.registrants.iter())
                .map(|r| RecordedRegistrant {
                    hostid: hex(&r.hostid),
                    key: key_text(r.key),
                    hostnqn: r.hostnqn.clone(),
                })
                .collect(),
        }
    }

    fn state(&self) -> Result<ReservationState, String> {
        let rtype = match &self.rtype {
            None => None,
            Some(t) => Some(
                (ReservationType::ALL.into_iter())
                    .find(|x| x.as_str() == t)
                    .ok_or_else(|| format!("'{t}' is not a reservation type"))?,
            ),
        };
        let mut registrants = Vec::with_capacity(self.registrants.len());
        for r in &self.registrants {
            registrants.push(Registrant {
                hostid: unhex_id(&r.hostid)?,
                key: unkey(&r.key)?,
                hostnqn: r.hostnqn.clone(),
            });
        }
        let st = ReservationState {
            generation: self.generation,
            ptpl: self.ptpl,
            rtype,
            holder: self.holder.as_deref().map(unhex_id).transpose()?,
            registrants,
        };
        st.check()?;
        Ok(st)
    }
}

/// Writes `bytes` to `path` whole: a temporary file beside it, flushed, renamed over it, and
/// the folder flushed so the rename itself is durable.
fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

fn remove_durably(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

impl ResvFiles {
    pub fn new(home: &Path) -> Arc<ResvFiles> {
        Arc::new(ResvFiles {
            dir: home.join(DIR),
            by_nqn: Mutex::new(HashMap::new()),
        })
    }

    /// The record of the volume with this uuid.
    pub fn path(&self, volume_uuid: &str) -> PathBuf {
        self.dir.join(format!("{volume_uuid}.json"))
    }

    /// What the target calls to record a namespace's state (None: forget it). The target
    /// calls it for one namespace at a time, so one record is never written twice at once.
    pub fn store(self: &Arc<Self>) -> ReservationStore {
        let files = self.clone();
        Arc::new(move |nqn, nsid, st| files.record(nqn, nsid, st))
    }

    fn record(&self, nqn: &str, nsid: u32, st: Option<&ReservationState>) -> std::io::Result<()> {
        let Some(a) = self.by_nqn.lock().get(nqn).cloned() else {
            return Err(std::io::Error::other(format!(
                "subsystem {nqn} is not an export of this server, so its reservations have nowhere to be recorded"
            )));
        };
        let Some(st) = st else {
            return remove_durably(&a.path);
        };
        let r = Record::of(nqn, (&a.pool, &a.volume), nsid, st);
        let text = serde_json::to_vec_pretty(&r).map_err(std::io::Error::other)?;
        write_whole(&a.path, &text)
    }

    /// An export of `pool`/`volume` (its uuid) serves as subsystem `nqn` from now on: its
    /// changes are recorded, and its record (namespace id and state), if it has one, is
    /// returned. A record that cannot be read is set aside (renamed `.unreadable`) with an
    /// error in the log, and the export starts without reservations.
    pub fn attach(
        &self,
        nqn: &str,
        pool: &str,
        volume: &str,
        uuid: &str,
    ) -> Option<(u32, ReservationState)> {
        let path = self.path(uuid);
        let a = Attached {
            path: path.clone(),
            pool: pool.to_string(),
            volume: volume.to_string(),
        };
        self.by_nqn.lock().insert(nqn.to_string(), a);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::error!(pool, volume, "cannot read the NVMe reservations recorded in {}: {e}; the export starts without them", path.display());
                return None;
            }
        };
        let read = serde_json::from_slice::<Record>(&bytes)
            .map_err(|e| e.to_string())
            .and_then(|r| Ok((r.nsid, r.state()?)));
        match read {
            Ok(x) => Some(x),
            Err(why) => {
                let aside = path.with_extension("json.unreadable");
                let _ = std::fs::rename(&path, &aside);
                tracing::error!(pool, volume, "the NVMe reservations recorded in {} are unreadable ({why}); set aside as {}, the export starts without them", path.display(), aside.display());
                None
            }
        }
    }

    /// The subsystem stopped serving (its record stays for its next start).
    pub fn detach(&self, nqn: &str) {
        self.by_nqn.lock().remove(nqn);
    }

    /// The export was removed: its record goes with it.
    pub fn forget(&self, uuid: &str) -> std::io::Result<()> {
        remove_durably(&self.path(uuid))
    }
}

#[derive(Clone)]
struct Attached {
    path: PathBuf,
    pool: String,
    volume: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_ones_are_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let files = ResvFiles::new(dir.path());
        let store = files.store();
        let st = ReservationState {
            generation: 7,
            ptpl: true,
            rtype: Some(ReservationType::WriteExclusive),
            holder: Some([0xab; 16]),
            registrants: vec![Registrant {
                hostid: [0xab; 16],
                key: u64::MAX,
                hostnqn: "nqn.h".into(),
            }],
        };
        let e = store("nqn.x", 1, Some(&st)).unwrap_err().to_string();
        assert!(e.contains("not an export"), "{e}");
        assert_eq!(files.attach("nqn.x", "tank", "v", "u1"), None);
        store("nqn.x", 1, Some(&st)).unwrap();
        let text = std::fs::read_to_string(files.path("u1")).unwrap();
        assert!(text.contains("\"write-exclusive\"") && text.contains("0xffffffffffffffff"));
        files.detach("nqn.x");
        assert_eq!(files.attach("nqn.y", "tank", "v", "u1"), Some((1, st)));
        store("nqn.y", 1, None).unwrap();
        assert!(!files.path("u1").exists());
        std::fs::write(files.path("u2"), b"{\"nqn\": 1}").unwrap();
        assert_eq!(files.attach("nqn.z", "tank", "w", "u2"), None);
        assert!(files.path("u2").with_extension("json.unreadable").exists());
        files.forget("u1").unwrap();
    }
}
