//! The partial-parity log (PPL) that closes the RAID5/6 write hole while a parity pool is
//! degraded (format version 2; it replaces version 1's whole-write journal, `crate::journal`).
//!
//! The idea is Linux md's (raid5-ppl): before a stripe whose data lives partly in parity (a data
//! strip of the stripe is on a member out of service) is updated, the *partial parity* of the
//! update is made durable on the stripe's own parity member: the parity of the data the update
//! does not write. After a crash, that parity XORed with whatever the written strips now hold
//! (old, new, or torn sector by sector) is a parity consistent with the drives, so the missing
//! strip is rebuilt right whatever the crash tore. Unlike md, where the missing member's own
//! strip is written its new data lives only in parity; the record carries that data too, so a
//! crash can never leave that strip holding bytes that were never written.
//!
//! RAID6: each record names the parity it recovers, P (XOR) or Q (the GF(2^8) syndrome); a stripe
//! missing one data strip logs P's partial parity on P (Q's on Q if P is out too), one missing two
//! logs both. Recovery recomputes the logged parities, then rebuilds the missing data from them and
//! recomputes the unlogged parity (Q) from the data.
//!
//! Each member's log area (JOURNAL_OFFSET up to the data) holds `slots` records of `slot_bytes`.
//! A record: a header {magic "MLRCPPL2", seq u64, entries u32, table bytes u32, payload bytes u64,
//! crc32c u32 of all that and of the table and payload}, the entry table, padded to 4 KiB, then
//! the payloads. An entry: {row u64, group u16, parity u8 (0 P, 1 Q; bit 7: the partial parity is
//! zero and not stored), set u8, writes u16, lo u32, hi u32} then per write {data index u16, at
//! u32, len u32, logged u8 (0: on its drive, 1: in this entry, 2: in another entry of the set)};
//! its payload is the partial parity of the strip span [lo, hi) unless bit 7 says it is zero,
//! then the new data of each write logged in this entry.
//!
//! Bit 7 and logged 2 came on 2026-11-26, within version 2: records written before never set
//! them, so they read as they always did. A full-stripe update's partial parity is zero (no data
//! of the span is left alone), and storing it doubled what a degraded full-stripe write put on
//! its parity member; a RAID6 stripe missing two written strips logs each strip's data once in
//! the set (P's entry or Q's) instead of in both, since recovery applies a set only whole.

use crate::aligned::AlignedBuf;
use crate::journal::JOURNAL_OFFSET;

const MAGIC: &[u8; 8] = b"MLRCPPL2";
const HEAD: usize = 40;
const ENTRY: usize = 22;
const WRITE: usize = 11;
const PAGE: usize = 4096;
/// Most records in flight per member.
pub const MAX_SLOTS: u64 = 16;

/// Where recovery finds a written strip's new data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Logged {
    /// On the strip's own member, in place.
    OnDrive,
    /// In this entry: the strip's member is out of service (its data lives only in parity).
    Here(Vec<u8>),
    /// In the other entry of the set (RAID6, both parities logged).
    InSet,
}

/// One data strip's part of a logged update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogWrite {
    /// Data index in the group (syndrome order).
    pub index: usize,
    /// Offset inside the strip.
    pub at: u64,
    pub len: usize,
    pub data: Logged,
}

impl LogWrite {
    /// The new data, where this entry holds it.
    pub fn here(&self) -> Option<&[u8]> {
        match &self.data {
            Logged::Here(d) => Some(d),
            _ => None,
        }
    }
}

/// The partial parity of one stripe's update, logged on one of its parity members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    pub row: u64,
    pub group: usize,
    /// 0: P, 1: Q.
    pub parity: usize,
    /// The parities (bit j for parity j) this update of the stripe logs, each in an entry of
    /// its own on its own member: recovery applies them only all together (a set found
    /// incomplete was cut before any of it went in place).
    pub set: u8,
    pub lo: u64,
    pub hi: u64,
    pub writes: Vec<LogWrite>,
    /// Parity of the span's data that the update leaves alone, hi - lo bytes; empty where that
    /// is zero (the update writes the whole span of every data strip).
    pub partial: Vec<u8>,
}

/// Bit 7 of an entry's parity byte: no partial parity stored, it is zero.
const ZERO_PARTIAL: u8 = 0x80;

/// Where a member's log slots lie.
#[derive(Clone, Copy, Debug)]
pub struct Area {
    pub slots: u64,
    pub slot_bytes: u64,
}

impl Area {
    /// The slots of a pool whose data starts at `data_offset`, sized so a slot holds the worst
    /// row (`row_bytes`); None when not even one fits.
    pub fn new(data_offset: u64, row_bytes: u64) -> Option<Area> {
        let cap = data_offset.saturating_sub(JOURNAL_OFFSET);
        let need = (PAGE as u64 + row_bytes).div_ceil(PAGE as u64) * PAGE as u64;
        let slots = (cap / need.max(1)).min(MAX_SLOTS);
        if slots == 0 {
            return None;
        }
        let slot_bytes = cap / slots / PAGE as u64 * PAGE as u64;
        Some(Area { slots, slot_bytes })
    }

