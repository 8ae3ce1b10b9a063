//! The allocation map against a model: random writes, trims, zeroes, reads, flushes, reopens
//! and crashes; a new volume reads as zeroes (also where a deleted one lay) without touching
//! the drives; the map survives a restart.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use millrace_block::{BlockDevice, MemBlockDevice};
use millrace_volume::Volumes;
use proptest::prelude::*;

const STRIPE: u64 = 64 << 10;

/// A pool stand-in whose full stripe is `STRIPE`; it counts the bytes read from it and the
/// bytes discarded (deallocated, as the array does with whole stripes); its discards can be
/// made to fail.
struct Pool {
    mem: MemBlockDevice,
    read_bytes: AtomicU64,
    discarded: AtomicU64,
    failing_discards: AtomicBool,
}
impl BlockDevice for Pool {
    fn size_bytes(&self) -> u64 {
        self.mem.size_bytes()
    }
    fn preferred_io_bytes(&self) -> u64 {
        STRIPE
    }
    fn read_at(&self, o: u64, b: &mut [u8]) -> io::Result<()> {
        self.read_bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
        self.mem.read_at(o, b)
    }
    fn write_at(&self, o: u64, d: &[u8]) -> io::Result<()> {
        self.mem.write_at(o, d)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn discard(&self, o: u64, len: u64) -> io::Result<()> {
        if self.failing_discards.load(Ordering::Relaxed) {
            return Err(io::Error::other(
                "injected: the drive refuses the deallocation",
            ));
        }
        self.discarded.fetch_add(len, Ordering::Relaxed);
        self.mem.write_zeroes(o, len)
    }
}

fn pool(size: u64) -> Arc<Pool> {
    Arc::new(Pool {
        mem: MemBlockDevice::new(size),
        read_bytes: AtomicU64::new(0),
        discarded: AtomicU64::new(0),
        failing_discards: AtomicBool::new(false),
    })
}

const VOL: u64 = 2 << 20;

#[derive(Debug, Clone)]
enum Op {
    Write(u64, u64, u8),
    Trim(u64, u64),
    Zero(u64, u64),
    Read(u64, u64),
    Flush,
    Reopen,
}

fn span() -> impl Strategy<Value = (u64, u64)> {
    // Lengths from a few bytes to several stripes, so ranges cover whole granules and parts.
    (0..VOL, 1u64..(4 * STRIPE)).prop_map(|(o, l)| (o, l.min(VOL - o)))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (span(), 1u8..255).prop_map(|((o, l), b)| Op::Write(o, l, b)),
        2 => span().prop_map(|(o, l)| Op::Trim(o, l)),
        1 => span().prop_map(|(o, l)| Op::Zero(o, l)),
        3 => span().prop_map(|(o, l)| Op::Read(o, l)),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Every read matches the model; what the map calls zero reads as zero; after a flush and a
    /// reopen nothing is lost.
    #[test]
    fn the_map_matches_a_model(ops in proptest::collection::vec(op(), 1..60)) {
        let dev = pool(16 << 20);
        let mut vols = Volumes::open(dev.clone()).unwrap();
        vols.create("a", VOL).unwrap();
        let mut v = vols.open_volume("a").unwrap();
        let mut model = vec![0u8; VOL as usize];
        for op in ops {
            match op {
                Op::Write(o, l, b) => {
                    v.write_at(o, &vec![b; l as usize]).unwrap();
                    model[o as usize..(o + l) as usize].fill(b);
                }
                Op::Trim(o, l) => {
                    v.discard(o, l).unwrap();
                    model[o as usize..(o + l) as usize].fill(0);
                }
                Op::Zero(o, l) => {
                    v.write_zeroes(o, l).unwrap();
                    model[o as usize..(o + l) as usize].fill(0);
                }
                Op::Read(o, l) => {
                    let mut b = vec![0u8; l as usize];
                    v.read_at(o, &mut b).unwrap();
                    prop_assert!(b[..] == model[o as usize..(o + l) as usize], "read {}+{} differs", o, l);
                }
                Op::Flush => v.flush().unwrap(),
                Op::Reopen => {
                    v.flush().unwrap();
                    drop(v);
                    vols = Volumes::open(dev.clone()).unwrap();
                    v = vols.open_volume("a").unwrap();
                }
            }
            // What the map reports as zero is zero in the model.
            let mut at = 0;
            for e in v.allocation(0, VOL).unwrap() {
                if e.zero {
                    prop_assert!(model[at as usize..(at + e.len) as usize].iter().all(|&b| b == 0),
                        "{}+{} is reported as zero but holds data", at, e.len);
                }
                at += e.len;
            }
            prop_assert_eq!(at, VOL);
        }
        let mut all = vec![0u8; VOL as usize];
        v.read_at(0, &mut all).unwrap();
        prop_assert!(all == model);
    }
}

#[test]
fn a_new_volume_reads_zeroes_without_touching_the_drives() {
    let dev = pool(16 << 20);
    let vols = Volumes::open(dev.clone()).unwrap();
    let info = vols.create("old", 4 << 20).unwrap();
    let v = vols.open_volume("old").unwrap();
    v.write_at(0, &vec![0x5a; 4 << 20]).unwrap();
    v.flush().unwrap();
    // The drive refuses delete's deallocation (or the server dies before it): the volume is
    // gone from the table, and its data is still on the drives.
    dev.failing_discards.store(true, Ordering::Relaxed);
    vols.delete("old").unwrap();
    dev.failing_discards.store(false, Ordering::Relaxed);
    let mut raw = vec![0u8; 4096];
    dev.mem.read_at(info.offset_bytes, &mut raw).unwrap();
    assert!(raw.iter().all(|&x| x == 0x5a), "the fault was not injected");

    // A new volume there must still read zeroes, because its map still says data there and
    // create deallocates what may hold data first.
    let vols = Volumes::open(dev.clone()).unwrap();
    let before_discard = dev.discarded.load(Ordering::Relaxed);
    let new = vols.create("new", 4 << 20).unwrap();
    assert_eq!(
        new.offset_bytes, info.offset_bytes,
        "made where the old one lay"
    );
    assert_eq!(
        dev.discarded.load(Ordering::Relaxed) - before_discard,
        4 << 20,
        "create deallocates what the failed delete left"
    );
    let v = vols.open_volume("new").unwrap();
    let before = dev.read_bytes.load(Ordering::Relaxed);
    let mut b = vec![1u8; 4 << 20];
    v.read_at(0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0), "the new volume shows old data");
    assert_eq!(
        dev.read_bytes.load(Ordering::Relaxed),
        before,
        "a fresh volume is read from the map, not the drives"
    );
    dev.mem.read_at(info.offset_bytes, &mut raw).unwrap();
    assert!(
        raw.iter().all(|&x| x == 0),
        "the old bytes are gone from the pool"
    );
    let ext = v.allocation(0, 4 << 20).unwrap();
    assert_eq!(ext.len(), 1);
    assert!(ext[0].zero);
    // A write to part of a stripe leaves the rest of it as zeroes.
    v.write_at(100, b"new data").unwrap();
    let mut s = vec![1u8; STRIPE as usize];
    v.read_at(0, &mut s).unwrap();
    assert_eq!(&s[100..108], b"new data");
    assert!(s[..100].iter().chain(&s[108..]).all(|&x| x == 0));
}

