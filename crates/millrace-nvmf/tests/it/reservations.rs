//! Persistent reservations driven by the crate's own initiator over 127.0.0.1: two or three
//! hosts (each its own host NQN and host identifier) register, acquire, preempt, release and
//! clear; the hosts without the reservation get Reservation Conflict instead of data; the
//! report, the notices, the features, bad commands, and the record of state that persists
//! through power loss.

use millrace_block::{BlockDevice, MemBlockDevice};
use millrace_nvmf::cmd::{self, io, Sqe, Status};
use millrace_nvmf::initiator::{Completion, Error, HostController, HostOptions, HostQueue};
use millrace_nvmf::{
    Namespace, ReservationState, ReservationStore, ReservationType, SubsystemConfig, Target,
    TargetConfig,
};
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const NQN: &str = "nqn.2024-01.io.millrace:resv";
const HOSTS: [&str; 3] = [
    "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a",
    "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b",
    "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000c",
];
const LBA: u32 = 4096;
/// The Reservation Log Page Available notice an Async Event Request completes with.
const RESV_EVENT: u32 = 0x0080_0006;
const CONFLICT: Status = Status::RESERVATION_CONFLICT;

/// What the target's store was given: (nqn, nsid, state or None), in order.
type Records = Arc<Mutex<Vec<(String, u32, Option<ReservationState>)>>>;

struct Setup {
    t: Target,
    addr: SocketAddr,
    records: Records,
}

fn target(store: bool) -> (Target, Records) {
    target_on(store, Arc::new(MemBlockDevice::new(8 << 20)))
}

fn target_on(store: bool, dev: Arc<dyn BlockDevice>) -> (Target, Records) {
    let t = Target::new(TargetConfig::default());
    let records: Records = Default::default();
    if store {
        let r = records.clone();
        let s: ReservationStore = Arc::new(move |nqn, nsid, st| {
            r.lock().push((nqn.to_string(), nsid, st.cloned()));
            Ok(())
        });
        t.set_reservation_store(s).unwrap();
    }
    t.add_subsystem(SubsystemConfig {
        nqn: NQN.into(),
        serial: "MR-RESV".into(),
        model: "Millrace test".into(),
        namespaces: vec![Namespace {
            nsid: 1,
            dev,
            uuid: [1; 16],
            nguid: [2; 16],
            ana_group: 0,
        }],
        allowed_hosts: HOSTS.iter().map(|h| h.to_string()).collect(),
        allow_any_host: false,
    })
    .unwrap();
    (t, records)
}

async fn serve(t: &Target) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let t2 = t.clone();
    tokio::spawn(async move { t2.serve(l).await });
    addr
}

async fn setup(store: bool) -> Setup {
    let (t, records) = target(store);
    let addr = serve(&t).await;
    Setup { t, addr, records }
}

fn host(i: usize) -> HostOptions {
    HostOptions {
        hostnqn: HOSTS[i].into(),
        hostid: [0xa0 + i as u8; 16],
        ..Default::default()
    }
}

/// Host `i`'s controller with one I/O queue.
async fn connect(s: &Setup, i: usize) -> HostController {
    HostController::connect(s.addr, NQN, &host(i), 1)
        .await
        .unwrap()
}

fn status(r: Result<impl std::fmt::Debug, Error>) -> Status {
    match r {
        Ok(v) => panic!("the command succeeded ({v:?}) where it should fail"),
        Err(e) => e.status().unwrap_or_else(|| panic!("no status: {e}")),
    }
}

async fn write(q: &HostQueue) -> Result<(), Error> {
    q.write(1, 0, vec![7; LBA as usize], LBA).await
}

async fn read(q: &HostQueue) -> Result<Vec<u8>, Error> {
    q.read(1, 0, 1, LBA).await
}

fn parked_aer(q: &Arc<HostQueue>) -> tokio::task::JoinHandle<Result<Completion, Error>> {
    let q = q.clone();
    tokio::spawn(async move {
        q.submit(Sqe::new(cmd::admin::ASYNC_EVENT_REQUEST, 0, 0), None, 0)
            .await
    })
}

