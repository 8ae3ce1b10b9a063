//! NVMe submission and completion queue entries as they travel inside capsules, the opcodes
//! Millrace knows and the status codes it answers with. Field positions follow the NVMe base
//! specification and the NVMe over Fabrics specification (Connect, Property Get/Set).

/// Size of a submission queue entry (a command).
pub const SQE_LEN: usize = 64;
/// Size of a completion queue entry (a response).
pub const CQE_LEN: usize = 16;

/// The opcode that marks a Fabrics command; its type is in byte 4 (FCTYPE).
pub const OPC_FABRICS: u8 = 0x7f;

/// Fabrics command types.
pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const AUTH_SEND: u8 = 0x05;
    pub const AUTH_RECEIVE: u8 = 0x06;
    pub const DISCONNECT: u8 = 0x08;
}

/// Admin command opcodes.
pub mod admin {
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    pub const KEEP_ALIVE: u8 = 0x18;
}

/// NVM command set opcodes.
pub mod io {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    pub const RESERVATION_REGISTER: u8 = 0x0d;
    pub const RESERVATION_REPORT: u8 = 0x0e;
    pub const RESERVATION_ACQUIRE: u8 = 0x11;
    pub const RESERVATION_RELEASE: u8 = 0x15;
}

/// Controller properties (the Fabrics stand-ins for PCIe registers).
pub mod prop {
    pub const CAP: u32 = 0x00;
    pub const VS: u32 = 0x08;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1c;
}

/// A completion status: status code type and status code, plus Do Not Retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    pub sct: u8,
    pub sc: u8,
    pub dnr: bool,
}

impl Status {
    pub const SUCCESS: Status = Status::generic(0x00);
    pub const INVALID_OPCODE: Status = Status::generic(0x01).dnr();
    pub const INVALID_FIELD: Status = Status::generic(0x02).dnr();
    pub const CID_CONFLICT: Status = Status::generic(0x03).dnr();
    pub const DATA_TRANSFER_ERROR: Status = Status::generic(0x04);
    pub const INTERNAL_ERROR: Status = Status::generic(0x06);
    pub const INVALID_NAMESPACE: Status = Status::generic(0x0b).dnr();
    pub const COMMAND_SEQUENCE_ERROR: Status = Status::generic(0x0c).dnr();
    pub const DATA_SGL_LENGTH_INVALID: Status = Status::generic(0x0f).dnr();
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Status = Status::generic(0x11).dnr();
    pub const SGL_OFFSET_INVALID: Status = Status::generic(0x16).dnr();
    /// A data digest did not match: the host may retry, the connection stays up.
    pub const TRANSIENT_TRANSPORT_ERROR: Status = Status::generic(0x22);
    pub const LBA_OUT_OF_RANGE: Status = Status::generic(0x80).dnr();
    /// A host without the reservation (or the registration) a command needs.
    pub const RESERVATION_CONFLICT: Status = Status::generic(0x83).dnr();
    /// A Reservation Report without the extended data structure, from a target whose host
    /// identifiers are 128-bit.
    pub const HOST_ID_INCONSISTENT_FORMAT: Status = Status::generic(0x18).dnr();
    /// Try again: the command met another in progress (NVMe 1.4).
    pub const COMMAND_INTERRUPTED: Status = Status::generic(0x21);
    pub const INVALID_LOG_PAGE: Status = Status::specific(0x09).dnr();
    pub const AER_LIMIT_EXCEEDED: Status = Status::specific(0x05).dnr();
    pub const FEATURE_NOT_SAVEABLE: Status = Status::specific(0x0d).dnr();
    pub const INVALID_QUEUE_ID: Status = Status::specific(0x01).dnr();
    pub const CONNECT_INCOMPATIBLE_FORMAT: Status = Status::specific(0x80).dnr();
    pub const CONNECT_CONTROLLER_BUSY: Status = Status::specific(0x81).dnr();
    pub const CONNECT_INVALID_PARAMETERS: Status = Status::specific(0x82).dnr();
    pub const CONNECT_INVALID_HOST: Status = Status::specific(0x84).dnr();
    /// The queue must authenticate (DH-HMAC-CHAP) before this command.
    pub const AUTH_REQUIRED: Status = Status::specific(0x91).dnr();
    pub const WRITE_FAULT: Status = Status::media(0x80);
    pub const UNRECOVERED_READ_ERROR: Status = Status::media(0x81);

