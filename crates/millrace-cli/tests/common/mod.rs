//! Helpers the CLI tests share: running `millrace` in a test folder, test data, JSON reads.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::Command;
use serde_json::Value;

/// `millrace` with its home and working folder in `dir`.
pub fn millrace(dir: &Path) -> Command {
    let mut c = Command::cargo_bin("millrace").unwrap();
    c.env("MILLRACE_HOME", dir.join("home")).current_dir(dir);
    c
}

/// Deterministic bytes, different for each seed.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Runs a command that must succeed and prints JSON; returns the JSON.
pub fn json(mut c: Command) -> Value {
    let out = c.assert().success().get_output().stdout.clone();
    serde_json::from_slice(&out).unwrap()
}

/// `pool scrub NAME --json`.
pub fn scrub(dir: &Path, name: &str) -> Value {
    let mut c = millrace(dir);
    c.args(["pool", "scrub", name, "--json"]);
    json(c)
}

/// A running `millrace serve`, stopped (SIGTERM, then waited for) when dropped.
pub struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.0.try_wait() {
            return;
        }
        // SAFETY: a plain kill(2) of the child this test started, not yet reaped.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Server {
    /// Whether the server process still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }

    /// Kills the server outright (SIGKILL), as a crash would, and reaps it.
    pub fn kill(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `millrace serve` for the home in `dir` (API on a free loopback port, no NVMe/TCP),
/// once it listens: it writes server.json then, where the CLI finds it.
pub fn serve(dir: &Path) -> Server {
    serve_with(dir, &["--no-nvme"])
}

/// `serve` with these arguments after `--api` (`--no-nvme` or an NVMe/TCP address).
pub fn serve_with(dir: &Path, args: &[&str]) -> Server {
    let home = dir.join("home");
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_millrace"))
        .env("MILLRACE_HOME", &home)
        .args(["serve", "--api", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("millrace serve starts");
    let s = Server(child);
    let t0 = Instant::now();
    while !home.join("server.json").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "millrace serve did not come up in 30 s; its log:\n{}",
            std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    s
}
