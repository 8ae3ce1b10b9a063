//! One NVMe/RDMA queue: a reliable-connected queue pair whose receives take command capsules,
//! whose sends carry response capsules, and whose RDMA READs and WRITEs move each command's data
//! between the host's memory and a buffer of the registered pool. One task on one core of the
//! data path runs it: it waits on the completion channel, the commands that await the device
//! (each a task of the same core, its device calls the `*_async` ones), the CM events and the
//! controller's end, and every state change happens in that task (no lock).
//!
//! Command slots are fixed at connect time (twice the receives): a slot holds the command, its
//! data buffer and its response capsule until the response's SEND completes. RDMA READs beyond
//! what the host allows outstanding wait in line. Everything the device may still touch stays
//! owned by this struct, whose CM id (and queue pair) is dropped before any buffer.

use crate::commands::{Commands, Exec, Outcome};
use crate::regpool::RegisteredPool;
use crate::sizing::{QueuePlan, Work, SQE_BYTES};
use crate::wire::{self, Plan, Remote};
use millrace_io::IoBuf;
use millrace_nvmf::cmd::{fctype, Cqe, Sqe, Status, Transfer};
use millrace_rdma::cm::{CmId, EventKind};
use millrace_rdma::verbs::{Completion, CompletionQueue, MemoryRegion, QueuePair};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::task::JoinSet;

/// Largest Connect data fetched before the queue is connected (Connect's data is 1024 bytes).
const CONNECT_FETCH_MAX: u32 = 4096;

/// Why a queue stops.
#[derive(Debug)]
pub enum Stop {
    /// The host disconnected, or the target closed the queue: nothing wrong.
    Closed,
    /// The host broke the transport's rules, or the device failed: logged, then closed.
    Fatal(String),
}

pub(crate) struct Slot<P> {
    pub busy: bool,
    pub sqe: Sqe,
    pub plan: Option<P>,
    pub data: Option<IoBuf>,
    /// The host's share of the pool `data` counts against, given back with it.
    pub held: Option<millrace_io::share::Held>,
    pub remote: Option<Remote>,
    pub invalidate: Option<u32>,
    /// A Connect whose data is being fetched before the queue is connected.
    pub connect_fetch: bool,
    pub parked: bool,
}

impl<P> Slot<P> {
    fn new() -> Slot<P> {
        Slot {
            busy: false,
            sqe: Sqe::default(),
            plan: None,
            data: None,
            held: None,
            remote: None,
            invalidate: None,
            connect_fetch: false,
            parked: false,
        }
    }
}

/// What the queue's side tasks hand back.
pub(crate) enum Done {
    Outcome(u32, Outcome),
    Buffer(u32, IoBuf, Option<millrace_io::share::Held>),
    NoBuffer(u32),
}

/// The resources of an accepted queue, handed to [`Queue::new`].
pub struct Parts {
    pub id: CmId,
    pub qp: QueuePair,
    pub cq: CompletionQueue,
    pub recv: MemoryRegion,
    pub rsp: MemoryRegion,
}

pub struct Queue<C: Commands> {
    // Declared (and so dropped) first: destroying the id destroys the queue pair, after which
    // the device touches none of the memory below.
    pub(crate) id: CmId,
    pub(crate) qp: QueuePair,
    pub(crate) cq: CompletionQueue,
    pub(crate) recv: MemoryRegion,
    pub(crate) rsp: MemoryRegion,
    pub(crate) slots: Vec<Slot<C::Plan>>,
    pub(crate) free: Vec<u32>,
    pub(crate) tasks: JoinSet<Done>,
    pub(crate) pool: Arc<RegisteredPool>,
    pub(crate) plan: QueuePlan,
    pub(crate) cmds: C,
    pub(crate) reads_in_flight: u8,
    pub(crate) reads_waiting: VecDeque<u32>,
    pub(crate) sqhd: u16,
    pub(crate) max_transfer: usize,
    /// Close once this slot's response is sent (after Disconnect).
    pub(crate) close_after: Option<u32>,
}

enum Wake {
    Completions,
    Task(Done),
    Cm(EventKind),
    Parked(Cqe),
    Closing,
}

