//! Reads answered from a device's own bytes (`BlockDevice::lend`) over NVMe/TCP, against the
//! crate's own initiator: the host gets exactly the bytes written, every lent buffer is given
//! back once sent, and a connection with a data digest is never answered from lent bytes.

use millrace_block::{check_range, BlockDevice, IoBuf, Lent};
use millrace_nvmf::cmd::{self, Cqe, Sgl, Sqe, CQE_LEN};
use millrace_nvmf::initiator::{connect_pdu, ic_req_pdu, HostController, HostOptions};
use millrace_nvmf::pdu::{self, Head, CH_LEN, IC_LEN};
use millrace_nvmf::{Namespace, SubsystemConfig, Target, TargetConfig};
use std::cell::UnsafeCell;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NQN: &str = "nqn.2024-01.io.millrace:lent";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000ab";
const SIZE: usize = 8 << 20;

/// Bytes at a fixed place for the device's life, as a mapped drive file's are.
struct Mem(UnsafeCell<Box<[u8]>>);

// SAFETY: the tests write and read disjoint ranges, or one after the other.
unsafe impl Sync for Mem {}

impl Mem {
    fn at(&self, offset: u64) -> *mut u8 {
        // SAFETY: callers check the range first.
        unsafe { (*self.0.get()).as_mut_ptr().add(offset as usize) }
    }
}

/// A device that lends every range it is asked for (except where told not to), and counts.
struct Lending {
    mem: Arc<Mem>,
    lends: AtomicUsize,
}

