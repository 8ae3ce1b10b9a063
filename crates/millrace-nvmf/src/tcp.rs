//! The NVMe/TCP transport: one TCP connection = one NVMe queue (admin or I/O). A reader task
//! parses PDUs and places data; the queue's [`Session`] handles each command; I/O commands run
//! in their own tasks (device calls on the blocking pool); a writer task owns the socket's
//! sending half and batches PDUs. Nothing here is shared with other connections except what
//! the session reaches (the controller and the namespaces, lock-free on the I/O path).

use crate::cmd::{self, Cqe, Sqe, Status, Transfer};
use crate::io_commands::IoDone;
use crate::model::{Inner, BUF_UNIT};
use crate::pdu::{
    self, encode, encode_head, read_data, read_head, DataHdr, Frame, Head, IcResp, Negotiated,
    PduError, R2t, ReadError, Side,
};
use crate::session::{Action, Session};
use millrace_io::IoBuf;
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
        data: IoBuf,
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
    async fn data(&self, cid: u16, data: IoBuf, permit: Option<OwnedSemaphorePermit>) {
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
    buf: IoBuf,
    received: usize,
    digest_error: bool,
    permit: Option<OwnedSemaphorePermit>,
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
    neg: Negotiated,
    maxh2cdata: usize,
    rd: BufReader<OwnedReadHalf>,
    reply: Replier,
    session: Session,
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
    let reply = Replier {
        tx,
        inflight: Arc::new(AtomicUsize::new(0)),
        qid: 0,
        t: t.clone(),
    };
    let session =
        Session::new(t.clone(), peer, local, discovery_only).with_completer(completer(&reply));
    let mut c = Conn {
        t: t.clone(),
        peer,
        neg,
        maxh2cdata,
        rd,
        reply,
        session,
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
    drop(c);
    let _ = writer.await;
}

/// Completes an admin queue's parked commands from any task: the in-flight count drops before
/// the host can see the completion, and comes back if the writer cannot take it now.
fn completer(r: &Replier) -> crate::model::Completer {
    let (tx, inflight, qid) = (r.tx.clone(), r.inflight.clone(), r.qid);
    Arc::new(move |mut c: Cqe| {
        inflight.fetch_sub(1, Ordering::Relaxed);
        c.sqid = qid;
        if tx.try_send(Out::Resp(c)).is_ok() {
            return true;
        }
        inflight.fetch_add(1, Ordering::Relaxed);
        false
    })
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
    async fn run(&mut self) -> Stop {
        loop {
            if self.closing {
                return Stop::Quiet;
            }
            let dead = self.session.closing();
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

    fn in_capsule_limit(&self) -> usize {
        match self.session.qid() {
            0 => ADMIN_IN_CAPSULE.max(self.t.cfg.in_capsule_bytes as usize),
            _ => self.t.cfg.in_capsule_bytes as usize,
        }
    }

    async fn capsule(&mut self, sqe: Sqe, f: &Frame, raw: Vec<u8>) -> Result<(), Stop> {
        self.session.received();
        let limit = self.in_capsule_limit();
        if f.data_len > limit {
            return Err(Stop::Fatal(PduError::TooLarge(f.data_len as u64), raw));
        }
        let mut icd = IoBuf::standalone(f.data_len);
        let digest_ok = read_data(&mut self.rd, f, &mut icd).await?;
        let inflight = self.reply.inflight.fetch_add(1, Ordering::Relaxed) + 1;
        if inflight > self.session.depth() {
            // The host ignored the queue size it asked for: nothing sane can follow.
            return Err(Stop::Fatal(
                PduError::Sequence(pdu::pdu_type::CAPSULE_CMD),
                raw,
            ));
        }
        if self.session.is_connected() {
            let d = self.session.depth() as u16;
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
        let x = cmd::transfer(&sqe, icd.len(), self.session.max_transfer());
        let (data, c2h_len) = match x {
            Err(st) => {
                self.reply.done(cid, st, 0).await;
                return Ok(());
            }
            Ok(Transfer::None) => (None, 0),
            Ok(Transfer::InCapsule(r)) => {
                let data = if r.start == 0 && r.end == icd.len() {
                    icd
                } else {
                    IoBuf::from_slice(&icd[r])
                };
                (Some(data), 0)
            }
            Ok(Transfer::FromHost(0)) => (Some(IoBuf::standalone(0)), 0),
            Ok(Transfer::FromHost(len)) => {
                if let Err(st) = self.session.admit_transfer(&sqe, &Transfer::FromHost(len)) {
                    self.reply.done(cid, st, 0).await;
                    return Ok(());
                }
                return self.start_r2t(sqe, len).await;
            }
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
                    buf: IoBuf::standalone(len),
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
        data: Option<IoBuf>,
        c2h_len: usize,
        permit: Option<OwnedSemaphorePermit>,
    ) {
        let cid = sqe.cid();
        let action = self.session.command(&sqe, data, c2h_len);
        // The queue id is known once Connect succeeded: responses, Connect's first, carry it.
        self.reply.qid = self.session.qid();
        match action {
            Action::Complete { status, result } => self.reply.done(cid, status, result).await,
            Action::Data { mut data, result } if c2h_len > 0 => {
                data.resize(c2h_len, 0);
                let mut c = Cqe::new(cid, Status::SUCCESS, result);
                c.sqid = self.reply.qid;
                self.reply.inflight.fetch_sub(1, Ordering::Relaxed);
                let out = Out::Data {
                    cqe: c,
                    data: IoBuf::from_slice(&data),
                    _permit: None,
                };
                let _ = self.reply.tx.send(out).await;
            }
            Action::Data { result, .. } => self.reply.done(cid, Status::SUCCESS, result).await,
            Action::Parked => {}
            Action::Disconnect => {
                self.reply.done(cid, Status::SUCCESS, 0).await;
                let _ = self.reply.tx.send(Out::Close).await;
                self.closing = true;
            }
            Action::Io(job) => {
                let reply = self.reply.clone();
                tokio::spawn(async move {
                    let r = job.run().await;
                    // A write's buffer budget is held until its data is on the device.
                    drop(permit);
                    match r {
                        IoDone::Status(st) => reply.done(cid, st, 0).await,
                        IoDone::Read { data, permit } => reply.data(cid, data, permit).await,
                    }
                });
            }
        }
    }
}
