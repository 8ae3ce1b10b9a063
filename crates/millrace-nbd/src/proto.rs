//! The NBD wire format: constants and pure encode/decode functions, with no I/O, so that every
//! byte layout is unit-tested on its own. Numbers follow the NBD protocol document
//! (NetworkBlockDevice/nbd, doc/proto.md); all integers are big-endian on the wire.

/// "NBDMAGIC": the first eight bytes a server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": newstyle negotiation, and the prefix of every option the client sends.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Prefix of every option reply.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_NO_ZEROES: u32 = 1 << 1;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;

// Option reply types; errors have bit 31 set.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const REP_ERR_POLICY: u32 = 0x8000_0002;
pub const REP_ERR_INVALID: u32 = 0x8000_0003;
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;

// Information types in NBD_REP_INFO.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub const TF_HAS_FLAGS: u16 = 1 << 0;
pub const TF_READ_ONLY: u16 = 1 << 1;
pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;
pub const TF_SEND_TRIM: u16 = 1 << 5;
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TF_SEND_DF: u16 = 1 << 7;
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TF_SEND_CACHE: u16 = 1 << 10;

// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// Structured reply chunks.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_ERROR: u16 = 0x8001;

// Error values (the protocol's own list, numerically equal to Linux errno).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const ESHUTDOWN: u32 = 108;

/// Size of a request header.
pub const REQUEST_LEN: usize = 28;
/// Size of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Size of a structured reply chunk header.
pub const STRUCTURED_HEADER_LEN: usize = 20;
/// The largest payload (read or write) we accept, which is also what we advertise as the
/// maximum block size: the protocol's portable limit, so every client already respects it.
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Strings (names, descriptions, messages) are at most this long by the protocol.
pub const MAX_STRING: usize = 4096;

/// The fixed-size greeting: magic, newstyle magic, handshake flags.
pub fn greeting() -> [u8; 18] {
    let mut b = [0u8; 18];
    b[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    b
}

/// An option header as the client sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub magic: u64,
    pub option: u32,
    pub len: u32,
}

pub fn parse_option_header(b: &[u8; 16]) -> OptionHeader {
    OptionHeader {
        magic: u64::from_be_bytes(b[0..8].try_into().unwrap()),
        option: u32::from_be_bytes(b[8..12].try_into().unwrap()),
        len: u32::from_be_bytes(b[12..16].try_into().unwrap()),
    }
}

/// One option reply: magic, option, type, length, data.
pub fn option_reply(option: u32, reply: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&reply.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// NBD_REP_SERVER data for NBD_OPT_LIST: the name, prefixed by its length.
pub fn rep_server(name: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + name.len());
    b.extend_from_slice(&(name.len() as u32).to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    b
}

/// NBD_INFO_EXPORT: size and transmission flags.
pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut b = Vec::with_capacity(12);
    b.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b
}

/// NBD_INFO_NAME or NBD_INFO_DESCRIPTION: a type and a string.
pub fn info_string(kind: u16, s: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(2 + s.len());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(s.as_bytes());
    b
}

/// NBD_INFO_BLOCK_SIZE: minimum, preferred and maximum.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(14);
    b.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    b.extend_from_slice(&min.to_be_bytes());
    b.extend_from_slice(&preferred.to_be_bytes());
    b.extend_from_slice(&max.to_be_bytes());
    b
}

/// The reply to NBD_OPT_EXPORT_NAME: size, flags and, unless the client negotiated
/// NO_ZEROES, 124 reserved zero bytes.
pub fn export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(10 + 124);
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        b.extend_from_slice(&[0u8; 124]);
    }
    b
}

/// The data of NBD_OPT_INFO and NBD_OPT_GO: an export name and the information types asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

