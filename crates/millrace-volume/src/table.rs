//! The volume table: what volumes a pool holds and where, kept in two slots at the start of the
//! pool's data area.
//!
//! Slot layout (each slot is `SLOT_BYTES`, written whole): a 32-byte header (magic, format
//! version, generation, JSON length, CRC32C of the JSON) and the table as JSON. JSON because the
//! table is small, rarely written, and an admin with `millrace io read` can read it by eye.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use millrace_block::BlockDevice;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::alloc::{AllocMap, MapArea};
use crate::error::{refuse, Result, VolumeError};
use crate::Volume;

const MAGIC: &[u8; 8] = b"MRVOLTB1";
/// Version 2 tables record an allocation map, whose area a version 1 reader would not know to
/// keep free: such a reader refuses the table instead of creating a volume over the map.
const VERSION: u32 = 2;
const VERSION_NO_MAP: u32 = 1;
const HEADER: usize = 32;
const SLOT_BYTES: u64 = 1 << 20;
/// Bytes at the start of a pool that hold the volume table (before rounding up to a stripe).
pub const TABLE_AREA_BYTES: u64 = 2 * SLOT_BYTES;

/// What a script or the API sees of a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VolumeInfo {
    pub name: String,
    pub uuid: Uuid,
    /// Start within the pool, a multiple of the pool's full stripe.
    pub offset_bytes: u64,
    pub size_bytes: u64,
    pub created_unix: u64,
    /// Settings of the layers above (exports, shares), stored here so that they travel with the
    /// pool; this layer never reads them.
    #[serde(default)]
    pub props: BTreeMap<String, String>,
}

#[derive(Default, Serialize, Deserialize)]
struct Table {
    volumes: Vec<VolumeInfo>,
    /// Where the pool's allocation map lives; absent in pools made before it existed, until
    /// their first volume change adds one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    alloc_map: Option<MapArea>,
    /// The map's bits are right outside volumes too, so a new volume's extent deallocates only
    /// its granules that may hold data. Maps made before this field began with the free space
    /// clear whatever the drives held there; `track_gaps` marks it as data once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    gaps_tracked: bool,
}

struct Inner {
    generation: u64,
    table: Table,
    map: Option<Arc<AllocMap>>,
    open: HashMap<String, Arc<Volume>>,
    /// The table area holds bytes that are not a table (written with `millrace io write`).
    foreign: bool,
}

/// The volumes of one pool.
pub struct Volumes {
    dev: Arc<dyn BlockDevice>,
    align: u64,
    inner: Mutex<Inner>,
}

/// Refuses names that would not survive a URL, a path or an NQN.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        refuse(format!(
            "'{name}' is not a valid volume name: use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        ))
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// A size from outside (the CLI, the API) rounded up to whole stripes, or None where that
/// passes 2^64: such a size must be refused, never wrap to a small one (it did, making a 0-byte
/// volume, or a grow that ran over its neighbours).
fn checked_round_up(x: u64, a: u64) -> Option<u64> {
    x.div_ceil(a).checked_mul(a)
}

