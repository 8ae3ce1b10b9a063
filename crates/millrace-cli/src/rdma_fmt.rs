//! The RDMA lines of `millrace status`: devices and ports, NFS/RDMA, NVMe/RDMA listeners and
//! connected hosts per transport, from the server's status (or, with no server, from sysfs).

use millrace_service::model::{RdmaView, Status};

/// Prints what `/api/v1/status` says about RDMA (its `rdma` object).
pub fn print(r: &RdmaView) {
    if r.devices.is_empty() {
        println!("RDMA: no device on this host (NVMe/TCP and NFS over TCP only)");
        return;
    }
    for d in &r.devices {
        let ports: Vec<String> = (d.ports.iter())
            .map(|p| {
                let net = (p.netdev.as_ref())
                    .map(|n| format!(" on {n}"))
                    .unwrap_or_default();
                format!("port {} {} ({}{net})", p.port, p.state, p.link_layer)
            })
            .collect();
        println!("RDMA device {}: {}", d.name, ports.join(", "));
    }
    match r.nfs_rdma_port {
        Some(p) => println!("NFS/RDMA: nfsd listens on port {p} (mount -o proto=rdma,port={p})"),
        None => println!("NFS/RDMA: off (turned on when a share is created)"),
    }
}

/// The NVMe-oF listeners of each transport and the hosts connected over each, from
/// `/api/v1/status`.
pub fn print_nvme(st: &Status) {
    let ls: Vec<String> = (st.nvme_listeners.iter())
        .map(|l| format!("{} {}:{}", l.transport, l.address, l.port))
        .collect();
    if ls.is_empty() {
        println!("NVMe-oF: not listening");
        return;
    }
    println!(
        "NVMe-oF: listening on {}; hosts connected: {} over TCP, {} over RDMA",
        ls.join(", "),
        st.nvme_hosts.tcp,
        st.nvme_hosts.rdma
    );
}

/// The same, with no server: devices from sysfs.
pub fn print_local() {
    print(&millrace_service::rdma_view());
}
