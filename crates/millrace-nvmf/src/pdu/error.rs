//! Why a PDU was refused, or reading one from a stream stopped.

use super::consts::fes;

/// Why a PDU was refused. Every variant maps to a termination request's fatal error status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    #[error("the PDU header field at byte {0} holds a value the receiver does not accept")]
    InvalidField(u32),
    #[error("a PDU of type {0:#04x} arrived where the protocol does not allow it")]
    Sequence(u8),
    #[error("the header digest does not match the header")]
    HeaderDigest,
    #[error("the data digest does not match the data")]
    DataDigest,
    #[error("the data lies outside the range of its transfer")]
    OutOfRange,
    #[error("the PDU carries {0} bytes of data, more than the negotiated limit")]
    TooLarge(u64),
    #[error("the peer asked for a parameter this side does not support: {0}")]
    Unsupported(&'static str),
}

impl PduError {
    /// Fatal error status and information for the termination request this error deserves.
    pub fn fes_fei(&self) -> (u16, u32) {
        match self {
            PduError::InvalidField(at) => (fes::INVALID_HEADER_FIELD, *at),
            PduError::Sequence(_) => (fes::PDU_SEQUENCE_ERROR, 0),
            PduError::HeaderDigest => (fes::HEADER_DIGEST_ERROR, 0),
            // A data digest error is not fatal; callers complete the command instead.
            PduError::DataDigest => (fes::HEADER_DIGEST_ERROR, 0),
            PduError::OutOfRange => (fes::DATA_OUT_OF_RANGE, 0),
            PduError::TooLarge(_) => (fes::DATA_LIMIT_EXCEEDED, 0),
            PduError::Unsupported(_) => (fes::UNSUPPORTED_PARAMETER, 0),
        }
    }
}

/// Why reading a PDU from a stream stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("the connection failed or closed: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Pdu(#[from] PduError),
}
