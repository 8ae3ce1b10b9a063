//! One queue's command handling, whatever transport carries it: Connect (admission, the host
//! allow-list, controller creation or an I/O queue joining its controller), the other Fabrics
//! commands, admin commands and Async Event Requests, and the admission of I/O commands against
//! the controller's namespaces. A transport (NVMe/TCP in `tcp`, NVMe/RDMA in its own crate)
//! receives capsules, moves data, and hands each command here; it acts on the [`Action`].

use crate::admin;
use crate::cmd::{self, fctype, io, Sqe, Status, Transfer, CONNECT_DATA_LEN};
use crate::io_commands::{IoCommand, IoQueue};
use crate::model::{Completer, Controller, Inner, Transport, TransportInfo, Via, AERL};
use millrace_io::Share;
use millrace_io::{BufPool, IoBuf};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[path = "session_auth.rs"]
mod auth;

/// Connect data fetched before a queue is connected is at most this long (it is 1024 bytes).
pub const CONNECT_DATA_MAX: usize = 4096;

/// What the transport does with a command.
pub enum Action {
    /// Complete with this status and result.
    Complete { status: Status, result: u64 },
    /// Send `data` to the host (the transport pads or trims it to the command's length), then
    /// complete with success and `result`.
    Data { data: Vec<u8>, result: u64 },
    /// Completed later through the queue's [`Completer`] (an Async Event Request).
    Parked,
    /// Complete with success, then close the queue (Fabrics Disconnect).
    Disconnect,
    /// An I/O command: run it (in a task of its own) and complete as it says.
    Io(IoCommand),
}

impl Action {
    fn status(status: Status) -> Action {
        Action::Complete { status, result: 0 }
    }
}

/// Counts failed commands in the target's counters, from any task.
pub struct ErrorCounter(Arc<Inner>);

impl ErrorCounter {
    pub fn add(&self) {
        self.0.counters.errors.fetch_add(1, Ordering::Relaxed);
    }
}

struct Bound {
    ctrl: Arc<Controller>,
    qid: u16,
    depth: usize,
    io: Arc<IoQueue>,
}

/// The target's side of one queue. Dropping it ends the queue: an admin queue takes its
/// controller with it, an I/O queue frees its id.
pub struct Session {
    t: Arc<Inner>,
    transport: TransportInfo,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    discovery_only: bool,
    completer: Option<Completer>,
    pool: BufPool,
    q: Option<Bound>,
    /// The queue's DH-HMAC-CHAP state when its host must authenticate (`session_auth.rs`).
    auth: Option<Box<crate::dhchap::txn::QueueAuth>>,
    /// The PSK identity the host proved over TLS (NVMe/TCP's secure channel): Connect must
    /// name the same host and subsystem.
    tls: Option<crate::tls::Identity>,
}

impl Session {
    pub(crate) fn new(
        t: Arc<Inner>,
        peer: SocketAddr,
        local: Option<SocketAddr>,
        discovery_only: bool,
    ) -> Session {
        let transport = TransportInfo {
            kind: Transport::Tcp,
            in_capsule: t.cfg.in_capsule_bytes,
        };
        let pool = t.data().pool.clone();
        Session {
            t,
            transport,
            peer,
            local,
            discovery_only,
            completer: None,
            pool,
            q: None,
            auth: None,
            tls: None,
        }
    }

    /// The PSK identity this queue's TLS handshake proved (None: plain TCP).
    pub(crate) fn with_tls(mut self, tls: Option<crate::tls::Identity>) -> Session {
        self.tls = tls;
        self
    }

    /// The transport carrying this queue, and the pool its read data comes from (one the
    /// transport reaches without a copy).
    pub fn with_transport(mut self, transport: TransportInfo, pool: BufPool) -> Session {
        self.transport = transport;
        self.pool = pool;
        self
    }

    /// How parked commands (Async Event Requests) of an admin queue complete.
    pub fn with_completer(mut self, c: Completer) -> Session {
        self.completer = Some(c);
        self
    }

    /// The queue id once connected (0 before Connect and on admin queues).
    pub fn qid(&self) -> u16 {
        self.q.as_ref().map_or(0, |q| q.qid)
    }

