//! An NVMe/RDMA port: the RDMA CM listener, the per-device resources (protection domain, the
//! data pool registered once, the device's limits), and the accept path. Each connect request
//! is handed to a core of the data path (docs/DATAPATH.md), the one with the fewest tasks,
//! where the queue stays: there it is decided on before any queue resource exists, then its
//! completion queue is made (its channel in that core's reactor), its receives posted, it is
//! accepted, and it runs. Its commands' device calls are the `*_async` ones, completing on that
//! core; its data buffers come from that core's slice of the registered pool.
//!
//! Queues are admitted as NVMe/TCP's connections are (`millrace_io::admission`): at most
//! `max_queues` in all and `max_queues_per_address` from one address, each host's data buffers
//! within its share of the pool (the session's), so many hosts at once, or one with many
//! queues, cannot take what the others need. What ends a queue is counted (timeouts, commands
//! abandoned) and logged at most once a second per kind, with a count of the lines held back,
//! so hosts that hang up by the hundred cannot flood the log.

use crate::accept::{self, Offer};
use crate::commands::Commands;
use crate::queue::{Deadlines, Ended, Parts, Queue, Stop};
use crate::regpool::RegisteredPool;
use crate::sizing::CQE_BYTES;
use crate::wire::{self, QueueLimits, RejectReason};
use millrace_io::admission::{AcceptBackoff, Admission, RateLimit};
use millrace_io::{BufPool, Cores};
use millrace_rdma::cm::{AcceptParams, CmId, ConnectRequest, Listener};
use millrace_rdma::verbs::{CompletionQueue, Context, DeviceAttr, ProtectionDomain};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
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
    /// Most queues at once from one IP address (a host opens one per queue).
    pub max_queues_per_address: usize,
    pub deadlines: Deadlines,
}

/// Counters for status pages.
#[derive(Default)]
pub struct PortStats {
    pub queues_open: AtomicUsize,
    pub queues_total: AtomicU64,
    pub refused: AtomicU64,
    /// Queues closed because the host missed a deadline (Connect, a READ, a response).
    pub timeouts: AtomicU64,
    /// Commands in flight when their queue ended: finished on the volume, no response sent.
    pub abandoned: AtomicU64,
    /// Refused connect requests are logged at a bounded rate ...
    pub refusal_log: RateLimit,
    /// ... and so are queues that end badly (a timeout, a failed transfer).
    pub close_log: RateLimit,
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
    let admission: Admission<IpAddr> = Admission::new(cfg.max_queues, cfg.max_queues_per_address);
    let mut backoff = AcceptBackoff::default();
    loop {
        let req = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            r = listener.accept() => match r {
                Ok(req) => req,
                // One request that could not be taken (out of descriptors for its event
                // channel, say) is refused; the listener goes on after a pause.
                Err(millrace_rdma::Error::Request(e)) => {
                    stats.refused.fetch_add(1, Ordering::Relaxed);
                    let wait = backoff.wait();
                    if let Some(n) = stats.refusal_log.allow() {
                        tracing::warn!("cannot take an NVMe/RDMA connect request ({n} more not logged): {e}; retrying in {wait:?}");
                    }
                    tokio::time::sleep(wait).await;
                    continue;
                }
                Err(e) => return Err(e),
            },
        };
        backoff.reset();
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
        // Held from now until the queue ends, so the limits hold while queues start on their
        // cores.
        let place = match admission.take(req.id.peer_addr().map(|a| a.ip())) {
            Ok(p) => p,
            Err(why) => {
                refuse_because(&req.id, RejectReason::NoResources, &why.to_string(), &stats);
                continue;
            }
        };
        stats.queues_open.fetch_add(1, Ordering::Relaxed);
        let (dev, factory, stats) = (dev.clone(), factory.clone(), stats.clone());
        cores.spawn(move || async move {
            let _place = place;
            if let Ok(q) = start_queue(req, &dev, &cfg, factory.as_ref(), &stats) {
                run_queue(q, &stats).await;
            }
            stats.queues_open.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Serves an accepted queue on this core until it ends.
async fn run_queue<C: Commands>(q: Queue<C>, stats: &PortStats) {
    let peer = q.id().peer_addr();
    stats.queues_total.fetch_add(1, Ordering::Relaxed);
    let Ended { why, abandoned } = q.run().await;
    if abandoned > 0 {
        stats
            .abandoned
            .fetch_add(abandoned as u64, Ordering::Relaxed);
    }
    match why {
        Stop::Closed => tracing::debug!(?peer, abandoned, "NVMe/RDMA queue closed"),
        Stop::Fatal(why) => {
            if let Some(n) = stats.close_log.allow() {
                tracing::warn!(
                    ?peer,
                    abandoned,
                    "NVMe/RDMA queue closed ({n} more closures not logged): {why}"
                );
            }
        }
        Stop::TimedOut(what) => {
            stats.timeouts.fetch_add(1, Ordering::Relaxed);
            if let Some(n) = stats.close_log.allow() {
                tracing::warn!(?peer, abandoned, "closing an NVMe/RDMA queue whose host did not {what} in time ({n} more closures not logged)");
            }
        }
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
    refuse_because(id, r, r.describe(), stats)
}

/// Rejects a connect request with reason `r` (the host's log shows it), counted, and logged
/// with `why` at most once a second.
fn refuse_because(id: &CmId, r: RejectReason, why: &str, stats: &PortStats) {
    stats.refused.fetch_add(1, Ordering::Relaxed);
    let peer = id.peer_addr();
    let logged = stats.refusal_log.allow();
    if let Some(n) = logged {
        tracing::info!(
            ?peer,
            "rejecting an NVMe/RDMA connect ({n} more refusals not logged): {why}"
        );
    }
    if let Err(e) = id.reject(&wire::reject_data(r)) {
        if logged.is_some() {
            tracing::warn!("rdma_reject failed: {e}");
        }
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
    let q = match Queue::new(
        parts,
        dev.pool.clone(),
        plan,
        cmds,
        cfg.max_transfer,
        cfg.deadlines,
    ) {
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
