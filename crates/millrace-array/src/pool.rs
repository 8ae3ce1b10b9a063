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
use std::sync::Arc;
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
}

#[derive(Clone, Debug, Serialize, Deserialize)]
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
    drives: Vec<Arc<dyn Drive>>,
}

impl Meta {
    /// Writes the current description, one event newer, to every member still in service.
    fn commit(&self, sb: &mut Superblock) -> io::Result<()> {
        sb.events += 1;
        let at = sb.slot() * SLOT_BYTES as u64;
        let mut written = 0;
        let mut last_err = None;
        for (i, d) in self.drives.iter().enumerate() {
            if !matches!(
                sb.table[i].1,
                MemberState::Online | MemberState::Rebuilding | MemberState::Spare
            ) {
                continue;
            }
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
}

pub struct Pool {
    meta: Arc<Meta>,
    array: Arc<Array>,
    paths: Vec<Option<PathBuf>>,
    dirty: AtomicBool,
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

    fn create_inner(opts: &CreateOptions, paths: &[PathBuf], created: &mut Vec<PathBuf>) -> Result<Pool> {
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
        for (p, d) in paths.iter().zip(&drives) {
            if opts.force {
                break;
            }
            match read_superblock(d.as_ref()) {
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
            let head = read_head(d.as_ref(), BLANK_CHECK)
                .map_err(|e| PoolError(format!("cannot read {}: {e}", p.display())))?;
            if head.iter().any(|&b| b != 0) {
                return err(format!(
                    "{} is not blank: it holds data that is not a Millrace pool (a filesystem or partition table?); pass --force to overwrite it",
                    p.display()
                ));
            }
        }
        let sizes: Vec<u64> = drives.iter().map(|d| d.size_bytes()).collect();
        let min = *sizes.iter().min().unwrap();
        let data_offset = opts.data_offset.unwrap_or_else(|| default_data_offset(min));
        if data_offset % 4096 != 0 || data_offset < 2 * SLOT_BYTES as u64 {
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
        let geo = Geometry::new(opts.level, paths.len(), opts.group, opts.strip, min - data_offset)
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
        // Drives this call created are sparse, so all-zero: their parity is already right.
        let fresh = created.len() == paths.len();
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
            table,
        };
        let pool = Pool::assemble_from(sb.clone(), drives, paths.iter().cloned().map(Some).collect(), notes);
        {
            // Zero the other slot too, so no older pool's superblock survives beside ours.
            let zero = AlignedBuf::zeroed(2 * SLOT_BYTES);
            for d in &pool.meta.drives {
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
        notes: Vec<String>,
    ) -> Pool {
        let geo = sb.geometry().expect("superblock geometry was checked");
        let states: Vec<MemberState> = sb.table.iter().map(|t| t.1).collect();
        let array = Arc::new(Array::new(geo, sb.data_offset, drives.clone(), &states));
        let meta = Arc::new(Meta {
            sb: Mutex::new(sb),
            drives,
        });
        let m2 = meta.clone();
        array.set_failure_hook(Box::new(move |member, why| {
            let mut sb = m2.sb.lock();
            sb.table[member].1 = MemberState::Faulty;
            if let Err(e) = m2.commit(&mut sb) {
                tracing::error!("could not record that member {member} failed ({why}): {e}");
            }
        }));
        Pool {
            meta,
            array,
            paths,
            dirty: AtomicBool::new(false),
            notes,
        }
    }

    /// Finds the pools on these drives and assembles each one. Drives without a Millrace
    /// superblock, or with a damaged one, are reported in the returned notes and left alone.
    pub fn import(paths: &[PathBuf]) -> Result<(Vec<Pool>, Vec<String>)> {
        let mut notes = Vec::new();
        let mut found: BTreeMap<Uuid, Vec<(PathBuf, Arc<dyn Drive>, Superblock)>> = BTreeMap::new();
        for p in paths {
            let d = match FileDrive::open(p) {
                Ok(d) => Arc::new(d) as Arc<dyn Drive>,
                Err(e) => {
                    notes.push(format!("skipped {}: {e}", p.display()));
                    continue;
                }
            };
            match read_superblock(d.as_ref()) {
                Ok(Ok(sb)) => found.entry(sb.pool_uuid).or_default().push((p.clone(), d, sb)),
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
            let sb = members.iter().find(|m| m.2.events == newest).unwrap().2.clone();
            let mut drives: Vec<Arc<dyn Drive>> = Vec::new();
            let mut mpaths = Vec::new();
            let mut table = sb.table.clone();
            let mut pnotes = Vec::new();
            for (i, (uuid, state)) in sb.table.iter().enumerate() {
                let hit = members.iter().find(|m| m.2.member_uuid == *uuid);
                match hit {
                    Some((p, d, msb)) if msb.events == newest => {
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
            sb.table = table;
            let pool = Pool::assemble_from(sb, drives, mpaths, pnotes);
            if changed {
                let mut sb = pool.meta.sb.lock().clone();
                pool.meta
                    .commit(&mut sb)
                    .map_err(|e| PoolError(format!("cannot record the members' states: {e}")))?;
                *pool.meta.sb.lock() = sb;
            }
            pools.push(pool);
        }
        Ok((pools, notes))
    }

    pub fn array(&self) -> &Arc<Array> {
        &self.array
    }

    pub fn name(&self) -> String {
        self.meta.sb.lock().name.clone()
    }

    pub fn uuid(&self) -> Uuid {
        self.meta.sb.lock().pool_uuid
    }

    pub fn member_paths(&self) -> Vec<Option<PathBuf>> {
        self.paths.clone()
    }

    pub fn superblock(&self) -> Superblock {
        self.meta.sb.lock().clone()
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
        self.array.flush()?;
        let mut sb = self.meta.sb.lock();
        if sb.clean && !self.dirty.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut copy = sb.clone();
        copy.clean = true;
        for (i, s) in self.array.member_states().into_iter().enumerate() {
            copy.table[i].1 = s;
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
        for d in &self.meta.drives {
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
        if states.iter().all(|s| matches!(s, MemberState::Online | MemberState::Spare)) {
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
                    path: self.paths[i].as_ref().map(|p| p.display().to_string()),
                    uuid: sb.table[i].0,
                    state: states[i],
                    data_offset_bytes: sb.data_offset,
                    group: i / geo.group,
                })
                .collect(),
        }
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
            .map_err(|e| PoolError(format!("cannot write the pool cache in {}: {e}", home.display())))
    }

    pub fn remember(&mut self, pool: &Pool) {
        self.pools.insert(
            pool.name(),
            CachedPool {
                uuid: pool.uuid(),
                members: pool
                    .member_paths()
                    .into_iter()
                    .flatten()
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