    pub const fn generic(sc: u8) -> Status {
        Status {
            sct: 0,
            sc,
            dnr: false,
        }
    }
    pub const fn specific(sc: u8) -> Status {
        Status {
            sct: 1,
            sc,
            dnr: false,
        }
    }
    pub const fn media(sc: u8) -> Status {
        Status {
            sct: 2,
            sc,
            dnr: false,
        }
    }
    pub const fn dnr(self) -> Status {
        Status { dnr: true, ..self }
    }
    pub fn is_success(&self) -> bool {
        self.sct == 0 && self.sc == 0
    }
    /// The 15-bit status field of a CQE (bits 15:1 of DW3's upper half, phase tag excluded).
    pub fn to_field(self) -> u16 {
        ((self.sc as u16) << 1) | (((self.sct & 7) as u16) << 9) | ((self.dnr as u16) << 15)
    }
    pub fn from_field(f: u16) -> Status {
        Status {
            sc: (f >> 1) as u8,
            sct: ((f >> 9) & 7) as u8,
            dnr: f & 0x8000 != 0,
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "status type {:#x} code {:#04x}", self.sct, self.sc)?;
        if self.dnr {
            write!(f, " (do not retry)")?;
        }
        Ok(())
    }
}

/// How a command's data travels, from its SGL descriptor (Fabrics uses SGLs only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sgl {
    /// Data Block descriptor, Offset subtype: the data is inside the capsule at `offset`.
    InCapsule { offset: u64, len: u32 },
    /// Transport SGL Data Block: the data moves in C2HData / H2CData PDUs.
    Transport { len: u32 },
    /// Any other descriptor type, which TCP does not use.
    Other { id: u8 },
}

/// SGL descriptor identifiers (type in the high nibble, subtype in the low one).
pub const SGL_ID_IN_CAPSULE: u8 = 0x01;
pub const SGL_ID_TRANSPORT: u8 = 0x5a;

/// Which way a command moves data, from the two low bits of its opcode (or FCTYPE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    None,
    HostToController,
    ControllerToHost,
    Both,
}

