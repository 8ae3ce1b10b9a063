//! The common header and framing: where a PDU's header digest, padding, data and data digest
//! lie, checked against the receiver's side and what the connection negotiated.

use super::consts::{
    expected_hlen, flags, pdu_type, CH_LEN, DIGEST_LEN, IC_LEN, TERM_HLEN, TERM_MAX_DATA,
};
use super::error::PduError;

/// The 8-byte common header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ch {
    pub pdu_type: u8,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

impl Ch {
    pub fn decode(b: &[u8; CH_LEN]) -> Ch {
        Ch {
            pdu_type: b[0],
            flags: b[1],
            hlen: b[2],
            pdo: b[3],
            plen: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }
    pub fn encode(&self) -> [u8; CH_LEN] {
        let p = self.plen.to_le_bytes();
        [
            self.pdu_type,
            self.flags,
            self.hlen,
            self.pdo,
            p[0],
            p[1],
            p[2],
            p[3],
        ]
    }
}

/// Which end is receiving: the controller takes host PDUs, the host takes controller PDUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Controller,
    Host,
}

/// What the connection agreed on, as seen by the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// The initialize-connection exchange is over.
    pub ic_done: bool,
    pub hdgst: bool,
    pub ddgst: bool,
    /// Most bytes of data one received PDU of any type may carry (in-capsule data, MAXH2CDATA
    /// for a controller; the largest transfer for a host).
    pub max_data: u32,
}

impl Negotiated {
    /// Before ICReq/ICResp: only the 128-byte IC PDUs are allowed.
    pub fn initial() -> Negotiated {
        Negotiated {
            ic_done: false,
            hdgst: false,
            ddgst: false,
            max_data: 0,
        }
    }
}

/// Where the parts of a PDU lie, from its common header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub ch: Ch,
    /// A header digest follows the header.
    pub hdgst: bool,
    /// Bytes of padding between the header (and its digest) and the data.
    pub pad: usize,
    pub data_len: usize,
    /// A data digest follows the data.
    pub ddgst: bool,
}

impl Frame {
    /// A frame with no padding and no data digest.
    fn bare(ch: &Ch, hdgst: bool, data_len: usize) -> Frame {
        Frame {
            ch: *ch,
            hdgst,
            pad: 0,
            data_len,
            ddgst: false,
        }
    }
    pub fn hlen(&self) -> usize {
        self.ch.hlen as usize
    }
    /// Header, header digest and padding: what precedes the data.
    pub fn head_len(&self) -> usize {
        self.hlen() + if self.hdgst { DIGEST_LEN } else { 0 } + self.pad
    }
}

/// Validates a common header against the receiver's side and the negotiated parameters, and
/// says where the header digest, padding, data and data digest lie. Nothing is allocated.
pub fn frame(ch: &Ch, side: Side, neg: &Negotiated) -> Result<Frame, PduError> {
    use pdu_type::*;
    let t = ch.pdu_type;
    let hlen = expected_hlen(t).ok_or(PduError::InvalidField(0))?;
    let allowed = match side {
        Side::Controller => matches!(t, IC_REQ | H2C_TERM_REQ | CAPSULE_CMD | H2C_DATA),
        Side::Host => matches!(t, IC_RESP | C2H_TERM_REQ | CAPSULE_RESP | C2H_DATA | R2T),
    };
    if !allowed {
        return Err(PduError::InvalidField(0));
    }
    let is_ic = matches!(t, IC_REQ | IC_RESP);
    if is_ic == neg.ic_done && !matches!(t, H2C_TERM_REQ | C2H_TERM_REQ) {
        return Err(PduError::Sequence(t));
    }
    if ch.hlen as usize != hlen {
        return Err(PduError::InvalidField(2));
    }
    let plen = ch.plen as usize;
    if is_ic {
        if plen != IC_LEN {
            return Err(PduError::InvalidField(4));
        }
        return Ok(Frame::bare(ch, false, 0));
    }
    if matches!(t, H2C_TERM_REQ | C2H_TERM_REQ) {
        // Termination requests never carry digests; their data is the offending header.
        if !(TERM_HLEN..=TERM_HLEN + TERM_MAX_DATA).contains(&plen) {
            return Err(PduError::InvalidField(4));
        }
        return Ok(Frame::bare(ch, false, plen - TERM_HLEN));
    }
    digested_frame(ch, hlen, neg)
}

/// The framing of a PDU that may carry digests (every type but IC and termination requests),
/// its type, direction, sequence and HLEN already checked.
fn digested_frame(ch: &Ch, hlen: usize, neg: &Negotiated) -> Result<Frame, PduError> {
    use pdu_type::*;
    let t = ch.pdu_type;
    let plen = ch.plen as usize;
    let hdgst = ch.flags & flags::HDGST != 0;
    if hdgst != neg.hdgst {
        return Err(PduError::InvalidField(1));
    }
    let head = hlen + if hdgst { DIGEST_LEN } else { 0 };
    if plen < head {
        return Err(PduError::InvalidField(4));
    }
    if plen == head {
        if matches!(t, H2C_DATA | C2H_DATA) {
            // A data PDU without data is meaningless.
            return Err(PduError::InvalidField(4));
        }
        return Ok(Frame::bare(ch, hdgst, 0));
    }
    if !matches!(t, CAPSULE_CMD | H2C_DATA | C2H_DATA) {
        return Err(PduError::InvalidField(4));
    }
    let ddgst = ch.flags & flags::DDGST != 0;
    if ddgst != neg.ddgst {
        return Err(PduError::InvalidField(1));
    }
    let pdo = ch.pdo as usize;
    if pdo < head {
        return Err(PduError::InvalidField(3));
    }
    let tail = if ddgst { DIGEST_LEN } else { 0 };
    if plen < pdo + tail + 1 {
        return Err(PduError::InvalidField(4));
    }
    let data_len = plen - pdo - tail;
    if data_len as u64 > neg.max_data as u64 {
        return Err(PduError::TooLarge(data_len as u64));
    }
    Ok(Frame {
        ch: *ch,
        hdgst,
        pad: pdo - head,
        data_len,
        ddgst,
    })
}
