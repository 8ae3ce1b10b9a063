//! What the network servers (NVMe/TCP, NBD) share about who may connect: a bound on the
//! connections open in all and from one client, and log lines that a flood of refusals cannot
//! turn into a flood of log. Written here rather than taken from a crate because it is a
//! counter map and a timestamp: the crates that do rate limiting (governor and the like) meter
//! requests, not "one line a second, and how many were held back".

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Milliseconds since the first call in this process, never 0 (0 means "never logged").
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Lets a log line through at most once a second; counts the ones held back, so the next
/// line says how many there were.
#[derive(Default)]
pub struct RateLimit {
    last_ms: AtomicU64,
    held: AtomicU64,
}

impl RateLimit {
    /// `Some(n)`: log now, mentioning `n` held back since the last line; None: stay quiet.
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(now_ms())
    }

    /// `allow` at a given time (milliseconds, from any fixed start).
    pub fn allow_at(&self, now_ms: u64) -> Option<u64> {
        let last = self.last_ms.load(Ordering::Relaxed);
        let first = last == 0 && self.held.load(Ordering::Relaxed) == 0;
        if (first || now_ms >= last + 1000)
            && (self.last_ms)
                .compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.held.swap(0, Ordering::Relaxed));
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The server has this many connections open, its limit.
    Total(usize),
    /// The client has this many connections open, its limit.
    PerClient(usize),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Total(n) => write!(f, "the server already has its maximum of {n} connections"),
            Refused::PerClient(n) => {
                write!(f, "this client already has its maximum of {n} connections")
            }
        }
    }
}

struct Open<K> {
    total: usize,
    per_client: HashMap<K, usize>,
}

struct Inner<K> {
    max_total: usize,
    max_per_client: usize,
    open: Mutex<Open<K>>,
}

/// Connections open, in all and per client key (an IP address, say), under two bounds.
pub struct Admission<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for Admission<K> {
    fn clone(&self) -> Self {
        Admission {
            inner: self.inner.clone(),
        }
    }
}

impl<K: Hash + Eq + Clone> Admission<K> {
    pub fn new(max_total: usize, max_per_client: usize) -> Self {
        Admission {
            inner: Arc::new(Inner {
                max_total,
                max_per_client,
                open: Mutex::new(Open {
                    total: 0,
                    per_client: HashMap::new(),
                }),
            }),
        }
    }

    /// A place for one more connection of `client` (None: counted in the total only, as the
    /// clients of a local socket are), held until the place is dropped.
    pub fn take(&self, client: Option<K>) -> Result<Place<K>, Refused> {
        let mut open = self.inner.open.lock();
        if open.total >= self.inner.max_total {
            return Err(Refused::Total(self.inner.max_total));
        }
        if let Some(k) = &client {
            let n = open.per_client.entry(k.clone()).or_insert(0);
            if *n >= self.inner.max_per_client {
                return Err(Refused::PerClient(self.inner.max_per_client));
            }
            *n += 1;
        }
        open.total += 1;
        Ok(Place {
            inner: self.inner.clone(),
            client,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.inner.open.lock().total
    }
}

/// One connection's place; given back when dropped, on whichever thread that is.
pub struct Place<K: Hash + Eq> {
    inner: Arc<Inner<K>>,
    client: Option<K>,
}

impl<K: Hash + Eq> Drop for Place<K> {
    fn drop(&mut self) {
        let mut open = self.inner.open.lock();
        open.total -= 1;
        if let Some(k) = &self.client {
            if let Some(n) = open.per_client.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    open.per_client.remove(k);
                }
            }
        }
    }
}

/// The wait after a failed `accept` (out of descriptors, say): from 10 ms doubling to a
/// second, back to 10 ms once a connection is accepted. The accept loop waits and goes on;
/// the connections already open keep being served.
pub struct AcceptBackoff(Duration);

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff(Duration::from_millis(10))
    }
}

impl AcceptBackoff {
    /// The wait before the next try; each call doubles the next one.
    pub fn wait(&mut self) -> Duration {
        let d = self.0;
        self.0 = (d * 2).min(Duration::from_secs(1));
        d
    }

    /// A connection was accepted.
    pub fn reset(&mut self) {
        self.0 = Duration::from_millis(10);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_in_all_and_per_client_and_places_come_back() {
        let a: Admission<u8> = Admission::new(3, 2);
        let p1 = a.take(Some(1)).unwrap();
        let p2 = a.take(Some(1)).unwrap();
        assert_eq!(a.take(Some(1)).err(), Some(Refused::PerClient(2)));
        let p3 = a.take(Some(2)).unwrap();
        assert_eq!(a.take(Some(3)).err(), Some(Refused::Total(3)));
        assert_eq!(a.take(None).err(), Some(Refused::Total(3)));
        drop(p1);
        // Client 1's place came back: it may connect again, and the total has room.
        let p4 = a.take(Some(1)).unwrap();
        assert_eq!(a.open(), 3);
        drop((p2, p3, p4));
        assert_eq!(a.open(), 0);
        assert!(a.inner.open.lock().per_client.is_empty());
        let locals: Vec<_> = (0..3).map(|_| a.take(None).unwrap()).collect();
        assert_eq!(a.take(None).err(), Some(Refused::Total(3)));
        drop(locals);
        assert!(Refused::PerClient(2).to_string().contains("maximum of 2"));
    }

    #[test]
    fn one_line_a_second_with_the_count_held_back() {
        let r = RateLimit::default();
        assert_eq!(r.allow_at(5), Some(0));
        assert_eq!(r.allow_at(6), None);
        assert_eq!(r.allow_at(900), None);
        assert_eq!(r.allow_at(1005), Some(2));
        assert_eq!(r.allow_at(1006), None);
    }

    #[test]
    fn accept_backoff_doubles_to_a_second_and_resets() {
        let mut b = AcceptBackoff::default();
        let waits: Vec<u64> = (0..9).map(|_| b.wait().as_millis() as u64).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.reset();
        assert_eq!(b.wait(), Duration::from_millis(10));
    }
}
