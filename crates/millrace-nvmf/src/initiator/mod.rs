//! A small user-space NVMe/TCP initiator: enough to test the target from Rust and to drive
//! host-side load from the bench. One `HostQueue` is one TCP connection (admin or I/O queue)
//! with many commands in flight; `HostController` connects an admin queue and I/O queues the
//! way the Linux host does (enable, Identify, Number of Queues, Connect per queue).

mod auth;
mod error;
mod reader;
mod resv;

pub use auth::{auth_sqe, HostAuth};
pub use error::Error;
pub use resv::{ReportedRegistrant, ReservationReport};

use crate::cmd::{admin, fctype, io, prop, ConnectData, Cqe, DsmRange, Sgl, Sqe, CONNECT_DATA_LEN};
use crate::model::DISCOVERY_NQN;
use crate::pdu::{encode, read_head, Head, IcReq, Negotiated, ReadError, Side};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// How a host connects.
#[derive(Clone, Debug)]
pub struct HostOptions {
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub hdgst: bool,
    pub ddgst: bool,
    /// Entries per queue (the Connect SQSIZE is this minus one).
    pub queue_size: u16,
    /// Keep-alive timeout asked for on the admin queue, in ms (0: none).
    pub kato_ms: u32,
    /// Send Keep Alive commands by ourselves (every half timeout).
    pub keep_alive: bool,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001".into(),
            hostid: [1; 16],
            hdgst: false,
            ddgst: false,
            queue_size: 32,
            kato_ms: 0,
            keep_alive: true,
        }
    }
}

/// A completed command: its CQE and the data the target sent.
#[derive(Debug)]
pub struct Completion {
    pub cqe: Cqe,
    pub data: Vec<u8>,
}

struct Waiter {
    tx: oneshot::Sender<Result<Completion, Error>>,
    read_buf: Vec<u8>,
    received: usize,
    write_data: Option<Arc<Vec<u8>>>,
}

struct Shared {
    wr: tokio::sync::Mutex<OwnedWriteHalf>,
    waiters: Mutex<HashMap<u16, Waiter>>,
    hdgst: bool,
    ddgst: bool,
    maxh2cdata: usize,
    closed: AtomicBool,
}