/// Parses NBD_OPT_INFO / NBD_OPT_GO data; the error is a sentence for NBD_REP_ERR_INVALID.
pub fn parse_info_request(d: &[u8]) -> Result<InfoRequest, String> {
    if d.len() < 6 {
        return Err(format!(
            "the option carries {} bytes, fewer than the 6 of an empty name and no requests",
            d.len()
        ));
    }
    let name_len = u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize;
    if name_len > MAX_STRING || 4 + name_len + 2 > d.len() {
        return Err(format!(
            "the export name length {name_len} does not fit in the {} bytes of the option",
            d.len()
        ));
    }
    let name = parse_name(&d[4..4 + name_len])?;
    let rest = &d[4 + name_len..];
    let n = u16::from_be_bytes(rest[0..2].try_into().unwrap()) as usize;
    if rest.len() != 2 + 2 * n {
        return Err(format!(
            "the option announces {n} information requests but carries {} bytes for them",
            rest.len() - 2
        ));
    }
    let requests = rest[2..]
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    Ok(InfoRequest { name, requests })
}

/// An export name as the protocol defines strings: UTF-8 without NUL, at most 4096 bytes.
pub fn parse_name(b: &[u8]) -> Result<String, String> {
    if b.len() > MAX_STRING {
        return Err(format!(
            "the export name is {} bytes, longer than the protocol's {MAX_STRING}",
            b.len()
        ));
    }
    let s = std::str::from_utf8(b).map_err(|_| "the export name is not UTF-8".to_string())?;
    if s.contains('\0') {
        return Err("the export name contains a NUL character".to_string());
    }
    Ok(s.to_string())
}

/// A transmission-phase request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub offset: u64,
    pub len: u32,
}

/// Parses a request header, refusing a wrong magic (the stream cannot be resynchronised then).
pub fn parse_request(b: &[u8; REQUEST_LEN]) -> Result<Request, u32> {
    let magic = u32::from_be_bytes(b[0..4].try_into().unwrap());
    if magic != REQUEST_MAGIC {
        return Err(magic);
    }
    Ok(Request {
        flags: u16::from_be_bytes(b[4..6].try_into().unwrap()),
        kind: u16::from_be_bytes(b[6..8].try_into().unwrap()),
        handle: u64::from_be_bytes(b[8..16].try_into().unwrap()),
        offset: u64::from_be_bytes(b[16..24].try_into().unwrap()),
        len: u32::from_be_bytes(b[24..28].try_into().unwrap()),
    })
}

/// Encodes a request header (for tests and in-process clients).
pub fn encode_request(r: &Request) -> [u8; REQUEST_LEN] {
    let mut b = [0u8; REQUEST_LEN];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.kind.to_be_bytes());
    b[8..16].copy_from_slice(&r.handle.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset.to_be_bytes());
    b[24..28].copy_from_slice(&r.len.to_be_bytes());
    b
}

/// Writes a simple reply header into the first 16 bytes of `b`.
pub fn put_simple_reply(b: &mut [u8], error: u32, handle: u64) {
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
}

/// Writes a structured reply chunk header into the first 20 bytes of `b`.
pub fn put_structured_header(b: &mut [u8], flags: u16, kind: u16, handle: u64, len: u32) {
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
}

/// A complete, final structured error chunk with a message for a human.
pub fn structured_error(handle: u64, error: u32, message: &str) -> Vec<u8> {
    // The message length field is 16 bits; our messages are short, but never overflow it.
    let msg = &message.as_bytes()[..message.len().min(MAX_STRING)];
    let mut b = vec![0u8; STRUCTURED_HEADER_LEN];
    put_structured_header(
        &mut b,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        handle,
        6 + msg.len() as u32,
    );
    b.extend_from_slice(&error.to_be_bytes());
    b.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    b.extend_from_slice(msg);
    b
}

/// A complete, final structured chunk that says "done, nothing more" (success without data).
pub fn structured_none(handle: u64) -> Vec<u8> {
    let mut b = vec![0u8; STRUCTURED_HEADER_LEN];
    put_structured_header(&mut b, REPLY_FLAG_DONE, REPLY_TYPE_NONE, handle, 0);
    b
}

