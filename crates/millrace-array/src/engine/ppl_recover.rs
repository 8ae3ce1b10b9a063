//! Recovery from the partial-parity log after a crash (the format is in `crate::ppl`): every
//! whole record on the members in service is applied in sequence order, each entry recomputing
//! its stripe's logged parity from the partial parity and what the written strips hold now (or
//! the logged data of a strip whose member is out of service, which is also written back where
//! the member takes writes). Then each stripe touched is made whole: its missing strips rebuilt
//! from the recovered parity and the parity not logged (RAID6's Q when P was logged) recomputed
//! from the data. Finally the records are retired.

use std::collections::BTreeMap;

use super::codes::{add_share, read_and_recover};
use super::Array;
use crate::aligned::AlignedBuf;
use crate::io::Op;
use crate::ppl::{LogEntry, LogWrite, Logged};

/// One update of one stripe: (sequence number, row, group).
type Update = (u64, u64, usize);
/// The writes of an update whose data its entries hold, each with its place in the list.
type Held<'a> = Vec<(usize, &'a LogWrite)>;

/// Per update: which parities' entries were found (a set is applied only whole), and the new
/// data it logged, whichever entry of its set holds it (the entries of a set list the same
/// writes, so a write is known by its place in the list).
fn sets(
    records: &[(u64, usize, Vec<LogEntry>)],
) -> (BTreeMap<Update, u8>, BTreeMap<Update, Held<'_>>) {
    let mut found: BTreeMap<Update, u8> = BTreeMap::new();
    let mut logged: BTreeMap<Update, Held<'_>> = BTreeMap::new();
    for (seq, _, entries) in records {
        for e in entries {
            if e.parity < 8 {
                *found.entry((*seq, e.row, e.group)).or_default() |= 1 << e.parity;
            }
            let held = e
                .writes
                .iter()
                .enumerate()
                .filter(|(_, w)| w.here().is_some());
            logged
                .entry((*seq, e.row, e.group))
                .or_default()
                .extend(held);
        }
    }
    (found, logged)
}

impl Array {
    /// Every whole record on the members in service: (seq, holder member, entries).
    fn read_log(&self) -> Vec<(u64, usize, Vec<LogEntry>)> {
        let Some(area) = self.log.area else {
            return Vec::new();
        };
        let drives = self.drives.load_full();
        let mut out = Vec::new();
        for m in (0..self.geo.members).filter(|&m| self.writable(m)) {
            for s in 0..area.slots {
                let mut head = AlignedBuf::zeroed(4096);
                if drives[m].read_at(&mut head, area.offset(s)).is_err() {
                    continue;
                }
                let Some(len) = crate::ppl::record_len(&head, area.slot_bytes) else {
                    continue;
                };
                let mut rec = AlignedBuf::zeroed(len);
                if drives[m].read_at(&mut rec, area.offset(s)).is_err() {
                    continue;
                }
                if let Some((seq, entries)) = crate::ppl::decode(&rec) {
                    out.push((seq, m, entries));
                }
            }
        }
        out.sort_by_key(|r| r.0);
        out
    }

    /// At the start of a pool stopped cleanly: a record still there is stale and must never be
    /// applied later. Retires it; returns whether there was one.
    pub fn discard_log(&self) -> bool {
        let found = !self.read_log().is_empty();
        if found {
            let live: Vec<usize> = (0..self.geo.members)
                .filter(|&m| self.writable(m))
                .collect();
            self.blank_log(&live);
        }
        found
    }

    /// After a crash: applies the log (see the module comment). Returns the entries applied.
    pub fn recover_log(&self) -> usize {
        let records = self.read_log();
        if records.is_empty() {
            return 0;
        }
        let (found, logged) = sets(&records);
        let mut touched: BTreeMap<(u64, usize), Vec<usize>> = BTreeMap::new();
        let mut applied = 0;
        for (seq, holder, entries) in &records {
            for e in entries {
                let key = (*seq, e.row, e.group);
                if found.get(&key) != Some(&e.set) {
                    continue;
                }
                let in_set = logged.get(&key).map_or(&[][..], Vec::as_slice);
                if self.apply_entry(e, *holder, in_set) {
                    applied += 1;
                    touched.entry((e.row, e.group)).or_default().push(e.parity);
                }
            }
        }
        let live: Vec<usize> = (0..self.geo.members)
            .filter(|&m| self.writable(m))
            .collect();
        self.flush_members(&self.drives.load_full(), &live);
        for ((row, group), logged) in touched {
            self.make_stripe_whole(row, group, &logged);
        }
        self.blank_log(&live);
        applied
    }

