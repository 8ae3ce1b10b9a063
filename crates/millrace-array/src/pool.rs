//! Pools as an admin sees them: created from drives, found again from the drives alone.
//!
//! Each member's superblock carries the whole pool's description and a member table, so any
//! member tells which pool it belongs to and what the others are. Assembly trusts only members
//! whose event counter equals the newest one seen; an older one is stale (it missed updates
//! while away) and stays out. A small cache under MILLRACE_HOME remembers member paths by pool
//! name, the way mdadm.conf or zpool.cache do, so later commands can name the pool.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::aligned::AlignedBuf;
use crate::drive::{Drive, FileDrive};
use crate::engine::{Array, ArrayError, MissingDrive};
use crate::geometry::{Geometry, Level, MAX_STRIP};
use crate::superblock::{MemberState, SbError, Superblock, SLOT_BYTES};

/// An admin-facing failure: always a sentence that says what was wrong and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PoolError(pub String);

impl From<ArrayError> for PoolError {
    fn from(e: ArrayError) -> Self {
        PoolError(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, PoolError>;

fn err<T>(msg: impl Into<String>) -> Result<T> {
    Err(PoolError(msg.into()))
}

const MIB: u64 = 1 << 20;
/// How much of a drive's start is checked for foreign content before it is claimed.
const BLANK_CHECK: usize = 64 << 10;

#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub name: String,
    pub level: Level,
    pub strip: u64,
    pub group: Option<usize>,
    /// Bytes reserved at each member's start for superblocks and metadata; default by size.
    pub data_offset: Option<u64>,
    /// Create missing drive files of this size (sparse).
    pub create_size: Option<u64>,
    /// Overwrite drives that hold other data or another pool.
    pub force: bool,
}

/// What an admin or a script sees of a pool.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PoolInfo {
    pub name: String,
    pub uuid: Uuid,
    pub level: Level,
    pub strip_bytes: u64,
    pub group_size: usize,
    pub groups: usize,
    pub data_drives_per_group: usize,
    pub size_bytes: u64,
    pub full_stripe_bytes: u64,
    pub state: String,
    pub clean: bool,
    pub events: u64,
    pub data_offset_bytes: u64,
    pub member_data_bytes: u64,
    pub members: Vec<MemberInfo>,
    /// Hot spares waiting for a member to fail.
    pub spares: Vec<String>,
    /// Progress of a rebuild, when one is under way or interrupted.
    pub rebuild: Option<RebuildInfo>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RebuildInfo {
    pub rows_done: u64,
    pub rows_total: u64,
    pub percent: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemberInfo {
    pub index: usize,
    pub path: Option<String>,
    pub uuid: Uuid,
    pub state: MemberState,
    pub data_offset_bytes: u64,
    pub group: usize,
}

/// The pool-wide metadata, shared with the engine's failure hook.
struct Meta {
    sb: Mutex<Superblock>,
    array: OnceLock<Weak<Array>>,
    /// Hot spares, in the order of their superblock table entries (after the members).
    spares: Mutex<Vec<(Arc<dyn Drive>, PathBuf)>>,
    /// Member paths in layout order (None where a member was never found).
    paths: Mutex<Vec<Option<PathBuf>>>,
}

impl Meta {
    fn array(&self) -> Option<Arc<Array>> {
        self.array.get().and_then(|w| w.upgrade())
    }

    /// Writes the current description, one event newer, to every member still in service and
    /// to every spare. The caller holds the `sb` lock.
    fn commit(&self, sb: &mut Superblock) -> io::Result<()> {
        sb.events += 1;
        // A version-1 pool becomes version 2 here: its journal was dealt with at import.
        sb.format = crate::superblock::VERSION;
        let at = sb.slot() * SLOT_BYTES as u64;
        let drives = self.array().map(|a| a.drives()).unwrap_or_default();
        let spares = self.spares.lock().clone();
        let mut written = 0;
        let mut last_err = None;
        for i in 0..sb.table.len() {
            if !matches!(
                sb.table[i].1,
                MemberState::Online | MemberState::Rebuilding | MemberState::Spare
            ) {
                continue;
            }
            let d = if i < sb.members {
                drives.get(i).cloned()
            } else {
                spares.get(i - sb.members).map(|s| s.0.clone())
            };
            let Some(d) = d else { continue };
            let mut me = sb.clone();
            me.member_index = i;
            me.member_uuid = sb.table[i].0;
            let buf = AlignedBuf::from_slice(&me.encode());
            match d.write_at(&buf, at).and_then(|_| d.flush()) {
                Ok(()) => written += 1,
                Err(e) => last_err = Some(e),
            }
        }
        match (written, last_err) {
            (0, Some(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// A member failed: record it, and put the first hot spare in its place to be rebuilt.
    fn member_failed(&self, member: usize, why: &io::Error) {
        let mut sb = self.sb.lock();
        sb.table[member].1 = MemberState::Faulty;
        if let Some(array) = self.array() {
            let mut spares = self.spares.lock();
            if !spares.is_empty() && sb.table.len() > sb.members {
                let (drive, path) = spares.remove(0);
                let first_spare = sb.members;
                let entry = sb.table.remove(first_spare);
                drop(spares);
                sb.table[member] = (entry.0, MemberState::Rebuilding);
                sb.rebuild_checkpoint = 0;
                array.install_member(member, drive, 0);
                tracing::warn!(
                    "hot spare {} takes the place of member {member}; rebuild it with `millrace pool rebuild`",
                    path.display()
                );
                self.paths.lock()[member] = Some(path);
            }
        }
        if let Err(e) = self.commit(&mut sb) {
            tracing::error!("could not record that member {member} failed ({why}): {e}");
        }
    }
}

/// A drive found at import: its path, the open drive, and its superblock.
type Found = (PathBuf, Arc<dyn Drive>, Superblock);

pub struct Pool {
    meta: Arc<Meta>,
    array: Arc<Array>,
    dirty: AtomicBool,
    /// Set by [`Pool::stop_work`]: a rebuild or scrub under way stops at its next batch.
    stopping: AtomicBool,
    /// Things worth telling the admin (unequal sizes, stale members, ...).
    pub notes: Vec<String>,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['-', '.'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        err(format!(
            "'{name}' is not a usable pool name: use 1 to 64 letters, digits, '-', '_' or '.', not starting with '-' or '.'"
        ))
    }
}

fn read_head(d: &dyn Drive, len: usize) -> io::Result<AlignedBuf> {
    let len = len.min(d.size_bytes() as usize / 4096 * 4096);
    let mut b = AlignedBuf::zeroed(len);
    d.read_at(&mut b, 0)?;
    Ok(b)
}

/// Reads the superblock of a drive (the newest whole slot).
pub fn read_superblock(d: &dyn Drive) -> io::Result<std::result::Result<Superblock, SbError>> {
    if d.size_bytes() < 2 * SLOT_BYTES as u64 {
        return Ok(Err(SbError::NotMillrace));
    }
    let head = read_head(d, 2 * SLOT_BYTES)?;
    Ok(Superblock::decode_slots(&head))
}

/// Refuses a drive that belongs to a pool (whole or damaged) or holds other data, so no admin
/// loses a filesystem or another pool to a typo; --force skips this.
fn refuse_if_claimed(p: &Path, d: &dyn Drive) -> Result<()> {
    match read_superblock(d) {
        Ok(Ok(sb)) => {
            return err(format!(
                "{} already belongs to pool '{}' ({}); destroy that pool first, or pass --force to overwrite it",
                p.display(),
                sb.name,
                sb.pool_uuid
            ))
        }
        Ok(Err(SbError::Corrupt(why))) => {
            return err(format!(
                "{} carries {why}; it may belong to a damaged pool: pass --force to overwrite it",
                p.display()
            ))
        }
        Ok(Err(SbError::NotMillrace)) => {}
        Err(e) => return err(format!("cannot read {}: {e}", p.display())),
    }
    let head = read_head(d, BLANK_CHECK)
        .map_err(|e| PoolError(format!("cannot read {}: {e}", p.display())))?;
    if head.iter().any(|&b| b != 0) {
        return err(format!(
            "{} is not blank: it holds data that is not a Millrace pool (a filesystem or partition table?); pass --force to overwrite it",
            p.display()
        ));
    }
    Ok(())
}

fn default_data_offset(min_size: u64) -> u64 {
    (min_size / 64 / MIB * MIB).clamp(MIB, 64 * MIB)
}

impl Pool {
    /// Creates a pool. Everything is checked before anything is written: a refusal leaves every
    /// drive as it was (and removes drive files this call created).
    pub fn create(opts: &CreateOptions, paths: &[PathBuf]) -> Result<Pool> {
        check_name(&opts.name)?;
        // The shape, checked before any file is touched.
        Geometry::new(opts.level, paths.len(), opts.group, opts.strip, MAX_STRIP)
            .map_err(PoolError)?;
        let mut seen: BTreeMap<PathBuf, usize> = BTreeMap::new();
        for (i, p) in paths.iter().enumerate() {
            let key = std::fs::canonicalize(p).unwrap_or_else(|_| absolute(p));
            if let Some(j) = seen.insert(key, i) {
                return err(format!(
                    "the same drive is given twice ({} and {}); each member must be a different drive",
                    paths[j].display(),
                    p.display()
                ));
            }
        }
        let mut created: Vec<PathBuf> = Vec::new();
        let result = Self::create_inner(opts, paths, &mut created);
        if result.is_err() {
            for p in &created {
                let _ = std::fs::remove_file(p);
            }
        }
        result
    }

    fn create_inner(
        opts: &CreateOptions,
        paths: &[PathBuf],
        created: &mut Vec<PathBuf>,
    ) -> Result<Pool> {
        if let Some(size) = opts.create_size {
            for p in paths {
                if !p.exists() {
                    if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                        std::fs::create_dir_all(dir).map_err(|e| {
                            PoolError(format!("cannot create the folder {}: {e}", dir.display()))
                        })?;
                    }
                    let f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(p)
                        .map_err(|e| PoolError(format!("cannot create {}: {e}", p.display())))?;
                    created.push(p.clone());
                    f.set_len(size)
                        .map_err(|e| PoolError(format!("cannot size {}: {e}", p.display())))?;
                }
            }
        }
        // Two names for one drive (a symlink, a hard link) are caught by identity.
        let mut ids: BTreeMap<(u64, u64), &Path> = BTreeMap::new();
        for p in paths {
            let id = FileDrive::identity(p).map_err(|e| {
                PoolError(format!(
                    "cannot use {}: {e}{}",
                    p.display(),
                    if opts.create_size.is_none() {
                        " (pass --create SIZE to make missing drive files)"
                    } else {
                        ""
                    }
                ))
            })?;
            if let Some(q) = ids.insert(id, p) {
                return err(format!(
                    "{} and {} are the same drive; each member must be a different drive",
                    q.display(),
                    p.display()
                ));
            }
        }
        let mut drives: Vec<Arc<dyn Drive>> = Vec::new();
        for p in paths {
            let d = FileDrive::open(p)
                .map_err(|e| PoolError(format!("cannot open {}: {e}", p.display())))?;
            drives.push(Arc::new(d));
        }
        // Drives this call created are sparse, so all-zero: their parity is already right.
        let fresh = created.len() == paths.len();
        Self::create_on(opts, paths, drives, fresh)
    }

    /// Creates a pool on drives already open (files, block devices, or test drives). `fresh`:
    /// the drives are known to be all zeroes, so redundancy needs no initialisation.
    pub fn create_on(
        opts: &CreateOptions,
        paths: &[PathBuf],
        drives: Vec<Arc<dyn Drive>>,
        fresh: bool,
    ) -> Result<Pool> {
        check_name(&opts.name)?;
        if !opts.force {
            for (p, d) in paths.iter().zip(&drives) {
                refuse_if_claimed(p, d.as_ref())?;
            }
        }
        let sizes: Vec<u64> = drives.iter().map(|d| d.size_bytes()).collect();
        let min = *sizes.iter().min().unwrap();
        let data_offset = opts.data_offset.unwrap_or_else(|| default_data_offset(min));
        if !data_offset.is_multiple_of(4096) || data_offset < 2 * SLOT_BYTES as u64 {
            return err(format!(
                "a data offset of {data_offset} bytes is not usable: it must be a multiple of 4 KiB and at least 8 KiB"
            ));
        }
        let need = data_offset + opts.strip;
        if let Some((p, s)) = paths.iter().zip(&sizes).find(|(_, &s)| s < need) {
            return err(format!(
                "{} is too small: it holds {s} bytes, but a member needs at least {need} ({data_offset} of metadata and one {} byte strip)",
                p.display(),
                opts.strip
            ));
        }
        let geo = Geometry::new(
            opts.level,
            paths.len(),
            opts.group,
            opts.strip,
            min - data_offset,
        )
        .map_err(PoolError)?;
        let mut notes = Vec::new();
        if sizes.iter().any(|&s| s != min) {
            notes.push(format!(
                "the drives differ in size; each member uses {} bytes, the size of the smallest, and the rest of the larger ones stays unused",
                min
            ));
        }
        let table: Vec<(Uuid, MemberState)> = paths
            .iter()
            .map(|_| (Uuid::new_v4(), MemberState::Online))
            .collect();
        let mut sb = Superblock {
            pool_uuid: Uuid::new_v4(),
            member_uuid: table[0].0,
            name: opts.name.clone(),
            level: opts.level,
            members: paths.len(),
            group: geo.group,
            strip: opts.strip,
            data_offset,
            member_data_bytes: geo.member_data_bytes,
            events: 0,
            member_index: 0,
            created: now(),
            clean: fresh,
            rebuild_checkpoint: 0,
            format: crate::superblock::VERSION,
            table,
        };
        let pool = Pool::assemble_from(
            sb.clone(),
            drives.clone(),
            paths.iter().cloned().map(Some).collect(),
            Vec::new(),
            notes,
        );
        {
            // Zero the other slot too, so no older pool's superblock survives beside ours.
            let zero = AlignedBuf::zeroed(2 * SLOT_BYTES);
            for d in &drives {
                d.write_at(&zero, 0)
                    .map_err(|e| PoolError(format!("cannot write {}: {e}", d.describe())))?;
            }
            pool.meta
                .commit(&mut sb)
                .map_err(|e| PoolError(format!("cannot write the superblocks: {e}")))?;
            *pool.meta.sb.lock() = sb;
        }
        Ok(pool)
    }

    fn assemble_from(
        sb: Superblock,
        drives: Vec<Arc<dyn Drive>>,
        paths: Vec<Option<PathBuf>>,
        spares: Vec<(Arc<dyn Drive>, PathBuf)>,
        notes: Vec<String>,
    ) -> Pool {
        let geo = sb.geometry().expect("superblock geometry was checked");
        let states: Vec<MemberState> = sb.table[..sb.members].iter().map(|t| t.1).collect();
        let array = Arc::new(Array::new(geo, sb.data_offset, drives, &states));
        for (m, s) in states.iter().enumerate() {
            if *s == MemberState::Rebuilding {
                // A rebuild interrupted by a restart goes on from its last checkpoint.
                array.set_rebuilt_rows(m, sb.rebuild_checkpoint);
            }
        }
        let meta = Arc::new(Meta {
            sb: Mutex::new(sb),
            array: OnceLock::new(),
            spares: Mutex::new(spares),
            paths: Mutex::new(paths),
        });
        let _ = meta.array.set(Arc::downgrade(&array));
        let m2 = meta.clone();
        array.set_failure_hook(Box::new(move |member, why| m2.member_failed(member, why)));
        Pool {
            meta,
            array,
            dirty: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            notes,
        }
    }

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
        let mut pools = Vec::new();
        for (_, members) in found {
            let newest = members.iter().map(|m| m.2.events).max().unwrap();
            let sb = members
                .iter()
                .find(|m| m.2.events == newest)
                .unwrap()
                .2
                .clone();
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
                                && matches!(
                                    state,
                                    MemberState::Online | MemberState::Rebuilding
                                )) =>
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
            let mut sb = sb;
            let changed = table != sb.table;
            let in_service =
                |s: MemberState| matches!(s, MemberState::Online | MemberState::Rebuilding);
            let lost_at_crash: Vec<usize> = (0..sb.members)
                .filter(|&i| !sb.clean && in_service(sb.table[i].1) && !in_service(table[i].1))
                .collect();
            sb.table = table;
            let name = sb.name.clone();
            // Read before any commit below rewrites the superblocks as the current version.
            let format = sb.format;
            let pool = Pool::assemble_from(sb, drives, mpaths, spares, pnotes);
            if !lost_at_crash.is_empty() && pool.array.geometry().level.is_parity() && !force {
                // A crash left stripes half written, and a member that was in service then is
                // gone now: its data in those stripes would be rebuilt from parity that may not
                // match. Linux md refuses such an array too; nothing has been written yet.
                let rows: u64 = pool
                    .array
                    .dirty_rows()
                    .iter()
                    .map(|r| r.end - r.start)
                    .sum();
                if rows > 0 {
                    let who: Vec<String> = lost_at_crash
                        .iter()
                        .map(|&i| match &pool.member_paths()[i] {
                            Some(p) => p.display().to_string(),
                            None => format!("member {i}"),
                        })
                        .collect();
                    return err(format!(
                        "pool '{name}' was not shut down cleanly, and {} was in service then but is missing or stale now: {rows} rows being written at the crash cannot be rebuilt reliably without it. Bring the drive back and import again, or import with --force to assemble the pool anyway (data of the missing drive in those rows may come back damaged)",
                        who.join(", ")
                    ));
                }
            }
            if changed {
                let mut sb = pool.meta.sb.lock().clone();
                pool.meta
                    .commit(&mut sb)
                    .map_err(|e| PoolError(format!("cannot record the members' states: {e}")))?;
                *pool.meta.sb.lock() = sb;
            }
            if !pool.superblock().clean {
                pool.recover_after_crash(format)?;
            } else if pool.array.geometry().level.is_parity() && pool.discard_log(format) {
                tracing::warn!(
                    "pool '{}': retired a log record that a clean stop had left behind",
                    pool.name()
                );
            }
            pools.push(pool);
        }
        Ok((pools, notes))
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

    pub fn array(&self) -> &Arc<Array> {
        &self.array
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

    pub fn name(&self) -> String {
        self.meta.sb.lock().name.clone()
    }

    pub fn uuid(&self) -> Uuid {
        self.meta.sb.lock().pool_uuid
    }

    pub fn member_paths(&self) -> Vec<Option<PathBuf>> {
        self.meta.paths.lock().clone()
    }

    pub fn spare_paths(&self) -> Vec<PathBuf> {
        self.meta
            .spares
            .lock()
            .iter()
            .map(|s| s.1.clone())
            .collect()
    }

    pub fn superblock(&self) -> Superblock {
        self.meta.sb.lock().clone()
    }

    /// Records the pool as in use before writes reach it by a path other than [`Pool::write_at`]
    /// (a server's volumes write to the array directly), so a crash is noticed at the next
    /// import and the write-intent bitmap's regions are resynced.
    pub fn mark_in_use(&self) -> Result<()> {
        self.mark_dirty()
    }

    /// Records the pool as dirty before its first write, so a crash is noticed at the next import.
    fn mark_dirty(&self) -> Result<()> {
        if self.dirty.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let mut sb = self.meta.sb.lock();
        if !sb.clean {
            return Ok(());
        }
        sb.clean = false;
        let mut copy = sb.clone();
        self.meta
            .commit(&mut copy)
            .map_err(|e| PoolError(format!("cannot mark the pool in use: {e}")))?;
        *sb = copy;
        Ok(())
    }

    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.mark_dirty()?;
        Ok(self.array.write_at(offset, data)?)
    }

    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        Ok(self.array.read_at(offset, buf)?)
    }

    /// Recomputes redundancy over the whole pool (after creation over used drives, or a crash),
    /// reporting progress as (rows done, rows total).
    pub fn resync(&self, mut progress: impl FnMut(u64, u64)) -> Result<()> {
        self.mark_dirty()?;
        let rows = self.array.geometry().rows();
        for r in 0..rows {
            self.array.resync_row(r)?;
            if r % 64 == 0 || r + 1 == rows {
                progress(r + 1, rows);
            }
        }
        self.array.flush()?;
        Ok(())
    }

    /// Flushes and records a clean shutdown.
    pub fn close(&self) -> Result<()> {
        self.array.settle()?;
        let mut sb = self.meta.sb.lock();
        if sb.clean && !self.dirty.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut copy = sb.clone();
        copy.clean = true;
        for (i, s) in self.array.member_states().into_iter().enumerate() {
            copy.table[i].1 = s;
        }
        if self
            .array
            .member_states()
            .contains(&MemberState::Rebuilding)
        {
            copy.rebuild_checkpoint = self.rebuild_checkpoint();
        }
        self.meta
            .commit(&mut copy)
            .map_err(|e| PoolError(format!("cannot record a clean shutdown: {e}")))?;
        *sb = copy;
        self.dirty.store(false, Ordering::Release);
        Ok(())
    }

    /// Erases the superblocks of every member, so the drives no longer form a pool.
    pub fn destroy(self) -> Result<()> {
        let zero = AlignedBuf::zeroed(2 * SLOT_BYTES);
        let spares: Vec<Arc<dyn Drive>> = self
            .meta
            .spares
            .lock()
            .iter()
            .map(|s| s.0.clone())
            .collect();
        for d in self.array.drives().iter().chain(spares.iter()) {
            if d.size_bytes() > 0 {
                d.write_at(&zero, 0)
                    .and_then(|_| d.flush())
                    .map_err(|e| PoolError(format!("cannot erase {}: {e}", d.describe())))?;
            }
        }
        Ok(())
    }

    pub fn state(&self) -> String {
        if self.array.offline_group().is_some() {
            return "offline".into();
        }
        let states = self.array.member_states();
        if states
            .iter()
            .all(|s| matches!(s, MemberState::Online | MemberState::Spare))
        {
            "online".into()
        } else if states.contains(&MemberState::Rebuilding) {
            "rebuilding".into()
        } else {
            "degraded".into()
        }
    }

    pub fn info(&self) -> PoolInfo {
        let sb = self.meta.sb.lock().clone();
        let geo = *self.array.geometry();
        let states = self.array.member_states();
        let paths = self.member_paths();
        PoolInfo {
            name: sb.name.clone(),
            uuid: sb.pool_uuid,
            level: geo.level,
            strip_bytes: geo.strip,
            group_size: geo.group,
            groups: geo.groups(),
            data_drives_per_group: geo.group_data(),
            size_bytes: geo.size_bytes(),
            full_stripe_bytes: geo.full_stripe_bytes(),
            state: self.state(),
            clean: sb.clean,
            events: sb.events,
            data_offset_bytes: sb.data_offset,
            member_data_bytes: geo.member_data_bytes,
            members: (0..geo.members)
                .map(|i| MemberInfo {
                    index: i,
                    path: paths[i].as_ref().map(|p| p.display().to_string()),
                    uuid: sb.table[i].0,
                    state: states[i],
                    data_offset_bytes: sb.data_offset,
                    group: i / geo.group,
                })
                .collect(),
            spares: self
                .spare_paths()
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
            rebuild: states.contains(&MemberState::Rebuilding).then(|| {
                let done = self.rebuild_checkpoint();
                RebuildInfo {
                    rows_done: done,
                    rows_total: geo.rows(),
                    percent: 100.0 * done as f64 / geo.rows().max(1) as f64,
                }
            }),
        }
    }

    /// The slot of the member at `path` (by identity, so any name for the drive works).
    fn slot_of(&self, path: &Path) -> Result<usize> {
        let want = FileDrive::identity(path).ok();
        let abs = absolute(path);
        let paths = self.member_paths();
        paths
            .iter()
            .position(|p| {
                p.as_ref().is_some_and(|p| {
                    absolute(p) == abs || (want.is_some() && FileDrive::identity(p).ok() == want)
                })
            })
            .ok_or_else(|| {
                PoolError(format!(
                    "{} is not a member of pool '{}'; `millrace pool show {}` lists its members",
                    path.display(),
                    self.name(),
                    self.name()
                ))
            })
    }

    /// Whether the pool would still serve with member `m` gone too.
    fn survives_losing(&self, m: usize) -> bool {
        let geo = self.array.geometry();
        let g = m / geo.group;
        let out = geo
            .group_members(g)
            .filter(|&i| i == m || self.array.member_state(i) != MemberState::Online)
            .count();
        out <= geo.tolerance_per_group()
    }

    /// Takes a member out of service, as a drive failure would. Refused where the pool would
    /// go offline.
    pub fn fail(&self, path: &Path) -> Result<String> {
        let m = self.slot_of(path)?;
        let st = self.array.member_state(m);
        if !matches!(st, MemberState::Online | MemberState::Rebuilding) {
            return err(
                format!("{} is already out of service ({st:?})", path.display()).to_lowercase(),
            );
        }
        if !self.survives_losing(m) {
            return err(format!(
                "failing {} would take pool '{}' offline: its group has no redundancy left to lose",
                path.display(),
                self.name()
            ));
        }
        self.array
            .fail_member(m, &io::Error::other("taken out of service by the admin"));
        let now = self.member_paths()[m].clone();
        Ok(match now {
            Some(p) if p != path && self.array.member_state(m) == MemberState::Rebuilding => {
                format!(
                    "{} failed; hot spare {} took its place and needs rebuilding",
                    path.display(),
                    p.display()
                )
            }
            _ => format!(
                "{} failed; pool '{}' is {}",
                path.display(),
                self.name(),
                self.state()
            ),
        })
    }

    /// Opens a drive to join the pool, checking it is big enough and not someone else's.
    fn claim(&self, path: &Path, force: bool) -> Result<Arc<dyn Drive>> {
        self.check_member_name(path)?;
        let d: Arc<dyn Drive> = Arc::new(
            FileDrive::open(path)
                .map_err(|e| PoolError(format!("cannot open {}: {e}", path.display())))?,
        );
        self.check_newcomer(path, d, force)
    }

    fn check_member_name(&self, path: &Path) -> Result<()> {
        let spares = self.spare_paths();
        if self.slot_of(path).is_ok() || spares.iter().any(|s| absolute(s) == absolute(path)) {
            return err(format!(
                "{} is already part of pool '{}'",
                path.display(),
                self.name()
            ));
        }
        Ok(())
    }

    /// Checks a drive about to join: big enough, and (unless forced) blank.
    fn check_newcomer(
        &self,
        path: &Path,
        d: Arc<dyn Drive>,
        force: bool,
    ) -> Result<Arc<dyn Drive>> {
        let sb = self.superblock();
        let need = sb.data_offset + sb.member_data_bytes;
        if d.size_bytes() < need {
            return err(format!(
                "{} is too small for pool '{}': it holds {} bytes, and a member needs {need}",
                path.display(),
                sb.name,
                d.size_bytes()
            ));
        }
        if !force {
            refuse_if_claimed(path, d.as_ref())?;
        }
        Ok(d)
    }

    /// Adds a hot spare. If a member is already out of service, the spare takes its place now.
    pub fn add_spare(&self, path: &Path, force: bool) -> Result<String> {
        let d = self.claim(path, force)?;
        {
            let mut sb = self.meta.sb.lock();
            if sb.table.len() >= crate::geometry::MAX_MEMBERS {
                return err("the pool has no room for more spares");
            }
            sb.table.push((Uuid::new_v4(), MemberState::Spare));
            self.meta.spares.lock().push((d, path.to_path_buf()));
            let mut copy = sb.clone();
            self.meta
                .commit(&mut copy)
                .map_err(|e| PoolError(format!("cannot record the spare: {e}")))?;
            *sb = copy;
        }
        let out = (0..self.array.geometry().members).find(|&m| {
            matches!(
                self.array.member_state(m),
                MemberState::Faulty | MemberState::Missing
            )
        });
        if let Some(m) = out {
            self.meta
                .member_failed(m, &io::Error::other("out of service"));
            return Ok(format!(
                "{} added as a hot spare and put in place of member {m}, which was out of service; rebuild it with `millrace pool rebuild {}`",
                path.display(),
                self.name()
            ));
        }
        Ok(format!(
            "{} added as a hot spare of pool '{}'",
            path.display(),
            self.name()
        ))
    }

    /// Puts `new` in place of member `old` and marks it for rebuilding. A member still in
    /// service is taken out first, where the pool survives that.
    pub fn replace(&self, old: &Path, new: &Path, force: bool) -> Result<String> {
        self.slot_of(old)?;
        let d = self.claim(new, force)?;
        self.install(old, new, d)
    }

    /// `replace` with a drive already open (a block device opened elsewhere, or a test drive).
    pub fn replace_with(&self, old: &Path, new: &Path, d: Arc<dyn Drive>) -> Result<String> {
        self.slot_of(old)?;
        self.check_member_name(new)?;
        let d = self.check_newcomer(new, d, false)?;
        self.install(old, new, d)
    }

    fn install(&self, old: &Path, new: &Path, d: Arc<dyn Drive>) -> Result<String> {
        let m = self.slot_of(old)?;
        if matches!(
            self.array.member_state(m),
            MemberState::Online | MemberState::Rebuilding
        ) {
            if !self.survives_losing(m) {
                return err(format!(
                    "replacing {} would take pool '{}' offline while the new drive is rebuilt",
                    old.display(),
                    self.name()
                ));
            }
            // Out of service first (this records it), without handing the slot to a spare.
            let spares = std::mem::take(&mut *self.meta.spares.lock());
            self.array
                .fail_member(m, &io::Error::other("being replaced by the admin"));
            *self.meta.spares.lock() = spares;
        }
        let mut sb = self.meta.sb.lock();
        sb.table[m] = (Uuid::new_v4(), MemberState::Rebuilding);
        sb.rebuild_checkpoint = 0;
        self.array.install_member(m, d, 0);
        self.meta.paths.lock()[m] = Some(new.to_path_buf());
        let mut copy = sb.clone();
        self.meta
            .commit(&mut copy)
            .map_err(|e| PoolError(format!("cannot record the replacement: {e}")))?;
        *sb = copy;
        Ok(format!(
            "{} replaces {} in pool '{}'",
            new.display(),
            old.display(),
            sb.name
        ))
    }

    /// The lowest row not yet rebuilt on any rebuilding member.
    fn rebuild_checkpoint(&self) -> u64 {
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
        for &m in &targets {
            self.array.set_member_state(m, MemberState::Online);
            sb.table[m].1 = MemberState::Online;
        }
        let mut copy = sb.clone();
        copy.rebuild_checkpoint = 0;
        self.meta
            .commit(&mut copy)
            .map_err(|e| PoolError(format!("cannot record the finished rebuild: {e}")))?;
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

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The cache of known pools under MILLRACE_HOME: name -> member paths.
#[derive(Default, Serialize, Deserialize)]
pub struct Cache {
    pub pools: BTreeMap<String, CachedPool>,
}

#[derive(Clone, Serialize, Deserialize)]
pub struct CachedPool {
    pub uuid: Uuid,
    pub members: Vec<PathBuf>,
}

impl Cache {
    pub fn home() -> PathBuf {
        std::env::var_os("MILLRACE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("millrace-data"))
    }

    fn file(home: &Path) -> PathBuf {
        home.join("pools.json")
    }

    pub fn load(home: &Path) -> Result<Cache> {
        match std::fs::read(Self::file(home)) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                PoolError(format!(
                    "the pool cache {} is damaged ({e}); delete it and run `millrace pool import DRIVES...`",
                    Self::file(home).display()
                ))
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Cache::default()),
            Err(e) => err(format!("cannot read {}: {e}", Self::file(home).display())),
        }
    }

    pub fn save(&self, home: &Path) -> Result<()> {
        std::fs::create_dir_all(home)
            .map_err(|e| PoolError(format!("cannot create {}: {e}", home.display())))?;
        let tmp = home.join("pools.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self).unwrap())
            .and_then(|_| std::fs::rename(&tmp, Self::file(home)))
            .map_err(|e| {
                PoolError(format!(
                    "cannot write the pool cache in {}: {e}",
                    home.display()
                ))
            })
    }

    pub fn remember(&mut self, pool: &Pool) {
        self.pools.insert(
            pool.name(),
            CachedPool {
                uuid: pool.uuid(),
                // Spares too: they are found again the same way as members.
                members: pool
                    .member_paths()
                    .into_iter()
                    .flatten()
                    .chain(pool.spare_paths())
                    .map(|p| absolute(&p))
                    .collect(),
            },
        );
    }

    /// Opens a pool by name from its remembered member paths.
    pub fn open(&self, name: &str) -> Result<Pool> {
        let Some(c) = self.pools.get(name) else {
            let known: Vec<&str> = self.pools.keys().map(|s| s.as_str()).collect();
            return err(format!(
                "no pool named '{name}' is known here (known: {}); create it with `millrace pool create` or find it with `millrace pool import DRIVES...`",
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            ));
        };
        let (pools, notes) = Pool::import(&c.members)?;
        let mut pool = pools.into_iter().find(|p| p.uuid() == c.uuid).ok_or_else(|| {
            PoolError(format!(
                "the drives remembered for pool '{name}' no longer hold it ({}); run `millrace pool import DRIVES...`",
                notes.join("; ")
            ))
        })?;
        pool.notes.extend(notes);
        Ok(pool)
    }
}
