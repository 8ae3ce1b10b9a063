//! Hosts that misbehave over NVMe/RDMA, against a running `millrace serve --nvme-rdma`, while a
//! well-behaved host runs verified I/O. Run by `tests/guest/nvme-rdma-serve.sh` on soft-RoCE.
//!
//! A minimal NVMe/RDMA host (one queue pair per queue, commands with keyed SGLs into memory it
//! registered, the Connect data fetched by the target with RDMA READ, as the Linux host does)
//! plays, on `--stalled` controllers of the allowed host: writes of the largest transfer
//! whose data the target can never read (the host's queue pair is put in the error state once
//! they are posted), reads whose responses the host never lets in (it posts no receives and
//! asks for infinite receiver-not-ready retries), queue pairs that never send Connect, and
//! hosts that disconnect, or whose process is killed with SIGKILL, with I/O in flight. Meanwhile
//! the good controller writes and reads back random 4 KiB blocks: every one must be answered
//! within `--max-ms` and read back byte for byte (within `--churn-max-ms` while this process and
//! the kernel are busy setting up or tearing down dozens of queue pairs on the same emulated
//! CPUs: the guest's soft-RoCE does that work on the CPUs the good host runs on, so it measures
//! the emulator rather than the target; the slowest round of each phase is reported). Then the
//! stalled hosts are left as they are
//! (never disconnected by the host): the target must close each of them by its deadlines (the
//! host sees its connection end), after which the rest hang up in random order, the good host
//! still checking. Exits 0 with a summary, or 1 with a sentence saying what went wrong.
//!   usage: rdma_hangups ADDR:PORT SUBNQN HOSTNQN [--stalled N] [--max-ms MS]
//!          [--churn-max-ms MS] [--deadline-s S]
//!          rdma_hangups --child ADDR:PORT SUBNQN HOSTNQN   (the process that is SIGKILLed)

