//! NFS over RDMA for shares: the kernel NFS server's RDMA listener (port 20049), turned on
//! whenever the host has an RDMA device, whether Millrace started nfsd or found it running.

use std::process::{Command, Stdio};

/// The port NFS/RDMA clients use (`mount -o proto=rdma,port=20049`).
pub const NFS_RDMA_PORT: u16 = 20049;

const PORTLIST: &str = "/proc/fs/nfsd/portlist";

/// The port nfsd listens for RDMA on, read from its port list ("rdma 20049").
pub fn listening_port() -> Option<u16> {
    parse_portlist(&std::fs::read_to_string(PORTLIST).ok()?)
}

fn parse_portlist(text: &str) -> Option<u16> {
    text.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next()? == "rdma").then(|| w.next()?.parse().ok())?
    })
}

/// Makes sure nfsd listens for RDMA where the host has an RDMA device; returns the port it
/// listens on (None: no RDMA device, or the listener could not be added, which is logged).
/// Needs nfsd's file system mounted at /proc/fs/nfsd; harmless to call again.
pub fn ensure() -> Option<u16> {
    if !millrace_rdma_devices::any() {
        return None;
    }
    if let Some(p) = listening_port() {
        return Some(p);
    }
    // The server side of NFS/RDMA: rpcrdma in current kernels (svcrdma is its old name).
    for m in ["rpcrdma", "svcrdma"] {
        let ok = Command::new("modprobe")
            .arg(m)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            break;
        }
    }
    if let Err(e) = std::fs::write(PORTLIST, format!("rdma {NFS_RDMA_PORT}\n")) {
        tracing::warn!(
            "this host has an RDMA device but nfsd would not listen for NFS/RDMA on port {NFS_RDMA_PORT}: {e} (is the rpcrdma module available?)"
        );
        return None;
    }
    tracing::info!("nfsd listens for NFS/RDMA on port {NFS_RDMA_PORT}");
    listening_port()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rdma_port_is_read_from_nfsds_port_list() {
        assert_eq!(parse_portlist("tcp 2049\nudp 2049\n"), None);
        assert_eq!(parse_portlist("rdma 20049\ntcp 2049\n"), Some(20049));
        assert_eq!(parse_portlist("tcp 2049\nrdma 4421\n"), Some(4421));
        assert_eq!(parse_portlist(""), None);
        assert_eq!(parse_portlist("rdma\n"), None);
    }
}
