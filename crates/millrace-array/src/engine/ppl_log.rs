//! Degraded parity writes through the partial-parity log (the format and the idea are in
//! `crate::ppl`): the records of a request go to its stripes' parity members, made durable (one
//! FUA write each, together), then the data and parity go in place. Nothing serialises
//! requests on different stripes: each takes a free slot on each member it logs on.
//!
//! The rules that keep a record replayable:
//! - A record is overwritten only once its in-place writes are durable: a used slot is freed by
//!   the first flush of every member issued after the request finished (`Array::flush`).
//! - A record's partial parity is computed from durable data: a stripe logged by an earlier
//!   request whose writes may not be durable yet is flushed first. So after a crash, applying
//!   every record in sequence order leaves each stripe right (a later record overrides an earlier
//!   one wherever it wrote).
//! - Records describe one set of members out of service (an "epoch"): when that set changes,
//!   everything is flushed and the records are retired before the next logged write, so a record
//!   never meets a stripe written without the log since; the same when the pool is whole again,
//!   before the first unlogged write, and at a clean stop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Condvar, Mutex};

use super::{Array, Result};
use crate::io::Op;
use crate::ppl::{Area, LogEntry};
use crate::superblock::MemberState;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    /// A request is writing its record or its data.
    Busy,
    /// The request finished at this flush generation; free after a flush that started later.
    Done(u64),
}

struct LogState {
    seq: u64,
    /// Flush generation: bumped as each flush starts.
    gen: u64,
    /// Flushes started and not yet ended.
    flushing: usize,
    /// Per member, per slot.
    slots: Vec<Vec<Slot>>,
    busy: usize,
    /// Stripes (row, group) logged by a finished request whose writes may not be durable, with
    /// the generation they finished in.
    undurable: HashMap<(u64, usize), u64>,
    /// Members out of service when the records on the drives were written.
    epoch: Vec<usize>,
    /// Where the records on the drives are: per stripe the (member, slot) holding one for it,
    /// and per member and slot the stripes its record covers. A stripe has at most one record
    /// per holder on the drives: an older one would undo, at recovery, a newer update whose
    /// own record was overwritten once it was durable.
    on_disk: HashMap<(u64, usize), Vec<(usize, u64)>>,
    slot_stripes: Vec<Vec<Vec<(u64, usize)>>>,
}

impl LogState {
    /// Slot `(m, i)` is about to be overwritten: the stripes its record covered lose it.
    fn evict(&mut self, m: usize, i: u64) {
        for s in std::mem::take(&mut self.slot_stripes[m][i as usize]) {
            if let Some(v) = self.on_disk.get_mut(&s) {
                v.retain(|&x| x != (m, i));
                if v.is_empty() {
                    self.on_disk.remove(&s);
                }
            }
        }
    }

    /// A free slot of `m` for a record of `stripes`: the one already holding a record of one of
    /// them if free (it is overwritten, not left behind), else any.
    fn pick(&self, m: usize, stripes: &[(u64, usize)]) -> Option<u64> {
        let free = |i: u64| self.slots[m][i as usize] == Slot::Free;
        stripes
            .iter()
            .filter_map(|s| self.on_disk.get(s))
            .flatten()
            .find(|&&(mm, i)| mm == m && free(i))
            .map(|&(_, i)| i)
            .or_else(|| (0..self.slots[m].len() as u64).find(|&i| free(i)))
    }

    fn forget_all(&mut self) {
        self.on_disk.clear();
        for v in self.slot_stripes.iter_mut().flatten() {
            v.clear();
        }
    }
}

pub(super) struct Log {
    pub(super) area: Option<Area>,
    state: Mutex<LogState>,
    freed: Condvar,
    /// Some member may hold a record not yet retired (a cheap check for the healthy path).
    pending: AtomicBool,
    /// A request is flushing to free slots before they run out (`free_early`).
    early: AtomicBool,
}

impl Log {
    pub(super) fn new(area: Option<Area>, members: usize) -> Log {
        let n = area.map_or(0, |a| a.slots as usize);
        Log {
            area,
            state: Mutex::new(LogState {
                seq: 1,
                gen: 0,
                flushing: 0,
                slots: vec![vec![Slot::Free; n]; members],
                busy: 0,
                undurable: HashMap::new(),
                epoch: Vec::new(),
                on_disk: HashMap::new(),
                slot_stripes: vec![vec![Vec::new(); n]; members],
            }),
            freed: Condvar::new(),
            pending: AtomicBool::new(false),
            early: AtomicBool::new(false),
        }
    }

