//! NVMe/TCP's secure channel over 127.0.0.1 against an independent TLS client (OpenSSL's, in
//! its own thread, with the PSK identity and key computed by the client side of this test
//! from the interchange key): the handshake completes with the right key, a wrong key and an
//! unknown identity are refused, a plain host is refused, and hosts that stall or hang up
//! mid-handshake neither hold up others nor end the server. After the handshake the server
//! hands the records to kernel TLS: where the kernel has it, an ICReq sent through the TLS
//! client gets its ICResp; where it does not (no `tls` module), the connection is closed.

use millrace_block::MemBlockDevice;
use millrace_nvmf::initiator::{connect_pdu, discover, ic_req_pdu, HostOptions};
use millrace_nvmf::tls::{psk, Psk, TlsMode};
use millrace_nvmf::{Namespace, SubsystemConfig, Target, TargetConfig};
use openssl::ssl::{Ssl, SslContext, SslMethod, SslVersion};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2024-01.io.millrace:tls";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000b1";
const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000b2";
/// The first vector of tests/data/tls_psk_vectors.txt (hash 01, 32 bytes).
const KEY: &str = "NVMeTLSkey-1:01:EBESExQVFhcYGRobHB0eHyAhIiMkJSYnKCkqKywtLi9A/ow7:";
/// The second vector (hash 02, 48 bytes: TLS_AES_256_GCM_SHA384), for HOST384.
const KEY384: &str =
    "NVMeTLSkey-1:02:AwoRGB8mLTQ7QklQV15lbHN6gYiPlp2kq7K5wMfO1dzj6vH4/wYNFBsiKTA3PkVMRdxyRQ==:";
const HOST384: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000b3";
/// Another valid key (hash 00).
const WRONG: &str = "NVMeTLSkey-1:00:oKGio6SlpqeoqaqrrK2ur7CxsrO0tba3uLm6u7y9vr8G4daz:";

async fn target(timeout: Duration) -> (Target, SocketAddr, SocketAddr) {
    let t = Target::new(TargetConfig {
        handshake_timeout: timeout,
        ..Default::default()
    });
    t.add_subsystem(SubsystemConfig {
        nqn: NQN.into(),
        serial: "MR-TLS".into(),
        model: "Millrace test".into(),
        namespaces: vec![Namespace {
            nsid: 1,
            dev: Arc::new(MemBlockDevice::new(16 << 20)),
            uuid: [3; 16],
            nguid: [4; 16],
            ana_group: 0,
        }],
        allowed_hosts: vec![HOST.into(), OTHER.into(), HOST384.into()],
        allow_any_host: false,
    })
    .unwrap();
    t.set_host_tls_psk(NQN, HOST, Some(Psk::parse(KEY).unwrap()))
        .unwrap();
    t.set_host_tls_psk(NQN, HOST384, Some(Psk::parse(KEY384).unwrap()))
        .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let t2 = t.clone();
    tokio::spawn(async move { t2.serve_with(l, TlsMode::Required).await });
    let d = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let daddr = d.local_addr().unwrap();
    let t3 = t.clone();
    tokio::spawn(async move { t3.serve_discovery(d).await });
    (t, addr, daddr)
}

/// What the client saw.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// The handshake failed.
    Refused,
    /// The handshake completed; then the ICReq got an ICResp (kernel TLS took over) and the
    /// admin queue's Connect got this status (0: connected).
    Served(u16),
    /// The handshake completed; then the server closed (no kernel TLS here).
    ClosedAfter,
}

// OpenSSL's external-PSK client call (1.1.1+) that the openssl crates do not wrap, for the
// SHA-384 suite (the simple PSK client callback is SHA-256 only under TLS 1.3).
type UseSession = unsafe extern "C" fn(
    *mut openssl_sys::SSL,
    *const openssl_sys::EVP_MD,
    *mut *const u8,
    *mut usize,
    *mut *mut openssl_sys::SSL_SESSION,
) -> libc::c_int;
extern "C" {
    fn SSL_CTX_set_psk_use_session_callback(c: *mut openssl_sys::SSL_CTX, cb: Option<UseSession>);
    fn SSL_SESSION_new() -> *mut openssl_sys::SSL_SESSION;
    fn SSL_SESSION_set1_master_key(
        s: *mut openssl_sys::SSL_SESSION,
        k: *const u8,
        n: usize,
    ) -> libc::c_int;
    fn SSL_CIPHER_find(
        ssl: *mut openssl_sys::SSL,
        code: *const u8,
    ) -> *const openssl_sys::SSL_CIPHER;
    fn SSL_SESSION_set_cipher(
        s: *mut openssl_sys::SSL_SESSION,
        c: *const openssl_sys::SSL_CIPHER,
    ) -> libc::c_int;
    fn SSL_SESSION_set_protocol_version(
        s: *mut openssl_sys::SSL_SESSION,
        v: libc::c_int,
    ) -> libc::c_int;
}

