//! The target over 127.0.0.1 with RAM block devices, driven by the crate's own initiator.

use millrace_block::{BlockDevice, MemBlockDevice};
use millrace_nvmf::cmd::{self, io, Sgl, Sqe, Status};
use millrace_nvmf::initiator::{discover, Error, HostController, HostOptions, HostQueue};
use millrace_nvmf::pdu::{self, DataHdr, Head};
use millrace_nvmf::{Namespace, SubsystemConfig, Target, TargetConfig, DISCOVERY_NQN};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const NQN: &str = "nqn.2024-01.io.millrace:test";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000aa";
const SIZE: u64 = 64 << 20;

struct Setup {
    t: Target,
    addr: SocketAddr,
    dev: Arc<MemBlockDevice>,
}

async fn setup_with(cfg: TargetConfig) -> Setup {
    let t = Target::new(cfg);
    let dev = Arc::new(MemBlockDevice::new(SIZE));
    t.add_subsystem(SubsystemConfig {
        nqn: NQN.into(),
        serial: "MR-TEST".into(),
        model: "Millrace test".into(),
        namespaces: vec![Namespace {
            nsid: 1,
            dev: dev.clone(),
            uuid: [0x11; 16],
            nguid: [0x22; 16],
            ana_group: 0,
        }],
        allowed_hosts: vec![HOST.into()],
        allow_any_host: false,
    })
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let t2 = t.clone();
    tokio::spawn(async move { t2.serve(l).await });
    Setup { t, addr, dev }
}

async fn setup() -> Setup {
    setup_with(TargetConfig::default()).await
}

