//! A server shutting down stops a rebuild mid-way: the rebuild records how far it got, the pool
//! closes cleanly, and after a restart the rebuild resumes from there and the data is whole.

use std::path::PathBuf;
use std::sync::Arc;

use millrace_array::superblock::MemberState;
use millrace_array::{CreateOptions, Level, Pool};
use rand::{Rng, SeedableRng};

#[test]
fn a_stopped_rebuild_resumes_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = (0..6)
        .map(|i| dir.path().join(format!("d{i}.img")))
        .collect();
    let opts = CreateOptions {
        name: "stop".into(),
        level: Level::Raid6,
        strip: 64 << 10,
        group: None,
        data_offset: None,
        create_size: Some(96 << 20),
        force: false,
    };
    let pool = Arc::new(Pool::create(&opts, &paths).unwrap());
    let size = pool.array().size_bytes() as usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let model: Vec<u8> = (0..size).map(|_| rng.random()).collect();
    pool.write_at(0, &model).unwrap();
    pool.fail(&paths[2]).unwrap();
    let new = dir.path().join("n2.img");
    std::fs::File::create(&new)
        .unwrap()
        .set_len(96 << 20)
        .unwrap();
    pool.replace(&paths[2], &new, false).unwrap();
    let rows = pool.array().geometry().rows();

    // Slow enough (8 MiB/s) that the stop lands in the middle.
    let p = pool.clone();
    let t = std::thread::spawn(move || p.rebuild(Some(8 << 20), |_, _| {}));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    pool.stop_work();
    let e = t.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("stopped"), "{e}");
    let at = pool.superblock().rebuild_checkpoint;
    assert!(at > 0 && at < rows, "checkpoint {at} of {rows} rows");
    pool.close().unwrap();
    drop(pool);

    let mut drives = paths.clone();
    drives[2] = new;
    let (mut pools, _) = Pool::import(&drives).unwrap();
    let pool = pools.remove(0);
    assert_eq!(
        pool.superblock().rebuild_checkpoint,
        at,
        "the checkpoint survived the restart"
    );
    assert!(pool.rebuild(None, |_, _| {}).unwrap());
    assert!(pool
        .array()
        .member_states()
        .iter()
        .all(|s| *s == MemberState::Online));
    let mut back = vec![0u8; size];
    pool.read_at(0, &mut back).unwrap();
    assert!(back == model, "data differs after the resumed rebuild");
    let rep = pool.scrub(false, |_, _| {}).unwrap();
    assert_eq!(rep.mismatches, 0);
    pool.close().unwrap();
}
