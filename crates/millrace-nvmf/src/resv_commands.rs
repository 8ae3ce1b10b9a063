//! Reservation commands as a controller runs them, and what they reach beyond the namespace's
//! own state (`reservation`): the notices owed to other hosts' controllers (the reservation
//! notification log and its asynchronous event), the record of state that persists through
//! power loss (through the target's [`ReservationStore`], on a blocking thread, before the
//! command completes), the wait of Preempt and Abort, the features (Host Identifier,
//! Reservation Notification Mask, Reservation Persistence) and the target's own calls
//! (restoring a record, an operator's clear).

use crate::cmd::{io, Sqe, Status};
use crate::model::{Controller, Inner, Ns, Subsystem};
use crate::reservation::wire::{self, Notice};
use crate::reservation::{self, HostId, ReservationState, ReservationStore};
use millrace_io::share::{Held, Share};
use millrace_io::{BufPool, IoBuf};
use std::sync::Arc;

/// The Reservation Log Page Available notice: type 6 (I/O command specific), information 0,
/// log page 80h.
pub(crate) const AEN_RESV_LOG: u32 = 0x06 | (0x80 << 16);

/// RESCAP of every namespace: the six reservation types, and IEKEY as NVMe 1.3 defines it
/// (refused on Acquire and Release); bit 0 (Persist Through Power Loss) is added where the
/// target records reservations.
pub(crate) const RESCAP: u8 = 0xfe;

/// Whether `opcode` is one of the four reservation commands.
pub(crate) fn is_reservation(opcode: u8) -> bool {
    matches!(
        opcode,
        io::RESERVATION_REGISTER
            | io::RESERVATION_REPORT
            | io::RESERVATION_ACQUIRE
            | io::RESERVATION_RELEASE
    )
}

/// Who sends an I/O queue's commands.
pub(crate) struct Host {
    pub id: HostId,
    pub nqn: String,
}

/// How a reservation command ended: a status, or a report for the host.
pub(crate) enum Done {
    Status(Status),
    Data { data: IoBuf, held: Option<Held> },
}

/// What a reservation command reaches.
pub(crate) struct Req<'a> {
    pub subsys: &'a Subsystem,
    pub ns: &'a Ns,
    pub host: &'a Host,
    pub store: Option<&'a ReservationStore>,
    pub pool: &'a BufPool,
    pub share: &'a Share,
}

/// Runs a reservation command with its data (`c2h_len`: the host's buffer for a report).
pub(crate) async fn run(r: Req<'_>, sqe: &Sqe, data: Option<&[u8]>, c2h_len: usize) -> Done {
    // A host that gave no identifier cannot be told from another one.
    if r.host.id == [0; 16] {
        return Done::Status(Status::COMMAND_SEQUENCE_ERROR);
    }
    let done = match sqe.opcode() {
        io::RESERVATION_REPORT => report(&r, sqe, c2h_len).await,
        _ => change(&r, sqe, data)
            .await
            .map(|()| Done::Status(Status::SUCCESS)),
    };
    done.unwrap_or_else(Done::Status)
}

async fn report(r: &Req<'_>, sqe: &Sqe, c2h_len: usize) -> Result<Done, Status> {
    let (bytes, extended) = wire::report_request(sqe);
    // Host identifiers here are 128-bit: only the extended data structure carries them.
    if !extended {
        return Err(Status::HOST_ID_INCONSISTENT_FORMAT);
    }
    if c2h_len == 0 || bytes > c2h_len as u64 {
        return Err(Status::DATA_SGL_LENGTH_INVALID);
    }
    let page = wire::report(&r.ns.resv.snapshot());
    let held = r.share.take(c2h_len).await;
    let mut buf = r.pool.get(c2h_len).await.map_err(|e| {
        tracing::warn!("no buffer for a reservation report of {c2h_len} bytes: {e}");
        Status::INTERNAL_ERROR
    })?;
    let n = page.len().min(bytes as usize);
    buf[..n].copy_from_slice(&page[..n]);
    buf[n..].fill(0);
    Ok(Done::Data {
        data: buf,
        held: Some(held),
    })
}

