//! What the target holds, whatever transport carries its queues: subsystems and their
//! namespaces, controllers (one per admin queue), ports, the discovery subsystem, limits and
//! counters. Lookups here happen at Connect time and on the control path; the data path reads
//! namespaces through an `ArcSwap` (no lock) and counts with relaxed atomics. Nothing here knows
//! a transport's framing: a controller completes parked commands through a [`Completer`] its
//! admin queue's transport gave it.

use crate::cmd::{Cqe, Status};
use crate::error::Error;
use arc_swap::ArcSwap;
use millrace_block::BlockDevice;
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, VecDeque};

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The well-known NQN of a discovery subsystem.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// The standard ports: NVMe/TCP I/O and the discovery service.
pub const DEFAULT_IO_PORT: u16 = 4420;
pub const DEFAULT_DISCOVERY_PORT: u16 = 8009;

/// The transports a queue may arrive on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Tcp,
    Rdma,
}

impl Transport {
    /// The name nvme-cli uses (`-t tcp`, `-t rdma`).
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        }
    }
    /// TRTYPE in the discovery log.
    pub(crate) fn trtype(self) -> u8 {
        match self {
            Transport::Rdma => 1,
            Transport::Tcp => 3,
        }
    }
}

/// What carries a session's queue, as Identify Controller reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransportInfo {
    pub kind: Transport,
    /// In-capsule data bytes an I/O queue takes (IOCCSZ is 64 bytes more, in 16-byte units).
    pub in_capsule: u32,
}

/// Completes a parked command (an Async Event Request) on the admin queue it came from, from
/// any task: true when the completion was taken, false when the queue cannot take it now (the
/// event then waits for the next request).
pub type Completer = Arc<dyn Fn(Cqe) -> bool + Send + Sync>;

/// Limits and timeouts of the target. Every buffer the target allocates is bounded by these.
#[derive(Clone, Debug)]
pub struct TargetConfig {
    /// Most I/O queues one controller may have.
    pub max_io_queues: u16,
    /// Most entries in an I/O queue (CAP.MQES + 1) and commands in flight on it.
    pub max_queue_depth: u16,
    /// Most entries in an admin queue.
    pub admin_queue_depth: u16,
    /// Most data bytes in one H2CData PDU (MAXH2CDATA in ICResp).
    pub maxh2cdata: u32,
    /// In-capsule data an I/O queue accepts (admin queues always take 8 KiB, as hosts expect).
    pub in_capsule_bytes: u32,
    /// Largest data transfer of one command (MDTS); a power of two times 4 KiB.
    pub max_transfer_bytes: u32,
    /// Added to the host's keep-alive timeout before a silent controller is torn down.
    pub keep_alive_grace: Duration,
    /// The pool of a target given no data path (`Target::set_data_path`): all data buffers
    /// of all connections together.
    pub max_buffer_bytes: u64,
    /// Most connections at once; further ones are closed at once.
    pub max_connections: usize,
    /// Most connections at once from one IP address (a host opens one per queue: an admin
    /// queue and one I/O queue per CPU, per subsystem).
    pub max_connections_per_address: usize,
    /// A new connection must finish ICReq and Connect this soon, or it is closed.
    pub handshake_timeout: Duration,
    /// A PDU once begun must arrive whole (header and data) this soon, or the connection
    /// is closed (a host that sends half a PDU holds nothing for long).
    pub pdu_timeout: Duration,
    /// Replies once being sent must be taken by the host this soon, or the connection is closed:
    /// a host that stops reading its socket holds what its replies are sent from (pool buffers,
    /// a member's pages) no longer.
    pub reply_timeout: Duration,
    /// Grant header and data digests when a host asks for them.
    pub allow_digests: bool,
    /// Most bytes of the buffer pool one host (host NQN) holds at once, over all its queues;
    /// None: a quarter of the pool. At least one largest transfer's buffer.
    pub max_host_buffer_bytes: Option<u64>,
    /// Longest a received write is held for the write continuing it inside the device's write
    /// granule, so the device can merge them (`BlockDevice::write_granule_bytes`); zero holds
    /// none.
    pub write_hold: Duration,
}

