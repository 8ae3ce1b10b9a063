//! An NVMe/RDMA port: the RDMA CM listener, the per-device resources (protection domain, the
//! data pool registered once, the device's limits), and the accept path. Each connect request
//! is handed to a core of the data path (docs/DATAPATH.md), the one with the fewest tasks,
//! where the queue stays: there it is decided on before any queue resource exists, then its
//! completion queue is made (its channel in that core's reactor), its receives posted, it is
//! accepted, and it runs. Its commands' device calls are the `*_async` ones, completing on that
//! core; its data buffers come from that core's slice of the registered pool.

use crate::accept::{self, Offer};
use crate::commands::Commands;
use crate::queue::{Parts, Queue, Stop};
use crate::regpool::RegisteredPool;
use crate::sizing::CQE_BYTES;
use crate::wire::{self, QueueLimits, RejectReason};
use millrace_io::{BufPool, Cores};
use millrace_rdma::cm::{AcceptParams, CmId, ConnectRequest, Listener};
use millrace_rdma::verbs::{CompletionQueue, Context, DeviceAttr, ProtectionDomain};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Makes the target's side of each new queue.
pub trait QueueFactory: Send + Sync + 'static {
    type C: Commands;
    fn open(&self, peer: SocketAddr, local: Option<SocketAddr>) -> Self::C;
}

#[derive(Clone, Copy, Debug)]
pub struct PortConfig {
    pub limits: QueueLimits,
    /// In-capsule data an I/O queue takes (IOCCSZ * 16 - 64 in Identify).
    pub in_capsule: usize,
    pub max_transfer: usize,
    /// Most queues (connections) at once on this port.
    pub max_queues: usize,
}

/// Counters for status pages.
#[derive(Default)]
pub struct PortStats {
    pub queues_open: AtomicUsize,
    pub queues_total: AtomicU64,
    pub refused: AtomicU64,
}

#[derive(Clone)]
struct Device {
    pool: Arc<RegisteredPool>,
    attr: DeviceAttr,
    pd: Arc<ProtectionDomain>,
}

/// Serves NVMe/RDMA on `listener` until `shutdown`, each queue on one of `cores` (whose pool
/// should be `pool`, so each core's buffers come from its own slice).
pub async fn serve<F: QueueFactory>(
    listener: Listener,
    pool: BufPool,
    cores: Arc<Cores>,
    cfg: PortConfig,
    factory: Arc<F>,
    stats: Arc<PortStats>,
    shutdown: CancellationToken,
) -> Result<(), millrace_rdma::Error> {
    let mut devices: HashMap<Context, Device> = HashMap::new();
    loop {
        let req = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            r = listener.accept() => r?,
        };
        let ctx = req.id.context();
        let dev = match devices.get(&ctx) {
            Some(d) => d,
            None => match open_device(ctx, &pool) {
                Ok(d) => devices.entry(ctx).or_insert(d),
                Err(e) => {
                    tracing::error!("cannot use RDMA device {}: {e}", ctx.name());
                    refuse(&req.id, RejectReason::NoResources, &stats);
                    continue;
                }
            },
        };
        if stats.queues_open.load(Ordering::Relaxed) >= cfg.max_queues {
            refuse(&req.id, RejectReason::NoResources, &stats);
            continue;
        }
        // Counted open from now, so the limit holds while queues start on their cores.
        stats.queues_open.fetch_add(1, Ordering::Relaxed);
        let (dev, factory, stats) = (dev.clone(), factory.clone(), stats.clone());
        cores.spawn(move || async move {
            match start_queue(req, &dev, &cfg, factory.as_ref(), &stats) {
                Ok(q) => run_queue(q, &stats).await,
                Err(r) => tracing::info!("NVMe/RDMA connect refused: {}", r.describe()),
            }
            stats.queues_open.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Serves an accepted queue on this core until it ends.
async fn run_queue<C: Commands>(q: Queue<C>, stats: &PortStats) {
    let peer = q.id().peer_addr();
    stats.queues_total.fetch_add(1, Ordering::Relaxed);
    match q.run().await {
        Stop::Closed => tracing::debug!(?peer, "NVMe/RDMA queue closed"),
        Stop::Fatal(why) => tracing::warn!(?peer, "NVMe/RDMA queue closed: {why}"),
    }
}

fn open_device(ctx: Context, pool: &BufPool) -> Result<Device, millrace_rdma::Error> {
    let attr = ctx.query()?;
    let pd = ctx.alloc_pd()?;
    let pool = Arc::new(RegisteredPool::new(&pd, pool)?);
    tracing::info!(device = %ctx.name(), "NVMe/RDMA: the buffer pool is registered with the device");
    Ok(Device { pool, attr, pd })
}

fn refuse(id: &CmId, r: RejectReason, stats: &PortStats) {
    stats.refused.fetch_add(1, Ordering::Relaxed);
    let peer = id.peer_addr();
    tracing::info!(?peer, "rejecting an NVMe/RDMA connect: {}", r.describe());
    if let Err(e) = id.reject(&wire::reject_data(r)) {
        tracing::warn!("rdma_reject failed: {e}");
    }
}

/// Decides, builds and accepts one queue (on the core it will run on: its completion channel
/// joins this core's reactor); on refusal the request is rejected with the reason.
fn start_queue<F: QueueFactory>(
    req: ConnectRequest,
    dev: &Device,
    cfg: &PortConfig,
    factory: &F,
    stats: &PortStats,
) -> Result<Queue<F::C>, RejectReason> {
    let ConnectRequest {
        mut id,
        private_data,
        initiator_depth,
        responder_resources,
    } = req;
    let offer = Offer {
        private_data: &private_data,
        host_responder_resources: initiator_depth,
    };
    let a = match accept::decide(&offer, &cfg.limits, &dev.attr, cfg.in_capsule) {
        Ok(a) => a,
        Err(r) => {
            refuse(&id, r, stats);
            return Err(r);
        }
    };
    let plan = a.plan;
    let built = (|| {
        let cq = CompletionQueue::new(id.context(), plan.cq_entries)?;
        let qp = id.create_qp(&dev.pd, &cq, plan.caps)?;
        let recv = dev
            .pd
            .register_new(plan.recv_slots as usize * plan.recv_bytes)?;
        let rsp = dev.pd.register_new(plan.cmd_slots as usize * CQE_BYTES)?;
        Ok::<_, millrace_rdma::Error>((cq, qp, recv, rsp))
    })();
    let (cq, qp, recv, rsp) = match built {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!("cannot build an NVMe/RDMA queue: {e}");
            refuse(&id, RejectReason::NoResources, stats);
            return Err(RejectReason::NoResources);
        }
    };
    let peer = id
        .peer_addr()
        .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
    let local = id.local_addr();
    let responder = responder_resources.min(dev.attr.max_qp_rd_atom);
    let cmds = factory.open(peer, local);
    let parts = Parts {
        id,
        qp,
        cq,
        recv,
        rsp,
    };
    let q = match Queue::new(parts, dev.pool.clone(), plan, cmds, cfg.max_transfer) {
        Ok(q) => q,
        Err(_) => return Err(RejectReason::NoResources),
    };
    let params = AcceptParams {
        private_data: &a.reply,
        initiator_depth: plan.max_reads,
        responder_resources: responder,
    };
    if let Err(e) = q.id().accept(&params) {
        tracing::warn!(%peer, "rdma_accept failed: {e}");
        return Err(RejectReason::NoResources);
    }
    tracing::info!(%peer, qid = a.sizes.qid, core = ?millrace_io::current_core(), depth = a.sizes.recv, "NVMe/RDMA queue accepted");
    Ok(q)
}
