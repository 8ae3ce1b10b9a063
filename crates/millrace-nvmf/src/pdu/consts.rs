//! The numbers of the NVMe/TCP wire format: PDU types, common header flags, fatal error
//! statuses, header lengths, and the CRC32C digest.

use crate::cmd::{CQE_LEN, SQE_LEN};

/// PDU types.
pub mod pdu_type {
    pub const IC_REQ: u8 = 0x00;
    pub const IC_RESP: u8 = 0x01;
    pub const H2C_TERM_REQ: u8 = 0x02;
    pub const C2H_TERM_REQ: u8 = 0x03;
    pub const CAPSULE_CMD: u8 = 0x04;
    pub const CAPSULE_RESP: u8 = 0x05;
    pub const H2C_DATA: u8 = 0x06;
    pub const C2H_DATA: u8 = 0x07;
    pub const R2T: u8 = 0x09;
}

/// Common header flags.
pub mod flags {
    pub const HDGST: u8 = 0x01;
    pub const DDGST: u8 = 0x02;
    /// H2CData / C2HData: the last PDU of this transfer.
    pub const DATA_LAST: u8 = 0x04;
    /// C2HData: the command succeeded and no response capsule follows.
    pub const DATA_SUCCESS: u8 = 0x08;
}

/// Fatal error status values carried by a termination request.
pub mod fes {
    pub const INVALID_HEADER_FIELD: u16 = 0x01;
    pub const PDU_SEQUENCE_ERROR: u16 = 0x02;
    pub const HEADER_DIGEST_ERROR: u16 = 0x03;
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    pub const DATA_LIMIT_EXCEEDED: u16 = 0x05;
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

pub const CH_LEN: usize = 8;
pub const IC_LEN: usize = 128;
pub const TERM_HLEN: usize = 24;
/// A termination request carries at most this many bytes of the PDU header that caused it.
pub const TERM_MAX_DATA: usize = 128;
pub const CMD_HLEN: usize = CH_LEN + SQE_LEN;
pub const RESP_HLEN: usize = CH_LEN + CQE_LEN;
pub const DATA_HLEN: usize = 24;
pub const R2T_HLEN: usize = 24;
pub const DIGEST_LEN: usize = 4;

/// CRC32C as NVMe/TCP digests use it (the standard reflected CRC with final inversion).
pub fn digest(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// The header length (HLEN) a PDU of type `t` must carry; `None` for an unknown type.
pub(super) fn expected_hlen(t: u8) -> Option<usize> {
    use pdu_type::*;
    Some(match t {
        IC_REQ | IC_RESP => IC_LEN,
        H2C_TERM_REQ | C2H_TERM_REQ => TERM_HLEN,
        CAPSULE_CMD => CMD_HLEN,
        CAPSULE_RESP => RESP_HLEN,
        H2C_DATA | C2H_DATA => DATA_HLEN,
        R2T => R2T_HLEN,
        _ => return None,
    })
}
