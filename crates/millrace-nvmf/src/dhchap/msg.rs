//! The authentication messages, as carried by Authentication Send (host to controller) and
//! Authentication Receive (controller to host). Every message starts with its type (00h common,
//! 01h DH-HMAC-CHAP), its id and the transaction id (bytes 4-5, little-endian). Decoding checks
//! every length against the buffer and never panics.

use super::{DhGroup, Hash};

/// Security protocol and its specific fields of Authentication Send and Receive (CDW10).
pub const SECP: u8 = 0xe9;
pub const SPSP0: u8 = 0x01;
pub const SPSP1: u8 = 0x01;

/// Message types (AUTH_TYPE) and ids (AUTH_ID).
pub const TYPE_COMMON: u8 = 0x00;
pub const TYPE_DHCHAP: u8 = 0x01;
pub const ID_NEGOTIATE: u8 = 0x00;
pub const ID_CHALLENGE: u8 = 0x01;
pub const ID_REPLY: u8 = 0x02;
pub const ID_SUCCESS1: u8 = 0x03;
pub const ID_SUCCESS2: u8 = 0x04;
pub const ID_FAILURE2: u8 = 0xf0;
pub const ID_FAILURE1: u8 = 0xf1;
/// The DH-HMAC-CHAP protocol in a Negotiate's descriptors (AUTHID).
pub const AUTHID_DHCHAP: u8 = 0x01;

/// Failure reason code (RCODE) and its explanations (RCODEEX).
pub const RCODE_FAILURE: u8 = 0x01;
pub mod why {
    pub const FAILED: u8 = 0x01;
    pub const PROTOCOL_NOT_USABLE: u8 = 0x02;
    pub const SCC_MISMATCH: u8 = 0x03;
    pub const HASH_NOT_USABLE: u8 = 0x04;
    pub const GROUP_NOT_USABLE: u8 = 0x05;
    pub const INCORRECT_PAYLOAD: u8 = 0x06;
    pub const INCORRECT_MESSAGE: u8 = 0x07;
}

/// AUTH_Negotiate: the host's proposal (only the DH-HMAC-CHAP descriptor is kept).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiate {
    pub tid: u16,
    pub sc_c: u8,
    pub hashes: Vec<u8>,
    pub groups: Vec<u8>,
}

/// DH-HMAC-CHAP_Challenge (controller to host).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    pub tid: u16,
    pub hash: Hash,
    pub group: DhGroup,
    pub seqnum: u32,
    pub c1: Vec<u8>,
    pub dhv: Vec<u8>,
}

/// DH-HMAC-CHAP_Reply (host to controller). `c2` is Some when the host asks the controller
/// to prove itself (CVALID).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub tid: u16,
    pub r1: Vec<u8>,
    pub c2: Option<Vec<u8>>,
    pub seqnum: u32,
    pub dhv: Vec<u8>,
}

/// One message, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    Negotiate(Negotiate),
    Challenge(Challenge),
    Reply(Reply),
    /// DH-HMAC-CHAP_Success1, with the controller's response when it proves itself.
    Success1 {
        tid: u16,
        r2: Option<Vec<u8>>,
    },
    Success2 {
        tid: u16,
    },
    /// AUTH_Failure1 (controller to host) or AUTH_Failure2 (host to controller).
    Failure {
        tid: u16,
        first: bool,
        why: u8,
    },
}

