//! How the CLI on this machine finds the server that runs for a home: the file it leaves there,
//! its NBD socket and the lock it holds for its whole life. Here, below both, because the CLI
//! reads what the server writes.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What `millrace serve` leaves in MILLRACE_HOME while it runs, so the CLI finds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServerFile {
    pub url: String,
    pub pid: u32,
    pub nbd_socket: PathBuf,
    /// The API's certificate when it speaks HTTPS, for the CLI on this machine to trust.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
}

pub fn server_file(home: &Path) -> PathBuf {
    home.join("server.json")
}

pub fn nbd_socket(home: &Path) -> PathBuf {
    home.join("nbd.sock")
}

/// The file a running server holds locked (flock) for its whole life: the lock, not the pid in
/// server.json, says whether a server runs, so a dead server's record (its pid reused by
/// another process) never blocks a start or the CLI.
pub fn server_lock(home: &Path) -> PathBuf {
    home.join("server.lock")
}

/// Whether a live server holds `home` (its lock is taken).
pub fn server_running(home: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(server_lock(home)) else {
        return false;
    };
    // SAFETY: flock on a descriptor this function owns; closing it releases a lock it took.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    r != 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
}
