//! The per-type PDU headers: what each carries, decoded from and encoded to its bytes.

use super::consts::{flags, pdu_type, CH_LEN, RESP_HLEN};
use super::error::PduError;
use super::frame::Frame;
use crate::cmd::{Cqe, Sqe, CQE_LEN};

/// ICReq: what the host asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcReq {
    pub pfv: u16,
    /// Host PDU data alignment, in dwords, zero-based.
    pub hpda: u8,
    pub hdgst: bool,
    pub ddgst: bool,
    /// Most R2Ts outstanding per command, zero-based.
    pub maxr2t: u32,
}

/// ICResp: what the controller grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcResp {
    pub pfv: u16,
    /// Controller PDU data alignment, in dwords, zero-based.
    pub cpda: u8,
    pub hdgst: bool,
    pub ddgst: bool,
    /// Most data bytes one H2CData PDU may carry.
    pub maxh2cdata: u32,
}

/// Header of an H2CData or C2HData PDU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataHdr {
    pub cccid: u16,
    pub ttag: u16,
    pub datao: u32,
    pub datal: u32,
    pub last: bool,
    pub success: bool,
}

/// An R2T: the controller is ready for `r2tl` bytes at offset `r2to` of command `cccid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct R2t {
    pub cccid: u16,
    pub ttag: u16,
    pub r2to: u32,
    pub r2tl: u32,
}

/// A decoded PDU header (everything but the data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    IcReq(IcReq),
    IcResp(IcResp),
    /// H2CTermReq when `h2c`, C2HTermReq otherwise; the data is the offending header.
    TermReq {
        h2c: bool,
        fes: u16,
        fei: u32,
    },
    Cmd(Sqe),
    Resp(Cqe),
    H2CData(DataHdr),
    C2HData(DataHdr),
    R2t(R2t),
}

impl Head {
    /// The PDU type and the flags this header sets (digest flags aside).
    pub(super) fn type_and_flags(&self) -> (u8, u8) {
        use pdu_type::*;
        match self {
            Head::IcReq(_) => (IC_REQ, 0),
            Head::IcResp(_) => (IC_RESP, 0),
            Head::TermReq { h2c: true, .. } => (H2C_TERM_REQ, 0),
            Head::TermReq { h2c: false, .. } => (C2H_TERM_REQ, 0),
            Head::Cmd(_) => (CAPSULE_CMD, 0),
            Head::Resp(_) => (CAPSULE_RESP, 0),
            Head::H2CData(d) => (H2C_DATA, if d.last { flags::DATA_LAST } else { 0 }),
            Head::C2HData(d) => (
                C2H_DATA,
                (if d.last { flags::DATA_LAST } else { 0 })
                    | (if d.success { flags::DATA_SUCCESS } else { 0 }),
            ),
            Head::R2t(_) => (R2T, 0),
        }
    }

    /// Appends the type-specific fields that follow the common header.
    pub(super) fn put_fields(&self, h: &mut Vec<u8>) {
        match self {
            Head::IcReq(r) => {
                h.extend_from_slice(&r.pfv.to_le_bytes());
                h.push(r.hpda);
                h.push(r.hdgst as u8 | (r.ddgst as u8) << 1);
                h.extend_from_slice(&r.maxr2t.to_le_bytes());
            }
            Head::IcResp(r) => {
                h.extend_from_slice(&r.pfv.to_le_bytes());
                h.push(r.cpda);
                h.push(r.hdgst as u8 | (r.ddgst as u8) << 1);
                h.extend_from_slice(&r.maxh2cdata.to_le_bytes());
            }
            Head::TermReq { fes, fei, .. } => {
                h.extend_from_slice(&fes.to_le_bytes());
                h.extend_from_slice(&fei.to_le_bytes());
            }
            Head::Cmd(s) => h.extend_from_slice(&s.0),
            Head::Resp(c) => h.extend_from_slice(&c.encode()),
            Head::H2CData(d) | Head::C2HData(d) => {
                h.extend_from_slice(&d.cccid.to_le_bytes());
                h.extend_from_slice(&d.ttag.to_le_bytes());
                h.extend_from_slice(&d.datao.to_le_bytes());
                h.extend_from_slice(&d.datal.to_le_bytes());
            }
            Head::R2t(r) => {
                h.extend_from_slice(&r.cccid.to_le_bytes());
                h.extend_from_slice(&r.ttag.to_le_bytes());
                h.extend_from_slice(&r.r2to.to_le_bytes());
                h.extend_from_slice(&r.r2tl.to_le_bytes());
            }
        }
    }
}

pub(super) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
pub(super) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Decodes the header bytes (`hlen` of them, common header included) of a framed PDU.
pub fn decode_head(f: &Frame, h: &[u8]) -> Result<Head, PduError> {
    use pdu_type::*;
    debug_assert_eq!(h.len(), f.hlen());
    Ok(match f.ch.pdu_type {
        IC_REQ => {
            let pfv = le16(h, 8);
            if pfv != 0 {
                return Err(PduError::InvalidField(8));
            }
            Head::IcReq(IcReq {
                pfv,
                hpda: h[10],
                hdgst: h[11] & 1 != 0,
                ddgst: h[11] & 2 != 0,
                maxr2t: le32(h, 12),
            })
        }
        IC_RESP => {
            let pfv = le16(h, 8);
            if pfv != 0 {
                return Err(PduError::InvalidField(8));
            }
            Head::IcResp(IcResp {
                pfv,
                cpda: h[10],
                hdgst: h[11] & 1 != 0,
                ddgst: h[11] & 2 != 0,
                maxh2cdata: le32(h, 12),
            })
        }
        H2C_TERM_REQ | C2H_TERM_REQ => Head::TermReq {
            h2c: f.ch.pdu_type == H2C_TERM_REQ,
            fes: le16(h, 8),
            fei: le32(h, 10),
        },
        CAPSULE_CMD => Head::Cmd(Sqe::from_slice(&h[CH_LEN..]).expect("hlen was checked")),
        CAPSULE_RESP => {
            let mut c = [0u8; CQE_LEN];
            c.copy_from_slice(&h[CH_LEN..RESP_HLEN]);
            Head::Resp(Cqe::decode(&c))
        }
        H2C_DATA | C2H_DATA => {
            let d = DataHdr {
                cccid: le16(h, 8),
                ttag: le16(h, 10),
                datao: le32(h, 12),
                datal: le32(h, 16),
                last: f.ch.flags & flags::DATA_LAST != 0,
                // SUCCESS means something only from the controller (C2HData); in an H2CData
                // the bit is reserved, so it is ignored, as reserved bits are.
                success: f.ch.pdu_type == C2H_DATA && f.ch.flags & flags::DATA_SUCCESS != 0,
            };
            if d.datal as usize != f.data_len {
                return Err(PduError::InvalidField(16));
            }
            if f.ch.pdu_type == H2C_DATA {
                Head::H2CData(d)
            } else {
                if d.success && !d.last {
                    return Err(PduError::InvalidField(1));
                }
                Head::C2HData(d)
            }
        }
        R2T => Head::R2t(R2t {
            cccid: le16(h, 8),
            ttag: le16(h, 10),
            r2to: le32(h, 12),
            r2tl: le32(h, 16),
        }),
        _ => return Err(PduError::InvalidField(0)),
    })
}
