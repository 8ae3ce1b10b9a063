//! Row locks that serve async writers on the cores and blocking callers (the synchronous
//! wrapper, rebuild, scrub, resync) at once. Rows map to 1024 shards; a request takes its
//! shards in ascending order, so two requests never wait on each other in a cycle. A blocking
//! caller waits on the shard's condition variable; an async one leaves its waker and returns
//! Pending, so no core thread ever parks on a row.
//!
//! Written here because neither kind of lock in the ecosystem serves both: tokio's Mutex refuses
//! `blocking_lock` inside a runtime (the inline fallback runs there), and a parking_lot guard
//! cannot be held across an await of a Send future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use parking_lot::{Condvar, Mutex};

pub(super) const SHARDS: usize = 1024;

/// Shards a request takes: one or two for most, inline.
pub(super) type Shards = smallvec::SmallVec<[usize; 4]>;

#[derive(Default)]
struct ShardState {
    held: bool,
    /// Async lockers waiting; all are woken on release (one wins, the rest wait again), which
    /// also makes a waker left by a dropped future harmless.
    wakers: Vec<Waker>,
}

#[derive(Default)]
struct Shard {
    state: Mutex<ShardState>,
    cv: Condvar,
}

pub(super) struct RowLocks {
    shards: Vec<Shard>,
}

/// Holds some shards; releases them when dropped.
pub(super) struct RowGuard<'a> {
    locks: &'a RowLocks,
    held: Shards,
}

impl Drop for RowGuard<'_> {
    fn drop(&mut self) {
        for &i in &self.held {
            self.locks.release(i);
        }
    }
}

impl RowLocks {
    pub fn new() -> RowLocks {
        RowLocks {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }

    /// The shards of rows r0..=r1, in ascending order.
    pub fn shards(r0: u64, r1: u64) -> Shards {
        let mut v: Shards = if r1 - r0 + 1 >= SHARDS as u64 {
            (0..SHARDS).collect()
        } else {
            (r0..=r1).map(|r| (r % SHARDS as u64) as usize).collect()
        };
        v.sort_unstable();
        v.dedup();
        v
    }

    fn release(&self, i: usize) {
        let s = &self.shards[i];
        let wakers = {
            let mut st = s.state.lock();
            st.held = false;
            std::mem::take(&mut st.wakers)
        };
        s.cv.notify_one();
        for w in wakers {
            w.wake();
        }
    }

    /// Takes `shards` (ascending), blocking the thread while another holds one.
    pub fn lock(&self, shards: Shards) -> RowGuard<'_> {
        for &i in &shards {
            let s = &self.shards[i];
            let mut st = s.state.lock();
            while st.held {
                s.cv.wait(&mut st);
            }
            st.held = true;
        }
        RowGuard {
            locks: self,
            held: shards,
        }
    }

    /// Takes `shards` (ascending) without blocking the thread. Dropping the future releases
    /// whatever it had taken.
    pub fn lock_async(&self, shards: Shards) -> LockFuture<'_> {
        LockFuture {
            want: shards,
            guard: Some(RowGuard {
                locks: self,
                held: Shards::new(),
            }),
        }
    }
}

pub(super) struct LockFuture<'a> {
    want: Shards,
    guard: Option<RowGuard<'a>>,
}

impl<'a> Future for LockFuture<'a> {
    type Output = RowGuard<'a>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<RowGuard<'a>> {
        let this = &mut *self;
        let g = this.guard.as_mut().expect("polled after completion");
        while g.held.len() < this.want.len() {
            let i = this.want[g.held.len()];
            let mut st = g.locks.shards[i].state.lock();
            if st.held {
                st.wakers.push(cx.waker().clone());
                return Poll::Pending;
            }
            st.held = true;
            drop(st);
            g.held.push(i);
        }
        Poll::Ready(this.guard.take().unwrap())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn async_and_blocking_lockers_exclude_each_other() {
        let locks = Arc::new(RowLocks::new());
        let inside = Arc::new(AtomicUsize::new(0));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        std::thread::scope(|s| {
            for t in 0..2 {
                let (locks, inside) = (locks.clone(), inside.clone());
                s.spawn(move || {
                    for i in 0..300u64 {
                        let _g = locks.lock(RowLocks::shards(i % 4, 3 + t));
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
            rt.block_on(async {
                let tasks: Vec<_> = (0..4u64)
                    .map(|t| {
                        let (locks, inside) = (locks.clone(), inside.clone());
                        async move {
                            for i in 0..300u64 {
                                let g = locks.lock_async(RowLocks::shards(3, 7 + t)).await;
                                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                                tokio::task::yield_now().await;
                                inside.fetch_sub(1, Ordering::SeqCst);
                                drop(g);
                                let _ = i;
                            }
                        }
                    })
                    .collect();
                let local = tokio::task::LocalSet::new();
                local
                    .run_until(async {
                        let hs: Vec<_> = tasks.into_iter().map(tokio::task::spawn_local).collect();
                        for h in hs {
                            h.await.unwrap();
                        }
                    })
                    .await;
            });
        });
        // Every locker holds shard 3, so at most one is ever inside. Everything was released: a whole-range lock is free at once.
        let g = locks.lock(RowLocks::shards(0, 5000));
        assert_eq!(g.held.len(), SHARDS);
    }

    #[test]
    fn a_dropped_lock_future_releases_what_it_took() {
        let locks = RowLocks::new();
        let held = locks.lock(smallvec::smallvec![5]);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let r = tokio::time::timeout(
                std::time::Duration::from_millis(5),
                locks.lock_async(smallvec::smallvec![1, 5]),
            )
            .await;
            assert!(r.is_err(), "shard 5 is held");
        });
        drop(held);
        let g = locks.lock(smallvec::smallvec![1, 5]);
        drop(g);
    }
}