/// (log page count, type, available after it, nsid) of the reservation notification log.
async fn notice(c: &HostController) -> (u64, u8, u8, u32) {
    let p = c.admin.get_log_page(0x80, 64, 0).await.unwrap();
    let count = u64::from_le_bytes(p[0..8].try_into().unwrap());
    (
        count,
        p[8],
        p[9],
        u32::from_le_bytes(p[12..16].try_into().unwrap()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identify_reports_reservations() {
    let s = setup(true).await;
    let a = connect(&s, 0).await;
    let id = &a.id_ctrl;
    assert_ne!(u16::from_le_bytes([id[520], id[521]]) & 1 << 5, 0, "ONCS");
    assert_eq!(id[96] & 1, 1, "CTRATT: 128-bit host identifiers");
    let ns = a.admin.identify(0, 1).await.unwrap();
    assert_eq!(ns[31], 0xff, "RESCAP: every type, IEKEY, PTPL");
    assert_eq!(ns[30] & 1, 1, "NMIC");
    let hid = a.admin.get_features(0x81).await;
    assert_eq!(status(hid), Status::HOST_ID_INCONSISTENT_FORMAT, "EXHID 0");
    let mut sqe = Sqe::new(cmd::admin::GET_FEATURES, 0, 0);
    sqe.set_cdw(10, 0x81);
    sqe.set_cdw(11, 1);
    let c = a.admin.submit(sqe, None, 16).await.unwrap();
    assert_eq!(c.data, vec![0xa0; 16], "Host Identifier, extended");
    // Without a store there is no persistence to offer.
    let s = setup(false).await;
    let a = connect(&s, 0).await;
    assert_eq!(a.admin.identify(0, 1).await.unwrap()[31], 0xfe);
    let q = &a.io[0];
    assert_eq!(
        status(q.resv_register(1, 0, false, 3, 0, 1).await),
        Status::INVALID_FIELD
    );
    assert_eq!(
        status(a.admin.set_features(0x83, 1).await),
        Status::INVALID_FIELD
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_exclusive_keeps_the_other_host_to_reads() {
    let s = setup(false).await;
    let (a, b) = (connect(&s, 0).await, connect(&s, 1).await);
    let (qa, qb) = (&a.io[0], &b.io[0]);
    qa.resv_register(1, 0, false, 0, 0, 0xaaaa).await.unwrap();
    qb.resv_register(1, 0, false, 0, 0, 0xbbbb).await.unwrap();
    qa.resv_acquire(1, 0, 1, 0xaaaa, 0).await.unwrap();
    // The holder reads and writes; the other host reads, and gets a conflict for the rest.
    write(qa).await.unwrap();
    assert_eq!(read(qb).await.unwrap(), vec![7; LBA as usize]);
    assert_eq!(status(write(qb).await), CONFLICT);
    assert_eq!(status(qb.flush(1).await), CONFLICT);
    assert_eq!(status(qb.write_zeroes(1, 0, 1).await), CONFLICT);
    assert_eq!(status(qb.deallocate(1, &[(0, 1)]).await), CONFLICT);
    // (CONFLICT carries Do Not Retry: the statuses compared include it.)
    assert_eq!(status(qb.resv_acquire(1, 0, 1, 0xbbbb, 0).await), CONFLICT);
    // The report shows both, the holder marked, in the extended format.
    let r = qb.resv_report(1, 4096).await.unwrap();
    assert_eq!((r.rtype, r.registrants_count, r.generation), (1, 2, 2));
    let a_entry = r
        .registrants
        .iter()
        .find(|e| e.hostid == [0xa0; 16])
        .unwrap();
    let b_entry = r
        .registrants
        .iter()
        .find(|e| e.hostid == [0xa1; 16])
        .unwrap();
    assert!(a_entry.holds && !b_entry.holds);
    assert_eq!((a_entry.key, b_entry.key), (0xaaaa, 0xbbbb));
    assert_eq!(a_entry.cntlid, 0xffff, "dynamic controllers");
    // Released, the namespace is everyone's again.
    qa.resv_release(1, 0, 1, 0xaaaa).await.unwrap();
    write(qb).await.unwrap();
    let st = &s.t.reservations(NQN).unwrap()[0].1;
    assert_eq!((st.rtype, st.registrants.len()), (None, 2));
    assert_eq!(st.registrants[0].hostnqn, HOSTS[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_type_lets_in_whom_it_should() {
    let s = setup(false).await;
    let hosts = [
        connect(&s, 0).await,
        connect(&s, 1).await,
        connect(&s, 2).await,
    ];
    let [qa, qb, qc] = [&hosts[0].io[0], &hosts[1].io[0], &hosts[2].io[0]];
    qa.resv_register(1, 0, false, 0, 0, 1).await.unwrap();
    qb.resv_register(1, 0, false, 0, 0, 2).await.unwrap();
    // C is not registered. (B: registrant read, write; C: read, write) may go through.
    let table = [
        (
            ReservationType::ExclusiveAccess,
            [false, false, false, false],
        ),
        (
            ReservationType::WriteExclusiveRegistrantsOnly,
            [true, true, true, false],
        ),
        (
            ReservationType::ExclusiveAccessRegistrantsOnly,
            [true, true, false, false],
        ),
        (
            ReservationType::WriteExclusiveAllRegistrants,
            [true, true, true, false],
        ),
        (
            ReservationType::ExclusiveAccessAllRegistrants,
            [true, true, false, false],
        ),
    ];
    for (t, allowed) in table {
        qa.resv_acquire(1, 0, t.code(), 1, 0).await.unwrap();
        let got = [
            read(qb).await.is_ok(),
            write(qb).await.is_ok(),
            read(qc).await.is_ok(),
            write(qc).await.is_ok(),
        ];
        assert_eq!(got, allowed, "{t}");
        assert!(
            read(qa).await.is_ok() && write(qa).await.is_ok(),
            "{t}: holder"
        );
        assert_eq!(status(read(qc).await.and(write(qc).await)), CONFLICT, "{t}");
        let r = qc.resv_report(1, 192).await.unwrap();
        let holders = r.registrants.iter().filter(|e| e.holds).count();
        assert_eq!(holders, if t.all_registrants() { 2 } else { 1 }, "{t}");
        qa.resv_release(1, 0, t.code(), 1).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosts_controllers_share_its_registration() {
    let s = setup(false).await;
    let (a1, a2, b) = (
        connect(&s, 0).await,
        connect(&s, 0).await,
        connect(&s, 1).await,
    );
    assert_ne!(a1.cntlid, a2.cntlid);
    a1.io[0].resv_register(1, 0, false, 0, 0, 5).await.unwrap();
    // The second controller of the same host is registered already, with the same key.
    assert_eq!(
        status(a2.io[0].resv_register(1, 0, false, 0, 0, 6).await),
        CONFLICT
    );
    a2.io[0].resv_acquire(1, 0, 2, 5, 0).await.unwrap();
    write(&a1.io[0]).await.unwrap();
    write(&a2.io[0]).await.unwrap();
    assert_eq!(status(read(&b.io[0]).await), CONFLICT);
    let r = b.io[0].resv_report(1, 4096).await.unwrap();
    assert_eq!(r.registrants_count, 1, "one host, one registrant");
    // A controller going away takes nothing with it.
    drop(a1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(status(read(&b.io[0]).await), CONFLICT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempt_removes_the_holders_registration_and_tells_it() {
    let s = setup(false).await;
    let (a, b) = (connect(&s, 0).await, connect(&s, 1).await);
    let (qa, qb) = (&a.io[0], &b.io[0]);
    qa.resv_register(1, 0, false, 0, 0, 1).await.unwrap();
    qb.resv_register(1, 0, false, 0, 0, 2).await.unwrap();
    qa.resv_acquire(1, 0, 1, 1, 0).await.unwrap();
    let ev = parked_aer(&a.admin);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // B takes the reservation (write exclusive) from A, whose registration goes.
    qb.resv_acquire(1, 1, 1, 2, 1).await.unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(2), ev).await;
    assert_eq!(ev.unwrap().unwrap().unwrap().cqe.result as u32, RESV_EVENT);
    assert_eq!(notice(&a).await, (1, 1, 0, 1), "registration preempted");
    assert_eq!(notice(&a).await, (0, 0, 0, 0), "read once, then empty");
    assert_eq!(status(write(qa).await), CONFLICT);
    assert_eq!(
        status(qa.resv_acquire(1, 0, 1, 1, 0).await),
        CONFLICT,
        "A is no registrant"
    );
    write(qb).await.unwrap();
    let r = qa.resv_report(1, 4096).await.unwrap();
    assert_eq!(r.registrants.len(), 1);
    assert!(r.registrants[0].holds && r.registrants[0].hostid == [0xa1; 16]);
    // Preempt and abort: A registers again and takes it back as exclusive access; B's
    // registration goes, and its commands meet the new reservation.
    qa.resv_register(1, 0, false, 0, 0, 1).await.unwrap();
    let writes: Vec<_> = (0..8)
        .map(|i| {
            let q = qb.clone();
            tokio::spawn(async move { q.write(1, i, vec![9; LBA as usize], LBA).await })
        })
        .collect();
    qa.resv_acquire(1, 2, 2, 1, 2).await.unwrap();
    for w in writes {
        // Each either went through before the preemption, or met it.
        if let Err(e) = w.await.unwrap() {
            assert_eq!(e.status(), Some(CONFLICT));
        }
    }
    assert_eq!(status(read(qb).await), CONFLICT);
    assert_eq!(notice(&b).await.1, 1, "B's registration was preempted");
    let st = &s.t.reservations(NQN).unwrap()[0].1;
    assert_eq!(st.rtype, Some(ReservationType::ExclusiveAccess));
    assert_eq!(st.holder, Some([0xa0; 16]));
    assert_eq!(st.generation, 5, "three registrations and two preemptions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_and_clear_tell_the_other_registrants() {
    let s = setup(false).await;
    let (a, b) = (connect(&s, 0).await, connect(&s, 1).await);
    let (qa, qb) = (&a.io[0], &b.io[0]);
    qa.resv_register(1, 0, false, 0, 0, 1).await.unwrap();
    qb.resv_register(1, 0, false, 0, 0, 2).await.unwrap();
    qa.resv_acquire(1, 0, 3, 1, 0).await.unwrap();
    // The wrong type is an invalid field; from a registrant that holds nothing, a no-op.
    assert_eq!(
        status(qa.resv_release(1, 0, 1, 1).await),
        Status::INVALID_FIELD
    );
    qb.resv_release(1, 0, 3, 2).await.unwrap();
    assert_eq!(status(write(&connect(&s, 2).await.io[0]).await), CONFLICT);
    qa.resv_release(1, 0, 3, 1).await.unwrap();
    assert_eq!(notice(&b).await, (1, 2, 0, 1), "reservation released");
    qb.resv_acquire(1, 0, 1, 2, 0).await.unwrap();
    qa.resv_release(1, 1, 0, 1).await.unwrap();
    assert_eq!(
        notice(&b).await,
        (2, 3, 0, 1),
        "reservation preempted by the clear"
    );
    assert_eq!(notice(&a).await.1, 0, "the host that cleared is not told");
    write(qb).await.unwrap();
    let r = qa.resv_report(1, 64).await.unwrap();
    assert_eq!((r.rtype, r.registrants_count), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_keys_conflict() {
    let s = setup(false).await;
    let (a, b) = (connect(&s, 0).await, connect(&s, 1).await);
    let (qa, qb) = (&a.io[0], &b.io[0]);
    assert_eq!(
        status(qa.resv_acquire(1, 0, 1, 0, 0).await),
        CONFLICT,
        "not registered"
    );
    assert_eq!(
        status(qa.resv_release(1, 1, 0, 0).await),
        CONFLICT,
        "not registered"
    );
    assert_eq!(
        status(qa.resv_register(1, 1, false, 0, 0, 0).await),
        CONFLICT
    );
    qa.resv_register(1, 0, false, 0, 0, u64::MAX).await.unwrap();
    qb.resv_register(1, 0, false, 0, 0, 0).await.unwrap();
    assert_eq!(
        status(qa.resv_register(1, 0, false, 0, 0, 1).await),
        CONFLICT
    );
    assert_eq!(status(qa.resv_acquire(1, 0, 1, 1, 0).await), CONFLICT);
    assert_eq!(
        status(qa.resv_register(1, 2, false, 0, 1, 2).await),
        CONFLICT
    );
    assert_eq!(
        status(qa.resv_register(1, 1, false, 0, 1, 0).await),
        CONFLICT
    );
    qa.resv_acquire(1, 0, 1, u64::MAX, 0).await.unwrap();
    assert_eq!(status(qa.resv_release(1, 0, 1, 3).await), CONFLICT);
    assert_eq!(
        status(qb.resv_acquire(1, 1, 1, 0, 77).await),
        CONFLICT,
        "no such key"
    );
    // Replace with the right key, or ignoring it, works.
    qa.resv_register(1, 2, false, 0, u64::MAX, 8).await.unwrap();
    qa.resv_register(1, 2, true, 0, 1234, 9).await.unwrap();
    qa.resv_release(1, 0, 1, 9).await.unwrap();
    let r = qb.resv_report(1, 4096).await.unwrap();
    assert_eq!(
        r.registrants.iter().map(|e| e.key).collect::<Vec<_>>(),
        vec![9, 0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_reservation_commands_are_refused() {
    let s = setup(true).await;
    let a = connect(&s, 0).await;
    let q = &a.io[0];
    let f = Status::INVALID_FIELD;
    let raw = |op: u8, c10: u32, data: Vec<u8>, nsid: u32| {
        let q = q.clone();
        async move {
            let mut sqe = Sqe::new(op, 0, nsid);
            sqe.set_cdw(10, c10);
            status(q.submit(sqe, Some(data), 0).await)
        }
    };
    let k = vec![0u8; 16];
    assert_eq!(
        raw(io::RESERVATION_REGISTER, 3, k.clone(), 1).await,
        f,
        "RREGA 3"
    );
    assert_eq!(
        raw(io::RESERVATION_REGISTER, 1 << 30, k.clone(), 1).await,
        f,
        "CPTPL 01b"
    );
    assert_eq!(
        raw(io::RESERVATION_ACQUIRE, 3 | 1 << 8, k.clone(), 1).await,
        f,
        "RACQA 3"
    );
    assert_eq!(
        raw(io::RESERVATION_ACQUIRE, 0, k.clone(), 1).await,
        f,
        "RTYPE 0"
    );
    assert_eq!(
        raw(io::RESERVATION_ACQUIRE, 7 << 8, k.clone(), 1).await,
        f,
        "RTYPE 7"
    );
    assert_eq!(
        raw(io::RESERVATION_ACQUIRE, 1 << 8 | 8, k.clone(), 1).await,
        f,
        "IEKEY"
    );
    assert_eq!(
        raw(io::RESERVATION_RELEASE, 2 | 1 << 8, k.clone(), 1).await,
        f,
        "RRELA 2"
    );
    assert_eq!(
        raw(io::RESERVATION_RELEASE, 0, k.clone(), 1).await,
        f,
        "RTYPE 0"
    );
    let short = Status::DATA_SGL_LENGTH_INVALID;
    assert_eq!(raw(io::RESERVATION_REGISTER, 0, vec![0; 8], 1).await, short);
    assert_eq!(
        raw(io::RESERVATION_ACQUIRE, 1 << 8, vec![0; 12], 1).await,
        short
    );
    assert_eq!(
        raw(io::RESERVATION_RELEASE, 1 << 8, vec![0; 4], 1).await,
        short
    );
    let no_data = q
        .submit(Sqe::new(io::RESERVATION_REGISTER, 0, 1), None, 0)
        .await;
    assert_eq!(status(no_data), short);
    assert_eq!(
        raw(io::RESERVATION_REGISTER, 0, k.clone(), 9).await,
        Status::INVALID_NAMESPACE
    );
    // A report without the extended structure, or asking for more than its buffer holds.
    let mut rep = Sqe::new(io::RESERVATION_REPORT, 0, 1);
    rep.set_cdw(10, 15);
    assert_eq!(
        status(q.submit(rep, None, 64).await),
        Status::HOST_ID_INCONSISTENT_FORMAT
    );
    rep.set_cdw(10, u32::MAX);
    rep.set_cdw(11, 1);
    assert_eq!(status(q.submit(rep, None, 64).await), short);
    // Nothing was registered, and the queue still serves.
    assert!(s.t.reservations(NQN).unwrap()[0].1.registrants.is_empty());
    assert!(s.records.lock().is_empty());
    write(q).await.unwrap();
    let r = q.resv_report(1, 8).await;
    assert!(
        matches!(r, Err(Error::Protocol(_))),
        "8 bytes: no whole header"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn features_mask_notices_and_set_persistence() {
    let s = setup(true).await;
    let (a, b) = (connect(&s, 0).await, connect(&s, 1).await);
    let (qa, qb) = (&a.io[0], &b.io[0]);
    let set = |c: &HostController, fid: u8, nsid: u32, v: u32| {
        let q = c.admin.clone();
        async move {
            let mut sqe = Sqe::new(cmd::admin::SET_FEATURES, 0, nsid);
            sqe.set_cdw(10, fid as u32);
            sqe.set_cdw(11, v);
            q.submit(sqe, None, 0).await.map(|_| ())
        }
    };
    let get = |c: &HostController, fid: u8, nsid: u32| {
        let q = c.admin.clone();
        async move {
            let mut sqe = Sqe::new(cmd::admin::GET_FEATURES, 0, nsid);
            sqe.set_cdw(10, fid as u32);
            q.submit(sqe, None, 0).await.map(|c| c.cqe.result)
        }
    };
    assert_eq!(
        status(set(&a, 0x82, 1, 1).await),
        Status::INVALID_FIELD,
        "bit 0"
    );
    assert_eq!(status(set(&a, 0x82, 5, 2).await), Status::INVALID_NAMESPACE);
    set(&a, 0x82, u32::MAX, 1 << 1).await.unwrap();
    assert_eq!(get(&a, 0x82, 1).await.unwrap(), 2);
    qa.resv_register(1, 0, false, 0, 0, 1).await.unwrap();
    qb.resv_register(1, 0, false, 0, 0, 2).await.unwrap();
    qb.resv_acquire(1, 1, 1, 2, 1).await.unwrap();
    assert_eq!(
        notice(&a).await.1,
        0,
        "registration preempted notices are masked"
    );
    // Persistence: off until set; each change is recorded while it is on.
    assert_eq!(get(&a, 0x83, 1).await.unwrap(), 0);
    assert!(s.records.lock().is_empty());
    set(&b, 0x83, 1, 1).await.unwrap();
    assert_eq!(get(&a, 0x83, 1).await.unwrap(), 1);
    qa.resv_register(1, 0, false, 0, 0, 3).await.unwrap();
    {
        let r = s.records.lock();
        assert_eq!(r.len(), 2);
        let st = r[1].2.as_ref().unwrap();
        assert_eq!((r[1].0.as_str(), r[1].1), (NQN, 1));
        assert!(st.ptpl && st.registrants.len() == 2);
    }
    // Cleared, the record goes.
    qb.resv_register(1, 0, false, 2, 0, 2).await.unwrap();
    assert_eq!(s.records.lock().last().unwrap().2, None);
    assert_eq!(get(&a, 0x83, 1).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_state_comes_back_on_a_new_target() {
    let s = setup(true).await;
    let (a, b) = (connect(&s, 0).await, connect(&s, 1).await);
    a.io[0]
        .resv_register(1, 0, false, 3, 0, 0x11)
        .await
        .unwrap();
    b.io[0]
        .resv_register(1, 0, false, 0, 0, 0x22)
        .await
        .unwrap();
    a.io[0].resv_acquire(1, 0, 1, 0x11, 0).await.unwrap();
    let kept = s.records.lock().last().unwrap().2.clone().unwrap();
    assert_eq!(kept, s.t.reservations(NQN).unwrap()[0].1);
    assert_eq!(
        (kept.generation, kept.rtype),
        (2, Some(ReservationType::WriteExclusive))
    );
    // A target started again with the record: the hosts find their registrations and the
    // reservation where they left them.
    let (t2, _) = target(true);
    let bad = ReservationState {
        holder: Some([9; 16]),
        ..kept.clone()
    };
    let e = t2
        .restore_reservations(NQN, 1, bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("do not hold together"), "{e}");
    t2.restore_reservations(NQN, 1, kept).unwrap();
    let s2 = Setup {
        addr: serve(&t2).await,
        t: t2,
        records: Default::default(),
    };
    let (a, b) = (connect(&s2, 0).await, connect(&s2, 1).await);
    let r = b.io[0].resv_report(1, 4096).await.unwrap();
    assert!(r.ptpl && r.rtype == 1 && r.registrants_count == 2 && r.generation == 2);
    assert_eq!(status(write(&b.io[0]).await), CONFLICT);
    write(&a.io[0]).await.unwrap();
    // An operator's clear ends it all, and tells the registrants.
    s2.t.clear_reservations(NQN, 1).unwrap();
    assert_eq!(notice(&b).await.1, 3);
    write(&b.io[0]).await.unwrap();
    let e = s2.t.clear_reservations(NQN, 2).unwrap_err().to_string();
    assert!(e.contains("no namespace 2"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_keeps_the_reservation() {
    let s = setup(false).await;
    let (a, b) = (connect(&s, 0).await, connect(&s, 1).await);
    a.io[0].resv_register(1, 0, false, 0, 0, 1).await.unwrap();
    a.io[0].resv_acquire(1, 0, 2, 1, 0).await.unwrap();
    s.t.resize_namespace(NQN, 1).unwrap();
    assert_eq!(status(read(&b.io[0]).await), CONFLICT);
    read(&a.io[0]).await.unwrap();
}

/// A device whose writes wait at a gate until the test opens it (or 10 s pass).
struct Gated {
    mem: MemBlockDevice,
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

impl BlockDevice for Gated {
    fn size_bytes(&self) -> u64 {
        self.mem.size_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.mem.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        // At most 10 s: a test that fails before it opens the gate ends instead of hanging.
        let open = self.open.lock().unwrap();
        let wait = Duration::from_secs(10);
        drop(self.opened.wait_timeout_while(open, wait, |o| !*o).unwrap());
        self.mem.write_at(offset, data)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempt_and_abort_completes_after_the_preempted_hosts_commands() {
    let dev = Arc::new(Gated {
        mem: MemBlockDevice::new(8 << 20),
        open: std::sync::Mutex::new(false),
        opened: std::sync::Condvar::new(),
    });
    let (t, records) = target_on(false, dev.clone());
    let s = Setup {
        addr: serve(&t).await,
        t,
        records,
    };
    let (a, b) = (connect(&s, 0).await, connect(&s, 1).await);
    a.io[0].resv_register(1, 0, false, 0, 0, 1).await.unwrap();
    b.io[0].resv_register(1, 0, false, 0, 0, 2).await.unwrap();
    b.io[0].resv_acquire(1, 0, 1, 2, 0).await.unwrap();
    // B's write is admitted, and waits in the device.
    let qb = b.io[0].clone();
    let w = tokio::spawn(async move { write(&qb).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let qa = a.io[0].clone();
    let p = tokio::spawn(async move { qa.resv_acquire(1, 2, 1, 1, 2).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !p.is_finished(),
        "preempt and abort waits for the write admitted before it"
    );
    // B's new commands meet the new reservation at once.
    assert_eq!(status(write(&b.io[0]).await), CONFLICT);
    *dev.open.lock().unwrap() = true;
    dev.opened.notify_all();
    w.await.unwrap().unwrap();
    p.await.unwrap().unwrap();
    // A plain preempt does not wait.
    *dev.open.lock().unwrap() = false;
    b.io[0].resv_register(1, 0, false, 0, 0, 2).await.unwrap();
    let qa = a.io[0].clone();
    let w = tokio::spawn(async move { write(&qa).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t0 = std::time::Instant::now();
    a.io[0].resv_acquire(1, 1, 1, 1, 2).await.unwrap();
    assert!(t0.elapsed() < Duration::from_millis(250));
    *dev.open.lock().unwrap() = true;
    dev.opened.notify_all();
    w.await.unwrap().unwrap();
}
