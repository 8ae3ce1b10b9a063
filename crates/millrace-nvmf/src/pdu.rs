//! The NVMe/TCP PDU codec (NVM Express TCP Transport Specification 1.0): the 8-byte common
//! header, the per-type headers, optional CRC32C header and data digests, and padding up to the
//! data offset (PDO). Hand-written because no maintained Rust crate speaks this wire format.
//!
//! Every length is checked against what the two sides negotiated before anything is allocated:
//! a receiver never trusts PLEN further than `Negotiated::max_data`.

use crate::cmd::{Cqe, Sqe, CQE_LEN, SQE_LEN};
use tokio::io::{AsyncRead, AsyncReadExt};

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
    pub fn hlen(&self) -> usize {
        self.ch.hlen as usize
    }
    /// Header, header digest and padding: what precedes the data.
    pub fn head_len(&self) -> usize {
        self.hlen() + if self.hdgst { DIGEST_LEN } else { 0 } + self.pad
    }
}

fn expected_hlen(t: u8) -> Option<usize> {
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
        return Ok(Frame {
            ch: *ch,
            hdgst: false,
            pad: 0,
            data_len: 0,
            ddgst: false,
        });
    }
    if matches!(t, H2C_TERM_REQ | C2H_TERM_REQ) {
        // Termination requests never carry digests; their data is the offending header.
        if !(TERM_HLEN..=TERM_HLEN + TERM_MAX_DATA).contains(&plen) {
            return Err(PduError::InvalidField(4));
        }
        return Ok(Frame {
            ch: *ch,
            hdgst: false,
            pad: 0,
            data_len: plen - TERM_HLEN,
            ddgst: false,
        });
    }
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
        return Ok(Frame {
            ch: *ch,
            hdgst,
            pad: 0,
            data_len: 0,
            ddgst: false,
        });
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

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
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

/// A whole PDU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pdu {
    pub head: Head,
    pub data: Vec<u8>,
}

/// Decodes one PDU from the front of `buf`. `Ok(None)`: more bytes are needed. On success,
/// also says how many bytes it used. A data digest mismatch is reported as
/// `PduError::DataDigest` (the caller decides whether it is fatal).
pub fn decode(buf: &[u8], side: Side, neg: &Negotiated) -> Result<Option<(Pdu, usize)>, PduError> {
    let Some(chb) = buf.get(..CH_LEN) else {
        return Ok(None);
    };
    let ch = Ch::decode(chb.try_into().expect("8 bytes"));
    let f = frame(&ch, side, neg)?;
    let plen = ch.plen as usize;
    if buf.len() < plen {
        return Ok(None);
    }
    let h = &buf[..f.hlen()];
    if f.hdgst {
        let want = le32(buf, f.hlen());
        if digest(h) != want {
            return Err(PduError::HeaderDigest);
        }
    }
    let head = decode_head(&f, h)?;
    let start = f.head_len();
    let data = &buf[start..start + f.data_len];
    if f.ddgst && digest(data) != le32(buf, start + f.data_len) {
        return Err(PduError::DataDigest);
    }
    Ok(Some((
        Pdu {
            head,
            data: data.to_vec(),
        },
        plen,
    )))
}

