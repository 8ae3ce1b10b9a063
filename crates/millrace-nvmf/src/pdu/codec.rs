//! Whole PDUs in memory: decoding one from the front of a byte buffer, and encoding a header
//! (with its digest and padding) or a whole PDU into bytes.

use super::consts::{digest, expected_hlen, flags, CH_LEN, DIGEST_LEN, IC_LEN};
use super::error::PduError;
use super::frame::{frame, Ch, Negotiated, Side};
use super::head::{decode_head, le32, Head};

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
    let mut h = Vec::with_capacity(IC_LEN + DIGEST_LEN + align);
    encode_head_into(&mut h, head, data, hdgst, ddgst, align);
    h
}

/// [`encode_head`], appended to `out` (a sender's batch: no allocation per PDU).
pub fn encode_head_into(
    out: &mut Vec<u8>,
    head: &Head,
    data: &[u8],
    hdgst: bool,
    ddgst: bool,
    align: usize,
) {
    encode_head_len_into(out, head, data.len(), hdgst, ddgst, align)
}

/// `encode_head_into` for a PDU of `data_len` bytes of data, wherever they are.
pub fn encode_head_len_into(
    out: &mut Vec<u8>,
    head: &Head,
    data_len: usize,
    hdgst: bool,
    ddgst: bool,
    align: usize,
) {
    let base = out.len();
    let (t, mut fl) = head.type_and_flags();
    let ic_or_term = matches!(
        head,
        Head::IcReq(_) | Head::IcResp(_) | Head::TermReq { .. }
    );
    let hdgst = hdgst && !ic_or_term;
    let ddgst = ddgst && !ic_or_term && data_len > 0;
    if hdgst {
        fl |= flags::HDGST;
    }
    if ddgst {
        fl |= flags::DDGST;
    }
    let hlen = expected_hlen(t).expect("known type");
    out.extend_from_slice(&[t, fl, hlen as u8, 0, 0, 0, 0, 0]);
    head.put_fields(out);
    out.resize(base + hlen, 0);
    let head_total = hlen + if hdgst { DIGEST_LEN } else { 0 };
    let align = align.max(1);
    // Termination requests carry their data right after the header, with PDO reserved.
    let (pdo, data_at) = if data_len == 0 || ic_or_term {
        (0, head_total)
    } else {
        let p = head_total.div_ceil(align) * align;
        (p, p)
    };
    let plen = data_at + data_len + if ddgst { DIGEST_LEN } else { 0 };
    out[base + 3] = pdo as u8;
    out[base + 4..base + 8].copy_from_slice(&(plen as u32).to_le_bytes());
    if hdgst {
        let d = digest(&out[base..]);
        out.extend_from_slice(&d.to_le_bytes());
    }
    out.resize(base + data_at, 0);
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