/// The command flags a request of `kind` may carry, given what was negotiated; anything else
/// earns EINVAL. FUA is accepted on every command because the protocol says existing clients
/// set it on commands that do not write.
pub fn allowed_flags(kind: u16, structured: bool) -> u16 {
    match kind {
        CMD_READ if structured => CMD_FLAG_FUA | CMD_FLAG_DF,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
        _ => CMD_FLAG_FUA,
    }
}

/// The block sizes we advertise. The device handles any alignment, so the honest minimum is 1;
/// the preferred size is the device's preferred I/O (a full stripe) rounded up to a power of
/// two as the protocol requires, kept between 4 KiB and 4 MiB so that clients neither split
/// requests finely nor build huge ones; the maximum is `max`, the largest buffer of the server's
/// pool (at most the protocol's portable 32 MiB, at least 4 KiB), which the preferred size
/// never exceeds.
pub fn block_sizes(preferred_io: u64, block: u32, max: u32) -> (u32, u32, u32) {
    let max = max.clamp(4096, MAX_PAYLOAD) as u64;
    let top = max.min(4 << 20);
    let floor = (block.max(512) as u64).next_power_of_two().max(4096);
    let preferred = preferred_io
        .max(1)
        .checked_next_power_of_two()
        .unwrap_or(top)
        .clamp(floor.min(top), top);
    (1, preferred as u32, max as u32)
}

