//! Parity writes, planned per (row, group) "unit": a full stripe computes parity from new data
//! alone; a partial one reads either the old data and parity (read-modify-write) or the rest of
//! the span (reconstruct-write), whichever reads less; a group missing a member it needs rebuilds
//! the span from what it can read, then writes. All units' reads go out as one batch, then all
//! writes as another (after the partial-parity log while the pool is degraded, `ppl_log`).

use std::sync::atomic::Ordering;

use super::codes::add_share;
use super::codes::{gen_parity, recover};
use super::{Array, ArrayError, Piece, Result};
use crate::ppl::{LogEntry, LogWrite, Logged};
use millrace_io::IoBuf;

use crate::io::Op;

/// The data of the requests one plan writes: one buffer per request (several when writes in
/// flight to one stripe are merged, see `merge`).
pub(super) type Srcs<'a> = &'a [&'a [u8]];

/// One data strip's part of a write.
pub(super) struct StripWrite {
    /// The data strip's index in its group (its syndrome order).
    pub(super) index: usize,
    /// Offset inside the strip.
    pub(super) at: u64,
    /// Which request's data (index into the plan's `Srcs`).
    pub(super) src: usize,
    /// Offset inside that request's data.
    pub(super) from: usize,
    pub(super) len: usize,
}

impl StripWrite {
    fn data<'a>(&self, data: Srcs<'a>) -> &'a [u8] {
        &data[self.src][self.from..self.from + self.len]
    }
}

pub(super) enum Plan {
    Full,
    Rmw,
    Rcw,
    Rebuild,
}

/// The writes of one request that land in one group of one row.
pub(super) struct Unit {
    pub(super) row: u64,
    group: usize,
    /// Members in syndrome order: data 0..k, then P (and Q).
    pub(super) layout: Vec<usize>,
    pub(super) writes: Vec<StripWrite>,
    pub(super) lo: u64,
    hi: u64,
    pub(super) plan: Plan,
    /// Span [lo, hi) buffers per layout position, as the plan needs them.
    pub(super) span: Vec<Option<IoBuf>>,
    /// Old contents of each write (read-modify-write).
    pub(super) old: Vec<Option<IoBuf>>,
    /// Layout positions this attempt could not read (fixed at planning time).
    pub(super) missing: Vec<usize>,
    /// Parities (0: P, 1: Q) whose partial parity is logged before the unit is written: while a
    /// data strip of the unit is on a member out of service (see `ppl_log`).
    log: Vec<usize>,
    /// The partial parity of each logged parity over [lo, hi), computed before the new data.
    partials: Vec<Vec<u8>>,
}

impl Unit {
    fn span_len(&self) -> usize {
        (self.hi - self.lo) as usize
    }

    /// Whether write `w` covers the whole span (its strip needs no read for reconstruct-write).
    fn covers(&self, w: &StripWrite) -> bool {
        w.at == self.lo && w.len == self.span_len()
    }
}

/// One attempt at a parity write. Ok(false): a read failed, members were marked faulty.
pub(super) fn write(a: &Array, pieces: &[Piece], data: &[u8]) -> Result<bool> {
    let data: Srcs = &[data];
    let planned = a.out_of_service();
    let mut units = units(a, pieces.iter().map(|p| (0, p)));
    for u in units.iter_mut() {
        plan(a, u)?;
        u.log = log_parities(a, u, &planned);
    }
    if !read_phase(a, &mut units) {
        return Ok(false);
    }
    compute(a, &mut units, data);
    if !write_phase(a, &units, data, &planned)? {
        return Ok(false);
    }
    match a.offline_group() {
        Some(e) => Err(e),
        None => Ok(true),
    }
}

/// The units of these pieces, each tagged with the request (source) it belongs to.
pub(super) fn units<'p>(a: &Array, pieces: impl Iterator<Item = (usize, &'p Piece)>) -> Vec<Unit> {
    let geo = &a.geo;
    let mut units: Vec<Unit> = Vec::new();
    for (src, p) in pieces {
        let loc = geo.locate(p.row, p.col);
        let same = |u: &Unit| u.row == p.row && u.group == loc.group;
        // One request's pieces come in row and group order: only the last unit can be theirs.
        // A later request of a merged set may add to any unit.
        let at = match units.last() {
            Some(u) if same(u) => Some(units.len() - 1),
            _ if src > 0 => units.iter().position(same),
            _ => None,
        };
        let ui = at.unwrap_or(units.len());
        if at.is_none() {
            units.push(Unit {
                row: p.row,
                group: loc.group,
                layout: geo.group_layout(p.row, loc.group),
                writes: Vec::new(),
                lo: p.s,
                hi: p.s + p.len as u64,
                plan: Plan::Full,
                span: Vec::new(),
                old: Vec::new(),
                missing: Vec::new(),
                log: Vec::new(),
                partials: Vec::new(),
            });
        }
        let u = &mut units[ui];
        u.writes.push(StripWrite {
            index: loc.index,
            at: p.s,
            src,
            from: p.at,
            len: p.len,
        });
        u.lo = u.lo.min(p.s);
        u.hi = u.hi.max(p.s + p.len as u64);
    }
    units
}

