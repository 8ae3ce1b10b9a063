//! Parity writes on a core's ring (every member online, no log): the requests' pieces planned as
//! in `parity_write`, their reads as one batch of the ring, parity computed when they complete,
//! then data and parity as another batch straight from the requests' buffers.

use millrace_io::mapped::Place;
use millrace_io::{Batch, IoBuf, SharedBuf};

use super::parity_write::{choose, compute, give_buffers, units, Plan, Unit};
use super::ring::{Done, Drives, Sent, SentList};
use super::unlogged::Ticket;
use super::{Array, Pieces, Result};

/// Where a buffer lent to the ring comes back to: a unit's span or old-data slot.
enum Slot {
    Span(usize, usize),
    Old(usize, usize),
}

impl Slot {
    fn of<'u>(&self, units: &'u mut [Unit]) -> &'u mut Option<IoBuf> {
        match *self {
            Slot::Span(u, i) => &mut units[u].span[i],
            Slot::Old(u, j) => &mut units[u].old[j],
        }
    }
}

/// The member reads of a unit's plan: (member, member offset, slot).
fn planned_reads(a: &Array, ui: usize, u: &Unit) -> Vec<(usize, u64, Slot)> {
    let k = a.geo.group_data();
    let at = a.member_offset(u.row, u.lo);
    let mut v = Vec::new();
    match u.plan {
        Plan::Full => {}
        Plan::Rmw => {
            for (j, w) in u.writes.iter().enumerate() {
                let off = a.member_offset(u.row, w.at);
                v.push((u.layout[w.index], off, Slot::Old(ui, j)));
            }
            for i in k..u.layout.len() {
                v.push((u.layout[i], at, Slot::Span(ui, i)));
            }
        }
        Plan::Rcw => {
            for i in (0..k).filter(|&i| u.span[i].is_some()) {
                v.push((u.layout[i], at, Slot::Span(ui, i)));
            }
        }
        Plan::Rebuild => {
            for i in (0..u.layout.len()).filter(|i| !u.missing.contains(i)) {
                v.push((u.layout[i], at, Slot::Span(ui, i)));
            }
        }
    }
    v
}

/// One request of a parity write on the ring: its place, its data and whether it is FUA.
pub(super) struct RingWrite {
    pub offset: u64,
    /// Only this handle exists outside the batches of `write_on_ring`.
    pub buf: SharedBuf,
    pub fua: bool,
}

/// A parity write of one or more requests (writes in flight to one stripe, merged, see
/// `merge`) on this core's ring: one plan over all their pieces, its reads as one batch, parity
/// computed when they complete, then data and parity as one batch, straight from the requests'
/// buffers. The requests never overlap. Only for a pool with every member online (no log).
/// Ok(false): a member failed; plan again.
pub(super) async fn write_on_ring(
    a: &Array,
    drives: &Drives,
    reqs: &mut [RingWrite],
) -> Result<bool> {
    let pieces: Vec<Pieces> = reqs
        .iter()
        .map(|r| a.pieces(r.offset, r.buf.len()))
        .collect();
    let tagged = pieces
        .iter()
        .enumerate()
        .flat_map(|(i, ps)| ps.iter().map(move |p| (i, p)));
    let mut units = units(a, tagged);
    let mut places = Vec::with_capacity(units.len());
    for u in units.iter_mut() {
        choose(a, u)?;
        if matches!(u.plan, Plan::Rebuild) {
            // A member left service since the request was placed: the blocking engine (and its
            // log) handles degraded writes.
            return Ok(false);
        }
        let placed = unit_places(a, drives, u);
        if placed.is_none() {
            give_buffers(a, u);
        }
        places.push(placed);
    }
    let reads: Vec<(usize, u64, Slot)> = units
        .iter()
        .enumerate()
        .flat_map(|(ui, u)| planned_reads(a, ui, u))
        .collect();
    if !ring_batch(a, drives, &mut units, reads, None, false).await {
        return Ok(false);
    }
    a.retire_log();
    let Some(ticket) = a.begin_unlogged() else {
        // A member failed since planning: the blocking engine writes with the log.
        return Ok(false);
    };
    let placed = {
        let views: Vec<&[u8]> = reqs
            .iter_mut()
            .map(|r| &r.buf.get_mut().expect("no operation holds the data")[..])
            .collect();
        compute(a, &mut units, &views);
        // Into the members, now that the write holds its ticket (`unlogged`).
        write_in_place(a, &units, places, &views)
    };
    let k = a.geo.group_data();
    // Parity covers every request's data: durable at once if any of them asked for it.
    let parity_fua = reqs.iter().any(|r| r.fua);
    let mut writes = Vec::new();
    for (ui, u) in units.iter().enumerate().filter(|(_, u)| !u.in_place) {
        let at = a.member_offset(u.row, u.lo);
        for i in k..u.layout.len() {
            writes.push((u.layout[i], at, Slot::Span(ui, i)));
        }
    }
    let n: usize = pieces.iter().map(|p| p.len()).sum();
    let mut extra = Batch::with_capacity(n + writes.len());
    let mut sent = SentList::with_capacity(n + writes.len());
    for u in &units {
        for w in &u.writes {
            let m = u.layout[w.index];
            let off = a.member_offset(u.row, w.at);
            let range = w.from..w.from + w.len;
            let r = &reqs[w.src];
            extra.write(a.ring_fd(drives, m), off, &r.buf, range, r.fua);
            sent.push(Sent {
                member: m,
                len: w.len,
                write: true,
            });
        }
    }
    // A member whose write fails leaves service; the write stands while the pool survives.
    let extra = Some(Extra {
        batch: extra,
        sent,
        ticket,
        placed,
    });
    ring_batch(a, drives, &mut units, writes, extra, parity_fua).await;
    match a.offline_group() {
        Some(e) => Err(e),
        None => Ok(true),
    }
}

