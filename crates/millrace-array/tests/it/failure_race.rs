//! A healthy parity write in flight when a member fails (issue #21). The write was planned with
//! every member online, so it goes in place without a partial-parity log record. If the failure
//! reached the superblocks (and their flush) while the write was still in flight, a crash then
//! left a torn stripe in a degraded pool, and the failed member's strip, rebuilt from that
//! parity, came back as neither its old content nor anything written: the write hole, for data
//! nobody wrote. Now a failure is recorded only once such writes have completed and every member
//! in service is flushed (`engine/unlogged.rs`).
//!
//! The write's parity update is held inside the parity member (a gate in front of its drive)
//! while the admin fails another member of the stripe; the gate opens a little later; the
//! process is killed (every later write and flush does nothing) as soon as the failure is
//! recorded, and power is cut (every unflushed write lost). Afterwards every acknowledged write
//! reads back, the failed member's untouched data too, and parity verifies.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use millrace_array::drive::Drive;
use millrace_array::fault::{kill_budget, FaultyDrive};
use millrace_array::superblock::MemberState;
use millrace_array::{CreateOptions, Level, Pool};

const STRIP: u64 = 4096;
const ROWS: u64 = 16;
const DATA_OFFSET: u64 = 1 << 20;
const SIZE: u64 = DATA_OFFSET + STRIP * ROWS;

/// Holds writes to `range` of the drive until opened (a write stuck in the drive's queue).
struct Gate {
    inner: Arc<FaultyDrive>,
    range: parking_lot::Mutex<Option<Range<u64>>>,
    entered: AtomicBool,
    open: AtomicBool,
}

impl Drive for Gate {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let held = self
            .range
            .lock()
            .as_ref()
            .is_some_and(|r| offset < r.end && offset + buf.len() as u64 > r.start);
        if held {
            self.entered.store(true, Ordering::Release);
            while !self.open.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// What is in flight when the member fails.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// A one-strip write of the row (read-modify-write: data, then parity).
    Write,
    /// A discard of the whole row (every member deallocated in turn).
    Discard,
}

fn check(level: Level, n: usize, op: Op) {
    let budget: Arc<AtomicI64> = kill_budget();
    let drives: Vec<Arc<FaultyDrive>> = (0..n)
        .map(|i| {
            let d = Arc::new(FaultyDrive::new(format!("d{i}"), SIZE));
            d.share_kill(budget.clone());
            d
        })
        .collect();
    let gates: Vec<Arc<Gate>> = drives
        .iter()
        .map(|d| {
            Arc::new(Gate {
                inner: d.clone(),
                range: parking_lot::Mutex::new(None),
                entered: AtomicBool::new(false),
                open: AtomicBool::new(false),
            })
        })
        .collect();
    let names: Vec<PathBuf> = (0..n).map(|i| PathBuf::from(format!("d{i}"))).collect();
    let opts = CreateOptions {
        name: "race".into(),
        level,
        strip: STRIP,
        group: None,
        data_offset: Some(DATA_OFFSET),
        create_size: None,
        force: false,
    };
    let dyns: Vec<Arc<dyn Drive>> = gates.iter().map(|g| g.clone() as _).collect();
    let pool = Pool::create_on(&opts, &names, dyns, true).unwrap();
    let size = pool.array().size_bytes() as usize;
    let durable = pattern(7, size);
    pool.write_at(0, &durable).unwrap();
    pool.array().flush().unwrap();

    // Row 5: its first data strip is rewritten (read-modify-write: data, then parity); the
    // member holding its second data strip fails meanwhile.
    let geo = *pool.array().geometry();
    let row = 5u64;
    let layout = geo.group_layout(row, 0);
    let k = geo.group_data();
    let (parity, victim) = (layout[k], layout[1]);
    let fs = geo.full_stripe_bytes();
    let at = (row * fs) as usize;
    let (new, len) = match op {
        Op::Write => (pattern(99, STRIP as usize), STRIP as usize),
        Op::Discard => (vec![0u8; fs as usize], fs as usize),
    };
    let held = DATA_OFFSET + row * STRIP;
    *gates[parity].range.lock() = Some(held..held + STRIP);
    let ctx = format!("{level} {op:?}: row {row}, parity on {parity}, member {victim} failed");
    std::thread::scope(|s| {
        let writer = s.spawn(|| match op {
            Op::Write => pool.write_at(at as u64, &new),
            Op::Discard => pool.array().discard(at as u64, fs).map_err(Into::into),
        });
        while !gates[parity].entered.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let g = gates[parity].clone();
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            g.open.store(true, Ordering::Release);
        });
        pool.fail(&names[victim]).unwrap();
        // Killed as soon as the failure is recorded.
        budget.store(0, Ordering::Release);
        let acked = writer.join().unwrap().is_ok();
        assert!(acked, "{ctx}: the write failed");
    });
    drop(pool);
    budget.store(i64::MAX, Ordering::Release);
    for d in &drives {
        d.power_cut(|| false);
    }
    let ds: Vec<(PathBuf, Arc<dyn Drive>)> = names
        .iter()
        .zip(&drives)
        .map(|(p, d)| (p.clone(), d.clone() as _))
        .collect();
    let (mut pools, notes) = Pool::import_drives(ds.clone(), false).unwrap();
    assert_eq!(pools.len(), 1, "{notes:?}");
    let pool = pools.remove(0);
    assert_eq!(
        pool.array().member_state(victim),
        MemberState::Faulty,
        "{ctx}"
    );
    let mut got = vec![0u8; size];
    pool.read_at(0, &mut got).unwrap();
    let victim_col = (0..geo.data_cols())
        .find(|&c| geo.locate(row, c).member == victim)
        .unwrap();
    let v = at + victim_col * STRIP as usize;
    let untouched = matches!(op, Op::Write);
    assert!(
        !untouched || got[v..v + STRIP as usize] == durable[v..v + STRIP as usize],
        "{ctx}: the failed member's untouched strip comes back damaged"
    );
    let mut want = durable.clone();
    want[at..at + len].copy_from_slice(&new);
    // The write was in flight when the failure was recorded: it is durable with it.
    assert!(
        got == want,
        "{ctx}: the pool reads back wrong after the crash"
    );
    // Parity verifies: the failed member is replaced and rebuilt from it, a scrub agrees.
    let fresh = Arc::new(FaultyDrive::new("fresh", SIZE));
    pool.replace_with(&names[victim], &PathBuf::from("fresh"), fresh)
        .unwrap();
    pool.rebuild(None, |_, _| {}).unwrap();
    let rep = pool.scrub(false, |_, _| {}).unwrap();
    assert_eq!(rep.mismatches, 0, "{ctx}: {rep:?}");
    let mut again = vec![0u8; size];
    pool.read_at(0, &mut again).unwrap();
    assert!(again == want, "{ctx}: data changed through the rebuild");
}

#[test]
fn raid5_write_in_flight_when_a_member_fails_survives_a_crash() {
    check(Level::Raid5, 4, Op::Write);
}

#[test]
fn raid6_discard_in_flight_when_a_member_fails_survives_a_crash() {
    check(Level::Raid6, 6, Op::Discard);
}

#[test]
fn raid6_write_in_flight_when_a_member_fails_survives_a_crash() {
    check(Level::Raid6, 6, Op::Write);
}
