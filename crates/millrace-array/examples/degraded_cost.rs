//! What a degraded write costs the drives, counted rather than timed (so a loaded machine gives
//! the same answer): member writes, member flushes and bytes written per client write, healthy
//! and with one or two members failed, for whole-stripe and 4 KiB writes.
//!
//! `cargo run --release -p millrace-array --example degraded_cost` prints a Markdown table
//! (docs/PERFORMANCE.md quotes it). It uses only the public engine API (and, since the log's
//! records went FUA, `Drive::write_fua_at`; drop that method and its column to run it against
//! older versions for a before/after comparison).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use millrace_array::drive::{Drive, MemDrive};
use millrace_array::superblock::MemberState;
use millrace_array::{Array, Geometry, Level};

const STRIP: u64 = 64 << 10;
const ROWS: u64 = 64;
const DATA_OFFSET: u64 = 8 << 20;

#[derive(Default)]
struct Counts {
    writes: AtomicU64,
    bytes: AtomicU64,
    flushes: AtomicU64,
    fua: AtomicU64,
}

struct Counting {
    inner: MemDrive,
    c: Arc<Counts>,
}

impl Drive for Counting {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.c.writes.fetch_add(1, Ordering::Relaxed);
        self.c.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.c.flushes.fetch_add(1, Ordering::Relaxed);
        self.inner.flush()
    }
    fn write_fua_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.c.fua.fetch_add(1, Ordering::Relaxed);
        self.c.writes.fetch_add(1, Ordering::Relaxed);
        self.c.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.inner.write_fua_at(buf, offset)
    }
}

/// (member writes, of them FUA, flushes) per client write, and bytes written per client byte.
fn measure(level: Level, n: usize, failed: usize, len: u64) -> (f64, f64, f64, f64) {
    let c = Arc::new(Counts::default());
    let drives: Vec<Arc<dyn Drive>> = (0..n)
        .map(|i| {
            Arc::new(Counting {
                inner: MemDrive::new(format!("m{i}"), DATA_OFFSET + STRIP * ROWS),
                c: c.clone(),
            }) as Arc<dyn Drive>
        })
        .collect();
    let geo = Geometry::new(level, n, None, STRIP, STRIP * ROWS).unwrap();
    let a = Array::new(geo, DATA_OFFSET, drives, &vec![MemberState::Online; n]);
    for m in 0..failed {
        a.fail_member(m * 3 % n, &io::Error::other("bench"));
    }
    // One write first, so one-time costs (the bitmap's first mark) stay out of the count.
    a.write_at(0, &vec![1u8; len as usize]).unwrap();
    c.writes.store(0, Ordering::Relaxed);
    c.bytes.store(0, Ordering::Relaxed);
    c.flushes.store(0, Ordering::Relaxed);
    c.fua.store(0, Ordering::Relaxed);
    let size = a.size_bytes();
    let count = 48u64;
    let data = vec![7u8; len as usize];
    for i in 0..count {
        // Spread over the pool; whole-stripe writes stay aligned.
        let at = (i * 7919 * len) % (size - len) / len * len;
        a.write_at(at, &data).unwrap();
    }
    let per = |x: &AtomicU64| x.load(Ordering::Relaxed) as f64 / count as f64;
    let amp = c.bytes.load(Ordering::Relaxed) as f64 / (count * len) as f64;
    (per(&c.writes), per(&c.fua), per(&c.flushes), amp)
}

fn main() {
    println!("| pool | failed | write | member writes / write | of them FUA | flushes / write | bytes written / client byte |");
    println!("|---|---|---|---|---|---|---|");
    for (name, level, n) in [
        ("RAID6 x16", Level::Raid6, 16),
        ("RAID6 x8", Level::Raid6, 8),
        ("RAID5 x6", Level::Raid5, 6),
    ] {
        let k = n - if level == Level::Raid6 { 2 } else { 1 };
        let fs = STRIP * k as u64;
        let most = if level == Level::Raid6 { 2 } else { 1 };
        for failed in 0..=most {
            for (w, len) in [("full stripe", fs), ("4 KiB", 4096)] {
                let (wr, fua, fl, amp) = measure(level, n, failed, len);
                println!("| {name} | {failed} | {w} | {wr:.1} | {fua:.1} | {fl:.1} | {amp:.2} |");
            }
        }
    }
}
