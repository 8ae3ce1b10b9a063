//! NVMe/TCP's secure channel through the server (#49): `nvme_tls: Required` on the listener, a
//! host's TLS PSK given through the API (a damaged key refused with a sentence that does not
//! quote it), shown only as the host's name and kept 0600; after a restart OpenSSL's client
//! completes the handshake with that key and a wrong key is refused. The restart sends SIGTERM
//! to its own process (hence tests/stops/, one test at a time).

use crate::common;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use millrace_nvmf::tls::{psk, Psk};
use openssl::ssl::{Ssl, SslContext, SslMethod, SslVersion};
use serde_json::{json, Value};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000049-0000-0000-0000-0000000000c1";
const KEY: &str = "NVMeTLSkey-1:01:EBESExQVFhcYGRobHB0eHyAhIiMkJSYnKCkqKywtLi9A/ow7:";
const WRONG: &str = "NVMeTLSkey-1:00:oKGio6SlpqeoqaqrrK2ur7CxsrO0tba3uLm6u7y9vr8G4daz:";

/// Whether OpenSSL's client completes a TLS 1.3 handshake with `key` as HOST on `nqn`.
fn handshake(addr: std::net::SocketAddr, nqn: &str, key: &str) -> bool {
    let key = Psk::parse(key).unwrap();
    let id = psk::identity(key.suite(), HOST, nqn);
    let tls = key.tls_key(HOST, &id).unwrap().to_vec();
    let mut b = SslContext::builder(SslMethod::tls_client()).unwrap();
    b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
    b.set_ciphersuites("TLS_AES_128_GCM_SHA256").unwrap();
    b.set_psk_client_callback(move |_, _, idb, pskb| {
        idb[..id.len()].copy_from_slice(id.as_bytes());
        idb[id.len()] = 0;
        pskb[..tls.len()].copy_from_slice(&tls);
        Ok(tls.len())
    });
    let sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let Ok(mut s) = Ssl::new(&b.build()).unwrap().connect(sock) else {
        return false;
    };
    // What follows depends on kernel TLS (tests/guest/nvme-tls-ktls.sh); the key was accepted.
    let _ = s.write_all(&millrace_nvmf::initiator::ic_req_pdu());
    let _ = s.read(&mut [0u8; 8]);
    true
}

#[test]
fn tls_psks_are_kept_hidden_and_survive_a_restart() {
    let _turn = crate::ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let cfg = || millrace_server::ServeConfig {
        nvme: vec!["127.0.0.1:0".parse().unwrap()],
        nvme_tls: millrace_service::nvme_tls::TlsMode::Required,
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
    let body = json!({"name": "tank", "level": "raid1", "drives": drives, "create_size_bytes": 16u64 << 20});
    assert_eq!(
        common::call(&agent, &url, "POST", "/api/v1/pools", Some(body)).0,
        201
    );
    let body = json!({"name": "v", "size_bytes": 4u64 << 20});
    assert_eq!(
        common::call(
            &agent,
            &url,
            "POST",
            "/api/v1/pools/tank/volumes",
            Some(body)
        )
        .0,
        201
    );
    let body = json!({"pool": "tank", "volume": "v", "hosts": [HOST]});
    let (st, v) = common::call(&agent, &url, "POST", "/api/v1/exports/nvme", Some(body));
    assert_eq!(st, 201, "{v}");
    let nqn = serde_json::from_str::<Value>(&v).unwrap()["nqn"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("/api/v1/exports/nvme/tank/v/hosts/{HOST}/dhchap");

    let bad = KEY.replace("EBES", "EBEA");
    let (st, v) = common::call(&agent, &url, "PUT", &path, Some(json!({"tls_psk": bad})));
    assert_eq!(st, 400, "{v}");
    assert!(v.contains("checksum") && !v.contains(&KEY[16..40]), "{v}");
    let (st, v) = common::call(&agent, &url, "PUT", &path, Some(json!({"tls_psk": KEY})));
    assert_eq!(st, 200, "{v}");
    let view: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(view["tls_psk"], json!([HOST]), "{v}");
    let (_, ex) = common::call(&agent, &url, "GET", "/api/v1/exports", None);
    assert!(
        !ex.contains(&KEY[16..40]) && !v.contains(&KEY[16..40]),
        "{ex}"
    );
    let store = home.join("tls-psk.json");
    let mode = std::fs::metadata(&store).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    crate::sigterm();
    server.join().unwrap().expect("the server stops cleanly");
    let c2 = cfg();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(millrace_server::run(c2))
    });
    let url = common::wait_url(&home, Some(&url));
    let (_, st) = common::call(&agent, &url, "GET", "/api/v1/status", None);
    let st: Value = serde_json::from_str(&st).unwrap();
    let l = &st["nvme_listeners"][0];
    let addr: std::net::SocketAddr = format!("{}:{}", l["address"].as_str().unwrap(), l["port"])
        .parse()
        .unwrap();
    assert!(
        handshake(addr, &nqn, KEY),
        "the stored key works after a restart"
    );
    assert!(!handshake(addr, &nqn, WRONG), "a wrong key is refused");
    let mut r = agent.get(format!("{url}/metrics")).call().unwrap();
    let m = r.body_mut().read_to_string().unwrap();
    assert!(m.contains("millrace_nvme_tls_hosts"), "{m}");
}
