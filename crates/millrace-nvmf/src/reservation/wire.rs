//! The reservation commands and data structures as they travel: decoding Reservation Register,
//! Acquire and Release (command dwords and their 8- or 16-byte data), the Reservation Report
//! (extended data structure: 128-bit host identifiers), the reservation notification log page
//! (LID 80h) a controller keeps for its host, and the Reservation Notification Mask feature.

use super::{ReservationState, ReservationType};
use crate::cmd::{Sqe, Status};
use std::collections::{HashMap, VecDeque};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RegisterAction {
    Register,
    Unregister,
    Replace,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcquireAction {
    Acquire,
    Preempt,
    PreemptAndAbort,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReleaseAction {
    Release,
    Clear,
}

/// A reservation command that changes state, decoded and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Request {
    Register {
        action: RegisterAction,
        iekey: bool,
        /// CPTPL: None leaves Persist Through Power Loss as it is.
        ptpl: Option<bool>,
        crkey: u64,
        nrkey: u64,
    },
    Acquire {
        action: AcquireAction,
        rtype: ReservationType,
        crkey: u64,
        /// The key whose registrations are preempted (Preempt, Preempt and Abort).
        prkey: u64,
    },
    Release {
        action: ReleaseAction,
        /// RTYPE as sent (checked against the reservation held by Release).
        rtype: u8,
        crkey: u64,
    },
}

/// What a notice (and a reservation notification log page) tells a host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Notice {
    /// Another host preempted this host's registration.
    RegistrationPreempted = 1,
    /// The reservation was released (by its holder, or went with its holder's registration).
    ReservationReleased = 2,
    /// The reservation was cleared, or taken by another host.
    ReservationPreempted = 3,
}

fn key(d: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[at..at + 8]);
    u64::from_le_bytes(b)
}

/// The command's data, at least `len` bytes, or the status that refuses a shorter one.
fn data_of(data: Option<&[u8]>, len: usize) -> Result<&[u8], Status> {
    data.filter(|d| d.len() >= len)
        .ok_or(Status::DATA_SGL_LENGTH_INVALID)
}

/// Decodes Reservation Register (0Dh), Acquire (11h) or Release (15h); malformed fields are
/// Invalid Field, data shorter than the command's structure Data SGL Length Invalid.
pub(crate) fn decode(sqe: &Sqe, data: Option<&[u8]>) -> Result<Request, Status> {
    let c10 = sqe.cdw(10);
    let action = c10 & 7;
    let iekey = c10 & (1 << 3) != 0;
    let rtype = ((c10 >> 8) & 0xff) as u8;
    match sqe.opcode() {
        crate::cmd::io::RESERVATION_REGISTER => {
            let action = match action {
                0 => RegisterAction::Register,
                1 => RegisterAction::Unregister,
                2 => RegisterAction::Replace,
                _ => return Err(Status::INVALID_FIELD),
            };
            let ptpl = match c10 >> 30 {
                0 => None,
                2 => Some(false),
                3 => Some(true),
                _ => return Err(Status::INVALID_FIELD),
            };
            let d = data_of(data, 16)?;
            Ok(Request::Register {
                action,
                iekey,
                ptpl,
                crkey: key(d, 0),
                nrkey: key(d, 8),
            })
        }
        crate::cmd::io::RESERVATION_ACQUIRE => {
            let action = match action {
                0 => AcquireAction::Acquire,
                1 => AcquireAction::Preempt,
                2 => AcquireAction::PreemptAndAbort,
                _ => return Err(Status::INVALID_FIELD),
            };
            // Since NVMe 1.3 a controller refuses IEKEY on Acquire and Release (RESCAP bit 7).
            let rtype = ReservationType::from_code(rtype).filter(|_| !iekey);
            let rtype = rtype.ok_or(Status::INVALID_FIELD)?;
            let d = data_of(data, 16)?;
            Ok(Request::Acquire {
                action,
                rtype,
                crkey: key(d, 0),
                prkey: key(d, 8),
            })
        }
        crate::cmd::io::RESERVATION_RELEASE => {
            let action = match action {
                0 if ReservationType::from_code(rtype).is_some() => ReleaseAction::Release,
                1 => ReleaseAction::Clear,
                _ => return Err(Status::INVALID_FIELD),
            };
            if iekey {
                return Err(Status::INVALID_FIELD);
            }
            let d = data_of(data, 8)?;
            Ok(Request::Release {
                action,
                rtype,
                crkey: key(d, 0),
            })
        }
        _ => Err(Status::INVALID_OPCODE),
    }
}

