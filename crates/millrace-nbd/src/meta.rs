//! Metadata contexts and block status: NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT
//! negotiate them, NBD_CMD_BLOCK_STATUS asks for one range's status. The one context offered is
//! `base:allocation`, answered from the volume's allocation map (`BlockDevice::allocation`):
//! a hole reads as zeroes and holds no space (NBD_STATE_HOLE | NBD_STATE_ZERO), anything else
//! is data (0). That is what lets `qemu-img convert`, `nbdcopy` and backups skip the zeroes.

use millrace_block::Extent;

// The commands and flags live with the others in `proto`, which never looks here.
use crate::proto::{put_structured_header, REPLY_FLAG_DONE, STRUCTURED_HEADER_LEN};
pub use crate::proto::{CMD_BLOCK_STATUS, CMD_FLAG_FAST_ZERO, CMD_FLAG_REQ_ONE};

pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const REP_META_CONTEXT: u32 = 4;
pub const TF_SEND_FAST_ZERO: u16 = 1 << 11;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const STATE_HOLE: u32 = 1;
pub const STATE_ZERO: u32 = 2;
/// What a fast zero that would be slow is refused with, as the protocol says.
pub const ENOTSUP: u32 = 95;

pub const BASE_ALLOCATION: &str = "base:allocation";
/// The id `base:allocation` gets on every connection (ids are the server's choice).
pub const ALLOCATION_ID: u32 = 1;
/// Queries a client may send in one option: far more than any real client does.
const MAX_QUERIES: usize = 64;

/// The data of NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    pub export: String,
    pub queries: Vec<String>,
}

fn take_u32(d: &[u8], at: &mut usize) -> Result<u32, String> {
    let b = d
        .get(*at..*at + 4)
        .ok_or_else(|| format!("the option ends at byte {} inside a length", d.len()))?;
    *at += 4;
    Ok(u32::from_be_bytes(b.try_into().unwrap()))
}

fn take_string(d: &[u8], at: &mut usize) -> Result<String, String> {
    let n = take_u32(d, at)? as usize;
    let end = at.checked_add(n).filter(|&e| e <= d.len()).ok_or_else(|| {
        format!(
            "a string of {n} bytes does not fit in the {} bytes of the option",
            d.len()
        )
    })?;
    let s = crate::proto::parse_name(&d[*at..end])?;
    *at = end;
    Ok(s)
}

/// Parses the option's data; the error is a sentence for NBD_REP_ERR_INVALID.
pub fn parse_meta_request(d: &[u8]) -> Result<MetaRequest, String> {
    let mut at = 0;
    let export = take_string(d, &mut at)?;
    let n = take_u32(d, &mut at)? as usize;
    if n > MAX_QUERIES {
        return Err(format!(
            "the option carries {n} queries; this server accepts at most {MAX_QUERIES}"
        ));
    }
    let mut queries = Vec::with_capacity(n);
    for _ in 0..n {
        queries.push(take_string(d, &mut at)?);
    }
    if at != d.len() {
        return Err(format!(
            "the option carries {} bytes after its {n} queries",
            d.len() - at
        ));
    }
    Ok(MetaRequest { export, queries })
}

/// Whether the queries select `base:allocation`. For LIST, no query means "every context", and
/// `base:` means every context of the base namespace.
pub fn selects_allocation(queries: &[String], list: bool) -> bool {
    if list && queries.is_empty() {
        return true;
    }
    queries
        .iter()
        .any(|q| q == BASE_ALLOCATION || (list && q == "base:"))
}

/// NBD_REP_META_CONTEXT data: the id and the name.
pub fn rep_meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + name.len());
    b.extend_from_slice(&id.to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    b
}

/// The status flags of one extent of `base:allocation`.
pub fn allocation_flags(e: &Extent) -> u32 {
    if e.zero {
        STATE_HOLE | STATE_ZERO
    } else {
        0
    }
}

