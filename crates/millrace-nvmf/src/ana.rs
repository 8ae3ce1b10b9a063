//! Asymmetric Namespace Access (ANA): how each path (a listener of the target, which a
//! controller was connected through) reaches each ANA group of a subsystem. A host's native
//! multipath reads these states from the ANA log page (LID 0Ch) and sends I/O down optimized
//! paths; a command on a path whose group is inaccessible, lost or changing completes with a
//! path-related status, so the host retries it on another path. States other than optimized are
//! kept per (port, group) in each subsystem; a path never set is optimized. This module depends
//! on no other of the crate's but the wire's statuses.

use crate::cmd::Status;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The largest ANA group id (ANAGRPMAX) and the number of groups (NANAGRPID) reported.
pub const ANA_GROUP_MAX: u32 = 128;
/// ANA Transition Time (ANATT) in seconds: the longest a group stays in the change state.
pub(crate) const ANATT: u8 = 10;
/// ANACAP: optimized, non-optimized, inaccessible, persistent loss and change states are
/// reported, and a namespace's group id does not change while it is attached.
pub(crate) const ANACAP: u8 = 0x1f | 1 << 6;

/// The ANA state of a group as one path reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AnaState {
    Optimized,
    NonOptimized,
    Inaccessible,
    PersistentLoss,
    /// The state is changing (ANA transition).
    Change,
}

impl AnaState {
    pub const ALL: [AnaState; 5] = [
        AnaState::Optimized,
        AnaState::NonOptimized,
        AnaState::Inaccessible,
        AnaState::PersistentLoss,
        AnaState::Change,
    ];
    /// The state's code in the ANA log page.
    pub fn code(self) -> u8 {
        match self {
            AnaState::Optimized => 0x01,
            AnaState::NonOptimized => 0x02,
            AnaState::Inaccessible => 0x03,
            AnaState::PersistentLoss => 0x04,
            AnaState::Change => 0x0f,
        }
    }
    /// The name the API, the CLI and Linux's `ana_state` file use.
    pub fn as_str(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non-optimized",
            AnaState::Inaccessible => "inaccessible",
            AnaState::PersistentLoss => "persistent-loss",
            AnaState::Change => "change",
        }
    }
    /// The status an I/O command gets on a path in this state (path-related, status code type
    /// 3, retryable so the host fails over), or None where I/O is served.
    pub fn io_status(self) -> Option<Status> {
        let path = |sc| Status {
            sct: 3,
            sc,
            dnr: false,
        };
        match self {
            AnaState::Optimized | AnaState::NonOptimized => None,
            AnaState::PersistentLoss => Some(path(0x01)),
            AnaState::Inaccessible => Some(path(0x02)),
            AnaState::Change => Some(path(0x03)),
        }
    }
}

impl std::fmt::Display for AnaState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for AnaState {
    type Err = String;
    fn from_str(s: &str) -> Result<AnaState, String> {
        let s = s.trim().to_ascii_lowercase().replace('_', "-");
        (AnaState::ALL.into_iter())
            .find(|a| a.as_str() == s || (s == "nonoptimized" && *a == AnaState::NonOptimized))
            .ok_or_else(|| {
                format!(
                    "'{s}' is not an ANA state; use optimized, non-optimized, inaccessible, persistent-loss or change"
                )
            })
    }
}

/// One subsystem's ANA states: those other than optimized, per (port id, group).
#[derive(Default)]
pub(crate) struct Ana {
    states: RwLock<HashMap<(u16, u32), AnaState>>,
    /// Whether any state is other than optimized: the data path reads only this while all are.
    others: AtomicBool,
    /// Counts changes (the ANA log's change count); starts at zero.
    changes: AtomicU64,
}

