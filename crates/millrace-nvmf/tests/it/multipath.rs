//! Multipath and ANA: one subsystem reached through two NVMe/TCP listeners (two paths), each
//! path with its own ANA state per group, driven by the crate's own initiator over 127.0.0.1.

use millrace_block::MemBlockDevice;
use millrace_nvmf::cmd::{self, Sqe, Status};
use millrace_nvmf::initiator::{
    discover, Completion, Error, HostController, HostOptions, HostQueue,
};
use millrace_nvmf::{AnaState, Namespace, SubsystemConfig, Target, TargetConfig, Transport};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const NQN: &str = "nqn.2024-01.io.millrace:multipath";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000bb";
/// The ANA log page's id, and the ANA change notice an Async Event Request completes with.
const ANA_LOG: u8 = 0x0c;
const ANA_CHANGE_EVENT: u32 = 0x000c_0302;

struct Paths {
    t: Target,
    a: SocketAddr,
    b: SocketAddr,
}

fn ns(nsid: u32, ana_group: u32) -> Namespace {
    Namespace {
        nsid,
        dev: Arc::new(MemBlockDevice::new(8 << 20)),
        uuid: [nsid as u8; 16],
        nguid: [0x40 + nsid as u8; 16],
        ana_group,
    }
}

/// A subsystem with namespace 1 in group 1 (by default) and namespace 2 in group 5, served on
/// two listeners.
async fn two_paths() -> Paths {
    let t = Target::new(TargetConfig::default());
    t.add_subsystem(SubsystemConfig {
        nqn: NQN.into(),
        serial: "MR-MPATH".into(),
        model: "Millrace test".into(),
        namespaces: vec![ns(1, 0), ns(2, 5)],
        allowed_hosts: vec![HOST.into()],
        allow_any_host: false,
    })
    .unwrap();
    let mut at = Vec::new();
    for _ in 0..2 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        at.push(l.local_addr().unwrap());
        let t2 = t.clone();
        tokio::spawn(async move { t2.serve(l).await });
    }
    // `serve` names its listener before it accepts; wait until both are named.
    for _ in 0..100 {
        if t.listen_addrs().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Paths {
        t,
        a: at[0],
        b: at[1],
    }
}

