//! The superblock every member carries, so that a pool can be found and assembled from its drives
//! alone. Two 4 KiB slots at the start of the member; a write goes to the slot chosen by the event
//! counter's parity, so a write torn by a power cut leaves the previous version in the other slot.
//!
//! Layout (little-endian), one slot:
//! ```text
//!    0  magic "MILLRACE"          8  format version u32     12  flags u32 (bit 0: clean)
//!   16  pool uuid [16]           32  member uuid [16]       48  pool name [64], NUL padded
//!  112  level u8, pad u8, members u16, group u16, spares u16  120  strip u32, pad u32
//!  128  data offset u64         136  data bytes per member u64     144  event counter u64
//!  152  member index u16, pad [6]     160  created (unix seconds) u64
//!  168  rebuild checkpoint (row) u64  176  reserved up to 256
//!  256  member table: (members + spares) x { uuid [16], state u8, pad [7] }, at most
//!       MAX_MEMBERS entries; hot spares follow the members, in state Spare
//! 4092  crc32c of bytes 0..4092
//! ```

pub use crate::error::SbError;

use crate::geometry::{Geometry, Level, MAX_MEMBERS};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub const MAGIC: &[u8; 8] = b"MILLRACE";
/// Version 2: the partial-parity log replaces version 1's degraded-write journal in the area
/// from `journal::JOURNAL_OFFSET` to the data. Version 1 pools are read, their journal replayed
/// or retired at import, and rewritten as version 2 at the next superblock commit (the first
/// write).
pub const VERSION: u32 = 2;
/// The oldest version this build reads (and converts).
pub const OLDEST_VERSION: u32 = 1;
pub const SLOT_BYTES: usize = 4096;
pub const SLOTS: u64 = 2;
const NAME_BYTES: usize = 64;
const TABLE: usize = 256;
const ENTRY: usize = 24;
const CRC_AT: usize = SLOT_BYTES - 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum MemberState {
    Online,
    Faulty,
    Spare,
    Rebuilding,
    /// Removed from the pool; its slot waits for a replacement.
    Missing,
}

