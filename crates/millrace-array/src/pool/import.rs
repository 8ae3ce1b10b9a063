//! Finding pools on drives and assembling them, with recovery after an unclean shutdown.

use super::*;

/// A drive found at import: its path, the open drive, and its superblock.
type Found = (PathBuf, Arc<dyn Drive>, Superblock);

impl Pool {
    /// Finds the pools on these drives and assembles each one. Drives without a Millrace
    /// superblock, or with a damaged one, are reported in the returned notes and left alone.
    pub fn import(paths: &[PathBuf]) -> Result<(Vec<Pool>, Vec<String>)> {
        Self::import_with(paths, false)
    }

    /// `import`; `force` assembles a pool even where a crash and a lost drive together leave
    /// rows that cannot be rebuilt reliably.
    pub fn import_with(paths: &[PathBuf], force: bool) -> Result<(Vec<Pool>, Vec<String>)> {
        let mut notes = Vec::new();
        let mut drives = Vec::new();
        for p in paths {
            match FileDrive::open(p) {
                Ok(d) => drives.push((p.clone(), Arc::new(d) as Arc<dyn Drive>)),
                // A drive another process is using is not missing: assembling without it would
                // record it as gone. Refuse instead.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return err(e.to_string()),
                Err(e) => notes.push(format!("skipped {}: {e}", p.display())),
            }
        }
        let (pools, more) = Self::import_drives(drives, force)?;
        notes.extend(more);
        Ok((pools, notes))
    }

    /// Assembles the pools found on drives already open. A pool that was not shut down cleanly
    /// is resynced here, in the regions its write-intent bitmap marks, before it is returned.
    pub fn import_drives(
        drives: Vec<(PathBuf, Arc<dyn Drive>)>,
        force: bool,
    ) -> Result<(Vec<Pool>, Vec<String>)> {
        let (found, notes) = read_found(drives);
        let mut pools = Vec::new();
        for members in found.values() {
            pools.push(Self::assemble_found(members, force)?);
        }
        Ok((pools, notes))
    }

    /// Assembles one pool from the drives carrying its superblocks: refuses where a crash and
    /// a lost member together leave rows that cannot be rebuilt reliably (unless `force`),
    /// records changed member states, and recovers from an unclean shutdown.
    fn assemble_found(members: &[Found], force: bool) -> Result<Pool> {
        let newest = members.iter().map(|m| m.2.events).max().unwrap();
        let mut sb = members
            .iter()
            .find(|m| m.2.events == newest)
            .unwrap()
            .2
            .clone();
        let m = match_members(&sb, members, newest);
        let changed = m.table != sb.table;
        let in_service =
            |s: MemberState| matches!(s, MemberState::Online | MemberState::Rebuilding);
        let lost_at_crash: Vec<usize> = (0..sb.members)
            .filter(|&i| !sb.clean && in_service(sb.table[i].1) && !in_service(m.table[i].1))
            .collect();
        sb.table = m.table;
        let name = sb.name.clone();
        // Read before any commit below rewrites the superblocks as the current version.
        let format = sb.format;
        let mut pool = Pool::assemble_from(sb, m.drives, m.paths, m.spares, m.notes);
        if !force {
            pool.refuse_lost_at_crash(&lost_at_crash, &name)?;
        }
        if changed {
            let mut sb = pool.meta.sb.lock().clone();
            pool.meta
                .commit(&mut sb)
                .map_err(|e| PoolError(format!("cannot record the members' states: {e}")))?;
            *pool.meta.sb.lock() = sb;
        }
        if !pool.superblock().clean {
            pool.found_unclean = true;
            pool.recover_after_crash(format)?;
        } else if pool.array.geometry().level.is_parity() && pool.discard_log(format) {
            tracing::warn!(
                "pool '{}': retired a log record that a clean stop had left behind",
                pool.name()
            );
        }
        Ok(pool)
    }

    /// Refuses a pool where members in service at a crash are gone and the crash left rows
    /// being written.
    fn refuse_lost_at_crash(&self, lost_at_crash: &[usize], name: &str) -> Result<()> {
        if lost_at_crash.is_empty() || !self.array.geometry().level.is_parity() {
            return Ok(());
        }
        // A crash left stripes half written, and a member that was in service then is
        // gone now: its data in those stripes would be rebuilt from parity that may not
        // match. Linux md refuses such an array too; nothing has been written yet.
        let rows: u64 = self
            .array
            .dirty_rows()
            .iter()
            .map(|r| r.end - r.start)
            .sum();
        if rows == 0 {
            return Ok(());
        }
        let who: Vec<String> = lost_at_crash
            .iter()
            .map(|&i| match &self.member_paths()[i] {
                Some(p) => p.display().to_string(),
                None => format!("member {i}"),
            })
            .collect();
        err(format!(
            "pool '{name}' was not shut down cleanly, and {} was in service then but is missing or stale now: {rows} rows being written at the crash cannot be rebuilt reliably without it. Bring the drive back and import again, or import with --force to assemble the pool anyway (data of the missing drive in those rows may come back damaged)",
            who.join(", ")
        ))
    }