impl<C: Commands> Queue<C> {
    /// A queue whose receives are posted (call before accepting the connection).
    pub fn new(
        p: Parts,
        pool: Arc<RegisteredPool>,
        plan: QueuePlan,
        cmds: C,
        max_transfer: usize,
    ) -> Result<Queue<C>, Stop> {
        let n = plan.cmd_slots as usize;
        let mut q = Queue {
            id: p.id,
            qp: p.qp,
            cq: p.cq,
            recv: p.recv,
            rsp: p.rsp,
            slots: (0..n).map(|_| Slot::new()).collect(),
            free: (0..n as u32).rev().collect(),
            tasks: JoinSet::new(),
            pool,
            plan,
            cmds,
            reads_in_flight: 0,
            reads_waiting: VecDeque::new(),
            sqhd: 0,
            max_transfer,
            close_after: None,
        };
        for r in 0..q.plan.recv_slots {
            q.repost(r)?;
        }
        Ok(q)
    }

    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// Serves the queue until the host disconnects, the target closes it, or it fails.
    pub async fn run(mut self) -> Stop {
        let closing = self.cmds.closing();
        let mut parked = self.cmds.parked();
        let mut wcs = [Completion {
            wr_id: 0,
            status: 0,
            byte_len: 0,
            is_recv: false,
        }; 32];
        loop {
            loop {
                let n = match self.cq.poll(&mut wcs) {
                    Ok(n) => n,
                    Err(e) => return self.stop(Stop::Fatal(e.to_string())),
                };
                if n == 0 {
                    break;
                }
                for wc in &wcs[..n] {
                    if let Err(s) = self.on_completion(wc) {
                        return self.stop(s);
                    }
                }
            }
            let wake = tokio::select! {
                r = self.cq.wait() => match r {
                    Ok(()) => Wake::Completions,
                    Err(e) => return self.stop(Stop::Fatal(e.to_string())),
                },
                Some(j) = self.tasks.join_next() => match j {
                    Ok(d) => Wake::Task(d),
                    Err(e) => return self.stop(Stop::Fatal(format!("a command's task failed: {e}"))),
                },
                ev = self.id.next_event() => match ev {
                    Ok(ev) => Wake::Cm(ev.kind),
                    Err(e) => return self.stop(Stop::Fatal(e.to_string())),
                },
                Some(cqe) = async { match parked.as_mut() { Some(r) => r.recv().await, None => std::future::pending().await } } => Wake::Parked(cqe),
                _ = closing.cancelled() => Wake::Closing,
            };
            let r = match wake {
                Wake::Completions => Ok(()),
                Wake::Task(d) => self.on_task(d),
                Wake::Cm(EventKind::Established | EventKind::Other(_)) => Ok(()),
                Wake::Cm(_) => Err(Stop::Closed),
                Wake::Parked(cqe) => self.on_parked(cqe),
                Wake::Closing => Err(Stop::Closed),
            };
            if let Err(s) = r {
                return self.stop(s);
            }
        }
    }

    fn stop(self, s: Stop) -> Stop {
        let _ = self.id.disconnect();
        s
    }

    fn on_completion(&mut self, wc: &Completion) -> Result<(), Stop> {
        let Some(w) = Work::from_wr_id(wc.wr_id) else {
            return Err(Stop::Fatal(format!(
                "a completion for unknown work {:#x}",
                wc.wr_id
            )));
        };
        if !wc.ok() {
            if wc.flushed() {
                return Err(Stop::Closed);
            }
            return Err(Stop::Fatal(format!("{w:?} failed: {}", wc.status_text())));
        }
        match w {
            Work::Recv(r) if r < self.plan.recv_slots => self.on_capsule(r, wc.byte_len as usize),
            Work::Read(c) if (c as usize) < self.slots.len() => {
                self.reads_in_flight = self.reads_in_flight.saturating_sub(1);
                self.next_read()?;
                self.after_fetch(c)
            }
            Work::Send(c) if (c as usize) < self.slots.len() => self.on_sent(c),
            _ => Err(Stop::Fatal(format!(
                "a completion for slot {w:?} beyond the queue"
            ))),
        }
    }

    /// A response went out: the slot and its buffer are free.
    fn on_sent(&mut self, c: u32) -> Result<(), Stop> {
        let s = &mut self.slots[c as usize];
        s.busy = false;
        s.data = None;
        s.held = None;
        s.plan = None;
        self.free.push(c);
        if self.close_after == Some(c) {
            return Err(Stop::Closed);
        }
        Ok(())
    }

    fn on_task(&mut self, d: Done) -> Result<(), Stop> {
        match d {
            Done::Outcome(c, o) => self.respond(c, o),
            Done::Buffer(c, buf, held) => {
                self.slots[c as usize].data = Some(buf);
                self.slots[c as usize].held = held;
                self.start_read(c)
            }
            Done::NoBuffer(c) => self.respond(c, Outcome::err(Status::INTERNAL_ERROR)),
        }
    }

    fn on_parked(&mut self, mut cqe: Cqe) -> Result<(), Stop> {
        let Some(c) = self
            .slots
            .iter()
            .position(|s| s.busy && s.parked && s.sqe.cid() == cqe.cid)
        else {
            return Ok(());
        };
        self.slots[c].parked = false;
        cqe.sqid = self.cmds.qid();
        cqe.sqhd = self.sqhd;
        self.send_cqe(c as u32, cqe)
    }