/// One queue: a TCP connection to the target.
pub struct HostQueue {
    sh: Arc<Shared>,
    next_cid: AtomicU16,
    /// In-capsule data this queue may send (8 KiB on admin queues; IOCCSZ on I/O queues).
    pub in_capsule: usize,
    pub qid: u16,
    pub cntlid: u16,
    /// The Connect result asked for authentication (AUTHREQ.ATR).
    pub auth_required: bool,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for HostQueue {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl HostQueue {
    /// Opens a TCP connection and exchanges ICReq/ICResp; no Connect yet.
    pub async fn open(addr: SocketAddr, o: &HostOptions) -> Result<HostQueue, Error> {
        let sock = TcpStream::connect(addr).await?;
        sock.set_nodelay(true)?;
        let (rd, mut wr) = sock.into_split();
        let mut rd = BufReader::with_capacity(64 * 1024, rd);
        let req = IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: o.hdgst,
            ddgst: o.ddgst,
            maxr2t: 0,
        };
        wr.write_all(&encode(&Head::IcReq(req), &[], false, false, 1))
            .await?;
        let (head, _, _) = read_head(&mut rd, Side::Host, &Negotiated::initial())
            .await
            .map_err(read_err)?;
        let Head::IcResp(r) = head else {
            return Err(Error::Protocol(
                "the target did not answer ICReq with ICResp".into(),
            ));
        };
        if r.hdgst != o.hdgst || r.ddgst != o.ddgst {
            return Err(Error::Protocol(
                "the target did not grant the digests asked for".into(),
            ));
        }
        if r.maxh2cdata < 4096 {
            return Err(Error::Protocol(format!(
                "MAXH2CDATA {} is below the 4096 the spec requires",
                r.maxh2cdata
            )));
        }
        let sh = Arc::new(Shared {
            wr: tokio::sync::Mutex::new(wr),
            waiters: Mutex::new(HashMap::new()),
            hdgst: r.hdgst,
            ddgst: r.ddgst,
            maxh2cdata: r.maxh2cdata as usize,
            closed: AtomicBool::new(false),
        });
        let neg = Negotiated {
            ic_done: true,
            hdgst: r.hdgst,
            ddgst: r.ddgst,
            max_data: u32::MAX,
        };
        let align = (r.cpda as usize + 1) * 4;
        let reader = tokio::spawn(reader::reader(rd, sh.clone(), neg, align));
        Ok(HostQueue {
            sh,
            next_cid: AtomicU16::new(0),
            in_capsule: 8192,
            qid: 0,
            cntlid: 0xffff,
            auth_required: false,
            reader,
        })
    }

    /// Opens a queue and connects it: `qid` 0 makes a new controller (its id is returned in
    /// `cntlid`), others join controller `cntlid`.
    pub async fn connect(
        addr: SocketAddr,
        o: &HostOptions,
        subnqn: &str,
        qid: u16,
        cntlid: u16,
    ) -> Result<HostQueue, Error> {
        HostQueue::connect_auth(addr, o, subnqn, qid, cntlid, None).await
    }

    /// `connect`, then, when the target asks for it and `auth` is given, a DH-HMAC-CHAP
    /// transaction (a queue the target wants authenticated and no `auth`: left as it is).
    pub async fn connect_auth(
        addr: SocketAddr,
        o: &HostOptions,
        subnqn: &str,
        qid: u16,
        cntlid: u16,
        auth: Option<&HostAuth>,
    ) -> Result<HostQueue, Error> {
        let mut q = HostQueue::open(addr, o).await?;
        let mut sqe = Sqe::fabrics(fctype::CONNECT, 0);
        let kato = if qid == 0 { o.kato_ms } else { 0 };
        // Admin queues hold 32 entries, as on Linux hosts.
        let size = if qid == 0 {
            o.queue_size.min(32)
        } else {
            o.queue_size
        };
        sqe.set_connect(qid, size.max(2) - 1, kato);
        let d = ConnectData {
            hostid: o.hostid,
            cntlid: if qid == 0 { 0xffff } else { cntlid },
            subnqn: subnqn.into(),
            hostnqn: o.hostnqn.clone(),
        };
        let c = q.submit(sqe, Some(d.encode()), 0).await?;
        q.qid = qid;
        q.cntlid = c.cqe.result as u16;
        q.auth_required = c.cqe.result & 1 << 17 != 0;
        if let (true, Some(a)) = (q.auth_required, auth) {
            let tid = q.cntlid ^ qid.rotate_left(8);
            q.authenticate(a, &o.hostnqn, subnqn, tid).await?;
        }
        Ok(q)
    }

    /// Writes raw bytes to the connection (for tests of hostile input).
    pub async fn send_raw(&self, bytes: &[u8]) -> Result<(), Error> {
        let mut w = self.sh.wr.lock().await;
        w.write_all(bytes).await?;
        Ok(())
    }

    /// True once the target closed the connection or it failed.
    pub fn is_closed(&self) -> bool {
        self.sh.closed.load(Ordering::Relaxed)
    }

    fn cid(&self) -> u16 {
        loop {
            let c = self.next_cid.fetch_add(1, Ordering::Relaxed);
            if !self.sh.waiters.lock().contains_key(&c) {
                return c;
            }
        }
    }

    /// Sends a command with `out` as its data (in the capsule when it fits, otherwise after an
    /// R2T) or expecting `in_len` bytes back, and waits for its completion. The SGL is set here.
    pub async fn submit(
        &self,
        mut sqe: Sqe,
        out: Option<Vec<u8>>,
        in_len: usize,
    ) -> Result<Completion, Error> {
        let (sgl, icd, write_data) = match out {
            Some(d) if d.len() <= self.in_capsule => (
                Sgl::InCapsule {
                    offset: 0,
                    len: d.len() as u32,
                },
                d,
                None,
            ),
            Some(d) => (
                Sgl::Transport {
                    len: d.len() as u32,
                },
                Vec::new(),
                Some(Arc::new(d)),
            ),
            None => (Sgl::Transport { len: in_len as u32 }, Vec::new(), None),
        };
        sqe.set_sgl(sgl);
        self.submit_as_is(sqe, &icd, in_len, write_data).await
    }

    /// Sends a command exactly as given (SGL untouched) with `icd` as in-capsule data.
    pub async fn submit_as_is(
        &self,
        mut sqe: Sqe,
        icd: &[u8],
        in_len: usize,
        write_data: Option<Arc<Vec<u8>>>,
    ) -> Result<Completion, Error> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        let cid = self.cid();
        sqe.set_cid(cid);
        let (tx, rx) = oneshot::channel();
        self.sh.waiters.lock().insert(
            cid,
            Waiter {
                tx,
                read_buf: vec![0; in_len],
                received: 0,
                write_data,
            },
        );
        let pdu = encode(&Head::Cmd(sqe), icd, self.sh.hdgst, self.sh.ddgst, 1);
        if let Err(e) = self.send_raw(&pdu).await {
            self.sh.waiters.lock().remove(&cid);
            return Err(e);
        }
        let c = rx.await.map_err(|_| Error::Closed)??;
        let st = c.cqe.status();
        if !st.is_success() {
            return Err(Error::Status(st, c.cqe));
        }
        Ok(c)
    }

