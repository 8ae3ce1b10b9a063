use super::wire::{self, AcquireAction, Notice, RegisterAction, ReleaseAction, Request};
use super::*;
use crate::cmd::{io, Sqe, Status};

const A: HostId = [0xa; 16];
const B: HostId = [0xb; 16];
const C: HostId = [0xc; 16];

fn reg(st: &mut ReservationState, h: &HostId, key: u64) -> Result<rules::Outcome, Status> {
    let r = Request::Register {
        action: RegisterAction::Register,
        iekey: false,
        ptpl: None,
        crkey: 0,
        nrkey: key,
    };
    apply(st, h, "nqn.test", &r, true)
}

fn acq(
    st: &mut ReservationState,
    h: &HostId,
    action: AcquireAction,
    t: ReservationType,
    crkey: u64,
    prkey: u64,
) -> Result<rules::Outcome, Status> {
    let r = Request::Acquire {
        action,
        rtype: t,
        crkey,
        prkey,
    };
    apply(st, h, "nqn.test", &r, true)
}

fn rel(
    st: &mut ReservationState,
    h: &HostId,
    action: ReleaseAction,
    rtype: u8,
    crkey: u64,
) -> Result<rules::Outcome, Status> {
    let r = Request::Release {
        action,
        rtype,
        crkey,
    };
    apply(st, h, "nqn.test", &r, true)
}

/// A and B registered (keys 1 and 2), C not; A holds a reservation of type `t`.
fn held(t: ReservationType) -> ReservationState {
    let mut st = ReservationState::default();
    reg(&mut st, &A, 1).unwrap();
    reg(&mut st, &B, 2).unwrap();
    acq(&mut st, &A, AcquireAction::Acquire, t, 1, 0).unwrap();
    st
}

#[test]
fn types_round_trip_their_codes() {
    for (i, t) in ReservationType::ALL.iter().enumerate() {
        assert_eq!(t.code() as usize, i + 1);
        assert_eq!(ReservationType::from_code(t.code()), Some(*t));
    }
    assert_eq!(ReservationType::from_code(0), None);
    assert_eq!(ReservationType::from_code(7), None);
}

#[test]
fn conflicts_follow_the_type_and_the_registration() {
    use Access::{Read, Write};
    use ReservationType::*;
    // (type, registrant may read, registrant may write, other may read, other may write)
    let table = [
        (WriteExclusive, true, false, true, false),
        (ExclusiveAccess, false, false, false, false),
        (WriteExclusiveRegistrantsOnly, true, true, true, false),
        (ExclusiveAccessRegistrantsOnly, true, true, false, false),
        (WriteExclusiveAllRegistrants, true, true, true, false),
        (ExclusiveAccessAllRegistrants, true, true, false, false),
    ];
    for (t, br, bw, cr, cw) in table {
        let st = held(t);
        assert!(!st.conflicts(&A, Read) && !st.conflicts(&A, Write), "{t}");
        assert_eq!(!st.conflicts(&B, Read), br, "{t}: registrant read");
        assert_eq!(!st.conflicts(&B, Write), bw, "{t}: registrant write");
        assert_eq!(!st.conflicts(&C, Read), cr, "{t}: other read");
        assert_eq!(!st.conflicts(&C, Write), cw, "{t}: other write");
        assert!(!st.conflicts(&C, Access::Other));
        assert_eq!(st.holds(&B), t.all_registrants(), "{t}");
        assert_eq!(st.check(), Ok(()));
    }
    assert!(!ReservationState::default().conflicts(&C, Write));
}