fn host() -> HostOptions {
    HostOptions {
        hostnqn: HOST.into(),
        ..Default::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).rotate_left(seed as u32) as u8 ^ seed)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn round_trip_in_capsule_and_r2t() {
    let s = setup().await;
    let c = HostController::connect(s.addr, NQN, &host(), 2)
        .await
        .unwrap();
    let q = &c.io[0];
    // Small write: in-capsule data. Large write: R2T and several H2CData PDUs.
    let small = pattern(4096, 1);
    q.write(1, 10, small.clone(), 4096).await.unwrap();
    let big = pattern(1 << 20, 2);
    q.write(1, 100, big.clone(), 4096).await.unwrap();
    assert_eq!(q.read(1, 10, 1, 4096).await.unwrap(), small);
    assert_eq!(q.read(1, 100, 256, 4096).await.unwrap(), big);
    let mut raw = vec![0u8; 4096];
    s.dev.read_at(10 * 4096, &mut raw).unwrap();
    assert_eq!(raw, small);
    q.flush(1).await.unwrap();
    let st = s.t.stats();
    assert_eq!(st.bytes_written, 4096 + (1 << 20));
    assert_eq!(st.bytes_read, 4096 + (1 << 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_queues_concurrently_with_and_without_digests() {
    let s = setup().await;
    for (hd, dd) in [(false, false), (true, true), (true, false), (false, true)] {
        let o = HostOptions {
            hdgst: hd,
            ddgst: dd,
            ..host()
        };
        let c = HostController::connect(s.addr, NQN, &o, 4).await.unwrap();
        assert_eq!(c.io.len(), 4);
        let mut tasks = Vec::new();
        for (i, q) in c.io.iter().enumerate() {
            let q = q.clone();
            tasks.push(tokio::spawn(async move {
                // Each queue owns a 4 MiB region; 16 commands in flight at once per queue.
                let base = i as u64 * 1024;
                let mut inner = Vec::new();
                for j in 0..16u64 {
                    let q = q.clone();
                    inner.push(async move {
                        let len = 4096 * (1 + (j as usize % 5) * 7);
                        let d = pattern(len, (i * 16 + j as usize) as u8);
                        let lba = base + j * 64;
                        q.write(1, lba, d.clone(), 4096).await.unwrap();
                        let back = q.read(1, lba, (len / 4096) as u32, 4096).await.unwrap();
                        assert_eq!(back, d);
                    });
                }
                futures_join(inner).await;
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let info = s.t.subsystems();
        assert_eq!(info[0].hosts.len(), 1);
        assert_eq!(info[0].hosts[0].io_queues, 4);
        assert_eq!(info[0].hosts[0].hostnqn, HOST);
    }
}

async fn futures_join<F: std::future::Future<Output = ()> + Send + 'static>(v: Vec<F>) {
    let hs: Vec<_> = v.into_iter().map(tokio::spawn).collect();
    for h in hs {
        h.await.unwrap();
    }
}

#[tokio::test]
async fn identify_logs_and_features() {
    let s = setup().await;
    let c = HostController::connect(s.addr, NQN, &host(), 1)
        .await
        .unwrap();
    let id = &c.id_ctrl;
    assert!(std::str::from_utf8(&id[24..64])
        .unwrap()
        .starts_with("Millrace test"));
    assert_eq!(u16::from_le_bytes([id[78], id[79]]), c.cntlid);
    assert!(std::str::from_utf8(&id[768..800]).unwrap().starts_with(NQN));
    assert_ne!(
        u16::from_le_bytes([id[320], id[321]]),
        0,
        "KAS must be set for fabrics"
    );
    let a = &c.admin;
    let ns = a.identify(0, 1).await.unwrap();
    assert_eq!(
        u64::from_le_bytes(ns[0..8].try_into().unwrap()),
        SIZE / 4096
    );
    assert_eq!(ns[128 + 2], 12, "LBADS of a 4 KiB block");
    assert_eq!(&ns[104..120], &[0x22; 16]);
    let list = a.identify(2, 0).await.unwrap();
    assert_eq!(u32::from_le_bytes(list[0..4].try_into().unwrap()), 1);
    assert_eq!(u32::from_le_bytes(list[4..8].try_into().unwrap()), 0);
    let desc = a.identify(3, 1).await.unwrap();
    assert_eq!((desc[0], desc[1]), (2, 16));
    assert_eq!(&desc[4..20], &[0x22; 16]);
    assert_eq!((desc[20], desc[21]), (3, 16));
    // Deallocation is bounded per command, or Linux sends a whole volume in one command that
    // outlives its I/O timeout (the array zeroes what it deallocates).
    let nvm = a.identify(6, 0).await.unwrap();
    let dmrsl = u32::from_le_bytes(nvm[4..8].try_into().unwrap()) as u64;
    let dmsl = u64::from_le_bytes(nvm[8..16].try_into().unwrap());
    assert_eq!(dmrsl, millrace_nvmf::MAX_DEALLOCATE_BYTES / 4096);
    assert_eq!(dmsl, dmrsl);
    assert!(dmrsl > 0 && dmrsl * 4096 <= 64 << 20);
    assert_eq!(
        a.identify(0x42, 0).await.unwrap_err().status(),
        Some(Status::INVALID_FIELD)
    );
    assert_eq!(
        a.identify(3, 9).await.unwrap_err().status(),
        Some(Status::INVALID_NAMESPACE)
    );
    c.io[0].write(1, 0, vec![7; 8192], 4096).await.unwrap();
    let smart = a.get_log_page(2, 512, 0).await.unwrap();
    assert_eq!(smart[0], 0);
    assert_eq!(u128::from_le_bytes(smart[80..96].try_into().unwrap()), 1);
    assert_eq!(a.get_log_page(1, 64, 0).await.unwrap().len(), 64);
    assert_eq!(
        a.get_log_page(0x70, 1024, 0).await.unwrap_err().status(),
        Some(Status::INVALID_LOG_PAGE)
    );
    assert_eq!(a.get_features(0x07).await.unwrap(), 0);
    a.set_features(0x0f, 12345).await.unwrap();
    assert_eq!(a.get_features(0x0f).await.unwrap(), 12345);
    a.set_features(0x0b, 1 << 8).await.unwrap();
    assert_eq!(a.get_features(0x0b).await.unwrap(), 1 << 8);
    a.keep_alive().await.unwrap();
    assert_eq!(a.property_get(cmd::prop::VS, false).await.unwrap(), 0x10300);
    assert_eq!(a.property_get(cmd::prop::CSTS, false).await.unwrap() & 1, 1);
    c.shutdown().await.unwrap();
    assert_eq!(
        (a.property_get(cmd::prop::CSTS, false).await.unwrap() >> 2) & 3,
        2
    );
}

#[tokio::test]
async fn write_zeroes_and_deallocate() {
    let s = setup().await;
    let c = HostController::connect(s.addr, NQN, &host(), 1)
        .await
        .unwrap();
    let q = &c.io[0];
    q.write(1, 0, vec![0xff; 16 * 4096], 4096).await.unwrap();
    q.write_zeroes(1, 2, 3).await.unwrap();
    q.deallocate(1, &[(8, 2), (12, 1)]).await.unwrap();
    let d = q.read(1, 0, 16, 4096).await.unwrap();
    for b in 0..16 {
        let zero = (2..5).contains(&b) || (8..10).contains(&b) || b == 12;
        let blk = &d[b * 4096..(b + 1) * 4096];
        assert!(
            blk.iter().all(|&x| x == if zero { 0 } else { 0xff }),
            "block {b}"
        );
    }
}

#[tokio::test]
async fn refusals_leave_the_connection_healthy() {
    let s = setup().await;
    let c = HostController::connect(s.addr, NQN, &host(), 1)
        .await
        .unwrap();
    let q = &c.io[0];
    let blocks = SIZE / 4096;
    // LBA past the end, a range that runs over the end, a huge transfer, a wrong SGL length.
    let e = q.read(1, blocks, 1, 4096).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::LBA_OUT_OF_RANGE));
    let e = q
        .write(1, blocks - 1, vec![1; 8192], 4096)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(Status::LBA_OUT_OF_RANGE));
    let mut sqe = Sqe::new(io::READ, 0, 1);
    sqe.set_lba_range(0, 65536);
    sqe.set_sgl(Sgl::Transport { len: 256 << 20 });
    let e = q.submit_as_is(sqe, &[], 0, None).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::INVALID_FIELD));
    let mut sqe = Sqe::new(io::READ, 0, 1);
    sqe.set_lba_range(0, 2);
    sqe.set_sgl(Sgl::Transport { len: 4096 });
    let e = q.submit_as_is(sqe, &[], 4096, None).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::DATA_SGL_LENGTH_INVALID));
    // Unknown opcodes, a missing namespace, an in-capsule SGL that points past the data.
    let e = q.submit(Sqe::new(0x55, 0, 1), None, 0).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::INVALID_OPCODE));
    let e = c
        .admin
        .submit(Sqe::new(0xc7, 0, 0), None, 0)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(Status::INVALID_OPCODE));
    let e = q.read(7, 0, 1, 4096).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::INVALID_NAMESPACE));
    let mut sqe = Sqe::new(io::WRITE, 0, 1);
    sqe.set_lba_range(0, 1);
    sqe.set_sgl(Sgl::InCapsule {
        offset: 100,
        len: 4096,
    });
    let e = q.submit_as_is(sqe, &[0; 4096], 0, None).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::DATA_SGL_LENGTH_INVALID));
    sqe.set_sgl(Sgl::InCapsule {
        offset: 8192,
        len: 0,
    });
    let e = q.submit_as_is(sqe, &[0; 4096], 0, None).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::SGL_OFFSET_INVALID));
    // Still healthy.
    q.write(1, 5, vec![9; 4096], 4096).await.unwrap();
    assert_eq!(q.read(1, 5, 1, 4096).await.unwrap(), vec![9; 4096]);
}

