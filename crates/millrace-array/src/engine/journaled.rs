//! Format version 1's degraded-write journal (`crate::journal`), read only so that a pool made
//! by an older Millrace converts: a record a crash left behind is written in place once at import
//! (or retired, after a clean stop); from then on the pool uses the partial-parity log, and its
//! superblocks are rewritten as version 2 at the first write.

use super::Array;
use crate::aligned::AlignedBuf;
use crate::io::Op;

impl Array {
    /// At the start of a version-1 pool stopped cleanly: every write of the last run is in
    /// place, so a journal record still found there is stale. Retires it; returns whether there
    /// was one.
    pub fn discard_journal(&self) -> bool {
        let cap = crate::journal::capacity(self.data_offset);
        let live = self.live_drives();
        let found = live
            .iter()
            .any(|d| crate::journal::read(d.as_ref(), cap, self.geo.members).is_some());
        if found {
            crate::journal::retire(&live);
        }
        found
    }

    /// After a crash of a version-1 pool: writes the newest whole journal record in place
    /// again, then retires it. Returns whether one was replayed.
    pub fn replay_journal(&self) -> bool {
        let cap = crate::journal::capacity(self.data_offset);
        let live = self.live_drives();
        let newest = live
            .iter()
            .filter_map(|d| crate::journal::read(d.as_ref(), cap, self.geo.members))
            .max_by_key(|r| r.0);
        let Some((_, entries)) = newest else {
            return false;
        };
        let mut bufs: Vec<(usize, u64, AlignedBuf)> = entries
            .into_iter()
            .filter(|(m, _, _)| self.writable(*m))
            .map(|(m, off, b)| (m, off, AlignedBuf::from_slice(&b)))
            .collect();
        let mut ops: Vec<Op> = bufs
            .iter_mut()
            .map(|(m, off, b)| Op::write(*m, *off, b))
            .collect();
        self.run(&mut ops);
        let _ = self.flush();
        crate::journal::retire(&live);
        true
    }
}