use millrace_nvmf::cmd::{admin, fctype, io, ConnectData, Cqe, Sqe, CQE_LEN};
use millrace_nvmf_rdma::wire::{self, CmRequest, Remote};
use millrace_rdma::cm::{CmId, ConnectParams, EventKind};
use millrace_rdma::verbs::{
    Completion, CompletionQueue, MemoryRegion, Opcode, ProtectionDomain, QpCaps, QueuePair, SendOp,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest data of one command (the target's MDTS is 1 MiB by default).
const BIG: usize = 1 << 20;
const DEPTH: u16 = 32;

fn fail(why: String) -> ! {
    eprintln!("rdma_hangups: FAILED: {why}");
    std::process::exit(1)
}

/// How a host queue takes its responses.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Receives {
    /// One receive per command slot, reposted as responses arrive.
    All,
    /// Only enough for Connect: later responses find no receive (RNR for ever).
    ConnectOnly,
}

/// One host queue: its CM id (dropped first: it takes the queue pair), completion queue and
/// registered memory for capsules, responses and data (one data slot per command id).
struct HostQueue {
    id: CmId,
    qp: QueuePair,
    cq: CompletionQueue,
    cmd: MemoryRegion,
    rsp: MemoryRegion,
    data: MemoryRegion,
    _pd: Arc<ProtectionDomain>,
    slot: usize,
    /// Data slots: commands share them round robin (misbehaving hosts need one 1 MiB slot
    /// for all their commands, not 32 MiB of memory each).
    slots: u16,
    next_cid: u16,
}

const RECV: u64 = 1 << 32;

impl HostQueue {
    async fn open(
        addr: SocketAddr,
        qid: u16,
        cntlid: u16,
        (slot, slots): (usize, u16),
        r: Receives,
    ) -> Result<HostQueue, String> {
        let mut id = CmId::resolve(addr, 5000).await.map_err(|e| e.to_string())?;
        let ctx = id.context();
        let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
        let n = DEPTH as u32;
        let mut cq = CompletionQueue::new(ctx, 4 * n + 8).map_err(|e| e.to_string())?;
        let caps = QpCaps {
            max_send_wr: 2 * n + 1,
            max_recv_wr: n + 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = id.create_qp(&pd, &cq, caps).map_err(|e| e.to_string())?;
        let reg = |len| pd.register_new(len).map_err(|e| e.to_string());
        let (cmd, rsp, data) = (
            reg(n as usize * 64)?,
            reg(n as usize * CQE_LEN)?,
            reg(slots as usize * slot)?,
        );
        let posted = if r == Receives::All { n } else { 1 };
        for i in 0..posted {
            let sge = rsp
                .sge(i as usize * CQE_LEN, CQE_LEN)
                .expect("inside the region");
            // SAFETY: the response buffer is registered and untouched until its completion.
            unsafe { qp.post_recv(RECV | i as u64, sge) }.map_err(|e| e.to_string())?;
        }
        let pd_bytes = CmRequest {
            qid,
            hrqsize: DEPTH,
            hsqsize: DEPTH - 1,
            cntlid,
        }
        .encode();
        let p = ConnectParams {
            private_data: &pd_bytes,
            initiator_depth: 0,
            responder_resources: 16,
            retry_count: 7,
            rnr_retry_count: 7,
        };
        id.connect(&p)
            .await
            .map_err(|e| format!("queue {qid}: {e}"))?;
        let _ = cq.wait().await;
        Ok(HostQueue {
            id,
            qp,
            cq,
            cmd,
            rsp,
            data,
            _pd: pd,
            slot,
            slots,
            next_cid: 0,
        })
    }

    /// The data slot of command `cid` as the target sees it (address, length, key).
    fn remote(&self, cid: u16, len: usize) -> Remote {
        let off = (cid % self.slots) as usize * self.slot;
        Remote {
            addr: self.data.addr() as u64 + off as u64,
            len: len as u32,
            key: self.data.rkey(),
        }
    }

    fn data_mut(&mut self, cid: u16, len: usize) -> &mut [u8] {
        let off = (cid % self.slots) as usize * self.slot;
        // SAFETY: the slot lies in the region; the target touches it only while command cid
        // is in flight, and we use it before posting and after its response.
        unsafe { std::slice::from_raw_parts_mut(self.data.addr().add(off), len) }
    }

    /// Posts command `sqe` (its cid set here) with `len` bytes of keyed data in its slot.
    fn post(&mut self, mut sqe: Sqe, len: usize) -> Result<u16, String> {
        let cid = self.next_cid;
        self.next_cid = (cid + 1) % DEPTH;
        sqe.set_cid(cid);
        // Commands without data carry a keyed SGL of length 0, as the Linux host sends them.
        wire::set_keyed(&mut sqe, self.remote(cid, len), false);
        let at = cid as usize * 64;
        // SAFETY: capsule slot cid is ours until its SEND completes (one command per slot).
        unsafe { std::ptr::copy_nonoverlapping(sqe.0.as_ptr(), self.cmd.addr().add(at), 64) };
        let sge = self.cmd.sge(at, 64).expect("inside the region");
        let op = SendOp {
            wr_id: cid as u64,
            op: Opcode::Send,
            sge,
            signaled: true,
        };
        // SAFETY: the capsule stays put until the SEND completes.
        unsafe { self.qp.post_send(&[op]) }.map_err(|e| e.to_string())?;
        Ok(cid)
    }

    /// Waits for the response of `cid` (reposting the receive it came in).
    async fn response(&mut self, cid: u16) -> Result<Cqe, String> {
        let mut wcs = [Completion {
            wr_id: 0,
            status: 0,
            byte_len: 0,
            is_recv: false,
        }; 32];
        loop {
            let n = self.cq.poll(&mut wcs).map_err(|e| e.to_string())?;
            for wc in &wcs[..n] {
                if !wc.ok() {
                    return Err(format!("a work request failed: {}", wc.status_text()));
                }
                if wc.wr_id & RECV == 0 {
                    continue;
                }
                let i = (wc.wr_id & 0xffff) as usize;
                let mut b = [0u8; CQE_LEN];
                // SAFETY: the receive completed: the device is done with buffer i.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.rsp.addr().add(i * CQE_LEN),
                        b.as_mut_ptr(),
                        CQE_LEN,
                    )
                };
                let sge = self
                    .rsp
                    .sge(i * CQE_LEN, CQE_LEN)
                    .expect("inside the region");
                // SAFETY: as when first posted.
                unsafe { self.qp.post_recv(wc.wr_id, sge) }.map_err(|e| e.to_string())?;
                let c = Cqe::decode(&b);
                if c.cid == cid {
                    return Ok(c);
                }
            }
            if n == 0 {
                self.cq.wait().await.map_err(|e| e.to_string())?;
            }
        }
    }

    async fn exec(&mut self, sqe: Sqe, len: usize) -> Result<Cqe, String> {
        let cid = self.post(sqe, len)?;
        let c = self.response(cid).await?;
        match c.status().is_success() {
            true => Ok(c),
            false => Err(format!(
                "command {:#x} failed: {:?}",
                sqe.opcode(),
                c.status()
            )),
        }
    }

    /// Sends Connect (its data in slot 0, fetched by the target) and returns the controller id.
    async fn connect(
        &mut self,
        qid: u16,
        cntlid: u16,
        subnqn: &str,
        hostnqn: &str,
    ) -> Result<u16, String> {
        let mut sqe = Sqe::fabrics(fctype::CONNECT, 0);
        sqe.set_connect(qid, DEPTH - 1, 0);
        let d = ConnectData {
            hostid: [7; 16],
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
        .encode();
        self.data_mut(self.next_cid, d.len()).copy_from_slice(&d);
        Ok(self.exec(sqe, d.len()).await?.result as u16)
    }
}

/// An admin queue, enabled, and one I/O queue of a new controller.
struct Host {
    io: HostQueue,
    admin: HostQueue,
}

async fn controller(
    addr: SocketAddr,
    subnqn: &str,
    hostnqn: &str,
    data: (usize, u16),
    r: Receives,
) -> Result<Host, String> {
    let mut admin = HostQueue::open(addr, 0, 0xffff, (4096, DEPTH), Receives::All).await?;
    let cntlid = admin.connect(0, 0xffff, subnqn, hostnqn).await?;
    let mut cc = Sqe::fabrics(fctype::PROPERTY_SET, 0);
    cc.set_prop(false, 0x14, 1 | 6 << 16 | 4 << 20);
    admin.exec(cc, 0).await?;
    let mut nq = Sqe::new(admin::SET_FEATURES, 0, 0);
    nq.set_cdw(10, 7);
    admin.exec(nq, 0).await?;
    let mut io = HostQueue::open(addr, 1, cntlid, data, r).await?;
    io.connect(1, cntlid, subnqn, hostnqn).await?;
    Ok(Host { io, admin })
}

fn rw(op: u8, slba: u64, blocks: u32) -> Sqe {
    let mut s = Sqe::new(op, 0, 1);
    s.set_lba_range(slba, blocks);
    s
}

/// The namespace's logical block size (Identify Namespace: FLBAS, then its LBA format).
async fn lba_bytes(h: &mut Host) -> Result<usize, String> {
    let mut s = Sqe::new(admin::IDENTIFY, 0, 1);
    s.set_cdw(10, 0);
    let cid = h.admin.next_cid;
    h.admin.exec(s, 4096).await?;
    let id = h.admin.data_mut(cid, 4096).to_vec();
    let f = (id[26] & 0xf) as usize;
    Ok(1 << id[128 + 4 * f + 2])
}

/// The good host's check: a random 4 KiB block written and read back within `max`.
struct Good {
    h: Host,
    lba: usize,
    rng: u64,
    /// The bound of the phase now, and the phase's name.
    max: Duration,
    phase: &'static str,
    done: u64,
    /// The slowest round of each phase, in the order the phases came.
    slowest: Vec<(&'static str, Duration)>,
}

impl Good {
    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    async fn round(&mut self) -> Result<(), String> {
        let blocks = (4096 / self.lba) as u32;
        let slba = (self.next() % ((32 << 20) / 4096)) * blocks as u64;
        let data: Vec<u8> = (0..4096).map(|_| self.next() as u8).collect();
        let t0 = Instant::now();
        let q = &mut self.h.io;
        let wcid = q.next_cid;
        q.data_mut(wcid, 4096).copy_from_slice(&data);
        let limit = Duration::from_secs(10);
        let w = tokio::time::timeout(limit, q.exec(rw(io::WRITE, slba, blocks), 4096)).await;
        w.map_err(|_| format!("a 4 KiB write at LBA {slba} got no answer in {limit:?}"))??;
        let rcid = q.next_cid;
        q.data_mut(rcid, 4096).fill(0);
        let r = tokio::time::timeout(limit, q.exec(rw(io::READ, slba, blocks), 4096)).await;
        r.map_err(|_| format!("a 4 KiB read at LBA {slba} got no answer in {limit:?}"))??;
        let took = t0.elapsed();
        if q.data_mut(rcid, 4096) != &data[..] {
            return Err(format!(
                "read back other bytes than were written at LBA {slba}"
            ));
        }
        if took > self.max {
            return Err(format!(
                "a 4 KiB write and read took {took:?} (limit {:?}) in phase '{}'",
                self.max, self.phase
            ));
        }
        match self.slowest.last_mut() {
            Some((p, d)) if *p == self.phase => *d = (*d).max(took),
            _ => self.slowest.push((self.phase, took)),
        }
        self.done += 1;
        Ok(())
    }

    fn phase(&mut self, name: &'static str, max: Duration) {
        self.phase = name;
        self.max = max;
    }

    fn report(&self) -> String {
        let v: Vec<String> = (self.slowest.iter())
            .map(|(p, d)| format!("{p} {:.0} ms", d.as_secs_f64() * 1000.0))
            .collect();
        format!("slowest round per phase: {}", v.join(", "))
    }

    /// Checks for `d`, as often as it can.
    async fn for_a_while(&mut self, d: Duration) -> Result<(), String> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.round().await?;
        }
        Ok(())
    }
}