/// The protocol's error value for an I/O error from the device.
pub fn errno_of(e: &std::io::Error) -> u32 {
    use std::io::ErrorKind as K;
    match e.raw_os_error() {
        Some(n) if n == 28 || n == 122 || n == 27 => return ENOSPC, // ENOSPC, EDQUOT, EFBIG
        Some(1) | Some(13) | Some(30) => return EPERM,              // EPERM, EACCES, EROFS
        Some(22) => return EINVAL,
        _ => {}
    }
    match e.kind() {
        K::InvalidInput => EINVAL,
        K::PermissionDenied => EPERM,
        _ => EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_is_magics_and_flags() {
        let g = greeting();
        assert_eq!(&g[0..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(&g[16..18], &[0, 3]);
    }

    #[test]
    fn option_reply_layout() {
        let r = option_reply(OPT_GO, REP_ERR_UNKNOWN, b"no");
        assert_eq!(r.len(), 22);
        assert_eq!(&r[0..8], &[0, 3, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9]);
        assert_eq!(&r[8..12], &[0, 0, 0, 7]);
        assert_eq!(&r[12..16], &[0x80, 0, 0, 6]);
        assert_eq!(&r[16..20], &[0, 0, 0, 2]);
        assert_eq!(&r[20..], b"no");
    }

    #[test]
    fn info_payloads() {
        assert_eq!(
            info_export(0x0102, 0x0304),
            vec![0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]
        );
        assert_eq!(
            info_block_size(1, 4096, 32 << 20),
            vec![0, 3, 0, 0, 0, 1, 0, 0, 0x10, 0, 0x02, 0, 0, 0]
        );
        assert_eq!(info_string(INFO_NAME, "ab"), vec![0, 1, b'a', b'b']);
        assert_eq!(rep_server("vol"), vec![0, 0, 0, 3, b'v', b'o', b'l']);
        assert_eq!(export_name_reply(5, 1, true).len(), 10);
        assert_eq!(export_name_reply(5, 1, false).len(), 134);
    }

    #[test]
    fn info_request_parses_and_refuses_garbage() {
        let mut d = vec![0, 0, 0, 3];
        d.extend_from_slice(b"vol");
        d.extend_from_slice(&[0, 2, 0, 3, 0, 1]);
        assert_eq!(
            parse_info_request(&d).unwrap(),
            InfoRequest {
                name: "vol".into(),
                requests: vec![INFO_BLOCK_SIZE, INFO_NAME]
            }
        );
        // Name longer than the option, odd request count, short data, huge name length.
        assert!(parse_info_request(&[0, 0, 0, 9, b'a', 0, 0]).is_err());
        assert!(parse_info_request(&[0, 0, 0, 0, 0, 2, 0, 1]).is_err());
        assert!(parse_info_request(&[0, 0, 0]).is_err());
        assert!(parse_info_request(&[0xff, 0xff, 0xff, 0xff, 0, 0]).is_err());
        assert!(parse_info_request(&[0, 0, 0, 1, 0, 0, 0]).is_err()); // NUL in the name
        assert!(parse_info_request(&[0, 0, 0, 1, 0xff, 0, 0]).is_err()); // not UTF-8
    }

    #[test]
    fn request_round_trip_and_bad_magic() {
        let r = Request {
            flags: CMD_FLAG_FUA,
            kind: CMD_WRITE,
            handle: 0xdead_beef_0000_0001,
            offset: 1 << 40,
            len: 4096,
        };
        let b = encode_request(&r);
        assert_eq!(&b[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(parse_request(&b).unwrap(), r);
        let mut bad = b;
        bad[0] = 0;
        assert_eq!(parse_request(&bad), Err(0x0060_9513));
    }

    #[test]
    fn reply_headers() {
        let mut b = [0u8; 16];
        put_simple_reply(&mut b, EINVAL, 7);
        assert_eq!(
            b,
            [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 22, 0, 0, 0, 0, 0, 0, 0, 7]
        );
        let e = structured_error(9, ENOSPC, "full");
        assert_eq!(&e[0..4], &[0x66, 0x8e, 0x33, 0xef]);
        assert_eq!(&e[4..8], &[0, 1, 0x80, 0x01]);
        assert_eq!(&e[16..20], &[0, 0, 0, 10]);
        assert_eq!(&e[20..26], &[0, 0, 0, 28, 0, 4]);
        assert_eq!(&e[26..], b"full");
        let n = structured_none(3);
        assert_eq!(n.len(), 20);
        assert_eq!(&n[4..8], &[0, 1, 0, 0]);
    }

    #[test]
    fn flags_per_command() {
        assert_eq!(allowed_flags(CMD_READ, false), CMD_FLAG_FUA);
        assert_eq!(allowed_flags(CMD_READ, true), CMD_FLAG_FUA | CMD_FLAG_DF);
        assert_eq!(
            allowed_flags(CMD_WRITE_ZEROES, false),
            CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO
        );
        assert_eq!(allowed_flags(CMD_TRIM, true), CMD_FLAG_FUA);
    }

    #[test]
    fn block_sizes_are_powers_of_two_within_limits() {
        assert_eq!(block_sizes(4096, 4096, MAX_PAYLOAD), (1, 4096, 32 << 20));
        // A RAID6 stripe of 14 x 64 KiB is not a power of two: round up.
        assert_eq!(
            block_sizes(14 * 65536, 4096, MAX_PAYLOAD),
            (1, 1 << 20, 32 << 20)
        );
        assert_eq!(
            block_sizes(1 << 30, 4096, MAX_PAYLOAD),
            (1, 4 << 20, 32 << 20)
        );
        assert_eq!(block_sizes(0, 512, MAX_PAYLOAD), (1, 4096, 32 << 20));
        assert_eq!(
            block_sizes(u64::MAX, 512, MAX_PAYLOAD),
            (1, 4 << 20, 32 << 20)
        );
        assert_eq!(block_sizes(512, 16384, MAX_PAYLOAD), (1, 16384, 32 << 20));
        // A small pool: its largest buffer is the maximum, and caps the preferred size.
        assert_eq!(block_sizes(1 << 30, 4096, 1 << 20), (1, 1 << 20, 1 << 20));
        assert_eq!(block_sizes(4096, 4096, 1 << 20), (1, 4096, 1 << 20));
        assert_eq!(block_sizes(4096, 4096, u32::MAX), (1, 4096, 32 << 20));
    }

    #[test]
    fn errno_mapping() {
        use std::io::{Error, ErrorKind};
        assert_eq!(errno_of(&Error::from_raw_os_error(28)), ENOSPC);
        assert_eq!(errno_of(&Error::from_raw_os_error(30)), EPERM);
        assert_eq!(errno_of(&Error::new(ErrorKind::InvalidInput, "x")), EINVAL);
        assert_eq!(errno_of(&Error::other("x")), EIO);
    }
}
