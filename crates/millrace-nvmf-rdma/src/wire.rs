//! What travels on the wire besides capsules: the RDMA CM private data of a connect request,
//! its accept and its reject, and the SGL data pointer of a command as the RDMA transport
//! reads it (keyed SGL data blocks, in-capsule data blocks).

use millrace_nvmf::cmd::{Direction, Sqe, Status};

/// Record format 0 of the NVMe/RDMA CM private data, the only one defined.
pub const RECFMT: u16 = 0;
/// Bytes of private data in a connect request and an accept.
pub const REQUEST_LEN: usize = 32;
pub const ACCEPT_LEN: usize = 32;
/// Bytes of private data in a reject.
pub const REJECT_LEN: usize = 4;

/// Why a connect request is rejected (the STS field of the reject private data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum RejectReason {
    InvalidLength = 0x01,
    InvalidRecfmt = 0x02,
    InvalidQid = 0x03,
    InvalidHsqsize = 0x04,
    InvalidHrqsize = 0x05,
    NoResources = 0x06,
    InvalidIrd = 0x07,
    InvalidOrd = 0x08,
}

impl RejectReason {
    pub fn describe(self) -> &'static str {
        match self {
            RejectReason::InvalidLength => "the private data is too short",
            RejectReason::InvalidRecfmt => "the private data's record format is not 0",
            RejectReason::InvalidQid => "the queue id is beyond what the target grants",
            RejectReason::InvalidHsqsize => "the submission queue size is beyond the target's",
            RejectReason::InvalidHrqsize => {
                "the host receive queue is smaller than its submission queue"
            }
            RejectReason::NoResources => "the target has no resources for another queue",
            RejectReason::InvalidIrd => "the host allows no RDMA READ from it",
            RejectReason::InvalidOrd => "invalid outbound RDMA READ depth",
        }
    }
}

/// A host's connect request (NVMe/RDMA CM private data, record format 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmRequest {
    pub qid: u16,
    /// Host receive queue size: how many responses the host can take at once.
    pub hrqsize: u16,
    /// Host send (submission) queue size, zero-based.
    pub hsqsize: u16,
    pub cntlid: u16,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

impl CmRequest {
    /// Reads the private data of a connect request. The transport pads it (56 bytes on RoCE and
    /// InfiniBand), so longer is fine; shorter is refused.
    pub fn decode(pd: &[u8]) -> Result<CmRequest, RejectReason> {
        if pd.len() < REQUEST_LEN {
            return Err(RejectReason::InvalidLength);
        }
        if le16(pd, 0) != RECFMT {
            return Err(RejectReason::InvalidRecfmt);
        }
        Ok(CmRequest {
            qid: le16(pd, 2),
            hrqsize: le16(pd, 4),
            hsqsize: le16(pd, 6),
            cntlid: le16(pd, 8),
        })
    }
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..2].copy_from_slice(&RECFMT.to_le_bytes());
        b[2..4].copy_from_slice(&self.qid.to_le_bytes());
        b[4..6].copy_from_slice(&self.hrqsize.to_le_bytes());
        b[6..8].copy_from_slice(&self.hsqsize.to_le_bytes());
        b[8..10].copy_from_slice(&self.cntlid.to_le_bytes());
        b
    }
}

/// The private data of an accept: our receive queue size (CRQSIZE).
pub fn accept_data(crqsize: u16) -> [u8; ACCEPT_LEN] {
    let mut b = [0u8; ACCEPT_LEN];
    b[0..2].copy_from_slice(&RECFMT.to_le_bytes());
    b[2..4].copy_from_slice(&crqsize.to_le_bytes());
    b
}

/// The private data of a reject.
pub fn reject_data(r: RejectReason) -> [u8; REJECT_LEN] {
    let mut b = [0u8; REJECT_LEN];
    b[0..2].copy_from_slice(&RECFMT.to_le_bytes());
    b[2..4].copy_from_slice(&(r as u16).to_le_bytes());
    b
}

/// What a reject's private data says (for tests and initiators).
pub fn decode_reject(pd: &[u8]) -> Option<u16> {
    (pd.len() >= REJECT_LEN && le16(pd, 0) == RECFMT).then(|| le16(pd, 2))
}

/// The limits a connect request is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLimits {
    /// Most entries of an admin queue (the Linux host asks for 32).
    pub admin_depth: u16,
    /// Most entries of an I/O queue (CAP.MQES + 1).
    pub io_depth: u16,
    /// Highest I/O queue id.
    pub max_qid: u16,
}

/// The sizes of one accepted queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSizes {
    pub qid: u16,
    /// Receives we keep posted: one per submission queue entry (HSQSIZE + 1), the CRQSIZE we
    /// answer with.
    pub recv: u16,
    /// Responses the host can receive at once (HRQSIZE).
    pub send: u16,
}