    /// Whether an entry read from a drive describes a stripe of this pool sanely.
    fn entry_fits(&self, e: &LogEntry, holder: usize) -> bool {
        let geo = &self.geo;
        let k = geo.group_data();
        let np = geo.level.parity();
        e.row < geo.rows()
            && e.group < geo.groups()
            && e.parity < np
            && e.hi <= geo.strip
            && (e.partial.is_empty() || e.partial.len() as u64 == e.hi - e.lo)
            && geo.group_layout(e.row, e.group)[k + e.parity] == holder
            && e.writes.iter().all(|w| {
                w.index < k
                    && w.at >= e.lo
                    && w.at + w.len as u64 <= e.hi
                    && w.here().is_none_or(|d| d.len() == w.len)
            })
    }

    /// Recomputes one entry's parity and writes it (and the data it logged) in place. `in_set`:
    /// the writes its set logged the data of, by place in the list, for those this entry says
    /// are in another entry. Returns whether it could: a written strip no longer readable
    /// leaves the stripe as it is.
    fn apply_entry(&self, e: &LogEntry, holder: usize, in_set: &[(usize, &LogWrite)]) -> bool {
        if !self.entry_fits(e, holder) {
            return false;
        }
        let layout = self.geo.group_layout(e.row, e.group);
        let k = self.geo.group_data();
        let mut par = if e.partial.is_empty() {
            AlignedBuf::zeroed((e.hi - e.lo) as usize)
        } else {
            AlignedBuf::from_slice(&e.partial)
        };
        let mut logged: Vec<(usize, u64, AlignedBuf)> = Vec::new();
        for (i, w) in e.writes.iter().enumerate() {
            let m = layout[w.index];
            let off = self.member_offset(e.row, w.at);
            let at = (w.at - e.lo) as usize;
            let src = match &w.data {
                Logged::Here(d) => {
                    let b = AlignedBuf::from_slice(d);
                    add_share(e.parity, w.index, &b, &mut par[at..at + w.len]);
                    logged.push((m, off, b));
                    continue;
                }
                Logged::InSet => {
                    let same = |x: &&(usize, &LogWrite)| {
                        x.0 == i && (x.1.index, x.1.at, x.1.len) == (w.index, w.at, w.len)
                    };
                    let Some(d) = in_set.iter().find(same).and_then(|x| x.1.here()) else {
                        return false;
                    };
                    AlignedBuf::from_slice(d)
                }
                Logged::OnDrive => {
                    if !self.readable(m, e.row) {
                        return false;
                    }
                    let mut b = AlignedBuf::zeroed(w.len);
                    if !self.run(&mut [Op::read(m, off, &mut b)]) {
                        return false;
                    }
                    b
                }
            };
            add_share(e.parity, w.index, &src, &mut par[at..at + w.len]);
        }
        let pm = layout[k + e.parity];
        let mut ops: Vec<Op> = logged
            .iter()
            .filter(|(m, _, _)| self.writable(*m))
            .map(|(m, off, b)| Op::write(*m, *off, b))
            .collect();
        if self.writable(pm) {
            ops.push(Op::write(pm, self.member_offset(e.row, e.lo), &par));
        }
        self.run(&mut ops);
        true
    }

    /// After its logged parities are right: rebuilds the stripe's unreadable strips from them
    /// and recomputes the parities not logged, writing what can be written.
    fn make_stripe_whole(&self, row: u64, group: usize, logged: &[usize]) {
        let layout = self.geo.group_layout(row, group);
        let k = self.geo.group_data();
        let np = self.geo.level.parity();
        let mut missing: Vec<usize> = (0..layout.len())
            .filter(|&i| !self.readable(layout[i], row) || (i >= k && !logged.contains(&(i - k))))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if missing.is_empty() || missing.len() > np {
            return;
        }
        let off = self.member_offset(row, 0);
        let Some(bufs) = read_and_recover(self, &layout, row, &missing) else {
            return;
        };
        let mut ops: Vec<Op> = missing
            .iter()
            .filter(|&&i| self.writable(layout[i]))
            .map(|&i| Op::write(layout[i], off, &bufs[i]))
            .collect();
        self.run(&mut ops);
    }
}