thread_local! {
    /// The identity and TLS PSK the use-session callback offers (the client runs on one thread).
    static OFFER: std::cell::RefCell<(Vec<u8>, Vec<u8>)> = Default::default();
}

unsafe extern "C" fn use_session(
    ssl: *mut openssl_sys::SSL,
    _md: *const openssl_sys::EVP_MD,
    id: *mut *const u8,
    idlen: *mut usize,
    sess: *mut *mut openssl_sys::SSL_SESSION,
) -> libc::c_int {
    OFFER.with(|o| {
        let o = o.borrow();
        // Leaked: OpenSSL reads the identity after the callback returns; a test's few bytes.
        let ident: &'static [u8] = Box::leak(o.0.clone().into_boxed_slice());
        let s = SSL_SESSION_new();
        let c = SSL_CIPHER_find(ssl, [0x13, 0x02].as_ptr());
        assert!(!s.is_null() && !c.is_null());
        assert_eq!(SSL_SESSION_set1_master_key(s, o.1.as_ptr(), o.1.len()), 1);
        assert_eq!(SSL_SESSION_set_cipher(s, c), 1);
        assert_eq!(
            SSL_SESSION_set_protocol_version(s, openssl_sys::TLS1_3_VERSION),
            1
        );
        *id = ident.as_ptr();
        *idlen = ident.len();
        *sess = s;
        1
    })
}

/// OpenSSL's client with TLS_AES_256_GCM_SHA384 and an external PSK given as a session (the
/// identity `NVMe0R02 <host> <subsystem>`), then an ICReq and a Connect as `host`.
fn client384(addr: SocketAddr, host: &str, key: &str) -> Outcome {
    let key = Psk::parse(key).unwrap();
    assert_eq!(key.suite(), millrace_nvmf::tls::Suite::Aes256Sha384);
    let id = psk::identity(key.suite(), host, NQN);
    let tls = key.tls_key(host, &id).unwrap().to_vec();
    OFFER.with(|o| *o.borrow_mut() = (id.into_bytes(), tls));
    let mut b = SslContext::builder(SslMethod::tls_client()).unwrap();
    b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
    b.set_max_proto_version(Some(SslVersion::TLS1_3)).unwrap();
    b.set_ciphersuites("TLS_AES_256_GCM_SHA384").unwrap();
    // SAFETY: the callback has OpenSSL's signature and lives as long as the program.
    unsafe { SSL_CTX_set_psk_use_session_callback(b.as_ptr(), Some(use_session)) };
    finish(b.build(), addr, host)
}

/// OpenSSL's client, TLS 1.3 with TLS_AES_128_GCM_SHA256 and an external PSK: the identity
/// `NVMe0R01 <host> <subsystem>` and the TLS PSK derived from `key` for `host`; through it an
/// ICReq, then a Connect of an admin queue as `connect_as`.
fn client(addr: SocketAddr, host: &str, key: &str, connect_as: &str) -> Outcome {
    let key = Psk::parse(key).unwrap();
    let id = psk::identity(key.suite(), host, NQN);
    let tls = key.tls_key(host, &id).unwrap().to_vec();
    let mut b = SslContext::builder(SslMethod::tls_client()).unwrap();
    b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
    b.set_max_proto_version(Some(SslVersion::TLS1_3)).unwrap();
    b.set_ciphersuites("TLS_AES_128_GCM_SHA256").unwrap();
    b.set_psk_client_callback(move |_ssl, _hint, idb, pskb| {
        idb[..id.len()].copy_from_slice(id.as_bytes());
        idb[id.len()] = 0;
        pskb[..tls.len()].copy_from_slice(&tls);
        Ok(tls.len())
    });
    finish(b.build(), addr, connect_as)
}

/// Connects, runs the client's handshake, then sends an ICReq and a Connect as `connect_as`.
fn finish(ctx: SslContext, addr: SocketAddr, connect_as: &str) -> Outcome {
    let sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let Ok(mut s) = Ssl::new(&ctx).unwrap().connect(sock) else {
        return Outcome::Refused;
    };
    if s.write_all(&ic_req_pdu()).is_err() {
        return Outcome::ClosedAfter;
    }
    let mut resp = [0u8; 128];
    if s.read_exact(&mut resp).is_err() {
        return Outcome::ClosedAfter;
    }
    assert_eq!(resp[0], 1, "an ICResp");
    let o = HostOptions {
        hostnqn: connect_as.into(),
        ..Default::default()
    };
    s.write_all(&connect_pdu(&o, NQN, 0, 32, 0xffff)).unwrap();
    // A capsule response: an 8-byte header and the 16-byte completion (status in DW3 17..31).
    let mut cap = [0u8; 24];
    s.read_exact(&mut cap).unwrap();
    assert_eq!(cap[0], 5, "a capsule response");
    Outcome::Served(u16::from_le_bytes([cap[22], cap[23]]) >> 1)
}

