//! Degraded writes from many threads through a partial-parity log with very few slots (issue
//! #21): slots are freed only by flushes, which requests start early (at half the slots used)
//! or wait for when one is under way. Every write completes (none waits for a slot forever) and
//! reads back, the failed members' strips too (rebuilt from parity, so parity is right).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use millrace_array::drive::{Drive, MemDrive};
use millrace_array::superblock::MemberState;
use millrace_array::{Array, Geometry, Level};

const STRIP: u64 = 64 << 10;
const ROWS: u64 = 96;
/// Room for two log slots on each member (the log starts at 512 KiB; a RAID6 x6 slot with
/// 64 KiB strips takes about 212 KiB).
const DATA_OFFSET: u64 = 960 << 10;
const THREADS: u64 = 8;
const WRITES: u64 = 120;

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn run(level: Level, members: usize, failed: &[usize]) {
    let drives: Vec<Arc<dyn Drive>> = (0..members)
        .map(|i| Arc::new(MemDrive::new(format!("m{i}"), DATA_OFFSET + STRIP * ROWS)) as _)
        .collect();
    let geo = Geometry::new(level, members, None, STRIP, STRIP * ROWS).unwrap();
    let a = Array::new(
        geo,
        DATA_OFFSET,
        drives,
        &vec![MemberState::Online; members],
    );
    for &m in failed {
        a.fail_member(m, &std::io::Error::other("test"));
    }
    let share = a.size_bytes() / THREADS / 4096 * 4096;
    let model: Vec<Vec<u8>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let a = &a;
                s.spawn(move || {
                    let mut mine = vec![0u8; share as usize];
                    let mut x = 0x2545_F491_4F6C_DD1D ^ (t + 1);
                    for i in 0..WRITES {
                        let len = 4096 * (1 + xorshift(&mut x) % 80);
                        let len = len.min(share);
                        let at = xorshift(&mut x) % ((share - len) / 4096 + 1) * 4096;
                        let fill = (t * WRITES + i) as u8 | 1;
                        let data = vec![fill; len as usize];
                        a.write_at(t * share + at, &data).unwrap();
                        mine[at as usize..(at + len) as usize].copy_from_slice(&data);
                    }
                    mine
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (t, want) in model.iter().enumerate() {
        let mut got = vec![0u8; share as usize];
        a.read_at(t as u64 * share, &mut got).unwrap();
        assert!(got == *want, "thread {t}'s region reads back wrong");
    }
    // Two slots per member: the records were many times that, so slots were freed by flushes
    // and reused while other threads kept writing.
    let logged = a.stats.log_records.load(Ordering::Relaxed);
    assert!(
        logged > 8 * members as u64,
        "only {logged} records were logged"
    );
    assert!(a.stats.member_flushes.load(Ordering::Relaxed) > 0);
}

#[test]
fn raid6_one_failed_with_two_slots() {
    run(Level::Raid6, 6, &[1]);
}

#[test]
fn raid6_two_failed_with_two_slots() {
    run(Level::Raid6, 6, &[1, 4]);
}

#[test]
fn raid5_one_failed_with_two_slots() {
    run(Level::Raid5, 5, &[2]);
}
