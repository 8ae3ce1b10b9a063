//! What a crashed pool's drives may hold, shared by the crash tests (`crash_kill`, on drives the
//! test fails by hand, and `crash_ring`, on drive files behind io_uring).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

pub fn h(b: &[u8]) -> u64 {
    let mut s = DefaultHasher::new();
    b.hash(&mut s);
    s.finish()
}

/// What the pool may hold: `now` is what it holds with nothing in flight (writes in flight
/// together never share a sector, so their order does not matter), `durable` what it held at
/// the last flush that completed before the kill, and per sector every content written since.
pub struct Model {
    pub now: Vec<u8>,
    pub durable: Vec<u8>,
    /// Sector -> hashes of contents written since the last completed flush.
    pub since: HashMap<usize, Vec<u64>>,
}

impl Model {
    pub fn wrote(&mut self, off: usize, data: &[u8]) {
        self.now[off..off + data.len()].copy_from_slice(data);
        for s in off / 4096..(off + data.len()).div_ceil(4096) {
            let c = h(&self.now[s * 4096..(s + 1) * 4096]);
            self.since.entry(s).or_default().push(c);
        }
    }

    pub fn flushed(&mut self) {
        self.durable.clone_from(&self.now);
        self.since.clear();
    }

    pub fn check(&self, got: &[u8], ctx: &str) {
        for s in 0..got.len() / 4096 {
            let g = &got[s * 4096..(s + 1) * 4096];
            let ok = g == &self.durable[s * 4096..(s + 1) * 4096]
                || self.since.get(&s).is_some_and(|c| c.contains(&h(g)));
            if !ok {
                let (d, n) = (
                    &self.durable[s * 4096..][..4096],
                    &self.now[s * 4096..][..4096],
                );
                let same = |x: &[u8]| g.iter().zip(x).filter(|(a, b)| a == b).count();
                let runs: Vec<(usize, bool, bool)> = (0..4096 / 256)
                    .map(|i| {
                        let r = i * 256..(i + 1) * 256;
                        (i, g[r.clone()] == d[r.clone()], g[r.clone()] == n[r])
                    })
                    .collect();
                panic!(
                    "{ctx}: sector {s} holds neither its durable content nor one written since ({} of 4096 bytes as durable, {} as the latest; per 256 bytes (durable, latest): {runs:?})",
                    same(d),
                    same(n)
                );
            }
        }
    }
}
