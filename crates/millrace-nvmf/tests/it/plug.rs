//! Writes held for the write that continues them (issue #15, `plug` in the transport): a host
//! sends two 128 KiB writes into one 256 KiB write granule (a parity array's full stripe) and
//! the first one's data; the target must not write it until the second's data is in, so the
//! device gets both together and can merge them; but never longer than the configured hold, and
//! never when the device has no granule or the write ends on a granule's boundary. The host here
//! is raw PDUs on a socket, so the test decides when each write's data goes out.

use millrace_block::{BlockDevice, MemBlockDevice};
use millrace_nvmf::cmd::{io, Sgl, Sqe};
use millrace_nvmf::initiator::{connect_pdu, ic_req_pdu, HostController, HostOptions};
use millrace_nvmf::pdu::{encode, read_head, DataHdr, Head, Negotiated, Side};
use millrace_nvmf::{Namespace, SubsystemConfig, Target, TargetConfig};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

const NQN: &str = "nqn.2024-01.io.millrace:plug";
const GRANULE: u64 = 256 << 10;
const HALF: usize = 128 << 10;
/// 4 KiB blocks in half a granule.
const HALF_BLOCKS: u64 = 32;

/// A device with a write granule (or none) that records each write it is given.
struct Recording {
    mem: MemBlockDevice,
    granule: u64,
    writes: Mutex<Vec<(u64, usize)>>,
}

impl BlockDevice for Recording {
    fn size_bytes(&self) -> u64 {
        self.mem.size_bytes()
    }
    fn write_granule_bytes(&self) -> u64 {
        self.granule
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.mem.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.writes.lock().unwrap().push((offset, data.len()));
        self.mem.write_at(offset, data)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Recording {
    fn writes(&self) -> Vec<(u64, usize)> {
        let mut w = self.writes.lock().unwrap().clone();
        w.sort();
        w
    }
}

async fn target(granule: u64, hold: Duration) -> (Arc<Recording>, SocketAddr) {
    let dev = Arc::new(Recording {
        mem: MemBlockDevice::new(16 << 20),
        granule,
        writes: Mutex::new(Vec::new()),
    });
    let t = Target::new(TargetConfig {
        write_hold: hold,
        ..TargetConfig::default()
    });
    t.add_subsystem(SubsystemConfig {
        nqn: NQN.into(),
        serial: "MR-PLUG".into(),
        model: "Millrace plug".into(),
        namespaces: vec![Namespace {
            nsid: 1,
            dev: dev.clone(),
            uuid: [3; 16],
            nguid: [3; 16],
            ana_group: 0,
        }],
        allowed_hosts: vec![],
        allow_any_host: true,
    })
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { t.serve(l).await });
    (dev, addr)
}

/// An I/O queue spoken to in raw PDUs (its controller's admin queue kept alive beside it).
struct RawQueue {
    _ctrl: HostController,
    rd: BufReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
    /// Each write's transfer tag, from its R2T.
    ttag: HashMap<u16, u16>,
}

const NEG: Negotiated = Negotiated {
    ic_done: true,
    hdgst: false,
    ddgst: false,
    max_data: u32::MAX,
};

impl RawQueue {
    async fn open(addr: SocketAddr) -> RawQueue {
        let o = HostOptions::default();
        let ctrl = HostController::connect(addr, NQN, &o, 0).await.unwrap();
        ctrl.admin.set_features(0x07, 0).await.unwrap();
        let sock = TcpStream::connect(addr).await.unwrap();
        sock.set_nodelay(true).unwrap();
        let (rd, mut wr) = sock.into_split();
        let mut rd = BufReader::new(rd);
        wr.write_all(&ic_req_pdu()).await.unwrap();
        let init = Negotiated::initial();
        let (h, _, _) = read_head(&mut rd, Side::Host, &init).await.unwrap();
        assert!(matches!(h, Head::IcResp(_)), "{h:?}");
        let mut q = RawQueue {
            _ctrl: ctrl,
            rd,
            wr,
            ttag: HashMap::new(),
        };
        q.send(&connect_pdu(&o, NQN, 1, 32, q._ctrl.cntlid)).await;
        assert_eq!(q.completion().await, 0);
        q
    }

    async fn send(&mut self, pdu: &[u8]) {
        self.wr.write_all(pdu).await.unwrap();
    }