    pub fn offset(&self, slot: u64) -> u64 {
        JOURNAL_OFFSET + slot * self.slot_bytes
    }
}

/// Worst-case bytes one row's update puts in one member's log: its entry (a group member holds
/// at most one parity of a row) with `k` writes, the partial parity and two strips of data.
pub fn row_bytes(k: usize, strip: u64) -> u64 {
    (ENTRY + k * WRITE) as u64 + 3 * strip
}

fn table_len(entries: &[LogEntry]) -> usize {
    entries.iter().map(|e| ENTRY + e.writes.len() * WRITE).sum()
}

fn payload_len(e: &LogEntry) -> usize {
    e.partial.len()
        + e.writes
            .iter()
            .filter_map(LogWrite::here)
            .map(<[u8]>::len)
            .sum::<usize>()
}

/// The record for these entries, or None if it does not fit in `room` bytes.
pub fn encode(seq: u64, entries: &[LogEntry], room: u64) -> Option<AlignedBuf> {
    let table = table_len(entries);
    let front = (HEAD + table).div_ceil(PAGE) * PAGE;
    let payload: usize = entries.iter().map(payload_len).sum();
    let total = (front + payload).div_ceil(PAGE) * PAGE;
    if total as u64 > room {
        return None;
    }
    let mut b = AlignedBuf::zeroed(total);
    b[0..8].copy_from_slice(MAGIC);
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b[16..20].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    b[20..24].copy_from_slice(&(table as u32).to_le_bytes());
    b[24..32].copy_from_slice(&(payload as u64).to_le_bytes());
    let (mut t, mut at) = (HEAD, front);
    let mut put = |b: &mut AlignedBuf, src: &[u8]| {
        b[at..at + src.len()].copy_from_slice(src);
        at += src.len();
    };
    for e in entries {
        b[t..t + 8].copy_from_slice(&e.row.to_le_bytes());
        b[t + 8..t + 10].copy_from_slice(&(e.group as u16).to_le_bytes());
        b[t + 10] = e.parity as u8
            | if e.partial.is_empty() {
                ZERO_PARTIAL
            } else {
                0
            };
        b[t + 11] = e.set;
        b[t + 12..t + 14].copy_from_slice(&(e.writes.len() as u16).to_le_bytes());
        b[t + 14..t + 18].copy_from_slice(&(e.lo as u32).to_le_bytes());
        b[t + 18..t + 22].copy_from_slice(&(e.hi as u32).to_le_bytes());
        t += ENTRY;
        for w in &e.writes {
            b[t..t + 2].copy_from_slice(&(w.index as u16).to_le_bytes());
            b[t + 2..t + 6].copy_from_slice(&(w.at as u32).to_le_bytes());
            b[t + 6..t + 10].copy_from_slice(&(w.len as u32).to_le_bytes());
            b[t + 10] = match w.data {
                Logged::OnDrive => 0,
                Logged::Here(_) => 1,
                Logged::InSet => 2,
            };
            t += WRITE;
        }
        put(&mut b, &e.partial);
        for d in e.writes.iter().filter_map(LogWrite::here) {
            put(&mut b, d);
        }
    }
    let crc = checksum(&b, table, front, payload);
    b[32..36].copy_from_slice(&crc.to_le_bytes());
    Some(b)
}

