//! Persistent reservations of a namespace (NVMe Base, "Reservations"): which hosts are
//! registered with which key, which reservation is held and by whom, and the rules that decide
//! whether a host's command conflicts with it. A host is its Host Identifier (the 128-bit HOSTID
//! of its Connect): every controller of one host shares its registrations. Nothing here knows a
//! controller or a transport: `rules` turns a decoded command into a new state and the notices
//! owed to other hosts, `wire` decodes commands and encodes the Reservation Report, the
//! reservation notification log page and the features, and [`NsResv`] is what a namespace holds
//! at run time (the state behind a lock, and the flags and counters its data path reads). The
//! delivery of notices and the recording of persistent state live a layer up (`resv_commands`).
//! This module depends on no other of the crate's but the wire's statuses.

mod rules;
pub(crate) mod wire;

pub(crate) use rules::apply;
pub(crate) use wire::NoticeLog;

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// A host's identity in reservations: the Host Identifier of its Connect data.
pub type HostId = [u8; 16];

/// Records a namespace's reservations that persist through power loss: called with the
/// subsystem NQN, the namespace id and the state to keep, or None when nothing is to be kept
/// any more (the host cleared PTPL). It runs on a blocking thread (or the admin queue's, for
/// Set Features) and returns once the record is durable; an error fails the command, which
/// leaves the state as it was.
pub type ReservationStore = std::sync::Arc<
    dyn Fn(&str, u32, Option<&ReservationState>) -> std::io::Result<()> + Send + Sync,
>;

/// The most registrants one namespace keeps: any allowed host can connect under any host
/// identifier, so their number is bounded like every other thing a peer can make the target
/// hold.
pub const MAX_REGISTRANTS: usize = 256;

/// The reservation types (RTYPE).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReservationType {
    WriteExclusive,
    ExclusiveAccess,
    WriteExclusiveRegistrantsOnly,
    ExclusiveAccessRegistrantsOnly,
    WriteExclusiveAllRegistrants,
    ExclusiveAccessAllRegistrants,
}

impl ReservationType {
    pub const ALL: [ReservationType; 6] = [
        ReservationType::WriteExclusive,
        ReservationType::ExclusiveAccess,
        ReservationType::WriteExclusiveRegistrantsOnly,
        ReservationType::ExclusiveAccessRegistrantsOnly,
        ReservationType::WriteExclusiveAllRegistrants,
        ReservationType::ExclusiveAccessAllRegistrants,
    ];
    /// The type of an RTYPE code (1 to 6); None for the reserved ones.
    pub fn from_code(c: u8) -> Option<ReservationType> {
        ReservationType::ALL
            .get(usize::from(c).checked_sub(1)?)
            .copied()
    }
    pub fn code(self) -> u8 {
        ReservationType::ALL
            .iter()
            .position(|t| *t == self)
            .map_or(0, |i| i as u8 + 1)
    }
    /// The name the API, the CLI and /metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            ReservationType::WriteExclusive => "write-exclusive",
            ReservationType::ExclusiveAccess => "exclusive-access",
            ReservationType::WriteExclusiveRegistrantsOnly => "write-exclusive-registrants-only",
            ReservationType::ExclusiveAccessRegistrantsOnly => "exclusive-access-registrants-only",
            ReservationType::WriteExclusiveAllRegistrants => "write-exclusive-all-registrants",
            ReservationType::ExclusiveAccessAllRegistrants => "exclusive-access-all-registrants",
        }
    }
    /// Every registrant holds a reservation of this type.
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            ReservationType::WriteExclusiveAllRegistrants
                | ReservationType::ExclusiveAccessAllRegistrants
        )
    }
    /// Registrants other than the holder read and write as the holder does.
    fn registrants_may_access(self) -> bool {
        !matches!(
            self,
            ReservationType::WriteExclusive | ReservationType::ExclusiveAccess
        )
    }
    /// Hosts without access may not read either.
    fn exclusive_access(self) -> bool {
        matches!(
            self,
            ReservationType::ExclusiveAccess
                | ReservationType::ExclusiveAccessRegistrantsOnly
                | ReservationType::ExclusiveAccessAllRegistrants
        )
    }
}

impl std::fmt::Display for ReservationType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an I/O command does to a namespace, as reservations see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Read (and Compare, Verify).
    Read,
    /// Write, Write Zeroes, Dataset Management, Flush, Write Uncorrectable.
    Write,
    /// Everything else (the reservation commands check their own rules).
    Other,
}

impl Access {
    pub fn of(opcode: u8) -> Access {
        match opcode {
            0x02 | 0x05 | 0x0c => Access::Read,
            0x00 | 0x01 | 0x04 | 0x08 | 0x09 => Access::Write,
            _ => Access::Other,
        }
    }
}

/// One registered host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registrant {
    pub hostid: HostId,
    pub key: u64,
    /// The host NQN of the controller that registered (for people reading the state).
    pub hostnqn: String,
}

