//! The NBD export through the real product: `millrace serve` with a pool, `millrace export nbd
//! add --listen ... --client ...`, and libnbd's own tools as the clients (nbdcopy writes random
//! data in and reads it back, nbdinfo describes the export). A client the export does not list
//! is refused. Skipped, with a message saying what to install, when libnbd-bin is missing.

use crate::common;
use std::path::PathBuf;
use std::process::Command;

use crate::common::{millrace, pattern, serve};
use millrace_io::cannot_run;

/// The path of a tool, or None when it is not installed.
fn tool(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

/// A loopback port nobody listens on right now (bound, then released for the export to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn run(c: &mut Command) -> std::process::Output {
    let out = c.output().expect("the tool starts");
    if !out.status.success() {
        eprintln!(
            "{c:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// Pool "tank" in `dir`: RAID6 over six 64 MiB members (loop devices with direct I/O where the
/// machine can make them, else drive files: `common::members`), 64 KiB strips.
fn raid6_pool(dir: &std::path::Path) {
    let (drives, create) = common::members(dir, 6, "64M");
    let mut c = millrace(dir);
    c.args([
        "pool", "create", "tank", "--level", "raid6", "--strip", "64k",
    ])
    .args(&create)
    .args(&drives);
    c.assert().success();
}

#[test]
fn nbd_export_through_millrace_serve_with_libnbd_tools() {
    let (Some(nbdinfo), Some(nbdcopy)) = (tool("nbdinfo"), tool("nbdcopy")) else {
        return cannot_run("nbdinfo and nbdcopy, from the Debian package libnbd-bin (scripts/setup.sh installs it)");
    };
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    raid6_pool(dir);
    let _server = serve(dir);

    millrace(dir)
        .args(["volume", "create", "tank/vm1", "--size", "32M"])
        .assert()
        .success();
    let port = free_port();
    millrace(dir)
        .args([
            "export",
            "nbd",
            "add",
            "tank/vm1",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--client",
            "127.0.0.1",
        ])
        .assert()
        .success();
    let uri = format!("nbd://127.0.0.1:{port}/tank/vm1");

    let out = run(Command::new(&nbdinfo).args(["--json", &uri]));
    assert!(out.status.success(), "nbdinfo on the export failed");
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = &info["exports"][0];
    assert_eq!(e["export-name"], "tank/vm1");
    let size = e["export-size"].as_u64().unwrap();
    assert!(
        size >= 32 << 20,
        "the export is {size} bytes, less than the volume's 32 MiB"
    );
    assert_eq!(e["is_read_only"], false);
    for cap in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
    ] {
        assert_eq!(e[cap], true, "the export does not advertise {cap}: {e}");
    }

    // Random data in through several connections, back out, byte for byte.
    let data = pattern(size as usize, 77);
    std::fs::write(dir.join("in.bin"), &data).unwrap();
    let out = run(Command::new(&nbdcopy)
        .args(["--connections=4", "--flush"])
        .arg(dir.join("in.bin"))
        .arg(&uri));
    assert!(out.status.success(), "nbdcopy into the export failed");
    let out = run(Command::new(&nbdcopy).arg(&uri).arg(dir.join("out.bin")));
    assert!(out.status.success(), "nbdcopy out of the export failed");
    let back = std::fs::read(dir.join("out.bin")).unwrap();
    assert!(
        back == data,
        "the bytes read back differ from those written"
    );

    // The export is listed with its TCP client and address.
    let mut c = millrace(dir);
    c.args(["export", "nbd", "list", "--json"]);
    let v = common::json(c);
    assert_eq!(v["nbd"][0]["name"], "tank/vm1");
    assert_eq!(v["nbd"][0]["clients"][0], "127.0.0.1");

    // A second export reachable over TCP only from 10.9.9.9: a client on 127.0.0.1 is refused.
    millrace(dir)
        .args(["volume", "create", "tank/vm2", "--size", "8M"])
        .assert()
        .success();
    let port2 = free_port();
    millrace(dir)
        .args([
            "export",
            "nbd",
            "add",
            "tank/vm2",
            "--listen",
            &format!("127.0.0.1:{port2}"),
            "--client",
            "10.9.9.9",
        ])
        .assert()
        .success();
    let out = Command::new(&nbdinfo)
        .arg(format!("nbd://127.0.0.1:{port2}/tank/vm2"))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "nbdinfo reached an export that lists only 10.9.9.9 from 127.0.0.1"
    );

    // The Unix socket reaches every export: vm2 is there for local clients.
    let sock = dir.join("home/nbd.sock");
    let out = run(Command::new(&nbdinfo)
        .args(["--size"])
        .arg(format!("nbd+unix:///tank/vm2?socket={}", sock.display())));
    assert!(
        out.status.success(),
        "nbdinfo over the server's Unix socket failed"
    );
    let n: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(n >= 8 << 20);
}

/// A server killed outright (SIGKILL) while a client writes through NBD, its drive files in
/// memory, where data goes by pwrite and parity is copied into the files' mappings: after a
/// restart every sector of the volume holds its old or its new content, a copy that finished
/// (and flushed) reads back whole, and a scrub finds parity right (the import resyncs the rows
/// the write-intent bitmap marks). A kill seldom lands between one stripe's member writes,
/// which run back to back on the core; millrace-array's
/// `parity_torn_in_a_mapping_lies_in_a_marked_row_and_resync_repairs_it` tears parity by hand.
#[test]
fn server_killed_mid_write_on_memory_files_tears_no_sector_and_parity_verifies() {
    let Some(nbdcopy) = tool("nbdcopy") else {
        return cannot_run(
            "nbdcopy, from the Debian package libnbd-bin (scripts/setup.sh installs it)",
        );
    };
    let Ok(t) = tempfile::tempdir_in("/dev/shm") else {
        return cannot_run("a tmpfs at /dev/shm");
    };
    let dir = t.path();
    raid6_pool(dir);
    let mut server = serve(dir);
    millrace(dir)
        .args(["volume", "create", "tank/vm1", "--size", "64M"])
        .assert()
        .success();
    millrace(dir)
        .args(["export", "nbd", "add", "tank/vm1", "--client", "127.0.0.1"])
        .assert()
        .success();
    let sock = dir.join("home/nbd.sock");
    let uri = format!("nbd+unix:///tank/vm1?socket={}", sock.display());
    let read_all = |name: &str| -> Vec<u8> {
        let out = dir.join(name);
        let r = run(Command::new(&nbdcopy).arg(&uri).arg(&out));
        assert!(r.status.success(), "nbdcopy out of the export failed");
        std::fs::read(out).unwrap()
    };
    let copy_in = |data: &[u8]| {
        std::fs::write(dir.join("in.bin"), data).unwrap();
        Command::new(&nbdcopy)
            // --flush: a copy that finished has flushed, so all of it must survive the kill
            // (writes not yet flushed may be lost, as on a drive with a write cache).
            .args(["--connections=4", "--requests=16", "--flush"])
            .arg(dir.join("in.bin"))
            .arg(&uri)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    // A first copy, timed, so the kills below land inside one on any machine; it also leaves
    // every region of the volume written (a region never written since it was made reads as
    // zeroes until a flush records it).
    let mut model = pattern(64 << 20, 299);
    let t0 = std::time::Instant::now();
    assert!(
        copy_in(&model).wait().unwrap().success(),
        "the first copy failed"
    );
    let took = t0.elapsed();
    assert!(
        read_all("start.bin") == model,
        "the first copy did not read back"
    );
    let mut finished_rounds = 0;
    for (round, frac) in [0.05, 0.15, 0.25, 0.35, 0.5, 1.5].into_iter().enumerate() {
        let data = pattern(model.len(), 300 + round as u32);
        let mut copy = copy_in(&data);
        std::thread::sleep(took.mul_f64(frac));
        server.kill();
        let finished = copy.wait().unwrap().success();
        // The dead server's record, so `serve` waits for the new one's.
        std::fs::remove_file(dir.join("home/server.json")).unwrap();
        server = serve(dir);
        let now = read_all("now.bin");
        assert_eq!(now.len(), model.len());
        for s in 0..model.len() / 4096 {
            let r = s * 4096..(s + 1) * 4096;
            assert!(
                now[r.clone()] == model[r.clone()] || now[r.clone()] == data[r.clone()],
                "round {round}: sector {s} holds neither its old nor its new content (copy finished: {finished})"
            );
        }
        if finished {
            finished_rounds += 1;
            assert!(
                now == data,
                "round {round}: a finished copy did not read back"
            );
        }
        let rep = common::scrub(dir, "tank");
        assert_eq!(rep["mismatches"], 0, "round {round}: {rep}");
        model = now;
    }
    assert!(
        finished_rounds < 6,
        "every copy finished before its kill: no kill landed inside a write"
    );
}