    pub async fn property_get(&self, offset: u32, size8: bool) -> Result<u64, Error> {
        let mut s = Sqe::fabrics(fctype::PROPERTY_GET, 0);
        s.set_prop(size8, offset, 0);
        Ok(self.submit(s, None, 0).await?.cqe.result)
    }

    pub async fn property_set(&self, offset: u32, value: u32) -> Result<(), Error> {
        let mut s = Sqe::fabrics(fctype::PROPERTY_SET, 0);
        s.set_prop(false, offset, value as u64);
        self.submit(s, None, 0).await.map(|_| ())
    }

    pub async fn identify(&self, cns: u8, nsid: u32) -> Result<Vec<u8>, Error> {
        let mut s = Sqe::new(admin::IDENTIFY, 0, nsid);
        s.set_cdw(10, cns as u32);
        Ok(self.submit(s, None, 4096).await?.data)
    }

    pub async fn get_log_page(&self, lid: u8, len: usize, offset: u64) -> Result<Vec<u8>, Error> {
        let mut s = Sqe::new(admin::GET_LOG_PAGE, 0, u32::MAX);
        let numd = (len / 4).max(1) as u32 - 1;
        s.set_cdw(10, lid as u32 | (numd & 0xffff) << 16);
        s.set_cdw(11, numd >> 16);
        s.set_cdw(12, offset as u32);
        s.set_cdw(13, (offset >> 32) as u32);
        Ok(self.submit(s, None, len).await?.data)
    }

    pub async fn set_features(&self, fid: u8, value: u32) -> Result<u64, Error> {
        let mut s = Sqe::new(admin::SET_FEATURES, 0, 0);
        s.set_cdw(10, fid as u32);
        s.set_cdw(11, value);
        Ok(self.submit(s, None, 0).await?.cqe.result)
    }

    pub async fn get_features(&self, fid: u8) -> Result<u64, Error> {
        let mut s = Sqe::new(admin::GET_FEATURES, 0, 0);
        s.set_cdw(10, fid as u32);
        Ok(self.submit(s, None, 0).await?.cqe.result)
    }

    pub async fn keep_alive(&self) -> Result<(), Error> {
        self.submit(Sqe::new(admin::KEEP_ALIVE, 0, 0), None, 0)
            .await
            .map(|_| ())
    }

    /// Reads `blocks` logical blocks of `lba_bytes` each.
    pub async fn read(
        &self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        lba_bytes: u32,
    ) -> Result<Vec<u8>, Error> {
        let mut s = Sqe::new(io::READ, 0, nsid);
        s.set_lba_range(slba, blocks);
        Ok(self
            .submit(s, None, blocks as usize * lba_bytes as usize)
            .await?
            .data)
    }

    /// Writes whole logical blocks (`data.len()` a multiple of `lba_bytes`).
    pub async fn write(
        &self,
        nsid: u32,
        slba: u64,
        data: Vec<u8>,
        lba_bytes: u32,
    ) -> Result<(), Error> {
        let mut s = Sqe::new(io::WRITE, 0, nsid);
        s.set_lba_range(slba, (data.len() / lba_bytes as usize) as u32);
        self.submit(s, Some(data), 0).await.map(|_| ())
    }