/// Register, Acquire or Release: applied, recorded where it persists (undone if the record
/// fails), then the notices, then (Preempt and Abort) the wait for commands already admitted.
async fn change(r: &Req<'_>, sqe: &Sqe, data: Option<&[u8]>) -> Result<(), Status> {
    let req = wire::decode(sqe, data)?;
    let _one = r.ns.resv.serial.lock().await;
    let (before, out) = r.ns.resv.update(|st| {
        let before = st.clone();
        let capable = r.store.is_some();
        reservation::apply(st, &r.host.id, &r.host.nqn, &req, capable).map(|o| (before, o))
    })?;
    let after = r.ns.resv.snapshot();
    if let Some(store) = r.store.filter(|_| must_record(&before, &after)) {
        let (store, nqn, nsid) = (store.clone(), r.subsys.nqn.clone(), r.ns.nsid);
        let keep = after.ptpl.then_some(after);
        let j = tokio::task::spawn_blocking(move || store(&nqn, nsid, keep.as_ref())).await;
        let res = j.unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        if let Err(e) = res {
            tracing::error!(subsystem = %r.subsys.nqn, nsid = r.ns.nsid, "cannot record the namespace's reservations, so the command that changed them fails: {e}");
            r.ns.resv.update(|st| *st = before);
            return Err(Status::INTERNAL_ERROR);
        }
    }
    notify(r.subsys, r.ns.nsid, &out.notices);
    if out.drain {
        r.ns.resv.drain().await;
    }
    Ok(())
}

/// A change is recorded while either side of it persists through power loss.
fn must_record(before: &ReservationState, after: &ReservationState) -> bool {
    (before.ptpl || after.ptpl) && before != after
}

/// Records a change now, on this thread (Set Features, the target's own calls).
fn record_now(
    t: &Inner,
    s: &Subsystem,
    nsid: u32,
    before: &ReservationState,
    after: &ReservationState,
) -> std::io::Result<()> {
    match t.resv_store.get() {
        Some(store) if must_record(before, after) => {
            store(&s.nqn, nsid, after.ptpl.then_some(after))
        }
        _ => Ok(()),
    }
}

/// Logs each notice with the controllers of the host it is for, and tells those that are
/// not already told with the Reservation Log Page Available event.
pub(crate) fn notify(s: &Subsystem, nsid: u32, notices: &[(HostId, Notice)]) {
    if notices.is_empty() {
        return;
    }
    let ctrls: Vec<Arc<Controller>> = s.controllers.lock().by_id.values().cloned().collect();
    for (h, kind) in notices {
        for c in ctrls.iter().filter(|c| c.hostid == *h) {
            let tell = c.resv_log.lock().push(*kind, nsid);
            if tell {
                c.event(AEN_RESV_LOG, 0);
            }
        }
    }
}

/// The reservation notification log page (80h) of controller `c`: its oldest notice, taken
/// off the log when read from offset 0.
pub(crate) fn log_page(c: &Controller, take: bool, rae: bool) -> Vec<u8> {
    c.resv_log.lock().page(take, rae)
}

/// Whether hosts may ask for persistence through power loss (RESCAP bit 0): only where the
/// target records it.
pub(crate) fn ptpl_capable(t: &Inner) -> bool {
    t.resv_store.get().is_some()
}

/// The namespace a namespace-specific feature names, or the status refusing it.
fn feature_ns(c: &Controller, nsid: u32) -> Result<Arc<Ns>, Status> {
    match c.subsys.ns(nsid) {
        Some(ns) => Ok(ns),
        None if nsid == u32::MAX => Err(Status::INVALID_FIELD),
        None => Err(Status::INVALID_NAMESPACE),
    }
}

/// Get Features: Host Identifier (81h, the 128-bit one only), Reservation Notification Mask
/// (82h) and Reservation Persistence (83h) of one namespace. Returns DW0 and any data.
pub(crate) fn get_feature(c: &Controller, sqe: &Sqe) -> Result<(u64, Option<Vec<u8>>), Status> {
    match sqe.cdw(10) & 0xff {
        0x81 if sqe.cdw(11) & 1 == 0 => Err(Status::HOST_ID_INCONSISTENT_FORMAT),
        0x81 => Ok((1, Some(c.hostid.to_vec()))),
        0x82 => {
            feature_ns(c, sqe.nsid())?;
            Ok((u64::from(c.resv_log.lock().mask(sqe.nsid())), None))
        }
        0x83 => Ok((
            u64::from(feature_ns(c, sqe.nsid())?.resv.snapshot().ptpl),
            None,
        )),
        _ => Err(Status::INVALID_FIELD),
    }
}

