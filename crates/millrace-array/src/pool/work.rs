//! Long work on a pool: rebuild (with its checkpoint) and scrub.

use super::*;

impl Pool {
    /// The lowest row not yet rebuilt on any rebuilding member.
    pub(super) fn rebuild_checkpoint(&self) -> u64 {
        self.array.rebuild_progress().unwrap_or(0)
    }

    /// Rebuilds every member in state Rebuilding, from its checkpoint, while the pool serves.
    /// `rate` caps the bytes written per second to the new drives. The checkpoint is recorded in
    /// the superblocks about every second, so an interrupted rebuild resumes there.
    pub fn rebuild(&self, rate: Option<u64>, mut progress: impl FnMut(u64, u64)) -> Result<bool> {
        let geo = *self.array.geometry();
        let targets: Vec<usize> = (0..geo.members)
            .filter(|&m| self.array.member_state(m) == MemberState::Rebuilding)
            .collect();
        if targets.is_empty() {
            return Ok(false);
        }
        self.mark_dirty()?;
        let start = self.rebuild_checkpoint();
        let t0 = std::time::Instant::now();
        let mut last_save = t0;
        let row_bytes = geo.strip * targets.len() as u64;
        let (min, mut size, max) = self.array.rebuild_batch_bounds();
        let stats = &self.array.stats;
        let client_ops =
            || stats.read_ops.load(Ordering::Relaxed) + stats.write_ops.load(Ordering::Relaxed);
        let mut seen = client_ops();
        if self.stopping.load(Ordering::Acquire) {
            return err(format!(
                "the rebuild was stopped at row {start} of {} (the server is shutting down); it resumes there",
                geo.rows()
            ));
        }
        let mut stop: Option<PoolError> = None;
        let reached = self.array.rebuild_pipelined(start, size, |row| {
            if let Some(&m) = targets
                .iter()
                .find(|&&m| self.array.member_state(m) != MemberState::Rebuilding)
            {
                stop = Some(PoolError(format!(
                    "the rebuild stopped: member {m} ({}) failed while being rebuilt; replace it with `millrace pool replace`",
                    self.member_paths()[m].as_ref().map(|p| p.display().to_string()).unwrap_or_default()
                )));
                return 0;
            }
            if self.stopping.load(Ordering::Acquire) {
                stop = self.save_rebuild_checkpoint(row).err().or(Some(PoolError(format!(
                    "the rebuild was stopped at row {row} of {} (the server is shutting down); it resumes there",
                    geo.rows()
                ))));
                return 0;
            }
            if let Some(rate) = rate.filter(|&r| r > 0) {
                let due = std::time::Duration::from_secs_f64(
                    (row - start) as f64 * row_bytes as f64 / rate as f64,
                );
                if let Some(wait) = due.checked_sub(t0.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            if last_save.elapsed() >= std::time::Duration::from_secs(1) {
                last_save = std::time::Instant::now();
                if let Err(e) = self.save_rebuild_checkpoint(row) {
                    stop = Some(e);
                    return 0;
                }
            }
            progress(row, geo.rows());
            // Clients at work: smaller batches, so their requests wait less behind the
            // rebuild's locks; idle: larger ones, so the drives see long sequential runs.
            let now = client_ops();
            size = if now != seen { (size / 2).max(min) } else { (size * 2).min(max) };
            seen = now;
            size
        })?;
        if let Some(e) = stop {
            return Err(e);
        }
        if reached < geo.rows() {
            return err(format!(
                "the rebuild stopped at row {reached} of {}; run it again to resume",
                geo.rows()
            ));
        }
        self.array.flush()?;
        let mut sb = self.meta.sb.lock();
        let mut copy = sb.clone();
        for &m in &targets {
            copy.table[m].1 = MemberState::Online;
        }
        copy.rebuild_checkpoint = 0;
        self.meta
            .commit(&mut copy)
            .map_err(|e| PoolError(format!("cannot record the finished rebuild: {e}")))?;
        // Online in memory only once the superblocks say so: a whole pool writes stripes
        // without the partial-parity log, and a crash before the record would reopen the
        // member as still rebuilding from an earlier checkpoint, its strips past it rebuilt from
        // parity that such a torn write left stale (tests/it/crash_ring.rs found this).
        for &m in &targets {
            self.array.set_member_state(m, MemberState::Online);
        }
        *sb = copy;
        Ok(true)
    }

    /// Records that rows before `row` are rebuilt, once they are durable.
    fn save_rebuild_checkpoint(&self, row: u64) -> Result<()> {
        self.array.flush()?;
        let mut sb = self.meta.sb.lock();
        let mut copy = sb.clone();
        copy.rebuild_checkpoint = row;
        self.meta
            .commit(&mut copy)
            .map_err(|e| PoolError(format!("cannot record the rebuild's progress: {e}")))?;
        *sb = copy;
        Ok(())
    }

    /// Asks a rebuild or scrub under way (on another thread) to stop at its next batch, the
    /// rebuild recording its checkpoint first; used before a server closes its pools.
    pub fn stop_work(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// Checks every row's redundancy; with `repair`, fixes what it finds.
    pub fn scrub(
        &self,
        repair: bool,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<crate::engine::ScrubReport> {
        if repair {
            self.mark_dirty()?;
        }
        let rows = self.array.geometry().rows();
        let mut total = crate::engine::ScrubReport::default();
        for row in 0..rows {
            if self.stopping.load(Ordering::Acquire) {
                return err(format!(
                    "the scrub was stopped at row {row} of {rows} (the server is shutting down); run it again"
                ));
            }
            total.add(&self.array.scrub_row(row, repair)?);
            if row % 64 == 0 || row + 1 == rows {
                progress(row + 1, rows);
            }
        }
        self.array.flush()?;
        Ok(total)
    }
}
