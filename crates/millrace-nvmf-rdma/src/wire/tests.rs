use super::*;
use millrace_nvmf::cmd::{fctype, io, Sgl};
use proptest::prelude::*;

const LIMITS: QueueLimits = QueueLimits {
    admin_depth: 32,
    io_depth: 128,
    max_qid: 64,
};

fn req(qid: u16, hrqsize: u16, hsqsize: u16) -> CmRequest {
    CmRequest {
        qid,
        hrqsize,
        hsqsize,
        cntlid: 0xffff,
    }
}

#[test]
fn the_linux_hosts_admin_and_io_requests_are_accepted() {
    // nvme-rdma asks for an admin queue of 32 (HRQSIZE 32, HSQSIZE 31) and I/O queues of
    // its queue size (128 by default).
    let a = CmRequest::decode(&req(0, 32, 31).encode()).unwrap();
    assert_eq!(
        negotiate(&a, &LIMITS),
        Ok(QueueSizes {
            qid: 0,
            recv: 32,
            send: 32
        })
    );
    let io = negotiate(&req(3, 128, 127), &LIMITS).unwrap();
    assert_eq!((io.qid, io.recv, io.send), (3, 128, 128));
    let acc = accept_data(io.recv);
    assert_eq!(&acc[..4], &[0, 0, 128, 0]);
    assert!(acc[4..].iter().all(|&b| b == 0));
}

#[test]
fn oversized_queues_and_ids_are_rejected_with_their_reason() {
    let n = |r| negotiate(&r, &LIMITS);
    assert_eq!(n(req(0, 33, 32)), Err(RejectReason::InvalidHsqsize));
    assert_eq!(n(req(1, 129, 128)), Err(RejectReason::InvalidHsqsize));
    assert_eq!(n(req(1, 1, 0)), Err(RejectReason::InvalidHsqsize));
    assert_eq!(n(req(65, 32, 31)), Err(RejectReason::InvalidQid));
    assert_eq!(n(req(1, 16, 31)), Err(RejectReason::InvalidHrqsize));
}

#[test]
fn private_data_must_be_long_enough_and_format_zero() {
    let mut pd = req(0, 32, 31).encode().to_vec();
    // The transport pads the host's 32 bytes to 56 on RoCE: still fine.
    pd.resize(56, 0);
    assert_eq!(CmRequest::decode(&pd).unwrap().hrqsize, 32);
    assert_eq!(
        CmRequest::decode(&pd[..31]),
        Err(RejectReason::InvalidLength)
    );
    assert_eq!(CmRequest::decode(&[]), Err(RejectReason::InvalidLength));
    pd[0] = 1;
    assert_eq!(CmRequest::decode(&pd), Err(RejectReason::InvalidRecfmt));
}

#[test]
fn rejects_carry_the_format_and_the_status() {
    for r in [
        RejectReason::InvalidLength,
        RejectReason::InvalidRecfmt,
        RejectReason::InvalidQid,
        RejectReason::InvalidHsqsize,
        RejectReason::InvalidHrqsize,
        RejectReason::NoResources,
        RejectReason::InvalidIrd,
    ] {
        let d = reject_data(r);
        assert_eq!(decode_reject(&d), Some(r as u16));
        assert!(!r.describe().is_empty());
    }
    assert_eq!(reject_data(RejectReason::NoResources), [0, 0, 6, 0]);
}

fn keyed(opcode: u8, addr: u64, len: u32, key: u32, inv: bool) -> Sqe {
    let mut s = Sqe::new(opcode, 7, 1);
    set_keyed(&mut s, Remote { addr, len, key }, inv);
    s
}

