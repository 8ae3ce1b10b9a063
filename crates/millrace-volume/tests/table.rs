//! The volume table against a simple model, and its survival of torn and lost writes.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use millrace_block::{BlockDevice, MemBlockDevice};
use millrace_volume::{VolumeError, Volumes, TABLE_AREA_BYTES};
use proptest::prelude::*;

const STRIPE: u64 = 192 << 10; // a 4-data-drive RAID with 48 KiB strips: not a power of two

/// A pool stand-in whose full stripe is `STRIPE`.
struct Pool(MemBlockDevice);
impl BlockDevice for Pool {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn preferred_io_bytes(&self) -> u64 {
        STRIPE
    }
    fn read_at(&self, o: u64, b: &mut [u8]) -> io::Result<()> {
        self.0.read_at(o, b)
    }
    fn write_at(&self, o: u64, d: &[u8]) -> io::Result<()> {
        self.0.write_at(o, d)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

fn pool(size: u64) -> Arc<Pool> {
    Arc::new(Pool(MemBlockDevice::new(size)))
}

#[derive(Debug, Clone)]
enum Op {
    Create(u8, u64),
    Delete(u8),
    Grow(u8, u64),
    Write(u8, u64, u8),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..6, size()).prop_map(|(n, s)| Op::Create(n, s)),
        1 => (0u8..6).prop_map(Op::Delete),
        1 => (0u8..6, size()).prop_map(|(n, s)| Op::Grow(n, s)),
        3 => (0u8..6, 0u64..(8 << 20), any::<u8>()).prop_map(|(n, o, b)| Op::Write(n, o, b)),
        1 => Just(Op::Reopen),
    ]
}

/// Sizes as a careless script or a hostile client sends them: mostly ones the pool can hold,
/// some near 2^64 (which once wrapped to a 0-byte volume, or a grow over the neighbours).
fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..(8 << 20),
        1 => (0u64..(1 << 24)).prop_map(|k| u64::MAX - k),
        1 => (0u32..64).prop_map(|b| 1u64 << b),
    ]
}

fn largest_gap(v: &Volumes) -> u64 {
    let mut spans: Vec<(u64, u64)> = v
        .list()
        .iter()
        .map(|v| (v.offset_bytes, v.offset_bytes + v.size_bytes))
        .collect();
    // The allocation map's area is taken too.
    let map = v.map_area_bytes().map_or(0, |(o, b)| {
        spans.push((o, o + b));
        b
    });
    spans.sort();
    let (mut at, mut best) = (v.data_start(), 0);
    for (s, e) in spans {
        best = best.max(s.saturating_sub(at));
        at = at.max(e);
    }
    best.max((v.data_start() + v.capacity() + map).saturating_sub(at))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Volumes never overlap each other or the table, stay stripe-aligned, survive reopening,
    /// and each volume's bytes are its own: a write to one never shows up in another.
    #[test]
    #[allow(clippy::map_entry)] // the model mirrors the order of checks the test reads best in
    fn volumes_match_a_model(ops in proptest::collection::vec(op(), 1..40)) {
        let dev = pool(24 << 20);
        let mut vols = Volumes::open(dev.clone()).unwrap();
        // model: name -> (size, the bytes written: offset -> byte)
        let mut model: BTreeMap<String, (u64, BTreeMap<u64, u8>)> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Create(n, s) => {
                    let name = format!("v{n}");
                    let r = vols.create(&name, s);
                    if model.contains_key(&name) {
                        prop_assert!(r.is_err());
                    } else if let Ok(info) = r {
                        prop_assert_eq!(Some(info.size_bytes), s.div_ceil(STRIPE).checked_mul(STRIPE));
                        model.insert(name, (info.size_bytes, BTreeMap::new()));
                    } else {
                        // refused only when no free range holds it
                        let need = s.div_ceil(STRIPE).saturating_mul(STRIPE);
                        prop_assert!(largest_gap(&vols) < need, "refused {} bytes with a gap of {}", need, largest_gap(&vols));
                    }
                }
                Op::Delete(n) => {
                    let name = format!("v{n}");
                    prop_assert_eq!(vols.delete(&name).is_ok(), model.remove(&name).is_some());
                }
                Op::Grow(n, s) => {
                    let name = format!("v{n}");
                    match (vols.grow(&name, s), model.get_mut(&name)) {
                        (Ok(info), Some(m)) => { prop_assert!(info.size_bytes >= m.0 && info.size_bytes >= s); m.0 = info.size_bytes; }
                        (Err(_), _) => {}
                        (Ok(_), None) => prop_assert!(false, "grew a volume that does not exist"),
                    }
                }
                Op::Write(n, o, b) => {
                    let name = format!("v{n}");
                    if let Some(m) = model.get_mut(&name) {
                        let v = vols.open_volume(&name).unwrap();
                        let r = v.write_at(o, &[b]);
                        prop_assert_eq!(r.is_ok(), o < m.0);
                        if o < m.0 { m.1.insert(o, b); }
                    }
                }
                // A restart: the old server closes (writing its allocation map) before the new
                // one reads the table.
                Op::Reopen => {
                    drop(vols);
                    vols = Volumes::open(dev.clone()).unwrap();
                }
            }
            let list = vols.list();
            prop_assert_eq!(list.iter().map(|v| v.name.clone()).collect::<Vec<_>>(), model.keys().cloned().collect::<Vec<_>>());
            let mut spans: Vec<(u64, u64)> = list.iter().map(|v| (v.offset_bytes, v.offset_bytes + v.size_bytes)).collect();
            spans.sort();
            for w in spans.windows(2) { prop_assert!(w[0].1 <= w[1].0, "volumes overlap: {:?}", spans); }
            prop_assert_eq!(vols.largest_free_bytes(), largest_gap(&vols));
            prop_assert_eq!(vols.free_bytes(), vols.capacity() - list.iter().map(|v| v.size_bytes).sum::<u64>());
            for v in &list {
                prop_assert_eq!(v.offset_bytes % STRIPE, 0);
                prop_assert!(v.offset_bytes >= TABLE_AREA_BYTES);
                prop_assert!(v.offset_bytes + v.size_bytes <= dev.size_bytes());
                prop_assert_eq!(v.size_bytes, model[&v.name].0);
            }
        }
        for (name, (_, bytes)) in &model {
            let v = vols.open_volume(name).unwrap();
            for (&o, &b) in bytes {
                let mut got = [0u8];
                v.read_at(o, &mut got).unwrap();
                prop_assert_eq!(got[0], b, "volume {} offset {}", name, o);
            }
        }
    }
}

