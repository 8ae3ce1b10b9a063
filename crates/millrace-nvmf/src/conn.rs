//! One TCP connection = one NVMe queue (admin or I/O). A reader task parses PDUs and places
//! data; commands that touch a device run in their own tasks (device calls on the blocking
//! pool); a writer task owns the socket's sending half and batches PDUs. Nothing here is shared
//! with other connections except the controller and the namespaces (lock-free on the I/O path).

use crate::admin;
use crate::cmd::{self, fctype, io, Cqe, Sqe, Status, Transfer, CONNECT_DATA_LEN};
use crate::pdu::{
    self, encode, encode_head, read_data, read_head, DataHdr, Frame, Head, IcResp, Negotiated,
    PduError, R2t, ReadError, Side,
};
use crate::target::{Controller, Inner, Ns, Subsystem, BUF_UNIT};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// A host must send its ICReq this soon after connecting.
const IC_TIMEOUT: Duration = Duration::from_secs(10);
/// Admin queues take 8 KiB of in-capsule data: hosts send Connect data and small admin
/// payloads that way without asking.
const ADMIN_IN_CAPSULE: usize = 8192;
/// Largest C2HData PDU the writer sends (longer reads go out in several).
const MAX_C2H_PDU: usize = 256 * 1024;

/// What the writer task sends.
pub(crate) enum Out {
    Resp(Cqe),
    /// C2HData PDUs carrying `data`, then the response capsule.
    Data {
        cqe: Cqe,
        data: Vec<u8>,
        _permit: Option<OwnedSemaphorePermit>,
    },
    R2t(R2t),
    /// A fatal error: send a C2HTermReq and close.
    Term {
        fes: u16,
        fei: u32,
        hdr: Vec<u8>,
    },
    /// Close once everything queued before is sent (after Disconnect).
    Close,
}

/// Sends completions and keeps the in-flight count, which must drop before the host can see
/// the completion (it may reuse the slot at once).
#[derive(Clone)]
struct Replier {
    tx: mpsc::Sender<Out>,
    inflight: Arc<AtomicUsize>,
    qid: u16,
    t: Arc<Inner>,
}