impl BlockDevice for Lending {
    fn size_bytes(&self) -> u64 {
        SIZE as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(SIZE as u64, offset, buf.len() as u64)?;
        // SAFETY: in range; see `Mem`.
        unsafe { std::ptr::copy_nonoverlapping(self.mem.at(offset), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        check_range(SIZE as u64, offset, data.len() as u64)?;
        // SAFETY: in range; see `Mem`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.mem.at(offset), data.len()) };
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    /// In pieces of 12 KiB, as an array lends a range over several members' strips.
    fn lend(&self, offset: u64, len: usize) -> Option<Lent> {
        check_range(SIZE as u64, offset, len as u64).ok()?;
        self.lends.fetch_add(1, Ordering::Relaxed);
        let mut lent = Lent::new();
        let mut at = 0;
        while at < len {
            let n = (len - at).min(12 << 10);
            let p = NonNull::new(self.mem.at(offset + at as u64))?;
            // SAFETY: the bytes live as long as `Mem`, which the buffer keeps.
            lent.push(unsafe { IoBuf::lent(p, n, Box::new(self.mem.clone())) });
            at += n;
        }
        Some(lent)
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).rotate_left(seed as u32) as u8 ^ seed)
        .collect()
}

/// A target serving a lending device; returns it, its address, the device and its bytes.
async fn serve(cfg: TargetConfig) -> (Target, std::net::SocketAddr, Arc<Lending>, Arc<Mem>) {
    let t = Target::new(cfg);
    let mem = Arc::new(Mem(UnsafeCell::new(vec![0u8; SIZE].into_boxed_slice())));
    let dev = Arc::new(Lending {
        mem: mem.clone(),
        lends: AtomicUsize::new(0),
    });
    t.add_subsystem(SubsystemConfig {
        nqn: NQN.into(),
        serial: "MR-LENT".into(),
        model: "Millrace test".into(),
        namespaces: vec![Namespace {
            nsid: 1,
            dev: dev.clone(),
            uuid: [0x31; 16],
            nguid: [0x32; 16],
        }],
        allowed_hosts: vec![HOST.into()],
        allow_any_host: false,
    })
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let t2 = t.clone();
    tokio::spawn(async move { t2.serve(l).await });
    (t, addr, dev, mem)
}

/// Waits until only the test and the device hold the device's bytes: every lent piece is back.
async fn all_back(mem: &Arc<Mem>, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Arc::strong_count(mem) > 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Arc::strong_count(mem) == 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_from_lent_bytes_are_the_bytes_written_and_digests_turn_lending_off() {
    let (t, addr, dev, mem) = serve(TargetConfig::default()).await;
    for ddgst in [false, true] {
        let o = HostOptions {
            hostnqn: HOST.into(),
            ddgst,
            ..Default::default()
        };
        let before = dev.lends.load(Ordering::Relaxed);
        let c = HostController::connect(addr, NQN, &o, 2).await.unwrap();
        let mut tasks = Vec::new();
        for (i, q) in c.io.iter().enumerate() {
            let q = q.clone();
            tasks.push(tokio::spawn(async move {
                // 4K and 128K reads, 16 at once per queue, each of what was just written.
                let mut inner = Vec::new();
                for j in 0..16u64 {
                    let q = q.clone();
                    inner.push(tokio::spawn(async move {
                        let len = if j % 2 == 0 { 4096 } else { 128 << 10 };
                        let d = pattern(len, (i * 16 + j as usize) as u8 ^ ddgst as u8);
                        let lba = (i as u64 * 16 + j) * 32;
                        q.write(1, lba, d.clone(), 4096).await.unwrap();
                        let back = q.read(1, lba, (len / 4096) as u32, 4096).await.unwrap();
                        assert_eq!(back, d, "a read gives back the bytes written");
                    }));
                }
                for h in inner {
                    h.await.unwrap();
                }
            }));
        }
        for h in tasks {
            h.await.unwrap();
        }
        let lent = dev.lends.load(Ordering::Relaxed) - before;
        if ddgst {
            assert_eq!(
                lent, 0,
                "no read of a connection with a data digest is lent"
            );
        } else {
            assert_eq!(lent, 32, "every read of this connection is lent");
        }
        assert_eq!(t.stats().lent_reads, 32, "and the target counts them");
        drop(c);
    }
    // Every lent piece went back once sent: only the device holds its bytes.
    assert!(
        all_back(&mem, Duration::from_secs(5)).await,
        "the test's and the device's"
    );
}

/// A host that sends reads and never reads its socket holds their lent pieces only until the
/// reply timeout: then its connection is closed and every piece goes back, though the host
/// keeps its end open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_stops_reading_holds_lent_pieces_until_the_reply_timeout() {
    let (_t, addr, dev, mem) = serve(TargetConfig {
        reply_timeout: Duration::from_secs(1),
        ..Default::default()
    })
    .await;
    let o = HostOptions {
        hostnqn: HOST.into(),
        ..Default::default()
    };
    let c = HostController::connect(addr, NQN, &o, 0).await.unwrap();
    c.admin.set_features(0x07, 0).await.unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut s = sock.connect(addr).await.unwrap();
    s.write_all(&ic_req_pdu()).await.unwrap();
    s.read_exact(&mut [0u8; IC_LEN]).await.unwrap();
    s.write_all(&connect_pdu(&o, NQN, 1, 128, c.cntlid))
        .await
        .unwrap();
    let mut b = [0u8; CH_LEN + CQE_LEN];
    s.read_exact(&mut b).await.unwrap();
    assert!(Cqe::decode(b[CH_LEN..].try_into().unwrap())
        .status()
        .is_success());
    // 100 reads of 256 KiB, far more than the sockets hold; none of their replies is read.
    let mut all = Vec::new();
    for cid in 0..100u16 {
        let mut r = Sqe::new(cmd::io::READ, cid, 1);
        r.set_lba_range(cid as u64 * 64 % (SIZE as u64 / 4096 - 64), 64);
        r.set_sgl(Sgl::Transport { len: 256 << 10 });
        all.extend(pdu::encode(&Head::Cmd(r), &[], false, false, 1));
    }
    s.write_all(&all).await.unwrap();
    let t0 = Instant::now();
    while dev.lends.load(Ordering::Relaxed) < 100 && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        Arc::strong_count(&mem) > 2,
        "the stalled replies hold their pieces"
    );
    assert!(
        all_back(&mem, Duration::from_secs(10)).await,
        "the pieces went back once the reply timeout closed the connection"
    );
    // What the socket still delivers ends: the target closed its side.
    let mut rest = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
    assert!(r.is_ok(), "the connection was closed");
    drop(c);
}