    pub fn is_connected(&self) -> bool {
        self.q.is_some()
    }

    /// Commands the queue holds at once: its size once connected, one before.
    pub fn depth(&self) -> usize {
        self.q.as_ref().map_or(1, |q| q.depth)
    }

    /// Cancelled when the queue must close: its controller went away or the target stops.
    pub fn closing(&self) -> CancellationToken {
        match &self.q {
            Some(q) => q.ctrl.dead.clone(),
            None => self.t.shutdown.clone(),
        }
    }

    /// Whether [`Session::closing`] has fired, without a clone of the token (a transport asks
    /// this per command).
    pub fn is_closing(&self) -> bool {
        match &self.q {
            Some(q) => q.ctrl.dead.is_cancelled(),
            None => self.t.shutdown.is_cancelled(),
        }
    }

    /// The pool this queue's data buffers come from.
    pub fn pool(&self) -> &BufPool {
        &self.pool
    }

    /// The connected host's share of the pool: a buffer's bytes are taken from it before the
    /// buffer is taken from the pool (None before Connect).
    pub fn share(&self) -> Option<&Share> {
        self.q.as_ref().map(|q| &q.io.share)
    }

    /// Where a Write on this I/O queue ends, with its namespace's write granule;
    /// None for other commands and for namespaces whose device writes any span whole.
    pub(crate) fn write_span(&self, sqe: &Sqe) -> Option<crate::plug::Span> {
        let q = self.q.as_ref().filter(|q| q.qid != 0)?;
        if sqe.is_fabrics() || sqe.opcode() != io::WRITE {
            return None;
        }
        let granule = q.io.subsys.with_ns(sqe.nsid(), |ns| ns.granule_blocks)?;
        let end = sqe.slba().checked_add(u64::from(sqe.nlb()))?;
        (granule > 0).then_some(crate::plug::Span {
            nsid: sqe.nsid(),
            end,
            granule,
        })
    }

    /// Largest data transfer of one command.
    pub fn max_transfer(&self) -> usize {
        self.t.max_transfer()
    }

    /// A command arrived: counted, and the controller's keep-alive timer restarts.
    pub fn received(&self) {
        self.counted();
        self.alive();
    }

    /// A command arrived: counted. A transport that restarts the keep-alive timer per read
    /// from its socket ([`Session::alive`]) calls this per command instead of `received`.
    pub fn counted(&self) {
        self.t.counters.commands.fetch_add(1, Ordering::Relaxed);
    }

    /// The host sent something: the controller's keep-alive timer restarts.
    pub fn alive(&self) {
        if let Some(q) = &self.q {
            q.ctrl.touch(&self.t);
        }
    }