impl Default for TargetConfig {
    fn default() -> Self {
        TargetConfig {
            max_io_queues: 64,
            max_queue_depth: 128,
            admin_queue_depth: 32,
            maxh2cdata: 128 * 1024,
            in_capsule_bytes: 8192,
            max_transfer_bytes: 1 << 20,
            keep_alive_grace: Duration::from_secs(5),
            max_buffer_bytes: 512 << 20,
            max_connections: 4096,
            max_connections_per_address: 1024,
            handshake_timeout: Duration::from_secs(10),
            pdu_timeout: Duration::from_secs(10),
            reply_timeout: Duration::from_secs(30),
            allow_digests: true,
            max_host_buffer_bytes: None,
            write_hold: Duration::from_millis(2),
        }
    }
}

/// A namespace to export: a block device under a namespace id, with stable identifiers (hosts
/// use them to recognise the namespace across reconnects and paths).
#[derive(Clone)]
pub struct Namespace {
    pub nsid: u32,
    pub dev: Arc<dyn BlockDevice>,
    pub uuid: [u8; 16],
    pub nguid: [u8; 16],
    /// The namespace's ANA group, 1 to [`crate::ANA_GROUP_MAX`]; 0 puts it in group 1.
    pub ana_group: u32,
}

/// A subsystem to export. Closed by default: only `allowed_hosts` may connect unless
/// `allow_any_host` says otherwise.
#[derive(Clone)]
pub struct SubsystemConfig {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    pub namespaces: Vec<Namespace>,
    pub allowed_hosts: Vec<String>,
    pub allow_any_host: bool,
}

/// A subsystem as the API and dashboard see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubsystemInfo {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    pub namespaces: Vec<NamespaceInfo>,
    pub allowed_hosts: Vec<String>,
    pub allow_any_host: bool,
    pub hosts: Vec<HostInfo>,
    /// Each listener to each ANA group, with the group's state there.
    pub paths: Vec<PathInfo>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub nsid: u32,
    pub size_bytes: u64,
    pub block_bytes: u32,
    pub ana_group: u32,
}

/// One path (a listener) to one ANA group of a subsystem, with the group's state there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathInfo {
    pub transport: Transport,
    pub listener: SocketAddr,
    pub ana_group: u32,
    pub state: crate::ana::AnaState,
}

/// A connected host (one controller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostInfo {
    pub hostnqn: String,
    pub cntlid: u16,
    pub peer: SocketAddr,
    pub io_queues: usize,
    pub transport: Transport,
    /// The listener the host connected through (None: one the target does not list).
    pub listener: Option<SocketAddr>,
    /// Whether the admin queue came over TLS (NVMe/TCP's secure channel).
    pub tls: bool,
}

/// Counters for Prometheus and the dashboard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub connections_open: u64,
    pub connections_total: u64,
    pub connections_refused: u64,
    pub controllers: u64,
    pub commands: u64,
    pub read_commands: u64,
    pub write_commands: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub errors: u64,
    pub protocol_errors: u64,
    /// Connections closed because a handshake or a PDU did not arrive in time.
    pub timeouts: u64,
    /// Commands in flight when their connection ended (the host hung up, reset or failed):
    /// they finish on the volume and their buffers come back; no completion is sent.
    pub abandoned: u64,
    /// Connects refused (host not allowed, unknown subsystem, bad data), per transport.
    pub connects_refused_tcp: u64,
    pub connects_refused_rdma: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub connections_total: AtomicU64,
    pub connections_refused: AtomicU64,
    pub commands: AtomicU64,
    pub errors: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub timeouts: AtomicU64,
    pub abandoned: AtomicU64,
    pub connects_refused_tcp: AtomicU64,
    pub connects_refused_rdma: AtomicU64,
}

/// Per-subsystem I/O counters (the SMART log reports them).
#[derive(Default)]
pub(crate) struct IoCounters {
    pub read_commands: AtomicU64,
    pub write_commands: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
}

/// A namespace with its derived geometry.
pub(crate) struct Ns {
    pub nsid: u32,
    pub dev: Arc<dyn BlockDevice>,
    pub uuid: [u8; 16],
    pub nguid: [u8; 16],
    /// log2 of the logical block size.
    pub lba_shift: u32,
    pub blocks: u64,
    /// Preferred write granularity in blocks (0: none reported).
    pub pref_blocks: u64,
    /// The device's minimum efficient write in blocks (a strip), at most `pref_blocks`.
    pub min_blocks: u64,
    /// The device's write granule in blocks (0: none; `BlockDevice::write_granule_bytes`).
    pub granule_blocks: u64,
    /// The namespace's ANA group (1 to `ANA_GROUP_MAX`).
    pub ana_group: u32,
    /// Its persistent reservations (kept when the namespace is re-read after a resize).
    pub resv: Arc<crate::reservation::NsResv>,
}