/// Encodes the header of a PDU whose data is `data` (which the caller sends after it, followed
/// by `data_digest(data)` when data digests are on). `hdgst`/`ddgst`: the negotiated digests;
/// `align`: the receiver's data alignment in bytes (1 when it asked for none).
pub fn encode_head(head: &Head, data: &[u8], hdgst: bool, ddgst: bool, align: usize) -> Vec<u8> {
    use pdu_type::*;
    let mut h = Vec::with_capacity(IC_LEN + DIGEST_LEN + align);
    let (t, mut fl) = match head {
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
    };
    let ic_or_term = matches!(
        head,
        Head::IcReq(_) | Head::IcResp(_) | Head::TermReq { .. }
    );
    let hdgst = hdgst && !ic_or_term;
    let ddgst = ddgst && !ic_or_term && !data.is_empty();
    if hdgst {
        fl |= flags::HDGST;
    }
    if ddgst {
        fl |= flags::DDGST;
    }
    let hlen = expected_hlen(t).expect("known type");
    h.extend_from_slice(&[t, fl, hlen as u8, 0, 0, 0, 0, 0]);
    match head {
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
    h.resize(hlen, 0);
    let head_total = hlen + if hdgst { DIGEST_LEN } else { 0 };
    let align = align.max(1);
    // Termination requests carry their data right after the header, with PDO reserved.
    let (pdo, data_at) = if data.is_empty() || ic_or_term {
        (0, head_total)
    } else {
        let p = head_total.div_ceil(align) * align;
        (p, p)
    };
    let plen = data_at + data.len() + if ddgst { DIGEST_LEN } else { 0 };
    h[3] = pdo as u8;
    h[4..8].copy_from_slice(&(plen as u32).to_le_bytes());
    if hdgst {
        let d = digest(&h);
        h.extend_from_slice(&d.to_le_bytes());
    }
    h.resize(data_at, 0);
    h
}

/// A whole PDU as bytes: header (+digest, padding), data, data digest.
pub fn encode(head: &Head, data: &[u8], hdgst: bool, ddgst: bool, align: usize) -> Vec<u8> {
    let mut b = encode_head(head, data, hdgst, ddgst, align);
    let with_ddgst = b[1] & flags::DDGST != 0;
    b.extend_from_slice(data);
    if with_ddgst {
        b.extend_from_slice(&digest(data).to_le_bytes());
    }
    b
}

/// Why reading a PDU from a stream stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("the connection failed or closed: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Pdu(#[from] PduError),
}

/// Reads the next PDU header from a stream and checks it (header digest included), leaving the
/// data (and its digest) unread so the caller can place it where it belongs. Returns the
/// header and its frame, and the raw header bytes (for a termination request's data).
pub async fn read_head<R: AsyncRead + Unpin>(
    r: &mut R,
    side: Side,
    neg: &Negotiated,
) -> Result<(Head, Frame, Vec<u8>), ReadError> {
    let mut chb = [0u8; CH_LEN];
    r.read_exact(&mut chb).await?;
    let ch = Ch::decode(&chb);
    let f = frame(&ch, side, neg)?;
    // Bounded: at most 128 header bytes, a digest and 255 bytes of padding.
    let mut h = vec![0u8; f.head_len()];
    h[..CH_LEN].copy_from_slice(&chb);
    r.read_exact(&mut h[CH_LEN..]).await?;
    if f.hdgst && digest(&h[..f.hlen()]) != le32(&h, f.hlen()) {
        return Err(PduError::HeaderDigest.into());
    }
    h.truncate(f.hlen());
    let head = decode_head(&f, &h)?;
    Ok((head, f, h))
}

/// Reads a PDU's data into `dst` (exactly `f.data_len` bytes) and checks its digest.
/// `Ok(false)`: the data digest did not match.
pub async fn read_data<R: AsyncRead + Unpin>(
    r: &mut R,
    f: &Frame,
    dst: &mut [u8],
) -> Result<bool, std::io::Error> {
    debug_assert_eq!(dst.len(), f.data_len);
    r.read_exact(dst).await?;
    if f.ddgst {
        let mut d = [0u8; DIGEST_LEN];
        r.read_exact(&mut d).await?;
        return Ok(digest(dst) == u32::from_le_bytes(d));
    }
    Ok(true)
}

