//! Holding a received write back until the write that continues it has its data too, so both
//! reach the device in the same scheduler round (issue #15), in the manner of the Linux block
//! layer's plugging. A parity pool merges writes in flight to one stripe into one full-stripe
//! write, but only those that have reached it together: a host streaming 128 KiB writes into
//! 256 KiB stripes sends the second half's data after the first's, and a first half written
//! the moment its own data was in went alone, with a read-modify-write (a quarter of the
//! stripes of a RAID6 pool over NVMe/TCP at QD16, docs/PERFORMANCE.md).
//!
//! The transport knows nothing of parity: the device says which span it writes whole (its
//! write granule, `BlockDevice::write_granule_bytes`), and a write is held only while a write
//! that begins where it ends, whose data the host has been asked for, is still arriving, and
//! only when it ends inside a granule. Held writes go to the device, oldest first, just before
//! the write they wait for; a chain of them never reaches past a granule boundary, and none
//! waits longer than the target's `write_hold` in all (2 ms unless configured: a host that
//! sends the data of a later write late delays the earlier ones by that much at most).

use crate::cmd::Sqe;
use millrace_io::share::Held;
use millrace_io::IoBuf;
use std::time::Duration;
use tokio::time::Instant;

/// Where a write's blocks end, and its namespace's write granule in blocks (non-zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub nsid: u32,
    pub end: u64,
    pub granule: u64,
}

impl Span {
    /// Whether a write to namespace `nsid` beginning at block `slba` continues this one inside
    /// one of its granules.
    pub fn continued_at(&self, nsid: u32, slba: u64) -> bool {
        nsid == self.nsid && slba == self.end && !self.end.is_multiple_of(self.granule)
    }
}

/// A write whose data is all in, held for the one that continues it.
pub(crate) struct HeldWrite {
    pub sqe: Sqe,
    pub buf: IoBuf,
    pub held: Option<Held>,
}

/// Writes held for one write, oldest first, and when the first of them was held.
pub(crate) struct Chain {
    since: Instant,
    pub writes: Vec<HeldWrite>,
}

/// A connection's held writes, each chain keyed by the command id of the write it waits for.
pub(crate) struct Plug {
    /// The longest a write is held (zero: none is).
    most: Duration,
    chains: Vec<(u16, Chain)>,
}

impl Plug {
    pub fn new(most: Duration) -> Plug {
        Plug {
            most,
            chains: Vec::new(),
        }
    }

    /// Whether writes are held at all.
    pub fn holds(&self) -> bool {
        !self.most.is_zero()
    }

    /// When the oldest held write's wait is over (None: nothing is held).
    pub fn deadline(&self) -> Option<Instant> {
        self.chains.iter().map(|(_, c)| c.since + self.most).min()
    }

    /// Holds `w`, after the chain that waited for it if any, for the write `next_cid`.
    pub fn hold(&mut self, next_cid: u16, chain: Option<Chain>, w: HeldWrite) {
        let mut chain = chain.unwrap_or_else(|| Chain {
            since: Instant::now(),
            writes: Vec::new(),
        });
        chain.writes.push(w);
        self.chains.push((next_cid, chain));
    }

    /// The writes held for `cid`, if any.
    pub fn release(&mut self, cid: u16) -> Option<Chain> {
        let i = self.chains.iter().position(|(c, _)| *c == cid)?;
        Some(self.chains.swap_remove(i).1)
    }

    /// Every held write, oldest chain first: the wait is over.
    pub fn release_all(&mut self) -> Vec<HeldWrite> {
        self.chains.sort_by_key(|(_, c)| c.since);
        self.chains.drain(..).flat_map(|(_, c)| c.writes).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ending_at(end: u64) -> Span {
        Span {
            nsid: 1,
            end,
            granule: 64,
        }
    }

    fn w(cid: u16) -> HeldWrite {
        HeldWrite {
            sqe: Sqe::new(crate::cmd::io::WRITE, cid, 1),
            buf: IoBuf::standalone(0),
            held: None,
        }
    }

    #[test]
    fn a_write_is_continued_only_inside_its_granule_and_namespace() {
        assert!(ending_at(32).continued_at(1, 32));
        // Ends on a granule boundary: the next write starts a span of its own.
        assert!(!ending_at(64).continued_at(1, 64));
        // Not adjacent, or another namespace.
        assert!(!ending_at(32).continued_at(1, 40));
        assert!(!ending_at(32).continued_at(2, 32));
    }

    #[test]
    fn chains_are_released_whole_and_in_order() {
        let mut p = Plug::new(Duration::from_millis(2));
        assert_eq!(p.deadline(), None);
        p.hold(7, None, w(5));
        let first = p.deadline().expect("a write is held");
        let chain = p.release(7).expect("5 waits for 7");
        assert_eq!(chain.writes.len(), 1);
        // A chain keeps the time its first write was held: its wait does not start again.
        p.hold(9, Some(chain), w(7));
        assert_eq!(p.deadline(), Some(first));
        p.hold(12, None, w(11));
        assert!(p.release(8).is_none());
        let cids: Vec<u16> = p
            .release(9)
            .unwrap()
            .writes
            .iter()
            .map(|h| h.sqe.cid())
            .collect();
        assert_eq!(cids, [5, 7]);
        let rest: Vec<u16> = p.release_all().iter().map(|h| h.sqe.cid()).collect();
        assert_eq!(rest, [11]);
        assert_eq!(p.deadline(), None);
    }
}
