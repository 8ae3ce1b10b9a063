//! What each reservation command does to a namespace's state (NVMe Base, "Reservations"),
//! and the notices it owes other hosts. A command either changes the state and succeeds, or
//! leaves it as it was and returns the status that refuses it.

use super::wire::{AcquireAction, Notice, RegisterAction, ReleaseAction, Request};
use super::{HostId, Registrant, ReservationState, ReservationType, MAX_REGISTRANTS};
use crate::cmd::Status;

/// What a command that succeeded did besides changing the state.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Notices for the controllers of each host named.
    pub notices: Vec<(HostId, Notice)>,
    /// Preempt and Abort: commands already admitted must end before the command completes.
    pub drain: bool,
}

/// Applies `req` from host `me` (its NQN `nqn`) to `st`, which is left as it was when the
/// command is refused. `ptpl_capable`: whether persistence through power loss can be asked for.
pub(crate) fn apply(
    st: &mut ReservationState,
    me: &HostId,
    nqn: &str,
    req: &Request,
    ptpl_capable: bool,
) -> Result<Outcome, Status> {
    let mut next = st.clone();
    let out = match *req {
        Request::Register {
            action,
            iekey,
            ptpl,
            crkey,
            nrkey,
        } => {
            if ptpl == Some(true) && !ptpl_capable {
                return Err(Status::INVALID_FIELD);
            }
            let out = register(&mut next, me, nqn, action, iekey, crkey, nrkey)?;
            if let Some(p) = ptpl {
                next.ptpl = p;
            }
            next.generation = next.generation.wrapping_add(1);
            out
        }
        Request::Acquire {
            action,
            rtype,
            crkey,
            prkey,
        } => {
            registrant(&next, me, crkey)?;
            match action {
                AcquireAction::Acquire => acquire(&mut next, me, rtype)?,
                AcquireAction::Preempt | AcquireAction::PreemptAndAbort => {
                    let mut out = preempt(&mut next, me, rtype, prkey)?;
                    out.drain = action == AcquireAction::PreemptAndAbort;
                    next.generation = next.generation.wrapping_add(1);
                    out
                }
            }
        }
        Request::Release {
            action,
            rtype,
            crkey,
        } => {
            registrant(&next, me, crkey)?;
            match action {
                ReleaseAction::Release => release(&mut next, me, rtype)?,
                ReleaseAction::Clear => {
                    let out = others(&next, me, Notice::ReservationPreempted);
                    next.registrants.clear();
                    next.rtype = None;
                    next.holder = None;
                    next.generation = next.generation.wrapping_add(1);
                    Outcome {
                        notices: out,
                        drain: false,
                    }
                }
            }
        }
    };
    *st = next;
    Ok(out)
}

/// Host `me` is registered with key `crkey`, or the command conflicts.
fn registrant(st: &ReservationState, me: &HostId, crkey: u64) -> Result<(), Status> {
    match st.find(me) {
        Some(i) if st.registrants[i].key == crkey => Ok(()),
        _ => Err(Status::RESERVATION_CONFLICT),
    }
}

/// Notices of `kind` for every registrant but `me`.
fn others(st: &ReservationState, me: &HostId, kind: Notice) -> Vec<(HostId, Notice)> {
    (st.registrants.iter())
        .filter(|r| r.hostid != *me)
        .map(|r| (r.hostid, kind))
        .collect()
}

fn register(
    st: &mut ReservationState,
    me: &HostId,
    nqn: &str,
    action: RegisterAction,
    iekey: bool,
    crkey: u64,
    nrkey: u64,
) -> Result<Outcome, Status> {
    let at = st.find(me);
    let key_ok = |i: usize| iekey || st.registrants[i].key == crkey;
    match (action, at) {
        // Registering again with the key it has is no change, and succeeds.
        (RegisterAction::Register, Some(i)) if st.registrants[i].key == nrkey => {}
        (RegisterAction::Register, Some(_)) => return Err(Status::RESERVATION_CONFLICT),
        (RegisterAction::Register, None) => add(st, me, nqn, nrkey)?,
        (RegisterAction::Unregister, Some(i)) if key_ok(i) => {
            return Ok(Outcome {
                notices: unregister(st, i),
                drain: false,
            })
        }
        (RegisterAction::Replace, Some(i)) if key_ok(i) => st.registrants[i].key = nrkey,
        // Replace ignoring the existing key registers a host that has none (as SCSI's
        // REGISTER AND IGNORE EXISTING KEY does, which hosts translate to it).
        (RegisterAction::Replace, None) if iekey => add(st, me, nqn, nrkey)?,
        _ => return Err(Status::RESERVATION_CONFLICT),
    }
    Ok(Outcome::default())
}

