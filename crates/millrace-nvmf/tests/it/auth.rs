//! In-band authentication (DH-HMAC-CHAP) over 127.0.0.1, driven by the crate's initiator:
//! right, wrong and missing secrets in both directions, commands refused before the
//! transaction succeeds, messages out of order and replayed, a host that stops half-way, and
//! a key rotated under a connected host.

use millrace_block::MemBlockDevice;
use millrace_nvmf::cmd::{fctype, prop, Status};
use millrace_nvmf::dhchap::msg::{self, Msg, Negotiate, Reply};
use millrace_nvmf::dhchap::{DhGroup, Hash, HostKeys, Secret};
use millrace_nvmf::initiator::{auth_sqe, Error, HostAuth, HostController, HostOptions, HostQueue};
use millrace_nvmf::{Namespace, SubsystemConfig, Target, TargetConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2024-01.io.millrace:auth";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000a1";
/// Allowed, without a secret.
const PLAIN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000a2";

fn secret(seed: u8, transform: Option<Hash>) -> Secret {
    Secret::new((0..32).map(|i| i ^ seed).collect(), transform).unwrap()
}

fn keys(bidi: bool) -> HostKeys {
    HostKeys {
        host: secret(1, Some(Hash::Sha256)),
        ctrl: bidi.then(|| secret(2, None)),
    }
}

async fn target(cfg: TargetConfig, k: HostKeys) -> (Target, SocketAddr) {
    let t = Target::new(cfg);
    let cfg = SubsystemConfig {
        nqn: NQN.into(),
        serial: "MR-AUTH".into(),
        model: "Millrace test".into(),
        namespaces: vec![Namespace {
            nsid: 1,
            dev: Arc::new(MemBlockDevice::new(16 << 20)),
            uuid: [3; 16],
            nguid: [4; 16],
            ana_group: 0,
        }],
        allowed_hosts: vec![HOST.into(), PLAIN.into()],
        allow_any_host: false,
    };
    t.add_subsystem_with_keys(cfg, vec![(HOST.into(), k)])
        .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let t2 = t.clone();
    tokio::spawn(async move { t2.serve(l).await });
    (t, addr)
}

fn host(nqn: &str) -> HostOptions {
    HostOptions {
        hostnqn: nqn.into(),
        ..Default::default()
    }
}

fn auth(k: &HostKeys, hash: Hash, group: DhGroup) -> HostAuth {
    HostAuth {
        hashes: vec![hash],
        groups: vec![group],
        ..HostAuth::new(k.host.clone(), k.ctrl.clone())
    }
}

fn counts(t: &Target) -> (u64, u64) {
    let i = &t.auth_info()[0];
    (i.succeeded, i.failed)
}

fn status(r: Result<impl std::fmt::Debug, Error>) -> Status {
    r.unwrap_err().status().expect("an NVMe status")
}

async fn io_works(c: &HostController) {
    let q = &c.io[0];
    q.write(1, 8, vec![0x5a; 4096], 4096).await.unwrap();
    assert_eq!(q.read(1, 8, 1, 4096).await.unwrap(), vec![0x5a; 4096]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn right_secrets_authenticate_every_queue() {
    let k = keys(false);
    let (t, addr) = target(TargetConfig::default(), k.clone()).await;
    let mut done = 0;
    for (hash, group) in [
        (Hash::Sha256, DhGroup::Null),
        (Hash::Sha512, DhGroup::Ffdhe2048),
        (Hash::Sha256, DhGroup::Ffdhe2048),
        (Hash::Sha384, DhGroup::Null),
    ] {
        let a = auth(&k, hash, group);
        let c = HostController::connect_auth(addr, NQN, &host(HOST), 2, Some(&a))
            .await
            .unwrap_or_else(|e| panic!("{hash:?} {group:?}: {e}"));
        assert!(c.admin.auth_required && c.io.iter().all(|q| q.auth_required));
        io_works(&c).await;
        done += 3;
        assert_eq!(counts(&t), (done, 0));
    }
    // A host without a secret on the subsystem is not asked to authenticate.
    let c = HostController::connect(addr, NQN, &host(PLAIN), 1)
        .await
        .unwrap();
    assert!(!c.admin.auth_required);
    io_works(&c).await;
    // The API shows which hosts authenticate, never the secret.
    let info = format!("{:?}", t.auth_info());
    assert!(info.contains(HOST) && !info.contains(&k.host.encode()[10..30]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_and_missing_secrets_are_refused() {
    let k = keys(false);
    let (t, addr) = target(TargetConfig::default(), k.clone()).await;
    for wrong in [
        secret(9, Some(Hash::Sha256)),
        secret(1, None),
        secret(1, Some(Hash::Sha512)),
    ] {
        let a = HostAuth::new(wrong, None);
        let e = HostController::connect_auth(addr, NQN, &host(HOST), 1, Some(&a))
            .await
            .err()
            .unwrap();
        assert!(e.to_string().contains("AUTH_Failure1"), "{e}");
    }
    assert_eq!(counts(&t), (0, 3));
    // No secret: Connect succeeds with ATR, and then nothing but authentication is served.
    let e = HostController::connect(addr, NQN, &host(HOST), 1)
        .await
        .err()
        .unwrap();
    assert_eq!(e.status(), Some(Status::AUTH_REQUIRED));
    // Its queue, closed without a transaction (as the Linux host without a secret hangs up),
    // counts as a refusal too.
    let start = Instant::now();
    while counts(&t) != (0, 4) {
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", counts(&t));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let q = HostQueue::connect(addr, &host(HOST), NQN, 0, 0xffff)
        .await
        .unwrap();
    assert!(q.auth_required);
    assert_eq!(
        status(q.property_get(prop::CAP, true).await),
        Status::AUTH_REQUIRED
    );
    assert_eq!(status(q.identify(1, 0).await), Status::AUTH_REQUIRED);
    assert_eq!(status(q.keep_alive().await), Status::AUTH_REQUIRED);
    // A failed authentication leaves the queue as unusable as before.
    let wrong = HostAuth::new(secret(7, None), None);
    assert!(q.authenticate(&wrong, HOST, NQN, 1).await.is_err());
    assert_eq!(
        status(q.property_get(prop::CAP, true).await),
        Status::AUTH_REQUIRED
    );
    // The right one then opens it.
    q.authenticate(&HostAuth::new(k.host.clone(), None), HOST, NQN, 2)
        .await
        .unwrap();
    q.property_get(prop::CAP, true).await.unwrap();
    // A queue whose transaction ended, either way, is not counted again when it closes.
    assert_eq!(counts(&t), (1, 5));
    drop(q);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(counts(&t), (1, 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bidirectional_with_right_and_wrong_controller_secrets() {
    let k = keys(true);
    let (t, addr) = target(TargetConfig::default(), k.clone()).await;
    for group in [DhGroup::Null, DhGroup::Ffdhe2048] {
        let a = auth(&k, Hash::Sha512, group);
        let c = HostController::connect_auth(addr, NQN, &host(HOST), 1, Some(&a))
            .await
            .unwrap();
        io_works(&c).await;
    }
    assert_eq!(counts(&t), (4, 0));
    // The host holds another controller secret: it refuses the controller (Failure2), and the
    // target does not count the queue as authenticated.
    let a = HostAuth::new(k.host.clone(), Some(secret(3, None)));
    let q = HostQueue::connect(addr, &host(HOST), NQN, 0, 0xffff)
        .await
        .unwrap();
    let e = q.authenticate(&a, HOST, NQN, 5).await.unwrap_err();
    assert!(e.to_string().contains("controller's response"), "{e}");
    assert_eq!(
        status(q.property_get(prop::CAP, true).await),
        Status::AUTH_REQUIRED
    );
    assert_eq!(counts(&t), (4, 1));
    // A host asking the controller to prove itself where no controller secret is set.
    let (t2, addr2) = target(TargetConfig::default(), keys(false)).await;
    let a = HostAuth::new(k.host.clone(), Some(secret(2, None)));
    let e = HostController::connect_auth(addr2, NQN, &host(HOST), 1, Some(&a))
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("AUTH_Failure1"), "{e}");
    assert_eq!(counts(&t2), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_is_refused_until_the_queue_authenticates() {
    let k = keys(false);
    let (_t, addr) = target(TargetConfig::default(), k.clone()).await;
    let a = HostAuth::new(k.host.clone(), None);
    let admin = HostQueue::connect_auth(addr, &host(HOST), NQN, 0, 0xffff, Some(&a))
        .await
        .unwrap();
    admin
        .property_set(prop::CC, 1 | 6 << 16 | 4 << 20)
        .await
        .unwrap();
    admin.set_features(0x07, 1 | 1 << 16).await.unwrap();
    // An I/O queue of the authenticated controller must authenticate too.
    let q = HostQueue::connect(addr, &host(HOST), NQN, 1, admin.cntlid)
        .await
        .unwrap();
    assert!(q.auth_required);
    assert_eq!(status(q.read(1, 0, 1, 4096).await), Status::AUTH_REQUIRED);
    assert_eq!(
        status(q.write(1, 0, vec![1; 4096], 4096).await),
        Status::AUTH_REQUIRED
    );
    // Data beyond an Authentication Send's 4 KiB is not taken either.
    assert_eq!(
        status(q.write(1, 0, vec![1; 64 << 10], 4096).await),
        Status::AUTH_REQUIRED
    );
    // Half-way through the transaction: still refused.
    let n = Msg::Negotiate(Negotiate {
        tid: 9,
        sc_c: 0,
        hashes: vec![1],
        groups: vec![0],
    });
    q.auth_send(&n.encode()).await.unwrap();
    q.auth_receive(4096).await.unwrap();
    assert_eq!(status(q.read(1, 0, 1, 4096).await), Status::AUTH_REQUIRED);
    // A fresh queue that completes it serves I/O.
    let q = HostQueue::connect_auth(addr, &host(HOST), NQN, 2, admin.cntlid, Some(&a))
        .await
        .unwrap();
    q.read(1, 0, 1, 4096).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_out_of_order_replayed_or_malformed_are_refused() {
    let k = keys(false);
    let (t, addr) = target(TargetConfig::default(), k.clone()).await;
    let o = host(HOST);
    let q = HostQueue::connect(addr, &o, NQN, 0, 0xffff).await.unwrap();
    let reply = Msg::Reply(Reply {
        tid: 1,
        r1: vec![0; 32],
        c2: None,
        seqnum: 0,
        dhv: vec![],
    });
    // A Reply with no transaction, a Receive with nothing to take.
    assert_eq!(
        status(q.auth_send(&reply.encode()).await),
        Status::COMMAND_SEQUENCE_ERROR
    );
    let failure = |b: Vec<u8>| match Msg::decode(&b) {
        Ok(Msg::Failure {
            first: true, why, ..
        }) => why,
        m => panic!("not a Failure1: {m:?}"),
    };
    assert_eq!(
        status(q.auth_receive(4096).await),
        Status::COMMAND_SEQUENCE_ERROR
    );
    // A Negotiate in the middle of a transaction.
    let neg = |tid| {
        Msg::Negotiate(Negotiate {
            tid,
            sc_c: 0,
            hashes: vec![1],
            groups: vec![0],
        })
        .encode()
    };
    q.auth_send(&neg(2)).await.unwrap();
    assert_eq!(
        status(q.auth_send(&neg(2)).await),
        Status::COMMAND_SEQUENCE_ERROR
    );
    assert_eq!(
        failure(q.auth_receive(4096).await.unwrap()),
        msg::why::INCORRECT_MESSAGE
    );
    // A Reply with another transaction's id.
    q.auth_send(&neg(3)).await.unwrap();
    q.auth_receive(4096).await.unwrap();
    q.auth_send(&reply.encode()).await.unwrap();
    assert_eq!(
        failure(q.auth_receive(4096).await.unwrap()),
        msg::why::INCORRECT_PAYLOAD
    );
    // A Receive too small for the Challenge, a wrong SECP, a length that is not the data's,
    // an undecodable message.
    q.auth_send(&neg(4)).await.unwrap();
    assert_eq!(status(q.auth_receive(8).await), Status::INVALID_FIELD);
    let mut bad = auth_sqe(fctype::AUTH_SEND, 72);
    bad.set_cdw(10, u32::from_le_bytes([0, 1, 1, 0xe8]));
    assert_eq!(
        status(q.submit(bad, Some(neg(5)), 0).await),
        Status::INVALID_FIELD
    );
    let short = auth_sqe(fctype::AUTH_SEND, 10);
    assert_eq!(
        status(q.submit(short, Some(neg(5)), 0).await),
        Status::INVALID_FIELD
    );
    assert_eq!(
        status(q.auth_send(&[0xee; 16]).await),
        Status::INVALID_FIELD
    );
    assert_eq!(
        status(q.property_get(prop::CAP, true).await),
        Status::AUTH_REQUIRED
    );
    // Replay: a Reply taken from a successful transaction on another queue, sent again with the
    // same transaction id after its own Negotiate, is refused (the challenge is new).
    let a = HostAuth::new(k.host.clone(), None);
    let seen = HostQueue::connect(addr, &o, NQN, 0, 0xffff).await.unwrap();
    seen.auth_send(&neg(6)).await.unwrap();
    let Msg::Challenge(c) = Msg::decode(&seen.auth_receive(4096).await.unwrap()).unwrap() else {
        panic!("no challenge");
    };
    let kh = a.secret.transformed(HOST);
    let r1 = millrace_nvmf::dhchap::response(
        c.hash,
        &kh,
        &c.c1,
        c.seqnum,
        6,
        millrace_nvmf::dhchap::Role::Host,
        HOST,
        NQN,
    );
    let good = Msg::Reply(Reply {
        tid: 6,
        r1,
        c2: None,
        seqnum: 0,
        dhv: vec![],
    })
    .encode();
    seen.auth_send(&good).await.unwrap();
    assert!(matches!(
        Msg::decode(&seen.auth_receive(4096).await.unwrap()),
        Ok(Msg::Success1 { .. })
    ));
    seen.property_get(prop::CAP, true).await.unwrap();
    let fresh = HostQueue::connect(addr, &o, NQN, 0, 0xffff).await.unwrap();
    fresh.auth_send(&neg(6)).await.unwrap();
    fresh.auth_receive(4096).await.unwrap();
    fresh.auth_send(&good).await.unwrap();
    assert_eq!(
        failure(fresh.auth_receive(4096).await.unwrap()),
        msg::why::FAILED
    );
    assert_eq!(
        status(fresh.property_get(prop::CAP, true).await),
        Status::AUTH_REQUIRED
    );
    // A host without a secret here cannot start a transaction.
    let plain = HostQueue::connect(addr, &host(PLAIN), NQN, 0, 0xffff)
        .await
        .unwrap();
    assert_eq!(
        status(plain.auth_send(&neg(1)).await),
        Status::INVALID_FIELD
    );
    assert!(counts(&t).1 >= 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_stops_mid_transaction_is_dropped() {
    let cfg = TargetConfig {
        handshake_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let (t, addr) = target(cfg, keys(false)).await;
    let q = HostQueue::connect(addr, &host(HOST), NQN, 0, 0xffff)
        .await
        .unwrap();
    let n = Msg::Negotiate(Negotiate {
        tid: 1,
        sc_c: 0,
        hashes: vec![3],
        groups: vec![1],
    });
    q.auth_send(&n.encode()).await.unwrap();
    let start = Instant::now();
    while !q.is_closed() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the queue was kept open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(t.stats().timeouts >= 1);
    // An authenticated queue is not held to that deadline.
    let a = HostAuth::new(keys(false).host, None);
    let c = HostController::connect_auth(addr, NQN, &host(HOST), 1, Some(&a))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    io_works(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_keeps_connected_hosts_and_serves_new_authentications() {
    let old = keys(false);
    let (t, addr) = target(TargetConfig::default(), old.clone()).await;
    let a_old = HostAuth::new(old.host.clone(), None);
    let c = HostController::connect_auth(addr, NQN, &host(HOST), 1, Some(&a_old))
        .await
        .unwrap();
    let new = HostKeys {
        host: secret(0x42, Some(Hash::Sha384)),
        ctrl: None,
    };
    t.set_host_keys(NQN, HOST, Some(new.clone())).unwrap();
    io_works(&c).await;
    assert!(
        HostController::connect_auth(addr, NQN, &host(HOST), 1, Some(&a_old))
            .await
            .is_err()
    );
    let a_new = HostAuth::new(new.host.clone(), None);
    let c2 = HostController::connect_auth(addr, NQN, &host(HOST), 1, Some(&a_new))
        .await
        .unwrap();
    io_works(&c2).await;
    // Re-authentication of the connected admin queue with the new key keeps it; with the old
    // one it loses it.
    c.admin.authenticate(&a_new, HOST, NQN, 77).await.unwrap();
    c.admin.property_get(prop::CAP, true).await.unwrap();
    assert!(c.admin.authenticate(&a_old, HOST, NQN, 78).await.is_err());
    assert_eq!(
        status(c.admin.property_get(prop::CAP, true).await),
        Status::AUTH_REQUIRED
    );
    // Removing the secret: new queues are no longer asked to authenticate.
    t.set_host_keys(NQN, HOST, None).unwrap();
    let c3 = HostController::connect(addr, NQN, &host(HOST), 1)
        .await
        .unwrap();
    assert!(!c3.admin.auth_required);
}