fn checksum(b: &[u8], table: usize, front: usize, payload: usize) -> u32 {
    let crc = crc32c::crc32c(&b[..32]);
    let crc = crc32c::crc32c_append(crc, &b[HEAD..HEAD + table]);
    crc32c::crc32c_append(crc, &b[front..front + payload])
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The first 4 KiB of a slot: whether it starts a record, and how many bytes the record takes.
pub fn record_len(head: &[u8], room: u64) -> Option<usize> {
    if head.len() < PAGE || &head[0..8] != MAGIC {
        return None;
    }
    let table = u32_at(head, 20) as u64;
    let payload = u64_at(head, 24);
    let front = (HEAD as u64 + table).div_ceil(PAGE as u64) * PAGE as u64;
    let total = front.checked_add(payload)?.div_ceil(PAGE as u64) * PAGE as u64;
    (total <= room).then_some(total as usize)
}

/// Decodes a whole record (its bytes from `record_len`); None unless every byte checks out.
/// Nothing read from a drive is trusted: every length is checked before it is used.
pub fn decode(b: &[u8]) -> Option<(u64, Vec<LogEntry>)> {
    if b.len() < PAGE || &b[0..8] != MAGIC {
        return None;
    }
    let seq = u64_at(b, 8);
    let n = u32_at(b, 16) as usize;
    let table = u32_at(b, 20) as usize;
    let payload = usize::try_from(u64_at(b, 24)).ok()?;
    let front = HEAD.checked_add(table)?.div_ceil(PAGE) * PAGE;
    if front.checked_add(payload)? > b.len() {
        return None;
    }
    if checksum(b, table, front, payload) != u32_at(b, 32) {
        return None;
    }
    let (mut t, mut at) = (HEAD, front);
    let t_end = HEAD + table;
    let p_end = front + payload;
    let mut take = |len: usize| -> Option<Vec<u8>> {
        let end = at.checked_add(len).filter(|&e| e <= p_end)?;
        let v = b[at..end].to_vec();
        at = end;
        Some(v)
    };
    let mut out = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        if t + ENTRY > t_end {
            return None;
        }
        let row = u64_at(b, t);
        let group = u16_at(b, t + 8) as usize;
        let parity = (b[t + 10] & !ZERO_PARTIAL) as usize;
        let zero = b[t + 10] & ZERO_PARTIAL != 0;
        let set = b[t + 11];
        let nw = u16_at(b, t + 12) as usize;
        let lo = u32_at(b, t + 14) as u64;
        let hi = u32_at(b, t + 18) as u64;
        t += ENTRY;
        if hi <= lo || t + nw * WRITE > t_end {
            return None;
        }
        let mut writes = Vec::with_capacity(nw);
        for _ in 0..nw {
            writes.push(LogWrite {
                index: u16_at(b, t) as usize,
                at: u32_at(b, t + 2) as u64,
                len: u32_at(b, t + 6) as usize,
                data: match b[t + 10] {
                    0 => Logged::OnDrive,
                    1 => Logged::Here(Vec::new()),
                    2 => Logged::InSet,
                    _ => return None,
                },
            });
            t += WRITE;
        }
        let partial = if zero {
            Vec::new()
        } else {
            take((hi - lo) as usize)?
        };
        for w in writes.iter_mut() {
            if let Logged::Here(d) = &mut w.data {
                *d = take(w.len)?;
            }
        }
        out.push(LogEntry {
            row,
            group,
            parity,
            set,
            lo,
            hi,
            writes,
            partial,
        });
    }
    Some((seq, out))
}

/// What retires a record: a blank first page over its header.
pub fn blank() -> AlignedBuf {
    AlignedBuf::zeroed(PAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<LogEntry> {
        vec![
            LogEntry {
                row: 7,
                group: 1,
                parity: 1,
                set: 3,
                lo: 4096,
                hi: 12288,
                writes: vec![
                    LogWrite {
                        index: 0,
                        at: 4096,
                        len: 4096,
                        data: Logged::OnDrive,
                    },
                    LogWrite {
                        index: 2,
                        at: 8192,
                        len: 4096,
                        data: Logged::Here(vec![9; 4096]),
                    },
                    LogWrite {
                        index: 3,
                        at: 4096,
                        len: 8192,
                        data: Logged::InSet,
                    },
                ],
                partial: (0..8192).map(|i| i as u8).collect(),
            },
            LogEntry {
                row: 9,
                group: 0,
                parity: 0,
                set: 1,
                lo: 0,
                hi: 4096,
                writes: vec![],
                partial: vec![3; 4096],
            },
            LogEntry {
                row: 11,
                group: 0,
                parity: 1,
                set: 2,
                lo: 0,
                hi: 65536,
                writes: vec![LogWrite {
                    index: 1,
                    at: 0,
                    len: 65536,
                    data: Logged::Here(vec![5; 65536]),
                }],
                partial: Vec::new(),
            },
        ]
    }

    #[test]
    fn round_trip() {
        let e = sample();
        let b = encode(42, &e, 1 << 20).unwrap();
        assert_eq!(record_len(&b[..PAGE], 1 << 20), Some(b.len()));
        assert_eq!(decode(&b), Some((42, e)));
    }

    #[test]
    fn too_big_is_refused() {
        assert!(encode(1, &sample(), 8192).is_none());
    }

    #[test]
    fn a_zero_partial_parity_takes_no_room() {
        let mut e = sample();
        e.truncate(2);
        let with = encode(1, &e, 1 << 20).unwrap().len();
        e[1].partial.clear();
        let without = encode(1, &e, 1 << 20).unwrap().len();
        assert_eq!(with - without, 4096);
        assert_eq!(decode(&encode(1, &e, 1 << 20).unwrap()), Some((1, e)));
    }

    #[test]
    fn an_unknown_logged_byte_is_refused() {
        let mut b = encode(42, &sample(), 1 << 20).unwrap().to_vec();
        // The first entry's first write's logged byte.
        b[HEAD + ENTRY + 10] = 3;
        let (table, payload) = (u32_at(&b, 20) as usize, u64_at(&b, 24) as usize);
        let crc = checksum(&b, table, 4096, payload);
        b[32..36].copy_from_slice(&crc.to_le_bytes());
        assert!(decode(&b).is_none());
    }

    #[test]
    fn any_flipped_byte_is_refused() {
        let b = encode(42, &sample(), 1 << 20).unwrap();
        for at in [0usize, 9, 17, 21, 33, 41, 60, 4096, 8000, 12287, 16383] {
            let mut c = b.to_vec();
            c[at] ^= 0x10;
            assert!(decode(&c).is_none(), "byte {at}");
        }
    }
}
