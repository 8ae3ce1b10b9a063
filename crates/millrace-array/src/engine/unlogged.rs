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

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::Array;

/// How long a failure waits for unlogged writes in flight before it is recorded anyway (a
/// member that never answers must not keep the failure from being recorded).
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(super) struct Unlogged {
    count: Mutex<usize>,
    drained: Condvar,
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
            hook(m, why);
        };
        if millrace_io::on_ring() {
            let why = std::io::Error::new(why.kind(), why.to_string());
            std::thread::spawn(move || record(&why));
        } else {
            record(why);
        }
    }
}
