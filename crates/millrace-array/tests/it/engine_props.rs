//! Property tests: random unaligned writes, reads and flushes against an in-memory model, for
//! every level; then the drives are read directly and checked with the independent reference
//! (layout and parity), so the engine cannot agree with itself by mistake.

use crate::common::{pattern, rig};
use millrace_array::Level;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    Write { at: f64, len: usize, seed: u64 },
    Read { at: f64, len: usize },
    Flush,
}

fn step(max_len: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0.0..1.0f64, 1..max_len, any::<u64>()).prop_map(|(at, len, seed)| Step::Write { at, len, seed }),
        3 => (0.0..1.0f64, 1..max_len).prop_map(|(at, len)| Step::Read { at, len }),
        1 => Just(Step::Flush),
    ]
}

fn run(level: Level, n: usize, group: Option<usize>, steps: &[Step]) -> Result<(), TestCaseError> {
    let r = rig(level, n, group, 4096, 6);
    let size = r.array.size_bytes() as usize;
    let mut model = vec![0u8; size];
    for s in steps {
        match *s {
            Step::Write { at, len, seed } => {
                let off = ((at * size as f64) as usize).min(size - 1);
                let len = len.min(size - off);
                let data = pattern(seed, len);
                r.array.write_at(off as u64, &data).unwrap();
                model[off..off + len].copy_from_slice(&data);
            }
            Step::Read { at, len } => {
                let off = ((at * size as f64) as usize).min(size - 1);
                let len = len.min(size - off);
                let mut buf = vec![0u8; len];
                r.array.read_at(off as u64, &mut buf).unwrap();
                prop_assert!(
                    buf == model[off..off + len],
                    "read {}+{} differs from the model",
                    off,
                    len
                );
            }
            Step::Flush => r.array.flush().unwrap(),
        }
    }
    let mut all = vec![0u8; size];
    r.array.read_at(0, &mut all).unwrap();
    prop_assert!(all == model, "whole-pool read differs from the model");
    prop_assert!(
        r.logical_from_drives() == model,
        "the drives' layout differs from md's left-symmetric layout"
    );
    if let Err(e) = r.check_redundancy() {
        return Err(TestCaseError::fail(e));
    }
    Ok(())
}

fn cfg() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn raid0(steps in prop::collection::vec(step(40_000), 1..40)) { run(Level::Raid0, 3, None, &steps)?; }
    #[test]
    fn raid1(steps in prop::collection::vec(step(20_000), 1..40)) { run(Level::Raid1, 3, None, &steps)?; }
    #[test]
    fn raid10(steps in prop::collection::vec(step(40_000), 1..40)) { run(Level::Raid10, 6, None, &steps)?; }
    #[test]
    fn raid5(steps in prop::collection::vec(step(40_000), 1..40)) { run(Level::Raid5, 5, None, &steps)?; }
    #[test]
    fn raid6(steps in prop::collection::vec(step(40_000), 1..40)) { run(Level::Raid6, 6, None, &steps)?; }
    #[test]
    fn raid6_narrow(steps in prop::collection::vec(step(20_000), 1..40)) { run(Level::Raid6, 4, None, &steps)?; }
    #[test]
    fn raid50(steps in prop::collection::vec(step(60_000), 1..40)) { run(Level::Raid50, 6, Some(3), &steps)?; }
    #[test]
    fn raid60(steps in prop::collection::vec(step(60_000), 1..40)) { run(Level::Raid60, 8, Some(4), &steps)?; }
}

/// Threads write interleaved sectors of the same stripes at once: every write is a partial
/// stripe update racing with others on its stripe. Without stripe locks parity goes wrong.
#[test]
fn concurrent_partial_writes_keep_parity_right() {
    for (level, n, g) in [
        (Level::Raid5, 4, None),
        (Level::Raid6, 6, None),
        (Level::Raid60, 8, Some(4)),
    ] {
        let r = rig(level, n, g, 4096, 16);
        let size = r.array.size_bytes() as usize;
        let sectors = size / 4096;
        let threads = 4;
        std::thread::scope(|s| {
            for t in 0..threads {
                let a = &r.array;
                s.spawn(move || {
                    for round in 0..3u64 {
                        for sec in (t..sectors).step_by(threads) {
                            let data = pattern(round * 1_000_003 + sec as u64, 4096);
                            a.write_at((sec * 4096) as u64, &data).unwrap();
                        }
                    }
                });
            }
        });
        let mut want = vec![0u8; size];
        for sec in 0..sectors {
            want[sec * 4096..(sec + 1) * 4096]
                .copy_from_slice(&pattern(2 * 1_000_003 + sec as u64, 4096));
        }
        let mut got = vec![0u8; size];
        r.array.read_at(0, &mut got).unwrap();
        assert!(got == want, "{level}: data differs after concurrent writes");
        r.check_redundancy()
            .unwrap_or_else(|e| panic!("{level}: {e}"));
    }
}

/// A member taken out of service: reads come from redundancy, writes keep working, and the
/// result matches the model.
#[test]
fn degraded_reads_and_writes_match_the_model() {
    for (level, n, g, fail) in [
        (Level::Raid1, 2, None, vec![0]),
        (Level::Raid10, 4, None, vec![1, 2]),
        (Level::Raid5, 4, None, vec![2]),
        (Level::Raid6, 6, None, vec![0, 4]),
        (Level::Raid50, 6, Some(3), vec![1, 3]),
        (Level::Raid60, 8, Some(4), vec![0, 1, 6, 7]),
    ] {
        let r = rig(level, n, g, 4096, 8);
        let size = r.array.size_bytes() as usize;
        let mut model = pattern(7, size);
        r.array.write_at(0, &model).unwrap();
        for &m in &fail {
            assert!(r.array.fail_member(m, &std::io::Error::other("test")));
        }
        let mut got = vec![0u8; size];
        r.array.read_at(0, &mut got).unwrap();
        assert!(got == model, "{level}: degraded read differs");
        for (i, (off, len)) in [
            (100usize, 5000usize),
            (4096 * 3, 4096),
            (size / 2 + 7, 30_000),
        ]
        .into_iter()
        .enumerate()
        {
            let len = len.min(size - off);
            let d = pattern(100 + i as u64, len);
            r.array.write_at(off as u64, &d).unwrap();
            model[off..off + len].copy_from_slice(&d);
        }
        r.array.read_at(0, &mut got).unwrap();
        assert!(got == model, "{level}: read after degraded writes differs");
    }
}

#[test]
fn too_many_failures_take_the_pool_offline_instead_of_returning_wrong_data() {
    let r = rig(Level::Raid5, 4, None, 4096, 4);
    r.array.write_at(0, &pattern(1, 8192)).unwrap();
    r.array.fail_member(0, &std::io::Error::other("test"));
    r.array.fail_member(1, &std::io::Error::other("test"));
    let mut buf = vec![0u8; 4096];
    let e = r.array.read_at(40960, &mut buf).unwrap_err().to_string();
    assert!(e.contains("offline"), "{e}");
    assert!(r.array.write_at(0, &[1, 2, 3]).is_err());
}
