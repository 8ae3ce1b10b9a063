//! /metrics in the Prometheus text format. Pool and member figures are read fresh at each
//! scrape; per-volume latency comes from the exports' metered devices.

use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Metric, Registry};

use crate::state::{PoolEntry, State};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolL {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateL {
    pool: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberL {
    pool: String,
    member: String,
    path: String,
    state: String,
}

/// A member slot's I/O counters carry no state label, so a failure does not split the series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberIoL {
    pool: String,
    member: String,
    path: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProtoL {
    protocol: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransportL {
    transport: String,
}

/// A family registered under `name`; series appear as they are first set.
fn family<L, M>(reg: &mut Registry, name: &str, help: &str) -> Family<L, M>
where
    Family<L, M>: Metric + Clone + Default,
{
    let f = Family::<L, M>::default();
    reg.register(name, help, f.clone());
    f
}

type Ratio = Gauge<f64, std::sync::atomic::AtomicU64>;

/// The per-pool and per-member families, in the order /metrics lists them.
struct PoolFamilies {
    rb: Family<PoolL, Counter>,
    wb: Family<PoolL, Counter>,
    ro: Family<PoolL, Counter>,
    wo: Family<PoolL, Counter>,
    dr: Family<PoolL, Counter>,
    me: Family<PoolL, Counter>,
    size: Family<PoolL, Gauge>,
    pstate: Family<StateL, Gauge>,
    mstate: Family<MemberL, Gauge>,
    rebuild: Family<PoolL, Ratio>,
    scrub: Family<PoolL, Ratio>,
    mrb: Family<MemberIoL, Counter>,
    mwb: Family<MemberIoL, Counter>,
    mro: Family<MemberIoL, Counter>,
    mwo: Family<MemberIoL, Counter>,
    merr: Family<MemberIoL, Counter>,
    vols: Family<PoolL, Gauge>,
}

impl PoolFamilies {
    fn register(reg: &mut Registry) -> Self {
        let r = reg;
        PoolFamilies {
            rb: family(r, "millrace_pool_read_bytes", "Bytes read from the pool"),
            wb: family(r, "millrace_pool_write_bytes", "Bytes written to the pool"),
            ro: family(
                r,
                "millrace_pool_read_ops",
                "Read requests served by the pool",
            ),
            wo: family(
                r,
                "millrace_pool_write_ops",
                "Write requests served by the pool",
            ),
            dr: family(
                r,
                "millrace_pool_degraded_reads",
                "Reads that rebuilt data from parity or a mirror",
            ),
            me: family(
                r,
                "millrace_pool_member_errors",
                "I/O errors returned by members",
            ),
            size: family(r, "millrace_pool_size_bytes", "Usable size of the pool"),
            pstate: family(
                r,
                "millrace_pool_state",
                "1 for the pool's current state (online, degraded, rebuilding, offline)",
            ),
            mstate: family(
                r,
                "millrace_member_state",
                "1 for each member's current state (online, faulty, spare, rebuilding, missing)",
            ),
            rebuild: family(
                r,
                "millrace_rebuild_progress_ratio",
                "Share of the rebuild done (0 to 1), while one is under way",
            ),
            scrub: family(
                r,
                "millrace_scrub_progress_ratio",
                "Share of the running scrub done (0 to 1)",
            ),
            mrb: family(
                r,
                "millrace_member_read_bytes",
                "Bytes read from a member drive (data, parity, rebuild and scrub reads)",
            ),
            mwb: family(
                r,
                "millrace_member_write_bytes",
                "Bytes written to a member drive",
            ),
            mro: family(
                r,
                "millrace_member_read_ops",
                "Reads issued to a member drive",
            ),
            mwo: family(
                r,
                "millrace_member_write_ops",
                "Writes issued to a member drive",
            ),
            merr: family(
                r,
                "millrace_member_errors",
                "I/O errors a member drive returned",
            ),
            vols: family(r, "millrace_pool_volumes", "Volumes in the pool"),
        }
    }

    fn observe(&self, e: &PoolEntry) {
        let info = e.pool.info();
        let l = PoolL {
            pool: info.name.clone(),
        };
        let s = &e.pool.array().stats;
        self.rb.get_or_create(&l).inc_by(s.read_bytes.load(Relaxed));
        self.wb
            .get_or_create(&l)
            .inc_by(s.write_bytes.load(Relaxed));
        self.ro.get_or_create(&l).inc_by(s.read_ops.load(Relaxed));
        self.wo.get_or_create(&l).inc_by(s.write_ops.load(Relaxed));
        self.dr
            .get_or_create(&l)
            .inc_by(s.degraded_reads.load(Relaxed));
        self.me
            .get_or_create(&l)
            .inc_by(s.member_errors.load(Relaxed));
        self.size.get_or_create(&l).set(info.size_bytes as i64);
        self.vols
            .get_or_create(&l)
            .set(e.volumes.list().len() as i64);
        let word = (info.state.split_whitespace().next())
            .unwrap_or("unknown")
            .to_string();
        self.pstate
            .get_or_create(&StateL {
                pool: info.name.clone(),
                state: word,
            })
            .set(1);
        for m in &info.members {
            self.observe_member(e, &info.name, m);
        }
        if let Some(r) = &info.rebuild {
            self.rebuild.get_or_create(&l).set(r.percent / 100.0);
        }
    }

    fn observe_member(&self, e: &PoolEntry, pool: &str, m: &millrace_array::pool::MemberInfo) {
        if let Some(ms) = e.pool.array().member_stats.get(m.index) {
            let l = MemberIoL {
                pool: pool.to_string(),
                member: m.index.to_string(),
                path: m.path.clone().unwrap_or_default(),
            };
            self.mrb
                .get_or_create(&l)
                .inc_by(ms.read_bytes.load(Relaxed));
            self.mwb
                .get_or_create(&l)
                .inc_by(ms.write_bytes.load(Relaxed));
            self.mro.get_or_create(&l).inc_by(ms.read_ops.load(Relaxed));
            self.mwo
                .get_or_create(&l)
                .inc_by(ms.write_ops.load(Relaxed));
            self.merr.get_or_create(&l).inc_by(ms.errors.load(Relaxed));
        }
        let st = serde_json::to_value(m.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| format!("{:?}", m.state).to_lowercase());
        self.mstate
            .get_or_create(&MemberL {
                pool: pool.to_string(),
                member: m.index.to_string(),
                path: m.path.clone().unwrap_or_default(),
                state: st,
            })
            .set(1);
    }

    fn observe_scrubs(&self, state: &State) {
        for j in state.jobs.list() {
            if j.kind == "scrub" && j.state == "running" {
                let l = PoolL {
                    pool: j.pool.clone(),
                };
                self.scrub.get_or_create(&l).set(j.percent / 100.0);
            }
        }
    }
}

/// The exports' per-volume meters and their connection counts.
fn register_exports(reg: &mut Registry, state: &State) {
    reg.register(
        "millrace_volume_io_seconds",
        "Latency of requests the exports make of a volume",
        state.meters.latency.clone(),
    );
    reg.register(
        "millrace_volume_io_bytes",
        "Bytes moved by the exports' requests to a volume",
        state.meters.bytes.clone(),
    );
    reg.register(
        "millrace_volume_inflight_requests",
        "Requests of a volume being served now (the queue depth)",
        state.meters.inflight.clone(),
    );
    let conns: Family<ProtoL, Gauge> = family(
        reg,
        "millrace_export_connections",
        "Client connections open now",
    );
    let opened: Family<ProtoL, Counter> = family(
        reg,
        "millrace_export_connections_opened",
        "Client connections accepted since start",
    );
    let refused: Family<ProtoL, Counter> = family(
        reg,
        "millrace_export_connections_refused",
        "Client connections refused (host not allowed, over the limit)",
    );
    let abandoned: Family<ProtoL, Counter> = family(
        reg,
        "millrace_export_requests_abandoned",
        "Requests in flight when their connection ended (the client hung up, reset or failed, or the server closed it): finished on the volume, buffers returned, no reply sent",
    );
    let n = state.nvmf.stats();
    let b = state.nbd.stats();
    let (rdma_timeouts, rdma_abandoned) = (state.nvme_rdma.lock().iter())
        .map(|l| l.hangups())
        .fold((0, 0), |(t, a), (lt, la)| (t + lt, a + la));
    let timeouts: Family<ProtoL, Counter> = family(
        reg,
        "millrace_export_connections_timed_out",
        "Client connections closed because the client did not finish a handshake, a transfer or take a reply in time",
    );
    for (protocol, k) in [("nvme-tcp", n.timeouts), ("nvme-rdma", rdma_timeouts)] {
        let l = ProtoL {
            protocol: protocol.into(),
        };
        timeouts.get_or_create(&l).inc_by(k);
    }
    let transports = [
        ("nvme-tcp", n.abandoned),
        ("nvme-rdma", rdma_abandoned),
        ("nbd", b.abandoned),
    ];
    for (protocol, k) in transports {
        let l = ProtoL {
            protocol: protocol.into(),
        };
        abandoned.get_or_create(&l).inc_by(k);
    }
    let figures = [
        (
            "nvme-tcp",
            n.connections_open,
            n.connections_total,
            n.connections_refused,
        ),
        (
            "nbd",
            b.connections_open,
            b.connections_total,
            b.connections_refused,
        ),
    ];
    for (protocol, open, total, refused_n) in figures {
        let l = ProtoL {
            protocol: protocol.into(),
        };
        conns.get_or_create(&l).set(open as i64);
        opened.get_or_create(&l).inc_by(total);
        refused.get_or_create(&l).inc_by(refused_n);
    }
    register_nvme_rdma(reg, state, &conns, &opened, &refused);
    register_ana(reg, state);
    register_reservations(reg, state);
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NsL {
    subsystem: String,
    nsid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HeldL {
    subsystem: String,
    nsid: String,
    r#type: String,
    holder: String,
}

/// Each namespace's registered hosts, and the reservation held (1, with its type and holder:
/// a host NQN, or "all-registrants").
fn register_reservations(reg: &mut Registry, state: &State) {
    let registrants: Family<NsL, Gauge> = family(
        reg,
        "millrace_nvme_reservation_registrants",
        "Hosts registered for persistent reservations with each NVMe namespace",
    );
    let held: Family<HeldL, Gauge> = family(
        reg,
        "millrace_nvme_reservation_held",
        "The persistent reservation held on an NVMe namespace (1), with its type and holder",
    );
    for s in state.nvmf.subsystems() {
        for (nsid, st) in state.nvmf.reservations(&s.nqn).unwrap_or_default() {
            let l = NsL {
                subsystem: s.nqn.clone(),
                nsid: nsid.to_string(),
            };
            registrants
                .get_or_create(&l)
                .set(st.registrants.len() as i64);
            let Some(t) = st.rtype else { continue };
            let holder = (st.holder.as_ref())
                .and_then(|h| st.registrants.iter().find(|r| r.hostid == *h))
                .map_or("all-registrants".to_string(), |r| r.hostnqn.clone());
            let l = HeldL {
                subsystem: s.nqn.clone(),
                nsid: nsid.to_string(),
                r#type: t.as_str().into(),
                holder,
            };
            held.get_or_create(&l).set(1);
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AnaL {
    subsystem: String,
    transport: String,
    listener: String,
    group: String,
    state: String,
}

/// Each path's ANA state per subsystem and group: 1 for the state it is in.
fn register_ana(reg: &mut Registry, state: &State) {
    let ana: Family<AnaL, Gauge> = family(
        reg,
        "millrace_nvme_ana_state",
        "The ANA state of each NVMe-oF path (listener) to each ANA group of a subsystem: 1 for the state it is in",
    );
    for s in state.nvmf.subsystems() {
        for p in &s.paths {
            let l = AnaL {
                subsystem: s.nqn.clone(),
                transport: p.transport.as_str().into(),
                listener: p.listener.to_string(),
                group: p.ana_group.to_string(),
                state: p.state.as_str().into(),
            };
            ana.get_or_create(&l).set(1);
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuthL {
    subsystem: String,
    result: String,
}

/// In-band authentications (DH-HMAC-CHAP) per subsystem, succeeded and failed.
fn register_auth(reg: &mut Registry, state: &State) {
    let auth: Family<AuthL, Counter> = family(
        reg,
        "millrace_nvme_auth",
        "DH-HMAC-CHAP authentications of hosts per NVMe subsystem, by result (succeeded, failed)",
    );
    for i in state.nvmf.auth_info() {
        for (result, n) in [("succeeded", i.succeeded), ("failed", i.failed)] {
            let l = AuthL {
                subsystem: i.nqn.clone(),
                result: result.into(),
            };
            auth.get_or_create(&l).inc_by(n);
        }
    }
}

/// NVMe/RDMA: queues (RDMA connections) of every listener; refusals, by the transport and by
/// the target (a Connect over RDMA refused: each counted under the transport it came on); and
/// the hosts connected per transport.
fn register_nvme_rdma(
    reg: &mut Registry,
    state: &State,
    conns: &Family<ProtoL, Gauge>,
    opened: &Family<ProtoL, Counter>,
    refused: &Family<ProtoL, Counter>,
) {
    let rdma = ProtoL {
        protocol: "nvme-rdma".into(),
    };
    let (mut open, mut total, mut refused_rdma) = (0i64, 0u64, 0u64);
    for l in state.nvme_rdma.lock().iter() {
        let (o, t, r) = l.queues();
        open += o as i64;
        total += t;
        refused_rdma += r;
    }
    refused_rdma += state.nvmf.stats().connects_refused_rdma;
    conns.get_or_create(&rdma).set(open);
    opened.get_or_create(&rdma).inc_by(total);
    refused.get_or_create(&rdma).inc_by(refused_rdma);
    let hosts: Family<TransportL, Gauge> = family(
        reg,
        "millrace_nvme_hosts",
        "Hosts connected to the NVMe-oF target now (controllers), per transport",
    );
    let per = millrace_service::rdma::hosts_per_transport(&state.nvmf);
    for (t, n) in [("tcp", per.tcp), ("rdma", per.rdma)] {
        let l = TransportL {
            transport: t.into(),
        };
        hosts.get_or_create(&l).set(n as i64);
    }
    let tls = Gauge::<i64>::default();
    let n = (state.nvmf.subsystems().iter())
        .flat_map(|s| s.hosts.iter())
        .filter(|h| h.tls)
        .count();
    tls.set(n as i64);
    reg.register(
        "millrace_nvme_tls_hosts",
        "Hosts connected to the NVMe-oF target now (controllers) whose admin queue came over TLS",
        tls,
    );
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BufL {
    state: String,
}

/// The data path's buffer pool (the bound on request payload memory) and the process's RSS.
fn register_data_path(reg: &mut Registry, state: &State) {
    if let Some(rss) = crate::datapath::rss_bytes() {
        let g = Gauge::<i64>::default();
        g.set(rss as i64);
        reg.register(
            "millrace_process_resident_bytes",
            "Resident memory of the server process (VmRSS)",
            g,
        );
    }
    let Some(dp) = state.data_path.get() else {
        return;
    };
    let u = dp.usage();
    let bytes: Family<BufL, Gauge> = family(
        reg,
        "millrace_buffer_pool_bytes",
        "The data path's buffer pool: capacity, in use now, and the most ever in use",
    );
    for (s, v) in [
        ("capacity", u.capacity_bytes),
        ("in_use", u.in_use_bytes),
        ("peak", u.peak_bytes),
    ] {
        bytes.get_or_create(&BufL { state: s.into() }).set(v as i64);
    }
    let c = |name: &str, help: &str, v: u64| {
        let k = Counter::<u64>::default();
        k.inc_by(v);
        (name.to_string(), help.to_string(), k)
    };
    for (name, help, k) in [
        c(
            "millrace_buffer_pool_gets",
            "Buffers handed out by the pool",
            u.gets,
        ),
        c(
            "millrace_buffer_pool_waits",
            "Requests that waited for buffer space (back-pressure)",
            u.waits,
        ),
        c(
            "millrace_buffer_pool_refused",
            "Requests larger than the pool's largest buffer",
            u.refused,
        ),
    ] {
        reg.register(name, help, k);
    }
    register_rings(reg, dp);
}

/// The cores' io_uring: member operations, submissions (system calls) and completion rounds,
/// and io_uring's worker threads alive now (entries the kernel could not issue inline).
fn register_rings(reg: &mut Registry, dp: &crate::datapath::DataPath) {
    let (mut entries, mut submits, mut reaps) = (0, 0, 0);
    for i in 0..dp.cores.len() {
        let st = dp.cores.ring_stats(i);
        entries += st.entries.load(Relaxed);
        submits += st.submits.load(Relaxed);
        reaps += st.reaps.load(Relaxed);
    }
    for (name, help, v) in [
        (
            "millrace_ring_entries",
            "Member operations the cores queued on their io_uring",
            entries,
        ),
        (
            "millrace_ring_submits",
            "io_uring_enter calls that submitted them (one per scheduler round that had any)",
            submits,
        ),
        (
            "millrace_ring_reaps",
            "Rounds in which the cores reaped completions",
            reaps,
        ),
    ] {
        let k = Counter::<u64>::default();
        k.inc_by(v);
        reg.register(name, help, k);
    }
    let w = Gauge::<i64>::default();
    w.set(millrace_io::io_wq_workers() as i64);
    reg.register(
        "millrace_io_wq_workers",
        "io_uring worker threads alive now: entries the kernel could not issue without blocking were handed to them (none expected on O_DIRECT block devices)",
        w,
    );
}

pub fn render(state: &State) -> String {
    let mut reg = Registry::default();
    let pools = PoolFamilies::register(&mut reg);
    for e in state.entries() {
        pools.observe(&e);
    }
    pools.observe_scrubs(state);
    register_exports(&mut reg, state);
    register_auth(&mut reg, state);
    register_data_path(&mut reg, state);
    crate::rdma::register_metrics(&mut reg);
    let up = Ratio::default();
    up.set(state.started.elapsed().as_secs_f64());
    reg.register(
        "millrace_uptime_seconds",
        "Seconds since the server started",
        up,
    );
    register_lifecycle(&mut reg, state);
    let mut out = String::new();
    encode(&mut out, &reg).expect("writing to a String cannot fail");
    out
}

/// When this server started and what it found: a restart after a crash shows as a recent start
/// with the previous stop unclean and the pools it left in use.
fn register_lifecycle(reg: &mut Registry, state: &State) {
    let g = |v: i64| {
        let k = Gauge::<i64>::default();
        k.set(v);
        k
    };
    reg.register(
        "millrace_server_start_time_seconds",
        "When this server started, in seconds since the Unix epoch",
        g(state.started_unix as i64),
    );
    reg.register(
        "millrace_server_previous_stop_unclean",
        "1 when the server before this one on this home did not stop in order (a crash or a kill)",
        g(state.previous_stop_unclean as i64),
    );
    reg.register(
        "millrace_pools_found_unclean",
        "Pools found recorded in use when this server took them into service (resynced)",
        g(state.found_unclean.read().len() as i64),
    );
}
