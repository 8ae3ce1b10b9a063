//! The server against real clients on this machine: libnbd's `nbdinfo` and `nbdcopy`, and
//! fio's nbd engine with verification. These tools are required: a missing one fails the test
//! with the Debian package to install (the project's test script installs them).

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use crate::common::*;
use millrace_block::{BlockDevice, MemBlockDevice};
use millrace_nbd::NbdServer;
use tokio::process::Command;

const MIB: u64 = 1 << 20;

/// The path of a required tool, or a failure that says how to get it.
fn require(tool: &str, package: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(tool))
                .find(|f| f.is_file())
        })
        .unwrap_or_else(|| {
            panic!("{tool} is not installed; install the Debian package {package} (apt-get install {package}) to run this test")
        })
}

async fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().await.expect("the tool starts");
    if !out.status.success() {
        eprintln!(
            "{cmd:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

fn unix_uri(name: &str, sock: &Path) -> String {
    format!("nbd+unix:///{name}?socket={}", sock.display())
}

fn sha256(path: &Path) -> String {
    let out = std::process::Command::new(require("sha256sum", "coreutils"))
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdinfo_reports_what_we_advertise() {
    let nbdinfo = require("nbdinfo", "libnbd-bin");
    let dir = tempfile::tempdir().unwrap();
    let server = NbdServer::new();
    // A device whose preferred I/O is a 6 x 64 KiB stripe: advertised rounded up to 512 KiB.
    let dev = TestDev::new(48 * MIB);
    let mut e = export("vol", dev, &["127.0.0.1"]);
    e.description = "a volume for nbdinfo".into();
    server.add_export(e).unwrap();
    let mut ro = export("ro", Arc::new(MemBlockDevice::new(MIB)), &[]);
    ro.read_only = true;
    server.add_export(ro).unwrap();
    let sock = unix_server(&server, dir.path());
    let addr = tcp_server(&server).await;

    for uri in [unix_uri("vol", &sock), format!("nbd://{addr}/vol")] {
        let out = run(Command::new(&nbdinfo).arg("--json").arg(&uri)).await;
        assert!(out.status.success(), "nbdinfo {uri} failed");
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(j["protocol"], "newstyle-fixed");
        assert_eq!(j["structured"], true);
        let x = &j["exports"][0];
        assert_eq!(x["export-name"], "vol");
        assert_eq!(x["description"], "a volume for nbdinfo");
        assert_eq!(x["export-size"], 48 * MIB);
        assert_eq!(x["block_size_minimum"], 1);
        assert_eq!(x["block_size_preferred"], 512 * 1024);
        assert_eq!(x["block_size_maximum"], 32 * MIB);
        for yes in [
            "can_multi_conn",
            "can_flush",
            "can_fua",
            "can_trim",
            "can_zero",
            "can_cache",
            "can_df",
            "can_fast_zero",
        ] {
            assert_eq!(x[yes], true, "{yes} on {uri}");
        }
        for no in ["is_read_only", "is_rotational"] {
            assert_eq!(x[no], false, "{no} on {uri}");
        }
        // nbdinfo lists the metadata contexts the export offers.
        assert_eq!(
            x["contexts"],
            serde_json::json!(["base:allocation"]),
            "{uri}"
        );
    }
    let out = run(Command::new(&nbdinfo)
        .arg("--json")
        .arg(unix_uri("ro", &sock)))
    .await;
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["exports"][0]["is_read_only"], true);
    assert_eq!(j["exports"][0]["can_trim"], false);

    // --list over the socket sees both exports; over TCP only the one this address may use.
    let out = run(Command::new(&nbdinfo)
        .arg("--list")
        .arg("--json")
        .arg(unix_uri("", &sock)))
    .await;
    assert!(out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<_> = j["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["export-name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["ro", "vol"]);
    let out = run(Command::new(&nbdinfo)
        .arg("--list")
        .arg("--json")
        .arg(format!("nbd://{addr}")))
    .await;
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["exports"].as_array().unwrap().len(), 1);

    // Refusals as a real client sees them: an unknown export, and one this address may not use.
    let out = run(Command::new(&nbdinfo).arg(unix_uri("nope", &sock))).await;
    assert!(!out.status.success());
    // libnbd reports NBD_REP_ERR_UNKNOWN as ENOENT.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("No such file or directory"), "{err}");
    let out = run(Command::new(&nbdinfo).arg(format!("nbd://{addr}/ro"))).await;
    assert!(!out.status.success(), "127.0.0.1 may not use ro");
    // libnbd reports NBD_REP_ERR_POLICY as ENOTSUP.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Operation not supported for export: ro"),
        "{err}"
    );
    let before = server.stats().connections_refused;
    server.remove_export("vol").unwrap();
    let out = run(Command::new(&nbdinfo).arg(format!("nbd://{addr}/vol"))).await;
    assert!(
        !out.status.success(),
        "with no export for it, the TCP client is closed"
    );
    assert_eq!(server.stats().connections_refused, before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdcopy_round_trips_64_mib() {
    let nbdcopy = require("nbdcopy", "libnbd-bin");
    let dir = tempfile::tempdir().unwrap();
    let server = NbdServer::new();
    let dev = Arc::new(MemBlockDevice::new(64 * MIB));
    server
        .add_export(export("vol", dev.clone(), &["127.0.0.1"]))
        .unwrap();
    let sock = unix_server(&server, dir.path());
    let addr = tcp_server(&server).await;

    let input = dir.path().join("in.img");
    let mut f = std::fs::File::open("/dev/urandom").unwrap();
    let mut data = vec![0u8; 64 * MIB as usize];
    std::io::Read::read_exact(&mut f, &mut data).unwrap();
    std::fs::write(&input, &data).unwrap();

    // In over the Unix socket, out over TCP; nbdcopy uses several connections (multi-conn).
    let out = run(Command::new(&nbdcopy)
        .arg("--flush")
        .arg(&input)
        .arg(unix_uri("vol", &sock)))
    .await;
    assert!(out.status.success());
    let mut held = vec![0u8; data.len()];
    dev.read_at(0, &mut held).unwrap();
    assert!(held == data, "the device holds the copied file");
    let output = dir.path().join("out.img");
    let out = run(Command::new(&nbdcopy)
        .arg(format!("nbd://{addr}/vol"))
        .arg(&output))
    .await;
    assert!(out.status.success());
    assert_eq!(sha256(&input), sha256(&output));
    let st = server.stats();
    assert!(st.connections_total > 2, "nbdcopy used multi-conn: {st:?}");
    assert!(
        st.bytes_written >= 64 * MIB && st.bytes_read >= 64 * MIB,
        "{st:?}"
    );
}

/// A RAM disk that returns wrong data for reads past `from`: the control that proves fio's
/// verification would notice.
struct Corrupting {
    mem: MemBlockDevice,
    from: u64,
}

impl BlockDevice for Corrupting {
    fn size_bytes(&self) -> u64 {
        self.mem.size_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.mem.read_at(offset, buf)?;
        if offset >= self.from && !buf.is_empty() {
            buf[buf.len() / 2] ^= 0x40;
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.mem.write_at(offset, data)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

fn fio_verify(fio: &Path, uri: &str, size: &str) -> Command {
    let mut c = Command::new(fio);
    c.args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bsrange=512-256k",
        &format!("--size={size}"),
        "--iodepth=32",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--output-format=json",
    ]);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fio_nbd_engine_verifies() {
    let fio = require("fio", "fio");
    let help = std::process::Command::new(&fio)
        .arg("--enghelp")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("nbd"),
        "this fio has no nbd engine; Debian's fio package is built with libnbd"
    );
    let dir = tempfile::tempdir().unwrap();
    let server = NbdServer::new();
    server
        .add_export(export(
            "vol",
            Arc::new(MemBlockDevice::new(64 * MIB)),
            &["127.0.0.1"],
        ))
        .unwrap();
    server
        .add_export(export(
            "bad",
            Arc::new(Corrupting {
                mem: MemBlockDevice::new(16 * MIB),
                from: 8 * MIB,
            }),
            &[],
        ))
        .unwrap();
    let sock = unix_server(&server, dir.path());
    let addr = tcp_server(&server).await;

    for uri in [unix_uri("vol", &sock), format!("nbd://{addr}/vol")] {
        let out = run(&mut fio_verify(&fio, &uri, "64M")).await;
        assert!(out.status.success(), "fio verify over {uri}");
        let text = String::from_utf8_lossy(&out.stdout);
        let j: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
        let job = &j["jobs"][0];
        assert_eq!(job["error"], 0);
        assert_eq!(job["write"]["io_bytes"], 64 * MIB);
        assert_eq!(
            job["read"]["io_bytes"],
            64 * MIB,
            "every written block was read back and verified"
        );
    }
    // The control: the same verification over a device that corrupts reads must fail.
    let out = fio_verify(&fio, &unix_uri("bad", &sock), "16M")
        .output()
        .await
        .unwrap();
    assert!(
        !out.status.success(),
        "fio must notice corrupted reads, or its success above proves nothing"
    );
}