#[test]
fn create_and_delete_deallocate_only_what_was_written() {
    let dev = pool(16 << 20);
    let vols = Volumes::open(dev.clone()).unwrap();
    let discarded = || dev.discarded.load(Ordering::Relaxed);
    // The first volume in fresh space deallocates all of it: what the drives held is unknown.
    vols.create("a", 4 << 20).unwrap();
    assert_eq!(discarded(), 4 << 20);
    vols.delete("a").unwrap();
    assert_eq!(
        discarded(),
        4 << 20,
        "a volume never written gives back nothing"
    );
    vols.create("b", 4 << 20).unwrap();
    assert_eq!(
        discarded(),
        4 << 20,
        "space known to be blank is not deallocated again"
    );
    let v = vols.open_volume("b").unwrap();
    v.write_at(3 * STRIPE + 5, &[7u8; 10]).unwrap();
    v.flush().unwrap();
    vols.delete("b").unwrap();
    assert_eq!(discarded(), (4 << 20) + STRIPE, "only the written stripe");
    // And it stays so across a restart.
    let vols = Volumes::open(dev.clone()).unwrap();
    vols.create("c", 4 << 20).unwrap();
    assert_eq!(discarded(), (4 << 20) + STRIPE);
    let mut b = vec![1u8; 4 << 20];
    vols.open_volume("c").unwrap().read_at(0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0));
}

/// The newest copy of the volume table: (its offset, its JSON).
fn newest_table(dev: &Pool) -> (u64, serde_json::Value) {
    let mut best = (0, 0, serde_json::Value::Null);
    for slot in [0u64, 1 << 20] {
        let mut h = [0u8; 32];
        dev.mem.read_at(slot, &mut h).unwrap();
        let gen = u64::from_le_bytes(h[16..24].try_into().unwrap());
        let len = u32::from_le_bytes(h[24..28].try_into().unwrap()) as usize;
        if &h[..8] == b"MRVOLTB1" && gen >= best.0 {
            let mut j = vec![0u8; len];
            dev.mem.read_at(slot + 32, &mut j).unwrap();
            best = (gen, slot, serde_json::from_slice(&j).unwrap());
        }
    }
    (best.1, best.2)
}

/// Rewrites the newest copy of the volume table with `json`.
fn rewrite_table(dev: &Pool, slot: u64, json: &serde_json::Value) {
    let j = serde_json::to_vec(json).unwrap();
    let mut h = [0u8; 32];
    dev.mem.read_at(slot, &mut h).unwrap();
    h[24..28].copy_from_slice(&(j.len() as u32).to_le_bytes());
    h[28..32].copy_from_slice(&crc32c::crc32c(&j).to_le_bytes());
    let mut buf = h.to_vec();
    buf.extend_from_slice(&j);
    buf.resize(buf.len().div_ceil(4096) * 4096, 0);
    dev.mem.write_at(slot, &buf).unwrap();
}

