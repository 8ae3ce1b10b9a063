//! Shares of the buffer pool. The pool bounds the payload memory of every connection together;
//! one peer (an NVMe host NQN, an NBD client address) may hold at most its share of it, so a
//! peer that announces large transfers and never completes them, or stops reading its socket,
//! keeps at most its share and the other peers' I/O goes on in the rest. A buffer's bytes are
//! taken from the share before the buffer is taken from the pool: a peer over its share waits
//! on its own semaphore, never in the pool's line ahead of other peers.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Weak};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::ALIGN;

/// Bytes of a share held for one buffer, given back when dropped (with the buffer).
pub type Held = OwnedSemaphorePermit;

/// The bytes a pool buffer for `len` bytes takes: a power-of-two run of 4 KiB pages, saturated
/// at what a semaphore can count in one acquire.
pub fn charge(len: usize) -> u32 {
    let pages = (len as u64).div_ceil(ALIGN as u64).max(1);
    (pages.next_power_of_two())
        .checked_mul(ALIGN as u64)
        .map_or(u32::MAX, |b| b.min(u32::MAX as u64) as u32)
}

/// One peer's share: a semaphore of bytes.
#[derive(Clone)]
pub struct Share(Arc<Semaphore>);

impl Share {
    /// A share of `bytes` that belongs to no map (one connection's own bound).
    pub fn new(bytes: usize) -> Share {
        Share(Arc::new(Semaphore::new(bytes.min(Semaphore::MAX_PERMITS))))
    }

    /// Waits until a buffer of `len` bytes fits in the share, and holds its bytes.
    pub async fn take(&self, len: usize) -> Held {
        self.take_bytes(charge(len)).await
    }

    /// Waits until `bytes` (already a charge, or 0) fit in the share, and holds them. Where
    /// they fit now, without building a wait's future (most requests).
    pub async fn take_bytes(&self, bytes: u32) -> Held {
        if let Ok(h) = self.0.clone().try_acquire_many_owned(bytes) {
            return h;
        }
        (self.0.clone().acquire_many_owned(bytes).await).expect("a share is never closed")
    }

    /// Holds the bytes of a buffer of `len` bytes if they fit now (and nobody waits).
    pub fn try_take(&self, len: usize) -> Option<Held> {
        self.0.clone().try_acquire_many_owned(charge(len)).ok()
    }

    /// Bytes of the share free now.
    pub fn available(&self) -> usize {
        self.0.available_permits()
    }

    /// Whether `self` and `other` are the same share.
    pub fn same(&self, other: &Share) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The shares of the peers connected now, by key: a share lives while any connection of its
/// peer holds it, so a peer that comes back starts afresh and the map holds only live peers.
pub struct Shares<K> {
    map: Mutex<HashMap<K, Weak<Semaphore>>>,
}

impl<K> Default for Shares<K> {
    fn default() -> Self {
        Shares {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash> Shares<K> {
    /// The share of peer `key`, `bytes` large when it is first made.
    pub fn of(&self, key: K, bytes: usize) -> Share {
        let mut m = self.map.lock();
        if let Some(s) = m.get(&key).and_then(Weak::upgrade) {
            return Share(s);
        }
        m.retain(|_, w| w.strong_count() > 0);
        let s = Share::new(bytes);
        m.insert(key, Arc::downgrade(&s.0));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charge_is_the_pools_run() {
        assert_eq!(charge(0), 4096);
        assert_eq!(charge(1), 4096);
        assert_eq!(charge(4096), 4096);
        assert_eq!(charge(4097), 8192);
        assert_eq!(charge(5 << 12), 8 << 12);
        assert_eq!(charge(32 << 20), 32 << 20);
        assert_eq!(charge(usize::MAX), u32::MAX, "saturates, never wraps");
    }

    #[test]
    fn one_share_per_peer_while_it_is_connected() {
        let s = Shares::default();
        let a = s.of("a", 1 << 20);
        assert!(a.same(&s.of("a", 1 << 20)), "same peer");
        assert!(!a.same(&s.of("b", 1 << 20)), "other peer");
        let held = a.try_take(512 << 10).unwrap();
        assert!(a.try_take(1 << 20).is_none(), "over the share");
        assert_eq!(a.available(), 512 << 10);
        drop(held);
        assert_eq!(a.available(), 1 << 20);
        drop(a);
        assert_eq!(
            s.of("a", 8192).available(),
            8192,
            "a peer that left starts afresh"
        );
    }
}