#[tokio::test]
async fn connect_refusals() {
    let s = setup().await;
    // Unknown subsystem: Connect Invalid Parameters, IPO = the SUBNQN offset in the data.
    let e = HostQueue::connect(s.addr, &host(), "nqn.2024-01.io.millrace:nope", 0, 0xffff)
        .await
        .err()
        .unwrap();
    let Error::Status(st, cqe) = e else {
        panic!("{e}")
    };
    assert_eq!(st, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(cqe.result as u32, 256 | 1 << 16);
    // A host that is not allowed: Connect Invalid Host.
    let stranger = HostOptions {
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:stranger".into(),
        ..host()
    };
    let e = HostController::connect(s.addr, NQN, &stranger, 1)
        .await
        .err()
        .unwrap();
    assert_eq!(e.status(), Some(Status::CONNECT_INVALID_HOST));
    // An I/O queue for a controller that does not exist, or of another host.
    let e = HostQueue::connect(s.addr, &host(), NQN, 1, 77)
        .await
        .err()
        .unwrap();
    assert_eq!(e.status(), Some(Status::CONNECT_INVALID_PARAMETERS));
    let c = HostController::connect(s.addr, NQN, &host(), 1)
        .await
        .unwrap();
    let other = HostOptions {
        hostid: [9; 16],
        ..host()
    };
    let e = HostQueue::connect(s.addr, &other, NQN, 2, c.cntlid)
        .await
        .err()
        .unwrap();
    assert_eq!(e.status(), Some(Status::CONNECT_INVALID_HOST));
    // A second Connect of an I/O queue id already in use.
    let e = HostQueue::connect(s.addr, &host(), NQN, 1, c.cntlid)
        .await
        .err()
        .unwrap();
    assert_eq!(e.status(), Some(Status::CONNECT_INVALID_PARAMETERS));
    // Commands before Connect.
    let q = HostQueue::open(s.addr, &host()).await.unwrap();
    let e = q.identify(1, 0).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::COMMAND_SEQUENCE_ERROR));
    // The stranger sees nothing in discovery; the host sees the subsystem.
    assert!(discover(s.addr, &stranger).await.unwrap().is_empty());
    let d = discover(s.addr, &host()).await.unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].subnqn, NQN);
    assert_eq!(d[0].trsvcid, s.addr.port().to_string());
    assert_eq!(d[0].traddr, "127.0.0.1");
    // The allowed host still does I/O.
    c.io[0].write(1, 0, vec![1; 4096], 4096).await.unwrap();
    assert!(s.t.stats().connections_refused >= 2);
}

