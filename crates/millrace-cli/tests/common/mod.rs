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
    Server(spawn_serve(dir, args, &[]))
}

/// Starts `millrace serve` for the home in `dir` (API on a free loopback port, then `args`,
/// with `env` set; its log in dir/serve.log) and waits until it has written its server file.
/// A file a killed server left is removed first, so the wait is for this server's.
pub fn spawn_serve(dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> Child {
    let home = dir.join("home");
    let _ = std::fs::remove_file(home.join("server.json"));
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_millrace"))
        .env("MILLRACE_HOME", &home)
        .envs(env.iter().copied())
        .args(["serve", "--api", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("millrace serve starts");
    let log_of = || std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
    let t0 = Instant::now();
    while !home.join("server.json").exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "millrace serve exited while starting; its log:\n{}",
            log_of()
        );
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "millrace serve did not come up in 30 s; its log:\n{}",
            log_of()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Runs a command and fails the test with its standard error if it fails.
pub fn run_ok(c: &mut Command) {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{c:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The sum of a metric's samples on the server's /metrics (every label set whose line starts
/// with `name`).
pub fn metric(url: &str, name: &str) -> f64 {
    let text = ureq::get(&format!("{url}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The API's URL from the running server's file in `home`.
pub fn server_url(home: &Path) -> String {
    let sf: Value = serde_json::from_slice(&std::fs::read(home.join("server.json")).unwrap())
        .expect("server.json is JSON");
    sf["url"].as_str().unwrap().to_string()
}

/// A loopback port free now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Hangs up a TCP connection with a reset (SO_LINGER 0, then close), as a peer that vanishes.
pub fn reset(s: std::net::TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a descriptor this stream owns, with a valid linger struct.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as u32,
        );
    }
    drop(s);
}

/// Paths of `n` members of `size` for a test pool: loop devices with direct I/O over files in
/// `dir` (block devices, as NVMe drives are used) where this machine can make them (root,
/// /dev/loop-control, losetup); else drive files in `dir`, for `pool create --create SIZE`.
/// The second value is the `--create` argument the paths need (none for block devices). Loop
/// devices are detached when the test binary exits (after every test's server has stopped).
pub fn members(dir: &Path, n: usize, size: &str) -> (Vec<String>, Vec<String>) {
    if let Some(loops) = loop_members(dir, n, size) {
        return (loops, Vec::new());
    }
    let files = (0..n)
        .map(|i| dir.join(format!("d{i}.img")).display().to_string())
        .collect();
    (files, vec!["--create".into(), size.into()])
}

static LOOPS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

extern "C" fn detach_loops() {
    for d in LOOPS.lock().map(|l| l.clone()).unwrap_or_default() {
        let _ = std::process::Command::new("losetup")
            .arg("-d")
            .arg(d)
            .status();
    }
}

fn loop_members(dir: &Path, n: usize, size: &str) -> Option<Vec<String>> {
    if !Path::new("/dev/loop-control").exists() {
        return None;
    }
    let mut out = Vec::new();
    for i in 0..n {
        let f = dir.join(format!("b{i}.img"));
        let ok = std::process::Command::new("truncate")
            .args(["-s", size])
            .arg(&f)
            .status()
            .is_ok_and(|s| s.success());
        let dev = ok
            .then(|| {
                std::process::Command::new("losetup")
                    .args(["--find", "--show", "--direct-io=on"])
                    .arg(&f)
                    .output()
                    .ok()
                    .filter(|o| o.status.success())
            })
            .flatten()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        let Some(dev) = dev else {
            for d in &out {
                let _ = std::process::Command::new("losetup")
                    .arg("-d")
                    .arg(d)
                    .status();
            }
            return None;
        };
        let mut l = LOOPS.lock().unwrap();
        if l.is_empty() {
            // SAFETY: registers a plain function with no arguments to run at exit.
            unsafe { libc::atexit(detach_loops) };
        }
        l.push(dev.clone());
        out.push(dev);
    }
    Some(out)
}

/// Pool "tank": RAID6 over six 96 MiB members (loop devices where the machine can make them,
/// see `members`), as the server tests use it.
pub fn raid6_tank(dir: &Path) {
    let (drives, create) = members(dir, 6, "96M");
    run_ok(
        millrace(dir)
            .args(["pool", "create", "tank", "--level", "raid6"])
            .args(&create)
            .args(&drives),
    );
}