impl Ns {
    pub fn new(n: Namespace) -> Result<Ns, Error> {
        if n.nsid == 0 || n.nsid == u32::MAX {
            return Err(Error::Invalid(format!(
                "namespace id {} is reserved; use 1 to {}",
                n.nsid,
                u32::MAX - 1
            )));
        }
        let ana_group = n.ana_group.max(1);
        if ana_group > crate::ana::ANA_GROUP_MAX {
            return Err(Error::Invalid(format!(
                "ANA group {} is out of range; use 1 to {}",
                n.ana_group,
                crate::ana::ANA_GROUP_MAX
            )));
        }
        let bb = n.dev.block_bytes();
        // NVMe formats start at 512 bytes; anything odd falls back to 4 KiB.
        let block = if bb.is_power_of_two() && (512..=65536).contains(&bb) {
            bb
        } else {
            4096
        };
        let lba_shift = block.trailing_zeros();
        let blocks = n.dev.size_bytes() >> lba_shift;
        if blocks == 0 {
            return Err(Error::Invalid(format!(
                "namespace {} is smaller than one {block}-byte block",
                n.nsid
            )));
        }
        let pref = n.dev.preferred_io_bytes();
        let pref_blocks = if pref >= block as u64 && pref.is_multiple_of(block as u64) {
            pref >> lba_shift
        } else {
            0
        };
        let min = n.dev.min_io_bytes();
        let min_blocks = if min >= block as u64
            && min.is_multiple_of(block as u64)
            && pref_blocks > 0
            && (pref >> lba_shift).is_multiple_of(min >> lba_shift)
        {
            min >> lba_shift
        } else {
            pref_blocks
        };
        let granule = n.dev.write_granule_bytes();
        let granule_blocks = match granule.is_multiple_of(block as u64) {
            true => granule >> lba_shift,
            false => 0,
        };
        Ok(Ns {
            granule_blocks,
            ana_group,
            resv: Default::default(),
            nsid: n.nsid,
            dev: n.dev,
            uuid: n.uuid,
            nguid: n.nguid,
            lba_shift,
            blocks,
            pref_blocks,
            min_blocks,
        })
    }
    pub fn block_bytes(&self) -> u32 {
        1 << self.lba_shift
    }
}

pub(crate) struct Subsystem {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    /// Changed in place by [`Target::set_allowed_hosts`]; read at Connect and discovery only.
    pub allowed_hosts: RwLock<Vec<String>>,
    pub allow_any_host: bool,
    pub discovery: bool,
    /// Sorted by nsid. Swapped whole on change so the data path never locks.
    pub namespaces: ArcSwap<Vec<Arc<Ns>>>,
    pub controllers: Mutex<Controllers>,
    pub io: IoCounters,
    /// The ANA states of its groups on each path other than optimized.
    pub ana: crate::ana::Ana,
    /// Hosts' DH-HMAC-CHAP secrets and the authentication counters.
    pub auth: crate::dhchap::SubsystemAuth,
    /// Hosts' configured TLS PSKs (NVMe/TCP's secure channel), per host NQN.
    pub tls_psks: RwLock<HashMap<String, crate::tls::Psk>>,
}

#[derive(Default)]
pub(crate) struct Controllers {
    pub by_id: HashMap<u16, Arc<Controller>>,
    pub next: u16,
}

