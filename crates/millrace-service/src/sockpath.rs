//! The Unix socket of an NBD export that asked for its own (`export nbd add --socket PATH`).
//! The path comes from a client of the API, so the server replaces nothing there but a stale
//! socket (one nobody listens on), and later deletes nothing but the very socket it made (same
//! device and inode, still a socket): a pool's drive, a directory, a symbolic link or a live
//! socket at PATH is refused with a sentence, and a file put there after the export started
//! outlives the export's removal (issue #16 item 6).

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The sockets this process made: path to (device, inode).
static OURS: Mutex<Option<HashMap<PathBuf, (u64, u64)>>> = Mutex::new(None);

fn ours() -> std::sync::MutexGuard<'static, Option<HashMap<PathBuf, (u64, u64)>>> {
    OURS.lock().unwrap_or_else(|e| e.into_inner())
}

/// What is at `path`, in words, when it is something the server must not replace.
fn refuse(path: &Path, m: &std::fs::Metadata) -> Option<String> {
    let t = m.file_type();
    let what = if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file (a pool's drive file, perhaps, or someone's data)"
    } else if t.is_socket() {
        return None;
    } else {
        "a device or a named pipe"
    };
    Some(format!(
        "{} is {what}; an NBD export's socket replaces nothing but a stale socket: give a path where nothing is",
        path.display()
    ))
}

/// Binds a listening socket at `path`, creating its folder. Refused with a sentence when
/// something other than a stale socket is there.
pub(crate) fn bind(path: &Path) -> Result<UnixListener, String> {
    let cannot = |e: io::Error| format!("cannot listen for NBD on {}: {e}", path.display());
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(cannot)?;
    }
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(cannot(e)),
        Ok(m) => {
            if let Some(why) = refuse(path, &m) {
                return Err(why);
            }
            match UnixStream::connect(path) {
                Ok(_) => {
                    return Err(format!(
                    "something already listens on {} (another server or export); give another path",
                    path.display()
                ))
                }
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    // Stale: its server is gone. Removed only if it is still that socket.
                    let same = std::fs::symlink_metadata(path)
                        .is_ok_and(|n| n.file_type().is_socket() && n.ino() == m.ino());
                    if same {
                        std::fs::remove_file(path).map_err(cannot)?;
                    }
                }
                Err(e) => return Err(cannot(e)),
            }
        }
    }
    let l = UnixListener::bind(path).map_err(cannot)?;
    let m = std::fs::symlink_metadata(path).map_err(cannot)?;
    ours()
        .get_or_insert_with(HashMap::new)
        .insert(path.to_path_buf(), (m.dev(), m.ino()));
    Ok(l)
}

/// Removes the socket at `path` if it is the one [`bind`] made; anything else is left alone.
pub(crate) fn remove(path: &Path) {
    let Some(id) = ours().as_mut().and_then(|m| m.remove(path)) else {
        return;
    };
    let still = std::fs::symlink_metadata(path)
        .is_ok_and(|m| m.file_type().is_socket() && (m.dev(), m.ino()) == id);
    if still {
        let _ = std::fs::remove_file(path);
    } else {
        tracing::warn!(
            "{} is no longer the NBD socket this server made; left as it is",
            path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_new_path_or_a_stale_socket_is_taken() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("drive.img");
        std::fs::write(&file, b"pool data").unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(d.path().join("nowhere"), &link).unwrap();
        for (p, what) in [
            (&file, "a regular file"),
            (&d.path().to_path_buf(), "a directory"),
            (&link, "a symbolic link"),
        ] {
            let e = bind(p).unwrap_err();
            assert!(e.contains(what), "{e}");
        }
        assert_eq!(std::fs::read(&file).unwrap(), b"pool data");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());

        // A live socket is refused; once its listener is gone (stale), it is taken.
        let s = d.path().join("sub/nbd.sock");
        let live = bind(&s).unwrap();
        assert!(bind(&s).unwrap_err().contains("already listens"));
        drop(live);
        let l = bind(&s).unwrap();
        // Removal deletes our socket...
        remove(&s);
        assert!(!s.exists());
        drop(l);
        // ... but not a file that took its place.
        let _l = bind(&s).unwrap();
        std::fs::remove_file(&s).unwrap();
        std::fs::write(&s, b"not ours").unwrap();
        remove(&s);
        assert_eq!(std::fs::read(&s).unwrap(), b"not ours");
    }
}
