//! Pools made by an older Millrace (superblock format version 1, with the whole-write journal
//! instead of the partial-parity log) open and convert: a journal record a crash left behind is
//! written in place at import, and the superblocks become version 2 at the first commit.

use std::path::PathBuf;
use std::sync::Arc;

use millrace_array::drive::Drive;
use millrace_array::fault::FaultyDrive;
use millrace_array::pool::read_superblock;
use millrace_array::{CreateOptions, Level, Pool};

const STRIP: u64 = 4096;
const ROWS: u64 = 8;
const DATA_OFFSET: u64 = 1 << 20;

fn drives(n: usize) -> Vec<(PathBuf, Arc<FaultyDrive>)> {
    (0..n)
        .map(|i| {
            let d = FaultyDrive::new(format!("d{i}"), DATA_OFFSET + STRIP * ROWS);
            (PathBuf::from(format!("d{i}")), Arc::new(d))
        })
        .collect()
}

fn create(ds: &[(PathBuf, Arc<FaultyDrive>)]) -> Pool {
    let opts = CreateOptions {
        name: "old".into(),
        level: Level::Raid5,
        strip: STRIP,
        group: None,
        data_offset: Some(DATA_OFFSET),
        create_size: None,
        force: false,
    };
    let names: Vec<PathBuf> = ds.iter().map(|d| d.0.clone()).collect();
    let dyns: Vec<Arc<dyn Drive>> = ds.iter().map(|d| d.1.clone() as _).collect();
    Pool::create_on(&opts, &names, dyns, true).unwrap()
}

fn import(ds: &[(PathBuf, Arc<FaultyDrive>)]) -> Pool {
    let v: Vec<(PathBuf, Arc<dyn Drive>)> = ds
        .iter()
        .map(|(p, d)| (p.clone(), d.clone() as _))
        .collect();
    Pool::import_drives(v, false).unwrap().0.remove(0)
}

/// Rewrites both superblock slots of every drive as format version 1, clean or not.
fn make_version_1(ds: &[(PathBuf, Arc<FaultyDrive>)], clean: bool) {
    for (_, d) in ds {
        let snap = d.snapshot();
        for slot in 0..2 {
            let mut b = snap[slot * 4096..(slot + 1) * 4096].to_vec();
            if &b[0..8] != b"MILLRACE" {
                continue;
            }
            b[8..12].copy_from_slice(&1u32.to_le_bytes());
            b[12..16].copy_from_slice(&(clean as u32).to_le_bytes());
            let crc = crc32c::crc32c(&b[..4092]);
            b[4092..].copy_from_slice(&crc.to_le_bytes());
            d.scribble((slot * 4096) as u64, &b);
        }
    }
}

fn format_of(d: &FaultyDrive) -> u32 {
    read_superblock(d).unwrap().unwrap().format
}

#[test]
fn a_version_1_pool_opens_and_converts_on_first_write() {
    let ds = drives(4);
    let pool = create(&ds);
    pool.write_at(0, &vec![1u8; 3 * STRIP as usize]).unwrap();
    pool.close().unwrap();
    drop(pool);
    make_version_1(&ds, true);
    let pool = import(&ds);
    assert_eq!(format_of(&ds[0].1), 1, "opening alone changes nothing");
    pool.write_at(0, &vec![2u8; 4096]).unwrap();
    assert_eq!(format_of(&ds[0].1), 2, "the first write converts");
    let mut got = vec![0u8; 3 * STRIP as usize];
    pool.read_at(0, &mut got).unwrap();
    assert!(got[..4096].iter().all(|&b| b == 2) && got[4096..].iter().all(|&b| b == 1));
}

#[test]
fn a_version_1_journal_record_is_replayed_at_import() {
    let ds = drives(4);
    let pool = create(&ds);
    let size = pool.array().size_bytes() as usize;
    pool.write_at(0, &vec![5u8; size]).unwrap();
    pool.close().unwrap();
    // What an older Millrace left after a crash in a degraded write of row 0's first strip:
    // the record (new data and its parity) is durable, the write in place never happened.
    let geo = *pool.array().geometry();
    let layout = geo.group_layout(0, 0);
    let (dm, pm) = (layout[0], layout[geo.group_data()]);
    let new = vec![9u8; STRIP as usize];
    let mut p = vec![0u8; STRIP as usize];
    for &m in &layout[..geo.group_data()] {
        let mut s = vec![0u8; STRIP as usize];
        pool.array().read_member_strip(m, 0, &mut s).unwrap();
        let s = if m == dm { new.clone() } else { s };
        p.iter_mut().zip(&s).for_each(|(a, b)| *a ^= b);
    }
    let entries = [
        millrace_array::journal::Entry {
            member: dm,
            offset: DATA_OFFSET,
            data: &new,
        },
        millrace_array::journal::Entry {
            member: pm,
            offset: DATA_OFFSET,
            data: &p,
        },
    ];
    let cap = millrace_array::journal::capacity(DATA_OFFSET);
    let rec = millrace_array::journal::encode(7, &entries, cap).unwrap();
    drop(pool);
    for (_, d) in &ds[..2] {
        d.scribble(millrace_array::journal::JOURNAL_OFFSET, &rec);
    }
    make_version_1(&ds, false);
    let pool = import(&ds);
    assert_eq!(format_of(&ds[0].1), 2, "recovery's commit converts");
    let mut got = vec![0u8; STRIP as usize];
    pool.read_at(0, &mut got).unwrap();
    assert!(got == new, "the version-1 journal record was not replayed");
    assert_eq!(pool.scrub(false, |_, _| {}).unwrap().mismatches, 0);
    // Retired: a second crash-free import finds nothing to replay.
    pool.close().unwrap();
    drop(pool);
    let pool = import(&ds);
    pool.read_at(0, &mut got).unwrap();
    assert!(got == new);
}