#[test]
fn register_unregister_and_replace() {
    let mut st = ReservationState::default();
    reg(&mut st, &A, 5).unwrap();
    // Again with its own key: no change, success; with another: conflict.
    reg(&mut st, &A, 5).unwrap();
    assert_eq!(reg(&mut st, &A, 6), Err(Status::RESERVATION_CONFLICT));
    assert_eq!(st.generation, 2);
    let replace = |crkey, iekey, nrkey| Request::Register {
        action: RegisterAction::Replace,
        iekey,
        ptpl: Some(true),
        crkey,
        nrkey,
    };
    assert_eq!(
        apply(&mut st, &A, "n", &replace(4, false, 9), true),
        Err(Status::RESERVATION_CONFLICT)
    );
    assert!(!st.ptpl, "a refused command changes nothing, PTPL included");
    apply(&mut st, &A, "n", &replace(5, false, 9), true).unwrap();
    assert!(st.ptpl);
    apply(&mut st, &A, "n", &replace(0, true, 10), true).unwrap();
    assert_eq!(st.registrants[0].key, 10);
    // Replace ignoring the key registers a host that has none; without IEKEY it conflicts.
    assert_eq!(
        apply(&mut st, &B, "n", &replace(0, false, 3), true),
        Err(Status::RESERVATION_CONFLICT)
    );
    apply(&mut st, &B, "nqn.b", &replace(0, true, 3), true).unwrap();
    assert_eq!(st.registrants[1].hostnqn, "nqn.b");
    let unreg = |crkey| Request::Register {
        action: RegisterAction::Unregister,
        iekey: false,
        ptpl: None,
        crkey,
        nrkey: 0,
    };
    assert_eq!(
        apply(&mut st, &B, "n", &unreg(4), true),
        Err(Status::RESERVATION_CONFLICT)
    );
    apply(&mut st, &B, "n", &unreg(3), true).unwrap();
    assert_eq!(
        apply(&mut st, &C, "n", &unreg(0), true),
        Err(Status::RESERVATION_CONFLICT)
    );
    assert_eq!(st.registrants.len(), 1);
    // Persistence where the target cannot record it is an invalid field.
    let mut st = ReservationState::default();
    let r = Request::Register {
        action: RegisterAction::Register,
        iekey: false,
        ptpl: Some(true),
        crkey: 0,
        nrkey: 1,
    };
    assert_eq!(
        apply(&mut st, &A, "n", &r, false),
        Err(Status::INVALID_FIELD)
    );
    assert!(st.registrants.is_empty());
}

#[test]
fn acquire_needs_the_key_and_a_free_namespace() {
    use ReservationType::*;
    let mut st = ReservationState::default();
    reg(&mut st, &A, 1).unwrap();
    reg(&mut st, &B, 2).unwrap();
    let acquire = AcquireAction::Acquire;
    assert_eq!(
        acq(&mut st, &A, acquire, WriteExclusive, 2, 0),
        Err(Status::RESERVATION_CONFLICT)
    );
    assert_eq!(
        acq(&mut st, &C, acquire, WriteExclusive, 0, 0),
        Err(Status::RESERVATION_CONFLICT)
    );
    acq(&mut st, &A, acquire, WriteExclusive, 1, 0).unwrap();
    acq(&mut st, &A, acquire, WriteExclusive, 1, 0).unwrap();
    assert_eq!(
        acq(&mut st, &A, acquire, ExclusiveAccess, 1, 0),
        Err(Status::RESERVATION_CONFLICT)
    );
    assert_eq!(
        acq(&mut st, &B, acquire, WriteExclusive, 2, 0),
        Err(Status::RESERVATION_CONFLICT)
    );
    assert_eq!(st.holder, Some(A));
    // Acquire and release do not count in the generation.
    assert_eq!(st.generation, 2);
}