impl Subsystem {
    pub fn ns(&self, nsid: u32) -> Option<Arc<Ns>> {
        self.with_ns(nsid, Arc::clone)
    }
    /// `f` of namespace `nsid`, without a reference of its own to keep.
    pub fn with_ns<R>(&self, nsid: u32, f: impl FnOnce(&Arc<Ns>) -> R) -> Option<R> {
        let v = self.namespaces.load();
        v.binary_search_by_key(&nsid, |n| n.nsid)
            .ok()
            .map(|i| f(&v[i]))
    }
    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        self.allow_any_host || self.allowed_hosts.read().iter().any(|h| h == hostnqn)
    }
    pub fn kill_controllers(&self) {
        let all: Vec<_> = self.controllers.lock().by_id.values().cloned().collect();
        for c in all {
            c.dead.cancel();
        }
    }
    /// The ANA groups of its namespaces, sorted, each with its namespace ids.
    pub fn ana_groups(&self) -> Vec<(u32, Vec<u32>)> {
        let mut g: Vec<(u32, Vec<u32>)> = Vec::new();
        for n in self.namespaces.load().iter() {
            match g.iter_mut().find(|(id, _)| *id == n.ana_group) {
                Some((_, ids)) => ids.push(n.nsid),
                None => g.push((n.ana_group, vec![n.nsid])),
            }
        }
        g.sort_by_key(|(id, _)| *id);
        g
    }
    /// Tells the controllers connected through port `port` that an ANA state changed.
    pub fn ana_changed(&self, port: u16) {
        let on: Vec<_> = (self.controllers.lock().by_id.values())
            .filter(|c| c.port == port)
            .cloned()
            .collect();
        for c in on {
            c.event(AEN_ANA_CHANGED, AEC_ANA);
        }
    }
    /// Tells every controller that the namespace list changed.
    pub fn namespaces_changed(&self, nsid: u32) {
        let all: Vec<_> = self.controllers.lock().by_id.values().cloned().collect();
        for c in all {
            c.changed_ns(nsid);
        }
    }
}

/// Asynchronous event information: a notice (type 2) that the namespace list changed
/// (information 0, log page 4), or that the discovery log changed (information F0h, log 70h).
pub(crate) const AEN_NS_CHANGED: u32 = 0x02 | (0x04 << 16);
pub(crate) const AEN_DISCOVERY_CHANGED: u32 = 0x02 | (0xf0 << 8) | (0x70 << 16);
/// A notice that an ANA state changed (information 3, ANA log page 0Ch).
pub(crate) const AEN_ANA_CHANGED: u32 = 0x02 | (0x03 << 8) | (0x0c << 16);
/// Async Event Configuration bits enabling those notices.
const AEC_NS_ATTR: u32 = 1 << 8;
pub(crate) const AEC_ANA: u32 = 1 << 11;
const AEC_DISCOVERY: u32 = 1 << 31;
/// Async Event Request Limit (zero-based, as Identify reports it).
pub(crate) const AERL: u8 = 3;

pub(crate) struct AenState {
    pub config: u32,
    /// Events not yet reported, waiting for an Async Event Request.
    pub pending: VecDeque<u32>,
    /// Async Event Requests waiting for an event (their command ids).
    pub waiting: VecDeque<u16>,
    /// The admin queue's way out, to complete a waiting request from anywhere.
    pub tx: Option<Completer>,
}

pub(crate) struct Regs {
    pub cc: u32,
    pub csts: u32,
}

/// One controller: created by an admin-queue Connect, gone when its admin queue closes or its
/// keep-alive timer runs out.
pub(crate) struct Controller {
    pub cntlid: u16,
    pub subsys: Arc<Subsystem>,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub peer: SocketAddr,
    pub transport: Transport,
    /// The port (listener) it was connected through, 0 when the target lists none there: ANA
    /// states are this path's.
    pub port: u16,
    /// The admin queue came over TLS.
    pub tls: bool,
    pub regs: Mutex<Regs>,
    pub enabled: AtomicBool,
    pub kato_ms: AtomicU32,
    /// Milliseconds since the target's epoch of the last command on any of its queues.
    pub last_seen: AtomicU64,
    /// I/O queues granted by Set Features (Number of Queues).
    pub io_queues: AtomicU16,
    pub io_qids: Mutex<Vec<u16>>,
    pub aen: Mutex<AenState>,
    pub changed: Mutex<Vec<u32>>,
    /// Its host's reservation notices and its notification masks.
    pub resv_log: Mutex<crate::reservation::NoticeLog>,
    pub dead: CancellationToken,
}

impl Controller {
    pub fn touch(&self, t: &Inner) {
        self.last_seen.store(t.now_ms(), Ordering::Relaxed);
    }
    fn changed_ns(&self, nsid: u32) {
        {
            let mut c = self.changed.lock();
            // The log holds 1024 entries; past that the spec says report 0xFFFFFFFF alone.
            if c.len() < 1024 && !c.contains(&nsid) {
                c.push(nsid);
            } else if c.len() >= 1024 {
                *c = vec![u32::MAX];
            }
        }
        self.event(AEN_NS_CHANGED, AEC_NS_ATTR);
    }
    /// Reports an asynchronous event if the host enabled it (`enable_bit` 0: an event no
    /// Async Event Configuration bit controls, such as a reservation notice).
    pub fn event(&self, info: u32, enable_bit: u32) {
        let mut a = self.aen.lock();
        if enable_bit != 0 && a.config & enable_bit == 0 {
            return;
        }
        if let (Some(cid), Some(tx)) = (a.waiting.front().copied(), a.tx.clone()) {
            if tx(Cqe::new(cid, Status::SUCCESS, info as u64)) {
                a.waiting.pop_front();
                return;
            }
        }
        if !a.pending.contains(&info) && a.pending.len() < 16 {
            a.pending.push_back(info);
        }
    }
}