    /// Makes redundancy consistent again after an unclean shutdown, in the rows the bitmap
    /// marks (all rows if the pool has no bitmap), then records the pool clean.
    fn recover_after_crash(&self, format: u32) -> Result<()> {
        if self.array.geometry().level.is_parity() {
            // A version-1 pool's journal (see superblock::VERSION), else the partial-parity log.
            if format < 2 {
                if self.array.replay_journal() {
                    tracing::warn!(
                        "pool '{}': replayed the (version 1) journal of a degraded write cut short",
                        self.name()
                    );
                }
            } else {
                let n = self.array.recover_log();
                if n > 0 {
                    tracing::warn!(
                        "pool '{}': recomputed parity of {n} stripe updates from the partial-parity log",
                        self.name()
                    );
                }
            }
        }
        let ranges = self.array.dirty_rows();
        let rows: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        for r in ranges {
            for row in r {
                self.array.resync_row(row)?;
            }
        }
        self.array.settle()?;
        let mut sb = self.meta.sb.lock();
        let mut copy = sb.clone();
        copy.clean = true;
        self.meta
            .commit(&mut copy)
            .map_err(|e| PoolError(format!("cannot record the resync: {e}")))?;
        *sb = copy;
        drop(sb);
        let msg = format!(
            "pool '{}' was not shut down cleanly; resynced {rows} of {} rows the write-intent bitmap marked",
            self.name(),
            self.array.geometry().rows()
        );
        tracing::warn!("{msg}");
        Ok(())
    }

    /// At the start of a pool stopped cleanly: retires a stale log (or version-1 journal)
    /// record. Returns whether there was one.
    fn discard_log(&self, format: u32) -> bool {
        if format < 2 {
            self.array.discard_journal()
        } else {
            self.array.discard_log()
        }
    }
}

/// Reads every drive's superblock and groups the drives by pool; notes what was skipped.
fn read_found(drives: Vec<(PathBuf, Arc<dyn Drive>)>) -> (BTreeMap<Uuid, Vec<Found>>, Vec<String>) {
    let mut notes = Vec::new();
    let mut found: BTreeMap<Uuid, Vec<Found>> = BTreeMap::new();
    for (p, d) in drives {
        match read_superblock(d.as_ref()) {
            Ok(Ok(sb)) => found
                .entry(sb.pool_uuid)
                .or_default()
                .push((p.clone(), d, sb)),
            Ok(Err(SbError::NotMillrace)) => {
                notes.push(format!("skipped {}: no Millrace superblock", p.display()))
            }
            Ok(Err(e)) => notes.push(format!(
                "ignored {}: it carries {e}; it is not used, and nothing was guessed from it",
                p.display()
            )),
            Err(e) => notes.push(format!("skipped {}: cannot read it: {e}", p.display())),
        }
    }
    (found, notes)
}

/// A pool's members as found: the drive (or a stand-in) and path per slot, the member table
/// with what is stale or missing marked, the spares found, and notes for the admin.
struct Matched {
    drives: Vec<Arc<dyn Drive>>,
    paths: Vec<Option<PathBuf>>,
    table: Vec<(Uuid, MemberState)>,
    spares: Vec<(Arc<dyn Drive>, PathBuf)>,
    notes: Vec<String>,
}

/// Matches the newest superblock's table against the drives found.
fn match_members(sb: &Superblock, members: &[Found], newest: u64) -> Matched {
    let mut drives: Vec<Arc<dyn Drive>> = Vec::new();
    let mut mpaths = Vec::new();
    let mut table = sb.table.clone();
    let mut pnotes = Vec::new();
    let mut spares = Vec::new();
    let mut lost_spares = Vec::new();
    for (i, (uuid, _)) in sb.table.iter().enumerate().skip(sb.members) {
        match members
            .iter()
            .find(|m| m.2.member_uuid == *uuid && m.2.events == newest)
        {
            Some((p, d, _)) => spares.push((d.clone(), p.clone())),
            None => {
                pnotes.push(format!(
                    "hot spare {i} of pool '{}' was not found; it is dropped",
                    sb.name
                ));
                lost_spares.push(i);
            }
        }
    }
    for i in lost_spares.into_iter().rev() {
        table.remove(i);
    }
    for (i, (uuid, state)) in sb.table.iter().enumerate().take(sb.members) {
        let hit = members.iter().find(|m| m.2.member_uuid == *uuid);
        match hit {
            // A crash can cut one commit short (superblocks are written member by
            // member): a member one event behind that the newest table still lists as
            // in service missed only that commit, and is current. One marked faulty
            // there, or further behind, is stale.
            Some((p, d, msb))
                if msb.events == newest
                    || (msb.events + 1 == newest
                        && matches!(state, MemberState::Online | MemberState::Rebuilding)) =>
            {
                drives.push(d.clone());
                mpaths.push(Some(p.clone()));
            }
            Some((p, _, msb)) => {
                pnotes.push(format!(
                    "{} is stale (event {} < {newest}): it missed updates while it was away, so it is not trusted; rebuild onto it to bring it back",
                    p.display(),
                    msb.events
                ));
                if matches!(state, MemberState::Online | MemberState::Rebuilding) {
                    table[i].1 = MemberState::Faulty;
                }
                drives.push(Arc::new(MissingDrive(p.display().to_string())));
                mpaths.push(Some(p.clone()));
            }
            None => {
                if matches!(state, MemberState::Online | MemberState::Rebuilding) {
                    pnotes.push(format!(
                        "member {i} of pool '{}' was not found among the drives given; it counts as missing",
                        sb.name
                    ));
                    table[i].1 = MemberState::Missing;
                }
                drives.push(Arc::new(MissingDrive(format!("member {i} (missing)"))));
                mpaths.push(None);
            }
        }
    }
    Matched {
        drives,
        paths: mpaths,
        table,
        spares,
        notes: pnotes,
    }
}