impl Replier {
    async fn done(&self, cid: u16, status: Status, result: u64) {
        self.inflight.fetch_sub(1, Ordering::Relaxed);
        if !status.is_success() {
            self.t.counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        let mut c = Cqe::new(cid, status, result);
        c.sqid = self.qid;
        let _ = self.tx.send(Out::Resp(c)).await;
    }
    async fn data(&self, cid: u16, data: Vec<u8>, permit: Option<OwnedSemaphorePermit>) {
        self.inflight.fetch_sub(1, Ordering::Relaxed);
        let mut c = Cqe::new(cid, Status::SUCCESS, 0);
        c.sqid = self.qid;
        let _ = self
            .tx
            .send(Out::Data {
                cqe: c,
                data,
                _permit: permit,
            })
            .await;
    }
}

/// A command waiting for its data in H2CData PDUs (after our R2T).
struct Pending {
    sqe: Sqe,
    buf: Vec<u8>,
    received: usize,
    digest_error: bool,
    permit: Option<OwnedSemaphorePermit>,
}

struct Queue {
    ctrl: Arc<Controller>,
    qid: u16,
    depth: usize,
}

/// Why the reader stops.
enum Stop {
    /// The peer closed, failed, or the controller went away: just close.
    Quiet,
    /// A protocol error: tell the host with a C2HTermReq, then close.
    Fatal(PduError, Vec<u8>),
}

impl From<std::io::Error> for Stop {
    fn from(_: std::io::Error) -> Stop {
        Stop::Quiet
    }
}

struct Conn {
    t: Arc<Inner>,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    discovery_only: bool,
    neg: Negotiated,
    maxh2cdata: usize,
    rd: BufReader<OwnedReadHalf>,
    reply: Replier,
    q: Option<Queue>,
    pending: Arc<Mutex<HashMap<u16, Pending>>>,
    sqhd: Arc<AtomicU16>,
    closing: bool,
}

pub(crate) async fn serve_connection(
    t: Arc<Inner>,
    sock: TcpStream,
    peer: SocketAddr,
    discovery_only: bool,
) {
    let _ = sock.set_nodelay(true);
    let local = sock.local_addr().ok();
    let (rd, mut wr) = sock.into_split();
    let mut rd = BufReader::with_capacity(64 * 1024, rd);
    let ic = tokio::time::timeout(
        IC_TIMEOUT,
        read_head(&mut rd, Side::Controller, &Negotiated::initial()),
    )
    .await;
    let ic = match ic {
        Ok(Ok((Head::IcReq(r), _, _))) => r,
        Ok(Err(ReadError::Pdu(e))) => {
            t.counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
            tracing::info!(%peer, "closing a connection whose first PDU was refused: {e}");
            let (fes, fei) = e.fes_fei();
            let _ = wr.write_all(&term(fes, fei, &[])).await;
            return;
        }
        _ => return,
    };
    if ic.hpda > 31 {
        let _ = wr
            .write_all(&term(pdu::fes::INVALID_HEADER_FIELD, 10, &[]))
            .await;
        return;
    }
    let hdgst = ic.hdgst && t.cfg.allow_digests;
    let ddgst = ic.ddgst && t.cfg.allow_digests;
    let maxh2cdata = t.cfg.maxh2cdata.max(4096) as usize;
    let resp = IcResp {
        pfv: 0,
        cpda: 0,
        hdgst,
        ddgst,
        maxh2cdata: maxh2cdata as u32,
    };
    if wr
        .write_all(&encode(&Head::IcResp(resp), &[], false, false, 1))
        .await
        .is_err()
    {
        return;
    }
    let in_capsule = (t.cfg.in_capsule_bytes as usize).max(ADMIN_IN_CAPSULE);
    let neg = Negotiated {
        ic_done: true,
        hdgst,
        ddgst,
        max_data: in_capsule.max(maxh2cdata) as u32,
    };
    let depth = t.cfg.max_queue_depth.max(t.cfg.admin_queue_depth) as usize;
    let (tx, rx) = mpsc::channel(depth * 2 + 16);
    let sqhd = Arc::new(AtomicU16::new(0));
    let align = (ic.hpda as usize + 1) * 4;
    let writer = tokio::spawn(writer(wr, rx, hdgst, ddgst, align, sqhd.clone()));
    let mut c = Conn {
        t: t.clone(),
        peer,
        local,
        discovery_only,
        neg,
        maxh2cdata,
        rd,
        reply: Replier {
            tx,
            inflight: Arc::new(AtomicUsize::new(0)),
            qid: 0,
            t: t.clone(),
        },
        q: None,
        pending: Arc::new(Mutex::new(HashMap::new())),
        sqhd,
        closing: false,
    };
    let stop = c.run().await;
    if let Stop::Fatal(e, hdr) = stop {
        t.counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
        tracing::info!(%peer, "closing the connection after a protocol error: {e}");
        let (fes, fei) = e.fes_fei();
        let _ = c.reply.tx.send(Out::Term { fes, fei, hdr }).await;
    }
    c.finish();
    drop(c);
    let _ = writer.await;
}

fn term(fes: u16, fei: u32, hdr: &[u8]) -> Vec<u8> {
    let hdr = &hdr[..hdr.len().min(pdu::TERM_MAX_DATA)];
    encode(
        &Head::TermReq {
            h2c: false,
            fes,
            fei,
        },
        hdr,
        false,
        false,
        1,
    )
}

async fn writer(
    wr: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Out>,
    hdgst: bool,
    ddgst: bool,
    align: usize,
    sqhd: Arc<AtomicU16>,
) {
    let mut w = BufWriter::with_capacity(64 * 1024, wr);
    loop {
        // Batch: write whatever is queued, flush only when the queue runs dry.
        let msg = match rx.try_recv() {
            Ok(m) => m,
            Err(mpsc::error::TryRecvError::Empty) => {
                if w.flush().await.is_err() {
                    return;
                }
                match rx.recv().await {
                    Some(m) => m,
                    None => break,
                }
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        };
        let r: std::io::Result<()> = async {
            match msg {
                Out::Resp(mut c) => {
                    c.sqhd = sqhd.load(Ordering::Relaxed);
                    w.write_all(&encode(&Head::Resp(c), &[], hdgst, ddgst, align))
                        .await?;
                }
                Out::Data { mut cqe, data, .. } => {
                    let mut off = 0;
                    while off < data.len() {
                        let n = (data.len() - off).min(MAX_C2H_PDU);
                        let chunk = &data[off..off + n];
                        let h = DataHdr {
                            cccid: cqe.cid,
                            ttag: 0,
                            datao: off as u32,
                            datal: n as u32,
                            last: off + n == data.len(),
                            success: false,
                        };
                        w.write_all(&encode_head(&Head::C2HData(h), chunk, hdgst, ddgst, align))
                            .await?;
                        w.write_all(chunk).await?;
                        if ddgst {
                            w.write_all(&pdu::digest(chunk).to_le_bytes()).await?;
                        }
                        off += n;
                    }
                    cqe.sqhd = sqhd.load(Ordering::Relaxed);
                    w.write_all(&encode(&Head::Resp(cqe), &[], hdgst, ddgst, align))
                        .await?;
                }
                Out::R2t(r) => {
                    w.write_all(&encode(&Head::R2t(r), &[], hdgst, ddgst, align))
                        .await?;
                }
                Out::Term { fes, fei, hdr } => {
                    w.write_all(&term(fes, fei, &hdr)).await?;
                    w.flush().await?;
                    return Err(std::io::ErrorKind::ConnectionAborted.into());
                }
                Out::Close => {
                    w.flush().await?;
                    return Err(std::io::ErrorKind::ConnectionAborted.into());
                }
            }
            Ok(())
        }
        .await;
        if r.is_err() {
            break;
        }
    }
    let _ = w.flush().await;
    let _ = w.into_inner().shutdown().await;
}

impl Conn {
    fn ctrl_dead(&self) -> tokio_util::sync::CancellationToken {
        match &self.q {
            Some(q) => q.ctrl.dead.clone(),
            None => self.t.shutdown.clone(),
        }
    }

    async fn run(&mut self) -> Stop {
        loop {
            if self.closing {
                return Stop::Quiet;
            }
            let dead = self.ctrl_dead();
            let r = tokio::select! {
                _ = dead.cancelled() => return Stop::Quiet,
                r = read_head(&mut self.rd, Side::Controller, &self.neg) => r,
            };
            let (head, f, raw) = match r {
                Ok(x) => x,
                Err(ReadError::Io(_)) => return Stop::Quiet,
                Err(ReadError::Pdu(e)) => return Stop::Fatal(e, Vec::new()),
            };
            let step = match head {
                Head::Cmd(sqe) => self.capsule(sqe, &f, raw).await,
                Head::H2CData(d) => self.h2c_data(d, &f, raw).await,
                Head::TermReq { fes, fei, .. } => {
                    tracing::info!(peer = %self.peer, fes, fei, "the host ended the connection with a termination request");
                    return Stop::Quiet;
                }
                _ => Err(Stop::Fatal(PduError::Sequence(f.ch.pdu_type), raw)),
            };
            if let Err(s) = step {
                return s;
            }
        }
    }

    /// On close: an admin queue takes its controller with it; an I/O queue frees its id.
    fn finish(&mut self) {
        if let Some(q) = &self.q {
            if q.qid == 0 {
                self.t.drop_controller(&q.ctrl);
            } else {
                q.ctrl.io_qids.lock().retain(|&x| x != q.qid);
            }
        }
    }

    fn in_capsule_limit(&self) -> usize {
        match &self.q {
            Some(q) if q.qid != 0 => self.t.cfg.in_capsule_bytes as usize,
            _ => ADMIN_IN_CAPSULE.max(self.t.cfg.in_capsule_bytes as usize),
        }
    }

    fn depth(&self) -> usize {
        match &self.q {
            Some(q) => q.depth,
            None => 1,
        }
    }

    /// Largest data transfer for one command on this queue.
    fn max_transfer(&self) -> usize {
        self.t.cfg.max_transfer_bytes as usize
    }

    async fn capsule(&mut self, sqe: Sqe, f: &Frame, raw: Vec<u8>) -> Result<(), Stop> {
        self.t.counters.commands.fetch_add(1, Ordering::Relaxed);
        let limit = self.in_capsule_limit();
        if f.data_len > limit {
            return Err(Stop::Fatal(PduError::TooLarge(f.data_len as u64), raw));
        }
        let mut icd = vec![0u8; f.data_len];
        let digest_ok = read_data(&mut self.rd, f, &mut icd).await?;
        let inflight = self.reply.inflight.fetch_add(1, Ordering::Relaxed) + 1;
        if inflight > self.depth() {
            // The host ignored the queue size it asked for: nothing sane can follow.
            return Err(Stop::Fatal(
                PduError::Sequence(pdu::pdu_type::CAPSULE_CMD),
                raw,
            ));
        }
        if let Some(q) = &self.q {
            q.ctrl.touch(&self.t);
            let d = q.depth as u16;
            let _ = self
                .sqhd
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| Some((h + 1) % d));
        }
        let cid = sqe.cid();
        if !digest_ok {
            self.reply
                .done(cid, Status::TRANSIENT_TRANSPORT_ERROR, 0)
                .await;
            return Ok(());
        }
        let (data, c2h_len) = match cmd::transfer(&sqe, icd.len(), self.max_transfer()) {
            Err(st) => {
                self.reply.done(cid, st, 0).await;
                return Ok(());
            }
            Ok(Transfer::None) => (None, 0),
            Ok(Transfer::InCapsule(r)) => {
                let data = if r.start == 0 && r.end == icd.len() {
                    icd
                } else {
                    icd[r].to_vec()
                };
                (Some(data), 0)
            }
            Ok(Transfer::FromHost(0)) => (Some(Vec::new()), 0),
            Ok(Transfer::FromHost(len)) => return self.start_r2t(sqe, len).await,
            Ok(Transfer::ToHost(len)) => (None, len),
        };
        self.execute(sqe, data, c2h_len, None).await;
        Ok(())
    }

    /// Takes buffer space for a host-to-controller transfer and asks for the data.
    async fn start_r2t(&mut self, sqe: Sqe, len: usize) -> Result<(), Stop> {
        let cid = sqe.cid();
        if self.pending.lock().contains_key(&cid) {
            self.reply.done(cid, Status::CID_CONFLICT, 0).await;
            return Ok(());
        }
        let units = (len as u64).div_ceil(BUF_UNIT) as u32;
        let sem = self.t.buffers.clone();
        let pending = self.pending.clone();
        let reply = self.reply.clone();
        let register = move |permit| {
            pending.lock().insert(
                cid,
                Pending {
                    sqe,
                    buf: vec![0u8; len],
                    received: 0,
                    digest_error: false,
                    permit,
                },
            );
            Out::R2t(R2t {
                cccid: cid,
                ttag: cid,
                r2to: 0,
                r2tl: len as u32,
            })
        };
        match sem.clone().try_acquire_many_owned(units) {
            Ok(p) => {
                let out = register(Some(p));
                let _ = self.reply.tx.send(out).await;
            }
            Err(_) => {
                // Out of buffer space: wait for it elsewhere so this reader keeps serving the
                // data that will free it. The host sends nothing for this command until the R2T.
                tokio::spawn(async move {
                    if let Ok(p) = sem.acquire_many_owned(units).await {
                        let out = register(Some(p));
                        let _ = reply.tx.send(out).await;
                    }
                });
            }
        }
        Ok(())
    }

    async fn h2c_data(&mut self, d: DataHdr, f: &Frame, raw: Vec<u8>) -> Result<(), Stop> {
        if f.data_len > self.maxh2cdata {
            return Err(Stop::Fatal(PduError::TooLarge(f.data_len as u64), raw));
        }
        let Some(mut p) = self.pending.lock().remove(&d.ttag) else {
            return Err(Stop::Fatal(PduError::InvalidField(10), raw));
        };
        if p.sqe.cid() != d.cccid {
            return Err(Stop::Fatal(PduError::InvalidField(8), raw));
        }
        // Data must arrive in order and inside the R2T's range.
        let off = d.datao as usize;
        if off != p.received || off + f.data_len > p.buf.len() {
            return Err(Stop::Fatal(PduError::OutOfRange, raw));
        }
        let ok = read_data(&mut self.rd, f, &mut p.buf[off..off + f.data_len]).await?;
        p.digest_error |= !ok;
        p.received += f.data_len;
        let complete = p.received == p.buf.len();
        if d.last != complete {
            return Err(Stop::Fatal(PduError::OutOfRange, raw));
        }
        if !complete {
            self.pending.lock().insert(d.ttag, p);
            return Ok(());
        }
        if p.digest_error {
            self.reply
                .done(p.sqe.cid(), Status::TRANSIENT_TRANSPORT_ERROR, 0)
                .await;
            return Ok(());
        }
        self.execute(p.sqe, Some(p.buf), 0, p.permit).await;
        Ok(())
    }

    async fn execute(
        &mut self,
        sqe: Sqe,
        data: Option<Vec<u8>>,
        c2h_len: usize,
        permit: Option<OwnedSemaphorePermit>,
    ) {
        let cid = sqe.cid();
        if sqe.is_fabrics() {
            return self.fabrics(sqe, data).await;
        }
        let Some(q) = &self.q else {
            self.reply
                .done(cid, Status::COMMAND_SEQUENCE_ERROR, 0)
                .await;
            return;
        };
        if q.qid == 0 {
            let ctrl = q.ctrl.clone();
            return self.admin(ctrl, sqe, data, c2h_len).await;
        }
        let ctrl = q.ctrl.clone();
        if !ctrl.enabled.load(Ordering::Relaxed) {
            self.reply
                .done(cid, Status::COMMAND_SEQUENCE_ERROR, 0)
                .await;
            return;
        }
        let Some(ns) = ctrl.subsys.ns(sqe.nsid()).or_else(|| {
            // Flush to every namespace (NSID FFFFFFFFh) is answered by the first one; the others
            // are flushed too, below.
            (sqe.opcode() == io::FLUSH && sqe.nsid() == u32::MAX)
                .then(|| ctrl.subsys.namespaces.load().first().cloned())
                .flatten()
        }) else {
            self.reply.done(cid, Status::INVALID_NAMESPACE, 0).await;
            return;
        };
        let job = IoJob {
            t: self.t.clone(),
            subsys: ctrl.subsys.clone(),
            ns,
            sqe,
            reply: self.reply.clone(),
            max_transfer: self.max_transfer(),
        };
        tokio::spawn(job.run(data, c2h_len, permit));
    }

    async fn fabrics(&mut self, sqe: Sqe, data: Option<Vec<u8>>) {
        let cid = sqe.cid();
        match sqe.fctype() {
            fctype::CONNECT => {
                let (st, res) = self.connect(&sqe, data.as_deref().unwrap_or(&[]));
                self.reply.done(cid, st, res).await;
            }
            fctype::PROPERTY_GET | fctype::PROPERTY_SET => {
                let Some(q) = &self.q else {
                    self.reply
                        .done(cid, Status::COMMAND_SEQUENCE_ERROR, 0)
                        .await;
                    return;
                };
                if q.qid != 0 {
                    self.reply.done(cid, Status::INVALID_FIELD, 0).await;
                    return;
                }
                let (st, res) = admin::property(&self.t, &q.ctrl, &sqe);
                self.reply.done(cid, st, res).await;
            }
            fctype::DISCONNECT => {
                if self.q.is_none() {
                    self.reply
                        .done(cid, Status::COMMAND_SEQUENCE_ERROR, 0)
                        .await;
                    return;
                }
                self.reply.done(cid, Status::SUCCESS, 0).await;
                let _ = self.reply.tx.send(Out::Close).await;
                self.closing = true;
            }
            _ => self.reply.done(cid, Status::INVALID_OPCODE, 0).await,
        }
    }

    /// Fabrics Connect: the only command a fresh queue accepts. Refusals carry the offset of
    /// the parameter at fault (IPO) and whether it lies in the data (IATTR), as the spec asks.
    fn connect(&mut self, sqe: &Sqe, data: &[u8]) -> (Status, u64) {
        // IPO in bits 15:0, IATTR in bits 23:16 (1: the offset is into the Connect data).
        let bad_sqe = |ipo: u64| (Status::CONNECT_INVALID_PARAMETERS, ipo);
        let bad_data = |ipo: u16| (Status::CONNECT_INVALID_PARAMETERS, ipo as u64 | 1 << 16);
        if self.q.is_some() {
            return (Status::COMMAND_SEQUENCE_ERROR, 0);
        }
        if sqe.connect_recfmt() != 0 {
            return (Status::CONNECT_INCOMPATIBLE_FORMAT, 0);
        }
        if data.len() < CONNECT_DATA_LEN {
            return (Status::DATA_SGL_LENGTH_INVALID, 0);
        }
        let d = match cmd::ConnectData::decode(data) {
            Ok(d) => d,
            Err(at) => return bad_data(at),
        };
        let unknown = || {
            tracing::info!(peer = %self.peer, host = %d.hostnqn, subsystem = %d.subnqn, "refused a connect to an unknown subsystem");
            self.t
                .counters
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            bad_data(cmd::CONNECT_DATA_SUBNQN)
        };
        let Some(s) = self.t.lookup(&d.subnqn) else {
            return unknown();
        };
        if self.discovery_only && !s.discovery {
            return unknown();
        }
        if !s.host_allowed(&d.hostnqn) {
            tracing::warn!(peer = %self.peer, host = %d.hostnqn, subsystem = %d.subnqn, "refused a connect from a host that is not allowed");
            self.t
                .counters
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            return (
                Status::CONNECT_INVALID_HOST,
                cmd::CONNECT_DATA_HOSTNQN as u64 | 1 << 16,
            );
        }
        let qid = sqe.connect_qid();
        let sqsize = sqe.connect_sqsize() as usize;
        if qid == 0 {
            if sqsize == 0 || sqsize >= self.t.cfg.admin_queue_depth.max(2) as usize {
                return bad_sqe(44);
            }
            if d.cntlid != 0xffff && d.cntlid != 0xfffe {
                return bad_data(cmd::CONNECT_DATA_CNTLID);
            }
            let Some(ctrl) =
                self.t
                    .new_controller(&s, &d.hostnqn, d.hostid, self.peer, sqe.connect_kato())
            else {
                return (Status::CONNECT_CONTROLLER_BUSY, 0);
            };
            {
                let mut a = ctrl.aen.lock();
                a.tx = Some(self.reply.tx.clone());
                a.inflight = Some(self.reply.inflight.clone());
            }
            tracing::info!(peer = %self.peer, host = %d.hostnqn, subsystem = %d.subnqn, cntlid = ctrl.cntlid, "a host connected its admin queue");
            let id = ctrl.cntlid;
            self.q = Some(Queue {
                ctrl,
                qid: 0,
                depth: sqsize + 1,
            });
            self.reply.qid = 0;
            return (Status::SUCCESS, id as u64);
        }
        if s.discovery {
            return bad_sqe(42);
        }
        let Some(ctrl) = s.controllers.lock().by_id.get(&d.cntlid).cloned() else {
            return bad_data(cmd::CONNECT_DATA_CNTLID);
        };
        if ctrl.hostnqn != d.hostnqn || ctrl.hostid != d.hostid {
            return (
                Status::CONNECT_INVALID_HOST,
                cmd::CONNECT_DATA_HOSTNQN as u64 | 1 << 16,
            );
        }
        if qid > ctrl.io_queues.load(Ordering::Relaxed) {
            return bad_sqe(42);
        }
        if sqsize == 0 || sqsize >= self.t.cfg.max_queue_depth as usize {
            return bad_sqe(44);
        }
        {
            let mut q = ctrl.io_qids.lock();
            if q.contains(&qid) {
                return bad_sqe(42);
            }
            q.push(qid);
        }
        ctrl.touch(&self.t);
        self.q = Some(Queue {
            ctrl,
            qid,
            depth: sqsize + 1,
        });
        self.reply.qid = qid;
        (Status::SUCCESS, d.cntlid as u64)
    }

    async fn admin(
        &mut self,
        ctrl: Arc<Controller>,
        sqe: Sqe,
        data: Option<Vec<u8>>,
        c2h_len: usize,
    ) {
        let cid = sqe.cid();
        if sqe.opcode() == cmd::admin::ASYNC_EVENT_REQUEST {
            let answer = {
                let mut a = ctrl.aen.lock();
                if let Some(ev) = a.pending.pop_front() {
                    Some((Status::SUCCESS, ev as u64))
                } else if a.waiting.len() > crate::target::AERL as usize {
                    Some((Status::AER_LIMIT_EXCEEDED, 0))
                } else {
                    // Completed later, by Controller::event, from whichever task sees it.
                    a.waiting.push_back(cid);
                    None
                }
            };
            if let Some((st, res)) = answer {
                self.reply.done(cid, st, res).await;
            }
            return;
        }
        let ctx = admin::Ctx {
            t: &self.t,
            ctrl: &ctrl,
            local: self.local,
        };
        let r = admin::execute(&ctx, &sqe, data.as_deref());
        tracing::debug!(
            cntlid = ctrl.cntlid,
            opcode = sqe.opcode(),
            cdw10 = sqe.cdw(10),
            nsid = sqe.nsid(),
            status = %r.status,
            "admin command"
        );
        match r.data {
            Some(mut d) if r.status.is_success() && c2h_len > 0 => {
                d.resize(c2h_len, 0);
                let mut c = Cqe::new(cid, Status::SUCCESS, r.result);
                c.sqid = 0;
                self.reply.inflight.fetch_sub(1, Ordering::Relaxed);
                let _ = self
                    .reply
                    .tx
                    .send(Out::Data {
                        cqe: c,
                        data: d,
                        _permit: None,
                    })
                    .await;
            }
            _ => self.reply.done(cid, r.status, r.result).await,
        }
    }
}

/// One I/O command running in its own task.
struct IoJob {
    t: Arc<Inner>,
    subsys: Arc<Subsystem>,
    ns: Arc<Ns>,
    sqe: Sqe,
    reply: Replier,
    max_transfer: usize,
}

fn status_of(e: &std::io::Error, read: bool) -> Status {
    if e.kind() == std::io::ErrorKind::InvalidInput {
        Status::LBA_OUT_OF_RANGE
    } else if read {
        Status::UNRECOVERED_READ_ERROR
    } else {
        Status::WRITE_FAULT
    }
}

impl IoJob {
    /// Byte range of an LBA range, or the status that refuses it.
    fn range(&self, slba: u64, blocks: u64) -> Result<(u64, u64), Status> {
        cmd::lba_range(slba, blocks, self.ns.blocks, self.ns.lba_shift)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn millrace_block::BlockDevice) -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        let dev = self.ns.dev.clone();
        match tokio::task::spawn_blocking(move || f(dev.as_ref())).await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(format!(
                "the device call did not finish: {e}"
            ))),
        }
    }

    async fn run(
        self,
        data: Option<Vec<u8>>,
        c2h_len: usize,
        permit: Option<OwnedSemaphorePermit>,
    ) {
        let cid = self.sqe.cid();
        let st = self.go(data, c2h_len, permit).await;
        if let Err(st) = st {
            self.reply.done(cid, st, 0).await;
        }
    }

    /// Ok: the reply was sent. Err: reply with this status.
    async fn go(
        &self,
        data: Option<Vec<u8>>,
        c2h_len: usize,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Result<(), Status> {
        let s = &self.sqe;
        let cid = s.cid();
        let io_ctr = &self.subsys.io;
        match s.opcode() {
            io::READ => {
                let (off, len) = self.range(s.slba(), s.nlb() as u64)?;
                if len as usize > self.max_transfer {
                    return Err(Status::INVALID_FIELD);
                }
                if len as usize != c2h_len {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                let units = len.div_ceil(BUF_UNIT) as u32;
                let permit = self
                    .t
                    .buffers
                    .clone()
                    .acquire_many_owned(units)
                    .await
                    .map_err(|_| Status::INTERNAL_ERROR)?;
                let buf = self
                    .blocking(move |d| {
                        let mut b = vec![0u8; len as usize];
                        d.read_at(off, &mut b).map(|_| b)
                    })
                    .await
                    .map_err(|e| {
                        tracing::warn!("a read of {len} bytes at {off} failed: {e}");
                        status_of(&e, true)
                    })?;
                io_ctr.read_commands.fetch_add(1, Ordering::Relaxed);
                io_ctr.bytes_read.fetch_add(len, Ordering::Relaxed);
                self.reply.data(cid, buf, Some(permit)).await;
                Ok(())
            }
            io::WRITE => {
                let (off, len) = self.range(s.slba(), s.nlb() as u64)?;
                let data = data.unwrap_or_default();
                if data.len() as u64 != len {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                let fua = s.cdw(12) & (1 << 30) != 0;
                self.blocking(move |d| {
                    d.write_at(off, &data)?;
                    if fua {
                        d.flush()?;
                    }
                    Ok(())
                })
                .await
                .map_err(|e| {
                    tracing::warn!("a write of {len} bytes at {off} failed: {e}");
                    status_of(&e, false)
                })?;
                drop(permit);
                io_ctr.write_commands.fetch_add(1, Ordering::Relaxed);
                io_ctr.bytes_written.fetch_add(len, Ordering::Relaxed);
                self.reply.done(cid, Status::SUCCESS, 0).await;
                Ok(())
            }
            io::FLUSH => {
                let all: Vec<_> = if s.nsid() == u32::MAX {
                    self.subsys
                        .namespaces
                        .load()
                        .iter()
                        .map(|n| n.dev.clone())
                        .collect()
                } else {
                    vec![self.ns.dev.clone()]
                };
                for dev in all {
                    let r = tokio::task::spawn_blocking(move || dev.flush()).await;
                    if !matches!(r, Ok(Ok(()))) {
                        return Err(Status::WRITE_FAULT);
                    }
                }
                self.reply.done(cid, Status::SUCCESS, 0).await;
                Ok(())
            }
            io::WRITE_ZEROES => {
                let (off, len) = self.range(s.slba(), s.nlb() as u64)?;
                // DEAC: the host allows deallocation, which reads back as zeroes too.
                let deac = s.cdw(12) & (1 << 25) != 0;
                self.blocking(move |d| {
                    if deac {
                        d.discard(off, len)
                    } else {
                        d.write_zeroes(off, len)
                    }
                })
                .await
                .map_err(|e| status_of(&e, false))?;
                self.reply.done(cid, Status::SUCCESS, 0).await;
                Ok(())
            }
            io::DATASET_MANAGEMENT => {
                let nr = (s.cdw(10) & 0xff) as usize + 1;
                let data = data.unwrap_or_default();
                if data.len() < nr * cmd::DsmRange::LEN {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                let deallocate = s.cdw(11) & (1 << 2) != 0;
                if !deallocate {
                    // Only hints (integral read/write): nothing to do.
                    self.reply.done(cid, Status::SUCCESS, 0).await;
                    return Ok(());
                }
                let mut ranges = Vec::with_capacity(nr);
                for i in 0..nr {
                    let r = cmd::DsmRange::decode(&data[i * 16..i * 16 + 16]);
                    if r.blocks == 0 {
                        continue;
                    }
                    ranges.push(self.range(r.slba, r.blocks as u64)?);
                }
                self.blocking(move |d| {
                    for (off, len) in ranges {
                        d.discard(off, len)?;
                    }
                    Ok(())
                })
                .await
                .map_err(|e| status_of(&e, false))?;
                self.reply.done(cid, Status::SUCCESS, 0).await;
                Ok(())
            }
            _ => Err(Status::INVALID_OPCODE),
        }
    }
}
