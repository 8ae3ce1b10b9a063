//! The NBD server's errors, in a module of their own that depends on no other.

/// What can go wrong when managing exports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("an export named {0:?} already exists; remove it first")]
    ExportExists(String),
    #[error("there is no export named {0:?}")]
    NoSuchExport(String),
    #[error("the export name {name:?} is not valid: {why}")]
    BadName { name: String, why: String },
    #[error("the description of export {0:?} is longer than the protocol's 4096 bytes")]
    DescriptionTooLong(String),
    #[error("the NBD server already runs its connections on other cores; give it its cores and pool before it serves")]
    DataPathSet,
}