/// A submission queue entry, kept as its 64 bytes with typed accessors.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; SQE_LEN]);

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Sqe {{ opcode: {:#04x}, cid: {}, nsid: {}, cdw10: {:#x} }}",
            self.opcode(),
            self.cid(),
            self.nsid(),
            self.cdw(10)
        )
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn le64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

impl Default for Sqe {
    fn default() -> Self {
        Sqe([0; SQE_LEN])
    }
}

impl Sqe {
    pub fn new(opcode: u8, cid: u16, nsid: u32) -> Sqe {
        let mut s = Sqe::default();
        s.0[0] = opcode;
        // PSDT = 01b: SGLs, the only data pointer Fabrics allows.
        s.0[1] = 0x40;
        s.set_cid(cid);
        s.0[4..8].copy_from_slice(&nsid.to_le_bytes());
        s
    }
    /// A Fabrics command of type `fctype`.
    pub fn fabrics(fctype: u8, cid: u16) -> Sqe {
        let mut s = Sqe::new(OPC_FABRICS, cid, 0);
        s.0[4] = fctype;
        s
    }
    pub fn from_slice(b: &[u8]) -> Option<Sqe> {
        b.get(..SQE_LEN).map(|x| {
            let mut s = [0u8; SQE_LEN];
            s.copy_from_slice(x);
            Sqe(s)
        })
    }
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }
    pub fn cid(&self) -> u16 {
        le16(&self.0, 2)
    }
    pub fn set_cid(&mut self, cid: u16) {
        self.0[2..4].copy_from_slice(&cid.to_le_bytes());
    }
    pub fn nsid(&self) -> u32 {
        le32(&self.0, 4)
    }
    pub fn is_fabrics(&self) -> bool {
        self.opcode() == OPC_FABRICS
    }
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }
    /// Command dword `n` (10..=15 are the command-specific ones).
    pub fn cdw(&self, n: usize) -> u32 {
        le32(&self.0, n * 4)
    }
    pub fn set_cdw(&mut self, n: usize, v: u32) {
        self.0[n * 4..n * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    pub fn direction(&self) -> Direction {
        let bits = if self.is_fabrics() {
            self.fctype()
        } else {
            self.opcode()
        };
        match bits & 3 {
            0 => Direction::None,
            1 => Direction::HostToController,
            2 => Direction::ControllerToHost,
            _ => Direction::Both,
        }
    }
    pub fn sgl(&self) -> Sgl {
        let d = &self.0[24..40];
        match d[15] {
            SGL_ID_IN_CAPSULE => Sgl::InCapsule {
                offset: le64(d, 0),
                len: le32(d, 8),
            },
            SGL_ID_TRANSPORT => Sgl::Transport { len: le32(d, 8) },
            id => Sgl::Other { id },
        }
    }
    pub fn set_sgl(&mut self, sgl: Sgl) {
        let d = &mut self.0[24..40];
        d.fill(0);
        match sgl {
            Sgl::InCapsule { offset, len } => {
                d[0..8].copy_from_slice(&offset.to_le_bytes());
                d[8..12].copy_from_slice(&len.to_le_bytes());
                d[15] = SGL_ID_IN_CAPSULE;
            }
            Sgl::Transport { len } => {
                d[8..12].copy_from_slice(&len.to_le_bytes());
                d[15] = SGL_ID_TRANSPORT;
            }
            Sgl::Other { id } => d[15] = id,
        }
    }
    /// Starting LBA of a Read, Write or Write Zeroes (CDW10-11).
    pub fn slba(&self) -> u64 {
        le64(&self.0, 40)
    }
    /// Number of logical blocks (CDW12 bits 15:0 are zero-based).
    pub fn nlb(&self) -> u32 {
        (self.cdw(12) & 0xffff) + 1
    }
    pub fn set_lba_range(&mut self, slba: u64, blocks: u32) {
        self.0[40..48].copy_from_slice(&slba.to_le_bytes());
        let c12 = self.cdw(12) & !0xffff;
        self.set_cdw(12, c12 | (blocks.saturating_sub(1) & 0xffff));
    }
    /// Connect: queue id, zero-based submission queue size, keep-alive timeout (ms).
    pub fn connect_qid(&self) -> u16 {
        le16(&self.0, 42)
    }
    pub fn connect_sqsize(&self) -> u16 {
        le16(&self.0, 44)
    }
    pub fn connect_recfmt(&self) -> u16 {
        le16(&self.0, 40)
    }
    pub fn connect_cattr(&self) -> u8 {
        self.0[46]
    }
    pub fn connect_kato(&self) -> u32 {
        le32(&self.0, 48)
    }
    pub fn set_connect(&mut self, qid: u16, sqsize: u16, kato_ms: u32) {
        self.0[40..42].copy_from_slice(&0u16.to_le_bytes());
        self.0[42..44].copy_from_slice(&qid.to_le_bytes());
        self.0[44..46].copy_from_slice(&sqsize.to_le_bytes());
        self.0[48..52].copy_from_slice(&kato_ms.to_le_bytes());
    }
    /// Property Get/Set: size (4 or 8 bytes), offset and (Set) value.
    pub fn prop_size8(&self) -> bool {
        self.0[40] & 7 == 1
    }
    pub fn prop_offset(&self) -> u32 {
        le32(&self.0, 44)
    }
    pub fn prop_value(&self) -> u64 {
        le64(&self.0, 48)
    }
    pub fn set_prop(&mut self, size8: bool, offset: u32, value: u64) {
        self.0[40] = size8 as u8;
        self.0[44..48].copy_from_slice(&offset.to_le_bytes());
        self.0[48..56].copy_from_slice(&value.to_le_bytes());
    }
}

/// Where a command's data comes from or goes to, once its SGL has been checked against the
/// capsule and the transfer limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transfer {
    /// No data moves (also for opcodes that claim both directions, which no known command
    /// uses: they are refused as unknown later).
    None,
    /// Host-to-controller data already in the capsule, at this range of the in-capsule data.
    InCapsule(std::ops::Range<usize>),
    /// Host-to-controller data still to be asked for with R2T (zero: none to ask for).
    FromHost(usize),
    /// Controller-to-host data of this length, sent in C2HData PDUs.
    ToHost(usize),
}

/// Checks a command's data pointer against `in_capsule_len` bytes of in-capsule data and the
/// largest transfer, and says how its data travels, or which status refuses it. The
/// connection calls this for every capsule; it reads nothing but the SQE.
pub fn transfer(sqe: &Sqe, in_capsule_len: usize, max_transfer: usize) -> Result<Transfer, Status> {
    match (sqe.direction(), sqe.sgl()) {
        (Direction::None | Direction::Both, _) => Ok(Transfer::None),
        (_, Sgl::Other { .. }) => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID),
        (Direction::HostToController, Sgl::InCapsule { offset, len }) => {
            let icd = in_capsule_len as u64;
            match offset.checked_add(len as u64) {
                Some(end) if end <= icd => Ok(Transfer::InCapsule(offset as usize..end as usize)),
                _ if offset > icd => Err(Status::SGL_OFFSET_INVALID),
                _ => Err(Status::DATA_SGL_LENGTH_INVALID),
            }
        }
        (Direction::HostToController, Sgl::Transport { len }) if len as usize <= max_transfer => {
            Ok(Transfer::FromHost(len as usize))
        }
        (Direction::ControllerToHost, Sgl::Transport { len }) if len as usize <= max_transfer => {
            Ok(Transfer::ToHost(len as usize))
        }
        (_, Sgl::Transport { .. }) => Err(Status::INVALID_FIELD),
        // Data for the host never travels inside a command capsule.
        (Direction::ControllerToHost, Sgl::InCapsule { .. }) => {
            Err(Status::SGL_DESCRIPTOR_TYPE_INVALID)
        }
    }
}

