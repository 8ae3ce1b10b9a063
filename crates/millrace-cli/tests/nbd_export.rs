//! The NBD export through the real product: `millrace serve` with a pool, `millrace export nbd
//! add --listen ... --client ...`, and libnbd's own tools as the clients (nbdcopy writes random
//! data in and reads it back, nbdinfo describes the export). A client the export does not list
//! is refused. Skipped, with a message saying what to install, when libnbd-bin is missing.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{millrace, pattern, serve};

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

#[test]
fn nbd_export_through_millrace_serve_with_libnbd_tools() {
    let (Some(nbdinfo), Some(nbdcopy)) = (tool("nbdinfo"), tool("nbdcopy")) else {
        eprintln!(
            "SKIPPED: nbdinfo/nbdcopy are not installed; install the Debian package libnbd-bin (scripts/setup.sh does) to run this test"
        );
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let mut c = millrace(dir);
    c.args([
        "pool", "create", "tank", "--level", "raid6", "--strip", "64k", "--create", "64M",
    ]);
    for i in 0..6 {
        c.arg(format!("drives/d{i}.img"));
    }
    c.assert().success();
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
