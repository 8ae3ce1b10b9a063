//! What the layers above the pool record in a volume's props, so exports and shares travel
//! with the pool and come back after a restart: the keys and the settings stored under them.
//! The bottom of the server's modules besides `error`: state, exports and shares all read it.

use std::path::PathBuf;

use millrace_volume::VolumeInfo;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

pub const NVME_PROP: &str = "export.nvme";
pub const NBD_PROP: &str = "export.nbd";

pub const SHARE_PROP: &str = "share.nfs";

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NvmeExportConfig {
    /// The subsystem NQN hosts connect to.
    pub nqn: String,
    /// Host NQNs allowed to connect.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Any host may connect: explicit, never the default.
    #[serde(default)]
    pub allow_any_host: bool,
    /// The namespace's ANA group (1 unless `--ana-group` said otherwise); hosts' multipath
    /// reads each path's state of it.
    #[serde(default = "first_ana_group")]
    pub ana_group: u32,
    /// The paths an operator set to a state other than optimized (`export nvme ana`), so that
    /// a restarted server serves them so again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ana_states: Vec<AnaPathState>,
}

/// One path's ANA state as an operator set it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AnaPathState {
    /// tcp or rdma.
    pub transport: String,
    /// The listener, ADDR:PORT.
    pub listener: String,
    pub state: String,
}

fn first_ana_group() -> u32 {
    1
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NbdExportConfig {
    /// The export name clients ask for.
    pub name: String,
    /// TCP clients (addresses or networks) allowed; the Unix sockets reach every export.
    #[serde(default)]
    pub clients: Vec<String>,
    /// A TCP address of its own to listen on, besides the server's `--nbd-listen`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub listen: Option<std::net::SocketAddr>,
    /// A Unix socket of its own (as the kernel NBD client of a share uses), besides
    /// MILLRACE_HOME/nbd.sock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub socket: Option<std::path::PathBuf>,
}

/// Any layer above has a hold on the volume (an export or a share).
pub fn is_exported(v: &VolumeInfo) -> bool {
    v.props
        .keys()
        .any(|k| k.starts_with("export.") || k.starts_with("share"))
}

pub fn describe(v: &VolumeInfo) -> String {
    v.props
        .keys()
        .filter(|k| k.starts_with("export.") || k.starts_with("share"))
        .map(|k| match k.as_str() {
            NVME_PROP => "NVMe/TCP".to_string(),
            NBD_PROP => "NBD".to_string(),
            k => k.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn default_nqn(pool: &str, vol: &str) -> String {
    format!("nqn.2026-11.dev.millrace:{pool}.{vol}")
}

/// NVMe's rules for a qualified name: "nqn." first, at most 223 bytes, printable ASCII.
pub fn check_nqn(what: &str, n: &str) -> Result<(), ApiError> {
    let ok = n.starts_with("nqn.") && n.len() <= 223 && n.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "{what} '{n}' is not an NVMe qualified name: it must start with \"nqn.\", have no spaces and be at most 223 bytes (like nqn.2014-08.org.nvmexpress:uuid:...; `cat /etc/nvme/hostnqn` on the host shows its own)"
        )))
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShareConfig {
    /// NFS clients allowed (addresses, networks such as 10.0.0.0/24, or host names).
    pub clients: Vec<String>,
    /// Writes are acknowledged only once stable (NFS `sync`); `async` is faster and loses
    /// acknowledged writes if the server dies.
    #[serde(default = "yes")]
    pub sync: bool,
    /// Requests from root on a client are mapped to nobody.
    #[serde(default = "yes")]
    pub root_squash: bool,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub mountpoint: PathBuf,
    /// The Unix socket of the share's own NBD export, which the kernel NBD client uses.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub nbd_socket: PathBuf,
    /// The NBD device it was last attached to (informational: a restart may pick another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd_device: Option<String>,
}

fn yes() -> bool {
    true
}
