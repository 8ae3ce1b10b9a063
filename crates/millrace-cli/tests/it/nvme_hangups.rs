//! NVMe/TCP hosts that hang up, against the real `millrace serve` binary: many controllers of
//! one host NQN hold stalled writes (R2T writes whose data never comes, in-capsule writes cut
//! short), pipeline reads and leave without reading the replies, and connections stop in the
//! middle of ICReq; then all of them hang up (close, RST, half-close) in random order while a
//! controller of the same host runs verified 4 KiB I/O. The server stays up, the good host
//! sees no error, no wrong byte and no wait of a second, and what the others held comes back.

use crate::common;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{free_port, metric, millrace, reset, run_ok, server_url};
use millrace_nvmf::cmd::{io, Sgl, Sqe};
use millrace_nvmf::initiator::{HostController, HostOptions};
use millrace_nvmf::pdu::{encode, Head};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:4d696c6c-7261-6365-0000-0000000000ee";
const NQN: &str = "nqn.2026-11.dev.millrace:tank.v";

fn host() -> HostOptions {
    HostOptions {
        hostnqn: HOST.into(),
        queue_size: 64,
        ..Default::default()
    }
}

/// The logical block size of namespace 1 (Identify Namespace: FLBAS, then its LBA format).
async fn lba_bytes(c: &HostController) -> u32 {
    let id = c.admin.identify(0, 1).await.unwrap();
    let f = (id[26] & 0xf) as usize;
    1 << id[128 + 4 * f + 2]
}

fn serve(dir: &Path, nvme: SocketAddr) -> (common::Server, String) {
    common::raid6_tank(dir);
    let server = common::serve_with(dir, &["--nvme", &nvme.to_string(), "--discovery-port", "0"]);
    run_ok(millrace(dir).args(["volume", "create", "tank/v", "--size", "256M"]));
    run_ok(millrace(dir).args(["export", "nvme", "add", "tank/v", "--host", HOST]));
    (server, server_url(&dir.join("home")))
}

/// A 4 KiB write and its read-back on the good controller, each answered within a second.
async fn good_io(c: &HostController, lba: u32, rng: &mut impl Rng) {
    let blocks = 4096 / lba;
    let slba = rng.random_range(0..(64u64 << 20) / 4096) * blocks as u64;
    let data: Vec<u8> = (0..4096).map(|_| rng.random()).collect();
    let t0 = Instant::now();
    let q = &c.io[0];
    tokio::time::timeout(Duration::from_secs(10), q.write(1, slba, data.clone(), lba))
        .await
        .expect("the write is answered")
        .expect("the write succeeds");
    let back = tokio::time::timeout(Duration::from_secs(10), q.read(1, slba, blocks, lba))
        .await
        .expect("the read is answered")
        .expect("the read succeeds");
    let took = t0.elapsed();
    assert!(
        back == data,
        "read back other bytes than were written at LBA {slba}"
    );
    assert!(
        took < Duration::from_secs(1),
        "a 4 KiB write and read took {took:?} while other hosts stalled"
    );
}

/// A write capsule whose data the target must fetch (R2T) and that never sends it.
fn r2t_write(cid: u16, slba: u64, blocks: u32, lba: u32) -> Vec<u8> {
    let mut sqe = Sqe::new(io::WRITE, cid, 1);
    sqe.set_lba_range(slba, blocks);
    sqe.set_sgl(Sgl::Transport { len: blocks * lba });
    encode(&Head::Cmd(sqe), &[], false, false, 1)
}

/// An in-capsule write cut short: its header and half its data.
fn cut_capsule(cid: u16, lba: u32) -> Vec<u8> {
    let mut sqe = Sqe::new(io::WRITE, cid, 1);
    sqe.set_lba_range(0, 8192 / lba);
    sqe.set_sgl(Sgl::InCapsule {
        offset: 0,
        len: 8192,
    });
    let b = encode(&Head::Cmd(sqe), &[7; 8192], false, false, 1);
    b[..b.len() - 4096].to_vec()
}

