//! RDMA as status pages show it: the host's RDMA devices and ports, nfsd's NFS/RDMA listener,
//! and the hosts connected per transport. Read fresh on each request from sysfs and /proc:
//! nothing here holds state, and nothing here needs rdma-core (the server's /metrics adds
//! its gauges from the same sources).

use crate::model::{NvmeHosts, RdmaDevice, RdmaPort, RdmaView};

/// The RDMA section of `/api/v1/status`.
pub fn view() -> RdmaView {
    let devices = (millrace_rdma_devices::list().into_iter())
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
