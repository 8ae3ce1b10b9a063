//! Each host's share of the buffer pool (NVMe/TCP): a host whose I/O queues send many reads and
//! then stop reading their sockets keeps at most its share of the pool in completed reads
//! waiting to be sent, and another host's I/O still completes in the rest. Without the share
//! the stalled host's reads take the whole pool and the other host waits for ever.

use crate::drained::wait_drained;
use millrace_block::MemBlockDevice;
use millrace_io::{BufPool, Cores, CoresConfig, PoolConfig};
use millrace_nvmf::cmd::{io, Cqe, Sgl, Sqe, CQE_LEN};
use millrace_nvmf::initiator::{connect_pdu, ic_req_pdu, HostController, HostOptions};
use millrace_nvmf::pdu::{self, Head, CH_LEN, IC_LEN};
use millrace_nvmf::{Namespace, SubsystemConfig, Target, TargetConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const NQN: &str = "nqn.2024-01.io.millrace:share";
const STALLED: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000a1";
const HEALTHY: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000b2";
const POOL: usize = 4 << 20;
/// Each stalled read: 256 KiB, the pool's largest buffer.
const READ_BLOCKS: u32 = 64;
const BLOCK: usize = 4096;
const STALLED_QUEUES: u16 = 2;
const STALLED_READS: u16 = 100;

fn target(bufs: &BufPool) -> Target {
    let cores = Cores::start(CoresConfig {
        cores: 1,
        cpus: None,
        ring_entries: 256,
        pool: Some(bufs.clone()),
    })
    .unwrap();
    let t = Target::new(TargetConfig::default());
    t.set_data_path(bufs.clone(), Some(Arc::new(cores)))
        .unwrap();
    t.add_subsystem(SubsystemConfig {
        nqn: NQN.into(),
        serial: "MR-SHARE".into(),
        model: "Millrace share".into(),
        namespaces: vec![Namespace {
            nsid: 1,
            dev: Arc::new(MemBlockDevice::new(64 << 20)),
            uuid: [5; 16],
            nguid: [5; 16],
            ana_group: 0,
        }],
        allowed_hosts: vec![STALLED.into(), HEALTHY.into()],
        allow_any_host: false,
    })
    .unwrap();
    t
}

async fn response(s: &mut TcpStream) -> Cqe {
    let mut b = [0u8; CH_LEN + CQE_LEN];
    s.read_exact(&mut b).await.unwrap();
    Cqe::decode(b[CH_LEN..].try_into().unwrap())
}

/// An I/O queue of controller `cntlid` that sends `STALLED_READS` reads of 256 KiB and never
/// reads its socket again (its receive buffer as small as the kernel allows).
async fn stalled_queue(addr: SocketAddr, qid: u16, cntlid: u16, o: &HostOptions) -> TcpStream {
    let sock = TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut s = sock.connect(addr).await.unwrap();
    s.write_all(&ic_req_pdu()).await.unwrap();
    s.read_exact(&mut [0u8; IC_LEN]).await.unwrap();
    s.write_all(&connect_pdu(o, NQN, qid, 128, cntlid))
        .await
        .unwrap();
    let r = response(&mut s).await;
    assert!(r.status().is_success(), "stalled queue {qid}: {r:?}");
    let mut all = Vec::new();
    for cid in 0..STALLED_READS {
        let mut r = Sqe::new(io::READ, cid, 1);
        r.set_lba_range(cid as u64 * READ_BLOCKS as u64, READ_BLOCKS);
        r.set_sgl(Sgl::Transport {
            len: READ_BLOCKS * BLOCK as u32,
        });
        all.extend(pdu::encode(&Head::Cmd(r), &[], false, false, 1));
    }
    s.write_all(&all).await.unwrap();
    s
}

fn pattern(i: u64) -> Vec<u8> {
    (0..16 * BLOCK as u64)
        .map(|b| (b.wrapping_mul(31) ^ i.wrapping_mul(0x9e37)) as u8)
        .collect()
}

#[test]
fn a_host_that_stops_reading_keeps_only_its_share_and_others_go_on() {
    let bufs = BufPool::new(&PoolConfig {
        bytes: POOL,
        slices: 1,
        max_buf: 256 << 10,
        populate: false,
    })
    .unwrap();
    let t = target(&bufs);
    let share = POOL / 4;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let t2 = t.clone();
        tokio::spawn(async move { t2.serve(l).await });
        // The stalled host: an admin queue as any host has, then raw I/O queues.
        let a = HostOptions {
            hostnqn: STALLED.into(),
            hostid: [0xa1; 16],
            ..Default::default()
        };
        let ca = HostController::connect(addr, NQN, &a, 0).await.unwrap();
        let n = (STALLED_QUEUES - 1) as u32;
        ca.admin.set_features(0x07, n | n << 16).await.unwrap();
        let mut stalled = Vec::new();
        for qid in 1..=STALLED_QUEUES {
            stalled.push(stalled_queue(addr, qid, ca.cntlid, &a).await);
        }
        // Its reads complete into pool buffers until its sockets are full; then they wait.
        let t0 = Instant::now();
        let mut last = (0, Instant::now());
        loop {
            let used = bufs.usage().in_use_bytes as usize;
            if used != last.0 {
                last = (used, Instant::now());
            }
            if last.1.elapsed() > Duration::from_millis(500) && used > 0 {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "the stalled host's reads never settled: {:?}", bufs.usage());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let u = bufs.usage();
        eprintln!("with one host stalled: {u:?}");
        assert!(
            u.in_use_bytes as usize <= share,
            "a host that stopped reading holds {} bytes of the pool, more than its share of {share}",
            u.in_use_bytes
        );
        // Another host's writes and reads still complete, and read back right.
        let b = HostOptions {
            hostnqn: HEALTHY.into(),
            hostid: [0xb2; 16],
            ..Default::default()
        };
        let healthy = async {
            let cb = HostController::connect(addr, NQN, &b, 1).await.unwrap();
            let q = cb.io[0].clone();
            let base = 8192u64;
            for i in 0..32u64 {
                q.write(1, base + i * 16, pattern(i), BLOCK as u32)
                    .await
                    .unwrap();
            }
            for i in 0..32u64 {
                let got = q.read(1, base + i * 16, 16, BLOCK as u32).await.unwrap();
                assert!(got == pattern(i), "block run {i} read back wrong");
            }
            cb
        };
        let cb = match tokio::time::timeout(Duration::from_secs(30), healthy).await {
            Ok(c) => c,
            Err(_) => panic!(
                "the other host's I/O did not complete while one host stalled: pool {:?}",
                bufs.usage()
            ),
        };
        drop(cb);
        drop(stalled);
        drop(ca);
        wait_drained(&bufs, &t).await;
    });
    t.shutdown();
}