#[tokio::test]
async fn allow_any_host_is_explicit() {
    let s = setup().await;
    s.t.add_subsystem(SubsystemConfig {
        nqn: "nqn.2024-01.io.millrace:open".into(),
        serial: "MR-OPEN".into(),
        model: "Millrace open".into(),
        namespaces: vec![],
        allowed_hosts: vec![],
        allow_any_host: true,
    })
    .unwrap();
    let stranger = HostOptions {
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:stranger".into(),
        ..host()
    };
    HostController::connect(s.addr, "nqn.2024-01.io.millrace:open", &stranger, 1)
        .await
        .unwrap();
    let d = discover(s.addr, &stranger).await.unwrap();
    assert_eq!(d.len(), 1);
    assert!(s
        .t
        .add_subsystem(SubsystemConfig {
            nqn: DISCOVERY_NQN.into(),
            serial: String::new(),
            model: String::new(),
            namespaces: vec![],
            allowed_hosts: vec![],
            allow_any_host: true,
        })
        .is_err());
}

#[tokio::test]
async fn hosts_change_on_a_live_subsystem() {
    let s = setup().await;
    let other = HostOptions {
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000bb".into(),
        hostid: [0xbb; 16],
        ..host()
    };
    let e = HostController::connect(s.addr, NQN, &other, 1)
        .await
        .err()
        .unwrap();
    assert_eq!(e.status(), Some(Status::CONNECT_INVALID_HOST));
    let first = HostController::connect(s.addr, NQN, &host(), 1)
        .await
        .unwrap();
    // Adding a host lets it in and leaves the connected one alone.
    s.t.set_allowed_hosts(NQN, vec![HOST.into(), other.hostnqn.clone()])
        .unwrap();
    let second = HostController::connect(s.addr, NQN, &other, 1)
        .await
        .unwrap();
    assert_eq!(discover(s.addr, &other).await.unwrap().len(), 1);
    first.io[0].write(1, 0, vec![7; 4096], 4096).await.unwrap();
    // Taking the first host off drops its connection at once and refuses it from then on.
    s.t.set_allowed_hosts(NQN, vec![other.hostnqn.clone()])
        .unwrap();
    expect_closed(&first.io[0]).await;
    expect_closed(&first.admin).await;
    assert!(discover(s.addr, &host()).await.unwrap().is_empty());
    let e = HostController::connect(s.addr, NQN, &host(), 1)
        .await
        .err()
        .unwrap();
    assert_eq!(e.status(), Some(Status::CONNECT_INVALID_HOST));
    assert_eq!(
        second.io[0].read(1, 0, 1, 4096).await.unwrap(),
        vec![7; 4096]
    );
    let info = &s.t.subsystems()[0];
    assert_eq!(info.allowed_hosts, vec![other.hostnqn.clone()]);
    assert_eq!(s.t.listen_addrs(), vec![s.addr]);
    assert!(s
        .t
        .set_allowed_hosts("nqn.2024-01.io.millrace:nope", vec![])
        .is_err());
    assert!(s.t.set_allowed_hosts(NQN, vec![String::new()]).is_err());
}

