//! Serving a [`Target`] over NVMe/RDMA: an RDMA CM listener whose queues each get a session of
//! the target (the same subsystems, allow-lists and namespaces as NVMe/TCP) and run on a core
//! of the data path (the target's, as NVMe/TCP's connections do, or one of the listener's own),
//! a data pool registered once with each device, and the listener named in the target's
//! discovery log while it serves.

use crate::port::{self, PortConfig, PortStats, QueueFactory};
use crate::queue::Deadlines;
use crate::session::SessionCommands;
use crate::wire::QueueLimits;
use millrace_io::{BufPool, Cores, CoresConfig, PoolConfig};
use millrace_nvmf::{Target, Transport, TransportInfo};
use millrace_rdma::cm::Listener;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The pool the RDMA queues move data through, registered once per device: it bounds the data
/// of all reads and writes in flight over RDMA together.
pub const DEFAULT_POOL_BYTES: usize = 128 << 20;

/// Makes each new queue's session.
struct Queues {
    target: Target,
    pool: BufPool,
    transport: TransportInfo,
}

impl QueueFactory for Queues {
    type C = SessionCommands;
    fn open(&self, peer: SocketAddr, local: Option<SocketAddr>) -> SessionCommands {
        let s =
            (self.target.session(peer, local)).with_transport(self.transport, self.pool.clone());
        SessionCommands::new(s, self.pool.clone())
    }
}

/// A running NVMe/RDMA listener. Dropping it stops accepting (open queues end with the target's
/// shutdown or their hosts).
pub struct RdmaListener {
    addr: SocketAddr,
    stats: Arc<PortStats>,
    stop: CancellationToken,
}

impl RdmaListener {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
    /// Queues open now, queues accepted since start, connect requests refused by the transport.
    pub fn queues(&self) -> (usize, u64, u64) {
        let s = &self.stats;
        (
            s.queues_open.load(Ordering::Relaxed),
            s.queues_total.load(Ordering::Relaxed),
            s.refused.load(Ordering::Relaxed),
        )
    }
    /// Queues closed because their host missed a deadline, and commands in flight when their
    /// queue ended (the host hung up, reset, failed or timed out).
    pub fn hangups(&self) -> (u64, u64) {
        let s = &self.stats;
        (
            s.timeouts.load(Ordering::Relaxed),
            s.abandoned.load(Ordering::Relaxed),
        )
    }
}

impl Drop for RdmaListener {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Serves `target` over NVMe/RDMA on `addr` (port 4420 is the standard one), in tasks of the
/// current tokio runtime. Fails with a sentence where the host has no RDMA device, no
/// rdma-core libraries, or no RDMA device with this address; nothing else is touched then.
pub fn listen(
    target: &Target,
    addr: SocketAddr,
    pool_bytes: usize,
) -> Result<RdmaListener, millrace_rdma::Error> {
    if !millrace_rdma::devices::any() {
        return Err(millrace_rdma::Error::NoDevice);
    }
    let max_transfer = target.config().max_transfer_bytes as usize;
    let pool = BufPool::new(&PoolConfig {
        bytes: pool_bytes.max(max_transfer * 4),
        slices: 1,
        max_buf: max_transfer,
        populate: false,
    })
    .map_err(|e| {
        millrace_rdma::Error::Invalid(format!(
            "cannot map the NVMe/RDMA buffer pool of {pool_bytes} bytes: {e}"
        ))
    })?;
    listen_with_pool(target, addr, pool)
}

/// As [`listen`], with the data path's shared pool (`millrace serve` gives the one NVMe/TCP
/// and NBD use, so one bound covers every export): it is registered with each RDMA device,
/// and its largest buffer caps the transfer size. The queues run on the target's cores
/// (`Target::set_data_path`), whose pool this must be; a target given none gets one core of
/// the listener's own, which stops with the listener (and its queues with it).
pub fn listen_with_pool(
    target: &Target,
    addr: SocketAddr,
    pool: BufPool,
) -> Result<RdmaListener, millrace_rdma::Error> {
    if !millrace_rdma::devices::any() {
        return Err(millrace_rdma::Error::NoDevice);
    }
    let cores = match target.cores() {
        Some(c) => c,
        None => Arc::new(
            Cores::start(CoresConfig {
                cores: 1,
                pool: Some(pool.clone()),
                ..CoresConfig::default()
            })
            .map_err(|e| {
                millrace_rdma::Error::Invalid(format!(
                    "cannot start a core for the NVMe/RDMA queues: {e}"
                ))
            })?,
        ),
    };
    let listener = Listener::bind(addr, 128)?;
    let at = listener.local_addr();
    let cfg = target.config();
    let max_transfer = (cfg.max_transfer_bytes as usize).min(pool.max_buf());
    let pc = PortConfig {
        limits: QueueLimits {
            admin_depth: cfg.admin_queue_depth,
            io_depth: cfg.max_queue_depth,
            max_qid: cfg.max_io_queues,
        },
        in_capsule: cfg.in_capsule_bytes as usize,
        max_transfer,
        max_queues: cfg.max_connections,
        max_queues_per_address: cfg.max_connections_per_address,
        // The same limits as NVMe/TCP's: a READ of write data is the PDU that must arrive
        // whole, a response SEND the reply the host must take.
        deadlines: Deadlines {
            handshake: cfg.handshake_timeout,
            transfer: cfg.pdu_timeout,
            reply: cfg.reply_timeout,
        },
    };
    let transport = TransportInfo {
        kind: Transport::Rdma,
        in_capsule: cfg.in_capsule_bytes,
    };
    let factory = Arc::new(Queues {
        target: target.clone(),
        pool: pool.clone(),
        transport,
    });
    let stats = Arc::new(PortStats::default());
    let stop = target.shutdown_token().child_token();
    let guard = target.add_listener(Transport::Rdma, at);
    {
        let (stats, stop) = (stats.clone(), stop.clone());
        tokio::spawn(async move {
            let _named = guard;
            if let Err(e) = port::serve(listener, pool, cores, pc, factory, stats, stop).await {
                tracing::error!(addr = %at, "NVMe/RDMA stopped serving: {e}");
            }
        });
    }
    tracing::info!(addr = %at, "serving NVMe/RDMA");
    Ok(RdmaListener {
        addr: at,
        stats,
        stop,
    })
}