/// Chooses the unit's plan and gives it the buffers the plan needs.
pub(super) fn plan(a: &Array, u: &mut Unit) -> Result<()> {
    choose(a, u)?;
    give_buffers(a, u);
    Ok(())
}

/// Chooses the unit's plan (`plan` without the buffers).
pub(super) fn choose(a: &Array, u: &mut Unit) -> Result<()> {
    let k = a.geo.group_data();
    let np = a.geo.level.parity();
    let span = u.span_len();
    u.missing = (0..u.layout.len())
        .filter(|&i| !a.readable(u.layout[i], u.row))
        .collect();
    let full = u.writes.len() == k
        && u.writes
            .iter()
            .all(|w| w.at == 0 && w.len as u64 == a.geo.strip);
    u.plan = if full {
        Plan::Full
    } else if !u.missing.is_empty() {
        if u.missing.len() > np {
            return Err(ArrayError::Offline {
                group: u.group,
                lost: u.missing.len(),
                tolerance: np,
            });
        }
        Plan::Rebuild
    } else {
        let rmw: usize = u.writes.iter().map(|w| w.len).sum::<usize>() + np * span;
        let covering = u.writes.iter().filter(|w| u.covers(w)).count();
        if rmw <= (k - covering) * span {
            Plan::Rmw
        } else {
            Plan::Rcw
        }
    };
    let stat = match u.plan {
        Plan::Full => &a.stats.full_stripe_writes,
        Plan::Rmw => &a.stats.rmw_writes,
        Plan::Rcw => &a.stats.rcw_writes,
        Plan::Rebuild => &a.stats.degraded_writes,
    };
    stat.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Gives the unit the buffers its plan needs: spans by layout position, old data for a
/// read-modify-write.
pub(super) fn give_buffers(a: &Array, u: &mut Unit) {
    let k = a.geo.group_data();
    let (n, span) = (u.layout.len(), u.span_len());
    let needs: Vec<bool> = (0..n)
        .map(|i| match u.plan {
            Plan::Full | Plan::Rmw => i >= k,
            Plan::Rcw => !u.writes.iter().any(|w| w.index == i && u.covers(w)),
            Plan::Rebuild => true,
        })
        .collect();
    u.span = needs
        .into_iter()
        .map(|need| need.then(|| millrace_io::scratch(span)))
        .collect();
    if matches!(u.plan, Plan::Rmw) {
        u.old = u
            .writes
            .iter()
            .map(|w| Some(millrace_io::scratch(w.len)))
            .collect();
    }
}

/// The parities a unit logs: as many as it has data strips on members out of service (each
/// recovers one), on parity members that take writes, Online ones first.
fn log_parities(a: &Array, u: &Unit, out: &[usize]) -> Vec<usize> {
    let k = a.geo.group_data();
    let lost = u.layout[..k].iter().filter(|m| out.contains(m)).count();
    if lost == 0 {
        return Vec::new();
    }
    let mut js: Vec<usize> = (0..u.layout.len() - k)
        .filter(|&j| a.writable(u.layout[k + j]))
        .collect();
    js.sort_by_key(|&j| out.contains(&u.layout[k + j]));
    js.truncate(lost);
    js.sort_unstable();
    js
}

/// Reads what every unit's plan needs, as one batch. Returns whether all reads succeeded.
fn read_phase(a: &Array, units: &mut [Unit]) -> bool {
    let k = a.geo.group_data();
    let mut ops: Vec<Op> = Vec::new();
    for u in units.iter_mut() {
        let at = a.member_offset(u.row, u.lo);
        match u.plan {
            Plan::Full => {}
            Plan::Rmw => {
                for (w, old) in u.writes.iter().zip(u.old.iter_mut()) {
                    let m = u.layout[w.index];
                    let old = old.as_mut().unwrap();
                    ops.push(Op::read(m, a.member_offset(u.row, w.at), old));
                }
                for (b, &m) in u.span[k..].iter_mut().zip(&u.layout[k..]) {
                    ops.push(Op::read(m, at, b.as_mut().unwrap()));
                }
            }
            Plan::Rcw => {
                for (b, &m) in u.span[..k].iter_mut().zip(&u.layout[..k]) {
                    if let Some(b) = b.as_mut() {
                        ops.push(Op::read(m, at, b));
                    }
                }
            }
            Plan::Rebuild => {
                for (i, b) in u.span.iter_mut().enumerate() {
                    if !u.missing.contains(&i) {
                        ops.push(Op::read(u.layout[i], at, b.as_mut().unwrap()));
                    }
                }
            }
        }
    }
    a.run(&mut ops)
}

pub(super) fn compute(a: &Array, units: &mut [Unit], data: Srcs) {
    let np = a.geo.level.parity();
    for u in units.iter_mut() {
        match u.plan {
            Plan::Full => {
                // Every data strip's whole span is written: the partial parity is zero, and an
                // empty one is logged as such (`crate::ppl`).
                u.partials = u.log.iter().map(|_| Vec::new()).collect();
                compute_full(u, data, np)
            }
            Plan::Rmw => {
                u.partials = u.log.iter().map(|&j| partial_rmw(u, j, np)).collect();
                compute_rmw(u, data, np)
            }
            Plan::Rcw | Plan::Rebuild => compute_rcw(u, data, np),
        }
    }
}

/// Read-modify-write: the old parity with the old data of the written ranges taken out.
fn partial_rmw(u: &Unit, j: usize, np: usize) -> Vec<u8> {
    let k = u.layout.len() - np;
    let mut pp = u.span[k + j]
        .as_ref()
        .expect("the plan read parity")
        .to_vec();
    for (w, old) in u.writes.iter().zip(&u.old) {
        let at = (w.at - u.lo) as usize;
        let old = old.as_ref().expect("the plan read the old data");
        add_share(j, w.index, old, &mut pp[at..at + w.len]);
    }
    pp
}

/// Reconstruct-write: the parity of the span's data strips (old, before the new data is copied
/// in) over the bytes no write covers. A strip not read is written whole.
fn partial_rcw(u: &Unit, j: usize, k: usize) -> Vec<u8> {
    let mut pp = vec![0u8; u.span_len()];
    for (i, b) in u.span[..k].iter().enumerate() {
        let Some(b) = b else { continue };
        add_share(j, i, b, &mut pp);
        // Adding the written bytes a second time takes them out again.
        for w in u.writes.iter().filter(|w| w.index == i) {
            let at = (w.at - u.lo) as usize;
            add_share(j, i, &b[at..at + w.len], &mut pp[at..at + w.len]);
        }
    }
    pp
}

fn compute_full(u: &mut Unit, data: Srcs, np: usize) {
    let srcs = u.full_data(data, np);
    let k = u.layout.len() - np;
    gen_parity(&srcs, &mut u.span[k..], np);
}

impl Unit {
    /// A full-stripe unit's data strips, in syndrome order.
    pub(super) fn full_data<'a>(&self, data: Srcs<'a>, np: usize) -> Vec<&'a [u8]> {
        let mut srcs: Vec<&[u8]> = vec![&[]; self.layout.len() - np];
        for w in &self.writes {
            srcs[w.index] = w.data(data);
        }
        srcs
    }
}

