//! Parity writes on a core's ring (every member online, no log): the requests' pieces planned as
//! in `parity_write`, their reads as one batch of the ring, parity computed when they complete,
//! then data and parity as another batch straight from the requests' buffers.

use millrace_io::{Batch, IoBuf, SharedBuf};

use super::parity_write::{choose, compute, give_buffers, units, Plan, Unit};
use super::ring::{Drives, Sent, SentList};
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
    for u in units.iter_mut() {
        choose(a, u)?;
        if matches!(u.plan, Plan::Rebuild) {
            // A member left service since the request was placed: the blocking engine (and its
            // log) handles degraded writes.
            return Ok(false);
        }
        give_buffers(a, u);
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
    {
        let views: Vec<&[u8]> = reqs
            .iter_mut()
            .map(|r| &r.buf.get_mut().expect("no operation holds the data")[..])
            .collect();
        compute(a, &mut units, &views);
    }
    let k = a.geo.group_data();
    // Parity covers every request's data: durable at once if any of them asked for it.
    let parity_fua = reqs.iter().any(|r| r.fua);
    let mut writes = Vec::new();
    for (ui, u) in units.iter().enumerate() {
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
    });
    ring_batch(a, drives, &mut units, writes, extra, parity_fua).await;
    match a.offline_group() {
        Some(e) => Err(e),
        None => Ok(true),
    }
}

/// The data writes of an unlogged write, and its ticket.
struct Extra {
    batch: Batch,
    sent: SentList,
    ticket: Ticket,
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
    let (mut batch, mut sent, ticket) = match extra {
        Some(e) => (e.batch, e.sent, Some(e.ticket)),
        None => (Batch::with_capacity(ops.len()), SentList::new(), None),
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
            batch.write(fd, off, &b, 0..b.len(), write_fua);
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
    a.account(drives, &sent, results)
}