/// Set Features: Reservation Notification Mask (82h, one namespace or all) and Reservation
/// Persistence (83h), which is recorded before it completes.
pub(crate) fn set_feature(t: &Inner, c: &Controller, sqe: &Sqe) -> Result<u64, Status> {
    let v = sqe.cdw(11);
    let nsid = sqe.nsid();
    match sqe.cdw(10) & 0xff {
        0x82 => {
            if v & !wire::MASK_ALL != 0 {
                return Err(Status::INVALID_FIELD);
            }
            let one = match nsid {
                u32::MAX => None,
                n => Some(feature_ns(c, n)?.nsid),
            };
            c.resv_log.lock().set_mask(one, v);
            Ok(0)
        }
        0x83 => {
            let ptpl = v & 1 != 0;
            if ptpl && !ptpl_capable(t) {
                return Err(Status::INVALID_FIELD);
            }
            let all = match nsid {
                u32::MAX => c.subsys.namespaces.load_full().to_vec(),
                n => vec![feature_ns(c, n)?],
            };
            for ns in all {
                set_ptpl(t, &c.subsys, &ns, ptpl)?;
            }
            Ok(0)
        }
        _ => Err(Status::INVALID_FIELD),
    }
}

fn set_ptpl(t: &Inner, s: &Subsystem, ns: &Ns, ptpl: bool) -> Result<(), Status> {
    // A reservation command is being recorded: the host tries again.
    let Ok(_one) = ns.resv.serial.try_lock() else {
        return Err(Status::COMMAND_INTERRUPTED);
    };
    let before = ns.resv.snapshot();
    let after = ns.resv.update(|st| {
        st.ptpl = ptpl;
        st.clone()
    });
    if let Err(e) = record_now(t, s, ns.nsid, &before, &after) {
        tracing::error!(subsystem = %s.nqn, nsid = ns.nsid, "cannot record the namespace's reservations, so Set Features (Reservation Persistence) fails: {e}");
        ns.resv.update(|st| *st = before);
        return Err(Status::INTERNAL_ERROR);
    }
    Ok(())
}

/// Puts a recorded state back on a namespace (the target starting again).
pub(crate) fn restore(ns: &Ns, st: ReservationState) -> Result<(), String> {
    st.check()?;
    ns.resv.update(|s| *s = st);
    Ok(())
}

/// An operator's clear: the reservation and every registration go, the registrants are told
/// their reservation was preempted, and the change is recorded. Waits (at most 10 s) for a
/// reservation command being recorded.
pub(crate) fn clear(t: &Inner, s: &Subsystem, ns: &Ns) -> Result<(), String> {
    let t0 = std::time::Instant::now();
    let _one = loop {
        match ns.resv.serial.try_lock() {
            Ok(g) => break g,
            Err(_) if t0.elapsed() < std::time::Duration::from_secs(10) => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            Err(_) => {
                return Err(format!(
                    "namespace {} of {} is busy with a reservation command; try again",
                    ns.nsid, s.nqn
                ))
            }
        }
    };
    let before = ns.resv.snapshot();
    let after = ns.resv.update(|st| {
        st.registrants.clear();
        st.rtype = None;
        st.holder = None;
        st.generation = st.generation.wrapping_add(1);
        st.clone()
    });
    if let Err(e) = record_now(t, s, ns.nsid, &before, &after) {
        ns.resv.update(|st| *st = before);
        return Err(format!(
            "cannot record the cleared reservations of namespace {} of {}: {e}",
            ns.nsid, s.nqn
        ));
    }
    let notices: Vec<_> = (before.registrants.iter())
        .map(|r| (r.hostid, Notice::ReservationPreempted))
        .collect();
    notify(s, ns.nsid, &notices);
    Ok(())
}