fn compute_rmw(u: &mut Unit, data: Srcs, np: usize) {
    let k = u.layout.len() - np;
    let (_, par) = u.span.split_at_mut(k);
    for (w, old) in u.writes.iter().zip(u.old.iter_mut()) {
        let old = old.as_mut().unwrap();
        // old ^= new gives the delta that P and Q must absorb.
        millrace_parity::xor_into(old, w.data(data));
        let at = (w.at - u.lo) as usize;
        let p = par[0].as_mut().unwrap();
        millrace_parity::xor_into(&mut p[at..at + w.len], old);
        if np == 2 {
            let q = par[1].as_mut().unwrap();
            millrace_parity::mul_xor_into(
                millrace_parity::gf::exp(w.index),
                old,
                &mut q[at..at + w.len],
            );
        }
    }
}

/// Reconstruct-write (and a degraded rebuild-write): the span's data, old where not written,
/// new where written, gives the new parity.
fn compute_rcw(u: &mut Unit, data: Srcs, np: usize) {
    let k = u.layout.len() - np;
    let span = u.span_len();
    if matches!(u.plan, Plan::Rebuild) {
        let mut strips: Vec<&mut [u8]> = u
            .span
            .iter_mut()
            .map(|b| &mut b.as_mut().unwrap()[..])
            .collect();
        recover(&mut strips, &u.missing, np);
    }
    u.partials = u.log.iter().map(|&j| partial_rcw(u, j, k)).collect();
    for w in &u.writes {
        if let Some(b) = u.span[w.index].as_mut() {
            let at = (w.at - u.lo) as usize;
            b[at..at + w.len].copy_from_slice(w.data(data));
        }
    }
    let (dpart, ppart) = u.span.split_at_mut(k);
    let mut srcs: Vec<&[u8]> = Vec::with_capacity(k);
    for (i, b) in dpart.iter().enumerate() {
        match b {
            Some(b) => srcs.push(&b[..]),
            None => {
                let w = u.writes.iter().find(|w| w.index == i).unwrap();
                srcs.push(&data[w.src][w.from..w.from + span]);
            }
        }
    }
    gen_parity(&srcs, ppart, np);
}