    pub async fn flush(&self, nsid: u32) -> Result<(), Error> {
        self.submit(Sqe::new(io::FLUSH, 0, nsid), None, 0)
            .await
            .map(|_| ())
    }

    pub async fn write_zeroes(&self, nsid: u32, slba: u64, blocks: u32) -> Result<(), Error> {
        let mut s = Sqe::new(io::WRITE_ZEROES, 0, nsid);
        s.set_lba_range(slba, blocks);
        self.submit(s, None, 0).await.map(|_| ())
    }

    /// Dataset Management with the deallocate attribute over `(slba, blocks)` ranges.
    pub async fn deallocate(&self, nsid: u32, ranges: &[(u64, u32)]) -> Result<(), Error> {
        let mut s = Sqe::new(io::DATASET_MANAGEMENT, 0, nsid);
        s.set_cdw(10, (ranges.len().max(1) - 1) as u32);
        s.set_cdw(11, 1 << 2);
        let mut d = Vec::with_capacity(ranges.len() * 16);
        for &(slba, blocks) in ranges {
            d.extend_from_slice(
                &DsmRange {
                    attributes: 0,
                    blocks,
                    slba,
                }
                .encode(),
            );
        }
        self.submit(s, Some(d), 0).await.map(|_| ())
    }

    pub async fn disconnect(&self) -> Result<(), Error> {
        self.submit(Sqe::fabrics(fctype::DISCONNECT, 0), None, 0)
            .await
            .map(|_| ())
    }
}

fn read_err(e: ReadError) -> Error {
    match e {
        ReadError::Io(e) => Error::Io(e),
        ReadError::Pdu(e) => Error::Protocol(e.to_string()),
    }
}

/// A connected controller: an admin queue and some I/O queues.
pub struct HostController {
    pub admin: Arc<HostQueue>,
    pub io: Vec<Arc<HostQueue>>,
    pub cntlid: u16,
    /// Identify Controller data.
    pub id_ctrl: Vec<u8>,
    keep_alive: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for HostController {
    fn drop(&mut self) {
        if let Some(k) = self.keep_alive.take() {
            k.abort();
        }
    }
}

impl HostController {
    /// Connects the admin queue, enables the controller, identifies it, asks for `io_queues`
    /// I/O queues and connects them.
    pub async fn connect(
        addr: SocketAddr,
        subnqn: &str,
        o: &HostOptions,
        io_queues: u16,
    ) -> Result<HostController, Error> {
        HostController::connect_auth(addr, subnqn, o, io_queues, None).await
    }

    /// `connect`, authenticating each queue the target asks to (DH-HMAC-CHAP) with `auth`.
    pub async fn connect_auth(
        addr: SocketAddr,
        subnqn: &str,
        o: &HostOptions,
        io_queues: u16,
        auth: Option<&HostAuth>,
    ) -> Result<HostController, Error> {
        let admin = HostQueue::connect_auth(addr, o, subnqn, 0, 0xffff, auth).await?;
        let admin = Arc::new(admin);
        let cntlid = admin.cntlid;
        let _cap = admin.property_get(prop::CAP, true).await?;
        // Enable: 64-byte SQEs, 16-byte CQEs, NVM command set, 4 KiB pages.
        admin.property_set(prop::CC, 1 | 6 << 16 | 4 << 20).await?;
        let mut ready = false;
        for _ in 0..100 {
            if admin.property_get(prop::CSTS, false).await? & 1 == 1 {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if !ready {
            return Err(Error::Protocol(
                "the controller did not become ready".into(),
            ));
        }
        let id_ctrl = admin.identify(1, 0).await?;
        let ioccsz = u32::from_le_bytes(id_ctrl[1792..1796].try_into().unwrap()) as usize;
        let mut io = Vec::new();
        if io_queues > 0 && subnqn != DISCOVERY_NQN {
            let n = io_queues - 1;
            let granted = admin
                .set_features(0x07, n as u32 | (n as u32) << 16)
                .await?;
            let granted = (granted as u16).min((granted >> 16) as u16) + 1;
            for qid in 1..=io_queues.min(granted) {
                let mut q = HostQueue::connect_auth(addr, o, subnqn, qid, cntlid, auth).await?;
                q.in_capsule = (ioccsz * 16).saturating_sub(64);
                io.push(Arc::new(q));
            }
        }
        let keep_alive = (o.kato_ms > 0 && o.keep_alive).then(|| {
            let a = admin.clone();
            let period = Duration::from_millis((o.kato_ms / 2).max(50) as u64);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(period).await;
                    if a.keep_alive().await.is_err() {
                        return;
                    }
                }
            })
        });
        Ok(HostController {
            admin,
            io,
            cntlid,
            id_ctrl,
            keep_alive,
        })
    }