    /// Sends a Write of half a granule at `slba` as command `cid`, its data to follow.
    async fn write_command(&mut self, cid: u16, slba: u64) {
        let mut sqe = Sqe::new(io::WRITE, cid, 1);
        sqe.set_lba_range(slba, HALF_BLOCKS as u32);
        sqe.set_sgl(Sgl::Transport { len: HALF as u32 });
        self.send(&encode(&Head::Cmd(sqe), &[], false, false, 1))
            .await;
    }

    /// Reads the next PDU: an R2T is remembered and None returned, a completion's command id
    /// is returned (and must be a success).
    async fn next(&mut self) -> Option<u16> {
        let (h, _, _) = read_head(&mut self.rd, Side::Host, &NEG).await.unwrap();
        match h {
            Head::R2t(r) => {
                assert_eq!(r.r2tl as usize, HALF);
                self.ttag.insert(r.cccid, r.ttag);
                None
            }
            Head::Resp(c) => {
                assert!(c.status().is_success(), "{:?}", c.status());
                Some(c.cid)
            }
            h => panic!("unexpected PDU {h:?}"),
        }
    }

    async fn completion(&mut self) -> u16 {
        loop {
            if let Some(cid) = self.next().await {
                return cid;
            }
        }
    }

    async fn r2ts(&mut self, n: usize) {
        while self.ttag.len() < n {
            assert_eq!(
                self.next().await,
                None,
                "a completion before the data was sent"
            );
        }
    }

    async fn data(&mut self, cid: u16, fill: u8) {
        let h = DataHdr {
            cccid: cid,
            ttag: self.ttag[&cid],
            datao: 0,
            datal: HALF as u32,
            last: true,
            success: false,
        };
        let d = vec![fill; HALF];
        self.send(&encode(&Head::H2CData(h), &d, false, false, 1))
            .await;
    }
}

/// Two writes into one granule, the first's data sent; returns the queue after `wait`.
async fn first_half_sent(addr: SocketAddr, first_slba: u64) -> RawQueue {
    let mut q = RawQueue::open(addr).await;
    q.write_command(1, first_slba).await;
    q.write_command(2, first_slba + HALF_BLOCKS).await;
    q.r2ts(2).await;
    q.data(1, 0xa1).await;
    q
}

#[tokio::test]
async fn a_write_waits_for_the_one_that_completes_its_granule() {
    let (dev, addr) = target(GRANULE, Duration::from_secs(30)).await;
    let mut q = first_half_sent(addr, 0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(dev.writes(), [], "the first half went to the device alone");
    q.data(2, 0xb2).await;
    let mut done = [q.completion().await, q.completion().await];
    done.sort();
    assert_eq!(done, [1, 2]);
    assert_eq!(dev.writes(), [(0, HALF), (HALF as u64, HALF)]);
    let mut back = vec![0u8; GRANULE as usize];
    dev.read_at(0, &mut back).unwrap();
    assert!(back[..HALF].iter().all(|&b| b == 0xa1));
    assert!(back[HALF..].iter().all(|&b| b == 0xb2));
}

#[tokio::test]
async fn a_held_write_goes_on_when_its_hold_is_over() {
    let hold = Duration::from_millis(100);
    let (dev, addr) = target(GRANULE, hold).await;
    let start = Instant::now();
    let mut q = first_half_sent(addr, 0).await;
    assert_eq!(q.completion().await, 1);
    assert!(start.elapsed() >= hold, "held {:?}", start.elapsed());
    assert_eq!(dev.writes(), [(0, HALF)]);
    q.data(2, 0xb2).await;
    assert_eq!(q.completion().await, 2);
}

#[tokio::test]
async fn writes_are_not_held_without_a_granule_or_at_its_boundary() {
    for (granule, slba) in [(0, 0), (GRANULE, HALF_BLOCKS)] {
        let (dev, addr) = target(granule, Duration::from_secs(30)).await;
        let mut q = first_half_sent(addr, slba).await;
        let first = tokio::time::timeout(Duration::from_secs(10), q.completion()).await;
        assert_eq!(first.ok(), Some(1), "granule {granule}, slba {slba}");
        assert_eq!(dev.writes(), [(slba * 4096, HALF)]);
        q.data(2, 0xb2).await;
        assert_eq!(q.completion().await, 2);
    }
}
