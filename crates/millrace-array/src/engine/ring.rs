//! What a request's batch on the core's io_uring is made of, below both the read and write
//! paths (`completion`) and the parity write plans (`parity_write`): the drives it goes to, what
//! each operation moved, and how results are counted against the members.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Array;
use crate::drive::Drive;
use crate::geometry::SECTOR;

pub(super) type Drives = Arc<Vec<Arc<dyn Drive>>>;

/// A batch's accounts: a request's member operations, inline when few.
pub(super) type SentList = smallvec::SmallVec<[Sent; 8]>;

/// Which member and how many bytes each operation of a batch moves, to account its result.
pub(super) struct Sent {
    pub member: usize,
    pub len: usize,
    pub write: bool,
}

impl Array {
    /// The drives, when this request can go to this core's ring as it is.
    pub(super) fn ring_drives(&self, offset: u64, len: usize) -> Option<Drives> {
        let aligned = offset.is_multiple_of(SECTOR) && (len as u64).is_multiple_of(SECTOR);
        if !aligned || !millrace_io::on_ring() || !self.all_online() {
            return None;
        }
        let d = self.drives.load_full();
        d.iter().all(|d| d.uring_fd().is_some()).then_some(d)
    }

    /// Counts a batch's results as `run` does; marks members whose I/O failed as faulty.
    /// Returns whether every operation moved all its bytes.
    pub(super) fn account(
        &self,
        drives: &Drives,
        sent: &[Sent],
        results: millrace_io::Results,
    ) -> bool {
        let mut ok = true;
        for (s, r) in sent.iter().zip(results) {
            let ms = &self.member_stats[s.member];
            match r {
                Ok(n) if n == s.len => ms.moved(s.write, n as u64),
                // A short transfer: the blocking path redoes the request and names the cause.
                Ok(_) => ok = false,
                Err(e) => {
                    ok = false;
                    ms.errors.fetch_add(1, Ordering::Relaxed);
                    self.stats.member_errors.fetch_add(1, Ordering::Relaxed);
                    if Arc::ptr_eq(&drives[s.member], &self.drives.load()[s.member]) {
                        self.fail_member(s.member, &e);
                    }
                }
            }
        }
        ok
    }

    pub(super) fn ring_fd(&self, drives: &Drives, m: usize) -> i32 {
        Self::member_fd(drives, m)
    }

    pub(super) fn member_fd(drives: &Drives, m: usize) -> i32 {
        drives[m]
            .uring_fd()
            .expect("ring_drives checked every member")
    }
}