/// The parity members' pages of a full-stripe unit, where parity can be computed straight into
/// them (`Array::parity_places`); then the unit is marked `in_place`, and needs no buffers.
/// None: its parity goes from buffers.
fn unit_places(a: &Array, drives: &Drives, u: &mut Unit) -> Option<Vec<Place>> {
    if !matches!(u.plan, Plan::Full) {
        return None;
    }
    let k = a.geo.group_data();
    let places = a.parity_places(drives, u.row, &u.layout[k..])?;
    u.in_place = true;
    Some(places)
}

/// Computes the parity of each `in_place` unit into its members' pages (`unit_places`): the
/// operations done, with their results, for the batch's accounts.
fn write_in_place(
    a: &Array,
    units: &[Unit],
    places: Vec<Option<Vec<Place>>>,
    data: &[&[u8]],
) -> Done {
    let np = a.geo.level.parity();
    let k = a.geo.group_data();
    let mut done = Done::default();
    for (u, ps) in units.iter().zip(places) {
        if let Some(ps) = ps {
            gen_in_place(&u.full_data(data, np), ps, &u.layout[k..], &mut done);
        }
    }
    done
}

/// P (and Q) of one group's data strips `srcs` into its parity `members`' pages `places`
/// (`Array::parity_places`), streamed past the caches; each write's result goes to `done`.
pub(super) fn gen_in_place(
    srcs: &[&[u8]],
    mut places: Vec<Place>,
    members: &[usize],
    done: &mut Done,
) {
    match &mut places[..] {
        [p, q] => millrace_parity::gen_pq_streamed(srcs, p.bytes(), q.bytes()),
        [p] => millrace_parity::gen_p_streamed(srcs, p.bytes()),
        _ => unreachable!("a parity level has one or two parities"),
    }
    for (place, &member) in places.into_iter().zip(members) {
        done.sent.push(Sent {
            member,
            len: place.len(),
            write: true,
        });
        done.results.push(place.finish());
    }
}

impl Array {
    /// The pages of the strips of `row` on the parity `members`, to compute parity straight
    /// into: a pool with a write-intent bitmap (parity torn by a kill is resynced, as for
    /// `parity_write`) on member files in memory. None: parity goes from a buffer.
    pub(super) fn parity_places(
        &self,
        drives: &Drives,
        row: u64,
        members: &[usize],
    ) -> Option<Vec<Place>> {
        self.bitmap.as_ref()?;
        let at = self.member_offset(row, 0);
        let len = self.geo.strip as usize;
        members
            .iter()
            .map(|&m| millrace_io::place_repaired(self.ring_fd(drives, m), at, len))
            .collect()
    }
}

/// The data writes of an unlogged write, its ticket, and its parity written in place.
struct Extra {
    batch: Batch,
    sent: SentList,
    ticket: Ticket,
    placed: Done,
}

/// Runs member operations on the slots' buffers (reads, or writes with `fua`) together with
/// `extra` (the data writes of an unlogged write, and its ticket), as one batch; the buffers go back to their slots. Returns whether all succeeded.
async fn ring_batch(
    a: &Array,
    drives: &Drives,
    units: &mut [Unit],
    ops: Vec<(usize, u64, Slot)>,
    extra: Option<Extra>,
    write_fua: bool,
) -> bool {
    let write = extra.is_some();
    let (mut batch, mut sent, ticket, placed) = match extra {
        Some(e) => (e.batch, e.sent, Some(e.ticket), e.placed),
        None => (
            Batch::with_capacity(ops.len()),
            SentList::new(),
            None,
            Done::default(),
        ),
    };
    let mut lent = Vec::with_capacity(ops.len());
    for (m, off, slot) in ops {
        let b = SharedBuf::new(
            slot.of(units)
                .take()
                .expect("the plan gave the slot a buffer"),
        );
        let fd = a.ring_fd(drives, m);
        if write {
            a.parity_write(&mut batch, fd, off, &b, 0..b.len(), write_fua);
        } else {
            batch.read(fd, off, &b, 0..b.len());
        }
        sent.push(Sent {
            member: m,
            len: b.len(),
            write,
        });
        lent.push((slot, b));
    }
    let results = batch.run().await;
    // Given back before a failure among the results is recorded (it waits for every ticket).
    drop(ticket);
    for (slot, b) in lent {
        *slot.of(units) = Some(
            b.try_unwrap()
                .expect("every member operation has completed"),
        );
    }
    let placed_ok = a.account(drives, &placed.sent, placed.results);
    a.account(drives, &sent, results) && placed_ok
}
