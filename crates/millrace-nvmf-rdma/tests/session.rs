//! The RDMA transport's side of the target, without an RDMA device: the commands an RDMA queue
//! hands to the target's session (as `Queue` does after receiving a capsule and fetching its
//! data), and what comes back. Refusals (a host not allowed, data before Connect, a Connect
//! too large to fetch), Identify as the Linux RDMA host needs it, and a write and a read through
//! the pool buffers RDMA moves without a copy.

use millrace_block::MemBlockDevice;
use millrace_io::{BufPool, IoBuf, PoolConfig};
use millrace_nvmf::cmd::{self, admin, fctype, io, ConnectData, Sgl, Sqe, Status, Transfer};
use millrace_nvmf::{Namespace, SubsystemConfig, Target, TargetConfig, Transport, TransportInfo};
use millrace_nvmf_rdma::commands::{Commands, Exec, Outcome};
use millrace_nvmf_rdma::session::SessionCommands;
use std::sync::Arc;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
const STRANGER: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000ff";
const NQN: &str = "nqn.2026-11.dev.millrace:test.vol";

fn target() -> Target {
    let t = Target::new(TargetConfig::default());
    t.add_subsystem(SubsystemConfig {
        nqn: NQN.into(),
        serial: "MR1".into(),
        model: "Millrace Volume".into(),
        namespaces: vec![Namespace {
            nsid: 1,
            dev: Arc::new(MemBlockDevice::new(8 << 20)),
            uuid: [1; 16],
            nguid: [2; 16],
            ana_group: 0,
        }],
        allowed_hosts: vec![HOST.into()],
        allow_any_host: false,
    })
    .unwrap();
    t
}

fn pool() -> BufPool {
    BufPool::new(&PoolConfig {
        bytes: 8 << 20,
        slices: 1,
        max_buf: 1 << 20,
        populate: false,
    })
    .unwrap()
}

fn queue(t: &Target, pool: &BufPool) -> SessionCommands {
    let info = TransportInfo {
        kind: Transport::Rdma,
        in_capsule: 8192,
    };
    let s = t
        .session("192.0.2.1:5000".parse().unwrap(), None)
        .with_transport(info, pool.clone());
    SessionCommands::new(s, pool.clone())
}

async fn outcome(e: Exec) -> Outcome {
    match e {
        Exec::Now(o) => o,
        Exec::Later(f) => f.await,
    }
}

/// Admits and runs one command as the queue does; Err is the admission's refusal.
async fn run(
    q: &mut SessionCommands,
    sqe: &Sqe,
    x: Transfer,
    data: Option<IoBuf>,
) -> Result<Outcome, Status> {
    let p = q.admit(sqe, &x)?;
    Ok(outcome(q.execute(sqe, p, data)).await)
}

fn status(o: &Outcome) -> (Status, u64) {
    match o {
        Outcome::Complete { status, result } => (*status, *result),
        Outcome::Data { result, .. } => (Status::SUCCESS, *result),
        _ => panic!("expected a completion"),
    }
}

fn connect_sqe(qid: u16) -> Sqe {
    let mut s = Sqe::fabrics(fctype::CONNECT, 1);
    s.set_connect(qid, 31, 0);
    s.set_sgl(Sgl::InCapsule {
        offset: 0,
        len: cmd::CONNECT_DATA_LEN as u32,
    });
    s
}

fn connect_data(host: &str, cntlid: u16) -> IoBuf {
    IoBuf::from_slice(
        &ConnectData {
            hostid: [7; 16],
            cntlid,
            subnqn: NQN.into(),
            hostnqn: host.into(),
        }
        .encode(),
    )
}

async fn connect(q: &mut SessionCommands, host: &str, qid: u16, cntlid: u16) -> (Status, u64) {
    let x = Transfer::InCapsule(0..cmd::CONNECT_DATA_LEN);
    let sqe = connect_sqe(qid);
    let o = run(q, &sqe, x, Some(connect_data(host, cntlid))).await;
    status(&o.unwrap())
}

#[tokio::test]
async fn a_host_not_allowed_is_refused_as_over_tcp() {
    let (t, p) = (target(), pool());
    let mut q = queue(&t, &p);
    let (st, res) = connect(&mut q, STRANGER, 0, 0xffff).await;
    assert_eq!(st, Status::CONNECT_INVALID_HOST);
    // IPO: the host NQN's offset in the Connect data (IATTR 1).
    assert_eq!(res, cmd::CONNECT_DATA_HOSTNQN as u64 | 1 << 16);
    assert!(!q.is_connected());
    // Counted under its own transport, not NVMe/TCP's.
    assert_eq!(t.stats().connects_refused_rdma, 1);
    assert_eq!(t.stats().connects_refused_tcp, 0);
    assert!(t.subsystems()[0].hosts.is_empty());
}