/// A complete, final NBD_REPLY_TYPE_BLOCK_STATUS chunk for `extents` (in order, from the
/// request's offset), at most one descriptor with `one`. Extents are merged where their flags
/// agree and cut to the protocol's 32-bit lengths.
pub fn block_status_chunk(handle: u64, extents: &[Extent], one: bool) -> Vec<u8> {
    let mut descs: Vec<(u32, u32)> = Vec::new();
    for e in extents {
        let flags = allocation_flags(e);
        let mut left = e.len;
        while left > 0 {
            if let Some(last) = descs.last_mut().filter(|d| d.1 == flags) {
                let room = u64::from(u32::MAX - last.0).min(left);
                if room > 0 {
                    last.0 += room as u32;
                    left -= room;
                    continue;
                }
            }
            let n = left.min(u64::from(u32::MAX));
            descs.push((n as u32, flags));
            left -= n;
        }
    }
    if one {
        descs.truncate(1);
    }
    let len = 4 + 8 * descs.len();
    let mut b = vec![0u8; STRUCTURED_HEADER_LEN];
    put_structured_header(
        &mut b,
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        handle,
        len as u32,
    );
    b.extend_from_slice(&ALLOCATION_ID.to_be_bytes());
    for (l, f) in descs {
        b.extend_from_slice(&l.to_be_bytes());
        b.extend_from_slice(&f.to_be_bytes());
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(name: &str, qs: &[&str]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(qs.len() as u32).to_be_bytes());
        for q in qs {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q.as_bytes());
        }
        d
    }

    #[test]
    fn meta_requests_parse_and_refuse_garbage() {
        let r = parse_meta_request(&req("vol", &["base:allocation", "qemu:dirty"])).unwrap();
        assert_eq!(r.export, "vol");
        assert_eq!(r.queries, vec!["base:allocation", "qemu:dirty"]);
        let mut long = req("vol", &["base:allocation"]);
        long.push(0);
        assert!(parse_meta_request(&long).is_err());
        assert!(parse_meta_request(&long[..long.len() - 3]).is_err());
        assert!(parse_meta_request(&[0xff, 0xff, 0xff, 0xff]).is_err());
        let mut many = req("v", &[]);
        many[5..9].copy_from_slice(&1000u32.to_be_bytes());
        assert!(parse_meta_request(&many).is_err());
    }

    #[test]
    fn selection() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(selects_allocation(&s(&[]), true));
        assert!(!selects_allocation(&s(&[]), false));
        assert!(selects_allocation(&s(&["base:"]), true));
        assert!(!selects_allocation(&s(&["base:"]), false));
        assert!(selects_allocation(&s(&["x:y", "base:allocation"]), false));
        assert!(!selects_allocation(&s(&["qemu:dirty-bitmap:a"]), true));
    }

    #[test]
    fn block_status_chunks_merge_and_cut() {
        let e = |len, zero| Extent { len, zero };
        let c = block_status_chunk(7, &[e(4096, true), e(4096, true), e(8192, false)], false);
        assert_eq!(&c[6..8], &REPLY_TYPE_BLOCK_STATUS.to_be_bytes());
        assert_eq!(&c[16..20], &20u32.to_be_bytes());
        assert_eq!(&c[20..24], &ALLOCATION_ID.to_be_bytes());
        assert_eq!(&c[24..28], &8192u32.to_be_bytes());
        assert_eq!(&c[28..32], &3u32.to_be_bytes());
        assert_eq!(&c[32..36], &8192u32.to_be_bytes());
        assert_eq!(&c[36..40], &0u32.to_be_bytes());
        let one = block_status_chunk(7, &[e(4096, true), e(1, false)], true);
        assert_eq!(one.len(), 20 + 4 + 8);
        let big = block_status_chunk(1, &[e(u64::from(u32::MAX) + 10, false)], false);
        assert_eq!(big.len(), 20 + 4 + 16);
    }
}
