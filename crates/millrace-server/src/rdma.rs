//! RDMA as status pages and /metrics show it: the host's RDMA devices and ports, nfsd's
//! NFS/RDMA listener, and (with the NVMe/RDMA transport) its listeners and connected hosts.
//! Read fresh on each request from sysfs and /proc: nothing here holds state.

use crate::model::{NvmeHosts, RdmaDevice, RdmaPort, RdmaView};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The RDMA section of `/api/v1/status`.
pub fn view() -> RdmaView {
    let devices = (millrace_rdma::devices::list().into_iter())
        .map(|d| RdmaDevice {
            name: d.name,
            node_guid: d.node_guid,
            ports: (d.ports.into_iter())
                .map(|p| RdmaPort {
                    port: p.port,
                    state: p.state,
                    link_layer: p.link_layer,
                    rate: p.rate,
                    netdev: p.netdev,
                })
                .collect(),
        })
        .collect();
    RdmaView {
        devices,
        nfs_rdma_port: crate::nfs_rdma::listening_port(),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortL {
    device: String,
    port: String,
    link_layer: String,
    netdev: String,
}

/// Hosts connected to the NVMe-oF target now (controllers), per transport.
pub fn hosts_per_transport(t: &millrace_nvmf::Target) -> NvmeHosts {
    let (mut tcp, mut rdma) = (0u64, 0u64);
    for s in t.subsystems() {
        for h in &s.hosts {
            match h.transport {
                millrace_nvmf::Transport::Tcp => tcp += 1,
                millrace_nvmf::Transport::Rdma => rdma += 1,
            }
        }
    }
    NvmeHosts { tcp, rdma }
}

/// `millrace_rdma_port_up` per device port and `millrace_nfs_rdma_listening`.
pub fn register_metrics(reg: &mut Registry) {
    let up = Family::<PortL, Gauge>::default();
    reg.register(
        "millrace_rdma_port_up",
        "1 when the RDMA device port is ACTIVE, 0 otherwise",
        up.clone(),
    );
    for d in millrace_rdma::devices::list() {
        for p in &d.ports {
            let l = PortL {
                device: d.name.clone(),
                port: p.port.to_string(),
                link_layer: p.link_layer.clone(),
                netdev: p.netdev.clone().unwrap_or_default(),
            };
            up.get_or_create(&l).set(p.is_active() as i64);
        }
    }
    let nfs = Gauge::<i64>::default();
    nfs.set(crate::nfs_rdma::listening_port().is_some() as i64);
    reg.register(
        "millrace_nfs_rdma_listening",
        "1 when the kernel NFS server listens for NFS/RDMA (port 20049)",
        nfs,
    );
}
