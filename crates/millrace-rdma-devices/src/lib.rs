//! The RDMA devices and ports of this host, read from sysfs, so that status pages and the
//! "is there RDMA at all" checks need neither rdma-core nor a device context.

use std::path::Path;

/// Where the kernel lists RDMA devices.
pub const SYSFS_CLASS: &str = "/sys/class/infiniband";

/// One RDMA device (an HCA, a RoCE NIC, or a soft-RoCE `rxe` device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    /// The node GUID as the kernel prints it (`0002:c903:0010:fee4`).
    pub node_guid: String,
    pub ports: Vec<Port>,
}

/// One port of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    pub port: u32,
    /// `ACTIVE`, `DOWN`, `INIT`, ... (the word after the number in sysfs's `4: ACTIVE`).
    pub state: String,
    /// `InfiniBand` or `Ethernet` (RoCE).
    pub link_layer: String,
    /// The rate as the kernel words it (`100 Gb/sec (4X EDR)`), empty when unknown.
    pub rate: String,
    /// The network device a RoCE port runs over, when the kernel says.
    pub netdev: Option<String>,
}

impl Port {
    pub fn is_active(&self) -> bool {
        self.state == "ACTIVE"
    }
}

/// Every RDMA device the kernel lists (none where there is no RDMA, or no sysfs).
pub fn list() -> Vec<Device> {
    list_under(Path::new(SYSFS_CLASS))
}

/// Whether this host has any RDMA device.
pub fn any() -> bool {
    std::fs::read_dir(SYSFS_CLASS).is_ok_and(|mut d| d.next().is_some())
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Lists the devices under a sysfs-shaped folder (a parameter so tests can feed a fake tree).
pub fn list_under(class: &Path) -> Vec<Device> {
    let Ok(dir) = std::fs::read_dir(class) else {
        return Vec::new();
    };
    let mut out: Vec<Device> = dir
        .flatten()
        .map(|e| {
            let d = e.path();
            Device {
                name: e.file_name().to_string_lossy().into_owned(),
                node_guid: read(&d.join("node_guid")),
                ports: ports(&d),
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn ports(dev: &Path) -> Vec<Port> {
    let Ok(dir) = std::fs::read_dir(dev.join("ports")) else {
        return Vec::new();
    };
    let mut out: Vec<Port> = dir
        .flatten()
        .filter_map(|e| {
            let n: u32 = e.file_name().to_str()?.parse().ok()?;
            let p = e.path();
            let state = read(&p.join("state"));
            // "4: ACTIVE" -> "ACTIVE"
            let state = state
                .split_once(':')
                .map_or(state.as_str(), |(_, w)| w.trim())
                .to_string();
            let netdev = Some(read(&p.join("gid_attrs/ndevs/0"))).filter(|s| !s.is_empty());
            Some(Port {
                port: n,
                state,
                link_layer: read(&p.join("link_layer")),
                rate: read(&p.join("rate")),
                netdev,
            })
        })
        .collect();
    out.sort_by_key(|p| p.port);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(p: &Path, s: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    }

    #[test]
    fn reads_devices_and_ports_from_a_sysfs_tree() {
        let t = std::env::temp_dir().join(format!("mr-rdma-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        put(&t.join("rxe0/node_guid"), "5054:00ff:fe12:3456\n");
        put(&t.join("rxe0/ports/1/state"), "4: ACTIVE\n");
        put(&t.join("rxe0/ports/1/link_layer"), "Ethernet\n");
        put(&t.join("rxe0/ports/1/rate"), "10 Gb/sec (1X SDR)\n");
        put(&t.join("rxe0/ports/1/gid_attrs/ndevs/0"), "mr0\n");
        put(&t.join("mlx5_0/node_guid"), "0002:c903:0010:fee4\n");
        put(&t.join("mlx5_0/ports/2/state"), "1: DOWN\n");
        put(&t.join("mlx5_0/ports/2/link_layer"), "InfiniBand\n");
        let v = list_under(&t);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].name, "mlx5_0");
        assert_eq!(v[0].ports[0].state, "DOWN");
        assert!(!v[0].ports[0].is_active());
        assert_eq!(v[0].ports[0].netdev, None);
        assert_eq!(v[1].name, "rxe0");
        assert_eq!(v[1].node_guid, "5054:00ff:fe12:3456");
        let p = &v[1].ports[0];
        assert_eq!((p.port, p.state.as_str()), (1, "ACTIVE"));
        assert_eq!(p.link_layer, "Ethernet");
        assert_eq!(p.netdev.as_deref(), Some("mr0"));
        std::fs::remove_dir_all(&t).unwrap();
    }

    #[test]
    fn no_sysfs_class_means_no_devices() {
        assert!(list_under(Path::new("/nonexistent/infiniband")).is_empty());
    }
}
