//! Discard and write-zeroes on pools of drive files: the range reads back as zeroes, the data
//! around it is untouched, parity stays consistent (scrub finds nothing), and whole rows give
//! their space back to the filesystem (the drive files' allocated blocks shrink).

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;

use millrace_array::{CreateOptions, Level, Pool};
use millrace_block::BlockDevice;
use rand::{Rng, SeedableRng};

const STRIP: u64 = 64 << 10;
const MEMBER_BYTES: u64 = 64 << 20;

fn pool(dir: &std::path::Path, level: Level, n: usize) -> (Arc<Pool>, Vec<PathBuf>) {
    let paths: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("d{i}.img"))).collect();
    let opts = CreateOptions {
        name: "z".into(),
        level,
        strip: STRIP,
        group: None,
        data_offset: None,
        create_size: Some(MEMBER_BYTES),
        force: false,
    };
    (Arc::new(Pool::create(&opts, &paths).unwrap()), paths)
}

/// Bytes the drive files hold on the filesystem under them.
fn allocated(paths: &[PathBuf]) -> u64 {
    paths
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().blocks() * 512)
        .sum()
}

fn check(level: Level, n: usize, async_path: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (pool, paths) = pool(dir.path(), level, n);
    let a = pool.array().clone();
    let size = a.size_bytes();
    let fs = a.geometry().full_stripe_bytes();
    let mut rng = rand::rngs::StdRng::seed_from_u64(n as u64);
    let mut model: Vec<u8> = (0..size).map(|_| rng.random()).collect();
    a.write_at(0, &model).unwrap();
    a.flush().unwrap();
    let before = allocated(&paths);

    // A range with unaligned partial rows at both ends and many whole rows between.
    let (off, len) = (fs / 2 + 1000, 20 * fs + fs / 3);
    if async_path {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(BlockDevice::discard_async(a.as_ref(), off, len))
            .unwrap();
    } else {
        BlockDevice::write_zeroes(a.as_ref(), off, len).unwrap();
    }
    a.flush().unwrap();
    model[off as usize..(off + len) as usize].fill(0);
    let mut back = vec![0u8; size as usize];
    a.read_at(0, &mut back).unwrap();
    assert!(
        back == model,
        "{level}: the pool does not read back as the model"
    );

    let freed = before - allocated(&paths);
    // 19 or 20 whole rows are deallocated on every member (data and parity).
    let whole_rows = (off + len) / fs - off.div_ceil(fs);
    let expect = whole_rows * STRIP * n as u64;
    assert!(
        freed >= expect * 9 / 10 && freed <= expect + 2 * STRIP * n as u64,
        "{level}: {freed} bytes freed, expected about {expect}"
    );
    let rep = pool.scrub(false, |_, _| {}).unwrap();
    assert_eq!(rep.mismatches, 0, "{level}: scrub found parity wrong");
    assert_eq!(
        a.stats
            .deallocated_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
        whole_rows * fs
    );
}

#[test]
fn raid6_discard_frees_whole_rows_and_keeps_parity() {
    check(Level::Raid6, 6, false);
}

#[test]
fn raid5_discard_on_the_async_path() {
    check(Level::Raid5, 4, true);
}

#[test]
fn raid0_and_raid10_discard() {
    check(Level::Raid0, 3, false);
    check(Level::Raid10, 4, true);
}

#[test]
fn a_degraded_pool_writes_zeroes_instead() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, paths) = pool(dir.path(), Level::Raid6, 5);
    let a = pool.array().clone();
    let fs = a.geometry().full_stripe_bytes();
    let data = vec![0xa5u8; (8 * fs) as usize];
    a.write_at(0, &data).unwrap();
    pool.fail(&paths[1]).unwrap();
    BlockDevice::discard(a.as_ref(), fs, 4 * fs).unwrap();
    let mut back = vec![0u8; (8 * fs) as usize];
    a.read_at(0, &mut back).unwrap();
    let mut want = data.clone();
    want[fs as usize..(5 * fs) as usize].fill(0);
    assert!(
        back == want,
        "a degraded pool reads back wrong after a discard"
    );
}