async fn run_as(
    addr: SocketAddr,
    host: &'static str,
    key: &'static str,
    connect_as: &'static str,
) -> Outcome {
    tokio::task::spawn_blocking(move || client(addr, host, key, connect_as))
        .await
        .unwrap()
}

async fn run_384(addr: SocketAddr, host: &'static str, key: &'static str) -> Outcome {
    tokio::task::spawn_blocking(move || client384(addr, host, key))
        .await
        .unwrap()
}

async fn run_client(addr: SocketAddr, host: &'static str, key: &'static str) -> Outcome {
    run_as(addr, host, key, host).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psk_handshakes_are_checked() {
    let (t, addr, daddr) = target(Duration::from_secs(10)).await;
    let good = run_client(addr, HOST, KEY).await;
    // Kernel TLS decides what follows the handshake; the handshake itself must succeed.
    let ktls = millrace_nvmf::tls::kernel_tls_listed();
    assert_eq!(
        good,
        if ktls {
            Outcome::Served(0)
        } else {
            Outcome::ClosedAfter
        },
        "kernel TLS listed: {ktls}"
    );
    if ktls {
        // The connection proved HOST's identity: a Connect as another host is refused.
        let other = run_as(addr, HOST, KEY, OTHER).await;
        assert!(matches!(other, Outcome::Served(st) if st != 0), "{other:?}");
        let t2 = run_384(addr, HOST384, KEY384).await;
        assert_eq!(t2, Outcome::Served(0), "TLS_AES_256_GCM_SHA384");
    } else {
        assert_eq!(run_384(addr, HOST384, KEY384).await, Outcome::ClosedAfter);
        eprintln!("this kernel has no kernel TLS: only the handshakes are checked here (the guest checks the rest: tests/guest/nvme-tls.sh)");
    }
    assert_eq!(run_client(addr, HOST, WRONG).await, Outcome::Refused);
    // OTHER is allowed on the subsystem but has no PSK: its identity is unknown.
    assert_eq!(run_client(addr, OTHER, KEY).await, Outcome::Refused);
    assert!(t.stats().connections_refused >= 2);
    // The right key after refusals still works.
    assert_ne!(run_client(addr, HOST, KEY).await, Outcome::Refused);
    assert_eq!(
        t.tls_hosts(NQN).unwrap(),
        vec![HOST.to_string(), HOST384.to_string()]
    );

    // A plain NVMe/TCP host (an ICReq where a ClientHello belongs) is closed without reply.
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    plain.write_all(&ic_req_pdu()).await.unwrap();
    let mut b = [0u8; 128];
    let n = tokio::time::timeout(Duration::from_secs(10), plain.read(&mut b))
        .await
        .expect("the server closes a plain host")
        .unwrap_or(0);
    assert_eq!(n, 0, "no ICResp in the clear");

    // The discovery log says TLS 1.3 is required on this listener.
    let o = HostOptions {
        hostnqn: HOST.into(),
        ..Default::default()
    };
    let log = discover(daddr, &o).await.unwrap();
    let e = log
        .iter()
        .find(|e| e.trsvcid == addr.port().to_string())
        .unwrap();
    assert_eq!(
        (e.treq & 3, e.sectype),
        (1, 2),
        "TREQ required, SECTYPE TLS 1.3"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_and_vanishing_hosts_hold_up_no_one() {
    let (t, addr, _) = target(Duration::from_secs(2)).await;
    // One host connects and sends nothing; another sends half a ClientHello and hangs up.
    let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
        half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00])
            .await
            .unwrap();
    }
    // Meanwhile a good host is served at once.
    let t0 = Instant::now();
    assert_ne!(run_client(addr, HOST, KEY).await, Outcome::Refused);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // The stalled host is dropped at the handshake deadline.
    use tokio::io::AsyncReadExt;
    let mut b = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), stalled.read(&mut b))
        .await
        .expect("the stalled host is closed at the deadline")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(t.stats().timeouts >= 1);
    // And the server still serves.
    assert_ne!(run_client(addr, HOST, KEY).await, Outcome::Refused);
}
