//! Batched rebuild (many rows per batch) while a writer and a reader keep the pool busy: the data
//! reads back as written, before, during and after, and the redundancy is whole at the end.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use millrace_array::drive::Drive;
use millrace_array::fault::FaultyDrive;
use millrace_array::{CreateOptions, Level, Pool};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};

const STRIP: u64 = 4096;
// 1000 rows of 4 KiB strips: four batches of 256 rows and a short one.
const ROWS: u64 = 1000;
const DATA_OFFSET: u64 = 1 << 20;

fn pool(level: Level, n: usize, group: Option<usize>) -> (Pool, Vec<PathBuf>) {
    let (pool, names, _) = pool_and_drives(level, n, group);
    (pool, names)
}

fn pool_and_drives(
    level: Level,
    n: usize,
    group: Option<usize>,
) -> (Pool, Vec<PathBuf>, Vec<Arc<FaultyDrive>>) {
    let names: Vec<PathBuf> = (0..n).map(|i| PathBuf::from(format!("d{i}"))).collect();
    let faulty: Vec<Arc<FaultyDrive>> = names
        .iter()
        .map(|p| {
            Arc::new(FaultyDrive::new(
                p.display().to_string(),
                DATA_OFFSET + STRIP * ROWS,
            ))
        })
        .collect();
    let drives: Vec<Arc<dyn Drive>> = faulty.iter().map(|d| d.clone() as Arc<dyn Drive>).collect();
    let opts = CreateOptions {
        name: "r".into(),
        level,
        strip: STRIP,
        group,
        data_offset: Some(DATA_OFFSET),
        create_size: None,
        force: false,
    };
    let pool = Pool::create_on(&opts, &names, drives, true).unwrap();
    (pool, names, faulty)
}

fn rebuild_under_load(level: Level, n: usize, group: Option<usize>, fail: &[usize]) {
    let (pool, names) = pool(level, n, group);
    let pool = Arc::new(pool);
    let size = pool.array().size_bytes() as usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(n as u64 * 31 + fail.len() as u64);
    let model: Vec<u8> = (0..size).map(|_| rng.random()).collect();
    pool.write_at(0, &model).unwrap();
    for &m in fail {
        pool.array().fail_member(m, &std::io::Error::other("test"));
    }
    for &m in fail {
        let new = PathBuf::from(format!("n{m}"));
        let d = Arc::new(FaultyDrive::new(
            new.display().to_string(),
            DATA_OFFSET + STRIP * ROWS,
        ));
        pool.replace_with(&names[m], &new, d).unwrap();
    }
    let model = Arc::new(Mutex::new(model));
    let stop = Arc::new(AtomicBool::new(false));
    // The writer holds the model's lock across its write so the model always says what the
    // pool holds; the reader takes the same lock to compare.
    let writer = {
        let (pool, model, stop) = (pool.clone(), model.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) || n < 50 {
                let len = rng.random_range(1..40_000usize);
                let off = rng.random_range(0..size - len);
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                let mut m = model.lock();
                pool.write_at(off as u64, &data).unwrap();
                m[off..off + len].copy_from_slice(&data);
                n += 1;
            }
        })
    };
    let reader = {
        let (pool, model, stop) = (pool.clone(), model.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(8);
            while !stop.load(Ordering::Relaxed) {
                let len = rng.random_range(1..200_000usize);
                let off = rng.random_range(0..size - len);
                let mut got = vec![0u8; len];
                let m = model.lock();
                pool.read_at(off as u64, &mut got).unwrap();
                assert!(
                    got == m[off..off + len],
                    "read during rebuild differs at {off}+{len}"
                );
            }
        })
    };
    let mut calls = 0;
    // Fixed batches (the rebuild adapts its batch to client load otherwise), so the count of
    // batches below is known.
    pool.array().set_rebuild_batch_rows(256);
    assert!(pool.rebuild(None, |_, _| calls += 1).unwrap());
    assert!(calls >= 4, "the rebuild reported progress {calls} times");
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    reader.join().unwrap();
    assert_eq!(pool.state(), "online");
    let mut got = vec![0u8; size];
    pool.read_at(0, &mut got).unwrap();
    assert!(got == *model.lock(), "data differs after the rebuild");
    assert_eq!(pool.scrub(false, |_, _| {}).unwrap().mismatches, 0);
    // The rebuilt members alone must carry the data: fail others up to the tolerance.
    let others: Vec<usize> = (0..n)
        .filter(|m| !fail.contains(m))
        .take(fail.len())
        .collect();
    for &m in &others {
        pool.array().fail_member(m, &std::io::Error::other("test"));
    }
    pool.read_at(0, &mut got).unwrap();
    assert!(
        got == *model.lock(),
        "data differs when read through the rebuilt members"
    );
}

#[test]
fn raid6_two_members_rebuilt_in_batches() {
    rebuild_under_load(Level::Raid6, 6, None, &[1, 4]);
}

#[test]
fn raid5_rebuilt_in_batches() {
    rebuild_under_load(Level::Raid5, 5, None, &[0]);
}

#[test]
fn raid10_rebuilt_in_batches() {
    rebuild_under_load(Level::Raid10, 4, None, &[3]);
}

#[test]
fn raid60_rebuilt_in_batches() {
    rebuild_under_load(Level::Raid60, 8, Some(4), &[2, 5]);
}

/// The rebuild reports a row reached (its progress, and the checkpoint saved from it) only once
/// every row before it is written to the new member: with three batches in flight the write
/// trails the computation, and a checkpoint ahead of the writes would skip rows after a restart.
#[test]
fn progress_never_runs_ahead_of_the_rows_written() {
    let (pool, names, drives) = pool_and_drives(Level::Raid10, 4, None);
    let size = pool.array().size_bytes() as usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let data: Vec<u8> = (0..size).map(|_| rng.random()).collect();
    pool.write_at(0, &data).unwrap();
    // Member 3 mirrors member 2; the rebuild copies 2's strips onto the new drive.
    pool.array().fail_member(3, &std::io::Error::other("test"));
    let new = Arc::new(FaultyDrive::new("n3", DATA_OFFSET + STRIP * ROWS));
    pool.replace_with(&names[3], &PathBuf::from("n3"), new.clone())
        .unwrap();
    // Small batches: many windows in flight one after another.
    pool.array().set_rebuild_batch_rows(7);
    let member = |d: &FaultyDrive, rows: u64| {
        let mut b = vec![0u8; (rows * STRIP) as usize];
        d.read_at(&mut b, DATA_OFFSET).unwrap();
        b
    };
    let (mut reports, mut last) = (0, 0);
    assert!(pool
        .rebuild(None, |row, _| {
            assert!(row >= last, "progress went back from row {last} to {row}");
            last = row;
            reports += 1;
            assert!(
                member(&new, row) == member(&drives[2], row),
                "row {row} reported before the rows under it were written"
            );
        })
        .unwrap());
    assert!(reports >= ROWS / 7, "only {reports} progress reports");
    assert!(member(&new, ROWS) == member(&drives[2], ROWS));
}