#[tokio::test]
async fn no_data_buffer_before_connect_but_connects_own() {
    let (t, p) = (target(), pool());
    let mut q = queue(&t, &p);
    let mut w = Sqe::new(io::WRITE, 2, 1);
    w.set_lba_range(0, 256);
    let refused = q.admit(&w, &Transfer::FromHost(1 << 20)).err();
    assert_eq!(refused, Some(Status::COMMAND_SEQUENCE_ERROR));
    let big = q
        .admit(&connect_sqe(0), &Transfer::FromHost(64 << 10))
        .err();
    assert_eq!(big, Some(Status::DATA_SGL_LENGTH_INVALID));
    assert!(q.admit(&connect_sqe(0), &Transfer::FromHost(1024)).is_ok());
    // Nothing but Connect runs before Connect.
    let mut id = Sqe::new(admin::IDENTIFY, 3, 0);
    id.set_cdw(10, 1);
    let o = run(&mut q, &id, Transfer::ToHost(4096), None)
        .await
        .unwrap();
    assert_eq!(status(&o).0, Status::COMMAND_SEQUENCE_ERROR);
    assert_eq!(p.usage().in_use_bytes, 0);
}

#[tokio::test]
async fn identify_reports_keyed_sgls_and_capsule_size_and_io_moves_through_the_pool() {
    let (t, p) = (target(), pool());
    let mut a = queue(&t, &p);
    let (st, cntlid) = connect(&mut a, HOST, 0, 0xffff).await;
    assert_eq!(st, Status::SUCCESS);
    let h = &t.subsystems()[0].hosts;
    assert_eq!((h.len(), h[0].transport), (1, Transport::Rdma));
    let mut id = Sqe::new(admin::IDENTIFY, 3, 0);
    id.set_cdw(10, 1);
    let o = run(&mut a, &id, Transfer::ToHost(4096), None)
        .await
        .unwrap();
    let Outcome::Data { data, .. } = o else {
        panic!("identify sends data")
    };
    assert!(
        data.is_pooled(),
        "admin data goes out from the registered pool"
    );
    let sgls = u32::from_le_bytes(data[536..540].try_into().unwrap());
    assert_ne!(sgls & 1 << 2, 0, "keyed SGL data blocks supported");
    let ioccsz = u32::from_le_bytes(data[1792..1796].try_into().unwrap());
    assert_eq!(ioccsz, (64 + 8192) / 16);
    drop(data);
    // Enable the controller, then an I/O queue.
    let mut cc = Sqe::fabrics(fctype::PROPERTY_SET, 4);
    cc.set_prop(false, cmd::prop::CC, 1);
    let o = run(&mut a, &cc, Transfer::None, None).await.unwrap();
    assert_eq!(status(&o).0, Status::SUCCESS);
    let mut q = queue(&t, &p);
    assert_eq!(
        connect(&mut q, HOST, 1, cntlid as u16).await.0,
        Status::SUCCESS
    );
    assert_eq!(q.qid(), 1);
    let mut w = Sqe::new(io::WRITE, 5, 1);
    w.set_lba_range(2, 2);
    let pw = q.admit(&w, &Transfer::FromHost(8192)).unwrap();
    assert!(q.fetches_data(&pw));
    let mut buf = p.try_get(8192).unwrap().unwrap();
    buf.set_len(8192).unwrap();
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let o = outcome(q.execute(&w, pw, Some(buf))).await;
    assert_eq!(status(&o).0, Status::SUCCESS);
    let mut r = Sqe::new(io::READ, 6, 1);
    r.set_lba_range(2, 2);
    let o = run(&mut q, &r, Transfer::ToHost(8192), None).await.unwrap();
    let Outcome::Data { data, .. } = o else {
        panic!("a read sends data")
    };
    assert!(
        data.is_pooled(),
        "read data is read into the registered pool"
    );
    assert!(data.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    drop(data);
    // Taking the host off the allow-list ends its queues.
    let closing = q.closing();
    t.set_allowed_hosts(NQN, vec![]).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), closing.cancelled())
        .await
        .expect("the queue is told to close");
    drop((q, a));
    assert!(t.subsystems()[0].hosts.is_empty());
    assert_eq!(p.usage().in_use_bytes, 0);
}
