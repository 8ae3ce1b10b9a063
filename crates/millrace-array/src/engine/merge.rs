//! Merging writes in flight to one stripe (issue #15), in the manner of md's stripe cache with
//! plugging and SPDK raid5f's stripe requests: a partial-row write of a healthy parity pool on a
//! core first joins its row's pending set, lets the other tasks ready in this scheduler round
//! run (a queue of sequential writes submitted together joins here), then waits for the row's
//! lock. Whoever gets the lock first takes every pending write of the row that overlaps none
//! taken before it, plans them as one (`parity_ring::write_on_ring`: full-stripe where they
//! cover the row, else the cheaper of read-modify-write and reconstruct-write over their union)
//! and completes each with its own result. A write whose task was not the one to plan it is
//! woken by the result, not by the lock.
//!
//! Why it stays safe: the set is written under the row's lock, exactly as one request would be,
//! so scrub, rebuild and resync (which take the same locks) never see it half done, and the
//! write-intent bitmap is marked for the row first. The merged path only runs while every member
//! is online, where the partial-parity log is not written; a degraded pool (or a member failing
//! during the merged write) writes each request alone through the blocking engine, whose log
//! covers it. Each request's data goes out with its own FUA; parity with FUA if any request of
//! the set asked for it, since it covers them all. Overlapping writes are never merged: the
//! later one waits for the next round, so concurrent writes to the same bytes land whole, one
//! after the other.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Poll;

use millrace_block::{BufResult, IoBuf};
use millrace_io::SharedBuf;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::parity_ring::{write_on_ring, RingWrite};
use super::Array;

/// A partial-row write waiting for the row's lock, to be written by its own task or another's.
struct Joined {
    id: u64,
    offset: u64,
    buf: IoBuf,
    fua: bool,
    done: oneshot::Sender<BufResult>,
}

impl Joined {
    fn overlaps(&self, o: &Joined) -> bool {
        let (a, b) = (self.offset, o.offset);
        a < b + o.buf.len() as u64 && b < a + self.buf.len() as u64
    }
}

/// The pending partial-row writes, per row.
pub(super) struct Pending {
    /// Merging is on (the default); off only to measure what it saves.
    on: AtomicBool,
    next: AtomicU64,
    rows: Mutex<HashMap<u64, Vec<Joined>>>,
}

/// Takes its request out of the pending set if the request's future is dropped before anyone
/// took it: nothing is written and the buffer goes back to its pool.
struct Ticket<'a> {
    pending: &'a Pending,
    row: u64,
    id: u64,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut rows = self.pending.rows.lock();
        if let Some(v) = rows.get_mut(&self.row) {
            v.retain(|j| j.id != self.id);
            if v.is_empty() {
                rows.remove(&self.row);
            }
        }
    }
}

impl Default for Pending {
    fn default() -> Pending {
        Pending {
            on: AtomicBool::new(true),
            next: AtomicU64::new(0),
            rows: Mutex::new(HashMap::new()),
        }
    }
}

impl Pending {
    /// Takes request `id` and every other pending write of `row` that overlaps none taken
    /// before it, oldest first. None: someone else took `id` (its result is on its way).
    fn take(&self, row: u64, id: u64) -> Option<Vec<Joined>> {
        let mut rows = self.rows.lock();
        let v = rows.get_mut(&row)?;
        let mine = v.iter().position(|j| j.id == id)?;
        let mut taken = vec![v.remove(mine)];
        let mut i = 0;
        while i < v.len() {
            if taken.iter().any(|t| t.overlaps(&v[i])) {
                i += 1;
            } else {
                taken.push(v.remove(i));
            }
        }
        if v.is_empty() {
            rows.remove(&row);
        }
        Some(taken)
    }
}

/// The answer to a request whose write was taken by a task that was then dropped.
fn cancelled(len: usize) -> BufResult {
    let e = io::Error::new(
        io::ErrorKind::Interrupted,
        "the write was cancelled with the request that carried it in a merged stripe write: \
         its data may or may not be on the drives; write it again",
    );
    (Err(e), IoBuf::standalone(len))
}

impl Array {
    /// Turns the merging of writes in flight to one stripe on or off (it is on), so a bench can
    /// show what it saves in one run.
    pub fn set_write_merging(&self, on: bool) {
        self.merge.on.store(on, Ordering::Relaxed);
    }