/// Writes every unit's new data and parity, as one batch (after their partial parity is logged
/// while the pool is degraded). Ok(false): the members out of service changed; plan again.
fn write_phase(a: &Array, units: &[Unit], data: Srcs, planned: &[usize]) -> Result<bool> {
    let k = a.geo.group_data();
    let mut ops: Vec<Op> = Vec::new();
    for u in units {
        for w in &u.writes {
            let m = u.layout[w.index];
            if a.writable(m) {
                ops.push(Op::write(m, a.member_offset(u.row, w.at), w.data(data)));
            }
        }
        let at = a.member_offset(u.row, u.lo);
        for (i, &m) in u.layout.iter().enumerate() {
            // Parity, and a member being rebuilt gets the whole span it now has a value for.
            let rebuilt = matches!(u.plan, Plan::Rebuild) && u.missing.contains(&i);
            if a.writable(m) && (i >= k || rebuilt) {
                ops.push(Op::write(m, at, u.span[i].as_ref().unwrap()));
            }
        }
    }
    if !a.all_online() {
        let (stripes, records) = log_records(a, units, data, planned);
        a.logged_write(planned, &stripes, records, &mut ops)
    } else {
        a.retire_log();
        let Some(ticket) = a.begin_unlogged() else {
            // A member failed since the check above: plan again, with the log.
            return Ok(false);
        };
        a.run_unlogged(&mut ops, Some(ticket));
        Ok(true)
    }
}

/// The units' log entries, per holder member, and the stripes they cover.
type Records = (Vec<(u64, usize)>, Vec<(usize, Vec<LogEntry>)>);

fn log_records(a: &Array, units: &[Unit], data: Srcs, out: &[usize]) -> Records {
    let k = a.geo.group_data();
    let mut stripes = Vec::new();
    let mut records: Vec<(usize, Vec<LogEntry>)> = Vec::new();
    for u in units.iter().filter(|u| !u.log.is_empty()) {
        stripes.push((u.row, u.group));
        // The writes whose member is out of service, numbered: the set's entries take turns
        // holding their data, so each is logged once (recovery applies a set only whole).
        let lost: Vec<usize> = (0..u.writes.len())
            .filter(|&i| out.contains(&u.layout[u.writes[i].index]))
            .collect();
        for (n, (&j, partial)) in u.log.iter().zip(&u.partials).enumerate() {
            let writes = u
                .writes
                .iter()
                .enumerate()
                .map(|(i, w)| LogWrite {
                    index: w.index,
                    at: w.at,
                    len: w.len,
                    data: match lost.iter().position(|&l| l == i) {
                        None => Logged::OnDrive,
                        Some(p) if p % u.log.len() == n => Logged::Here(w.data(data).to_vec()),
                        Some(_) => Logged::InSet,
                    },
                })
                .collect();
            let e = LogEntry {
                row: u.row,
                group: u.group,
                parity: j,
                set: u.log.iter().map(|&j| 1u8 << j).sum(),
                lo: u.lo,
                hi: u.hi,
                writes,
                partial: partial.clone(),
            };
            let holder = u.layout[k + j];
            match records.iter_mut().find(|r| r.0 == holder) {
                Some(r) => r.1.push(e),
                None => records.push((holder, vec![e])),
            }
        }
    }
    (stripes, records)
}
