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
//!
//! A host cannot hold what it was given for ever (docs/SECURITY.md): the queue must be connected
//! within the handshake timeout, each RDMA READ of a write's data must complete within the
//! transfer timeout and each response (with its RDMA WRITE) within the reply timeout, or the
//! queue is closed and everything it held goes back. Without these a host whose queue pair
//! stops answering keeps its buffers for as long as the ACK timeout it chose in its connect
//! request allows (hours), and one that stops posting receives keeps them for ever (the host
//! asks for infinite receiver-not-ready retries). Time is counted in ticks of one second, so
//! posting work costs no clock read. Commands already running on the volume when the queue
//! ends finish there (their tasks are detached) and are counted as abandoned.

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
use std::time::Duration;
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
    /// The host did not do this in time (connect, let its write data be read, take a response):
    /// counted, logged at a bounded rate, then closed.
    TimedOut(&'static str),
}

/// How a queue ended, and how many of its commands were still in flight then.
#[derive(Debug)]
pub struct Ended {
    pub why: Stop,
    pub abandoned: usize,
}

/// How long a host may take, from the moment the queue waits on it.
#[derive(Clone, Copy, Debug)]
pub struct Deadlines {
    /// From accept to a successful Connect.
    pub handshake: Duration,
    /// An RDMA READ of a write's data, from its post to its completion.
    pub transfer: Duration,
    /// A response SEND (after its RDMA WRITE of read data), from its post to its completion.
    pub reply: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            handshake: Duration::from_secs(10),
            transfer: Duration::from_secs(10),
            reply: Duration::from_secs(30),
        }
    }
}

/// Whole ticks a deadline spans (at least one, so a tick that comes just after a post never
/// cuts it short).
pub(crate) fn ticks(d: Duration) -> u32 {
    (d.as_millis().div_ceil(TICK.as_millis())).clamp(1, u32::MAX as u128) as u32
}

/// The queue's clock: work is stamped with the tick it was posted in.
pub(crate) const TICK: Duration = Duration::from_secs(1);

/// Work of a slot the host must finish, with the tick it was posted in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Posted {
    Read(u32),
    Reply(u32),
}

/// Which posted work, if any, has waited longer than its limit at tick `now`.
pub(crate) fn overdue(
    posted: impl Iterator<Item = Posted>,
    now: u32,
    read_ticks: u32,
    reply_ticks: u32,
) -> Option<&'static str> {
    for p in posted {
        match p {
            Posted::Read(t) if now.wrapping_sub(t) > read_ticks => {
                return Some("let its write data be read")
            }
            Posted::Reply(t) if now.wrapping_sub(t) > reply_ticks => {
                return Some("take a response")
            }
            _ => {}
        }
    }
    None
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
    /// The RDMA READ or response SEND posted for this slot and not yet completed.
    pub posted: Option<Posted>,
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
            posted: None,
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
    /// Commands running on the volume: detached when the queue ends, so they finish there.
    pub(crate) tasks: JoinSet<Done>,
    /// Waits for a share of the pool or a buffer: dropped when the queue ends.
    pub(crate) waits: JoinSet<Done>,
    pub(crate) pool: Arc<RegisteredPool>,
    pub(crate) plan: QueuePlan,
    pub(crate) cmds: C,
    pub(crate) reads_in_flight: u8,
    pub(crate) reads_waiting: VecDeque<u32>,
    pub(crate) sqhd: u16,
    pub(crate) max_transfer: usize,
    /// Close once this slot's response is sent (after Disconnect).
    pub(crate) close_after: Option<u32>,
    pub(crate) deadlines: Deadlines,
    /// Ticks since the queue started.
    pub(crate) tick: u32,
}

enum Wake {
    Completions,
    Task(Done),
    Cm(EventKind),
    Parked(Cqe),
    Closing,
    Tick,
}

