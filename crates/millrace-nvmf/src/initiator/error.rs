//! Why a host-side operation failed, in a module of its own that depends only on the wire types.

use crate::cmd::{Cqe, Status};

/// Why a host-side operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the target broke the protocol: {0}")]
    Protocol(String),
    #[error("the target ended the connection (fatal error status {fes:#x}, information {fei})")]
    Terminated { fes: u16, fei: u32 },
    #[error("the command failed with {0}")]
    Status(Status, Cqe),
    #[error("the connection is closed")]
    Closed,
}

impl Error {
    /// The NVMe status, when the target answered the command with one.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Status(s, _) => Some(*s),
            _ => None,
        }
    }
}
