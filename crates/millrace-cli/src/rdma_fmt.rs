//! The RDMA lines of `millrace status`: devices and ports, NFS/RDMA, NVMe/RDMA listeners and
//! connected hosts per transport, from the server's status (or, with no server, from sysfs).

use serde_json::Value;

/// Prints what `/api/v1/status` says about RDMA (its `rdma` object).
pub fn print(r: &Value) {
    let devices = r["devices"].as_array().cloned().unwrap_or_default();
    if devices.is_empty() {
        println!("RDMA: no device on this host (NVMe/TCP and NFS over TCP only)");
        return;
    }
    for d in &devices {
        let ports: Vec<String> = d["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                let net = p["netdev"]
                    .as_str()
                    .map(|n| format!(" on {n}"))
                    .unwrap_or_default();
                format!(
                    "port {} {} ({}{net})",
                    p["port"],
                    p["state"].as_str().unwrap_or("?"),
                    p["link_layer"].as_str().unwrap_or("?")
                )
            })
            .collect();
        println!(
            "RDMA device {}: {}",
            d["name"].as_str().unwrap_or("?"),
            ports.join(", ")
        );
    }
    match r["nfs_rdma_port"].as_u64() {
        Some(p) => println!("NFS/RDMA: nfsd listens on port {p} (mount -o proto=rdma,port={p})"),
        None => println!("NFS/RDMA: off (turned on when a share is created)"),
    }
}

/// The NVMe-oF listeners of each transport and the hosts connected over each, from
/// `/api/v1/status`.
pub fn print_nvme(st: &Value) {
    let ls: Vec<String> = (st["nvme_listeners"].as_array().into_iter().flatten())
        .map(|l| {
            format!(
                "{} {}:{}",
                l["transport"].as_str().unwrap_or("?"),
                l["address"].as_str().unwrap_or("?"),
                l["port"]
            )
        })
        .collect();
    if ls.is_empty() {
        println!("NVMe-oF: not listening");
        return;
    }
    let h = &st["nvme_hosts"];
    println!(
        "NVMe-oF: listening on {}; hosts connected: {} over TCP, {} over RDMA",
        ls.join(", "),
        h["tcp"].as_u64().unwrap_or(0),
        h["rdma"].as_u64().unwrap_or(0)
    );
}

/// The same, with no server: devices from sysfs.
pub fn print_local() {
    let devices: Vec<Value> = millrace_rdma::devices::list()
        .into_iter()
        .map(|d| {
            serde_json::json!({
                "name": d.name,
                "ports": d.ports.iter().map(|p| serde_json::json!({
                    "port": p.port, "state": p.state, "link_layer": p.link_layer, "netdev": p.netdev,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    print(&serde_json::json!({
        "devices": devices,
        "nfs_rdma_port": millrace_server::nfs_rdma::listening_port(),
    }));
}