/// Where a new controller's admin queue came from.
pub(crate) struct Via {
    pub peer: SocketAddr,
    pub transport: Transport,
    pub port: u16,
    /// The queue came over TLS (NVMe/TCP's secure channel).
    pub tls: bool,
}

pub(crate) struct Port {
    pub id: u16,
    pub addr: SocketAddr,
    pub transport: Transport,
    /// Whether the listener requires TLS (the discovery log's TREQ and TSAS say so).
    pub tls: crate::tls::TlsMode,
}

/// The buffers and cores the target's connections run on (docs/DATAPATH.md).
pub(crate) struct DataPath {
    pub pool: millrace_io::BufPool,
    /// None: connections run as tasks of the runtime that accepted them.
    pub cores: Option<Arc<millrace_io::Cores>>,
}

pub(crate) struct Inner {
    pub cfg: TargetConfig,
    /// Set once by `Target::set_data_path`, or made on first use from `max_buffer_bytes`.
    pub data: std::sync::OnceLock<DataPath>,
    pub subsystems: RwLock<HashMap<String, Arc<Subsystem>>>,
    pub discovery: Arc<Subsystem>,
    pub ports: Mutex<Vec<Port>>,
    pub genctr: AtomicU64,
    pub counters: Counters,
    /// Connections open now, in all and per source address.
    pub admission: millrace_io::admission::Admission<std::net::IpAddr>,
    /// Refusals are logged at most once a second each kind, with a count of those not logged.
    pub refusal_log: millrace_io::admission::RateLimit,
    pub connect_log: millrace_io::admission::RateLimit,
    pub epoch: Instant,
    pub shutdown: CancellationToken,
    /// Each connected host's share of the pool.
    pub host_shares: millrace_io::Shares<String>,
    /// Where namespaces' reservations that persist through power loss are recorded
    /// (`Target::set_reservation_store`); none: hosts cannot ask for persistence.
    pub resv_store: std::sync::OnceLock<crate::reservation::ReservationStore>,
    /// ANA states other than optimized by (subsystem, transport, listener address, group):
    /// a port's id changes when its listener starts again, its address does not, so a state
    /// set before a listener starts (a restart) or kept while it restarts comes back with it.
    pub ana_paths: Mutex<HashMap<AnaPath, crate::ana::AnaState>>,
}

/// A subsystem's ANA group as one listener (by address) reaches it.
pub(crate) type AnaPath = (String, Transport, SocketAddr, u32);

