//! Each host's share of the buffer pool. The pool bounds the data of every connection together;
//! one host (a host NQN, over every controller and queue it has) may hold at most its share of
//! it, so a host that stops reading its sockets keeps at most its share in completed reads
//! waiting to be sent, and the other hosts' I/O goes on in the rest (as NBD's per-client share,
//! crates/millrace-nbd/src/datapath.rs). A buffer's bytes are taken from the share before the
//! buffer is taken from the pool: a host over its share waits on its own semaphore, never in
//! the pool's line ahead of other hosts.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes of a host's share held for one buffer, given back when dropped (with the buffer).
pub type Held = OwnedSemaphorePermit;

/// The bytes a pool buffer for `len` bytes takes: a power-of-two run of 4 KiB pages.
pub fn charge(len: usize) -> u32 {
    let pages = (len as u64).div_ceil(millrace_io::ALIGN as u64).max(1);
    (pages.next_power_of_two() * millrace_io::ALIGN as u64).min(u32::MAX as u64) as u32
}

/// One host's share: a semaphore of bytes.
#[derive(Clone)]
pub struct HostShare(Arc<Semaphore>);

impl HostShare {
    /// Waits until `len` bytes of buffer fit in the host's share, and holds them.
    pub async fn take(&self, len: usize) -> Held {
        (self.0.clone().acquire_many_owned(charge(len)).await)
            .expect("a host's share is never closed")
    }

    /// Holds `len` bytes of the share if they fit now (and nobody of this host waits).
    pub fn try_take(&self, len: usize) -> Option<Held> {
        self.0.clone().try_acquire_many_owned(charge(len)).ok()
    }

    /// Bytes of the share free now.
    pub fn available(&self) -> usize {
        self.0.available_permits()
    }
}

/// The shares of the hosts connected now, by host NQN: a share lives while any queue of its
/// host holds it, so a host that comes back starts afresh.
#[derive(Default)]
pub(crate) struct HostShares {
    map: Mutex<HashMap<String, Weak<Semaphore>>>,
}

impl HostShares {
    /// The share of host `hostnqn`, `bytes` large when it is first made.
    pub fn of(&self, hostnqn: &str, bytes: usize) -> HostShare {
        let mut m = self.map.lock();
        if let Some(s) = m.get(hostnqn).and_then(Weak::upgrade) {
            return HostShare(s);
        }
        // Forget hosts that have gone, so the map holds only connected ones.
        m.retain(|_, w| w.strong_count() > 0);
        let bytes = bytes.min(Semaphore::MAX_PERMITS);
        let s = Arc::new(Semaphore::new(bytes));
        m.insert(hostnqn.to_string(), Arc::downgrade(&s));
        HostShare(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charge_is_the_pools_run() {
        assert_eq!(charge(0), 4096);
        assert_eq!(charge(4096), 4096);
        assert_eq!(charge(4097), 8192);
        assert_eq!(charge(5 << 12), 8 << 12);
        assert_eq!(charge(1 << 20), 1 << 20);
    }

    #[test]
    fn one_share_per_host_while_it_is_connected() {
        let s = HostShares::default();
        let a = s.of("nqn.a", 1 << 20);
        assert!(Arc::ptr_eq(&a.0, &s.of("nqn.a", 1 << 20).0), "same host");
        assert!(!Arc::ptr_eq(&a.0, &s.of("nqn.b", 1 << 20).0), "other host");
        let held = a.try_take(512 << 10).unwrap();
        assert!(a.try_take(1 << 20).is_none(), "over the share");
        assert_eq!(a.available(), 512 << 10);
        drop(held);
        assert_eq!(a.available(), 1 << 20);
        drop(a);
        assert_eq!(
            s.of("nqn.a", 8192).available(),
            8192,
            "a host that left starts afresh"
        );
    }
}