    /// Whether a write of [offset, offset+len) (sector-aligned) may join its row's pending set:
    /// a partial row of a parity pool, on a core, every member online behind a descriptor.
    pub(super) fn merges(&self, offset: u64, len: usize) -> bool {
        let fs = self.geo.full_stripe_bytes();
        let end = offset + len as u64;
        self.merge.on.load(Ordering::Relaxed)
            && self.geo.level.is_parity()
            && offset / fs == (end - 1) / fs
            && (len as u64) < fs
            && self.ring_drives(offset, len).is_some()
    }

    /// A partial-row write through the row's pending set (see the module's comment).
    pub(super) async fn write_merging(&self, offset: u64, buf: IoBuf, fua: bool) -> BufResult {
        let fs = self.geo.full_stripe_bytes();
        let (row, len) = (offset / fs, buf.len());
        let id = self.merge.next.fetch_add(1, Ordering::Relaxed);
        let (done, mut rx) = oneshot::channel();
        let me = Joined {
            id,
            offset,
            buf,
            fua,
            done,
        };
        self.merge.rows.lock().entry(row).or_default().push(me);
        let _ticket = Ticket {
            pending: &self.merge,
            row,
            id,
        };
        // The other writes ready in this scheduler round (the rest of a queue submitted
        // together) join the set before anyone plans it.
        tokio::task::yield_now().await;
        let mut lock = self.locks.lock_async(self.row_shards(row * fs, fs));
        let got = poll_fn(|cx| {
            if let Poll::Ready(r) = Pin::new(&mut rx).poll(cx) {
                return Poll::Ready(Err(r));
            }
            Pin::new(&mut lock).poll(cx).map(Ok)
        })
        .await;
        let guard = match got {
            Ok(g) => g,
            Err(r) => return r.unwrap_or_else(|_| cancelled(len)),
        };
        let Some(set) = self.merge.take(row, id) else {
            // Taken between the lock's release and this poll: the result was sent first.
            drop(guard);
            return rx.await.unwrap_or_else(|_| cancelled(len));
        };
        let mine = self.write_set(set).await;
        drop(guard);
        mine
    }

    /// Writes a set taken from a row's pending set (the row locked); sends every request but
    /// the first its result and returns the first's.
    async fn write_set(&self, set: Vec<Joined>) -> BufResult {
        let lo = set
            .iter()
            .map(|j| j.offset)
            .min()
            .expect("a set is never empty");
        let hi = set
            .iter()
            .map(|j| j.offset + j.buf.len() as u64)
            .max()
            .expect("a set is never empty");
        self.stats
            .merged_writes
            .fetch_add(set.len() as u64 - 1, Ordering::Relaxed);
        let mut senders = Vec::with_capacity(set.len());
        let mut reqs: Vec<RingWrite> = set
            .into_iter()
            .map(|j| {
                senders.push(j.done);
                RingWrite {
                    offset: j.offset,
                    buf: SharedBuf::new(j.buf),
                    fua: j.fua,
                }
            })
            .collect();
        self.mark_intent(lo, hi);
        // A member may have left service while the set waited for the lock.
        let r = match self.ring_drives(lo, (hi - lo) as usize) {
            Some(d) => write_on_ring(self, &d, &mut reqs).await,
            None => Ok(false),
        };
        let mut results: Vec<BufResult> = Vec::with_capacity(reqs.len());
        for q in reqs {
            let buf = q
                .buf
                .try_unwrap()
                .expect("every member operation has completed");
            let r = match &r {
                Ok(true) => Ok(()),
                Err(e) => Err(io::Error::other(e.to_string())),
                // The blocking engine plans each request alone around the failed member.
                Ok(false) => self.write_alone_recorded(q.offset, &buf, q.fua).await,
            };
            results.push((r, buf));
        }
        let mut results = results.into_iter();
        let mine = results.next().expect("a set is never empty");
        for (tx, r) in senders.into_iter().skip(1).zip(results) {
            // A request whose future was dropped no longer waits for its answer.
            let _ = tx.send(r);
        }
        mine
    }

    /// `write_alone` once every member failure so far is recorded: it may go around a member
    /// that just failed, which must not happen before the superblocks say so (see `unlogged`).
    pub(super) async fn write_alone_recorded(
        &self,
        offset: u64,
        buf: &[u8],
        fua: bool,
    ) -> io::Result<()> {
        self.unlogged.recorded().await;
        self.write_alone(offset, buf, fua)
    }

    /// One request through the blocking engine, under the locks its caller holds.
    pub(super) fn write_alone(&self, offset: u64, buf: &[u8], fua: bool) -> io::Result<()> {
        let mut r = self.write_locked(offset, buf);
        if fua && r.is_ok() {
            r = self.flush();
        }
        r.map_err(Into::into)
    }
}