pub(crate) fn human(b: u64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

enum Slot {
    Empty,
    Foreign,
    Damaged,
    Good(u64, Table),
}

impl Volumes {
    /// Reads the table of the pool `dev`; a pool that never held volumes has an empty one.
    pub fn open(dev: Arc<dyn BlockDevice>) -> Result<Volumes> {
        let align = dev.preferred_io_bytes().max(4096);
        let mut best: Option<(u64, Table)> = None;
        let (mut damaged, mut foreign) = (0, 0);
        for s in 0..2 {
            match read_slot(dev.as_ref(), s)? {
                Slot::Good(g, t) => {
                    if best.as_ref().is_none_or(|(bg, _)| g > *bg) {
                        best = Some((g, t));
                    }
                }
                Slot::Damaged => damaged += 1,
                Slot::Foreign => foreign += 1,
                Slot::Empty => {}
            }
        }
        let (generation, table) = match best {
            Some((_, t)) if !fits(&t, round_up(TABLE_AREA_BYTES, align), dev.size_bytes() / align * align) => {
                return refuse(
                    "this pool's volume table places volumes outside the pool or over each other (the table was not written by this \
                     version of Millrace, or a drive returned bad data); no volume is opened so none can write over another. \
                     Run `millrace pool scrub --repair`, or restore the pool's drives from a backup",
                )
            }
            Some(b) => b,
            None if damaged > 0 => {
                return refuse(
                    "both copies of this pool's volume table fail their checksum; the volume layout is lost. \
                     Restore the pool's drives from a backup, or run `millrace pool scrub --repair` if a drive returned bad data",
                )
            }
            None => (0, Table::default()),
        };
        let map = match table.alloc_map {
            Some(area) => Some(Arc::new(AllocMap::load(dev.clone(), area).map_err(
                |source| VolumeError::Io {
                    what: "cannot read the pool's allocation map".into(),
                    source,
                },
            )?)),
            None => None,
        };
        Ok(Volumes {
            dev,
            align,
            inner: Mutex::new(Inner {
                generation,
                table,
                map,
                open: HashMap::new(),
                foreign: generation == 0 && foreign > 0,
            }),
        })
    }

    /// The alignment of every volume's start and size: the pool's full stripe.
    pub fn alignment(&self) -> u64 {
        self.align
    }

    /// Where the first volume may start.
    pub fn data_start(&self) -> u64 {
        round_up(TABLE_AREA_BYTES, self.align)
    }

    /// Bytes volumes may use in all: the volume space less the allocation map's area.
    pub fn capacity(&self) -> u64 {
        self.capacity_of(&self.inner.lock().table)
    }

    /// The allocation map's area (offset, bytes) in the pool: where it is, or where the first
    /// volume change will put it. No volume is placed there.
    pub fn map_area_bytes(&self) -> Option<(u64, u64)> {
        self.map_area(&self.inner.lock().table)
            .map(|a| (a.offset_bytes, a.bytes))
    }

    fn capacity_of(&self, t: &Table) -> u64 {
        let map = self.map_area(t).map_or(0, |a| a.bytes);
        self.raw_capacity().saturating_sub(map)
    }

    fn raw_capacity(&self) -> u64 {
        (self.dev.size_bytes() / self.align * self.align).saturating_sub(self.data_start())
    }

    fn space_end(&self) -> u64 {
        self.data_start() + self.raw_capacity()
    }

    /// Where the allocation map is, or will go when the first volume change makes it: at the
    /// start of the volume space (next to the table, the part of a pool raw users already keep
    /// clear), or, in a pool made before maps whose first volume lies there, at the end. None:
    /// both are taken by volumes; the pool then has no map.
    fn map_area(&self, t: &Table) -> Option<MapArea> {
        if t.alloc_map.is_some() {
            return t.alloc_map;
        }
        let (base, end) = (self.data_start(), self.space_end());
        let free = |a: &MapArea| {
            t.volumes.iter().all(|v| {
                v.offset_bytes + v.size_bytes <= a.offset_bytes
                    || v.offset_bytes >= a.offset_bytes + a.bytes
            })
        };
        let start = MapArea::plan(base, end, self.align, true).filter(free);
        start.or_else(|| MapArea::plan(base, end, self.align, false).filter(free))
    }

    pub fn free_bytes(&self) -> u64 {
        let used: u64 = self
            .inner
            .lock()
            .table
            .volumes
            .iter()
            .map(|v| v.size_bytes)
            .sum();
        self.capacity().saturating_sub(used)
    }

    /// The largest volume that could be created now (free space may lie in several ranges).
    pub fn largest_free_bytes(&self) -> u64 {
        self.largest_gap(&self.inner.lock().table)
    }

    /// Bytes of the volumes that may hold data, by the allocation map: whole granules (a write
    /// of one byte counts its full stripe), so trimming whole stripes shows space coming back.
    /// A pool without a map counts its volumes whole.
    pub fn allocated_bytes(&self) -> u64 {
        let g = self.inner.lock();
        (g.table.volumes.iter())
            .map(|v| match &g.map {
                Some(m) => m.data_bytes(v.offset_bytes, v.size_bytes),
                None => v.size_bytes,
            })
            .sum()
    }

    /// True when the start of the pool holds bytes written directly (not a volume table):
    /// creating a volume would overwrite them, so [`Volumes::create`] refuses until
    /// [`Volumes::claim`].
    pub fn holds_foreign_data(&self) -> bool {
        self.inner.lock().foreign
    }

    /// Writes an empty table over whatever the table area held.
    pub fn claim(&self) -> Result<()> {
        let mut g = self.inner.lock();
        g.foreign = false;
        self.commit(&mut g)
    }

    pub fn list(&self) -> Vec<VolumeInfo> {
        let mut v = self.inner.lock().table.volumes.clone();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn get(&self, name: &str) -> Option<VolumeInfo> {
        self.inner
            .lock()
            .table
            .volumes
            .iter()
            .find(|v| v.name == name)
            .cloned()
    }

    /// Creates a volume of at least `size` bytes (rounded up to the full stripe) in the first
    /// gap that holds it.
    pub fn create(&self, name: &str, size: u64) -> Result<VolumeInfo> {
        self.create_with_props(name, size, BTreeMap::new())
    }

    /// Creates a volume that carries `props` from the start, in the same table write (an
    /// orchestrator's tag on it is never missing after a crash, as it could be with a second
    /// write).
    pub fn create_with_props(
        &self,
        name: &str,
        size: u64,
        props: BTreeMap<String, String>,
    ) -> Result<VolumeInfo> {
        check_name(name)?;
        if size == 0 {
            return refuse("a volume needs a size above zero (for example --size 10G)");
        }
        let mut g = self.inner.lock();
        if g.foreign {
            return refuse(
                "the start of this pool holds data written directly with `millrace io write`, where the volume table goes; \
                 creating a volume would overwrite it. Copy that data off, then create the volume with --force",
            );
        }
        if g.table.volumes.iter().any(|v| v.name == name) {
            return refuse(format!("a volume named {name} already exists in this pool; pick another name or delete it first"));
        }
        self.ensure_map(&mut g)?;
        self.track_gaps(&mut g)?;
        let Some(offset) =
            checked_round_up(size, self.align).and_then(|rounded| self.find_gap(&g.table, rounded))
        else {
            return refuse(format!(
                "the pool has no room for a volume of {}: {} is free in all, {} in the largest free range; delete or shrink volumes, or use a smaller size",
                human(size),
                human(self.capacity_of(&g.table) - used(&g.table)),
                human(self.largest_gap(&g.table)),
            ));
        };
        let size = round_up(size, self.align);
        let info = VolumeInfo {
            name: name.to_string(),
            uuid: Uuid::new_v4(),
            offset_bytes: offset,
            size_bytes: size,
            created_unix: now(),
            props,
        };
        // Whatever a deleted volume (or anything before) left here must never reach the new
        // one: its extent is deallocated, durably, before the table gives it out.
        self.deallocate(&g, offset, size)?;
        g.table.volumes.push(info.clone());
        if let Err(e) = self.commit(&mut g) {
            g.table.volumes.pop();
            return Err(e);
        }
        Ok(info)
    }

    /// Deletes a volume; I/O through handles still open fails from now on.
    pub fn delete(&self, name: &str) -> Result<()> {
        let mut g = self.inner.lock();
        let Some(i) = g.table.volumes.iter().position(|v| v.name == name) else {
            return refuse(no_such(name));
        };
        let removed = g.table.volumes.remove(i);
        if let Err(e) = self.commit(&mut g) {
            g.table.volumes.insert(i, removed);
            return Err(e);
        }
        if let Some(v) = g.open.remove(name) {
            v.mark_deleted();
        }
        // The space goes back to the drives. Should this fail, the table no longer holds the
        // volume, and the next volume made there is deallocated before it is given out.
        if let Err(e) = self.deallocate(&g, removed.offset_bytes, removed.size_bytes) {
            tracing::warn!(
                "volume {name} is deleted, but its space was not given back to the drives: {e}"
            );
        }
        Ok(())
    }

    /// Grows a volume in place to at least `new_size` bytes; the space after it must be free.
    pub fn grow(&self, name: &str, new_size: u64) -> Result<VolumeInfo> {
        let mut g = self.inner.lock();
        let Some(i) = g.table.volumes.iter().position(|v| v.name == name) else {
            return refuse(no_such(name));
        };
        let cur = g.table.volumes[i].clone();
        let new_size = checked_round_up(new_size, self.align).unwrap_or(u64::MAX);
        if new_size < cur.size_bytes {
            return refuse(format!(
                "volume {name} is {} and cannot shrink (the data of the filesystem on it would be cut off); give a size of at least its current one",
                human(cur.size_bytes)
            ));
        }
        let limit = g
            .table
            .volumes
            .iter()
            .map(|v| v.offset_bytes)
            .chain(self.map_area(&g.table).map(|a| a.offset_bytes))
            .filter(|&o| o > cur.offset_bytes)
            .min()
            .unwrap_or(self.space_end());
        if cur
            .offset_bytes
            .checked_add(new_size)
            .is_none_or(|end| end > limit)
        {
            return refuse(format!(
                "volume {name} can grow to at most {} in place (the space after it ends there); create a new volume instead",
                human(limit - cur.offset_bytes)
            ));
        }
        self.track_gaps(&mut g)?;
        self.deallocate(
            &g,
            cur.offset_bytes + cur.size_bytes,
            new_size - cur.size_bytes,
        )?;
        g.table.volumes[i].size_bytes = new_size;
        if let Err(e) = self.commit(&mut g) {
            g.table.volumes[i].size_bytes = cur.size_bytes;
            return Err(e);
        }
        if let Some(v) = g.open.get(name) {
            v.set_size(new_size);
        }
        Ok(g.table.volumes[i].clone())
    }

    /// Sets (or with `None` removes) one of a volume's props.
    pub fn set_prop(&self, name: &str, key: &str, value: Option<&str>) -> Result<VolumeInfo> {
        let mut g = self.inner.lock();
        let Some(i) = g.table.volumes.iter().position(|v| v.name == name) else {
            return refuse(no_such(name));
        };
        let old = g.table.volumes[i].props.clone();
        match value {
            Some(v) => g.table.volumes[i].props.insert(key.into(), v.into()),
            None => g.table.volumes[i].props.remove(key),
        };
        if let Err(e) = self.commit(&mut g) {
            g.table.volumes[i].props = old;
            return Err(e);
        }
        Ok(g.table.volumes[i].clone())
    }

    /// A handle for I/O; every caller asking for the same volume shares one handle.
    pub fn open_volume(&self, name: &str) -> Result<Arc<Volume>> {
        let mut g = self.inner.lock();
        if let Some(v) = g.open.get(name) {
            return Ok(v.clone());
        }
        let Some(info) = g.table.volumes.iter().find(|v| v.name == name) else {
            return refuse(no_such(name));
        };
        let v = Arc::new(Volume::new(
            self.dev.clone(),
            g.map.clone(),
            info.name.clone(),
            info.uuid,
            info.offset_bytes,
            info.size_bytes,
        ));
        g.open.insert(name.to_string(), v.clone());
        Ok(v)
    }

    /// Makes `[offset, offset + len)` read as zeroes on the drives and in the map, durably.
    fn deallocate(&self, g: &Inner, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let io = |what: &str, source| VolumeError::Io {
            what: format!("cannot {what}"),
            source,
        };
        // Only what may hold data: a granule the map has clear reads as zeroes on the drives
        // already (see `track_gaps`), and a deallocation through a parity array writes.
        let runs = match &g.map {
            Some(m) => m.data_runs(offset, len),
            None => vec![(offset, len)],
        };
        let cleared = g.map.as_ref().map(|m| m.begin_clear(offset, len));
        let r = (runs.iter()).try_for_each(|&(o, l)| self.dev.discard(o, l));
        if let (Some(m), Some(c)) = (&g.map, cleared) {
            if r.is_ok() {
                m.end_clear(c);
            } else {
                m.restore(&c);
            }
        }
        r.map_err(|e| io("zero the volume's space on the drives", e))?;
        match &g.map {
            Some(m) => m.commit(),
            None => self.dev.flush(),
        }
        .map_err(|e| io("make the zeroed space durable", e))
    }

    /// Marks the free space of a map made before `gaps_tracked` as data, durably, once: what
    /// the drives hold there is unknown, so the next volume made there deallocates it.
    fn track_gaps(&self, g: &mut Inner) -> Result<()> {
        let Some(m) = g.map.as_ref().filter(|_| !g.table.gaps_tracked) else {
            return Ok(());
        };
        for (start, end) in self.gaps(&g.table) {
            m.note_write(start, end - start);
        }
        m.commit().map_err(|source| VolumeError::Io {
            what: "cannot write the pool's allocation map".into(),
            source,
        })?;
        g.table.gaps_tracked = true;
        Ok(())
    }

    /// Gives the pool its allocation map (see `map_area`), where none is yet; volumes that
    /// exist and the free space (whose contents are unknown) are marked as data throughout.
    fn ensure_map(&self, g: &mut Inner) -> Result<()> {
        if g.map.is_some() {
            return Ok(());
        }
        let Some(area) = self.map_area(&g.table) else {
            tracing::warn!(
                "this pool's volumes take both places its allocation map could go: \
                 they read from the drives everywhere (a new volume's space is still zeroed first)"
            );
            return Ok(());
        };
        let data: Vec<(u64, u64)> = (g.table.volumes.iter())
            .map(|v| (v.offset_bytes, v.size_bytes))
            .chain(self.gaps(&g.table).into_iter().map(|(s, e)| (s, e - s)))
            .collect();
        let map = AllocMap::new(self.dev.clone(), area, &data);
        map.commit().map_err(|source| VolumeError::Io {
            what: "cannot write the pool's allocation map".into(),
            source,
        })?;
        g.map = Some(Arc::new(map));
        g.table.alloc_map = Some(area);
        g.table.gaps_tracked = true;
        Ok(())
    }

    /// Free ranges of the volume space, in order (the map's area is not free).
    fn gaps(&self, t: &Table) -> Vec<(u64, u64)> {
        let mut taken: Vec<(u64, u64)> = t
            .volumes
            .iter()
            .map(|v| (v.offset_bytes, v.offset_bytes + v.size_bytes))
            .collect();
        taken.extend(
            self.map_area(t)
                .map(|a| (a.offset_bytes, a.offset_bytes + a.bytes)),
        );
        gaps(taken, self.data_start(), self.space_end())
    }

    fn find_gap(&self, t: &Table, size: u64) -> Option<u64> {
        self.gaps(t)
            .into_iter()
            .find(|(s, e)| e - s >= size)
            .map(|(s, _)| s)
    }

    fn largest_gap(&self, t: &Table) -> u64 {
        self.gaps(t)
            .into_iter()
            .map(|(s, e)| e - s)
            .max()
            .unwrap_or(0)
    }

    fn commit(&self, g: &mut Inner) -> Result<()> {
        let gen = g.generation + 1;
        let json = serde_json::to_vec(&g.table).expect("the table serialises");
        if json.len() > SLOT_BYTES as usize - HEADER {
            return refuse("the volume table is full (too many volumes or props); delete volumes you no longer use");
        }
        let len = round_up((HEADER + json.len()) as u64, 4096) as usize;
        let mut buf = vec![0u8; len];
        buf[..8].copy_from_slice(MAGIC);
        let version = if g.table.alloc_map.is_some() {
            VERSION
        } else {
            VERSION_NO_MAP
        };
        buf[8..12].copy_from_slice(&version.to_le_bytes());
        buf[16..24].copy_from_slice(&gen.to_le_bytes());
        buf[24..28].copy_from_slice(&(json.len() as u32).to_le_bytes());
        buf[28..32].copy_from_slice(&crc32c::crc32c(&json).to_le_bytes());
        buf[HEADER..HEADER + json.len()].copy_from_slice(&json);
        let io = |what: &str, source| VolumeError::Io {
            what: format!("cannot {what} the volume table"),
            source,
        };
        self.dev
            .write_at((gen % 2) * SLOT_BYTES, &buf)
            .map_err(|e| io("write", e))?;
        self.dev.flush().map_err(|e| io("flush", e))?;
        g.generation = gen;
        Ok(())
    }
}

fn no_such(name: &str) -> String {
    format!("this pool has no volume named {name}; `millrace volume list` shows the ones it has")
}

/// Whether every volume of a table read from the drives lies inside the pool, after the
/// table area, and apart from the others: a table this code did not write must not make two
/// volumes share bytes or reach past the pool.
fn fits(t: &Table, start: u64, end: u64) -> bool {
    let mut spans = Vec::with_capacity(t.volumes.len() + 1);
    if let Some(a) = t.alloc_map {
        // Its bits must cover the whole volume space, and its area lie inside it.
        let covers = a.granule_bytes >= 4096
            && a.granules <= crate::alloc::MAX_GRANULES
            && a.granules.div_ceil(8) <= a.bytes
            && a.base_bytes == start
            && a.granules
                .checked_mul(a.granule_bytes)
                .is_some_and(|c| c >= end - start);
        match a.offset_bytes.checked_add(a.bytes) {
            Some(e) if covers && a.offset_bytes >= start && e <= end => {
                spans.push((a.offset_bytes, e))
            }
            _ => return false,
        }
    }
    for v in &t.volumes {
        match v.offset_bytes.checked_add(v.size_bytes) {
            Some(e) if v.offset_bytes >= start && e <= end => spans.push((v.offset_bytes, e)),
            _ => return false,
        }
    }
    spans.sort();
    spans.windows(2).all(|w| w[0].1 <= w[1].0)
}

fn used(t: &Table) -> u64 {
    t.volumes.iter().map(|v| v.size_bytes).sum()
}

/// Free ranges between `start` and `end`, in order, around the `taken` ones.
fn gaps(mut vs: Vec<(u64, u64)>, start: u64, end: u64) -> Vec<(u64, u64)> {
    vs.sort();
    let mut out = Vec::new();
    let mut at = start;
    for (s, e) in vs {
        if s > at {
            out.push((at, s));
        }
        at = at.max(e);
    }
    if end > at {
        out.push((at, end));
    }
    out
}

fn read_slot(dev: &dyn BlockDevice, slot: u64) -> Result<Slot> {
    let mut head = vec![0u8; 4096];
    let off = slot * SLOT_BYTES;
    if off + SLOT_BYTES > dev.size_bytes() {
        return refuse(format!(
            "the pool ({}) is too small to hold volumes; it needs more than {}",
            human(dev.size_bytes()),
            human(TABLE_AREA_BYTES)
        ));
    }
    dev.read_at(off, &mut head)
        .map_err(|source| VolumeError::Io {
            what: "cannot read the volume table".into(),
            source,
        })?;
    if &head[..8] != MAGIC {
        return Ok(if head.iter().all(|&b| b == 0) {
            Slot::Empty
        } else {
            Slot::Foreign
        });
    }
    let version = u32::from_le_bytes(head[8..12].try_into().unwrap());
    let gen = u64::from_le_bytes(head[16..24].try_into().unwrap());
    let len = u32::from_le_bytes(head[24..28].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(head[28..32].try_into().unwrap());
    if !(VERSION_NO_MAP..=VERSION).contains(&version) || len > SLOT_BYTES as usize - HEADER {
        return Ok(Slot::Damaged);
    }
    let mut buf = vec![0u8; round_up((HEADER + len) as u64, 4096) as usize];
    dev.read_at(off, &mut buf)
        .map_err(|source| VolumeError::Io {
            what: "cannot read the volume table".into(),
            source,
        })?;
    let json = &buf[HEADER..HEADER + len];
    if crc32c::crc32c(json) != crc {
        return Ok(Slot::Damaged);
    }
    match serde_json::from_slice::<Table>(json) {
        Ok(t) => Ok(Slot::Good(gen, t)),
        Err(_) => Ok(Slot::Damaged),
    }
}

impl Volumes {
    /// Writes the allocation map as it is in memory (and flushes the pool): after a clean stop,
    /// writes never flushed by their client are still found. Dropping does this too.
    pub fn close(&self) -> Result<()> {
        let map = self.inner.lock().map.clone();
        match map {
            Some(m) if m.needs_commit() => m.commit().map_err(|source| VolumeError::Io {
                what: "cannot write the pool's allocation map".into(),
                source,
            }),
            _ => Ok(()),
        }
    }
}

impl Drop for Volumes {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(
                "{e}; regions written since the last flush may read as zeroes after a restart"
            );
        }
    }
}

impl fmt::Debug for Volumes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Volumes")
            .field("volumes", &self.list())
            .finish()
    }
}