#[test]
fn release_and_clear() {
    use ReservationType::*;
    let mut st = held(WriteExclusive);
    // Not the holder: nothing released, success. The wrong type: invalid field.
    assert_eq!(
        rel(&mut st, &B, ReleaseAction::Release, 1, 2),
        Ok(Default::default())
    );
    assert_eq!(
        rel(&mut st, &A, ReleaseAction::Release, 2, 1),
        Err(Status::INVALID_FIELD)
    );
    let out = rel(&mut st, &A, ReleaseAction::Release, 1, 1).unwrap();
    assert!(out.notices.is_empty(), "releasing WE tells no one");
    assert_eq!((st.rtype, st.holder), (None, None));
    // A registrants-only reservation's release tells the other registrants.
    let mut st = held(WriteExclusiveRegistrantsOnly);
    let out = rel(&mut st, &A, ReleaseAction::Release, 3, 1).unwrap();
    assert_eq!(out.notices, vec![(B, Notice::ReservationReleased)]);
    // Any registrant releases an all-registrants reservation.
    let mut st = held(ExclusiveAccessAllRegistrants);
    rel(&mut st, &B, ReleaseAction::Release, 6, 2).unwrap();
    assert_eq!(st.rtype, None);
    // Clear: everything goes, the others are told they were preempted.
    let mut st = held(ExclusiveAccess);
    assert_eq!(
        rel(&mut st, &B, ReleaseAction::Clear, 0, 9),
        Err(Status::RESERVATION_CONFLICT)
    );
    let out = rel(&mut st, &B, ReleaseAction::Clear, 0, 2).unwrap();
    assert_eq!(out.notices, vec![(A, Notice::ReservationPreempted)]);
    assert_eq!(st.registrants.len(), 0);
    assert_eq!(st.rtype, None);
    assert_eq!(st.generation, 3);
}

#[test]
fn unregistering_the_holder_ends_its_reservation() {
    use ReservationType::*;
    let unreg = Request::Register {
        action: RegisterAction::Unregister,
        iekey: false,
        ptpl: None,
        crkey: 1,
        nrkey: 0,
    };
    let mut st = held(ExclusiveAccessRegistrantsOnly);
    let out = apply(&mut st, &A, "n", &unreg, true).unwrap();
    assert_eq!(st.rtype, None);
    assert_eq!(out.notices, vec![(B, Notice::ReservationReleased)]);
    let mut st = held(WriteExclusiveAllRegistrants);
    apply(&mut st, &A, "n", &unreg, true).unwrap();
    assert_eq!(
        st.rtype,
        Some(WriteExclusiveAllRegistrants),
        "B still holds it"
    );
    assert!(st.holds(&B));
    let unreg_b = Request::Register {
        action: RegisterAction::Unregister,
        iekey: false,
        ptpl: None,
        crkey: 2,
        nrkey: 0,
    };
    apply(&mut st, &B, "n", &unreg_b, true).unwrap();
    assert_eq!(st.rtype, None, "no registrant, no reservation");
    assert_eq!(st.check(), Ok(()));
}

#[test]
fn preempt_takes_the_reservation_and_the_registrations() {
    use ReservationType::*;
    let pre = AcquireAction::Preempt;
    // B takes A's write-exclusive reservation as exclusive access: A's registration goes.
    let mut st = held(WriteExclusive);
    reg(&mut st, &C, 3).unwrap();
    let out = acq(&mut st, &B, pre, ExclusiveAccess, 2, 1).unwrap();
    assert_eq!(st.holder, Some(B));
    assert_eq!(st.rtype, Some(ExclusiveAccess));
    assert!(st.find(&A).is_none());
    assert!(out.notices.contains(&(A, Notice::RegistrationPreempted)));
    assert!(out.notices.contains(&(C, Notice::ReservationReleased)));
    assert!(!out.drain);
    // A key that is not the holder's removes those registrations only; none is a conflict.
    let mut st = held(WriteExclusive);
    reg(&mut st, &C, 3).unwrap();
    let out = acq(&mut st, &B, pre, WriteExclusive, 2, 3).unwrap();
    assert_eq!(out.notices, vec![(C, Notice::RegistrationPreempted)]);
    assert_eq!(st.holder, Some(A));
    assert_eq!(
        acq(&mut st, &B, pre, WriteExclusive, 2, 77),
        Err(Status::RESERVATION_CONFLICT)
    );
    // Key zero against a single holder is an invalid field.
    assert_eq!(
        acq(&mut st, &B, pre, WriteExclusive, 2, 0),
        Err(Status::INVALID_FIELD)
    );
    // Against all-registrants, key zero takes it over and removes every other registrant.
    let mut st = held(ExclusiveAccessAllRegistrants);
    reg(&mut st, &C, 3).unwrap();
    let abort = AcquireAction::PreemptAndAbort;
    let out = acq(&mut st, &C, abort, WriteExclusive, 3, 0).unwrap();
    assert!(out.drain);
    assert_eq!(st.registrants.len(), 1);
    assert_eq!((st.rtype, st.holder), (Some(WriteExclusive), Some(C)));
    assert_eq!(out.notices.len(), 2);
    // Without a reservation, registrations with the key go.
    let mut st = ReservationState::default();
    reg(&mut st, &A, 1).unwrap();
    reg(&mut st, &B, 2).unwrap();
    acq(&mut st, &A, pre, WriteExclusive, 1, 2).unwrap();
    assert_eq!(st.registrants.len(), 1);
    assert_eq!(st.rtype, None);
    // The holder preempting itself changes the type.
    let mut st = held(WriteExclusive);
    acq(&mut st, &A, pre, ExclusiveAccess, 1, 1).unwrap();
    assert_eq!((st.rtype, st.holder), (Some(ExclusiveAccess), Some(A)));
    assert_eq!(st.registrants.len(), 2);
}

