//! Creating a pool: checks that refuse a drive in use or holding data, and the first superblocks.

use super::*;

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
pub(super) fn refuse_if_claimed(p: &Path, d: &dyn Drive) -> Result<()> {
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
        let fresh = fresh || zero_data_areas(&drives, data_offset, geo.member_data_bytes);
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

    pub(super) fn assemble_from(
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
            found_unclean: false,
            notes,
        }
    }
}

/// Whether every member's data area now reads zeroes, each zeroed by one unmapping request and
/// flushed: then the new pool is consistent at once (zeroes have zero parity, and mirrors of
/// zeroes are equal), in seconds on drives that deallocate, where the resync would read and
/// write every row. A member that offers no such request, or fails it, leaves the pool to the
/// resync, which meets any real I/O error again and reports it.
fn zero_data_areas(drives: &[Arc<dyn Drive>], offset: u64, len: u64) -> bool {
    drives
        .iter()
        .all(|d| matches!(d.zero_by_unmap(offset, len), Ok(true)) && d.flush().is_ok())
}