impl Inner {
    /// The data path; a target given none gets its own pool of `max_buffer_bytes` (not
    /// faulted in) and runs connections where they were accepted.
    pub fn data(&self) -> &DataPath {
        self.data.get_or_init(|| {
            let max = (self.cfg.max_transfer_bytes as usize).max(4096);
            let pool = millrace_io::BufPool::new(&millrace_io::PoolConfig {
                bytes: (self.cfg.max_buffer_bytes as usize).max(max * 4),
                slices: 1,
                max_buf: max,
                populate: false,
            })
            .or_else(|_| {
                millrace_io::BufPool::new(&millrace_io::PoolConfig {
                    bytes: max * 4,
                    slices: 1,
                    max_buf: max,
                    populate: false,
                })
            })
            .expect("a small buffer pool can be mapped");
            DataPath { pool, cores: None }
        })
    }
    /// Largest data transfer of one command: the configured one, within the pool's largest
    /// buffer (a power of two of 4 KiB pages, as MDTS needs).
    pub fn max_transfer(&self) -> usize {
        (self.cfg.max_transfer_bytes as usize).min(self.data().pool.max_buf())
    }
    /// The share of the pool host `hostnqn` may hold (made when its first queue connects).
    pub fn host_share(&self, hostnqn: &str) -> millrace_io::Share {
        let quarter = self.data().pool.usage().capacity_bytes / 4;
        let bytes = (self.cfg.max_host_buffer_bytes)
            .unwrap_or(quarter)
            .max(millrace_io::share::charge(self.max_transfer()) as u64);
        self.host_shares
            .of(hostnqn.to_string(), bytes.min(usize::MAX as u64) as usize)
    }
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
    pub fn lookup(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        if nqn == DISCOVERY_NQN {
            return Some(self.discovery.clone());
        }
        self.subsystems.read().get(nqn).cloned()
    }
    /// Creates a controller in `s` and starts its keep-alive watch.
    pub fn new_controller(
        self: &Arc<Self>,
        s: &Arc<Subsystem>,
        hostnqn: &str,
        hostid: [u8; 16],
        via: Via,
        kato_ms: u32,
    ) -> Option<Arc<Controller>> {
        let mut cs = s.controllers.lock();
        // Dynamic controller ids run 1..=0xFFEF; 0xFFF0 and up are reserved.
        let mut id = None;
        for _ in 0..0xffef {
            cs.next = if cs.next >= 0xffef { 1 } else { cs.next + 1 };
            if !cs.by_id.contains_key(&cs.next) {
                id = Some(cs.next);
                break;
            }
        }
        let cntlid = id?;
        let c = Arc::new(Controller {
            cntlid,
            subsys: s.clone(),
            hostnqn: hostnqn.to_owned(),
            hostid,
            peer: via.peer,
            transport: via.transport,
            port: via.port,
            tls: via.tls,
            regs: Mutex::new(Regs { cc: 0, csts: 0 }),
            enabled: AtomicBool::new(false),
            kato_ms: AtomicU32::new(kato_ms),
            last_seen: AtomicU64::new(self.now_ms()),
            io_queues: AtomicU16::new(self.cfg.max_io_queues),
            io_qids: Mutex::new(Vec::new()),
            aen: Mutex::new(AenState {
                config: 0,
                pending: VecDeque::new(),
                waiting: VecDeque::new(),
                tx: None,
            }),
            changed: Mutex::new(Vec::new()),
            resv_log: Default::default(),
            dead: self.shutdown.child_token(),
        });
        cs.by_id.insert(cntlid, c.clone());
        drop(cs);
        let t = self.clone();
        let w = c.clone();
        tokio::spawn(async move { keep_alive_watch(t, w).await });
        Some(c)
    }
    /// The port a queue of `transport` arriving at local address `local` came through: the
    /// listener on that address, or on any address at that port number; 0 when none is.
    pub fn port_of(&self, transport: Transport, local: Option<SocketAddr>) -> u16 {
        let Some(l) = local else { return 0 };
        let ports = self.ports.lock();
        let on = |exact: bool| {
            (ports.iter())
                .filter(|p| p.transport == transport && p.addr.port() == l.port())
                .find(|p| match exact {
                    true => p.addr.ip() == l.ip(),
                    false => p.addr.ip().is_unspecified(),
                })
                .map(|p| p.id)
        };
        on(true).or_else(|| on(false)).unwrap_or(0)
    }
    pub fn drop_controller(&self, c: &Controller) {
        c.dead.cancel();
        c.subsys.controllers.lock().by_id.remove(&c.cntlid);
    }
    pub fn discovery_changed(&self) {
        self.genctr.fetch_add(1, Ordering::Relaxed);
        let all: Vec<_> = self
            .discovery
            .controllers
            .lock()
            .by_id
            .values()
            .cloned()
            .collect();
        for c in all {
            c.event(AEN_DISCOVERY_CHANGED, AEC_DISCOVERY);
        }
    }
}

/// Tears a controller down when the host stays silent past its keep-alive timeout.
async fn keep_alive_watch(t: Arc<Inner>, c: Arc<Controller>) {
    loop {
        let kato = c.kato_ms.load(Ordering::Relaxed) as u64;
        let period = if kato == 0 { 1000 } else { (kato / 2).max(100) };
        tokio::select! {
            _ = c.dead.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(period)) => {}
        }
        if kato == 0 {
            continue;
        }
        let idle = t
            .now_ms()
            .saturating_sub(c.last_seen.load(Ordering::Relaxed));
        if idle > kato + t.cfg.keep_alive_grace.as_millis() as u64 {
            tracing::warn!(
                cntlid = c.cntlid,
                host = %c.hostnqn,
                "the host sent nothing for {idle} ms (keep-alive timeout {kato} ms); dropping its controller"
            );
            t.drop_controller(&c);
            return;
        }
    }
}
