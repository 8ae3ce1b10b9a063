//! Format version 1's journal, which closed the RAID5/6 write hole while a pool was degraded.
//! Version 2 replaces it with the partial-parity log (`crate::ppl`, in the same area); this is
//! kept to convert older pools (`engine::journaled`) and to test that conversion.
//!
//! With every member present, a crash is repaired by resync: the data on the drives is what it
//! is, and parity is recomputed from it. With a member missing, the missing member's data lives
//! only in parity, so a stripe torn by a crash (some strips new, some old) would rebuild it
//! wrong. So while a parity pool is degraded, each write is first recorded whole (every strip
//! span it is about to write, data and parity) in the journal area of enough members in service
//! to outlive any further failure the pool survives, made durable, then written in place and made
//! durable. It is retired in the same batch that writes the next record (or before any write that
//! bypasses the journal, and at a clean stop), so at most one whole record is ever on the drives
//! (`Array::journaled_write`). After a crash that record is written in place again: every strip
//! it names then holds its new content, so the stripe is consistent whatever the crash tore.
//!
//! Record layout (at JOURNAL_OFFSET on each member): a 4 KiB header {magic "MLRCJRNL", seq u64,
//! entries u32, payload bytes u64, crc32c of header and payload}, an entry table
//! {member u16, offset u64, len u32} per entry, then the payloads, 4 KiB aligned.

use std::sync::Arc;

use crate::aligned::AlignedBuf;
use crate::drive::Drive;
use crate::io::{execute, Op};

pub const JOURNAL_OFFSET: u64 = 512 << 10;
const MAGIC: &[u8; 8] = b"MLRCJRNL";
const HEADER: usize = 4096;
const ENTRY: usize = 14;

pub struct Entry<'a> {
    pub member: usize,
    pub offset: u64,
    pub data: &'a [u8],
}

/// Bytes of journal room on each member of a pool whose data starts at `data_offset`.
pub fn capacity(data_offset: u64) -> u64 {
    data_offset.saturating_sub(JOURNAL_OFFSET)
}

fn table_bytes(n: usize) -> usize {
    (n * ENTRY).div_ceil(4096) * 4096
}

/// The record for these entries, or None if it does not fit in `capacity` bytes.
pub fn encode(seq: u64, entries: &[Entry], capacity: u64) -> Option<AlignedBuf> {
    let table = table_bytes(entries.len());
    let payload: usize = entries.iter().map(|e| e.data.len()).sum();
    let total = HEADER + table + payload;
    if total as u64 > capacity {
        return None;
    }
    let mut b = AlignedBuf::zeroed(total);
    b[0..8].copy_from_slice(MAGIC);
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b[16..20].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    b[20..28].copy_from_slice(&(payload as u64).to_le_bytes());
    let mut at = HEADER + table;
    for (i, e) in entries.iter().enumerate() {
        let t = HEADER + i * ENTRY;
        b[t..t + 2].copy_from_slice(&(e.member as u16).to_le_bytes());
        b[t + 2..t + 10].copy_from_slice(&e.offset.to_le_bytes());
        b[t + 10..t + 14].copy_from_slice(&(e.data.len() as u32).to_le_bytes());
        b[at..at + e.data.len()].copy_from_slice(e.data);
        at += e.data.len();
    }
    let mut crc = crc32c::crc32c(&b[..32]);
    crc = crc32c::crc32c_append(crc, &b[HEADER..]);
    b[32..36].copy_from_slice(&crc.to_le_bytes());
    Some(b)
}

/// A record read back: (seq, entries as (member, offset, bytes)).
pub type Record = (u64, Vec<(usize, u64, Vec<u8>)>);

/// Reads the record on one drive, if it holds a whole one.
pub fn read(d: &dyn Drive, capacity: u64, members: usize) -> Option<Record> {
    if capacity < HEADER as u64 {
        return None;
    }
    let mut h = AlignedBuf::zeroed(HEADER);
    d.read_at(&mut h, JOURNAL_OFFSET).ok()?;
    if &h[0..8] != MAGIC {
        return None;
    }
    let seq = u64::from_le_bytes(h[8..16].try_into().unwrap());
    let n = u32::from_le_bytes(h[16..20].try_into().unwrap()) as usize;
    let payload = u64::from_le_bytes(h[20..28].try_into().unwrap());
    let total = (HEADER + table_bytes(n)) as u64 + payload;
    if n == 0 || total > capacity {
        return None;
    }
    let mut b = AlignedBuf::zeroed(total.div_ceil(4096) as usize * 4096);
    d.read_at(&mut b, JOURNAL_OFFSET).ok()?;
    let mut crc = crc32c::crc32c(&b[..32]);
    crc = crc32c::crc32c_append(crc, &b[HEADER..total as usize]);
    if crc != u32::from_le_bytes(b[32..36].try_into().unwrap()) {
        return None;
    }
    let mut at = HEADER + table_bytes(n);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let t = HEADER + i * ENTRY;
        let member = u16::from_le_bytes(b[t..t + 2].try_into().unwrap()) as usize;
        let offset = u64::from_le_bytes(b[t + 2..t + 10].try_into().unwrap());
        let len = u32::from_le_bytes(b[t + 10..t + 14].try_into().unwrap()) as usize;
        if member >= members || at + len > total as usize {
            return None;
        }
        out.push((member, offset, b[at..at + len].to_vec()));
        at += len;
    }
    Some((seq, out))
}

/// What retires a record: a blank header written over its own.
pub fn blank_header() -> AlignedBuf {
    AlignedBuf::zeroed(HEADER)
}

/// Writes `bufs[i]` (a record or a blank header) at JOURNAL_OFFSET on `drives[i]`, durably: the
/// writes go out together, then the flushes together (a batch gives no order, so the flushes
/// need a batch of their own). Returns, per drive, whether both its write and flush succeeded.
pub fn put(drives: &[Arc<dyn Drive>], bufs: &[&[u8]]) -> Vec<bool> {
    let mut writes: Vec<Op> = bufs
        .iter()
        .enumerate()
        .map(|(i, b)| Op::write(i, JOURNAL_OFFSET, b))
        .collect();
    let wrote = execute(drives, &mut writes);
    let mut flushes: Vec<Op> = (0..drives.len()).map(Op::flush).collect();
    let flushed = execute(drives, &mut flushes);
    wrote
        .iter()
        .zip(&flushed)
        .map(|(w, f)| w.is_ok() && f.is_ok())
        .collect()
}

/// Marks the record retired on these drives, durably. A drive that fails here is left to the
/// I/O path to notice.
pub fn retire(drives: &[Arc<dyn Drive>]) {
    let zero = blank_header();
    put(drives, &vec![&zero[..]; drives.len()]);
}