fn sqe(op: u8, c10: u32) -> Sqe {
    let mut s = Sqe::new(op, 1, 1);
    s.set_cdw(10, c10);
    s
}

#[test]
fn malformed_commands_are_refused() {
    let d16 = [0u8; 16];
    let bad = |op, c10, d: &[u8]| wire::decode(&sqe(op, c10), Some(d)).unwrap_err();
    let f = Status::INVALID_FIELD;
    assert_eq!(bad(io::RESERVATION_REGISTER, 3, &d16), f);
    assert_eq!(bad(io::RESERVATION_REGISTER, 7, &d16), f);
    assert_eq!(bad(io::RESERVATION_REGISTER, 1 << 30, &d16), f, "CPTPL 01b");
    assert_eq!(bad(io::RESERVATION_ACQUIRE, 3 | 1 << 8, &d16), f);
    assert_eq!(bad(io::RESERVATION_ACQUIRE, 0, &d16), f, "RTYPE 0");
    assert_eq!(bad(io::RESERVATION_ACQUIRE, 7 << 8, &d16), f, "RTYPE 7");
    assert_eq!(
        bad(io::RESERVATION_ACQUIRE, 1 << 8 | 1 << 3, &d16),
        f,
        "IEKEY"
    );
    assert_eq!(bad(io::RESERVATION_RELEASE, 2 | 1 << 8, &d16), f);
    assert_eq!(
        bad(io::RESERVATION_RELEASE, 0xff << 8, &d16),
        f,
        "RTYPE FFh"
    );
    assert_eq!(
        bad(io::RESERVATION_RELEASE, 1 << 8 | 1 << 3, &d16),
        f,
        "IEKEY"
    );
    let short = Status::DATA_SGL_LENGTH_INVALID;
    assert_eq!(bad(io::RESERVATION_REGISTER, 0, &[0; 15]), short);
    assert_eq!(bad(io::RESERVATION_ACQUIRE, 1 << 8, &[0; 8]), short);
    assert_eq!(bad(io::RESERVATION_RELEASE, 1 << 8, &[0; 7]), short);
    assert_eq!(
        wire::decode(&sqe(io::RESERVATION_REGISTER, 0), None),
        Err(short)
    );
    // Clear takes any type; longer data is fine.
    let mut d = vec![0u8; 32];
    d[..8].copy_from_slice(&7u64.to_le_bytes());
    assert_eq!(
        wire::decode(&sqe(io::RESERVATION_RELEASE, 1 | 9 << 8), Some(&d)),
        Ok(Request::Release {
            action: ReleaseAction::Clear,
            rtype: 9,
            crkey: 7
        })
    );
}

#[test]
fn report_layout() {
    let mut st = held(ReservationType::WriteExclusive);
    st.ptpl = true;
    let b = wire::report(&st);
    assert_eq!(b.len(), 64 + 128);
    assert_eq!(u32::from_le_bytes(b[0..4].try_into().unwrap()), 2);
    assert_eq!((b[4], b[5], b[6], b[9]), (1, 2, 0, 1));
    let e = &b[64..128];
    assert_eq!(&e[0..2], &[0xff, 0xff]);
    assert_eq!(e[2], 1);
    assert_eq!(u64::from_le_bytes(e[8..16].try_into().unwrap()), 1);
    assert_eq!(&e[16..32], &A);
    assert_eq!(b[128 + 2], 0, "B does not hold it");
}

