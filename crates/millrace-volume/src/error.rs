//! The volume layer's one error type: a refusal (a sentence that says what to do) or an I/O
//! failure with what was being done.

use std::io;

/// A refusal or failure, as a sentence that says what was wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("{0}")]
    Refused(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

pub(crate) fn refuse<T>(msg: impl Into<String>) -> Result<T> {
    Err(VolumeError::Refused(msg.into()))
}

pub(crate) type Result<T> = std::result::Result<T, VolumeError>;