/// The byte range of `blocks` logical blocks from `slba` on a namespace of `ns_blocks` blocks
/// of `1 << lba_shift` bytes, or LBA Out of Range when any of it lies past the end.
pub fn lba_range(
    slba: u64,
    blocks: u64,
    ns_blocks: u64,
    lba_shift: u32,
) -> Result<(u64, u64), Status> {
    match slba.checked_add(blocks) {
        // Inside the namespace, so the shifts cannot overflow: the device's byte size fits.
        Some(end) if end <= ns_blocks => Ok((slba << lba_shift, blocks << lba_shift)),
        _ => Err(Status::LBA_OUT_OF_RANGE),
    }
}

/// A completion queue entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Cqe {
    /// Command-specific result (DW0, and DW1 for an 8-byte Property Get).
    pub result: u64,
    pub sqhd: u16,
    pub sqid: u16,
    pub cid: u16,
    pub status: u16,
}

impl Cqe {
    pub fn new(cid: u16, status: Status, result: u64) -> Cqe {
        Cqe {
            result,
            cid,
            status: status.to_field(),
            ..Default::default()
        }
    }
    pub fn status(&self) -> Status {
        Status::from_field(self.status)
    }
    pub fn encode(&self) -> [u8; CQE_LEN] {
        let mut b = [0u8; CQE_LEN];
        b[0..8].copy_from_slice(&self.result.to_le_bytes());
        b[8..10].copy_from_slice(&self.sqhd.to_le_bytes());
        b[10..12].copy_from_slice(&self.sqid.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        b[14..16].copy_from_slice(&self.status.to_le_bytes());
        b
    }
    pub fn decode(b: &[u8; CQE_LEN]) -> Cqe {
        Cqe {
            result: le64(b, 0),
            sqhd: le16(b, 8),
            sqid: le16(b, 10),
            cid: le16(b, 12),
            status: le16(b, 14),
        }
    }
}

/// Connect command data (1024 bytes): host identifier, controller id, subsystem and host NQNs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectData {
    pub hostid: [u8; 16],
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
}

pub const CONNECT_DATA_LEN: usize = 1024;
/// Byte offsets inside the Connect data, reported back as IPO when a field is refused.
pub const CONNECT_DATA_CNTLID: u16 = 16;
pub const CONNECT_DATA_SUBNQN: u16 = 256;
pub const CONNECT_DATA_HOSTNQN: u16 = 512;