#[tokio::test]
async fn discovery_only_port() {
    let s = setup().await;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let daddr = l.local_addr().unwrap();
    let t2 = s.t.clone();
    tokio::spawn(async move { t2.serve_discovery(l).await });
    let d = discover(daddr, &host()).await.unwrap();
    assert_eq!(d.len(), 1);
    // Entries name the I/O port, not the discovery port.
    assert_eq!(d[0].trsvcid, s.addr.port().to_string());
    let e = HostQueue::connect(daddr, &host(), NQN, 0, 0xffff)
        .await
        .err()
        .unwrap();
    assert_eq!(e.status(), Some(Status::CONNECT_INVALID_PARAMETERS));
}

async fn expect_closed(q: &HostQueue) {
    for _ in 0..200 {
        if q.is_closed() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the target did not close the connection");
}

#[tokio::test]
async fn hostile_pdus_close_only_their_connection() {
    let s = setup().await;
    let good = HostController::connect(s.addr, NQN, &host(), 1)
        .await
        .unwrap();
    let digests = HostOptions {
        hdgst: true,
        ddgst: true,
        ..host()
    };
    // 1. Garbage after the ICReq.
    let q = HostQueue::connect(s.addr, &host(), NQN, 0, 0xffff)
        .await
        .unwrap();
    q.send_raw(&[0xde; 64]).await.unwrap();
    expect_closed(&q).await;
    // 2. A huge PLEN: refused from the header, nothing allocated.
    let q = HostQueue::connect(s.addr, &host(), NQN, 0, 0xffff)
        .await
        .unwrap();
    let mut b = pdu::encode(&Head::Cmd(Sqe::new(io::READ, 1, 1)), &[], false, false, 1);
    b[3] = 72;
    b[4..8].copy_from_slice(&(u32::MAX).to_le_bytes());
    q.send_raw(&b).await.unwrap();
    expect_closed(&q).await;
    // 3. A bad header digest.
    let q = HostQueue::connect(s.addr, &digests, NQN, 0, 0xffff)
        .await
        .unwrap();
    let mut b = pdu::encode(&Head::Cmd(Sqe::new(0x18, 1, 0)), &[], true, true, 1);
    b[12] ^= 0x40;
    q.send_raw(&b).await.unwrap();
    expect_closed(&q).await;
    // 4. A bad data digest on in-capsule data: the command fails, the connection lives.
    let dc = HostController::connect(s.addr, NQN, &digests, 1)
        .await
        .unwrap();
    let mut sqe = Sqe::new(io::WRITE, 77, 1);
    sqe.set_lba_range(0, 1);
    sqe.set_sgl(Sgl::InCapsule {
        offset: 0,
        len: 4096,
    });
    let mut b = pdu::encode(&Head::Cmd(sqe), &[5; 4096], true, true, 1);
    let n = b.len();
    b[n - 1] ^= 1;
    dc.io[0].send_raw(&b).await.unwrap();
    dc.io[0].write(1, 3, vec![3; 4096], 4096).await.unwrap();
    assert_eq!(dc.io[0].read(1, 3, 1, 4096).await.unwrap(), vec![3; 4096]);
    assert_eq!(dc.io[0].read(1, 0, 1, 4096).await.unwrap(), vec![0; 4096]);
    // 5. H2CData nobody asked for, and out-of-order H2CData.
    let q = HostController::connect(s.addr, NQN, &host(), 1)
        .await
        .unwrap();
    let h = DataHdr {
        cccid: 5,
        ttag: 5,
        datao: 0,
        datal: 512,
        last: true,
        success: false,
    };
    q.io[0]
        .send_raw(&pdu::encode(&Head::H2CData(h), &[0; 512], false, false, 1))
        .await
        .unwrap();
    expect_closed(&q.io[0]).await;
    let q = HostQueue::connect(s.addr, &host(), NQN, 0, 0xffff)
        .await
        .unwrap();
    let c2 = HostController::connect(s.addr, NQN, &host(), 1)
        .await
        .unwrap();
    drop(q);
    let mut sqe = Sqe::new(io::WRITE, 9, 1);
    sqe.set_lba_range(0, 4);
    sqe.set_sgl(Sgl::Transport { len: 16384 });
    c2.io[0]
        .send_raw(&pdu::encode(&Head::Cmd(sqe), &[], false, false, 1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await; // let the R2T go out
    let h = DataHdr {
        cccid: 9,
        ttag: 9,
        datao: 4096,
        datal: 4096,
        last: false,
        success: false,
    };
    c2.io[0]
        .send_raw(&pdu::encode(&Head::H2CData(h), &[0; 4096], false, false, 1))
        .await
        .unwrap();
    expect_closed(&c2.io[0]).await;
    // 6. An ICReq that is too short, then silence.
    let sock = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut sock = sock;
        sock.write_all(&[0, 0, 128, 0, 20, 0, 0, 0]).await.unwrap();
        let mut buf = vec![0u8; 256];
        use tokio::io::AsyncReadExt;
        let n = sock.read(&mut buf).await.unwrap_or(0);
        // A C2HTermReq (type 3) or nothing, then the close.
        assert!(n == 0 || buf[0] == 3, "got {:?}", &buf[..n]);
    }
    // The first host is still fine, and so is the target.
    good.io[0].write(1, 1, vec![8; 4096], 4096).await.unwrap();
    assert_eq!(good.io[0].read(1, 1, 1, 4096).await.unwrap(), vec![8; 4096]);
    assert!(s.t.stats().protocol_errors >= 4);
}

#[tokio::test]
async fn keep_alive_timeout_drops_a_silent_controller() {
    let s = setup_with(TargetConfig {
        keep_alive_grace: Duration::from_millis(100),
        ..Default::default()
    })
    .await;
    let silent = HostOptions {
        kato_ms: 300,
        keep_alive: false,
        ..host()
    };
    let c = HostController::connect(s.addr, NQN, &silent, 1)
        .await
        .unwrap();
    let chatty = HostOptions {
        kato_ms: 300,
        keep_alive: true,
        ..host()
    };
    let k = HostController::connect(s.addr, NQN, &chatty, 1)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(c.admin.is_closed() && c.io[0].is_closed());
    assert!(!k.admin.is_closed());
    k.io[0].write(1, 0, vec![1; 4096], 4096).await.unwrap();
    assert_eq!(s.t.subsystems()[0].hosts.len(), 1);
}

#[tokio::test]
async fn namespace_changes_raise_an_async_event_and_removal_drops_hosts() {
    let s = setup().await;
    let c = HostController::connect(s.addr, NQN, &host(), 1)
        .await
        .unwrap();
    c.admin.set_features(0x0b, 1 << 8).await.unwrap();
    let a = c.admin.clone();
    let aer = tokio::spawn(async move {
        a.submit(Sqe::new(cmd::admin::ASYNC_EVENT_REQUEST, 0, 0), None, 0)
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.t.add_namespace(
        NQN,
        Namespace {
            nsid: 2,
            dev: Arc::new(MemBlockDevice::new(1 << 20)),
            uuid: [3; 16],
            nguid: [4; 16],
            ana_group: 0,
        },
    )
    .unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(2), aer)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(ev.cqe.result as u32, 0x0004_0002);
    let log = c.admin.get_log_page(4, 4096, 0).await.unwrap();
    assert_eq!(u32::from_le_bytes(log[0..4].try_into().unwrap()), 2);
    let list = c.admin.identify(2, 0).await.unwrap();
    assert_eq!(u32::from_le_bytes(list[4..8].try_into().unwrap()), 2);
    c.io[0].write(1, 0, vec![1; 4096], 4096).await.unwrap();
    c.io[0].write(2, 0, vec![2; 4096], 4096).await.unwrap();
    s.t.remove_namespace(NQN, 2).unwrap();
    assert_eq!(
        c.io[0].read(2, 0, 1, 4096).await.unwrap_err().status(),
        Some(Status::INVALID_NAMESPACE)
    );
    s.t.remove_subsystem(NQN).unwrap();
    expect_closed(&c.io[0]).await;
    expect_closed(&c.admin).await;
    assert!(s.t.subsystems().is_empty());
}

#[tokio::test]
async fn sixty_four_parallel_big_writes_stay_within_the_buffer_budget() {
    // A budget of 2 MiB: 64 writes of 1 MiB each must wait for buffers, not fail or grow.
    let s = setup_with(TargetConfig {
        max_buffer_bytes: 2 << 20,
        ..Default::default()
    })
    .await;
    let o = HostOptions {
        queue_size: 128,
        ..host()
    };
    let c = HostController::connect(s.addr, NQN, &o, 1).await.unwrap();
    let mut v = Vec::new();
    for i in 0..64u64 {
        let q = c.io[0].clone();
        v.push(async move {
            let d = pattern(1 << 20, i as u8);
            q.write(1, (i % 16) * 256, d, 4096).await.unwrap();
        });
    }
    futures_join(v).await;
    let d = c.io[0].read(1, 0, 256, 4096).await.unwrap();
    assert_eq!(d.len(), 1 << 20);
}

/// A parity array's geometry: 64 KiB strips, 256 KiB full stripes.
struct Striped(MemBlockDevice);

impl BlockDevice for Striped {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn preferred_io_bytes(&self) -> u64 {
        256 << 10
    }
    fn min_io_bytes(&self) -> u64 {
        64 << 10
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.write_at(offset, data)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[tokio::test]
async fn namespace_reports_strip_and_full_stripe_as_md_does() {
    let t = Target::new(TargetConfig::default());
    t.add_subsystem(SubsystemConfig {
        nqn: NQN.into(),
        serial: "MR-TEST".into(),
        model: "Millrace test".into(),
        namespaces: vec![Namespace {
            nsid: 1,
            dev: Arc::new(Striped(MemBlockDevice::new(SIZE))),
            uuid: [0x11; 16],
            nguid: [0x22; 16],
            ana_group: 0,
        }],
        allowed_hosts: vec![HOST.into()],
        allow_any_host: false,
    })
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let t2 = t.clone();
    tokio::spawn(async move { t2.serve(l).await });
    let c = HostController::connect(addr, NQN, &host(), 1)
        .await
        .unwrap();
    let ns = c.admin.identify(0, 1).await.unwrap();
    let f = |o: usize| u16::from_le_bytes([ns[o], ns[o + 1]]) as u64 + 1;
    assert_ne!(ns[24] & (1 << 4), 0, "OPTPERF set");
    // Linux: io_min from NPWG, io_opt from NOWS (in 4 KiB blocks, zero-based).
    assert_eq!(f(64), 16, "NPWG: a 64 KiB strip");
    assert_eq!(f(66), 16, "NPWA: aligned to a strip");
    assert_eq!(f(72), 64, "NOWS: a 256 KiB full stripe");
    assert_eq!(f(68), 64, "NPDG: discards by full stripes");
}
