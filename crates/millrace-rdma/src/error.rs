//! Errors, as sentences that say what went wrong and what to do.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// rdma-core's libraries could not be loaded.
    #[error("RDMA is unavailable: libibverbs.so.1 or librdmacm.so.1 could not be loaded; install rdma-core's libraries (Debian: libibverbs1 librdmacm1 ibverbs-providers)")]
    NoLibrary,
    /// The host has no RDMA device at all.
    #[error("this host has no RDMA device (/sys/class/infiniband is empty); load the NIC's RDMA driver, or add a soft-RoCE device with `rdma link add rxe0 type rxe netdev IFACE`")]
    NoDevice,
    /// No RDMA device serves the address asked for.
    #[error("no RDMA device has the address {addr} ({source}); give an address of an RDMA-capable interface (`rdma link` lists them with their network devices)")]
    NoDeviceForAddress {
        addr: std::net::SocketAddr,
        source: io::Error,
    },
    /// A verbs or CM call failed.
    #[error("{call} failed: {source}")]
    Call {
        call: &'static str,
        source: io::Error,
    },
    /// A request the device cannot satisfy (sizes beyond its limits and the like).
    #[error("{0}")]
    Invalid(String),
    /// One connect request could not be taken (it was rejected); the listener itself is fine.
    #[error("a connect request was rejected because {0}")]
    Request(Box<Error>),
}

impl Error {
    /// The error of a call that set errno.
    pub(crate) fn last(call: &'static str) -> Error {
        Error::Call {
            call,
            source: io::Error::last_os_error(),
        }
    }
    /// The error of a call that returned an errno value (or -1 with errno set).
    pub(crate) fn code(call: &'static str, rc: i32) -> Error {
        let source = if rc > 0 {
            io::Error::from_raw_os_error(rc)
        } else {
            io::Error::last_os_error()
        };
        Error::Call { call, source }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