/// An NQN is at most 223 bytes of UTF-8 in a 256-byte, NUL-terminated field.
pub const NQN_MAX: usize = 223;

/// An NQN field: NUL-terminated UTF-8 of at most NQN_MAX bytes; empty when `may_be_empty`.
fn nqn_field(b: &[u8], may_be_empty: bool) -> Option<String> {
    let end = b.iter().position(|&c| c == 0)?;
    if (end == 0 && !may_be_empty) || end > NQN_MAX {
        return None;
    }
    std::str::from_utf8(&b[..end]).ok().map(str::to_owned)
}

impl ConnectData {
    /// Decodes Connect data; `Err` carries the byte offset of the field at fault. The host NQN
    /// may be empty (SPDK's initiator sends none): whether that is allowed is the subsystem's
    /// call (only where any host may connect).
    pub fn decode(b: &[u8]) -> Result<ConnectData, u16> {
        if b.len() < CONNECT_DATA_LEN {
            return Err(0);
        }
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&b[0..16]);
        Ok(ConnectData {
            hostid,
            cntlid: le16(b, 16),
            subnqn: nqn_field(&b[256..512], false).ok_or(CONNECT_DATA_SUBNQN)?,
            hostnqn: nqn_field(&b[512..768], true).ok_or(CONNECT_DATA_HOSTNQN)?,
        })
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; CONNECT_DATA_LEN];
        b[0..16].copy_from_slice(&self.hostid);
        b[16..18].copy_from_slice(&self.cntlid.to_le_bytes());
        let s = self.subnqn.as_bytes();
        let n = s.len().min(255);
        b[256..256 + n].copy_from_slice(&s[..n]);
        let h = self.hostnqn.as_bytes();
        let n = h.len().min(255);
        b[512..512 + n].copy_from_slice(&h[..n]);
        b
    }
}

/// One Dataset Management range (16 bytes): context attributes, length in blocks, start LBA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DsmRange {
    pub attributes: u32,
    pub blocks: u32,
    pub slba: u64,
}