/// Reads and drops a PDU's data (for data that has nowhere to go), in bounded pieces.
pub async fn skip_data<R: AsyncRead + Unpin>(r: &mut R, f: &Frame) -> std::io::Result<()> {
    let mut left = f.data_len + if f.ddgst { DIGEST_LEN } else { 0 };
    let mut junk = [0u8; 4096];
    while left > 0 {
        let n = left.min(junk.len());
        r.read_exact(&mut junk[..n]).await?;
        left -= n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::{io, Sgl, Status};

    fn neg(hdgst: bool, ddgst: bool) -> Negotiated {
        Negotiated {
            ic_done: true,
            hdgst,
            ddgst,
            max_data: 1 << 20,
        }
    }

    fn round_trip(head: Head, data: &[u8], side: Side, hd: bool, dd: bool) {
        let b = encode(&head, data, hd, dd, 1);
        let n = if matches!(head, Head::IcReq(_) | Head::IcResp(_)) {
            Negotiated::initial()
        } else {
            neg(hd, dd)
        };
        let (p, used) = decode(&b, side, &n).unwrap().unwrap();
        assert_eq!(used, b.len());
        assert_eq!(p.head, head);
        assert_eq!(p.data, data);
        // Every strict prefix is "need more", never an error or a panic.
        for cut in 0..b.len() {
            assert_eq!(decode(&b[..cut], side, &n), Ok(None), "prefix {cut}");
        }
    }

    #[test]
    fn every_pdu_type_round_trips_with_and_without_digests() {
        let ic = IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: true,
            ddgst: false,
            maxr2t: 0,
        };
        round_trip(Head::IcReq(ic), &[], Side::Controller, false, false);
        let icr = IcResp {
            pfv: 0,
            cpda: 0,
            hdgst: true,
            ddgst: true,
            maxh2cdata: 131072,
        };
        round_trip(Head::IcResp(icr), &[], Side::Host, false, false);
        for (hd, dd) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut s = Sqe::new(io::WRITE, 9, 1);
            s.set_lba_range(4, 2);
            s.set_sgl(Sgl::InCapsule {
                offset: 0,
                len: 8192,
            });
            round_trip(Head::Cmd(s), &[0xab; 8192], Side::Controller, hd, dd);
            round_trip(
                Head::Cmd(Sqe::new(io::FLUSH, 1, 1)),
                &[],
                Side::Controller,
                hd,
                dd,
            );
            round_trip(
                Head::Resp(Cqe::new(9, Status::LBA_OUT_OF_RANGE, 5)),
                &[],
                Side::Host,
                hd,
                dd,
            );
            let d = DataHdr {
                cccid: 9,
                ttag: 3,
                datao: 4096,
                datal: 100,
                last: true,
                success: false,
            };
            round_trip(Head::H2CData(d), &[1; 100], Side::Controller, hd, dd);
            round_trip(
                Head::C2HData(DataHdr { success: true, ..d }),
                &[2; 100],
                Side::Host,
                hd,
                dd,
            );
            let r = R2t {
                cccid: 9,
                ttag: 3,
                r2to: 0,
                r2tl: 65536,
            };
            round_trip(Head::R2t(r), &[], Side::Host, hd, dd);
            for h2c in [true, false] {
                let t = Head::TermReq {
                    h2c,
                    fes: fes::HEADER_DIGEST_ERROR,
                    fei: 0,
                };
                let side = if h2c { Side::Controller } else { Side::Host };
                round_trip(t, &[7; 24], side, hd, dd);
            }
        }
    }

    /// Found by the pdu_decode fuzzer: an H2CData with the SUCCESS bit set (reserved there)
    /// decoded as "success" but encoded without it, so the PDU did not survive a round trip.
    #[test]
    fn the_success_bit_of_an_h2c_data_pdu_is_reserved_and_ignored() {
        let d = DataHdr {
            cccid: 3,
            ttag: 3,
            datao: 8192,
            datal: 16,
            last: false,
            success: false,
        };
        let mut b = encode(&Head::H2CData(d), &[7; 16], false, false, 1);
        b[1] |= flags::DATA_SUCCESS;
        let (p, used) = decode(&b, Side::Controller, &neg(false, false))
            .unwrap()
            .unwrap();
        assert_eq!(used, b.len());
        assert_eq!(p.head, Head::H2CData(d));
        let again = encode(&p.head, &p.data, false, false, 1);
        let (back, _) = decode(&again, Side::Controller, &neg(false, false))
            .unwrap()
            .unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn data_is_placed_at_the_receivers_alignment() {
        let d = DataHdr {
            cccid: 1,
            ttag: 0,
            datao: 0,
            datal: 10,
            last: true,
            success: false,
        };
        let b = encode(&Head::C2HData(d), &[5; 10], true, false, 32);
        assert_eq!(b[3], 32);
        let (p, _) = decode(&b, Side::Host, &neg(true, false)).unwrap().unwrap();
        assert_eq!(p.data, vec![5; 10]);
    }

    #[test]
    fn bad_digests_are_refused() {
        let s = Sqe::new(io::WRITE, 9, 1);
        let mut b = encode(&Head::Cmd(s), &[3; 64], true, true, 1);
        let n = neg(true, true);
        b[20] ^= 1; // inside the SQE
        assert_eq!(
            decode(&b, Side::Controller, &n),
            Err(PduError::HeaderDigest)
        );
        b[20] ^= 1;
        let last = b.len() - 10;
        b[last] ^= 1; // inside the data
        assert_eq!(decode(&b, Side::Controller, &n), Err(PduError::DataDigest));
    }

    #[test]
    fn refusals() {
        let n = neg(false, false);
        let s = Sqe::new(io::READ, 1, 1);
        let good = encode(&Head::Cmd(s), &[], false, false, 1);
        // Unknown type, wrong direction, wrong HLEN, PLEN shorter than the header.
        let mut b = good.clone();
        b[0] = 0x42;
        assert_eq!(
            decode(&b, Side::Controller, &n),
            Err(PduError::InvalidField(0))
        );
        assert_eq!(
            decode(&good, Side::Host, &n),
            Err(PduError::InvalidField(0))
        );
        let mut b = good.clone();
        b[2] = 71;
        assert_eq!(
            decode(&b, Side::Controller, &n),
            Err(PduError::InvalidField(2))
        );
        let mut b = good.clone();
        b[4..8].copy_from_slice(&10u32.to_le_bytes());
        assert_eq!(
            decode(&b, Side::Controller, &n),
            Err(PduError::InvalidField(4))
        );
        // Digest flags that disagree with the negotiation.
        assert_eq!(
            decode(&good, Side::Controller, &neg(true, false)),
            Err(PduError::InvalidField(1))
        );
        // Huge PLEN is refused from the header alone, before anything is read or allocated.
        let mut b = good.clone();
        b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        b[3] = CMD_HLEN as u8;
        assert_eq!(
            decode(&b[..CH_LEN], Side::Controller, &n),
            Err(PduError::TooLarge(u32::MAX as u64 - CMD_HLEN as u64))
        );
        // PDO inside the header.
        let mut b = encode(&Head::Cmd(s), &[1; 16], false, false, 1);
        b[3] = 8;
        assert_eq!(
            decode(&b, Side::Controller, &n),
            Err(PduError::InvalidField(3))
        );
        // DATAL that disagrees with PLEN.
        let d = DataHdr {
            cccid: 1,
            ttag: 1,
            datao: 0,
            datal: 16,
            last: true,
            success: false,
        };
        let mut b = encode(&Head::H2CData(d), &[1; 16], false, false, 1);
        b[16] = 17;
        assert_eq!(
            decode(&b, Side::Controller, &n),
            Err(PduError::InvalidField(16))
        );
        // An ICReq after the exchange, a command before it.
        let ic = encode(
            &Head::IcReq(IcReq {
                pfv: 0,
                hpda: 0,
                hdgst: false,
                ddgst: false,
                maxr2t: 0,
            }),
            &[],
            false,
            false,
            1,
        );
        assert_eq!(
            decode(&ic, Side::Controller, &n),
            Err(PduError::Sequence(0))
        );
        assert_eq!(
            decode(&good, Side::Controller, &Negotiated::initial()),
            Err(PduError::Sequence(4))
        );
        // A non-zero PDU format version.
        let mut b = ic.clone();
        b[8] = 1;
        assert_eq!(
            decode(&b, Side::Controller, &Negotiated::initial()),
            Err(PduError::InvalidField(8))
        );
        // A data PDU without data; a response with data.
        let mut b = encode(&Head::H2CData(d), &[1; 16], false, false, 1);
        b[4..8].copy_from_slice(&24u32.to_le_bytes());
        assert_eq!(
            decode(&b, Side::Controller, &n),
            Err(PduError::InvalidField(4))
        );
        let mut b = encode(&Head::Resp(Cqe::default()), &[], false, false, 1);
        b[4..8].copy_from_slice(&40u32.to_le_bytes());
        b.resize(40, 0);
        assert_eq!(decode(&b, Side::Host, &n), Err(PduError::InvalidField(4)));
    }
}