    /// Shuts the controller down (CC.SHN) the way hosts do before disconnecting.
    pub async fn shutdown(&self) -> Result<(), Error> {
        self.admin
            .property_set(prop::CC, 1 | 6 << 16 | 4 << 20 | 1 << 14)
            .await
    }
}

/// One discovery log entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryEntry {
    pub trtype: u8,
    pub adrfam: u8,
    pub subtype: u8,
    pub portid: u16,
    pub trsvcid: String,
    pub traddr: String,
    pub subnqn: String,
    /// Transport requirements: 01b secure channel required, 10b not required.
    pub treq: u8,
    /// NVMe/TCP's security type (TSAS byte 0): 0 none, 2 TLS 1.3.
    pub sectype: u8,
}

fn field(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).trim_end().to_string()
}

/// Reads the discovery log of the target at `addr` as host `o.hostnqn` sees it.
pub async fn discover(addr: SocketAddr, o: &HostOptions) -> Result<Vec<DiscoveryEntry>, Error> {
    let c = HostController::connect(addr, DISCOVERY_NQN, o, 0).await?;
    let hdr = c.admin.get_log_page(0x70, 1024, 0).await?;
    let n = u64::from_le_bytes(hdr[8..16].try_into().unwrap()).min(1024) as usize;
    let mut out = Vec::with_capacity(n);
    if n > 0 {
        let all = c.admin.get_log_page(0x70, 1024 * n, 1024).await?;
        for e in all.chunks_exact(1024) {
            out.push(DiscoveryEntry {
                trtype: e[0],
                adrfam: e[1],
                subtype: e[2],
                portid: u16::from_le_bytes([e[4], e[5]]),
                trsvcid: field(&e[32..64]),
                traddr: field(&e[512..768]),
                subnqn: field(&e[256..512]),
                treq: e[3],
                sectype: e[768],
            });
        }
    }
    Ok(out)
}

/// An ICReq PDU asking for no digests, for tests that speak raw PDUs.
pub fn ic_req_pdu() -> Vec<u8> {
    let ic = IcReq {
        pfv: 0,
        hpda: 0,
        hdgst: false,
        ddgst: false,
        maxr2t: 0,
    };
    encode(&Head::IcReq(ic), &[], false, false, 1)
}

/// A Connect command PDU for tests that speak raw PDUs: queue `qid` of `entries` entries,
/// joining controller `cntlid` (0xffff: a new one), its Connect data in the capsule, no digests.
pub fn connect_pdu(o: &HostOptions, subnqn: &str, qid: u16, entries: u16, cntlid: u16) -> Vec<u8> {
    let mut sqe = Sqe::fabrics(fctype::CONNECT, 0);
    sqe.set_connect(qid, entries - 1, 0);
    let d = connect_data(o, subnqn, cntlid);
    sqe.set_sgl(Sgl::InCapsule {
        offset: 0,
        len: d.len() as u32,
    });
    encode(&Head::Cmd(sqe), &d, false, false, 1)
}

/// Connect data for tests that build their own Connect commands.
pub fn connect_data(o: &HostOptions, subnqn: &str, cntlid: u16) -> Vec<u8> {
    let d = ConnectData {
        hostid: o.hostid,
        cntlid,
        subnqn: subnqn.into(),
        hostnqn: o.hostnqn.clone(),
    };
    let v = d.encode();
    debug_assert_eq!(v.len(), CONNECT_DATA_LEN);
    v
}