impl DsmRange {
    pub const LEN: usize = 16;
    pub fn decode(b: &[u8]) -> DsmRange {
        DsmRange {
            attributes: le32(b, 0),
            blocks: le32(b, 4),
            slba: le64(b, 8),
        }
    }
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.attributes.to_le_bytes());
        b[4..8].copy_from_slice(&self.blocks.to_le_bytes());
        b[8..16].copy_from_slice(&self.slba.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_field_round_trips() {
        for s in [
            Status::SUCCESS,
            Status::CONNECT_INVALID_HOST,
            Status::LBA_OUT_OF_RANGE,
            Status::UNRECOVERED_READ_ERROR,
        ] {
            assert_eq!(Status::from_field(s.to_field()), s);
        }
        // Connect Invalid Host: SCT 1, SC 0x84, DNR.
        assert_eq!(
            Status::CONNECT_INVALID_HOST.to_field(),
            0x8000 | (1 << 9) | (0x84 << 1)
        );
    }

    #[test]
    fn cqe_round_trips() {
        let c = Cqe {
            result: 0x1122_3344_5566_7788,
            sqhd: 7,
            sqid: 3,
            cid: 0xbeef,
            status: Status::INVALID_FIELD.to_field(),
        };
        assert_eq!(Cqe::decode(&c.encode()), c);
    }

    #[test]
    fn sqe_fields() {
        let mut s = Sqe::new(io::WRITE, 42, 1);
        s.set_lba_range(1000, 8);
        s.set_sgl(Sgl::Transport { len: 32768 });
        assert_eq!(s.cid(), 42);
        assert_eq!(s.nsid(), 1);
        assert_eq!(s.slba(), 1000);
        assert_eq!(s.nlb(), 8);
        assert_eq!(s.sgl(), Sgl::Transport { len: 32768 });
        assert_eq!(s.direction(), Direction::HostToController);
        let mut c = Sqe::fabrics(fctype::CONNECT, 1);
        c.set_connect(2, 127, 5000);
        c.set_sgl(Sgl::InCapsule {
            offset: 0,
            len: 1024,
        });
        assert_eq!(
            (c.connect_qid(), c.connect_sqsize(), c.connect_kato()),
            (2, 127, 5000)
        );
        assert_eq!(c.direction(), Direction::HostToController);
        assert_eq!(
            Sqe::fabrics(fctype::PROPERTY_GET, 1).direction(),
            Direction::None
        );
    }

    #[test]
    fn transfers_are_checked_against_the_capsule_and_the_limit() {
        let w = |sgl| {
            let mut s = Sqe::new(io::WRITE, 1, 1);
            s.set_sgl(sgl);
            s
        };
        let ic = |offset, len| Sgl::InCapsule { offset, len };
        assert_eq!(
            transfer(&w(ic(0, 512)), 512, 4096),
            Ok(Transfer::InCapsule(0..512))
        );
        assert_eq!(
            transfer(&w(ic(100, 12)), 512, 4096),
            Ok(Transfer::InCapsule(100..112))
        );
        assert_eq!(
            transfer(&w(ic(0, 513)), 512, 4096),
            Err(Status::DATA_SGL_LENGTH_INVALID)
        );
        assert_eq!(
            transfer(&w(ic(513, 0)), 512, 4096),
            Err(Status::SGL_OFFSET_INVALID)
        );
        // Offsets and lengths that overflow when added are refused, not wrapped.
        assert_eq!(
            transfer(&w(ic(u64::MAX, 2)), 512, 4096),
            Err(Status::SGL_OFFSET_INVALID)
        );
        assert_eq!(
            transfer(&w(Sgl::Transport { len: 4097 }), 0, 4096),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            transfer(&w(Sgl::Transport { len: 4096 }), 0, 4096),
            Ok(Transfer::FromHost(4096))
        );
        assert_eq!(
            transfer(&w(Sgl::Other { id: 0x20 }), 0, 4096),
            Err(Status::SGL_DESCRIPTOR_TYPE_INVALID)
        );
        let mut r = Sqe::new(io::READ, 1, 1);
        r.set_sgl(Sgl::Transport { len: u32::MAX });
        assert_eq!(transfer(&r, 0, 1 << 20), Err(Status::INVALID_FIELD));
        r.set_sgl(ic(0, 0));
        assert_eq!(
            transfer(&r, 0, 4096),
            Err(Status::SGL_DESCRIPTOR_TYPE_INVALID)
        );
        assert_eq!(
            transfer(&Sqe::new(io::FLUSH, 1, 1), 0, 4096),
            Ok(Transfer::None)
        );
    }

    #[test]
    fn lba_ranges_past_the_end_are_refused() {
        assert_eq!(lba_range(0, 8, 8, 12), Ok((0, 32768)));
        assert_eq!(lba_range(1, 8, 8, 12), Err(Status::LBA_OUT_OF_RANGE));
        assert_eq!(lba_range(u64::MAX, 1, 8, 12), Err(Status::LBA_OUT_OF_RANGE));
        assert_eq!(lba_range(8, 0, 8, 12), Ok((32768, 0)));
    }

    #[test]
    fn connect_data_round_trips_and_refuses_bad_nqns() {
        let d = ConnectData {
            hostid: [7; 16],
            cntlid: 0xffff,
            subnqn: "nqn.2024-01.io.millrace:vol1".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1234".into(),
        };
        let b = d.encode();
        assert_eq!(ConnectData::decode(&b).unwrap(), d);
        let mut bad = b.clone();
        bad[256..512].fill(b'a'); // no terminator
        assert_eq!(ConnectData::decode(&bad), Err(CONNECT_DATA_SUBNQN));
        // An empty host NQN decodes (the subsystem decides); an empty subsystem NQN does not,
        // nor does a host NQN with no terminator.
        let mut empty = b.clone();
        empty[512..768].fill(0);
        assert_eq!(ConnectData::decode(&empty).unwrap().hostnqn, "");
        let mut empty = b.clone();
        empty[256..512].fill(0);
        assert_eq!(ConnectData::decode(&empty), Err(CONNECT_DATA_SUBNQN));
        let mut bad = b.clone();
        bad[512..768].fill(b'h');
        assert_eq!(ConnectData::decode(&bad), Err(CONNECT_DATA_HOSTNQN));
        assert_eq!(ConnectData::decode(&b[..100]), Err(0));
    }
}