/// Checks a connect request's queue id and sizes, as the Linux host and target agree on them:
/// an admin queue of at most `admin_depth` entries, I/O queues of at most `io_depth`, and a
/// host receive queue that holds a response for every command it may submit.
pub fn negotiate(r: &CmRequest, l: &QueueLimits) -> Result<QueueSizes, RejectReason> {
    if r.qid > l.max_qid {
        return Err(RejectReason::InvalidQid);
    }
    let recv = r.hsqsize as u32 + 1;
    let most = if r.qid == 0 {
        l.admin_depth
    } else {
        l.io_depth
    };
    if r.hsqsize == 0 || recv > most as u32 {
        return Err(RejectReason::InvalidHsqsize);
    }
    if (r.hrqsize as u32) < recv {
        return Err(RejectReason::InvalidHrqsize);
    }
    Ok(QueueSizes {
        qid: r.qid,
        recv: recv as u16,
        send: r.hrqsize,
    })
}

/// SGL descriptor types as the RDMA transport uses them (type in the high nibble).
pub const SGL_DATA_BLOCK: u8 = 0x0;
pub const SGL_KEYED_DATA_BLOCK: u8 = 0x4;
/// Subtypes: an address (keyed), an offset into the capsule (data block), invalidate the key.
pub const SGL_SUB_ADDRESS: u8 = 0x0;
pub const SGL_SUB_OFFSET: u8 = 0x1;
pub const SGL_SUB_INVALIDATE: u8 = 0xf;

/// The host's memory for one command, from a keyed SGL data block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remote {
    pub addr: u64,
    pub len: u32,
    pub key: u32,
}

/// How a command's data moves over RDMA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// No data.
    None,
    /// Host-to-controller data already in the capsule, at this range of the in-capsule data.
    InCapsule(std::ops::Range<usize>),
    /// Host-to-controller data to fetch with RDMA READ.
    FromHost(Remote),
    /// Controller-to-host data to place with RDMA WRITE.
    ToHost(Remote),
}

/// A command's data plan and the host key to invalidate with the response, if it asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataPlan {
    pub plan: Plan,
    pub invalidate: Option<u32>,
}

/// Reads a command's SGL (SQE bytes 24..40) against `in_capsule_len` bytes of in-capsule data
/// and the largest transfer, or says which status refuses it. Reads nothing but the SQE.
pub fn plan(sqe: &Sqe, in_capsule_len: usize, max_transfer: usize) -> Result<DataPlan, Status> {
    let d = &sqe.0[24..40];
    let (ty, sub) = (d[15] >> 4, d[15] & 0xf);
    let addr = u64::from_le_bytes(d[0..8].try_into().expect("8 bytes"));
    let dir = sqe.direction();
    match (ty, sub) {
        (SGL_KEYED_DATA_BLOCK, SGL_SUB_ADDRESS | SGL_SUB_INVALIDATE) => {
            let len = u32::from_le_bytes([d[8], d[9], d[10], 0]);
            let key = u32::from_le_bytes([d[11], d[12], d[13], d[14]]);
            let invalidate = (sub == SGL_SUB_INVALIDATE).then_some(key);
            let r = Remote { addr, len, key };
            let plan = match dir {
                _ if len == 0 => Plan::None,
                Direction::None | Direction::Both => Plan::None,
                _ if len as usize > max_transfer => return Err(Status::INVALID_FIELD),
                Direction::HostToController => Plan::FromHost(r),
                Direction::ControllerToHost => Plan::ToHost(r),
            };
            Ok(DataPlan { plan, invalidate })
        }
        (SGL_DATA_BLOCK, SGL_SUB_OFFSET) => {
            let len = u32::from_le_bytes(d[8..12].try_into().expect("4 bytes")) as u64;
            let plan = match dir {
                _ if len == 0 => Plan::None,
                Direction::HostToController => {
                    let icd = in_capsule_len as u64;
                    match addr.checked_add(len) {
                        Some(end) if end <= icd => Plan::InCapsule(addr as usize..end as usize),
                        _ => return Err(Status::SGL_OFFSET_INVALID),
                    }
                }
                // Data for the host never rides in a command capsule.
                _ => return Err(Status::INVALID_FIELD),
            };
            Ok(DataPlan {
                plan,
                invalidate: None,
            })
        }
        (SGL_DATA_BLOCK | SGL_KEYED_DATA_BLOCK, _) => Err(Status::INVALID_FIELD),
        _ => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID),
    }
}

/// Writes a keyed SGL data block into an SQE (for initiators and tests).
pub fn set_keyed(sqe: &mut Sqe, r: Remote, invalidate: bool) {
    let d = &mut sqe.0[24..40];
    d.fill(0);
    d[0..8].copy_from_slice(&r.addr.to_le_bytes());
    d[8..11].copy_from_slice(&r.len.to_le_bytes()[..3]);
    d[11..15].copy_from_slice(&r.key.to_le_bytes());
    let sub = if invalidate {
        SGL_SUB_INVALIDATE
    } else {
        SGL_SUB_ADDRESS
    };
    d[15] = SGL_KEYED_DATA_BLOCK << 4 | sub;
}

#[cfg(test)]
mod tests;