impl<C: Commands> Queue<C> {
    /// A queue whose receives are posted (call before accepting the connection).
    pub fn new(
        p: Parts,
        pool: Arc<RegisteredPool>,
        plan: QueuePlan,
        cmds: C,
        max_transfer: usize,
        deadlines: Deadlines,
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
            waits: JoinSet::new(),
            pool,
            plan,
            cmds,
            reads_in_flight: 0,
            reads_waiting: VecDeque::new(),
            sqhd: 0,
            max_transfer,
            close_after: None,
            deadlines,
            tick: 0,
        };
        for r in 0..q.plan.recv_slots {
            q.repost(r)?;
        }
        Ok(q)
    }

    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// Serves the queue until the host disconnects, the target closes it, it fails, or the host
    /// misses a deadline.
    pub async fn run(mut self) -> Ended {
        let closing = self.cmds.closing();
        let mut parked = self.cmds.parked();
        let mut clock = tokio::time::interval_at(tokio::time::Instant::now() + TICK, TICK);
        clock.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                Some(j) = self.waits.join_next() => match j {
                    Ok(d) => Wake::Task(d),
                    Err(e) => return self.stop(Stop::Fatal(format!("a wait for a buffer failed: {e}"))),
                },
                _ = clock.tick() => Wake::Tick,
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
                Wake::Tick => self.on_tick(),
            };
            if let Err(s) = r {
                return self.stop(s);
            }
        }
    }

    /// Ends the queue: the host is told, the commands on the volume finish there, and what
    /// the device may touch goes when `self` does (the queue pair first).
    fn stop(self, why: Stop) -> Ended {
        let _ = self.id.disconnect();
        let abandoned = (self.slots.iter()).filter(|s| s.busy && !s.parked).count();
        let Queue {
            id,
            qp,
            cq,
            recv,
            rsp,
            slots,
            mut tasks,
            waits,
            ..
        } = self;
        tasks.detach_all();
        drop(waits);
        // Destroying a queue pair waits for the device to flush its work (in soft-RoCE, seconds
        // for one stuck in receiver-not-ready retries), which on this core would stall every
        // other queue it serves: it happens on a blocking thread. The slots' buffers, which the
        // device may write until then, go back on this core afterwards.
        tokio::spawn(async move {
            let device = tokio::task::spawn_blocking(move || drop((id, qp, cq, recv, rsp))).await;
            match device {
                Ok(()) => drop(slots),
                // The queue pair may be alive: its buffers are never handed out again.
                Err(_) => std::mem::forget(slots),
            }
        });
        Ended { why, abandoned }
    }

    /// One more second: a queue not yet connected past the handshake deadline, or work the
    /// host has not finished within its deadline, ends the queue.
    fn on_tick(&mut self) -> Result<(), Stop> {
        self.tick = self.tick.wrapping_add(1);
        let d = self.deadlines;
        if !self.cmds.is_connected() && self.tick >= ticks(d.handshake) {
            return Err(Stop::TimedOut("connect"));
        }
        let posted = self.slots.iter().filter_map(|s| s.posted);
        match overdue(posted, self.tick, ticks(d.transfer), ticks(d.reply)) {
            Some(what) => Err(Stop::TimedOut(what)),
            None => Ok(()),
        }
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
                self.slots[c as usize].posted = None;
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
        s.posted = None;
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
                // The host's share of a write's buffer goes back with the buffer, when the
                // command is done with it (also when the queue ended meanwhile).
                let held = self.slots[c as usize].held.take();
                self.tasks.spawn(async move {
                    let o = f.await;
                    drop(held);
                    Done::Outcome(c, o)
                });
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_are_whole_ticks_never_zero() {
        assert_eq!(ticks(Duration::from_secs(10)), 10);
        assert_eq!(ticks(Duration::from_millis(1500)), 2);
        assert_eq!(ticks(Duration::ZERO), 1);
        assert_eq!(ticks(Duration::MAX), u32::MAX);
    }

    #[test]
    fn work_is_overdue_only_past_its_own_limit() {
        let read = [Posted::Read(5)];
        assert_eq!(
            overdue(read.into_iter(), 15, 10, 30),
            None,
            "10 ticks is in time"
        );
        assert_eq!(
            overdue(read.into_iter(), 16, 10, 30),
            Some("let its write data be read")
        );
        let reply = [Posted::Reply(5), Posted::Read(10)];
        assert_eq!(
            overdue(reply.into_iter(), 16, 10, 30),
            None,
            "replies get longer"
        );
        assert_eq!(
            overdue(reply.into_iter(), 21, 10, 30),
            Some("let its write data be read"),
            "the READ is late while the reply posted before it is not"
        );
        assert_eq!(
            overdue([Posted::Reply(5)].into_iter(), 36, 10, 30),
            Some("take a response")
        );
        // The tick counter wraps after 136 years; the arithmetic must not panic when it does.
        assert_eq!(
            overdue([Posted::Read(u32::MAX)].into_iter(), 3, 10, 30),
            None
        );
        assert_eq!(overdue(std::iter::empty(), 1000, 10, 30), None);
    }
}
