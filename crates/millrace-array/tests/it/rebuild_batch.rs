//! The rebuild adapts its batch to client load (issue #21): it grows to its largest while the
//! pool is idle, shrinks to its smallest while clients work (so their requests wait less behind
//! the rebuild's row locks), and grows back once they stop. The load is a client read made
//! between batches (in the progress callback), so the schedule is exact, not timed; each
//! batch's size is what the reported rows advance by.

use std::path::PathBuf;
use std::sync::Arc;

use millrace_array::drive::Drive;
use millrace_array::fault::FaultyDrive;
use millrace_array::{CreateOptions, Level, Pool};

const STRIP: u64 = 64 << 10;
const ROWS: u64 = 512;
const DATA_OFFSET: u64 = 1 << 20;

/// A pool of `n` members in memory, `rows` rows each: the pool, its members' names and size.
fn pool_in_memory(n: usize, level: Level, rows: u64) -> (Pool, Vec<PathBuf>, u64) {
    let names: Vec<PathBuf> = (0..n).map(|i| PathBuf::from(format!("d{i}"))).collect();
    let size = DATA_OFFSET + STRIP * rows;
    let drives: Vec<Arc<dyn Drive>> = names
        .iter()
        .map(|p| Arc::new(FaultyDrive::new(p.display().to_string(), size)) as Arc<dyn Drive>)
        .collect();
    let opts = CreateOptions {
        name: "b".into(),
        level,
        strip: STRIP,
        group: None,
        data_offset: Some(DATA_OFFSET),
        create_size: None,
        force: false,
    };
    let pool = Pool::create_on(&opts, &names, drives, true).unwrap();
    (pool, names, size)
}

#[test]
fn rebuild_batch_shrinks_under_client_load_and_grows_back_when_idle() {
    let (pool, names, size) = pool_in_memory(4, Level::Raid5, ROWS);
    let model: Vec<u8> = (0..pool.array().size_bytes())
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    pool.write_at(0, &model).unwrap();
    pool.array().fail_member(2, &std::io::Error::other("test"));
    let fresh = Arc::new(FaultyDrive::new("n2", size));
    pool.replace_with(&names[2], &PathBuf::from("n2"), fresh)
        .unwrap();
    let (min, first, max) = pool.array().rebuild_batch_bounds();
    assert!(min < first && first < max, "bounds {min} {first} {max}");

    // Callbacks 0..4 idle, 4..10 with a client read each, then idle to the end.
    let mut rows_at = vec![0u64];
    let mut buf = vec![0u8; 4096];
    let mut calls = 0;
    assert!(pool
        .rebuild(None, |row, _| {
            rows_at.push(row);
            if (4..10).contains(&calls) {
                pool.read_at(row * 4096 % (ROWS * 4096), &mut buf).unwrap();
            }
            calls += 1;
        })
        .unwrap());
    let sizes: Vec<u64> = rows_at.windows(2).map(|w| w[1] - w[0]).collect();
    // Callback i follows batch i's write, and batch i + 5 has the size it chooses: the four
    // after batch i are under way (one written, one computed, two read).
    let before = &sizes[..9];
    let loaded = &sizes[9..15];
    let after = &sizes[15..sizes.len() - 1];
    assert_eq!(
        before.iter().max(),
        Some(&max),
        "idle: grows to the largest batch ({sizes:?})"
    );
    assert!(
        loaded.windows(2).all(|w| w[1] <= w[0]),
        "under load: never grows ({sizes:?})"
    );
    assert_eq!(
        loaded.last(),
        Some(&min),
        "under load: shrinks to the smallest batch ({sizes:?})"
    );
    assert_eq!(
        after.iter().max(),
        Some(&max),
        "idle again: grows back to the largest ({sizes:?})"
    );
    let mut got = vec![0u8; model.len()];
    pool.read_at(0, &mut got).unwrap();
    assert!(got == model, "data differs after the rebuild");
    let rep = pool.scrub(false, |_, _| {}).unwrap();
    assert_eq!(rep.mismatches, 0, "{rep:?}");
}

/// The rebuild's windows in flight (five) and its two reader threads' spare buffers fit the
/// memory it is given (issue #15: the server gives it the buffer pool's size); an idle rebuild
/// of 16 members held 417 MiB with windows grown to 4 MiB a member.
#[test]
fn rebuild_windows_fit_the_memory_given() {
    let n = 16;
    let (pool, _, _) = pool_in_memory(n, Level::Raid6, 64);
    let a = pool.array();
    let row = STRIP * n as u64;
    let spares = 2 * (32u64 << 20);
    // The default, 256 MiB: windows up to what a reader's 32 MiB of spares holds whole (32
    // rows of 16 x 64 KiB), where 4 members grow to 64 rows.
    let (min, first, max) = a.rebuild_batch_bounds();
    assert_eq!((min, first, max), (2, 16, 32));
    assert!(5 * max * row + spares <= 256 << 20);
    // A smaller budget: eight rows a window at most.
    a.set_rebuild_memory(spares + 5 * 8 * row);
    assert_eq!(a.rebuild_batch_bounds(), (2, 8, 8));
    // Less than one row's windows still rebuilds, a row at a time.
    a.set_rebuild_memory(1 << 20);
    assert_eq!(a.rebuild_batch_bounds(), (1, 1, 1));
}