/// The bytes a Reservation Report (0Eh) asks for (NUMD, zero-based dwords in CDW10) and
/// whether it asks for the extended data structure (CDW11 bit 0).
pub(crate) fn report_request(sqe: &Sqe) -> (u64, bool) {
    let bytes = (u64::from(sqe.cdw(10)) + 1) * 4;
    (bytes, sqe.cdw(11) & 1 != 0)
}

/// The Reservation Status extended data structure: a 64-byte header (generation, type,
/// number of registrants, PTPL state) and a 64-byte descriptor per registrant (controller id
/// FFFFh in the dynamic model, whether it holds the reservation, its key, its 128-bit host id).
pub(crate) fn report(st: &ReservationState) -> Vec<u8> {
    let mut b = vec![0u8; 64 + 64 * st.registrants.len()];
    b[0..4].copy_from_slice(&st.generation.to_le_bytes());
    b[4] = st.rtype.map_or(0, |t| t.code());
    let n = st.registrants.len().min(u16::MAX as usize) as u16;
    b[5..7].copy_from_slice(&n.to_le_bytes());
    b[9] = st.ptpl as u8;
    for (i, r) in st.registrants.iter().enumerate() {
        let e = &mut b[64 + 64 * i..128 + 64 * i];
        e[0..2].copy_from_slice(&0xffffu16.to_le_bytes());
        e[2] = st.holds(&r.hostid) as u8;
        e[8..16].copy_from_slice(&r.key.to_le_bytes());
        e[16..32].copy_from_slice(&r.hostid);
    }
    b
}

/// Entries a controller's notification log holds; past that the newest are lost (the log page
/// count then skips their numbers, which is how a host sees that some were).
const LOG_MAX: usize = 64;
/// Reservation Notification Mask bits (Set Features 82h): registration preempted, reservation
/// released, reservation preempted.
pub(crate) const MASK_ALL: u32 = 0b1110;

/// One controller's reservation notification log, its Reservation Notification Masks, and
/// whether the Reservation Log Page Available notice is outstanding (it is not sent again until
/// the host reads the log).
#[derive(Default)]
pub(crate) struct NoticeLog {
    queue: VecDeque<(u64, Notice, u32)>,
    count: u64,
    aen_out: bool,
    masks: HashMap<u32, u32>,
    /// The mask of namespaces never set one by one (set with NSID FFFFFFFFh).
    all: u32,
}

impl NoticeLog {
    /// Logs a notice for namespace `nsid` unless masked; true when the host is to be told
    /// with an asynchronous event.
    pub fn push(&mut self, kind: Notice, nsid: u32) -> bool {
        if self.mask(nsid) & (1 << kind as u32) != 0 {
            return false;
        }
        self.count = self.count.wrapping_add(1).max(1);
        if self.queue.len() < LOG_MAX {
            self.queue.push_back((self.count, kind, nsid));
        }
        !std::mem::replace(&mut self.aen_out, true)
    }

    /// The log page (64 bytes): the oldest entry, taken off the log when `take`, with the
    /// number of entries after it; an empty page when there is none. Read without RAE, the
    /// notice may be sent again.
    pub fn page(&mut self, take: bool, rae: bool) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        let entry = match take {
            true => self.queue.pop_front(),
            false => self.queue.front().copied(),
        };
        if let Some((count, kind, nsid)) = entry {
            b[0..8].copy_from_slice(&count.to_le_bytes());
            b[8] = kind as u8;
            b[9] = self.queue.len().saturating_sub(usize::from(!take)).min(255) as u8;
            b[12..16].copy_from_slice(&nsid.to_le_bytes());
        }
        if take && !rae {
            self.aen_out = false;
        }
        b
    }

    pub fn mask(&self, nsid: u32) -> u32 {
        self.masks.get(&nsid).copied().unwrap_or(self.all)
    }

    /// Sets the mask of `nsid`, or of every namespace for `None`.
    pub fn set_mask(&mut self, nsid: Option<u32>, mask: u32) {
        match nsid {
            Some(n) => {
                self.masks.insert(n, mask);
            }
            None => {
                self.masks.clear();
                self.all = mask;
            }
        }
    }
}
