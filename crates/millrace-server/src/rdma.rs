//! RDMA as /metrics shows it: the host's RDMA device ports and nfsd's NFS/RDMA listener, read
//! fresh on each scrape from sysfs and /proc (the status page's view is the service crate's).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortL {
    device: String,
    port: String,
    link_layer: String,
    netdev: String,
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
