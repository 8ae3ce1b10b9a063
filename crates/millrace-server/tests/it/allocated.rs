//! `pool show`'s allocated bytes (#17): what the volumes hold by the allocation map, and what
//! the drive files take, grow with writes and shrink when whole stripes are trimmed.

use std::path::PathBuf;
use std::sync::Arc;

use millrace_block::BlockDevice;
use millrace_server::model::{CreatePool, CreateVolume, PoolView};
use millrace_server::{service, State};

const MIB: u64 = 1 << 20;

fn view(s: &Arc<State>) -> PoolView {
    service::pool(s, "tank").unwrap()
}

#[test]
fn allocated_grows_with_writes_and_shrinks_with_trims() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    // The state's export services are tokio objects, even when they serve nothing.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _g = rt.enter();
    let s = Arc::new(State::open_offline(&home).unwrap());
    let drives: Vec<PathBuf> = (0..6)
        .map(|i| dir.path().join(format!("d{i}.img")))
        .collect();
    let req = CreatePool {
        name: "tank".into(),
        level: "raid6".into(),
        strip_bytes: Some(64 << 10),
        group: None,
        drives,
        create_size_bytes: Some(64 * MIB),
        data_offset_bytes: None,
        force: false,
    };
    service::create_pool(&s, req).unwrap();
    let vol = CreateVolume {
        name: "v".into(),
        size_bytes: 64 * MIB,
        force: false,
        props: Default::default(),
    };
    service::create_volume(&s, "tank", vol).unwrap();
    let before = view(&s);
    assert_eq!(before.allocated_bytes, 0, "a new volume holds no data");
    let files_before = before
        .member_allocated_bytes
        .expect("the members are files");

    let v = s.entry("tank").unwrap().volumes.open_volume("v").unwrap();
    let data: Vec<u8> = (0..32 * MIB).map(|i| (i % 251) as u8 + 1).collect();
    v.write_at(4 * MIB, &data).unwrap();
    v.flush().unwrap();
    let written = view(&s);
    // Whole full stripes (4 data strips of 64 KiB): the 32 MiB written, no more.
    assert_eq!(written.allocated_bytes, 32 * MIB);
    let files_written = written.member_allocated_bytes.unwrap();
    // Six drives for four strips of data: parity takes half as much again.
    assert!(
        files_written >= files_before + 48 * MIB,
        "the drive files grew from {files_before} to {files_written} bytes"
    );

    v.discard(4 * MIB, 16 * MIB).unwrap();
    v.flush().unwrap();
    let trimmed = view(&s);
    assert_eq!(trimmed.allocated_bytes, 16 * MIB);
    let files_trimmed = trimmed.member_allocated_bytes.unwrap();
    assert!(
        files_trimmed + 24 * MIB - MIB <= files_written,
        "trimming 16 MiB gave back {} bytes of drive files",
        files_written - files_trimmed
    );
    // What is left reads back; the trimmed part reads as zeroes.
    let mut back = vec![0u8; (32 * MIB) as usize];
    v.read_at(4 * MIB, &mut back).unwrap();
    let half = (16 * MIB) as usize;
    assert!(back[..half].iter().all(|&b| b == 0));
    assert!(back[half..] == data[half..]);
    drop(v);
    s.close().unwrap();
}