    /// A flush starts: returns its generation.
    pub(super) fn begin_flush(&self) -> u64 {
        let mut st = self.state.lock();
        st.gen += 1;
        st.flushing += 1;
        st.gen - 1
    }

    /// A flush of every member that started at generation `g` has completed.
    pub(super) fn end_flush(&self, g: u64) {
        let mut st = self.state.lock();
        for s in st.slots.iter_mut().flatten() {
            if matches!(*s, Slot::Done(d) if d <= g) {
                *s = Slot::Free;
            }
        }
        st.undurable.retain(|_, d| *d > g);
        st.flushing -= 1;
        drop(st);
        self.freed.notify_all();
    }
}

/// The slots a request holds: (member, slot), its sequence number, and the slots holding older
/// records of its stripes, to be blanked with its own record's write.
struct Claim {
    slots: Vec<(usize, u64)>,
    seq: u64,
    blanks: Vec<(usize, u64)>,
}

impl Array {
    /// Members out of service (not Online): their strips' data lives, in part, in parity.
    pub(super) fn out_of_service(&self) -> Vec<usize> {
        (0..self.geo.members)
            .filter(|&m| self.member_state(m) != MemberState::Online)
            .collect()
    }

    /// Writes a degraded pool's ops after logging `records` (per holder member) for `stripes`.
    /// `planned`: the members out of service when the request was planned. Ok(false): that set
    /// changed since; plan again.
    pub(super) fn logged_write(
        &self,
        planned: &[usize],
        stripes: &[(u64, usize)],
        records: Vec<(usize, Vec<LogEntry>)>,
        ops: &mut [Op],
    ) -> Result<bool> {
        let Some(area) = self.log.area else {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| tracing::warn!("the pool's metadata area has no room for a partial-parity log; degraded writes are not protected against a crash"));
            self.run(ops);
            return Ok(true);
        };
        let held: Vec<(usize, Vec<(u64, usize)>)> = records
            .iter()
            .map(|(m, es)| (*m, es.iter().map(|e| (e.row, e.group)).collect()))
            .collect();
        let Some(claim) = self.claim(planned, stripes, &held) else {
            return Ok(false);
        };
        let bufs: Vec<_> = records
            .iter()
            .map(|(_, e)| crate::ppl::encode(claim.seq, e, area.slot_bytes))
            .collect();
        if bufs.iter().any(Option::is_none) {
            // The write path cuts requests so that a record always fits a slot.
            debug_assert!(false, "a log record larger than its slot");
            self.release(&claim, &[]);
            self.run(ops);
            return Ok(true);
        }
        let mut lops: Vec<Op> = claim
            .slots
            .iter()
            .zip(&bufs)
            .map(|(&(m, s), b)| Op::write_fua(m, area.offset(s), b.as_ref().expect("checked")))
            .collect();
        let zero = crate::ppl::blank();
        lops.extend(
            claim
                .blanks
                .iter()
                .map(|&(m, s)| Op::write_fua(m, area.offset(s), &zero)),
        );
        let bytes: u64 = lops.iter().map(Op::bytes).sum();
        self.stats
            .log_records
            .fetch_add(lops.len() as u64, Ordering::Relaxed);
        self.stats.log_bytes.fetch_add(bytes, Ordering::Relaxed);
        // FUA: each record is durable when its write completes, without waiting for the
        // member's other writes (other stripes' data) to be flushed with it.
        self.run(&mut lops);
        drop(lops);
        if self.out_of_service() != planned {
            // A holder failed: its record may not be durable. Nothing was written in place;
            // plan again for the members left (a record that did land only restates the old
            // parity, and the next epoch retires it).
            self.release(&claim, &[]);
            return Ok(false);
        }
        self.run(ops);
        self.release(&claim, stripes);
        self.free_early(&claim);
        Ok(true)
    }

    /// Slots are freed only by a flush. Left until a member has none free, every request
    /// logging on that member stalls on a flush at once (on the simulated 16-drive RAID6, one
    /// stalled request in ten, a sixth of the write time); so once one of this request's
    /// members is down to half its slots free, this request (alone: others go on) flushes
    /// before it returns, while the member still has slots for the others.
    fn free_early(&self, claim: &Claim) {
        let st = self.log.state.lock();
        let low = claim.slots.iter().any(|&(m, _)| {
            let free = st.slots[m].iter().filter(|s| **s == Slot::Free).count();
            free * 2 < st.slots[m].len()
        });
        drop(st);
        if low && !self.log.early.swap(true, Ordering::AcqRel) {
            let _ = self.flush();
            self.log.early.store(false, Ordering::Release);
        }
    }

    /// Takes a free slot on each holder, flushing first where a rule above asks for it. None:
    /// the members out of service are not those the request was planned with.
    fn claim(
        &self,
        planned: &[usize],
        stripes: &[(u64, usize)],
        holders: &[(usize, Vec<(u64, usize)>)],
    ) -> Option<Claim> {
        let mut st = self.log.state.lock();
        loop {
            let now = self.out_of_service();
            if now != st.epoch {
                if st.busy > 0 {
                    self.log.freed.wait(&mut st);
                    continue;
                }
                self.new_epoch(&mut st, now);
                continue;
            }
            if now != planned {
                return None;
            }
            let stale = stripes.iter().any(|s| st.undurable.contains_key(s));
            let mut free = Vec::with_capacity(holders.len());
            let mut done = false;
            for (m, hs) in holders {
                match st.pick(*m, hs) {
                    Some(i) => free.push((*m, i)),
                    None => done |= st.slots[*m].iter().any(|s| matches!(s, Slot::Done(_))),
                }
            }
            if !stale && free.len() < holders.len() && done && st.flushing > 0 {
                // A flush under way frees the slots done before it began: wait for it rather
                // than start one more (looking again after, and flushing if still short).
                self.log.freed.wait(&mut st);
                continue;
            }
            if stale || (free.len() < holders.len() && done) {
                drop(st);
                let _ = self.flush();
                st = self.log.state.lock();
                continue;
            }
            if free.len() < holders.len() {
                self.log.freed.wait(&mut st);
                continue;
            }
            let mut blanks = Vec::new();
            for (&(m, i), (_, hs)) in free.iter().zip(holders) {
                st.slots[m][i as usize] = Slot::Busy;
                st.evict(m, i);
                // Older records of these stripes elsewhere are durable in place (the flush
                // above saw to it): blank them with this write.
                for s in hs {
                    let older = st.on_disk.get(s).cloned().unwrap_or_default();
                    for (m2, y) in older.into_iter().filter(|&(m2, _)| m2 == m) {
                        st.evict(m2, y);
                        blanks.push((m2, y));
                    }
                }
                st.slot_stripes[m][i as usize] = hs.clone();
                for s in hs {
                    st.on_disk.entry(*s).or_default().push((m, i));
                }
            }
            st.busy += free.len();
            let seq = st.seq;
            st.seq += 1;
            self.log.pending.store(true, Ordering::Release);
            return Some(Claim {
                slots: free,
                seq,
                blanks,
            });
        }
    }

    fn release(&self, claim: &Claim, stripes: &[(u64, usize)]) {
        let mut st = self.log.state.lock();
        let g = st.gen;
        for &(m, i) in &claim.slots {
            st.slots[m][i as usize] = Slot::Done(g);
        }
        st.busy -= claim.slots.len();
        for &s in stripes {
            st.undurable.insert(s, g);
        }
        drop(st);
        self.log.freed.notify_all();
    }

    /// The set of members out of service changed and no request is logging: make everything
    /// durable and retire every record, so none is ever applied over a write made without it.
    fn new_epoch(&self, st: &mut LogState, now: Vec<usize>) {
        let live: Vec<usize> = (0..self.geo.members)
            .filter(|&m| self.writable(m))
            .collect();
        let drives = self.drives.load_full();
        self.flush_members(&drives, &live);
        if self.log.pending.load(Ordering::Acquire) {
            self.blank_log(&live);
        }
        for s in st.slots.iter_mut().flatten() {
            *s = Slot::Free;
        }
        st.undurable.clear();
        st.forget_all();
        st.epoch = now;
    }

    /// Zeroes the header of every slot on these members, durably.
    pub(super) fn blank_log(&self, members: &[usize]) {
        if let Some(area) = self.log.area {
            let zero = crate::ppl::blank();
            let mut ops: Vec<Op> = members
                .iter()
                .flat_map(|&m| (0..area.slots).map(move |s| (m, s)))
                .map(|(m, s)| Op::write(m, area.offset(s), &zero))
                .collect();
            self.run(&mut ops);
            self.flush_members(&self.drives.load_full(), members);
        }
        self.log.pending.store(false, Ordering::Release);
    }

    /// Retires every record, durably, once no request is logging: before a write that does not
    /// go through the log (the pool is whole again), and at a clean stop.
    pub fn retire_log(&self) {
        if !self.log.pending.load(Ordering::Acquire) {
            return;
        }
        let mut st = self.log.state.lock();
        while st.busy > 0 {
            self.log.freed.wait(&mut st);
        }
        if self.log.pending.load(Ordering::Acquire) {
            let now = self.out_of_service();
            self.new_epoch(&mut st, now);
        }
    }
}