fn add(st: &mut ReservationState, me: &HostId, nqn: &str, key: u64) -> Result<(), Status> {
    if st.registrants.len() >= MAX_REGISTRANTS {
        return Err(Status::INTERNAL_ERROR.dnr());
    }
    st.registrants.push(Registrant {
        hostid: *me,
        key,
        hostnqn: nqn.to_string(),
    });
    Ok(())
}

/// Removes registrant `i`; a reservation it alone held goes with it (one of the registrants-only
/// types: the others are told it was released). An all-registrants reservation stays while
/// any registrant does.
fn unregister(st: &mut ReservationState, i: usize) -> Vec<(HostId, Notice)> {
    let gone = st.registrants.remove(i).hostid;
    let mut notices = Vec::new();
    match st.rtype {
        Some(t) if t.all_registrants() && st.registrants.is_empty() => st.rtype = None,
        Some(t) if !t.all_registrants() && st.holder == Some(gone) => {
            st.rtype = None;
            st.holder = None;
            if matches!(
                t,
                ReservationType::WriteExclusiveRegistrantsOnly
                    | ReservationType::ExclusiveAccessRegistrantsOnly
            ) {
                notices = others(st, &gone, Notice::ReservationReleased);
            }
        }
        _ => {}
    }
    notices
}

fn hold(st: &mut ReservationState, me: &HostId, t: ReservationType) {
    st.rtype = Some(t);
    st.holder = (!t.all_registrants()).then_some(*me);
}

fn acquire(st: &mut ReservationState, me: &HostId, t: ReservationType) -> Result<Outcome, Status> {
    match st.rtype {
        None => hold(st, me, t),
        Some(held) if held == t && st.holds(me) => {}
        Some(_) => return Err(Status::RESERVATION_CONFLICT),
    }
    Ok(Outcome::default())
}

/// Unregisters every host but `me` registered with `key`; conflicts when there is none.
fn preempt_key(
    st: &mut ReservationState,
    me: &HostId,
    key: u64,
) -> Result<Vec<(HostId, Notice)>, Status> {
    let mut notices = Vec::new();
    while let Some(i) = (st.registrants.iter()).position(|r| r.key == key && r.hostid != *me) {
        let h = st.registrants[i].hostid;
        notices.extend(unregister(st, i));
        notices.push((h, Notice::RegistrationPreempted));
    }
    match notices.is_empty() {
        true => Err(Status::RESERVATION_CONFLICT),
        false => Ok(notices),
    }
}

fn preempt(
    st: &mut ReservationState,
    me: &HostId,
    t: ReservationType,
    prkey: u64,
) -> Result<Outcome, Status> {
    let notices = match st.rtype {
        // No reservation: the registrations with that key go.
        None => preempt_key(st, me, prkey)?,
        // An all-registrants reservation: key zero takes it over and removes everyone else.
        Some(held) if held.all_registrants() && prkey == 0 => {
            hold(st, me, t);
            let notices = others(st, me, Notice::RegistrationPreempted);
            st.registrants.retain(|r| r.hostid == *me);
            notices
        }
        Some(held) if held.all_registrants() => preempt_key(st, me, prkey)?,
        Some(held) => {
            let holder_key = (st.holder.as_ref())
                .and_then(|h| st.find(h))
                .map(|i| st.registrants[i].key);
            if holder_key == Some(prkey) {
                // Taking the reservation from its holder (or changing its own type).
                hold(st, me, t);
                let mut notices = preempt_key(st, me, prkey).unwrap_or_default();
                if held != t {
                    notices.extend(others(st, me, Notice::ReservationReleased));
                }
                notices
            } else if prkey != 0 {
                preempt_key(st, me, prkey)?
            } else {
                return Err(Status::INVALID_FIELD);
            }
        }
    };
    Ok(Outcome {
        notices,
        drain: false,
    })
}

fn release(st: &mut ReservationState, me: &HostId, rtype: u8) -> Result<Outcome, Status> {
    let Some(held) = st.rtype else {
        return Ok(Outcome::default());
    };
    if !st.holds(me) {
        // A registrant that holds nothing releases nothing, successfully.
        return Ok(Outcome::default());
    }
    if held.code() != rtype {
        return Err(Status::INVALID_FIELD);
    }
    st.rtype = None;
    st.holder = None;
    let notices = match held {
        ReservationType::WriteExclusive | ReservationType::ExclusiveAccess => Vec::new(),
        _ => others(st, me, Notice::ReservationReleased),
    };
    Ok(Outcome {
        notices,
        drain: false,
    })
}
