//! NVMe persistent reservations through the server: two hosts register with an export, one
//! holds a write-exclusive reservation and asked for it to persist through power loss; the API,
//! /metrics and the record in the home show it; `millrace serve` stops (SIGTERM) and starts
//! again on the same home, and the hosts find their registrations and the reservation where
//! they left them; the operator's clear ends it. It sends SIGTERM to its own process, which the
//! server it started catches (hence tests/stops/, one test at a time).

use crate::common;
use std::net::SocketAddr;
use std::path::Path;

use millrace_nvmf::cmd::Status;
use millrace_nvmf::initiator::{HostController, HostOptions};
use serde_json::{json, Value};

const NQN: &str = "nqn.2026-11.dev.millrace:resv";
const HOSTS: [&str; 2] = [
    "nqn.2014-08.org.nvmexpress:uuid:00000049-0000-0000-0000-00000000000a",
    "nqn.2014-08.org.nvmexpress:uuid:00000049-0000-0000-0000-00000000000b",
];

fn host(i: usize) -> HostOptions {
    HostOptions {
        hostnqn: HOSTS[i].into(),
        hostid: [0x40 + i as u8; 16],
        ..Default::default()
    }
}

fn call(url: &str, method: &str, p: &str, body: Option<Value>) -> (u16, Value) {
    common::call_json(&common::agent(), url, method, p, body)
}

/// Starts a server on `home` in a thread of its own; returns its URL, its NVMe/TCP address and
/// the thread, which ends when the server stops.
fn start(home: &Path, not: Option<&str>) -> (String, SocketAddr, std::thread::JoinHandle<()>) {
    let cfg = millrace_server::ServeConfig {
        nvme: vec!["127.0.0.1:0".parse().unwrap()],
        ..common::config(home)
    };
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(millrace_server::run(cfg))
            .expect("the server stops cleanly");
    });
    let url = common::wait_url(home, not);
    let (_, st) = call(&url, "GET", "/api/v1/status", None);
    let port = st["nvme_listeners"][0]["port"].as_u64().unwrap() as u16;
    (url, SocketAddr::from(([127, 0, 0, 1], port)), server)
}

fn stop(server: std::thread::JoinHandle<()>) {
    crate::sigterm();
    server.join().unwrap();
}

fn metric_lines(url: &str) -> Vec<String> {
    let mut r = common::agent()
        .get(format!("{url}/metrics"))
        .call()
        .unwrap();
    let text = r.body_mut().read_to_string().unwrap();
    (text.lines())
        .filter(|l| l.starts_with("millrace_nvme_reservation_"))
        .map(str::to_string)
        .collect()
}

fn export(url: &str) -> Value {
    let (_, ex) = call(url, "GET", "/api/v1/exports", None);
    ex["nvme"][0].clone()
}

async fn lba_bytes(c: &HostController) -> u32 {
    let id = c.admin.identify(0, 1).await.unwrap();
    let f = (id[26] & 0xf) as usize;
    1 << id[128 + 4 * f + 2]
}

/// (host A's write, host B's write) on the export at `addr`, as statuses.
async fn writes(addr: SocketAddr) -> (Status, Status) {
    let a = HostController::connect(addr, NQN, &host(0), 1)
        .await
        .unwrap();
    let b = HostController::connect(addr, NQN, &host(1), 1)
        .await
        .unwrap();
    let lba = lba_bytes(&a).await;
    let st = |r: Result<(), millrace_nvmf::initiator::Error>| match r {
        Ok(()) => Status::SUCCESS,
        Err(e) => e.status().expect("a status"),
    };
    let wa = st(a.io[0].write(1, 0, vec![0xa; lba as usize], lba).await);
    let wb = st(b.io[0].write(1, 1, vec![0xb; lba as usize], lba).await);
    (wa, wb)
}