/// A raw TCP connection that sent part of an ICReq, to be hung up by `how`.
fn partial_icreq(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    let ic = millrace_nvmf::initiator::ic_req_pdu();
    s.write_all(&ic[..ic.len() / 2]).unwrap();
    s
}

enum Hostile {
    Controller(HostController),
    Raw(TcpStream),
}

#[test]
fn nvme_hosts_hanging_up_under_load_neither_end_nor_starve_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (mut server, url) = serve(dir.path(), addr);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let good = HostController::connect(addr, NQN, &host(), 1)
            .await
            .unwrap();
        let lba = lba_bytes(&good).await;
        let mdts = good.id_ctrl[77];
        // The largest transfer the target takes, at most 32 MiB.
        let big = (4096u64 << mdts.min(13)).min(32 << 20) as u32;
        let mut hostile = Vec::new();
        for i in 0..24u16 {
            let c = HostController::connect(addr, NQN, &host(), 1)
                .await
                .unwrap();
            let q = &c.io[0];
            match i % 3 {
                // Stalled R2T writes, twice the host's share of the pool (a quarter of it) in
                // all: the target holds a buffer for each it can until the PDU timeout, and
                // the rest wait for the share.
                0 => {
                    let n = (128u32 << 20).div_ceil(big * 8).max(2) as u16;
                    for k in 0..n {
                        let at = (i * n + k) as u64 * big as u64 % (128 << 20);
                        let slba = at / lba as u64;
                        q.send_raw(&r2t_write(0x8000 + k, slba, big / lba, lba))
                            .await
                            .unwrap();
                    }
                }
                // An in-capsule write cut short.
                1 => q.send_raw(&cut_capsule(0x8000, lba)).await.unwrap(),
                // Reads pipelined; the controller is dropped before their replies are read.
                _ => {
                    for k in 0..8u16 {
                        let mut sqe = Sqe::new(io::READ, 0x8000 + k, 1);
                        sqe.set_lba_range(k as u64 * (1 << 20) / lba as u64, (1 << 20) / lba);
                        sqe.set_sgl(Sgl::Transport { len: 1 << 20 });
                        q.send_raw(&encode(&Head::Cmd(sqe), &[], false, false, 1))
                            .await
                            .unwrap();
                    }
                }
            }
            hostile.push(Hostile::Controller(c));
        }
        for _ in 0..8 {
            hostile.push(Hostile::Raw(partial_icreq(addr)));
        }
        // The good controller is answered within a second while all of that holds.
        for _ in 0..5 {
            good_io(&good, lba, &mut rng).await;
        }
        hostile.shuffle(&mut rng);
        for (i, h) in hostile.into_iter().enumerate() {
            match (h, rng.random_range(0..3)) {
                (Hostile::Controller(c), _) => drop(c),
                (Hostile::Raw(s), 0) => reset(s),
                (Hostile::Raw(s), 1) => {
                    let _ = s.shutdown(std::net::Shutdown::Write);
                    drop(s);
                }
                (Hostile::Raw(s), _) => drop(s),
            }
            if i % 4 == 0 {
                good_io(&good, lba, &mut rng).await;
            }
            assert!(server.alive(), "millrace serve ended when a host hung up");
        }
        for _ in 0..5 {
            good_io(&good, lba, &mut rng).await;
        }
        // Only the good controller's two connections are left, and the pool holds nothing.
        let t0 = Instant::now();
        loop {
            let open = metric(&url, "millrace_export_connections{");
            let in_use = metric(&url, "millrace_buffer_pool_bytes{state=\"in_use\"}");
            if open == 2.0 && in_use == 0.0 {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "after the hang-ups, {open} connections are open and {in_use} buffer bytes in use"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        good_io(&good, lba, &mut rng).await;
        // The stalled writes were in flight when their hosts went: counted as abandoned.
        let abandoned = metric(
            &url,
            "millrace_export_requests_abandoned_total{protocol=\"nvme-tcp\"}",
        );
        assert!(abandoned > 0.0, "no command was counted as abandoned");
    });
    assert!(server.alive());
    let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap();
    assert!(!log.contains("panic"), "the server panicked:\n{log}");
}