#[test]
fn notice_log_queues_masks_and_tells_once() {
    let mut l = NoticeLog::default();
    assert_eq!(l.page(true, false), vec![0u8; 64], "empty");
    assert!(l.push(Notice::ReservationReleased, 1));
    assert!(!l.push(Notice::RegistrationPreempted, 2), "told once");
    let p = l.page(false, false);
    assert_eq!((p[0], p[8], p[9], p[12]), (1, 2, 1, 1), "a peek keeps it");
    let p = l.page(true, true);
    assert_eq!((p[0], p[8], p[9], p[12]), (1, 2, 1, 1));
    assert!(
        !l.push(Notice::ReservationPreempted, 1),
        "RAE kept it outstanding"
    );
    let p = l.page(true, false);
    assert_eq!((p[0], p[8], p[9], p[12]), (2, 1, 1, 2));
    assert!(
        l.push(Notice::ReservationPreempted, 1),
        "read without RAE: told again"
    );
    l.set_mask(Some(1), 1 << 3);
    assert!(!l.push(Notice::ReservationPreempted, 1));
    assert_eq!(l.mask(1), 8);
    assert_eq!(l.mask(2), 0);
    l.set_mask(None, wire::MASK_ALL);
    assert_eq!(l.mask(1), wire::MASK_ALL);
    // Past the log's size the newest are lost; their numbers are skipped.
    let mut l = NoticeLog::default();
    for _ in 0..100 {
        l.push(Notice::RegistrationPreempted, 1);
    }
    let mut last = 0;
    for _ in 0..64 {
        last = u64::from_le_bytes(l.page(true, false)[0..8].try_into().unwrap());
    }
    assert_eq!(last, 64);
    l.push(Notice::RegistrationPreempted, 1);
    assert_eq!(l.page(true, false)[0], 101);
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn request() -> impl Strategy<Value = (u8, Request)> {
        let host = 0u8..3;
        let key = 0u64..3;
        let reg = (0u8..3, any::<bool>(), 0u8..3, key.clone(), key.clone()).prop_map(
            |(a, iekey, p, crkey, nrkey)| Request::Register {
                action: [
                    RegisterAction::Register,
                    RegisterAction::Unregister,
                    RegisterAction::Replace,
                ][a as usize],
                iekey,
                ptpl: [None, Some(false), Some(true)][p as usize],
                crkey,
                nrkey,
            },
        );
        let acq = (0u8..3, 1u8..7, key.clone(), key.clone()).prop_map(|(a, t, crkey, prkey)| {
            Request::Acquire {
                action: [
                    AcquireAction::Acquire,
                    AcquireAction::Preempt,
                    AcquireAction::PreemptAndAbort,
                ][a as usize],
                rtype: ReservationType::from_code(t).unwrap(),
                crkey,
                prkey,
            }
        });
        let rel = (any::<bool>(), 0u8..8, key).prop_map(|(clear, rtype, crkey)| Request::Release {
            action: match clear {
                true => ReleaseAction::Clear,
                false => ReleaseAction::Release,
            },
            rtype,
            crkey,
        });
        (host, prop_oneof![reg, acq, rel])
    }

    proptest! {
        /// Whatever three hosts send, the state holds together, a refused command changes
        /// nothing, and notices go only to other hosts that were registered.
        #[test]
        fn any_sequence_keeps_the_state_whole(reqs in proptest::collection::vec(request(), 1..40)) {
            let mut st = ReservationState::default();
            for (h, r) in reqs {
                let me = [h; 16];
                let before = st.clone();
                match apply(&mut st, &me, "n", &r, true) {
                    Ok(out) => {
                        for (to, _) in &out.notices {
                            prop_assert!(*to != me);
                            prop_assert!(before.find(to).is_some());
                        }
                    }
                    Err(_) => prop_assert_eq!(&st, &before),
                }
                prop_assert_eq!(st.check(), Ok(()));
            }
        }
    }
}