#[test]
fn refusals_are_sentences() {
    let dev = pool(16 << 20);
    let v = Volumes::open(dev).unwrap();
    let msg = |e: VolumeError| e.to_string();
    assert!(msg(v.create("bad/name", 1 << 20).unwrap_err()).contains("not a valid volume name"));
    assert!(msg(v.create("a", 0).unwrap_err()).contains("size above zero"));
    v.create("a", 4 << 20).unwrap();
    assert!(msg(v.create("a", 1 << 20).unwrap_err()).contains("already exists"));
    let full = msg(v.create("huge", 1 << 40).unwrap_err());
    assert!(full.contains("no room") && full.contains("free"), "{full}");
    assert!(msg(v.delete("nope").unwrap_err()).contains("no volume named nope"));
    assert!(msg(v.grow("a", 1 << 20).unwrap_err()).contains("cannot shrink"));
    assert!(msg(v.grow("a", 1 << 40).unwrap_err()).contains("at most"));
}

#[test]
fn deleted_volume_refuses_io_and_grow_is_seen_by_open_handles() {
    let v = Volumes::open(pool(32 << 20)).unwrap();
    v.create("a", 1 << 20).unwrap();
    let h = v.open_volume("a").unwrap();
    let before = h.size_bytes();
    v.grow("a", 4 << 20).unwrap();
    assert!(h.size_bytes() > before);
    h.write_at(h.size_bytes() - 1, b"x").unwrap();
    v.delete("a").unwrap();
    let e = h.write_at(0, b"x").unwrap_err();
    assert!(e.to_string().contains("deleted"), "{e}");
}