/// What each misbehaving host does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Writes whose data the target cannot read: the queue pair goes to the error state.
    StalledWrites,
    /// Reads whose responses find no receive (and infinite RNR retries).
    NoReceives,
    /// A queue pair that never sends Connect.
    Mute,
    /// Writes and reads in flight, then a disconnect.
    Disconnects,
}

enum Bad {
    Ctrl(Kind, Box<Host>),
    Mute(HostQueue),
}

impl Bad {
    /// What it does, for a failure's sentence.
    fn what(&self) -> String {
        match self {
            Bad::Ctrl(k, _) => format!("{k:?}"),
            Bad::Mute(_) => "Mute".into(),
        }
    }

    /// The CM id the target's closure shows on.
    fn id(&self) -> &CmId {
        match self {
            Bad::Ctrl(_, h) => &h.io.id,
            Bad::Mute(q) => &q.id,
        }
    }
}

async fn misbehave(
    addr: SocketAddr,
    sub: &str,
    host: &str,
    k: Kind,
    lba: usize,
) -> Result<Bad, String> {
    let blocks = (BIG / lba) as u32;
    if k == Kind::Mute {
        return Ok(Bad::Mute(
            HostQueue::open(addr, 1, 1, (4096, 1), Receives::All).await?,
        ));
    }
    let r = if k == Kind::NoReceives {
        Receives::ConnectOnly
    } else {
        Receives::All
    };
    let mut h = controller(addr, sub, host, (BIG, 1), r).await?;
    // 32 commands of 1 MiB: a 32 MiB write (or read) per controller.
    for i in 0..DEPTH as u64 {
        let slba = (64 << 20) / lba as u64 + i * blocks as u64;
        let op = match (k, i % 2) {
            (Kind::StalledWrites, _) | (Kind::Disconnects, 0) => io::WRITE,
            _ => io::READ,
        };
        h.io.post(rw(op, slba, blocks), BIG)?;
    }
    match k {
        Kind::StalledWrites => h.io.qp.to_error().map_err(|e| e.to_string())?,
        Kind::Disconnects => h.io.id.disconnect().map_err(|e| e.to_string())?,
        _ => {}
    }
    Ok(Bad::Ctrl(k, Box::new(h)))
}