fn head(kind: u8, id: u8, tid: u16) -> Vec<u8> {
    let mut v = vec![kind, id, 0, 0];
    v.extend_from_slice(&tid.to_le_bytes());
    v
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Msg {
    pub fn tid(&self) -> u16 {
        match self {
            Msg::Negotiate(n) => n.tid,
            Msg::Challenge(c) => c.tid,
            Msg::Reply(r) => r.tid,
            Msg::Success1 { tid, .. } | Msg::Success2 { tid } | Msg::Failure { tid, .. } => *tid,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        match self {
            Msg::Negotiate(n) => {
                let mut v = head(TYPE_COMMON, ID_NEGOTIATE, n.tid);
                v.extend_from_slice(&[n.sc_c, 1]);
                let mut d = [0u8; 64];
                d[0] = AUTHID_DHCHAP;
                d[2] = n.hashes.len().min(30) as u8;
                d[3] = n.groups.len().min(30) as u8;
                for (i, h) in n.hashes.iter().take(30).enumerate() {
                    d[4 + i] = *h;
                }
                for (i, g) in n.groups.iter().take(30).enumerate() {
                    d[34 + i] = *g;
                }
                v.extend_from_slice(&d);
                v
            }
            Msg::Challenge(c) => {
                let mut v = head(TYPE_DHCHAP, ID_CHALLENGE, c.tid);
                v.extend_from_slice(&[c.hash.bytes() as u8, 0, c.hash.id(), c.group.id()]);
                v.extend_from_slice(&(c.dhv.len() as u16).to_le_bytes());
                v.extend_from_slice(&c.seqnum.to_le_bytes());
                v.extend_from_slice(&c.c1);
                v.extend_from_slice(&c.dhv);
                v
            }
            Msg::Reply(r) => {
                let mut v = head(TYPE_DHCHAP, ID_REPLY, r.tid);
                v.extend_from_slice(&[r.r1.len() as u8, 0, r.c2.is_some() as u8, 0]);
                v.extend_from_slice(&(r.dhv.len() as u16).to_le_bytes());
                v.extend_from_slice(&r.seqnum.to_le_bytes());
                v.extend_from_slice(&r.r1);
                match &r.c2 {
                    Some(c) => v.extend_from_slice(c),
                    None => v.resize(v.len() + r.r1.len(), 0),
                }
                v.extend_from_slice(&r.dhv);
                v
            }
            Msg::Success1 { tid, r2 } => Msg::success1(*tid, r2.as_deref(), 0),
            Msg::Success2 { tid } => {
                let mut v = head(TYPE_DHCHAP, ID_SUCCESS2, *tid);
                v.resize(16, 0);
                v
            }
            Msg::Failure { tid, first, why } => {
                let id = if *first { ID_FAILURE1 } else { ID_FAILURE2 };
                let mut v = head(TYPE_COMMON, id, *tid);
                v.extend_from_slice(&[RCODE_FAILURE, *why]);
                v
            }
        }
    }

    /// Success1 carries HL bytes for the response whether or not it is valid (RVALID).
    pub fn success1(tid: u16, r2: Option<&[u8]>, hl: usize) -> Vec<u8> {
        let mut v = head(TYPE_DHCHAP, ID_SUCCESS1, tid);
        let hl = r2.map_or(hl, |r| r.len());
        v.extend_from_slice(&[hl as u8, 0, r2.is_some() as u8]);
        v.resize(16, 0);
        match r2 {
            Some(r) => v.extend_from_slice(r),
            None => v.resize(16 + hl, 0),
        }
        v
    }

    /// Decodes a message; Err is a sentence naming what is wrong.
    pub fn decode(b: &[u8]) -> Result<Msg, &'static str> {
        if b.len() < 8 {
            return Err("the message is shorter than its header");
        }
        let tid = le16(b, 4);
        match (b[0], b[1]) {
            (TYPE_COMMON, ID_NEGOTIATE) => decode_negotiate(b, tid),
            (TYPE_DHCHAP, ID_CHALLENGE) => decode_challenge(b, tid),
            (TYPE_DHCHAP, ID_REPLY) => decode_reply(b, tid),
            (TYPE_DHCHAP, ID_SUCCESS1) => {
                let hl = b[6] as usize;
                let r = b
                    .get(16..16 + hl)
                    .ok_or("a Success1 shorter than its response")?;
                let r2 = (b[8] & 1 == 1).then(|| r.to_vec());
                Ok(Msg::Success1 { tid, r2 })
            }
            (TYPE_DHCHAP, ID_SUCCESS2) => Ok(Msg::Success2 { tid }),
            (TYPE_COMMON | TYPE_DHCHAP, id @ (ID_FAILURE1 | ID_FAILURE2)) => Ok(Msg::Failure {
                tid,
                first: id == ID_FAILURE1,
                why: b[7],
            }),
            _ => Err("an unknown message type"),
        }
    }
}

fn decode_negotiate(b: &[u8], tid: u16) -> Result<Msg, &'static str> {
    let napd = b[7] as usize;
    if napd == 0 || b.len() < 8 + 64 * napd {
        return Err("a Negotiate whose protocol descriptors are missing or cut short");
    }
    let d = (0..napd)
        .map(|i| &b[8 + 64 * i..8 + 64 * (i + 1)])
        .find(|d| d[0] == AUTHID_DHCHAP)
        .ok_or("a Negotiate without DH-HMAC-CHAP")?;
    let (hl, gl) = (d[2] as usize, d[3] as usize);
    if hl > 30 || gl > 30 {
        return Err("a Negotiate with more than 30 hash or group ids");
    }
    Ok(Msg::Negotiate(Negotiate {
        tid,
        sc_c: b[6],
        hashes: d[4..4 + hl].to_vec(),
        groups: d[34..34 + gl].to_vec(),
    }))
}

fn decode_challenge(b: &[u8], tid: u16) -> Result<Msg, &'static str> {
    if b.len() < 16 {
        return Err("a Challenge shorter than its header");
    }
    let hash = Hash::from_id(b[8]).ok_or("a Challenge with an unknown hash")?;
    let group = DhGroup::from_id(b[9]).ok_or("a Challenge with an unknown group")?;
    let (hl, dl) = (b[6] as usize, le16(b, 10) as usize);
    if hl != hash.bytes() || dl != group.bytes() || b.len() < 16 + hl + dl {
        return Err("a Challenge whose lengths do not match its hash, group or size");
    }
    Ok(Msg::Challenge(Challenge {
        tid,
        hash,
        group,
        seqnum: le32(b, 12),
        c1: b[16..16 + hl].to_vec(),
        dhv: b[16 + hl..16 + hl + dl].to_vec(),
    }))
}

fn decode_reply(b: &[u8], tid: u16) -> Result<Msg, &'static str> {
    if b.len() < 16 {
        return Err("a Reply shorter than its header");
    }
    let (hl, dl) = (b[6] as usize, le16(b, 10) as usize);
    if b.len() < 16 + 2 * hl + dl {
        return Err("a Reply shorter than its response, challenge and DH value");
    }
    Ok(Msg::Reply(Reply {
        tid,
        r1: b[16..16 + hl].to_vec(),
        c2: (b[8] & 1 == 1).then(|| b[16 + hl..16 + 2 * hl].to_vec()),
        seqnum: le32(b, 12),
        dhv: b[16 + 2 * hl..16 + 2 * hl + dl].to_vec(),
    }))
}