#[test]
fn a_reservation_asked_to_persist_survives_a_restart() {
    let _turn = crate::ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let (url, addr, server) = start(&home, None);
    let drives: Vec<String> = (0..2)
        .map(|i| dir.path().join(format!("d{i}.img")).display().to_string())
        .collect();
    let (st, v) = call(
        &url,
        "POST",
        "/api/v1/pools",
        Some(
            json!({"name": "tank", "level": "raid1", "drives": drives, "create_size_bytes": 16u64 << 20}),
        ),
    );
    assert_eq!(st, 201, "{v}");
    let (st, v) = call(
        &url,
        "POST",
        "/api/v1/pools/tank/volumes",
        Some(json!({"name": "v", "size_bytes": 4u64 << 20})),
    );
    assert_eq!(st, 201, "{v}");
    let (st, v) = call(
        &url,
        "POST",
        "/api/v1/exports/nvme",
        Some(json!({"pool": "tank", "volume": "v", "nqn": NQN, "hosts": HOSTS})),
    );
    assert_eq!(st, 201, "{v}");
    assert_eq!(export(&url)["reservation"]["registrants"], json!([]));

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let a = HostController::connect(addr, NQN, &host(0), 1)
            .await
            .unwrap();
        let b = HostController::connect(addr, NQN, &host(1), 1)
            .await
            .unwrap();
        // A registers asking for persistence through power loss (CPTPL 11b), then holds.
        a.io[0].resv_register(1, 0, false, 3, 0, 0xa).await.unwrap();
        b.io[0].resv_register(1, 0, false, 0, 0, 0xb).await.unwrap();
        a.io[0].resv_acquire(1, 0, 1, 0xa, 0).await.unwrap();
    });
    assert_eq!(
        rt.block_on(writes(addr)),
        (Status::SUCCESS, Status::RESERVATION_CONFLICT)
    );
    let e = export(&url);
    let r = &e["reservation"];
    assert_eq!(r["type"], "write-exclusive", "{e}");
    assert_eq!(r["holder"], HOSTS[0], "{e}");
    assert_eq!(r["ptpl"], true, "{e}");
    assert_eq!(r["registrants"].as_array().unwrap().len(), 2, "{e}");
    assert_eq!(r["registrants"][0]["key"], "0x000000000000000a", "{e}");
    assert_eq!(r["registrants"][0]["hostid"], "40".repeat(16), "{e}");
    let m = metric_lines(&url);
    let want = [
        format!("millrace_nvme_reservation_registrants{{subsystem=\"{NQN}\",nsid=\"1\"}} 2"),
        format!("millrace_nvme_reservation_held{{subsystem=\"{NQN}\",nsid=\"1\",type=\"write-exclusive\",holder=\"{}\"}} 1", HOSTS[0]),
    ];
    for w in &want {
        assert!(m.contains(w), "{w} not in {m:?}");
    }
    let records: Vec<_> = std::fs::read_dir(home.join("nvme-reservations"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    let text = std::fs::read_to_string(&records[0]).unwrap();
    assert!(
        text.contains("write-exclusive") && text.contains(HOSTS[1]),
        "{text}"
    );

    // Stopped and started again on the same home: the same state, and the same conflicts.
    stop(server);
    let (url2, addr, server) = start(&home, Some(&url));
    let e = export(&url2);
    assert_eq!(e["reservation"]["type"], "write-exclusive", "{e}");
    assert_eq!(e["reservation"]["generation"], 2, "{e}");
    assert_eq!(
        rt.block_on(writes(addr)),
        (Status::SUCCESS, Status::RESERVATION_CONFLICT)
    );
    let report = rt.block_on(async {
        let b = HostController::connect(addr, NQN, &host(1), 1)
            .await
            .unwrap();
        b.io[0].resv_report(1, 4096).await.unwrap()
    });
    assert!(report.ptpl && report.rtype == 1 && report.registrants_count == 2);

    // The operator's clear: no reservation, no registrant; recorded so.
    let (st, v) = call(
        &url2,
        "DELETE",
        "/api/v1/exports/nvme/tank/v/reservation",
        None,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["reservation"]["type"], Value::Null, "{v}");
    assert_eq!(v["reservation"]["registrants"], json!([]), "{v}");
    assert_eq!(
        rt.block_on(writes(addr)),
        (Status::SUCCESS, Status::SUCCESS)
    );
    let text = std::fs::read_to_string(&records[0]).unwrap();
    assert!(!text.contains(HOSTS[1]), "{text}");
    let (st, v) = call(
        &url2,
        "DELETE",
        "/api/v1/exports/nvme/tank/w/reservation",
        None,
    );
    assert_eq!(st, 404, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("no volume named w"),
        "{v}"
    );
    assert!(metric_lines(&url2)
        .iter()
        .all(|l| !l.starts_with("millrace_nvme_reservation_held")));

    // Removing the export removes its record.
    let (st, v) = call(&url2, "DELETE", "/api/v1/exports/nvme/tank/v", None);
    assert_eq!(st, 200, "{v}");
    assert!(!records[0].exists());
    stop(server);
}