impl Ana {
    /// The state of `group` as seen through port `port` (0: a port not known, optimized).
    pub fn state(&self, port: u16, group: u32) -> AnaState {
        if !self.others.load(Ordering::Relaxed) {
            return AnaState::Optimized;
        }
        (self.states.read().get(&(port, group)).copied()).unwrap_or(AnaState::Optimized)
    }
    /// Sets a state; true when it changed.
    pub fn set(&self, port: u16, group: u32, state: AnaState) -> bool {
        let mut m = self.states.write();
        let old = m
            .get(&(port, group))
            .copied()
            .unwrap_or(AnaState::Optimized);
        if old == state {
            return false;
        }
        match state {
            AnaState::Optimized => m.remove(&(port, group)),
            s => m.insert((port, group), s),
        };
        self.others.store(!m.is_empty(), Ordering::Relaxed);
        self.changes.fetch_add(1, Ordering::Relaxed);
        true
    }
    /// Forgets the states of a port that went away.
    pub fn forget_port(&self, port: u16) {
        let mut m = self.states.write();
        m.retain(|(p, _), _| *p != port);
        self.others.store(!m.is_empty(), Ordering::Relaxed);
    }
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }
}

/// The ANA log page: a 16-byte header (change count, number of group descriptors), then per
/// group a 32-byte descriptor (group id, number of namespace ids, change count, state) and,
/// unless `groups_only` (RGO), the group's namespace ids in ascending order. `groups` is sorted
/// by group id, each with its state on this path and its namespace ids.
pub(crate) fn log_page(
    changes: u64,
    groups: &[(u32, AnaState, Vec<u32>)],
    groups_only: bool,
) -> Vec<u8> {
    let ids: usize = match groups_only {
        true => 0,
        false => groups.iter().map(|g| g.2.len()).sum(),
    };
    let mut b = vec![0u8; 16 + 32 * groups.len() + 4 * ids];
    b[0..8].copy_from_slice(&changes.to_le_bytes());
    b[8..10].copy_from_slice(&(groups.len() as u16).to_le_bytes());
    let mut at = 16;
    for (group, state, nsids) in groups {
        let n = if groups_only { 0 } else { nsids.len() };
        b[at..at + 4].copy_from_slice(&group.to_le_bytes());
        b[at + 4..at + 8].copy_from_slice(&(n as u32).to_le_bytes());
        b[at + 8..at + 16].copy_from_slice(&changes.to_le_bytes());
        b[at + 16] = state.code();
        at += 32;
        for id in nsids.iter().take(n) {
            b[at..at + 4].copy_from_slice(&id.to_le_bytes());
            at += 4;
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_parse_and_default_to_optimized() {
        assert_eq!(
            "Non_Optimized".parse::<AnaState>(),
            Ok(AnaState::NonOptimized)
        );
        assert!("sideways"
            .parse::<AnaState>()
            .unwrap_err()
            .contains("not an ANA state"));
        let a = Ana::default();
        assert_eq!(a.state(1, 1), AnaState::Optimized);
        assert!(a.set(1, 1, AnaState::Inaccessible));
        assert!(!a.set(1, 1, AnaState::Inaccessible));
        assert_eq!(a.state(1, 1), AnaState::Inaccessible);
        assert_eq!(a.state(2, 1), AnaState::Optimized);
        a.forget_port(1);
        assert_eq!(a.state(1, 1), AnaState::Optimized);
    }

    #[test]
    fn log_page_layout() {
        let p = log_page(
            7,
            &[
                (1, AnaState::Optimized, vec![1, 2]),
                (3, AnaState::Change, vec![5]),
            ],
            false,
        );
        assert_eq!(p.len(), 16 + 64 + 12);
        assert_eq!(u16::from_le_bytes([p[8], p[9]]), 2);
        assert_eq!(p[16 + 16], 1);
        assert_eq!(&p[48..56], &[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(p[56 + 16], 0x0f);
        assert_eq!(&p[88..92], &5u32.to_le_bytes());
        assert_eq!(
            log_page(7, &[(1, AnaState::Optimized, vec![1])], true).len(),
            48
        );
    }
}
