//! Issue #16's NVMe/TCP items against a running target: connections that stall before Connect
//! or mid-PDU are closed in bounded time, connections per address are bounded, an empty host
//! NQN is accepted only where any host may connect, and every refused Connect is logged (at a
//! bounded rate) and counted under the transport it came on.

use millrace_block::MemBlockDevice;
use millrace_nvmf::cmd::{fctype, Sqe, Status};
use millrace_nvmf::initiator::{connect_data, HostController, HostOptions, HostQueue};
use millrace_nvmf::{Namespace, SubsystemConfig, Target, TargetConfig, Transport, TransportInfo};
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

const CLOSED: &str = "nqn.2024-01.io.millrace:closed";
const OPEN: &str = "nqn.2024-01.io.millrace:open";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000cc";

/// Everything the target logs, for the tests that check a refusal was logged.
fn log() -> &'static Mutex<Vec<u8>> {
    static LOG: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    let l = LOG.get_or_init(|| Mutex::new(Vec::new()));
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        struct W;
        impl Write for W {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                log().lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        tracing_subscriber::fmt()
            .with_writer(|| W)
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .init();
    });
    l
}

fn log_lines(containing: &str) -> Vec<String> {
    let text = String::from_utf8_lossy(&log().lock().unwrap()).to_string();
    text.lines()
        .filter(|l| l.contains(containing))
        .map(str::to_string)
        .collect()
}

