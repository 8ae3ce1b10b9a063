//! Writes done from the target's read buffer (`BlockDevice::write_now`) over NVMe/TCP, against
//! the crate's own initiator: a write whose data comes in the capsule is offered to the device
//! first, one the device declines is written the usual way, and the host reads back exactly the
//! bytes it wrote either way. Writes with a data digest, FUA writes and writes fetched by R2T
//! are never offered; an error the device reports reaches the host as an error status.

use millrace_block::{check_range, BlockDevice};
use millrace_nvmf::cmd::{io as op, Sqe};
use millrace_nvmf::initiator::{HostController, HostOptions};
use millrace_nvmf::{Namespace, SubsystemConfig, Target, TargetConfig};
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const NQN: &str = "nqn.2024-01.io.millrace:borrowed";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000cd";
const SIZE: usize = 8 << 20;
/// Writes that begin at or past this block fail in `write_now`.
const BAD_LBA: u64 = 1800;

/// A device in memory that takes a write offered to `write_now` where its first block is a
/// multiple of 3, declines the others, and counts both.
struct Taking {
    mem: Mutex<Vec<u8>>,
    taken: AtomicUsize,
    declined: AtomicUsize,
    /// Offers longer than the in-capsule size (8 KiB): none should come.
    long: AtomicUsize,
}

impl BlockDevice for Taking {
    fn size_bytes(&self) -> u64 {
        SIZE as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(SIZE as u64, offset, buf.len() as u64)?;
        let o = offset as usize;
        buf.copy_from_slice(&self.mem.lock()[o..o + buf.len()]);
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        check_range(SIZE as u64, offset, data.len() as u64)?;
        let o = offset as usize;
        self.mem.lock()[o..o + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn write_now(&self, offset: u64, data: &[u8]) -> Option<io::Result<()>> {
        if data.len() > 8192 {
            self.long.fetch_add(1, Ordering::Relaxed);
        }
        if offset / 4096 >= BAD_LBA {
            return Some(Err(io::Error::other("the test's device fails this write")));
        }
        if !(offset / 4096).is_multiple_of(3) {
            self.declined.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.taken.fetch_add(1, Ordering::Relaxed);
        Some(self.write_at(offset, data))
    }
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| {
            (i.wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)).rotate_left(seed % 31) as u8
        })
        .collect()
}

async fn serve() -> (std::net::SocketAddr, Arc<Taking>) {
    let t = Target::new(TargetConfig::default());
    let dev = Arc::new(Taking {
        mem: Mutex::new(vec![0; SIZE]),
        taken: AtomicUsize::new(0),
        declined: AtomicUsize::new(0),
        long: AtomicUsize::new(0),
    });
    t.add_subsystem(SubsystemConfig {
        nqn: NQN.into(),
        serial: "MR-BORROW".into(),
        model: "Millrace test".into(),
        namespaces: vec![Namespace {
            nsid: 1,
            dev: dev.clone(),
            uuid: [0x41; 16],
            nguid: [0x42; 16],
        }],
        allowed_hosts: vec![HOST.into()],
        allow_any_host: false,
    })
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { t.serve(l).await });
    (addr, dev)
}

/// Writes of 4 and 8 KiB (in the capsule) and 64 KiB (after an R2T), 24 at once on each of two
/// queues, each read back; with `ddgst` the connection carries data digests.
async fn write_and_read_back(addr: std::net::SocketAddr, ddgst: bool, base: u64) -> usize {
    let o = HostOptions {
        hostnqn: HOST.into(),
        ddgst,
        ..Default::default()
    };
    let c = HostController::connect(addr, NQN, &o, 2).await.unwrap();
    let mut tasks = Vec::new();
    let mut in_capsule = 0;
    for (i, q) in c.io.iter().enumerate() {
        for j in 0..24u64 {
            let blocks = [1usize, 2, 16][j as usize % 3];
            in_capsule += (blocks <= 2) as usize;
            let lba = base + (i as u64 * 24 + j) * 17;
            let d = pattern(blocks * 4096, lba as u32 ^ ddgst as u32);
            let q = q.clone();
            tasks.push(tokio::spawn(async move {
                q.write(1, lba, d.clone(), 4096).await.unwrap();
                let back = q.read(1, lba, blocks as u32, 4096).await.unwrap();
                assert!(
                    back == d,
                    "block {lba}: a read gives back the bytes written"
                );
            }));
        }
    }
    for h in tasks {
        h.await.unwrap();
    }
    in_capsule
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_capsule_writes_are_offered_to_the_device_and_read_back_either_way() {
    let (addr, dev) = serve().await;
    let offered = write_and_read_back(addr, false, 0).await;
    let (taken, declined) = (
        dev.taken.load(Ordering::Relaxed),
        dev.declined.load(Ordering::Relaxed),
    );
    // Offered where the capsule came whole in one read of the socket: nearly all of them.
    assert!(
        taken + declined <= offered && taken + declined >= offered / 2,
        "{} of {offered} in-capsule writes offered",
        taken + declined
    );
    assert_eq!(
        dev.long.load(Ordering::Relaxed),
        0,
        "no write fetched by R2T is offered"
    );
    assert!(
        taken > 0 && declined > 0,
        "some were taken ({taken}), some declined ({declined})"
    );
    let offered = write_and_read_back(addr, true, 900).await;
    assert!(offered > 0);
    assert_eq!(
        dev.taken.load(Ordering::Relaxed) + dev.declined.load(Ordering::Relaxed),
        taken + declined,
        "no write of a connection with a data digest is offered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fua_writes_are_not_offered_and_a_failure_reaches_the_host() {
    let (addr, dev) = serve().await;
    let o = HostOptions {
        hostnqn: HOST.into(),
        ..Default::default()
    };
    let c = HostController::connect(addr, NQN, &o, 1).await.unwrap();
    let q = &c.io[0];
    let d = pattern(4096, 7);
    let mut s = Sqe::new(op::WRITE, 0, 1);
    s.set_lba_range(3, 1);
    s.set_cdw(12, s.cdw(12) | 1 << 30);
    q.submit(s, Some(d.clone()), 0).await.unwrap();
    assert_eq!(
        dev.taken.load(Ordering::Relaxed),
        0,
        "a FUA write is not offered"
    );
    assert_eq!(
        q.read(1, 3, 1, 4096).await.unwrap(),
        d,
        "and it was written"
    );
    let r = q.write(1, BAD_LBA, pattern(4096, 8), 4096).await;
    assert!(r.is_err(), "the device's failure reaches the host: {r:?}");
    q.write(1, 6, pattern(4096, 9), 4096).await.unwrap();
    assert_eq!(
        dev.taken.load(Ordering::Relaxed),
        1,
        "the queue goes on taking writes"
    );
    assert_eq!(q.read(1, 6, 1, 4096).await.unwrap(), pattern(4096, 9));
}
