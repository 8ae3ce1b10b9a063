//! `millrace serve`: runs the `millrace-server` program installed beside this one, in this
//! process's place (exec: the same pid, signals and exit status, so systemd, scripts and tests
//! see the server itself). The server is a program of its own so that this one, which every
//! other command runs, links no HTTP stack, TLS or RDMA binding (docs/ARCHITECTURE.md).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};

/// The server's program name, looked for in the directory of the running `millrace`.
const SERVER_PROGRAM: &str = "millrace-server";

/// Where the server's program is: beside the running `millrace` (an install copies both into
/// one directory, and cargo builds both into one target folder).
fn server_program() -> Result<PathBuf> {
    let me = std::env::current_exe().context("cannot find where this millrace program is")?;
    let path = me.with_file_name(SERVER_PROGRAM);
    if !path.is_file() {
        return Err(anyhow!(
            "`millrace serve` runs the {SERVER_PROGRAM} program, which is not beside this millrace ({} is missing); install it into the same directory (cargo build --workspace --bins builds both)",
            path.display()
        ));
    }
    Ok(path)
}

/// Replaces this process with the server, given the home and verbosity this command was given
/// and every argument after `serve`; returns only when the server cannot be started.
pub fn exec(home: &Path, verbose: u8, args: Vec<OsString>) -> Result<()> {
    let program = server_program()?;
    let mut c = std::process::Command::new(&program);
    // The home through the environment, so an explicit --home among the arguments wins.
    c.env("MILLRACE_HOME", home);
    for _ in 0..verbose {
        c.arg("-v");
    }
    c.args(args);
    let e = c.exec();
    Err(anyhow!("cannot run {}: {e}", program.display()))
}
