//! The target's errors, in a module of their own that depends on no other.

/// Errors of the target's management API. They are sentences meant for an operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a subsystem named {0} already exists")]
    SubsystemExists(String),
    #[error("no subsystem is named {0}")]
    NoSuchSubsystem(String),
    #[error("subsystem {nqn} already has a namespace {nsid}")]
    NamespaceExists { nqn: String, nsid: u32 },
    #[error("subsystem {nqn} has no namespace {nsid}")]
    NoSuchNamespace { nqn: String, nsid: u32 },
    #[error("{0}")]
    Invalid(String),
}
