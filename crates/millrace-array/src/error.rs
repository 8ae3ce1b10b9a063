//! The array layer's errors, in one module that depends on no other, so that the engine, the
//! pools and the superblock code all reach them without reaching each other.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum ArrayError {
    #[error("the range {offset}+{len} bytes lies past the end of the pool ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("the pool is offline: group {group} has lost {lost} of its drives but survives the loss of only {tolerance}; bring drives back (`millrace pool import`) before using it")]
    Offline {
        group: usize,
        lost: usize,
        tolerance: usize,
    },
}

impl From<ArrayError> for io::Error {
    fn from(e: ArrayError) -> io::Error {
        let kind = match e {
            ArrayError::OutOfRange { .. } => io::ErrorKind::InvalidInput,
            ArrayError::Offline { .. } => io::ErrorKind::Other,
        };
        io::Error::new(kind, e.to_string())
    }
}

/// An admin-facing failure: always a sentence that says what was wrong and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PoolError(pub String);

impl From<ArrayError> for PoolError {
    fn from(e: ArrayError) -> Self {
        PoolError(e.to_string())
    }
}

/// Why a superblock slot was not accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum SbError {
    /// No Millrace magic: the drive is blank or belongs to something else.
    NotMillrace,
    Corrupt(String),
}

impl std::fmt::Display for SbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SbError::NotMillrace => write!(f, "no Millrace superblock"),
            SbError::Corrupt(why) => write!(f, "a corrupt Millrace superblock ({why})"),
        }
    }
}
