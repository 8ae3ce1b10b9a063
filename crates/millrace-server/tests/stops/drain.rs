//! SIGTERM during heavy writes (#16 item 7c): the server stops accepting, lets the requests
//! already inside the volumes finish, refuses the rest, and only then records the pools clean.
//! Afterwards the pool is clean on its drives, every write the initiators were told was done
//! reads back, and a scrub finds parity consistent. It sends SIGTERM to its own process, which
//! the server it started catches (hence tests/stops/, one test at a time).

use crate::common;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use millrace_array::superblock::{Superblock, SLOT_BYTES};
use millrace_nvmf::initiator::{HostController, HostOptions};
use parking_lot::Mutex;
use serde_json::{json, Value};

const NQN: &str = "nqn.2026-11.dev.millrace:drain";
const WRITERS: u64 = 8;
const BLOCK: usize = 4096;

fn pattern(seed: u64) -> Vec<u8> {
    common::pattern(seed, BLOCK)
}

fn call(agent: &ureq::Agent, method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    let r = match (method, body) {
        ("GET", _) => agent.get(url).call(),
        (_, Some(b)) => agent.post(url).send_json(&b),
        _ => unreachable!(),
    };
    let mut r = r.unwrap();
    let st = r.status().as_u16();
    (
        st,
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap_or(Value::Null),
    )
}

/// The logical block size of namespace 1 (Identify Namespace: FLBAS, then its LBA format).
async fn lba_bytes(c: &HostController) -> u32 {
    let id = c.admin.identify(0, 1).await.unwrap();
    let f = (id[26] & 0xf) as usize;
    1 << id[128 + 4 * f + 2]
}

#[test]
fn sigterm_during_heavy_writes_loses_nothing_and_leaves_the_pool_clean() {
    let _turn = crate::ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let cfg = millrace_server::ServeConfig {
        nvme: vec!["127.0.0.1:0".parse().unwrap()],
        ..common::config(&home)
    };
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(millrace_server::run(cfg))
    });
    let url = common::wait_url(&home, None);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let drives: Vec<String> = (0..3)
        .map(|i| dir.path().join(format!("d{i}")).display().to_string())
        .collect();
    let api = |p: &str| format!("{url}{p}");
    let (st, v) = call(
        &agent,
        "POST",
        &api("/api/v1/pools"),
        Some(json!({"name": "tank",
        "level": "raid5", "strip_bytes": 65536, "drives": drives, "create_size_bytes": 64u64 << 20})),
    );
    assert_eq!(st, 201, "{v}");
    let (st, v) = call(
        &agent,
        "POST",
        &api("/api/v1/pools/tank/volumes"),
        Some(json!({"name": "v", "size_bytes": 32u64 << 20})),
    );
    assert_eq!(st, 201, "{v}");
    let (st, v) = call(
        &agent,
        "POST",
        &api("/api/v1/exports/nvme"),
        Some(json!({"pool": "tank", "volume": "v", "nqn": NQN, "allow_any_host": true})),
    );
    assert_eq!(st, 201, "{v}");
    let (_, status) = call(&agent, "GET", &api("/api/v1/status"), None);
    let port = status["nvme_listeners"][0]["port"].as_u64().unwrap() as u16;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));

    // Writers, each on a controller of its own, each block written once: a block is either
    // acknowledged (and must read back) or not.
    let acked: Arc<Mutex<Vec<u64>>> = Arc::default();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let blocks = (32u64 << 20) / BLOCK as u64;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let acked = acked.clone();
            rt.spawn(async move {
                let c = HostController::connect(addr, NQN, &HostOptions::default(), 1)
                    .await
                    .unwrap();
                let lba = lba_bytes(&c).await;
                let per = BLOCK as u64 / lba as u64;
                let mut b = w;
                while b < blocks {
                    let data = pattern(b);
                    if c.io[0].write(1, b * per, data, lba).await.is_err() {
                        break;
                    }
                    acked.lock().push(b);
                    b += WRITERS;
                }
            })
        })
        .collect();
    // Stop once the writes are well under way.
    let t0 = Instant::now();
    while acked.lock().len() < 200 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the writers made no progress"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    crate::sigterm();
    server.join().unwrap().expect("the server stops cleanly");
    rt.block_on(async {
        for w in writers {
            let _ = tokio::time::timeout(Duration::from_secs(30), w).await;
        }
    });
    let acked = acked.lock().clone();
    assert!(acked.len() >= 200);

    // Clean on every drive, before anything opens the pool again (an open would resync).
    for d in &drives {
        let b = std::fs::read(d).unwrap();
        let sb = Superblock::decode_slots(&b[..2 * SLOT_BYTES]).unwrap();
        assert!(sb.clean, "{d} is recorded in use after the stop");
    }
    let state = millrace_server::State::open_offline(&home).unwrap();
    let (e, _) = state.volume("tank", "v").unwrap();
    let vol = e.volumes.open_volume("v").unwrap();
    let mut buf = vec![0u8; BLOCK];
    for &b in &acked {
        millrace_block::BlockDevice::read_at(&*vol, b * BLOCK as u64, &mut buf).unwrap();
        assert!(
            buf == pattern(b),
            "acknowledged block {b} did not survive the stop"
        );
    }
    let rep = e.pool.scrub(false, |_, _| {}).unwrap();
    assert_eq!(
        rep.mismatches, 0,
        "parity is inconsistent after a clean stop"
    );
    drop((e, vol));
    state.close().unwrap();
}