impl MemberState {
    fn code(self) -> u8 {
        match self {
            MemberState::Online => 1,
            MemberState::Faulty => 2,
            MemberState::Spare => 3,
            MemberState::Rebuilding => 4,
            MemberState::Missing => 5,
        }
    }
    fn from_code(c: u8) -> Option<MemberState> {
        Some(match c {
            1 => MemberState::Online,
            2 => MemberState::Faulty,
            3 => MemberState::Spare,
            4 => MemberState::Rebuilding,
            5 => MemberState::Missing,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub pool_uuid: Uuid,
    pub member_uuid: Uuid,
    pub name: String,
    pub level: Level,
    pub members: usize,
    pub group: usize,
    pub strip: u64,
    pub data_offset: u64,
    pub member_data_bytes: u64,
    pub events: u64,
    pub member_index: usize,
    pub created: u64,
    pub clean: bool,
    pub rebuild_checkpoint: u64,
    /// The format version the slot was read with (encode always writes `VERSION`).
    pub format: u32,
    /// One entry per slot in layout order: (uuid of the drive in that slot, its state), then
    /// one per hot spare.
    pub table: Vec<(Uuid, MemberState)>,
}

impl Superblock {
    pub fn geometry(&self) -> Result<Geometry, String> {
        let group = self.level.takes_group().then_some(self.group);
        Geometry::new(
            self.level,
            self.members,
            group,
            self.strip,
            self.member_data_bytes,
        )
    }

    /// Which of the two slots this version goes to.
    pub fn slot(&self) -> u64 {
        self.events % SLOTS
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SLOT_BYTES];
        b[0..8].copy_from_slice(MAGIC);
        put32(&mut b, 8, VERSION);
        put32(&mut b, 12, self.clean as u32);
        b[16..32].copy_from_slice(self.pool_uuid.as_bytes());
        b[32..48].copy_from_slice(self.member_uuid.as_bytes());
        let name = self.name.as_bytes();
        let n = name.len().min(NAME_BYTES);
        b[48..48 + n].copy_from_slice(&name[..n]);
        b[112] = self.level.code();
        put16(&mut b, 114, self.members as u16);
        put16(&mut b, 116, self.group as u16);
        put16(&mut b, 118, (self.table.len() - self.members) as u16);
        put32(&mut b, 120, self.strip as u32);
        put64(&mut b, 128, self.data_offset);
        put64(&mut b, 136, self.member_data_bytes);
        put64(&mut b, 144, self.events);
        put16(&mut b, 152, self.member_index as u16);
        put64(&mut b, 160, self.created);
        put64(&mut b, 168, self.rebuild_checkpoint);
        for (i, (uuid, state)) in self.table.iter().enumerate().take(MAX_MEMBERS) {
            let at = TABLE + i * ENTRY;
            b[at..at + 16].copy_from_slice(uuid.as_bytes());
            b[at + 16] = state.code();
        }
        let crc = crc32c::crc32c(&b[..CRC_AT]);
        put32(&mut b, CRC_AT, crc);
        b
    }

    /// Reads one slot. Never trusts a field before the checksum says the slot is whole, and
    /// checks every field against what a pool can be, so a foreign or damaged slot is refused
    /// rather than guessed at.
    pub fn decode(b: &[u8]) -> Result<Superblock, SbError> {
        if b.len() < SLOT_BYTES || &b[0..8] != MAGIC {
            return Err(SbError::NotMillrace);
        }
        let crc = get32(b, CRC_AT);
        if crc32c::crc32c(&b[..CRC_AT]) != crc {
            return Err(SbError::Corrupt("checksum mismatch".into()));
        }
        let version = get32(b, 8);
        if !(OLDEST_VERSION..=VERSION).contains(&version) {
            return Err(SbError::Corrupt(format!(
                "format version {version}, this build reads versions {OLDEST_VERSION} to {VERSION}; use a newer millrace"
            )));
        }
        let level = Level::from_code(b[112])
            .ok_or_else(|| SbError::Corrupt(format!("unknown level code {}", b[112])))?;
        let members = get16(b, 114) as usize;
        if members == 0 || members > MAX_MEMBERS {
            return Err(SbError::Corrupt(format!("{members} members")));
        }
        let spares = get16(b, 118) as usize;
        if members + spares > MAX_MEMBERS {
            return Err(SbError::Corrupt(format!(
                "{members} members and {spares} spares"
            )));
        }
        let member_index = get16(b, 152) as usize;
        if member_index >= members + spares {
            return Err(SbError::Corrupt(format!(
                "member index {member_index} of {members}"
            )));
        }
        let name_raw = &b[48..48 + NAME_BYTES];
        let end = name_raw.iter().position(|&c| c == 0).unwrap_or(NAME_BYTES);
        let name = std::str::from_utf8(&name_raw[..end])
            .map_err(|_| SbError::Corrupt("pool name is not UTF-8".into()))?
            .to_string();
        let mut table = Vec::with_capacity(members + spares);
        for i in 0..members + spares {
            let at = TABLE + i * ENTRY;
            let uuid = Uuid::from_slice(&b[at..at + 16]).expect("16 bytes");
            let state = MemberState::from_code(b[at + 16]).ok_or_else(|| {
                SbError::Corrupt(format!("member {i} has unknown state {}", b[at + 16]))
            })?;
            table.push((uuid, state));
        }
        let sb = Superblock {
            pool_uuid: Uuid::from_slice(&b[16..32]).expect("16 bytes"),
            member_uuid: Uuid::from_slice(&b[32..48]).expect("16 bytes"),
            name,
            level,
            members,
            group: get16(b, 116) as usize,
            strip: get32(b, 120) as u64,
            data_offset: get64(b, 128),
            member_data_bytes: get64(b, 136),
            events: get64(b, 144),
            member_index,
            created: get64(b, 160),
            clean: get32(b, 12) & 1 == 1,
            rebuild_checkpoint: get64(b, 168),
            format: version,
            table,
        };
        sb.geometry().map_err(SbError::Corrupt)?;
        if sb.data_offset < SLOT_BYTES as u64 * SLOTS || !sb.data_offset.is_multiple_of(4096) {
            return Err(SbError::Corrupt(format!(
                "data offset {} overlaps the superblocks or is not 4 KiB aligned",
                sb.data_offset
            )));
        }
        Ok(sb)
    }

    /// Picks the newest whole slot of a member's first 8 KiB.
    pub fn decode_slots(area: &[u8]) -> Result<Superblock, SbError> {
        let a = Superblock::decode(&area[..SLOT_BYTES]);
        let b = Superblock::decode(&area[SLOT_BYTES..2 * SLOT_BYTES]);
        match (a, b) {
            (Ok(x), Ok(y)) => Ok(if y.events > x.events { y } else { x }),
            (Ok(x), Err(_)) | (Err(_), Ok(x)) => Ok(x),
            (Err(SbError::NotMillrace), Err(SbError::NotMillrace)) => Err(SbError::NotMillrace),
            (Err(SbError::Corrupt(e)), _) | (_, Err(SbError::Corrupt(e))) => {
                Err(SbError::Corrupt(e))
            }
        }
    }
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn get64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            pool_uuid: Uuid::new_v4(),
            member_uuid: Uuid::new_v4(),
            name: "tank".into(),
            level: Level::Raid60,
            members: 8,
            group: 4,
            strip: 65536,
            data_offset: 1 << 20,
            member_data_bytes: 64 << 20,
            events: 7,
            member_index: 3,
            created: 1_700_000_000,
            clean: true,
            rebuild_checkpoint: 0,
            format: VERSION,
            table: (0..8)
                .map(|i| {
                    (
                        Uuid::new_v4(),
                        if i == 2 {
                            MemberState::Faulty
                        } else {
                            MemberState::Online
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
    }

    #[test]
    fn any_flipped_byte_is_refused() {
        let enc = sample().encode();
        for at in [0usize, 9, 20, 112, 150, 300, 4000, 4093] {
            let mut b = enc.clone();
            b[at] ^= 0x40;
            assert!(Superblock::decode(&b).is_err(), "byte {at}");
        }
    }

    #[test]
    fn version_1_is_read_and_a_newer_one_refused() {
        let mut b = sample().encode();
        put32(&mut b, 8, 1);
        let crc = crc32c::crc32c(&b[..CRC_AT]);
        put32(&mut b, CRC_AT, crc);
        assert_eq!(Superblock::decode(&b).unwrap().format, 1);
        put32(&mut b, 8, VERSION + 1);
        let crc = crc32c::crc32c(&b[..CRC_AT]);
        put32(&mut b, CRC_AT, crc);
        let e = Superblock::decode(&b).unwrap_err().to_string();
        assert!(e.contains("use a newer millrace"), "{e}");
    }

    #[test]
    fn blank_is_not_millrace() {
        assert_eq!(Superblock::decode(&[0u8; 4096]), Err(SbError::NotMillrace));
    }

    #[test]
    fn newest_whole_slot_wins() {
        let mut sb = sample();
        let mut area = vec![0u8; 8192];
        area[4096..].copy_from_slice(&sb.encode()); // events 7 -> slot 1
        sb.events = 8;
        area[..4096].copy_from_slice(&sb.encode());
        assert_eq!(Superblock::decode_slots(&area).unwrap().events, 8);
        area[100] ^= 1; // tear the newest
        assert_eq!(Superblock::decode_slots(&area).unwrap().events, 7);
    }
}
