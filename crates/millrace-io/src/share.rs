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

/// Buffers of at most this many bytes are small: they take the share's small lane.
pub const SMALL: u32 = 128 << 10;

/// One peer's share: two semaphores of bytes, one for large buffers and a smaller lane for
/// small ones (at most [`SMALL`] bytes). A peer's connections take from one share in arrival
/// order, so without the lane a 4 KiB request would wait behind the large transfers its own
/// peer's other connections announced and stalled (until the payload timeout frees them):
/// with it, stalled large transfers delay only large ones. The peer may hold its share and
/// an eighth more in small buffers.
#[derive(Clone)]
pub struct Share {
    large: Arc<Semaphore>,
    small: Arc<Semaphore>,
}

impl Share {
    /// A share of `bytes` that belongs to no map (one connection's own bound).
    pub fn new(bytes: usize) -> Share {
        let bytes = bytes.min(Semaphore::MAX_PERMITS);
        let small = (bytes / 8)
            .max(2 * SMALL as usize)
            .min(Semaphore::MAX_PERMITS);
        Share {
            large: Arc::new(Semaphore::new(bytes)),
            small: Arc::new(Semaphore::new(small)),
        }
    }

    fn lane(&self, bytes: u32) -> &Arc<Semaphore> {
        match bytes <= SMALL {
            true => &self.small,
            false => &self.large,
        }
    }

    /// Waits until a buffer of `len` bytes fits in the share, and holds its bytes.
    pub async fn take(&self, len: usize) -> Held {
        self.take_bytes(charge(len)).await
    }

    /// Waits until `bytes` (already a charge, or 0) fit in the share, and holds them. Where
    /// they fit now, without building a wait's future (most requests).
    pub async fn take_bytes(&self, bytes: u32) -> Held {
        let lane = self.lane(bytes);
        if let Ok(h) = lane.clone().try_acquire_many_owned(bytes) {
            return h;
        }
        (lane.clone().acquire_many_owned(bytes).await).expect("a share is never closed")
    }

    /// Holds the bytes of a buffer of `len` bytes if they fit now (and nobody waits).
    pub fn try_take(&self, len: usize) -> Option<Held> {
        let bytes = charge(len);
        self.lane(bytes).clone().try_acquire_many_owned(bytes).ok()
    }

    /// Bytes of the share's large lane free now.
    pub fn available(&self) -> usize {
        self.large.available_permits()
    }

    /// Whether `self` and `other` are the same share.
    pub fn same(&self, other: &Share) -> bool {
        Arc::ptr_eq(&self.large, &other.large)
    }
}

/// A share as the map keeps it: alive while a connection holds the share itself.
type WeakShare = (Weak<Semaphore>, Weak<Semaphore>);

/// The shares of the peers connected now, by key: a share lives while any connection of its
/// peer holds it, so a peer that comes back starts afresh and the map holds only live peers.
pub struct Shares<K> {
    map: Mutex<HashMap<K, WeakShare>>,
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
        if let Some((large, small)) = m.get(&key) {
            if let (Some(large), Some(small)) = (large.upgrade(), small.upgrade()) {
                return Share { large, small };
            }
        }
        m.retain(|_, (w, _)| w.strong_count() > 0);
        let s = Share::new(bytes);
        m.insert(key, (Arc::downgrade(&s.large), Arc::downgrade(&s.small)));
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

    #[tokio::test]
    async fn small_buffers_never_wait_behind_stalled_large_ones() {
        let share = Share::new(64 << 20);
        // Two 32 MiB transfers fill the large lane; a third waits for one of them.
        let held = [share.take(32 << 20).await, share.take(32 << 20).await];
        let waiting = {
            let s = share.clone();
            tokio::spawn(async move { s.take(32 << 20).await })
        };
        tokio::task::yield_now().await;
        // A 4 KiB request of the same peer is not behind it.
        let small = tokio::time::timeout(std::time::Duration::from_secs(1), share.take(4096))
            .await
            .expect("a small buffer is not queued behind a large one");
        assert!(!waiting.is_finished(), "the large lane is full");
        drop(held);
        let third = waiting.await.unwrap();
        drop((small, third));
        assert_eq!(share.available(), 64 << 20);
        // The small lane is bounded too: an eighth of the share.
        let mut smalls = Vec::new();
        while let Some(h) = share.try_take(SMALL as usize) {
            smalls.push(h);
        }
        assert_eq!(smalls.len() * SMALL as usize, 8 << 20);
    }
}