    /// A command completed with an error status (counted for the status pages).
    pub fn failed(&self) {
        self.t.counters.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts errors of commands that complete elsewhere (in their own tasks).
    pub fn error_counter(&self) -> ErrorCounter {
        ErrorCounter(self.t.clone())
    }

    /// The transport broke the protocol's rules (counted; the transport closes the queue).
    pub fn protocol_error(&self) {
        self.t
            .counters
            .protocol_errors
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the transport may take a buffer for the host's data of `sqe` before running it.
    /// Only a connected queue gets one; before Connect only Connect's own data (bounded), so a
    /// host that has not been admitted cannot make the target hold memory.
    pub fn admit_transfer(&self, sqe: &Sqe, x: &Transfer) -> Result<(), Status> {
        let len = match x {
            Transfer::FromHost(n) => *n,
            _ => return Ok(()),
        };
        if self.q.is_some() && !self.authenticated() {
            return self.admit_before_auth(sqe, x);
        }
        if self.q.is_some() {
            return match len <= self.max_transfer() {
                true => Ok(()),
                false => Err(Status::INVALID_FIELD),
            };
        }
        let connect = sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT;
        match (connect, len <= CONNECT_DATA_MAX) {
            (true, true) => Ok(()),
            (true, false) => Err(Status::DATA_SGL_LENGTH_INVALID),
            (false, _) => Err(Status::COMMAND_SEQUENCE_ERROR),
        }
    }

    /// Handles one command with its host-to-controller data (in the capsule or fetched);
    /// `c2h_len` is the length of the host's buffer for data coming back.
    pub fn command(&mut self, sqe: &Sqe, data: Option<IoBuf>, c2h_len: usize) -> Action {
        if sqe.is_fabrics() {
            return self.fabrics(sqe, data.as_deref());
        }
        let Some(q) = &self.q else {
            return Action::status(Status::COMMAND_SEQUENCE_ERROR);
        };
        if !self.authenticated() {
            return Action::status(Status::AUTH_REQUIRED);
        }
        if q.qid == 0 {
            let ctrl = q.ctrl.clone();
            return self.admin(&ctrl, sqe, data.as_deref());
        }
        let ctrl = &q.ctrl;
        if !ctrl.enabled.load(Ordering::Relaxed) {
            return Action::status(Status::COMMAND_SEQUENCE_ERROR);
        }
        let Some(ns) = ctrl.subsys.ns(sqe.nsid()).or_else(|| {
            // Flush to every namespace (NSID FFFFFFFFh) is answered by the first one; the others
            // are flushed too.
            (sqe.opcode() == io::FLUSH && sqe.nsid() == u32::MAX)
                .then(|| ctrl.subsys.namespaces.load().first().cloned())
                .flatten()
        }) else {
            return Action::status(Status::INVALID_NAMESPACE);
        };
        // A path whose ANA group is inaccessible, lost or changing serves no I/O: the status
        // tells the host's multipath to use another path.
        if let Some(st) = (ctrl.subsys.ana.state(ctrl.port, ns.ana_group)).io_status() {
            return Action::status(st);
        }
        Action::Io(IoCommand {
            q: q.io.clone(),
            ns,
            sqe: *sqe,
            data,
            c2h_len,
            max_transfer: self.max_transfer(),
        })
    }

    fn fabrics(&mut self, sqe: &Sqe, data: Option<&[u8]>) -> Action {
        match sqe.fctype() {
            fctype::CONNECT => {
                let (status, result) = self.connect(sqe, data.unwrap_or(&[]));
                Action::Complete { status, result }
            }
            fctype::AUTH_SEND | fctype::AUTH_RECEIVE => self.auth_command(sqe, data),
            fctype::PROPERTY_GET | fctype::PROPERTY_SET => match &self.q {
                None => Action::status(Status::COMMAND_SEQUENCE_ERROR),
                Some(_) if !self.authenticated() => Action::status(Status::AUTH_REQUIRED),
                Some(q) if q.qid != 0 => Action::status(Status::INVALID_FIELD),
                Some(q) => {
                    let (status, result) = admin::property(&self.t, &q.ctrl, sqe);
                    Action::Complete { status, result }
                }
            },
            fctype::DISCONNECT if self.q.is_none() => {
                Action::status(Status::COMMAND_SEQUENCE_ERROR)
            }
            fctype::DISCONNECT => Action::Disconnect,
            _ => Action::status(Status::INVALID_OPCODE),
        }
    }

    /// Binds this queue to `ctrl` as queue `qid` of `depth` entries, with what its I/O
    /// commands reach: the subsystem, the pool and the host's share.
    fn bind(&mut self, ctrl: Arc<Controller>, qid: u16, depth: usize) {
        let io = Arc::new(IoQueue {
            subsys: ctrl.subsys.clone(),
            pool: self.pool.clone(),
            share: self.t.host_share(&ctrl.hostnqn),
            host: crate::resv_commands::Host {
                id: ctrl.hostid,
                nqn: ctrl.hostnqn.clone(),
            },
            store: self.t.resv_store.get().cloned(),
        });
        self.q = Some(Bound {
            ctrl,
            qid,
            depth,
            io,
        });
    }

    /// Fabrics Connect: the only command a fresh queue accepts. Every refusal is counted
    /// (under this queue's transport) and logged with the host, its address and the reason.
    fn connect(&mut self, sqe: &Sqe, data: &[u8]) -> (Status, u64) {
        let mut who = (String::new(), String::new());
        match self.try_connect(sqe, data, &mut who) {
            Ok(r) => r,
            Err((why, reply)) => {
                let c = &self.t.counters;
                match self.transport.kind {
                    Transport::Tcp => {
                        c.connections_refused.fetch_add(1, Ordering::Relaxed);
                        c.connects_refused_tcp.fetch_add(1, Ordering::Relaxed);
                    }
                    Transport::Rdma => {
                        c.connects_refused_rdma.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if let Some(n) = self.t.connect_log.allow() {
                    tracing::warn!(peer = %self.peer, transport = self.transport.kind.as_str(), host = %who.0, subsystem = %who.1, "refused a Connect: {why} ({n} more refusals not logged)");
                }
                reply
            }
        }
    }

    /// Connect's checks; `Err` is the reason (a sentence) and the refusal to send. Refusals
    /// carry the offset of the parameter at fault (IPO) and whether it lies in the data
    /// (IATTR), as the spec asks. `who` learns the host and subsystem NQNs once decoded.
    fn try_connect(
        &mut self,
        sqe: &Sqe,
        data: &[u8],
        who: &mut (String, String),
    ) -> Result<(Status, u64), (String, (Status, u64))> {
        let no = |why: &str, r: (Status, u64)| Err((why.to_string(), r));
        if self.q.is_some() {
            return no(
                "the queue is already connected",
                (Status::COMMAND_SEQUENCE_ERROR, 0),
            );
        }
        if sqe.connect_recfmt() != 0 {
            return no(
                "an unknown record format",
                (Status::CONNECT_INCOMPATIBLE_FORMAT, 0),
            );
        }
        if data.len() < CONNECT_DATA_LEN {
            return no(
                "its data is too short",
                (Status::DATA_SGL_LENGTH_INVALID, 0),
            );
        }
        let d = match cmd::ConnectData::decode(data) {
            Ok(d) => d,
            Err(at) => return no(&format!("its data is malformed at byte {at} (an NQN that is not NUL-terminated UTF-8 of at most 223 bytes)"), bad_data(at)),
        };
        *who = (d.hostnqn.clone(), d.subnqn.clone());
        if let Some(id) = &self.tls {
            if id.hostnqn != d.hostnqn || id.subnqn != d.subnqn {
                return no(
                    "its host or subsystem NQN differs from the PSK identity its TLS handshake proved",
                    bad_host(),
                );
            }
        }
        let Some(s) = self.t.lookup(&d.subnqn) else {
            return no("no such subsystem", bad_data(cmd::CONNECT_DATA_SUBNQN));
        };
        if self.discovery_only && !s.discovery {
            return no(
                "this port serves only discovery",
                bad_data(cmd::CONNECT_DATA_SUBNQN),
            );
        }
        if !s.host_allowed(&d.hostnqn) {
            let why = match d.hostnqn.is_empty() {
                true => "an empty host NQN, which only a subsystem open to any host accepts",
                false => "the host is not allowed",
            };
            return no(why, bad_host());
        }
        let qid = sqe.connect_qid();
        let sqsize = sqe.connect_sqsize() as usize;
        if qid == 0 {
            return self.connect_admin(&s, &d, sqe, sqsize);
        }
        if s.discovery {
            return no("a discovery controller has no I/O queues", bad_sqe(42));
        }
        let Some(ctrl) = s.controllers.lock().by_id.get(&d.cntlid).cloned() else {
            return no("no such controller", bad_data(cmd::CONNECT_DATA_CNTLID));
        };
        if ctrl.hostnqn != d.hostnqn || ctrl.hostid != d.hostid {
            return no("the controller belongs to another host", bad_host());
        }
        if qid > ctrl.io_queues.load(Ordering::Relaxed) {
            return no("a queue id beyond those granted", bad_sqe(42));
        }
        if sqsize == 0 || sqsize >= self.t.cfg.max_queue_depth as usize {
            return no("a queue size out of range", bad_sqe(44));
        }
        {
            let mut q = ctrl.io_qids.lock();
            if q.contains(&qid) {
                return no("the queue id is already connected", bad_sqe(42));
            }
            q.push(qid);
        }
        ctrl.touch(&self.t);
        let authreq = self.auth_at_connect(&s, &d.hostnqn);
        self.bind(ctrl, qid, sqsize + 1);
        Ok((Status::SUCCESS, d.cntlid as u64 | authreq))
    }

    fn connect_admin(
        &mut self,
        s: &Arc<crate::model::Subsystem>,
        d: &cmd::ConnectData,
        sqe: &Sqe,
        sqsize: usize,
    ) -> Result<(Status, u64), (String, (Status, u64))> {
        if sqsize == 0 || sqsize >= self.t.cfg.admin_queue_depth.max(2) as usize {
            return Err(("an admin queue size out of range".into(), bad_sqe(44)));
        }
        if d.cntlid != 0xffff && d.cntlid != 0xfffe {
            return Err((
                "an admin queue must ask for a new controller".into(),
                bad_data(cmd::CONNECT_DATA_CNTLID),
            ));
        }
        let kato = sqe.connect_kato();
        let via = Via {
            peer: self.peer,
            transport: self.transport.kind,
            port: self.t.port_of(self.transport.kind, self.local),
            tls: self.tls.is_some(),
        };
        let Some(ctrl) = (self.t).new_controller(s, &d.hostnqn, d.hostid, via, kato) else {
            return Err((
                "the subsystem has no controller id left".into(),
                (Status::CONNECT_CONTROLLER_BUSY, 0),
            ));
        };
        ctrl.aen.lock().tx = self.completer.clone();
        tracing::info!(peer = %self.peer, transport = self.transport.kind.as_str(), host = %d.hostnqn, subsystem = %d.subnqn, cntlid = ctrl.cntlid, "a host connected its admin queue");
        let id = ctrl.cntlid;
        let authreq = self.auth_at_connect(s, &d.hostnqn);
        self.bind(ctrl, 0, sqsize + 1);
        Ok((Status::SUCCESS, id as u64 | authreq))
    }

    fn admin(&mut self, ctrl: &Arc<Controller>, sqe: &Sqe, data: Option<&[u8]>) -> Action {
        let cid = sqe.cid();
        if sqe.opcode() == cmd::admin::ASYNC_EVENT_REQUEST {
            let mut a = ctrl.aen.lock();
            return if let Some(ev) = a.pending.pop_front() {
                Action::Complete {
                    status: Status::SUCCESS,
                    result: ev as u64,
                }
            } else if a.waiting.len() > AERL as usize || a.tx.is_none() {
                Action::status(Status::AER_LIMIT_EXCEEDED)
            } else {
                // Completed later, by Controller::event, from whichever task sees it.
                a.waiting.push_back(cid);
                Action::Parked
            };
        }
        let ctx = admin::Ctx {
            t: &self.t,
            ctrl,
            local: self.local,
            transport: self.transport,
        };
        let r = admin::execute(&ctx, sqe, data);
        tracing::debug!(
            cntlid = ctrl.cntlid,
            opcode = sqe.opcode(),
            cdw10 = sqe.cdw(10),
            nsid = sqe.nsid(),
            status = %r.status,
            "admin command"
        );
        match r.data {
            Some(data) if r.status.is_success() => Action::Data {
                data,
                result: r.result,
            },
            _ => Action::Complete {
                status: r.status,
                result: r.result,
            },
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.auth_at_close();
        if let Some(q) = self.q.take() {
            if q.qid == 0 {
                self.t.drop_controller(&q.ctrl);
            } else {
                q.ctrl.io_qids.lock().retain(|&x| x != q.qid);
            }
        }
    }
}

// IPO in bits 15:0, IATTR in bits 23:16 (1: the offset is into the Connect data).
fn bad_sqe(ipo: u64) -> (Status, u64) {
    (Status::CONNECT_INVALID_PARAMETERS, ipo)
}
fn bad_data(ipo: u16) -> (Status, u64) {
    (Status::CONNECT_INVALID_PARAMETERS, ipo as u64 | 1 << 16)
}
fn bad_host() -> (Status, u64) {
    (
        Status::CONNECT_INVALID_HOST,
        cmd::CONNECT_DATA_HOSTNQN as u64 | 1 << 16,
    )
}