#[test]
fn props_persist_and_raw_data_is_not_overwritten() {
    let dev = pool(16 << 20);
    let v = Volumes::open(dev.clone()).unwrap();
    v.create("a", 1 << 20).unwrap();
    v.set_prop("a", "export.nvme", Some("{\"hosts\":[]}"))
        .unwrap();
    let v = Volumes::open(dev.clone()).unwrap();
    assert_eq!(v.get("a").unwrap().props["export.nvme"], "{\"hosts\":[]}");
    v.set_prop("a", "export.nvme", None).unwrap();
    // Props given at creation are in the same table write as the volume.
    let tag = BTreeMap::from([("csi.name".to_string(), "pvc-1".to_string())]);
    v.create_with_props("b", 1 << 20, tag.clone()).unwrap();
    assert_eq!(
        Volumes::open(dev.clone()).unwrap().get("b").unwrap().props,
        tag
    );
    v.delete("b").unwrap();
    assert!(Volumes::open(dev)
        .unwrap()
        .get("a")
        .unwrap()
        .props
        .is_empty());

    // A pool written raw (`millrace io write`) is not silently turned into a volume table.
    let raw = pool(16 << 20);
    raw.write_at(100, b"precious").unwrap();
    let v = Volumes::open(raw.clone()).unwrap();
    assert!(v.holds_foreign_data());
    assert!(v
        .create("a", 1 << 20)
        .unwrap_err()
        .to_string()
        .contains("--force"));
    let mut b = [0u8; 8];
    raw.read_at(100, &mut b).unwrap();
    assert_eq!(&b, b"precious");
    v.claim().unwrap();
    v.create("a", 1 << 20).unwrap();
}

/// A device that loses every write after a point (a power cut in the middle of a table update
/// that tears the slot being written).
struct Torn {
    inner: Arc<Pool>,
    cut: AtomicBool,
}
impl BlockDevice for Torn {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn preferred_io_bytes(&self) -> u64 {
        STRIPE
    }
    fn read_at(&self, o: u64, b: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(o, b)
    }
    fn write_at(&self, o: u64, d: &[u8]) -> io::Result<()> {
        if self.cut.load(Ordering::SeqCst) {
            // Half the slot reaches the media, then the power goes.
            self.inner.write_at(o, &d[..d.len() / 2])?;
            return Err(io::Error::other("power cut"));
        }
        self.inner.write_at(o, d)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_torn_table_write_leaves_the_previous_table() {
    let base = pool(16 << 20);
    let dev = Arc::new(Torn {
        inner: base.clone(),
        cut: AtomicBool::new(false),
    });
    let v = Volumes::open(dev.clone()).unwrap();
    for i in 0..5 {
        v.create(&format!("v{i}"), 1 << 20).unwrap();
    }
    dev.cut.store(true, Ordering::SeqCst);
    // A big prop makes the JSON long enough that a half-written slot fails its checksum.
    let big = "x".repeat(20_000);
    assert!(v.set_prop("v0", "share", Some(&big)).is_err());
    // The failed commit is not half-applied in memory either.
    assert!(v.get("v0").unwrap().props.is_empty());
    let again = Volumes::open(base).unwrap();
    assert_eq!(again.list().len(), 5);
    assert!(again.get("v0").unwrap().props.is_empty());
}

/// A table on the drives that places two volumes over each other (written by something else,
/// or returned wrong by a drive) opens no volume at all, so neither can write over the other.
#[test]
fn a_table_with_overlapping_volumes_is_refused() {
    let dev = pool(16 << 20);
    let v = Volumes::open(dev.clone()).unwrap();
    let a = v.create("a", 1 << 20).unwrap();
    let b = v.create("b", 1 << 20).unwrap();
    drop(v);
    // The newest slot is generation 2 (slot 0); point b at a's start and reseal it.
    let mut slot = vec![0u8; 1 << 20];
    dev.read_at(0, &mut slot).unwrap();
    let len = u32::from_le_bytes(slot[24..28].try_into().unwrap()) as usize;
    let json = String::from_utf8(slot[32..32 + len].to_vec()).unwrap();
    let from = format!("\"offset_bytes\":{}", b.offset_bytes);
    let to = format!(
        "\"offset_bytes\":{:>width$}",
        a.offset_bytes,
        width = from.len() - 15
    );
    assert_eq!(from.len(), to.len());
    let json = json.replacen(&from, &to, 1);
    assert_ne!(json.as_bytes(), &slot[32..32 + len]);
    slot[32..32 + len].copy_from_slice(json.as_bytes());
    slot[28..32].copy_from_slice(&crc32c::crc32c(json.as_bytes()).to_le_bytes());
    dev.write_at(0, &slot).unwrap();
    let Err(e) = Volumes::open(dev) else {
        panic!("an overlapping table must be refused");
    };
    assert!(e.to_string().contains("over each other"), "{e}");
}