/// Waits until the target closes the connection of `id` (its CM event arrives), up to `d`.
async fn closed_by_target(id: &CmId, d: Duration) -> bool {
    let wait = async {
        loop {
            match id.next_event().await {
                Ok(ev)
                    if matches!(
                        ev.kind,
                        EventKind::Disconnected | EventKind::Failed(_) | EventKind::TimewaitExit
                    ) =>
                {
                    return
                }
                Ok(_) => continue,
                Err(_) => return,
            }
        }
    };
    tokio::time::timeout(d, wait).await.is_ok()
}

struct Args {
    addr: SocketAddr,
    sub: String,
    host: String,
    stalled: usize,
    max: Duration,
    churn_max: Duration,
    deadline: Duration,
}

fn args() -> (bool, Args) {
    let v: Vec<String> = std::env::args().skip(1).collect();
    let child = v.first().is_some_and(|a| a == "--child");
    let pos: Vec<&String> = v.iter().filter(|a| !a.starts_with("--")).collect();
    let opt = |name: &str, default: u64| -> u64 {
        (v.iter().position(|a| a == name))
            .and_then(|i| v.get(i + 1))
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let usage = || {
        fail("usage: rdma_hangups [--child] ADDR:PORT SUBNQN HOSTNQN [--stalled N] [--max-ms MS] [--deadline-s S]".into())
    };
    if pos.len() < 3 {
        usage();
    }
    let addr = pos[0].parse().unwrap_or_else(|_| usage());
    let a = Args {
        addr,
        sub: pos[1].clone(),
        host: pos[2].clone(),
        stalled: opt("--stalled", 48) as usize,
        max: Duration::from_millis(opt("--max-ms", 1000)),
        churn_max: Duration::from_millis(opt("--churn-max-ms", 1000)),
        deadline: Duration::from_secs(opt("--deadline-s", 45)),
    };
    (child, a)
}

/// The process killed with SIGKILL: a controller that keeps 8 writes and reads of 64 KiB in
/// flight until it dies (the good host's share is also theirs: more would crowd its small lane).
async fn child(a: &Args) -> ! {
    let mut h = controller(a.addr, &a.sub, &a.host, (128 << 10, DEPTH), Receives::All)
        .await
        .unwrap_or_else(|e| fail(e));
    let lba = lba_bytes(&mut h).await.unwrap_or_else(|e| fail(e));
    let blocks = ((64 << 10) / lba) as u32;
    let mut in_flight = std::collections::VecDeque::new();
    for i in 0u64.. {
        let op = if i % 2 == 0 { io::WRITE } else { io::READ };
        let cid =
            h.io.post(rw(op, (i % 64) * blocks as u64, blocks), 64 << 10)
                .unwrap_or_else(|e| fail(e));
        in_flight.push_back(cid);
        if in_flight.len() >= 8 {
            let oldest = in_flight.pop_front().expect("8 in flight");
            h.io.response(oldest).await.unwrap_or_else(|e| fail(e));
        }
    }
    unreachable!("the loop ends with the process")
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (is_child, a) = args();
    if is_child {
        child(&a).await;
    }
    if let Err(e) = run(&a).await {
        fail(e);
    }
}

/// Starts the 4 processes to be killed and the misbehaving controllers, the good host checked
/// between each.
async fn start_misbehaving(
    a: &Args,
    good: &mut Good,
    lba: usize,
) -> Result<(Vec<std::process::Child>, Vec<Bad>), String> {
    // Killed processes: each a controller with I/O in flight when SIGKILL comes.
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut kids = Vec::new();
    for _ in 0..4 {
        let c = std::process::Command::new(&exe)
            .args(["--child", &a.addr.to_string(), &a.sub, &a.host])
            .stdout(std::process::Stdio::null())
            .spawn();
        kids.push(c.map_err(|e| format!("cannot start a child host: {e}"))?);
    }
    let kinds = [
        Kind::StalledWrites,
        Kind::NoReceives,
        Kind::Mute,
        Kind::Disconnects,
    ];
    let mut bad = Vec::new();
    for i in 0..a.stalled {
        let k = kinds[i % kinds.len()];
        let b = tokio::time::timeout(
            Duration::from_secs(30),
            misbehave(a.addr, &a.sub, &a.host, k, lba),
        )
        .await;
        bad.push(
            b.map_err(|_| format!("a {k:?} host could not connect in 30 s"))?
                .map_err(|e| format!("a {k:?} host: {e}"))?,
        );
        good.round().await?;
    }
    Ok((kids, bad))
}

async fn run(a: &Args) -> Result<(), String> {
    let t0 = Instant::now();
    let mut h = controller(a.addr, &a.sub, &a.host, (4096, DEPTH), Receives::All).await?;
    let lba = lba_bytes(&mut h).await?;
    let mut good = Good {
        h,
        lba,
        rng: 0x9e3779b97f4a7c15,
        max: a.max,
        phase: "alone",
        done: 0,
        slowest: Vec::new(),
    };
    good.round().await?;
    good.phase("hosts connecting", a.churn_max);
    let (kids, bad) = start_misbehaving(a, &mut good, lba).await?;
    good.phase("48 stalled", a.max);
    good.for_a_while(Duration::from_secs(2)).await?;
    good.phase("processes killed", a.churn_max);
    for mut k in kids {
        let _ = k.kill();
        let _ = k.wait();
        good.round().await?;
    }
    println!("rdma_hangups: {} misbehaving controllers and 4 killed processes; the good host's I/O went on ({} rounds)", a.stalled, good.done);
    good.phase("target closing stalled queues", a.max);
    // The target must end every stalled queue by itself, by its deadlines, while the good
    // host goes on; each is waited for in turn, the good host checked between them.
    let end = Instant::now() + a.deadline;
    let mut closed = 0;
    for (i, b) in
        (bad.iter().enumerate()).filter(|(_, b)| !matches!(b, Bad::Ctrl(Kind::Disconnects, _)))
    {
        loop {
            good.round().await?;
            if closed_by_target(b.id(), Duration::from_millis(200)).await {
                closed += 1;
                break;
            }
            if Instant::now() > end {
                return Err(format!(
                    "the target kept a stalled queue open for more than {:?} (misbehaving host {i}, {}; {closed} closed before it)",
                    a.deadline,
                    b.what()
                ));
            }
        }
    }
    println!(
        "rdma_hangups: the target closed every stalled queue by itself within {:?} of the start",
        t0.elapsed()
    );
    // The rest hang up in an order of their own (admin queues, mostly), while the good host checks.
    let mut order: Vec<usize> = (0..bad.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (good.next() % (i as u64 + 1)) as usize);
    }
    good.phase("hosts hanging up", a.churn_max);
    let mut slots: Vec<Option<Bad>> = bad.into_iter().map(Some).collect();
    for i in order {
        if let Some(Bad::Ctrl(_, h)) = slots[i].take() {
            let _ = h.admin.id.disconnect();
        }
        good.round().await?;
    }
    good.phase("after", a.max);
    good.for_a_while(Duration::from_secs(1)).await?;
    let _ = good.h.io.id.disconnect();
    let _ = good.h.admin.id.disconnect();
    println!(
        "rdma_hangups: PASS: {} verified 4 KiB write+read rounds ({}), {:.0} s in all",
        good.done,
        good.report(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
