//! Parity writes in flight without the partial-parity log, and the order a member failure is
//! recorded in (issue #21).
//!
//! A write planned while every member is online goes in place without a log record. If a member
//! fails while such a write is in flight and the failure reaches the superblocks before the
//! write is durable, a crash leaves a torn stripe that the pool, now degraded, cannot resync:
//! the failed member's strip would be rebuilt from parity that matches neither the old data
//! nor the new. So a failure is recorded only after (1) every unlogged write that saw the pool
//! whole has completed (writes that start later see the member out and take the log), and (2)
//! every member in service has been flushed, so those writes and every earlier one are durable
//! before any superblock says the pool is degraded.
//!
//! On a core, the writes in flight complete only when the core runs on, so the core does not
//! wait: the failure is recorded from a thread of its own (the member is out of service in
//! memory at once either way).
//!
//! The other direction: a write is acknowledged only once every failure recorded so far in
//! memory has reached the superblocks. Writes planned after a failure go around the member, so
//! its strips go stale; were one acknowledged (and flushed) before the record, a crash would
//! reopen the pool with the member in service, its stale strips read as data (resync would even
//! make parity agree with them). Linux md likewise holds writes back while a failure's
//! superblock update is pending. tests/it/crash_ring.rs found this.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tokio::sync::Notify;

use super::Array;

/// How long a failure waits for unlogged writes in flight before it is recorded anyway (a
/// member that never answers must not keep the failure from being recorded).
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(super) struct Unlogged {
    count: Mutex<usize>,
    drained: Condvar,
    /// Failures taken out of service in memory and not yet recorded (`record_failure`).
    unrecorded: AtomicUsize,
    records: Mutex<usize>,
    recorded: Condvar,
    recorded_async: Notify,
}

/// One unlogged write in flight; dropped once its member writes have completed.
pub(super) struct Ticket(Arc<Unlogged>);

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut n = self.0.count.lock();
        *n -= 1;
        if *n == 0 {
            self.0.drained.notify_all();
        }
    }
}

impl Unlogged {
    /// Waits until no unlogged write is in flight, at most `DRAIN_LIMIT`.
    fn wait_drained(&self) {
        let mut n = self.count.lock();
        let deadline = std::time::Instant::now() + DRAIN_LIMIT;
        while *n > 0 {
            if self.drained.wait_until(&mut n, deadline).timed_out() {
                tracing::warn!(
                    "{} parity writes still in flight after {DRAIN_LIMIT:?}; recording the failure without them",
                    *n
                );
                return;
            }
        }
    }
}

impl Unlogged {
    fn begin_record(&self) {
        *self.records.lock() += 1;
        self.unrecorded.fetch_add(1, Ordering::AcqRel);
    }

    fn end_record(&self) {
        let mut n = self.records.lock();
        *n -= 1;
        self.unrecorded.fetch_sub(1, Ordering::AcqRel);
        if *n == 0 {
            self.recorded.notify_all();
            self.recorded_async.notify_waiters();
        }
    }

    /// Waits until every failure taken out of service so far is recorded (off a core: on one,
    /// the record may wait for this core's writes in flight; use `recorded`).
    pub(super) fn wait_recorded(&self) {
        if self.unrecorded.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut n = self.records.lock();
        while *n > 0 {
            self.recorded.wait(&mut n);
        }
    }

    /// Whether every failure taken out of service so far is recorded (`recorded` would not wait).
    pub(super) fn is_recorded(&self) -> bool {
        self.unrecorded.load(Ordering::Acquire) == 0
    }

    /// `wait_recorded` for a task on a core.
    pub(super) async fn recorded(&self) {
        loop {
            if self.is_recorded() {
                return;
            }
            let wake = std::pin::pin!(self.recorded_async.notified());
            let mut wake = wake;
            wake.as_mut().enable();
            if self.is_recorded() {
                return;
            }
            wake.await;
        }
    }
}

impl Array {
    /// A ticket for a parity write about to go in place without the log: None when a member is
    /// out of service (the write must take the logged path; plan again). Taken before the check,
    /// so a failure either is seen here or waits for this write.
    pub(super) fn begin_unlogged(&self) -> Option<Ticket> {
        *self.unlogged.count.lock() += 1;
        let t = Ticket(self.unlogged.clone());
        self.all_online().then_some(t)
    }

    /// Records member `m`'s failure through the hook once the unlogged writes in flight and
    /// everything before them are durable (see the module's comment).
    pub(super) fn record_failure(&self, m: usize, why: &std::io::Error) {
        let Some(hook) = self.on_failure.read().clone() else {
            return;
        };
        let unlogged = self.unlogged.clone();
        unlogged.begin_record();
        let drives = self.drives.load_full();
        let live: Vec<usize> = (0..self.geo.members)
            .filter(|&i| self.writable(i))
            .collect();
        let record = move |why: &std::io::Error| {
            unlogged.wait_drained();
            for &i in &live {
                // A flush that fails here fails again in the hook's commit, which reports it.
                let _ = drives[i].flush();
            }
            live.iter().for_each(|&i| drives[i].settle());
            hook(m, why);
            unlogged.end_record();
        };
        if millrace_io::on_ring() {
            let why = std::io::Error::new(why.kind(), why.to_string());
            std::thread::spawn(move || record(&why));
        } else {
            record(why);
        }
    }
}