async fn target(cfg: TargetConfig) -> (Target, SocketAddr) {
    log();
    let t = Target::new(cfg);
    for (nqn, any) in [(CLOSED, false), (OPEN, true)] {
        t.add_subsystem(SubsystemConfig {
            nqn: nqn.into(),
            serial: "MR-HOSTILE".into(),
            model: "Millrace hostile".into(),
            namespaces: vec![Namespace {
                nsid: 1,
                dev: Arc::new(MemBlockDevice::new(8 << 20)),
                uuid: [7; 16],
                nguid: [7; 16],
                ana_group: 0,
            }],
            allowed_hosts: vec![HOST.into()],
            allow_any_host: any,
        })
        .unwrap();
    }
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

async fn closed_within(q: &HostQueue, limit: Duration) -> Duration {
    let t0 = Instant::now();
    while !q.is_closed() {
        assert!(t0.elapsed() < limit, "the target kept the connection open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t0.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_connections_are_closed_in_bounded_time() {
    let (t, addr) = target(TargetConfig {
        handshake_timeout: Duration::from_millis(400),
        pdu_timeout: Duration::from_millis(400),
        ..Default::default()
    })
    .await;
    // ICReq, then nothing: closed at the handshake deadline.
    let q = HostQueue::open(addr, &host(HOST)).await.unwrap();
    closed_within(&q, Duration::from_secs(3)).await;
    // Connected, then half a PDU header: closed at the PDU deadline.
    let c = HostController::connect(addr, CLOSED, &host(HOST), 1)
        .await
        .unwrap();
    let q = &c.io[0];
    q.send_raw(&[4, 0, 72, 0]).await.unwrap();
    closed_within(q, Duration::from_secs(3)).await;
    // A whole capsule header whose in-capsule data never comes.
    let c2 = HostController::connect(addr, CLOSED, &host(HOST), 1)
        .await
        .unwrap();
    let mut sqe = Sqe::new(millrace_nvmf::cmd::io::WRITE, 9, 1);
    sqe.set_lba_range(0, 1);
    sqe.set_sgl(millrace_nvmf::cmd::Sgl::InCapsule {
        offset: 0,
        len: 4096,
    });
    let b = millrace_nvmf::pdu::encode(
        &millrace_nvmf::pdu::Head::Cmd(sqe),
        &[1; 4096],
        false,
        false,
        1,
    );
    c2.io[0].send_raw(&b[..b.len() - 100]).await.unwrap();
    closed_within(&c2.io[0], Duration::from_secs(3)).await;
    // An idle connected queue is not a stalled one: it stays open past both deadlines.
    let idle = HostController::connect(addr, CLOSED, &host(HOST), 1)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!idle.io[0].is_closed());
    idle.io[0].write(1, 0, vec![5; 4096], 4096).await.unwrap();
    assert!(t.stats().timeouts >= 3, "{:?}", t.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_address_are_bounded() {
    let (t, addr) = target(TargetConfig {
        max_connections_per_address: 3,
        ..Default::default()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(HostQueue::open(addr, &host(HOST)).await.unwrap());
    }
    // The fourth from the same address is closed at once (its ICReq gets no answer).
    assert!(HostQueue::open(addr, &host(HOST)).await.is_err());
    assert!(t.stats().connections_refused >= 1);
    assert!(!log_lines("already has its maximum of 3 connections").is_empty());
    // One goes: there is room again.
    drop(held.pop());
    let t0 = Instant::now();
    while t.stats().connections_open > 2 {
        assert!(t0.elapsed() < Duration::from_secs(3));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.push(HostQueue::open(addr, &host(HOST)).await.unwrap());
}

#[tokio::test]
async fn an_empty_host_nqn_gets_in_only_where_any_host_may() {
    let (t, addr) = target(TargetConfig::default()).await;
    let anon = host("");
    let c = HostController::connect(addr, OPEN, &anon, 1).await.unwrap();
    c.io[0].write(1, 1, vec![9; 4096], 4096).await.unwrap();
    assert_eq!(c.io[0].read(1, 1, 1, 4096).await.unwrap(), vec![9; 4096]);
    let e = HostController::connect(addr, CLOSED, &anon, 1)
        .await
        .err()
        .unwrap();
    assert_eq!(e.status(), Some(Status::CONNECT_INVALID_HOST));
    assert!(
        !log_lines("an empty host NQN, which only a subsystem open to any host accepts").is_empty()
    );
    assert!(t.stats().connects_refused_tcp >= 1);
}

#[tokio::test]
async fn refused_connects_are_logged_with_host_address_and_reason_at_a_bounded_rate() {
    let (t, addr) = target(TargetConfig::default()).await;
    let stranger = "nqn.2014-08.org.nvmexpress:uuid:stranger-logged";
    for _ in 0..20 {
        let e = HostController::connect(addr, CLOSED, &host(stranger), 1)
            .await
            .err()
            .unwrap();
        assert_eq!(e.status(), Some(Status::CONNECT_INVALID_HOST));
    }
    let lines = log_lines(stranger);
    assert!(!lines.is_empty(), "no refusal was logged");
    assert!(
        lines.len() < 5,
        "the refusals were not rate-limited: {lines:?}"
    );
    let l = &lines[0];
    assert!(
        l.contains("the host is not allowed") && l.contains("127.0.0.1"),
        "{l}"
    );
    assert!(
        l.contains(CLOSED) && l.contains("transport=\"tcp\"") || l.contains("tcp"),
        "{l}"
    );
    assert_eq!(t.stats().connects_refused_tcp, 20);
    // Malformed Connect data is a refusal that is logged too (a subsystem NQN with no NUL).
    let q = HostQueue::open(addr, &host(HOST)).await.unwrap();
    let mut d = connect_data(&host(HOST), CLOSED, 0xffff);
    d[256..512].fill(b'x');
    let mut sqe = Sqe::fabrics(fctype::CONNECT, 1);
    sqe.set_connect(0, 31, 0);
    let e = q.submit(sqe, Some(d), 0).await.err().unwrap();
    assert_eq!(e.status(), Some(Status::CONNECT_INVALID_PARAMETERS));
    assert_eq!(t.stats().connects_refused_tcp, 21);
}

#[test]
fn refused_connects_are_counted_under_their_own_transport() {
    let t = Target::new(TargetConfig::default());
    t.add_subsystem(SubsystemConfig {
        nqn: CLOSED.into(),
        serial: "MR".into(),
        model: "M".into(),
        namespaces: vec![],
        allowed_hosts: vec![HOST.into()],
        allow_any_host: false,
    })
    .unwrap();
    let pool = t.pool();
    let mut s = t
        .session("192.0.2.1:5000".parse().unwrap(), None)
        .with_transport(
            TransportInfo {
                kind: Transport::Rdma,
                in_capsule: 8192,
            },
            pool,
        );
    let d = connect_data(
        &host("nqn.2014-08.org.nvmexpress:uuid:other"),
        CLOSED,
        0xffff,
    );
    let mut sqe = Sqe::fabrics(fctype::CONNECT, 1);
    sqe.set_connect(0, 31, 0);
    let a = s.command(&sqe, Some(millrace_io::IoBuf::from_slice(&d)), 0);
    assert!(matches!(
        a,
        millrace_nvmf::Action::Complete { status, .. } if status == Status::CONNECT_INVALID_HOST
    ));
    let st = t.stats();
    assert_eq!((st.connects_refused_rdma, st.connects_refused_tcp), (1, 0));
    assert_eq!(
        st.connections_refused, 0,
        "an RDMA refusal counted as NVMe/TCP"
    );
}
