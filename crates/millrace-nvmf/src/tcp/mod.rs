//! The NVMe/TCP transport: one TCP connection = one NVMe queue (admin or I/O), served on one
//! core (docs/DATAPATH.md). A reader task parses PDUs and receives each command's data straight
//! into a buffer of the pool; the queue's [`Session`] handles each command; I/O commands run in
//! their own tasks on the same core, awaiting the device's completion; a writer task owns the
//! socket's sending half and sends batches of PDUs with vectored writes, read data straight
//! from the buffer the device filled (`reply`). Nothing here is shared with other connections
//! except what the session reaches (the controller and the namespaces, lock-free on the I/O
//! path).

use crate::cmd::{self, Sqe, Status, Transfer};
use crate::gather::Fmt;
use crate::model::Inner;
use crate::pdu::{
    self, encode, read_data_direct, read_head, read_head_into, Frame, Head, IcResp, Inbound,
    Negotiated, PduError, ReadError, Side,
};
use crate::plug::Plug;
use crate::session::{Action, Session};
use crate::tls::TlsMode;
use millrace_io::share::Held;
use millrace_io::IoBuf;
use parking_lot::Mutex;
use reply::{completer, term, Out, Outbox, Replier};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use transfer::Pending;

mod reply;
mod transfer;

/// Admin queues take 8 KiB of in-capsule data: hosts send Connect data and small admin
/// payloads that way without asking.
const ADMIN_IN_CAPSULE: usize = 8192;

/// Command capsule bytes (with their in-capsule data) the reader takes in before it lets the
/// core's other tasks run, the writer among them. A reader that runs while the host keeps
/// sending holds every reply back until the host has no slot left; the host then waits for a
/// burst of replies and the target for a burst of commands, and the core idles in between
/// (4K writes at QD64: 10% of it, docs/PERFORMANCE.md). 64 KiB is 16 such writes, and about 900
/// read commands, which a host sends in far smaller bursts, so reads are not cut up.
const YIELD_AFTER: usize = 64 * 1024;

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
    rd: Inbound<OwnedReadHalf>,
    reply: Replier,
    session: Session,
    pending: Arc<Mutex<HashMap<u16, Pending>>>,
    /// Transfers waiting for a pool buffer before their R2T (each becomes `pending`).
    r2t_waiting: Arc<AtomicUsize>,
    sqhd: Arc<AtomicU16>,
    closing: bool,
    /// The PDU being read is all in the read buffer: reading it cannot wait, so it needs no
    /// timer (arming one per PDU cost a clock read and a timer-wheel entry per command).
    whole: bool,
    /// Before this the queue must be connected (ICReq and Connect), or it is closed.
    handshake_deadline: Instant,
    /// The header of the PDU being handled, in a buffer kept for the next.
    head_buf: Vec<u8>,
    /// Writes whose data is in, held for the write that continues them (`crate::plug`).
    plug: Plug,
}

