//! Where connections run and what their payloads live in: the server's cores (one
//! thread-per-core tokio runtime each, `millrace_io::Cores`) and its buffer pool
//! (`millrace_io::BufPool`), shared by every connection. The pool is the global bound on payload
//! memory: a request takes one buffer for its whole payload, and when the pool is empty the
//! connection stops reading from its socket until buffers come back (docs/DATAPATH.md).
//!
//! One client (a TCP source address, or every local-socket client together) may hold at most its
//! share of the pool, so that a client whose connections announce large writes and never send
//! them waits behind its own share instead of taking the whole pool; the payload timeout then
//! closes its stalled connections and gives their buffers back.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};

use millrace_io::{BufPool, Cores, CoresConfig, PoolConfig};
use tokio::sync::Semaphore;

use crate::proto::MAX_PAYLOAD;
use crate::Peer;

/// The cores connections run on and the pool their payloads use.
#[derive(Clone)]
pub struct DataPath {
    pub cores: Arc<Cores>,
    pub pool: BufPool,
}

impl DataPath {
    /// What a server gets when nobody gave it cores and a pool (tests, tools): one core and a
    /// 64 MiB pool whose pages are faulted in as they are first used.
    pub fn small() -> io::Result<DataPath> {
        let pool = BufPool::new(&PoolConfig {
            bytes: 64 << 20,
            slices: 1,
            max_buf: MAX_PAYLOAD as usize,
            populate: false,
        })?;
        let cores = Cores::start(CoresConfig {
            cores: 1,
            pool: Some(pool.clone()),
            ..CoresConfig::default()
        })?;
        Ok(DataPath {
            cores: Arc::new(cores),
            pool,
        })
    }

    /// The largest request this server takes: the pool's largest buffer, within the protocol's
    /// portable 32 MiB.
    pub fn max_payload(&self) -> u32 {
        (self.pool.max_buf() as u64).min(MAX_PAYLOAD as u64) as u32
    }
}

/// The bytes a buffer for `len` bytes takes from the pool: a power-of-two run of 4 KiB pages.
pub(crate) fn charge(len: u32) -> u32 {
    let pages = (len as u64).div_ceil(millrace_io::ALIGN as u64).max(1);
    (pages.next_power_of_two() * millrace_io::ALIGN as u64).min(u32::MAX as u64) as u32
}

/// Each client's share of the pool: a semaphore of bytes per client, alive while any of its
/// connections is.
#[derive(Default)]
pub(crate) struct Shares {
    map: Mutex<HashMap<Option<IpAddr>, Weak<Semaphore>>>,
}

impl Shares {
    /// The share of the client behind `peer`, `bytes` large when it is first made.
    pub fn of(&self, peer: &Peer, bytes: usize) -> Arc<Semaphore> {
        let key = match peer {
            Peer::Unix => None,
            Peer::Tcp(a) => Some(a.ip().to_canonical()),
        };
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = m.get(&key).and_then(Weak::upgrade) {
            return s;
        }
        // Forget clients that have gone, so the map holds only connected ones.
        m.retain(|_, w| w.strong_count() > 0);
        let s = Arc::new(Semaphore::new(bytes));
        m.insert(key, Arc::downgrade(&s));
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
    }

    #[test]
    fn one_share_per_client_while_it_is_connected() {
        let s = Shares::default();
        let a: Peer = Peer::Tcp("10.0.0.1:5000".parse().unwrap());
        let a2: Peer = Peer::Tcp("10.0.0.1:5001".parse().unwrap());
        let b: Peer = Peer::Tcp("10.0.0.2:5000".parse().unwrap());
        let x = s.of(&a, 100);
        assert!(Arc::ptr_eq(&x, &s.of(&a2, 100)), "same address, same share");
        assert!(!Arc::ptr_eq(&x, &s.of(&b, 100)));
        let u = s.of(&Peer::Unix, 7);
        assert!(
            Arc::ptr_eq(&u, &s.of(&Peer::Unix, 7)),
            "local clients share one"
        );
        assert!(!Arc::ptr_eq(&u, &x));
        drop(x);
        let y = s.of(&a, 50);
        assert_eq!(
            y.available_permits(),
            50,
            "a client that left starts afresh"
        );
    }
}