/// A namespace's reservations: what a Reservation Report shows, and what is recorded when a
/// host asked for them to persist through power loss.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReservationState {
    /// Counts registrations, preemptions and clears (wrapping).
    pub generation: u32,
    /// Persist Through Power Loss: kept across restarts of the target (the server records it).
    pub ptpl: bool,
    /// The reservation held, if any.
    pub rtype: Option<ReservationType>,
    /// Its holder; None for the all-registrants types, which every registrant holds.
    pub holder: Option<HostId>,
    pub registrants: Vec<Registrant>,
}

impl ReservationState {
    pub(crate) fn find(&self, h: &HostId) -> Option<usize> {
        self.registrants.iter().position(|r| r.hostid == *h)
    }

    /// Whether host `h` holds the reservation.
    pub fn holds(&self, h: &HostId) -> bool {
        match self.rtype {
            None => false,
            Some(t) if t.all_registrants() => self.find(h).is_some(),
            Some(_) => self.holder.as_ref() == Some(h),
        }
    }

    /// Whether a command of `access` from host `h` conflicts with the reservation held.
    pub(crate) fn conflicts(&self, h: &HostId, access: Access) -> bool {
        let Some(t) = self.rtype else { return false };
        if access == Access::Other || self.holds(h) {
            return false;
        }
        if t.registrants_may_access() && self.find(h).is_some() {
            return false;
        }
        access == Access::Write || t.exclusive_access()
    }

    /// Checks a state read back from a record: types, holders and the number of registrants.
    pub fn check(&self) -> Result<(), String> {
        if self.registrants.len() > MAX_REGISTRANTS {
            return Err(format!(
                "{} registrants, more than the {MAX_REGISTRANTS} a namespace keeps",
                self.registrants.len()
            ));
        }
        for (i, r) in self.registrants.iter().enumerate() {
            if self.registrants[..i].iter().any(|o| o.hostid == r.hostid) {
                return Err("a host is registered twice".into());
            }
        }
        match (self.rtype, &self.holder) {
            (None, Some(_)) => Err("a holder without a reservation".into()),
            (Some(t), Some(_)) if t.all_registrants() => {
                Err(format!("a single holder of a {t} reservation"))
            }
            (Some(t), None) if !t.all_registrants() => {
                Err(format!("a {t} reservation with no holder"))
            }
            (Some(t), _) if t.all_registrants() && self.registrants.is_empty() => {
                Err(format!("a {t} reservation with no registrant"))
            }
            (_, Some(h)) if self.find(h).is_none() => Err("a holder that is not registered".into()),
            _ => Ok(()),
        }
    }
}

/// A namespace's reservations at run time. The data path reads two flags while none is in
/// use: `active` (some host is registered: commands are counted, for Preempt and Abort) and
/// `held` (a reservation is held: commands are checked against it).
#[derive(Default)]
pub(crate) struct NsResv {
    state: Mutex<ReservationState>,
    active: AtomicBool,
    held: AtomicBool,
    /// Which of the two in-flight counts new commands join; Preempt and Abort flips it and
    /// waits for the other to drain.
    epoch: AtomicUsize,
    inflight: [AtomicUsize; 2],
    /// One change (with its record and its wait) at a time.
    pub serial: tokio::sync::Mutex<()>,
}

/// A command counted in flight; uncounted when dropped.
pub(crate) struct InFlight<'a> {
    n: &'a AtomicUsize,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.n.fetch_sub(1, Ordering::SeqCst);
    }
}

impl NsResv {
    /// Counts a command in flight while hosts are registered (None otherwise: nothing to wait
    /// for, and nothing for the data path to pay).
    pub fn enter(&self) -> Option<InFlight<'_>> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        let n = &self.inflight[self.epoch.load(Ordering::SeqCst) & 1];
        n.fetch_add(1, Ordering::SeqCst);
        Some(InFlight { n })
    }

    /// Whether a command of `access` from host `h` conflicts with the reservation held.
    pub fn conflicts(&self, h: &HostId, access: Access) -> bool {
        if access == Access::Other || !self.held.load(Ordering::SeqCst) {
            return false;
        }
        self.state.lock().conflicts(h, access)
    }

    pub fn snapshot(&self) -> ReservationState {
        self.state.lock().clone()
    }

    /// Runs `f` on the state; the flags follow what it leaves.
    pub fn update<R>(&self, f: impl FnOnce(&mut ReservationState) -> R) -> R {
        let mut st = self.state.lock();
        let r = f(&mut st);
        self.active
            .store(!st.registrants.is_empty(), Ordering::Release);
        self.held.store(st.rtype.is_some(), Ordering::SeqCst);
        r
    }

    /// Waits until every command counted before this call has finished (Preempt and Abort:
    /// the preempted hosts' commands already admitted end before the command completes; new
    /// ones meet the new reservation). The caller holds `serial`.
    pub async fn drain(&self) {
        let old = self.epoch.fetch_add(1, Ordering::SeqCst) & 1;
        while self.inflight[old].load(Ordering::SeqCst) != 0 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
}

#[cfg(test)]
mod tests;
