//! A drive file in memory truncated behind the server's back while its reads are lent to
//! NVMe/TCP replies (the kernel sends them straight from the drive's pages). The send that meets
//! the missing pages fails with EFAULT and ends that connection; it must also take the drive's
//! pages out of lending, so that the host's retry reads through the pool, which fails the drive
//! and serves its data from parity. Before, every read of that drive's blocks ended its
//! connection again, and the drive stayed in service.

use crate::common;
use std::net::SocketAddr;
use std::time::Duration;

use millrace_io::cannot_run;
use millrace_nvmf::initiator::{HostController, HostOptions};
use serde_json::{json, Value};

const NQN: &str = "nqn.2026-11.dev.millrace:shrunk";
const BLOCK: usize = 4096;
const BLOCKS: u64 = 512;

fn pattern(seed: u64) -> Vec<u8> {
    common::pattern(seed, BLOCK)
}

fn call(agent: &ureq::Agent, url: &str, body: Option<Value>) -> (u16, Value) {
    let mut r = match body {
        None => agent.get(url).call(),
        Some(b) => agent.post(url).send_json(&b),
    }
    .unwrap();
    let st = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap();
    (st, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn controller(addr: SocketAddr) -> (HostController, u32) {
    let c = HostController::connect(addr, NQN, &HostOptions::default(), 1)
        .await
        .expect("the host connects");
    let id = c.admin.identify(0, 1).await.unwrap();
    let f = (id[26] & 0xf) as usize;
    let lba = 1 << id[128 + 4 * f + 2];
    (c, lba)
}

#[test]
fn a_drive_truncated_under_lent_reads_is_failed_and_its_data_served_by_parity() {
    // Drive files in memory, which the pool maps and lends reads from.
    let Ok(shm) = tempfile::tempdir_in("/dev/shm") else {
        return cannot_run("a tmpfs at /dev/shm");
    };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let url = common::spawn(
        millrace_server::ServeConfig {
            nvme: vec!["127.0.0.1:0".parse().unwrap()],
            ..common::config(&home)
        },
        None,
    );
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let api = |p: &str| format!("{url}{p}");
    let drives: Vec<String> = (0..3)
        .map(|i| shm.path().join(format!("d{i}")).display().to_string())
        .collect();
    let (st, v) = call(
        &agent,
        &api("/api/v1/pools"),
        Some(
            json!({"name": "tank", "level": "raid5", "strip_bytes": 65536,
            "drives": drives, "create_size_bytes": 32u64 << 20}),
        ),
    );
    assert_eq!(st, 201, "{v}");
    let (st, v) = call(
        &agent,
        &api("/api/v1/pools/tank/volumes"),
        Some(json!({"name": "v", "size_bytes": 8u64 << 20})),
    );
    assert_eq!(st, 201, "{v}");
    let (st, v) = call(
        &agent,
        &api("/api/v1/exports/nvme"),
        Some(json!({"pool": "tank", "volume": "v", "nqn": NQN, "allow_any_host": true})),
    );
    assert_eq!(st, 201, "{v}");
    let (_, status) = call(&agent, &api("/api/v1/status"), None);
    let port = status["nvme_listeners"][0]["port"].as_u64().unwrap() as u16;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));

    let rt = tokio::runtime::Runtime::new().unwrap();
    let resets = rt.block_on(async {
        let (mut c, lba) = controller(addr).await;
        let per = BLOCK as u64 / lba as u64;
        for b in 0..BLOCKS {
            c.io[0].write(1, b * per, pattern(b), lba).await.unwrap();
        }
        for b in 0..BLOCKS {
            let got = c.io[0].read(1, b * per, per as u32, lba).await.unwrap();
            assert!(got == pattern(b), "block {b} reads back before the fault");
        }
        // The drive loses everything past its first MiB, its data area included.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&drives[1])
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        // Every block reads back; a read whose reply met the missing pages ended its
        // connection, and is read again on a new one.
        let mut resets = 0;
        for b in 0..BLOCKS {
            let mut tries = 0;
            loop {
                let r = tokio::time::timeout(
                    Duration::from_secs(20),
                    c.io[0].read(1, b * per, per as u32, lba),
                )
                .await;
                match r {
                    Ok(Ok(got)) => {
                        assert!(got == pattern(b), "block {b} reads back after the fault");
                        break;
                    }
                    _ => {
                        tries += 1;
                        resets += 1;
                        assert!(
                            tries < 3,
                            "block {b} fails to read again and again: the drive's pages are still lent"
                        );
                        c = controller(addr).await.0;
                    }
                }
            }
        }
        resets
    });
    assert!(
        resets <= 4,
        "{resets} connections ended; one read (and those sent with it) should have"
    );
    let (_, p) = call(&agent, &api("/api/v1/pools/tank"), None);
    assert_eq!(p["state"], "degraded", "{p}");
    assert_eq!(p["members"][1]["state"], "faulty", "{p}");
}
