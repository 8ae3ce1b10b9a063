//! `millrace serve` and the CLI as its client, over the real binary: volumes and exports made
//! through the server's API, refusals that record nothing, exports that survive a restart, pool
//! I/O through the server, and what was recorded offline served by a later `serve`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{json, millrace};
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;
use serde_json::Value;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:4d696c6c-7261-6365-0000-000000000001";
const NQN: &str = "nqn.2026-11.dev.millrace:tank.a";

/// A running `millrace serve`, stopped with SIGTERM and waited for when dropped (also when a
/// test panics), so no server outlives its test.
struct Server {
    child: Child,
    home: PathBuf,
}

impl Server {
    /// Starts `millrace serve` for `dir`'s home on free loopback ports (`extra` picks NVMe/TCP)
    /// and waits until it has written its server file, which it does once everything listens.
    fn start(dir: &Path, extra: &[&str]) -> Server {
        let home = dir.join("home");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("serve.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_millrace"))
            .env("MILLRACE_HOME", &home)
            .env_remove("MILLRACE_SERVER")
            .env_remove("MILLRACE_API_LISTEN")
            .args(["serve", "--api", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("millrace serve starts");
        let mut s = Server { child, home };
        let t0 = Instant::now();
        while !s.home.join("server.json").exists() {
            if let Ok(Some(st)) = s.child.try_wait() {
                panic!("millrace serve exited ({st}); its log:\n{}", log_of(dir));
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "millrace serve did not come up in 60 s; its log:\n{}",
                log_of(dir)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    /// The API's URL, from the server file (the server bound port 0, so this is the real port).
    fn url(&self) -> String {
        let sf: Value =
            serde_json::from_slice(&std::fs::read(self.home.join("server.json")).unwrap()).unwrap();
        sf["url"].as_str().unwrap().to_string()
    }

    /// SIGTERM, then waits for a clean exit; the server file is gone afterwards.
    fn stop(mut self) {
        let st = self
            .terminate()
            .expect("millrace serve stops within 30 s of SIGTERM");
        assert!(st.success(), "millrace serve exited with {st} on SIGTERM");
        assert!(
            !self.home.join("server.json").exists(),
            "the server file outlives the server"
        );
    }

    fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        if let Ok(Some(st)) = self.child.try_wait() {
            return Some(st);
        }
        // SAFETY: a plain kill(2) of the child this test started.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.terminate();
    }
}

fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
}

fn pool(dir: &Path) {
    let ds: Vec<PathBuf> = (0..6)
        .map(|i| dir.join(format!("drives/d{i}.img")))
        .collect();
    millrace(dir)
        .args([
            "pool", "create", "tank", "--level", "raid6", "--strip", "64k", "--create", "32M",
        ])
        .args(&ds)
        .assert()
        .success();
}

fn cli(dir: &Path, args: &[&str]) -> Value {
    let mut c = millrace(dir);
    c.env_remove("MILLRACE_SERVER").args(args);
    json(c)
}

fn volume_names(dir: &Path) -> Vec<String> {
    cli(dir, &["volume", "list", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            format!(
                "{}/{}",
                v["pool"].as_str().unwrap(),
                v["name"].as_str().unwrap()
            )
        })
        .collect()
}

fn nvme_exports(dir: &Path) -> Vec<Value> {
    cli(dir, &["export", "list", "--json"])["nvme"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn volumes_and_exports_through_the_server_survive_a_restart() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    pool(dir);
    let s = Server::start(dir, &["--nvme", "127.0.0.1:0", "--discovery-port", "0"]);
    assert!(s.url().starts_with("http://127.0.0.1:") && !s.url().ends_with(":0"));
    // The server says where NVMe/TCP really listens, not the port 0 it was given.
    let t0 = Instant::now();
    while !log_of(dir).contains("NVMe/TCP on") && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = log_of(dir);
    let at = log
        .split("NVMe/TCP on ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("the server does not say where NVMe/TCP listens:\n{log}"));
    let port: u16 = at.rsplit(':').next().unwrap().parse().unwrap();
    assert!(
        at.starts_with("127.0.0.1:") && port != 0,
        "NVMe/TCP is said to listen on {at}"
    );
    std::net::TcpStream::connect(at).expect("NVMe/TCP listens where the server says");

    // The drives are the server's now: the CLI must be going through its API.
    let v = cli(
        dir,
        &["volume", "create", "tank/a", "--size", "5000000", "--json"],
    );
    assert_eq!(v["name"], "a");
    // Rounded up to whole full stripes (4 data drives x 64 KiB).
    assert_eq!(v["size_bytes"], 5 << 20);
    cli(
        dir,
        &["volume", "create", "tank/b", "--size", "1M", "--json"],
    );
    assert_eq!(volume_names(dir), ["tank/a", "tank/b"]);
    let shown = cli(dir, &["volume", "show", "tank/a", "--json"]);
    assert_eq!(shown["size_bytes"], 5 << 20);
    assert_eq!(shown["uuid"], v["uuid"]);
    // tank/b sits right after tank/a, so tank/a cannot grow until it is gone.
    millrace(dir)
        .args(["volume", "grow", "tank/a", "--size", "8M"])
        .assert()
        .failure()
        .stderr(contains("can grow to at most"));
    millrace(dir)
        .args(["volume", "delete", "tank/b"])
        .assert()
        .success()
        .stdout(contains("deleted volume tank/b"));
    let g = cli(dir, &["volume", "grow", "tank/a", "--size", "8M", "--json"]);
    assert_eq!(g["size_bytes"], 8 << 20);
    assert_eq!(
        cli(dir, &["volume", "show", "tank/a", "--json"])["size_bytes"],
        8 << 20
    );
    assert_eq!(volume_names(dir), ["tank/a"]);

    // Exports are closed by default: no host, no export, and nothing recorded.
    millrace(dir)
        .args(["export", "nvme", "add", "tank/a"])
        .assert()
        .failure()
        .stderr(contains("closed by default").and(contains("--host")));
    assert!(
        nvme_exports(dir).is_empty(),
        "a refused export was recorded"
    );
    let props = cli(dir, &["volume", "show", "tank/a", "--json"])["props"].clone();
    assert!(
        props.as_object().unwrap().is_empty(),
        "a refused export left props: {props}"
    );

    let e = cli(
        dir,
        &["export", "nvme", "add", "tank/a", "--host", HOST, "--json"],
    );
    assert_eq!(e["nqn"], NQN);
    let ex = nvme_exports(dir);
    assert_eq!(ex.len(), 1);
    assert_eq!(ex[0]["nqn"], NQN);
    assert_eq!(ex[0]["hosts"], serde_json::json!([HOST]));
    assert_eq!(ex[0]["allow_any_host"], false);
    assert_eq!(ex[0]["serving"], true);

    // A volume that is exported cannot be deleted.
    millrace(dir)
        .args(["volume", "delete", "tank/a"])
        .assert()
        .failure()
        .stderr(contains("tank/a is exported"));
    assert_eq!(volume_names(dir), ["tank/a"]);

    // The export is in the volume: a restarted server serves it again.
    s.stop();
    let s = Server::start(dir, &["--nvme", "127.0.0.1:0", "--discovery-port", "0"]);
    let ex = nvme_exports(dir);
    assert_eq!(ex.len(), 1, "the export is gone after a restart: {ex:?}");
    assert_eq!(ex[0]["nqn"], NQN);
    assert_eq!(ex[0]["hosts"], serde_json::json!([HOST]));
    assert_eq!(ex[0]["serving"], true);
    assert_eq!(
        cli(dir, &["volume", "show", "tank/a", "--json"])["size_bytes"],
        8 << 20,
        "the grown size did not survive the restart"
    );

    millrace(dir)
        .args(["export", "nvme", "remove", "tank/a"])
        .assert()
        .success()
        .stdout(contains("no longer exported"));
    assert!(nvme_exports(dir).is_empty());
    millrace(dir)
        .args(["export", "nvme", "remove", "tank/a"])
        .assert()
        .failure()
        .stderr(contains("not exported"));
    millrace(dir)
        .args(["volume", "delete", "tank/a"])
        .assert()
        .success();
    assert!(volume_names(dir).is_empty());
    s.stop();
}

#[test]
fn io_through_the_server_round_trips_at_an_unaligned_offset() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    pool(dir);
    let data: Vec<u8> = (0..777_777).map(|_| rand::random::<u8>()).collect();
    std::fs::write(dir.join("in.bin"), &data).unwrap();
    let before = millrace(dir)
        .args(["io", "read", "tank", "--offset", "12000", "--length", "345"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let s = Server::start(dir, &["--no-nvme"]);
    millrace(dir)
        .args([
            "io", "write", "tank", "--offset", "12345", "--input", "in.bin",
        ])
        .assert()
        .success();
    // A read a little wider than the write: the bytes around it are untouched.
    let out = millrace(dir)
        .args(["io", "read", "tank", "--offset", "12000", "--length"])
        .arg((345 + data.len() + 1000).to_string())
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(out.len(), 345 + data.len() + 1000);
    assert!(out[..345] == before[..], "bytes before the write changed");
    assert!(
        out[345..345 + data.len()] == data[..],
        "read back differs from what was written"
    );
    s.stop();
    // Written for real: the pool opened offline reads the same bytes.
    let off = millrace(dir)
        .args(["io", "read", "tank", "--offset", "12345", "--length"])
        .arg(data.len().to_string())
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert!(
        off == data,
        "the pool read offline differs from what the server wrote"
    );
}

#[test]
fn volumes_and_exports_recorded_offline_are_served_by_a_later_serve() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    pool(dir);
    cli(
        dir,
        &["volume", "create", "tank/a", "--size", "4M", "--json"],
    );
    millrace(dir)
        .args(["export", "nvme", "add", "tank/a"])
        .assert()
        .failure()
        .stderr(contains("closed by default"));
    assert!(
        nvme_exports(dir).is_empty(),
        "a refused export was recorded"
    );
    millrace(dir)
        .args(["export", "nvme", "add", "tank/a", "--host", HOST])
        .assert()
        .success()
        .stdout(contains(NQN).and(contains("served when `millrace serve` starts")));
    let ex = nvme_exports(dir);
    assert_eq!(ex.len(), 1);
    assert_eq!(ex[0]["serving"], false, "no server runs, yet: {ex:?}");
    millrace(dir)
        .args(["volume", "delete", "tank/a"])
        .assert()
        .failure()
        .stderr(contains("tank/a is exported"));

    let s = Server::start(dir, &["--nvme", "127.0.0.1:0", "--discovery-port", "0"]);
    let ex = nvme_exports(dir);
    assert_eq!(ex.len(), 1, "the server does not list the export: {ex:?}");
    assert_eq!(ex[0]["nqn"], NQN);
    assert_eq!(ex[0]["hosts"], serde_json::json!([HOST]));
    assert_eq!(
        ex[0]["serving"], true,
        "the server does not serve it: {ex:?}"
    );
    s.stop();

    // A server with no NVMe/TCP port does not claim to serve the export.
    let s = Server::start(dir, &["--no-nvme"]);
    let ex = nvme_exports(dir);
    assert_eq!(ex.len(), 1, "{ex:?}");
    assert_eq!(ex[0]["serving"], false, "--no-nvme, yet: {ex:?}");
    s.stop();
}