    /// Posts receive buffer `r` again.
    pub(crate) fn repost(&mut self, r: u32) -> Result<(), Stop> {
        let bytes = self.plan.recv_bytes;
        let sge = self
            .recv
            .sge(r as usize * bytes, bytes)
            .ok_or_else(|| Stop::Fatal(format!("receive buffer {r} lies outside its region")))?;
        // SAFETY: receive buffer r is ours and not read again until its completion; the id
        // (and QP) is alive as long as self.
        unsafe { self.qp.post_recv(Work::Recv(r).wr_id(), sge) }
            .map_err(|e| Stop::Fatal(e.to_string()))
    }

    /// A command capsule arrived in receive buffer `r`.
    fn on_capsule(&mut self, r: u32, n: usize) -> Result<(), Stop> {
        if n < SQE_BYTES {
            return Err(Stop::Fatal(format!(
                "a capsule of {n} bytes, less than a command"
            )));
        }
        let at = r as usize * self.plan.recv_bytes;
        // SAFETY: the receive completed, so the device is done with buffer r; n bytes of it
        // were written (n <= recv_bytes, or the receive would have failed).
        let capsule = unsafe {
            std::slice::from_raw_parts(self.recv.addr().add(at), n.min(self.plan.recv_bytes))
        };
        let sqe = Sqe::from_slice(capsule).expect("64 bytes checked above");
        let Some(c) = self.free.pop() else {
            return Err(Stop::Fatal(
                "the host sent more commands than its queue holds".into(),
            ));
        };
        self.sqhd = (self.sqhd + 1) % self.plan.recv_slots as u16;
        let s = &mut self.slots[c as usize];
        s.busy = true;
        s.sqe = sqe;
        s.remote = None;
        s.invalidate = None;
        s.connect_fetch = false;
        let dp = match wire::plan(&sqe, n - SQE_BYTES, self.max_transfer) {
            Ok(dp) => dp,
            Err(st) => {
                self.repost(r)?;
                return self.respond(c, Outcome::err(st));
            }
        };
        s.invalidate = dp.invalidate;
        let icd = match &dp.plan {
            Plan::InCapsule(range) => Some(self.copy_in_capsule(&capsule[SQE_BYTES..], range)),
            _ => None,
        };
        self.repost(r)?;
        self.dispatch(c, dp.plan, icd)
    }

    fn copy_in_capsule(&self, icd: &[u8], range: &std::ops::Range<usize>) -> Option<IoBuf> {
        let src = &icd[range.clone()];
        let mut b = self.pool.pool().try_get(src.len()).ok().flatten()?;
        b.set_len(src.len()).ok()?;
        b.copy_from_slice(src);
        Some(b)
    }

    /// Admits the command and starts its data movement or runs it.
    fn dispatch(&mut self, c: u32, plan: Plan, icd: Option<Option<IoBuf>>) -> Result<(), Stop> {
        let sqe = self.slots[c as usize].sqe;
        let x = match &plan {
            Plan::None => Transfer::None,
            Plan::InCapsule(r) => Transfer::InCapsule(0..r.len()),
            Plan::FromHost(r) => Transfer::FromHost(r.len as usize),
            Plan::ToHost(r) => Transfer::ToHost(r.len as usize),
        };
        let icd = match icd {
            // No pool space for even a small copy: the host retries.
            Some(None) => return self.respond(c, Outcome::err(Status::INTERNAL_ERROR)),
            icd => icd.flatten(),
        };
        if let Plan::FromHost(r) | Plan::ToHost(r) = plan {
            self.slots[c as usize].remote = Some(r);
        }
        // Before Connect, Linux sends the Connect data on the admin queue by keyed SGL: fetch
        // it (bounded: one small buffer per unconnected queue), then admit it as in-capsule.
        if let Plan::FromHost(r) = plan {
            let connect = sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT;
            if connect && !self.cmds.is_connected() && r.len <= CONNECT_FETCH_MAX {
                self.slots[c as usize].connect_fetch = true;
                return self.fetch(c, r.len as usize);
            }
        }
        let p = match self.cmds.admit(&sqe, &x) {
            Ok(p) => p,
            Err(st) => return self.respond(c, Outcome::err(st)),
        };
        let fetch = self.cmds.fetches_data(&p);
        self.slots[c as usize].plan = Some(p);
        match plan {
            Plan::FromHost(r) if fetch => self.fetch(c, r.len as usize),
            _ => self.execute(c, icd),
        }
    }

    pub(crate) fn execute(&mut self, c: u32, data: Option<IoBuf>) -> Result<(), Stop> {
        let s = &mut self.slots[c as usize];
        let sqe = s.sqe;
        let Some(p) = s.plan.take() else {
            return self.respond(c, Outcome::err(Status::INTERNAL_ERROR));
        };
        match self.cmds.execute(&sqe, p, data) {
            Exec::Now(o) => self.respond(c, o),
            Exec::Later(f) => {
                self.tasks.spawn(async move { Done::Outcome(c, f.await) });
                Ok(())
            }
        }
    }
}