fn host() -> HostOptions {
    HostOptions {
        hostnqn: HOST.into(),
        ..Default::default()
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// (group, state, namespace ids) of each descriptor of an ANA log page.
fn ana_groups(page: &[u8]) -> Vec<(u32, u8, Vec<u32>)> {
    let n = u16::from_le_bytes([page[8], page[9]]) as usize;
    let mut at = 16;
    let mut v = Vec::new();
    for _ in 0..n {
        let (group, count) = (u32_at(page, at), u32_at(page, at + 4) as usize);
        let state = page[at + 16];
        at += 32;
        let ids = (0..count).map(|i| u32_at(page, at + 4 * i)).collect();
        at += 4 * count;
        v.push((group, state, ids));
    }
    v
}

async fn ana_log(c: &HostController) -> Vec<(u32, u8, Vec<u32>)> {
    ana_groups(&c.admin.get_log_page(ANA_LOG, 4096, 0).await.unwrap())
}

fn parked_aer(q: &Arc<HostQueue>) -> tokio::task::JoinHandle<Result<Completion, Error>> {
    let q = q.clone();
    tokio::spawn(async move {
        q.submit(Sqe::new(cmd::admin::ASYNC_EVENT_REQUEST, 0, 0), None, 0)
            .await
    })
}

fn path_status(sc: u8) -> Status {
    Status {
        sct: 3,
        sc,
        dnr: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_lists_each_listener_and_identify_reports_ana() {
    let p = two_paths().await;
    let d = discover(p.a, &host()).await.unwrap();
    assert_eq!(d.len(), 2, "one entry per listener: {d:?}");
    let mut services: Vec<String> = d.iter().map(|e| e.trsvcid.clone()).collect();
    services.sort();
    let mut want = vec![p.a.port().to_string(), p.b.port().to_string()];
    want.sort();
    assert_eq!(services, want);
    assert_ne!(d[0].portid, d[1].portid);
    assert!(d
        .iter()
        .all(|e| e.subnqn == NQN && e.traddr == "127.0.0.1" && e.trtype == 3));

    let c = HostController::connect(p.b, NQN, &host(), 1).await.unwrap();
    let id = &c.id_ctrl;
    assert_eq!(
        id[76] & 0b1010,
        0b1010,
        "CMIC: multi-controller and ANA reporting"
    );
    assert_ne!(u32_at(id, 92) & 1 << 11, 0, "OAES: ANA change notices");
    assert_eq!(id[342], 10, "ANATT");
    assert_eq!(id[343] & 0x1f, 0x1f, "ANACAP: every state reported");
    assert_eq!(u32_at(id, 344), millrace_nvmf::ANA_GROUP_MAX, "ANAGRPMAX");
    assert_eq!(u32_at(id, 348), millrace_nvmf::ANA_GROUP_MAX, "NANAGRPID");
    let n1 = c.admin.identify(0, 1).await.unwrap();
    let n2 = c.admin.identify(0, 2).await.unwrap();
    assert_eq!((u32_at(&n1, 92), u32_at(&n2, 92)), (1, 5), "ANAGRPID");
    assert_eq!(n1[30] & 1, 1, "NMIC: the namespace may be shared");
    // Both paths to both groups, all optimized until told otherwise.
    let paths = &p.t.subsystems()[0].paths;
    assert_eq!(paths.len(), 4);
    assert!(paths.iter().all(|x| x.state == AnaState::Optimized));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ana_log_is_per_path_and_a_change_raises_an_event_on_that_path_only() {
    let p = two_paths().await;
    let a = HostController::connect(p.a, NQN, &host(), 1).await.unwrap();
    let b = HostController::connect(p.b, NQN, &host(), 1).await.unwrap();
    assert_eq!(
        ana_log(&a).await,
        vec![(1, 1, vec![1]), (5, 1, vec![2])],
        "groups, optimized, with their namespaces"
    );
    for c in [&a, &b] {
        c.admin.set_features(0x0b, 1 << 11).await.unwrap();
    }
    let (ev_a, ev_b) = (parked_aer(&a.admin), parked_aer(&b.admin));
    tokio::time::sleep(Duration::from_millis(50)).await;
    p.t.set_ana_state(NQN, Transport::Tcp, p.a, 1, AnaState::Inaccessible)
        .unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(2), ev_a)
        .await
        .expect("the path's controller is told")
        .unwrap()
        .unwrap();
    assert_eq!(ev.cqe.result as u32, ANA_CHANGE_EVENT);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !ev_b.is_finished(),
        "the other path's controller is not told"
    );
    assert_eq!(ana_log(&a).await, vec![(1, 3, vec![1]), (5, 1, vec![2])]);
    assert_eq!(ana_log(&b).await, vec![(1, 1, vec![1]), (5, 1, vec![2])]);
    // RGO (LSP bit 0): the groups without their namespace ids.
    let mut sqe = Sqe::new(cmd::admin::GET_LOG_PAGE, 0, u32::MAX);
    sqe.set_cdw(10, ANA_LOG as u32 | 1 << 8 | (1024 - 1) << 16);
    let rgo = a.admin.submit(sqe, None, 4096).await.unwrap().data;
    assert_eq!(ana_groups(&rgo), vec![(1, 3, vec![]), (5, 1, vec![])]);
    // The change count moves with each change.
    let before = u64::from_le_bytes(rgo[0..8].try_into().unwrap());
    p.t.set_ana_state(NQN, Transport::Tcp, p.b, 5, AnaState::NonOptimized)
        .unwrap();
    let after = b.admin.get_log_page(ANA_LOG, 4096, 0).await.unwrap();
    assert!(u64::from_le_bytes(after[0..8].try_into().unwrap()) > before);
    let ev = tokio::time::timeout(Duration::from_secs(2), ev_b).await;
    assert_eq!(
        ev.unwrap().unwrap().unwrap().cqe.result as u32,
        ANA_CHANGE_EVENT
    );
    let info = &p.t.subsystems()[0];
    let state = |l, g| {
        (info.paths.iter())
            .find(|x| x.listener == l && x.ana_group == g)
            .map(|x| x.state)
    };
    assert_eq!(state(p.a, 1), Some(AnaState::Inaccessible));
    assert_eq!(state(p.b, 5), Some(AnaState::NonOptimized));
    assert_eq!(state(p.b, 1), Some(AnaState::Optimized));
    assert!(info.hosts.iter().any(|h| h.listener == Some(p.a)));
    assert!(info.hosts.iter().any(|h| h.listener == Some(p.b)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_through_an_inaccessible_path_gets_the_path_status_while_the_other_path_serves() {
    let p = two_paths().await;
    let a = HostController::connect(p.a, NQN, &host(), 1).await.unwrap();
    let b = HostController::connect(p.b, NQN, &host(), 1).await.unwrap();
    let (qa, qb) = (&a.io[0], &b.io[0]);
    qa.write(1, 0, vec![1; 4096], 4096).await.unwrap();
    for (state, sc) in [
        (AnaState::Inaccessible, 0x02),
        (AnaState::PersistentLoss, 0x01),
        (AnaState::Change, 0x03),
    ] {
        p.t.set_ana_state(NQN, Transport::Tcp, p.a, 1, state)
            .unwrap();
        let e = qa.write(1, 0, vec![9; 4096], 4096).await.unwrap_err();
        assert_eq!(
            e.status(),
            Some(path_status(sc)),
            "{state}: retryable path status"
        );
        let e = qa.read(1, 0, 1, 4096).await.unwrap_err();
        assert_eq!(e.status(), Some(path_status(sc)));
        // The other group on the same path, and the same group on the other path, serve.
        qa.write(2, 0, vec![2; 4096], 4096).await.unwrap();
        assert_eq!(qb.read(1, 0, 1, 4096).await.unwrap(), vec![1; 4096]);
    }
    p.t.set_ana_state(NQN, Transport::Tcp, p.a, 1, AnaState::NonOptimized)
        .unwrap();
    qa.write(1, 1, vec![3; 4096], 4096).await.unwrap();
    p.t.set_ana_state(NQN, Transport::Tcp, p.a, 1, AnaState::Optimized)
        .unwrap();
    assert_eq!(qa.read(1, 1, 1, 4096).await.unwrap(), vec![3; 4096]);
    assert_eq!(qb.read(1, 0, 1, 4096).await.unwrap(), vec![1; 4096]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ana_requests_are_refused_with_a_reason() {
    let p = two_paths().await;
    let nowhere: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let e =
        (p.t.set_ana_state(NQN, Transport::Tcp, nowhere, 1, AnaState::Inaccessible))
            .unwrap_err()
            .to_string();
    assert!(
        e.contains("no tcp listener on 127.0.0.1:1") && e.contains(&p.a.to_string()),
        "{e}"
    );
    let e =
        (p.t.set_ana_state(NQN, Transport::Rdma, p.a, 1, AnaState::Inaccessible))
            .unwrap_err()
            .to_string();
    assert!(e.contains("no rdma listener"), "{e}");
    let e =
        (p.t.set_ana_state(NQN, Transport::Tcp, p.a, 2, AnaState::Inaccessible))
            .unwrap_err()
            .to_string();
    assert!(
        e.contains("no namespace in ANA group 2") && e.contains("1, 5"),
        "{e}"
    );
    let e = (p.t.set_ana_state(
        "nqn.2024-01.io.millrace:none",
        Transport::Tcp,
        p.a,
        1,
        AnaState::Optimized,
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("no subsystem"), "{e}");
    let e = p.t.add_namespace(NQN, ns(3, 129)).unwrap_err().to_string();
    assert!(e.contains("ANA group 129 is out of range"), "{e}");
    let e = "sideways".parse::<AnaState>().unwrap_err();
    assert!(e.contains("use optimized, non-optimized"), "{e}");
    // Nothing changed.
    assert!(p.t.subsystems()[0]
        .paths
        .iter()
        .all(|x| x.state == AnaState::Optimized));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_raises_the_namespace_attribute_notice() {
    let p = two_paths().await;
    let c = HostController::connect(p.a, NQN, &host(), 1).await.unwrap();
    c.admin.set_features(0x0b, 1 << 8 | 1 << 11).await.unwrap();
    let ev = parked_aer(&c.admin);
    tokio::time::sleep(Duration::from_millis(50)).await;
    p.t.resize_namespace(NQN, 2).unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(2), ev).await;
    // Notice, namespace attribute changed, Changed Namespace List log (04h).
    assert_eq!(ev.unwrap().unwrap().unwrap().cqe.result as u32, 0x0004_0002);
    let log = c.admin.get_log_page(4, 4096, 0).await.unwrap();
    assert_eq!((u32_at(&log, 0), u32_at(&log, 4)), (2, 0));
}
