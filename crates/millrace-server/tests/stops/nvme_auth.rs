//! DH-HMAC-CHAP through the API (#49): an export with a host secret, shown as `dhchap: host`
//! and never returned; its store 0600; after a restart the target still asks the host to
//! authenticate (the right key works, none is refused); set-key rotates (old refused, new
//! works). The restart sends SIGTERM to its own process (hence tests/stops/, one test at a time).

use crate::common;
use std::os::unix::fs::PermissionsExt;

use millrace_nvmf::dhchap::{HostKeys, Secret};
use millrace_nvmf::initiator::{HostAuth, HostController, HostOptions};
use serde_json::{json, Value};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000049-0000-0000-0000-0000000000a1";

fn secret(seed: u8) -> Secret {
    Secret::new((0..32).map(|i| i ^ seed).collect(), None).unwrap()
}

fn nvme_addr(agent: &ureq::Agent, url: &str) -> std::net::SocketAddr {
    let (_, st) = common::call(agent, url, "GET", "/api/v1/status", None);
    let st: Value = serde_json::from_str(&st).unwrap();
    let l = &st["nvme_listeners"][0];
    format!("{}:{}", l["address"].as_str().unwrap(), l["port"])
        .parse()
        .unwrap()
}

/// Connects as HOST with `key` (None: without authenticating): Ok if the target let it in.
fn connect(addr: std::net::SocketAddr, nqn: &str, key: Option<&Secret>) -> Result<(), String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let o = HostOptions {
            hostnqn: HOST.into(),
            ..Default::default()
        };
        let a = key.map(|k| HostAuth::new(k.clone(), None));
        let c = HostController::connect_auth(addr, nqn, &o, 1, a.as_ref())
            .await
            .map_err(|e| e.to_string())?;
        let ok = c.io[0].read(1, 0, 1, 4096).await.map_err(|e| e.to_string());
        ok.map(|_| ())
    })
}

#[test]
fn secrets_are_kept_hidden_survive_a_restart_and_rotate() {
    let _turn = crate::ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let cfg = || millrace_server::ServeConfig {
        nvme: vec!["127.0.0.1:0".parse().unwrap()],
        ..common::config(&home)
    };
    let c1 = cfg();
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(millrace_server::run(c1))
    });
    let url = common::wait_url(&home, None);
    let agent = common::agent();
    let drives: Vec<String> = (0..2)
        .map(|i| dir.path().join(format!("d{i}.img")).display().to_string())
        .collect();
    let (st, v) = common::call(
        &agent,
        &url,
        "POST",
        "/api/v1/pools",
        Some(
            json!({"name": "tank", "level": "raid1", "drives": drives, "create_size_bytes": 16u64 << 20}),
        ),
    );
    assert_eq!(st, 201, "{v}");
    let (st, v) = common::call(
        &agent,
        &url,
        "POST",
        "/api/v1/pools/tank/volumes",
        Some(json!({"name": "v", "size_bytes": 4u64 << 20})),
    );
    assert_eq!(st, 201, "{v}");

    let (old, new) = (secret(1), secret(2));
    // A damaged secret is refused with a sentence that does not quote it.
    let mut bad = old.encode();
    bad.replace_range(12..14, "AA");
    let (st, v) = common::call(
        &agent,
        &url,
        "POST",
        "/api/v1/exports/nvme",
        Some(json!({"pool": "tank", "volume": "v", "hosts": [HOST], "dhchap_secret": bad})),
    );
    assert_eq!(st, 400, "{v}");
    assert!(v.contains("checksum") && !v.contains(&bad[10..40]), "{v}");
    let (st, v) = common::call(
        &agent,
        &url,
        "POST",
        "/api/v1/exports/nvme",
        Some(
            json!({"pool": "tank", "volume": "v", "hosts": [HOST], "dhchap_secret": old.encode()}),
        ),
    );
    assert_eq!(st, 201, "{v}");
    let nqn = serde_json::from_str::<Value>(&v).unwrap()["nqn"]
        .as_str()
        .unwrap()
        .to_string();
    let b64 = |s: &Secret| s.encode()[10..50].to_string();
    assert!(!v.contains(&b64(&old)), "{v}");
    let (_, ex) = common::call(&agent, &url, "GET", "/api/v1/exports", None);
    let exv: Value = serde_json::from_str(&ex).unwrap();
    assert_eq!(exv["nvme"][0]["dhchap"][HOST], "host", "{ex}");
    assert!(!ex.contains(&b64(&old)), "{ex}");
    let store = home.join("dhchap.json");
    let mode = std::fs::metadata(&store).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    // Restart: the secret is loaded with the export.
    crate::sigterm();
    server.join().unwrap().expect("the server stops cleanly");
    let c2 = cfg();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(millrace_server::run(c2))
    });
    let url = common::wait_url(&home, Some(&url));
    let addr = nvme_addr(&agent, &url);
    connect(addr, &nqn, Some(&old)).expect("the right key works after a restart");
    assert!(connect(addr, &nqn, None).is_err(), "no key is refused");

    // Rotation: the old key is refused, the new one works.
    let (st, v) = common::call(
        &agent,
        &url,
        "PUT",
        &format!("/api/v1/exports/nvme/tank/v/hosts/{HOST}/dhchap"),
        Some(json!({"dhchap_secret": new.encode(), "dhchap_ctrl_secret": secret(3).encode()})),
    );
    assert_eq!(st, 200, "{v}");
    assert!(
        !v.contains(&b64(&new)) && v.contains("bidirectional"),
        "{v}"
    );
    assert!(
        connect(addr, &nqn, Some(&old)).is_err(),
        "the old key is refused"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let k = HostKeys {
            host: new.clone(),
            ctrl: Some(secret(3)),
        };
        let o = HostOptions {
            hostnqn: HOST.into(),
            ..Default::default()
        };
        let a = HostAuth::new(k.host, k.ctrl);
        HostController::connect_auth(addr, &nqn, &o, 1, Some(&a))
            .await
            .expect("the new keys work");
    });
    let mut r = agent.get(format!("{url}/metrics")).call().unwrap();
    let m = r.body_mut().read_to_string().unwrap();
    assert!(
        m.lines()
            .any(|l| l.starts_with("millrace_nvme_auth_total{") && l.contains("result=\"failed\"")),
        "{m}"
    );
    let text = std::fs::read_to_string(&store).unwrap();
    assert!(text.contains(&new.encode()) && !text.contains(&old.encode()));
}