pub(crate) async fn serve_connection(
    t: Arc<Inner>,
    sock: TcpStream,
    peer: SocketAddr,
    discovery_only: bool,
    tls: TlsMode,
) {
    let _ = sock.set_nodelay(true);
    let local = sock.local_addr().ok();
    let handshake_deadline = Instant::now() + t.cfg.handshake_timeout;
    // NVMe/TCP's secure channel opens before the ICReq, within the same deadline as the
    // ICReq and Connect: a host that stalls or hangs up mid-handshake only loses its own
    // connection.
    let tls_id = match tls {
        TlsMode::None => None,
        TlsMode::Required => match tls_handshake(&t, &sock, peer, handshake_deadline).await {
            Some(id) => Some(id),
            None => return,
        },
    };
    let (rd, mut wr) = sock.into_split();
    let mut rd = Inbound::with_capacity(64 * 1024, rd);
    let Some(ic) = ic_req(&t, &mut rd, &mut wr, peer, handshake_deadline).await else {
        return;
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
    let sqhd = Arc::new(AtomicU16::new(0));
    let align = (ic.hpda as usize + 1) * 4;
    let fmt = Fmt {
        hdgst,
        ddgst,
        align,
    };
    let reply = Outbox::open(t.clone());
    let writer = tokio::spawn(reply.writer(wr, fmt, sqhd.clone()));
    let session = Session::new(t.clone(), peer, local, discovery_only)
        .with_completer(completer(&reply))
        .with_tls(tls_id);
    let mut c = Conn {
        t: t.clone(),
        peer,
        neg,
        maxh2cdata,
        rd,
        reply,
        session,
        pending: Arc::new(Mutex::new(HashMap::new())),
        r2t_waiting: Arc::new(AtomicUsize::new(0)),
        sqhd,
        closing: false,
        whole: false,
        handshake_deadline,
        head_buf: Vec::new(),
        plug: Plug::new(t.cfg.write_hold),
    };
    let stop = c.run().await;
    let in_flight = c.reply.in_flight();
    if in_flight > 0 {
        t.counters
            .abandoned
            .fetch_add(in_flight as u64, Ordering::Relaxed);
    }
    if let Stop::Fatal(e, hdr) = stop {
        t.counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
        tracing::info!(%peer, "closing the connection after a protocol error: {e}");
        let (fes, fei) = e.fes_fei();
        c.reply.send(Out::Term { fes, fei, hdr });
    }
    drop(c);
    let _ = writer.await;
}

/// The TLS 1.3 PSK handshake of a listener that requires it, bounded by `deadline`: the
/// identity the host proved (its host and subsystem NQNs), or None after counting and logging
/// why the connection is refused.
async fn tls_handshake(
    t: &Arc<Inner>,
    sock: &TcpStream,
    peer: SocketAddr,
    deadline: Instant,
) -> Option<crate::tls::Identity> {
    let r = tls_accept(t, sock, deadline).await;
    if let Err(why) = &r {
        t.counters
            .connections_refused
            .fetch_add(1, Ordering::Relaxed);
        if let Some(n) = t.refusal_log.allow() {
            tracing::warn!(%peer, "refusing an NVMe/TCP connection on a listener that requires TLS: {why} ({n} more refusals not logged)");
        }
    }
    r.ok()
}

async fn tls_accept(
    t: &Arc<Inner>,
    sock: &TcpStream,
    deadline: Instant,
) -> Result<crate::tls::Identity, String> {
    let tt = t.clone();
    let lookup: crate::tls::Lookup = Arc::new(move |id: &crate::tls::Identity| {
        let s = tt.lookup(&id.subnqn)?;
        let psk = s.tls_psks.read().get(&id.hostnqn).cloned();
        psk
    });
    match tokio::time::timeout_at(deadline, crate::tls::accept(sock, lookup)).await {
        Ok(r) => r,
        Err(_) => {
            t.counters.timeouts.fetch_add(1, Ordering::Relaxed);
            Err("the host did not finish the TLS handshake in time".into())
        }
    }
}

/// The connection's first PDU, which must be an ICReq before the handshake deadline; a PDU
/// refused is answered with a C2HTermReq, and None closes the connection.
async fn ic_req(
    t: &Inner,
    rd: &mut Inbound<OwnedReadHalf>,
    wr: &mut OwnedWriteHalf,
    peer: SocketAddr,
    deadline: Instant,
) -> Option<pdu::IcReq> {
    let initial = Negotiated::initial();
    let first = read_head(rd, Side::Controller, &initial);
    match tokio::time::timeout_at(deadline, first).await {
        Ok(Ok((Head::IcReq(r), _, _))) => Some(r),
        Ok(Err(ReadError::Pdu(e))) => {
            t.counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
            tracing::info!(%peer, "closing a connection whose first PDU was refused: {e}");
            let (fes, fei) = e.fes_fei();
            let _ = wr.write_all(&term(fes, fei, &[])).await;
            None
        }
        _ => None,
    }
}

/// Whether `buffered` begins with a whole PDU (its common header's PDU length, header, data and
/// digests included, is all there).
fn whole_pdu(buffered: &[u8]) -> bool {
    buffered
        .first_chunk::<{ pdu::CH_LEN }>()
        .is_some_and(|ch| buffered.len() as u64 >= u64::from(pdu::Ch::decode(ch).plen))
}

impl Conn {
    async fn run(&mut self) -> Stop {
        // Command bytes taken in since the reader last let the core's other tasks run.
        let mut taken = 0usize;
        loop {
            if self.closing {
                return Stop::Quiet;
            }
            if taken >= YIELD_AFTER {
                taken = 0;
                tokio::task::yield_now().await;
            }
            if let Some(at) = self.plug.deadline() {
                if Instant::now() >= at {
                    self.release_held().await;
                }
            }
            let reads = self.rd.buffer().is_empty();
            if reads {
                let dead = self.session.closing();
                // Held writes go on once their wait is over, whether the host sends or not.
                let until = self.plug.deadline();
                let held_over = async move {
                    match until {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = dead.cancelled() => return Stop::Quiet,
                    _ = held_over => {
                        self.release_held().await;
                        continue;
                    }
                    r = self.next_pdu_begins() => if let Err(s) = r { return s },
                };
            } else if self.session.is_closing() {
                // The next PDU is here already: a look at the token costs less than waiting
                // on a clone of it per command.
                return Stop::Quiet;
            }
            self.whole = whole_pdu(self.rd.buffer());
            // A read from the socket (for this PDU's first bytes or for its rest) restarts the
            // keep-alive timer: once per read, not per command (the clock costs more than the
            // count). Under a steady stream every read ends inside a PDU, so it is never missed.
            if reads || !self.whole {
                self.session.alive();
            }
            let buf = std::mem::take(&mut self.head_buf);
            let head = read_head_into(&mut self.rd, Side::Controller, &self.neg, buf);
            let r = match self.whole {
                true => Ok(head.await),
                false => tokio::time::timeout(self.t.cfg.pdu_timeout, head).await,
            };
            let (head, f, raw) = match r {
                Ok(Ok(x)) => x,
                Ok(Err(ReadError::Io(_))) => return Stop::Quiet,
                Ok(Err(ReadError::Pdu(e))) => return Stop::Fatal(e, Vec::new()),
                Err(_) => return self.timed_out("the rest of a PDU's header"),
            };
            let step = match head {
                Head::Cmd(sqe) => {
                    taken += f.ch.plen as usize;
                    self.capsule(sqe, &f, &raw).await
                }
                Head::H2CData(d) => self.h2c_data(d, &f, &raw).await,
                Head::TermReq { fes, fei, .. } => {
                    tracing::info!(peer = %self.peer, fes, fei, "the host ended the connection with a termination request");
                    return Stop::Quiet;
                }
                _ => Err(Stop::Fatal(PduError::Sequence(f.ch.pdu_type), raw.clone())),
            };
            self.head_buf = raw;
            if let Err(s) = step {
                return s;
            }
        }
    }

    /// Waits for the first byte of the next PDU: as long as it takes on a connected queue (an
    /// idle host sends nothing; keep-alive watches its controller), until the handshake
    /// deadline on a queue not yet connected.
    async fn next_pdu_begins(&mut self) -> Result<(), Stop> {
        let limit = self.fill_limit();
        let r = match !self.session.is_handshaking() {
            true => self.rd.fill_limited(limit).await.map(|b| b.is_empty()),
            false => {
                let first = self.rd.fill_limited(limit);
                match tokio::time::timeout_at(self.handshake_deadline, first).await {
                    Ok(r) => r.map(|b| b.is_empty()),
                    Err(_) if self.session.is_connected() => {
                        return Err(self.timed_out("its authentication messages"))
                    }
                    Err(_) => return Err(self.timed_out("a Connect")),
                }
            }
        };
        match r {
            Ok(false) => Ok(()),
            _ => Err(Stop::Quiet),
        }
    }

    /// How much the next read of the socket may take in. While R2Ts await their data the next
    /// PDU is most likely H2CData: then no further than its header (with its digest), so that
    /// its data goes from the socket straight to its buffer (`Inbound`); another PDU's header
    /// is longer, and its rest comes with the following read.
    fn fill_limit(&self) -> usize {
        if self.pending.lock().is_empty() {
            return usize::MAX;
        }
        pdu::DATA_HLEN + if self.neg.hdgst { pdu::DIGEST_LEN } else { 0 }
    }

    /// Reads a PDU's data, which must follow its header within the PDU timeout.
    async fn data(&mut self, f: &Frame, dst: &mut [u8]) -> Result<bool, Stop> {
        if self.whole {
            return Ok(read_data_direct(&mut self.rd, f, dst).await?);
        }
        match tokio::time::timeout(
            self.t.cfg.pdu_timeout,
            read_data_direct(&mut self.rd, f, dst),
        )
        .await
        {
            Ok(r) => Ok(r?),
            Err(_) => Err(self.timed_out("a PDU's data")),
        }
    }

    fn timed_out(&self, what: &str) -> Stop {
        self.t.counters.timeouts.fetch_add(1, Ordering::Relaxed);
        if let Some(n) = self.t.refusal_log.allow() {
            tracing::warn!(peer = %self.peer, "closing an NVMe/TCP connection that did not send {what} in time ({n} more not logged)");
        }
        Stop::Quiet
    }

    fn in_capsule_limit(&self) -> usize {
        match self.session.qid() {
            0 => ADMIN_IN_CAPSULE.max(self.t.cfg.in_capsule_bytes as usize),
            _ => self.t.cfg.in_capsule_bytes as usize,
        }
    }

    async fn capsule(&mut self, sqe: Sqe, f: &Frame, raw: &[u8]) -> Result<(), Stop> {
        self.session.counted();
        let limit = self.in_capsule_limit();
        if f.data_len > limit {
            return Err(Stop::Fatal(
                PduError::TooLarge(f.data_len as u64),
                raw.to_vec(),
            ));
        }
        self.admit(raw)?;
        let (mut icd, held) = self.in_capsule_buffer(f.data_len).await?;
        let digest_ok = match icd.as_mut() {
            Some(b) => self.data(f, b).await?,
            None => self.data(f, &mut []).await?,
        };
        self.admitted(sqe, icd, held, digest_ok).await
    }

    /// A command in flight on this queue from now on, unless the host already has as many as
    /// its queue holds.
    fn admit(&mut self, raw: &[u8]) -> Result<(), Stop> {
        let inflight = self.reply.admit();
        if inflight > self.session.depth() {
            // The host ignored the queue size it asked for: nothing sane can follow.
            return Err(Stop::Fatal(
                PduError::Sequence(pdu::pdu_type::CAPSULE_CMD),
                raw.to_vec(),
            ));
        }
        if self.session.is_connected() {
            // This reader is its one writer: no read-modify-write needed.
            let d = self.session.depth() as u16;
            let h = self.sqhd.load(Ordering::Relaxed);
            self.sqhd.store((h + 1) % d, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Runs an admitted command whose in-capsule data is in (`icd`, `digest_ok`).
    async fn admitted(
        &mut self,
        sqe: Sqe,
        icd: Option<IoBuf>,
        held: Option<Held>,
        digest_ok: bool,
    ) -> Result<(), Stop> {
        let cid = sqe.cid();
        if !digest_ok {
            self.reply.done(cid, Status::TRANSIENT_TRANSPORT_ERROR, 0);
            return Ok(());
        }
        let icd_len = icd.as_ref().map_or(0, |b| b.len());
        let x = cmd::transfer(&sqe, icd_len, self.session.max_transfer());
        let (data, c2h_len) = match x {
            Err(st) => {
                self.reply.done(cid, st, 0);
                return Ok(());
            }
            Ok(Transfer::None) => (None, 0),
            Ok(Transfer::InCapsule(r)) => match icd {
                Some(b) if r.start == 0 && r.end == b.len() => (Some(b), 0),
                Some(b) => (Some(IoBuf::from_slice(&b[r])), 0),
                None => (None, 0),
            },
            Ok(Transfer::FromHost(0)) => (None, 0),
            Ok(Transfer::FromHost(len)) => {
                if let Err(st) = self.session.admit_transfer(&sqe, &Transfer::FromHost(len)) {
                    self.reply.done(cid, st, 0);
                    return Ok(());
                }
                return self.start_r2t(sqe, len).await;
            }
            Ok(Transfer::ToHost(len)) => (None, len),
        };
        self.execute(sqe, data, c2h_len, held).await;
        Ok(())
    }

    /// A buffer for `len` bytes of in-capsule data, and the bytes of the host's share it holds.
    /// An I/O queue's come from the host's share, then the pool: the reader waits in line for
    /// each when short, which stops reading the socket (back-pressure) -- unless this queue
    /// holds buffers still waiting for the host's data (after our R2Ts, or waiting in line for
    /// one), which arrive behind this capsule on the same socket: waiting then could never end,
    /// so such a capsule's data (at most the in-capsule size) goes to a buffer of its own. While
    /// the reader waits it starts no transfer, so nothing of this queue waits on its socket.
    /// Admin and Connect data (bounded, small) is never pooled.
    async fn in_capsule_buffer(
        &mut self,
        len: usize,
    ) -> Result<(Option<IoBuf>, Option<Held>), Stop> {
        if len == 0 {
            return Ok((None, None));
        }
        let Some(share) = self
            .session
            .share()
            .filter(|_| self.session.qid() != 0)
            .cloned()
        else {
            return Ok((Some(IoBuf::standalone(len)), None));
        };
        let may_wait =
            self.pending.lock().is_empty() && self.r2t_waiting.load(Ordering::Acquire) == 0;
        // The token is cloned only to wait (a clone per write was 1% of the core at 4K).
        let held = match share.try_take(len) {
            Some(h) => h,
            None if may_wait => tokio::select! {
                _ = self.session.closing().cancelled_owned() => return Err(Stop::Quiet),
                h = share.take(len) => h,
            },
            None => return Ok((Some(IoBuf::standalone(len)), None)),
        };
        let pool = self.session.pool().clone();
        let b = match pool.try_get(len) {
            Ok(Some(b)) => b,
            Ok(None) if may_wait => tokio::select! {
                _ = self.session.closing().cancelled_owned() => return Err(Stop::Quiet),
                b = pool.get(len) => b.map_err(|_| Stop::Quiet)?,
            },
            Ok(None) | Err(_) => return Ok((Some(IoBuf::standalone(len)), None)),
        };
        Ok((Some(b), Some(held)))
    }

    /// Runs a command; `held`, the host's share its data buffer counts against, goes back
    /// when the command is done with the buffer.
    async fn execute(&mut self, sqe: Sqe, data: Option<IoBuf>, c2h_len: usize, held: Option<Held>) {
        let cid = sqe.cid();
        let action = self.session.command(&sqe, data, c2h_len);
        // The queue id is known once Connect succeeded: responses, Connect's first, carry it.
        self.reply.qid = self.session.qid();
        match action {
            Action::Complete { status, result } => self.reply.done(cid, status, result),
            Action::Data { mut data, result } if c2h_len > 0 => {
                data.resize(c2h_len, 0);
                // Admin data (Identify, log pages): small, and not on the data path.
                self.reply.data(cid, IoBuf::from_slice(&data), None, result);
            }
            Action::Data { result, .. } => self.reply.done(cid, Status::SUCCESS, result),
            Action::Parked => {}
            Action::Disconnect => {
                self.reply.done(cid, Status::SUCCESS, 0);
                self.reply.send(Out::Close);
                self.closing = true;
            }
            Action::Io(job) => {
                let mut run = Box::pin(async move {
                    let _held = held;
                    job.run().await
                });
                // Its first step runs here: on members in memory most commands end in it, and
                // a task each cost a scheduling round per command and split the writer's
                // batches (a reply sent from here joins the batch of this socket read). One
                // that must wait goes on in a task of this core, which the device's completion
                // wakes (a waker it left for this reader is replaced at the task's first poll;
                // if it fires first, the reader only wakes once for nothing).
                // Only a command that waits takes a replier of its own.
                match std::future::poll_fn(|cx| Poll::Ready(run.as_mut().poll(cx))).await {
                    Poll::Ready(done) => self.reply.finish(cid, done),
                    Poll::Pending => {
                        let reply = self.reply.clone();
                        tokio::spawn(async move { reply.finish(cid, run.await) });
                    }
                }
            }
        }
    }
}