#[test]
fn keyed_sgls_become_reads_and_writes_of_the_hosts_memory() {
    let w = keyed(io::WRITE, 0x1000_2000, 65536, 0xabcd_0123, true);
    assert_eq!(w.0[39], 0x4f);
    let p = plan(&w, 0, 1 << 20).unwrap();
    assert_eq!(
        p.plan,
        Plan::FromHost(Remote {
            addr: 0x1000_2000,
            len: 65536,
            key: 0xabcd_0123
        })
    );
    assert_eq!(p.invalidate, Some(0xabcd_0123));
    let r = keyed(io::READ, 42, 4096, 9, false);
    assert_eq!(r.0[39], 0x40);
    let p = plan(&r, 0, 1 << 20).unwrap();
    assert!(matches!(p.plan, Plan::ToHost(Remote { len: 4096, .. })));
    assert_eq!(p.invalidate, None);
    // The Linux host's "null" SGL on commands without data: keyed, zero length.
    let f = keyed(io::FLUSH, 0, 0, 0, false);
    assert_eq!(plan(&f, 0, 1 << 20).unwrap().plan, Plan::None);
    // Connect's 1024 bytes come by RDMA READ on the admin queue.
    let mut c = Sqe::fabrics(fctype::CONNECT, 1);
    set_keyed(
        &mut c,
        Remote {
            addr: 8,
            len: 1024,
            key: 5,
        },
        true,
    );
    assert!(matches!(
        plan(&c, 0, 8192).unwrap().plan,
        Plan::FromHost(Remote { len: 1024, .. })
    ));
}

#[test]
fn in_capsule_data_is_checked_against_what_arrived() {
    let mut s = Sqe::new(io::WRITE, 1, 1);
    s.set_sgl(Sgl::InCapsule {
        offset: 0,
        len: 4096,
    });
    assert_eq!(
        plan(&s, 4096, 1 << 20).unwrap().plan,
        Plan::InCapsule(0..4096)
    );
    assert_eq!(plan(&s, 4095, 1 << 20), Err(Status::SGL_OFFSET_INVALID));
    s.set_sgl(Sgl::InCapsule {
        offset: u64::MAX,
        len: 2,
    });
    assert_eq!(plan(&s, 4096, 1 << 20), Err(Status::SGL_OFFSET_INVALID));
    let mut r = Sqe::new(io::READ, 1, 1);
    r.set_sgl(Sgl::InCapsule { offset: 0, len: 8 });
    assert_eq!(plan(&r, 4096, 1 << 20), Err(Status::INVALID_FIELD));
}

#[test]
fn other_descriptors_and_oversized_transfers_are_refused() {
    let big = keyed(io::READ, 0, 2 << 20, 1, false);
    assert_eq!(plan(&big, 0, 1 << 20), Err(Status::INVALID_FIELD));
    let mut t = Sqe::new(io::WRITE, 1, 1);
    t.set_sgl(Sgl::Transport { len: 4096 });
    assert_eq!(
        plan(&t, 0, 1 << 20),
        Err(Status::SGL_DESCRIPTOR_TYPE_INVALID)
    );
    let mut odd = keyed(io::WRITE, 0, 512, 1, false);
    odd.0[39] = 0x41;
    assert_eq!(plan(&odd, 0, 1 << 20), Err(Status::INVALID_FIELD));
}

proptest! {
    #[test]
    fn any_sqe_plans_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 64), icd in 0usize..20000) {
        let s = Sqe::from_slice(&bytes).unwrap();
        let _ = plan(&s, icd, 1 << 20);
    }

    #[test]
    fn keyed_descriptors_round_trip(addr in any::<u64>(), len in 1u32..(1 << 24), key in any::<u32>(), inv in any::<bool>()) {
        let s = keyed(io::WRITE, addr, len, key, inv);
        let p = plan(&s, 0, usize::MAX).unwrap();
        prop_assert_eq!(p.plan, Plan::FromHost(Remote { addr, len, key }));
        prop_assert_eq!(p.invalidate, inv.then_some(key));
    }

    #[test]
    fn any_private_data_decodes_or_is_refused(pd in proptest::collection::vec(any::<u8>(), 0..64)) {
        match CmRequest::decode(&pd) {
            Ok(r) => { let _ = negotiate(&r, &LIMITS); }
            Err(e) => prop_assert!(matches!(e, RejectReason::InvalidLength | RejectReason::InvalidRecfmt)),
        }
    }
}
