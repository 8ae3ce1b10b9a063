//! /metrics in the Prometheus text format. Pool and member figures are read fresh at each
//! scrape; per-volume latency comes from the exports' metered devices.

use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::State;

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

fn counter(reg: &mut Registry, name: &str, help: &str) -> Family<PoolL, Counter> {
    let f = Family::<PoolL, Counter>::default();
    reg.register(name, help, f.clone());
    f
}

pub fn render(state: &State) -> String {
    let mut reg = Registry::default();
    let rb = counter(
        &mut reg,
        "millrace_pool_read_bytes",
        "Bytes read from the pool",
    );
    let wb = counter(
        &mut reg,
        "millrace_pool_write_bytes",
        "Bytes written to the pool",
    );
    let ro = counter(
        &mut reg,
        "millrace_pool_read_ops",
        "Read requests served by the pool",
    );
    let wo = counter(
        &mut reg,
        "millrace_pool_write_ops",
        "Write requests served by the pool",
    );
    let dr = counter(
        &mut reg,
        "millrace_pool_degraded_reads",
        "Reads that rebuilt data from parity or a mirror",
    );
    let me = counter(
        &mut reg,
        "millrace_pool_member_errors",
        "I/O errors returned by members",
    );
    let size = Family::<PoolL, Gauge>::default();
    reg.register(
        "millrace_pool_size_bytes",
        "Usable size of the pool",
        size.clone(),
    );
    let pstate = Family::<StateL, Gauge>::default();
    reg.register(
        "millrace_pool_state",
        "1 for the pool's current state (online, degraded, rebuilding, offline)",
        pstate.clone(),
    );
    let mstate = Family::<MemberL, Gauge>::default();
    reg.register(
        "millrace_member_state",
        "1 for each member's current state (online, faulty, spare, rebuilding, missing)",
        mstate.clone(),
    );
    let rebuild = Family::<PoolL, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    reg.register(
        "millrace_rebuild_progress_ratio",
        "Share of the rebuild done (0 to 1), while one is under way",
        rebuild.clone(),
    );
    let scrub = Family::<PoolL, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    reg.register(
        "millrace_scrub_progress_ratio",
        "Share of the running scrub done (0 to 1)",
        scrub.clone(),
    );
    let member_counter = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<MemberIoL, Counter>::default();
        reg.register(name, help, f.clone());
        f
    };
    let mrb = member_counter(
        &mut reg,
        "millrace_member_read_bytes",
        "Bytes read from a member drive (data, parity, rebuild and scrub reads)",
    );
    let mwb = member_counter(
        &mut reg,
        "millrace_member_write_bytes",
        "Bytes written to a member drive",
    );
    let mro = member_counter(
        &mut reg,
        "millrace_member_read_ops",
        "Reads issued to a member drive",
    );
    let mwo = member_counter(
        &mut reg,
        "millrace_member_write_ops",
        "Writes issued to a member drive",
    );
    let merr = member_counter(
        &mut reg,
        "millrace_member_errors",
        "I/O errors a member drive returned",
    );
    let vols = Family::<PoolL, Gauge>::default();
    reg.register("millrace_pool_volumes", "Volumes in the pool", vols.clone());
    for e in state.entries() {
        let info = e.pool.info();
        let l = PoolL {
            pool: info.name.clone(),
        };
        let s = &e.pool.array().stats;
        rb.get_or_create(&l).inc_by(s.read_bytes.load(Relaxed));
        wb.get_or_create(&l).inc_by(s.write_bytes.load(Relaxed));
        ro.get_or_create(&l).inc_by(s.read_ops.load(Relaxed));
        wo.get_or_create(&l).inc_by(s.write_ops.load(Relaxed));
        dr.get_or_create(&l).inc_by(s.degraded_reads.load(Relaxed));
        me.get_or_create(&l).inc_by(s.member_errors.load(Relaxed));
        size.get_or_create(&l).set(info.size_bytes as i64);
        vols.get_or_create(&l).set(e.volumes.list().len() as i64);
        let word = info
            .state
            .split_whitespace()
            .next()
            .unwrap_or("unknown")
            .to_string();
        pstate
            .get_or_create(&StateL {
                pool: info.name.clone(),
                state: word,
            })
            .set(1);
        for m in &info.members {
            if let Some(ms) = e.pool.array().member_stats.get(m.index) {
                let l = MemberIoL {
                    pool: info.name.clone(),
                    member: m.index.to_string(),
                    path: m.path.clone().unwrap_or_default(),
                };
                mrb.get_or_create(&l).inc_by(ms.read_bytes.load(Relaxed));
                mwb.get_or_create(&l).inc_by(ms.write_bytes.load(Relaxed));
                mro.get_or_create(&l).inc_by(ms.read_ops.load(Relaxed));
                mwo.get_or_create(&l).inc_by(ms.write_ops.load(Relaxed));
                merr.get_or_create(&l).inc_by(ms.errors.load(Relaxed));
            }
            let st = serde_json::to_value(m.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| format!("{:?}", m.state).to_lowercase());
            mstate
                .get_or_create(&MemberL {
                    pool: info.name.clone(),
                    member: m.index.to_string(),
                    path: m.path.clone().unwrap_or_default(),
                    state: st,
                })
                .set(1);
        }
        if let Some(r) = &info.rebuild {
            rebuild.get_or_create(&l).set(r.percent / 100.0);
        }
    }
    for j in state.jobs.list() {
        if j.kind == "scrub" && j.state == "running" {
            scrub
                .get_or_create(&PoolL {
                    pool: j.pool.clone(),
                })
                .set(j.percent / 100.0);
        }
    }
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
    let conns = Family::<ProtoL, Gauge>::default();
    reg.register(
        "millrace_export_connections",
        "Client connections open now",
        conns.clone(),
    );
    let conns_total = Family::<ProtoL, Counter>::default();
    reg.register(
        "millrace_export_connections_opened",
        "Client connections accepted since start",
        conns_total.clone(),
    );
    let refused = Family::<ProtoL, Counter>::default();
    reg.register(
        "millrace_export_connections_refused",
        "Client connections refused (host not allowed, over the limit)",
        refused.clone(),
    );
    let n = state.nvmf.stats();
    let nvme = ProtoL {
        protocol: "nvme-tcp".into(),
    };
    conns.get_or_create(&nvme).set(n.connections_open as i64);
    conns_total.get_or_create(&nvme).inc_by(n.connections_total);
    refused.get_or_create(&nvme).inc_by(n.connections_refused);
    // NVMe/RDMA: queues (RDMA connections) of every listener; refusals by the transport (the
    // target's own, a host not allowed, are counted with nvme-tcp's above: one target).
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
    conns.get_or_create(&rdma).set(open);
    conns_total.get_or_create(&rdma).inc_by(total);
    refused.get_or_create(&rdma).inc_by(refused_rdma);
    let hosts = Family::<TransportL, Gauge>::default();
    reg.register(
        "millrace_nvme_hosts",
        "Hosts connected to the NVMe-oF target now (controllers), per transport",
        hosts.clone(),
    );
    let per = crate::rdma::hosts_per_transport(&state.nvmf);
    for t in ["tcp", "rdma"] {
        let l = TransportL {
            transport: t.into(),
        };
        hosts.get_or_create(&l).set(per[t].as_i64().unwrap_or(0));
    }
    let b = state.nbd.stats();
    let nbd = ProtoL {
        protocol: "nbd".into(),
    };
    conns.get_or_create(&nbd).set(b.connections_open as i64);
    conns_total.get_or_create(&nbd).inc_by(b.connections_total);
    refused.get_or_create(&nbd).inc_by(b.connections_refused);
    crate::rdma::register_metrics(&mut reg);
    let up = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    up.set(state.started.elapsed().as_secs_f64());
    reg.register(
        "millrace_uptime_seconds",
        "Seconds since the server started",
        up,
    );
    let mut out = String::new();
    encode(&mut out, &reg).expect("writing to a String cannot fail");
    out
}