#[test]
fn a_map_made_before_free_space_was_tracked_deallocates_it_once() {
    let dev = pool(16 << 20);
    let vols = Volumes::open(dev.clone()).unwrap();
    let filler = vols.create("filler", 4 << 20).unwrap();
    vols.delete("filler").unwrap();
    drop(vols);
    // As an older Millrace left it: the free space clear in the map, whatever the drives hold
    // there (here, old bytes), and no word in the table that the free space is tracked.
    dev.mem
        .write_at(filler.offset_bytes, &vec![0x66; 4 << 20])
        .unwrap();
    let (slot, mut table) = newest_table(&dev);
    assert_eq!(table["gaps_tracked"], true, "{table}");
    table.as_object_mut().unwrap().remove("gaps_tracked");
    rewrite_table(&dev, slot, &table);

    let vols = Volumes::open(dev.clone()).unwrap();
    let before = dev.discarded.load(Ordering::Relaxed);
    let v = vols.create("v", 4 << 20).unwrap();
    assert_eq!(v.offset_bytes, filler.offset_bytes);
    assert_eq!(dev.discarded.load(Ordering::Relaxed) - before, 4 << 20);
    let h = vols.open_volume("v").unwrap();
    h.write_at(10, b"x").unwrap();
    let mut s = vec![1u8; STRIPE as usize];
    h.read_at(0, &mut s).unwrap();
    assert_eq!(s[10], b'x');
    assert!(
        s.iter().enumerate().all(|(i, &x)| i == 10 || x == 0),
        "old bytes show through a fresh volume"
    );
    assert_eq!(newest_table(&dev).1["gaps_tracked"], true);
}

#[test]
fn allocation_survives_a_restart_and_a_crash_errs_towards_data() {
    let dev = pool(16 << 20);
    let vols = Volumes::open(dev.clone()).unwrap();
    vols.create("a", 4 << 20).unwrap();
    let v = vols.open_volume("a").unwrap();
    v.write_at(STRIPE, &[9u8; 100]).unwrap();
    v.flush().unwrap();
    // Written after the flush, never flushed: after a "crash" it may read either way.
    v.write_at(3 * STRIPE, &[8u8; 100]).unwrap();
    drop(v);
    drop(vols);
    let vols = Volumes::open(dev.clone()).unwrap();
    let v = vols.open_volume("a").unwrap();
    let ext = v.allocation(0, 4 << 20).unwrap();
    let runs: Vec<(u64, bool)> = ext.iter().map(|e| (e.len, e.zero)).collect();
    assert_eq!(runs[0], (STRIPE, true));
    assert_eq!(
        runs[1],
        (STRIPE, false),
        "the flushed write is data: {runs:?}"
    );
    let mut b = [0u8; 100];
    v.read_at(STRIPE, &mut b).unwrap();
    assert_eq!(b, [9u8; 100]);

    // A trim of the whole stripe clears it; before a flush the map on the drives still says
    // data (erring towards data), after one it says zero.
    v.discard(STRIPE, STRIPE).unwrap();
    let reopened = Volumes::open(dev.clone()).unwrap();
    let ext = reopened
        .open_volume("a")
        .unwrap()
        .allocation(STRIPE, STRIPE)
        .unwrap();
    assert!(!ext[0].zero, "a clear reached the drives before a flush");
    v.flush().unwrap();
    let reopened = Volumes::open(dev.clone()).unwrap();
    let ext = reopened
        .open_volume("a")
        .unwrap()
        .allocation(STRIPE, STRIPE)
        .unwrap();
    assert!(ext[0].zero);
}

#[tokio::test]
async fn async_face_follows_the_map() {
    use millrace_block::IoBuf;
    let dev = pool(16 << 20);
    let vols = Volumes::open(dev.clone()).unwrap();
    vols.create("a", 1 << 20).unwrap();
    let v = vols.open_volume("a").unwrap();
    let (r, _) = v
        .write_async(STRIPE + 10, IoBuf::from_slice(b"fua data"), true)
        .await;
    r.unwrap();
    // The FUA write to a fresh stripe committed the map: a restart sees it as data.
    let again = Volumes::open(dev.clone()).unwrap();
    let ext = again
        .open_volume("a")
        .unwrap()
        .allocation(STRIPE, STRIPE)
        .unwrap();
    assert!(!ext[0].zero);
    let (r, buf) = v
        .read_async(STRIPE, IoBuf::standalone(STRIPE as usize))
        .await;
    r.unwrap();
    assert_eq!(&buf[10..18], b"fua data");
    v.write_zeroes_async(0, 2 * STRIPE).await.unwrap();
    v.flush_async().await.unwrap();
    let (r, buf) = v.read_async(0, buf).await;
    r.unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    assert!(v.allocation(0, 1 << 20).unwrap().iter().all(|e| e.zero));
}
