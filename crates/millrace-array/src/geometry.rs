//! Where every byte of a pool lives: levels, groups, strips and md's left-symmetric rotation.
//!
//! The logical address space is cut into rows (full stripes). A row holds `data_cols()` strips
//! of data, spread over groups: a parity group of `group` drives holds `group - parity` data
//! strips per row; a mirror group holds one strip per row on each of its copies. RAID0 is
//! n mirror groups of one copy, RAID1 one mirror group of n, RAID10 n/g mirror groups of g.

use serde::{Deserialize, Serialize};
use std::fmt;

pub const SECTOR: u64 = 4096;
pub const MIN_STRIP: u64 = 4 << 10;
pub const MAX_STRIP: u64 = 1 << 20;
/// The superblock holds a member table of this many entries.
pub const MAX_MEMBERS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Level {
    Raid0,
    Raid1,
    Raid10,
    Raid5,
    Raid6,
    Raid50,
    Raid60,
}

impl Level {
    pub const ALL: [Level; 7] = [
        Level::Raid0,
        Level::Raid1,
        Level::Raid10,
        Level::Raid5,
        Level::Raid6,
        Level::Raid50,
        Level::Raid60,
    ];

    pub fn code(self) -> u8 {
        match self {
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid10 => 10,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
            Level::Raid50 => 50,
            Level::Raid60 => 60,
        }
    }

    pub fn from_code(c: u8) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.code() == c)
    }

    /// Parity strips per group per row (0 for mirror-family levels).
    pub fn parity(self) -> usize {
        match self {
            Level::Raid5 | Level::Raid50 => 1,
            Level::Raid6 | Level::Raid60 => 2,
            _ => 0,
        }
    }

    pub fn is_parity(self) -> bool {
        self.parity() > 0
    }

    /// Whether `--group` means something for this level.
    pub fn takes_group(self) -> bool {
        matches!(self, Level::Raid10 | Level::Raid50 | Level::Raid60)
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "raid{}", self.code())
    }
}

impl std::str::FromStr for Level {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        let digits = t.strip_prefix("raid").unwrap_or(&t);
        digits
            .parse::<u8>()
            .ok()
            .and_then(Level::from_code)
            .ok_or_else(|| {
                format!(
                    "unknown RAID level '{s}': use one of raid0, raid1, raid10, raid5, raid6, raid50, raid60"
                )
            })
    }
}

/// The shape of a pool, enough to place every byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub level: Level,
    pub members: usize,
    /// Drives per group (parity group or mirror set); equals `members` for raid1/5/6, 1 for raid0.
    pub group: usize,
    pub strip: u64,
    /// Bytes of data area on each member, a whole number of strips.
    pub member_data_bytes: u64,
}

/// Where one data strip of a row lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripLoc {
    pub group: usize,
    /// Index of the strip among its group's data strips (its syndrome order in Q).
    pub index: usize,
    /// Member holding it (the first copy for mirrors).
    pub member: usize,
}

impl Geometry {
    /// Checks a requested shape and fills in the default group size. Every refusal is a sentence
    /// that says what is wrong and what would work.
    pub fn new(
        level: Level,
        members: usize,
        group: Option<usize>,
        strip: u64,
        member_data_bytes: u64,
    ) -> Result<Geometry, String> {
        if !strip.is_power_of_two() || !(MIN_STRIP..=MAX_STRIP).contains(&strip) {
            return Err(format!(
                "the strip size {strip} bytes is not allowed: use a power of two from 4 KiB to 1 MiB (for example 64k)"
            ));
        }
        if members > MAX_MEMBERS {
            return Err(format!(
                "{members} drives is more than a pool can hold ({MAX_MEMBERS}); split them into several pools"
            ));
        }
        if group.is_some() && !level.takes_group() {
            return Err(format!(
                "--group applies only to raid10, raid50 and raid60; {level} always uses all its drives as one group"
            ));
        }
        let need = |min: usize, what: &str| -> Result<(), String> {
            if members < min {
                Err(format!(
                    "{level} needs at least {min} drives{what}, but {members} were given"
                ))
            } else {
                Ok(())
            }
        };
        let group = match level {
            Level::Raid0 => {
                need(1, "")?;
                1
            }
            Level::Raid1 => {
                need(2, "")?;
                members
            }
            Level::Raid5 => {
                need(3, " (two for data and one for parity)")?;
                members
            }
            Level::Raid6 => {
                need(4, " (two for data and two for parity)")?;
                members
            }
            Level::Raid10 | Level::Raid50 | Level::Raid60 => {
                let min_group = match level {
                    Level::Raid10 => 2,
                    Level::Raid50 => 3,
                    _ => 4,
                };
                let g = match group {
                    Some(g) => g,
                    None if level == Level::Raid10 => 2,
                    None => {
                        return Err(format!(
                            "{level} needs --group N, the number of drives in each parity group (at least {min_group}; N must divide the {members} drives)"
                        ))
                    }
                };
                if g < min_group {
                    return Err(format!(
                        "a {level} group needs at least {min_group} drives, but --group {g} was given"
                    ));
                }
                if !members.is_multiple_of(g) {
                    return Err(format!(
                        "--group {g} does not divide the {members} drives given: {level} needs whole groups (try a group size that divides {members})"
                    ));
                }
                if members / g < 2 {
                    return Err(format!(
                        "{level} stripes over at least two groups of {g}, so it needs at least {} drives, but {members} were given; use {} for a single group",
                        2 * g,
                        if level == Level::Raid10 { "raid1" } else if level == Level::Raid50 { "raid5" } else { "raid6" }
                    ));
                }
                g
            }
        };
        if member_data_bytes < strip {
            return Err(format!(
                "each drive must hold at least one strip ({strip} bytes) of data after the metadata area"
            ));
        }
        Ok(Geometry {
            level,
            members,
            group,
            strip,
            member_data_bytes: member_data_bytes / strip * strip,
        })
    }

    pub fn groups(&self) -> usize {
        self.members / self.group
    }

    /// Data strips per group per row.
    pub fn group_data(&self) -> usize {
        if self.level.is_parity() {
            self.group - self.level.parity()
        } else {
            1
        }
    }

    pub fn data_cols(&self) -> usize {
        self.groups() * self.group_data()
    }

    pub fn full_stripe_bytes(&self) -> u64 {
        self.data_cols() as u64 * self.strip
    }

    pub fn rows(&self) -> u64 {
        self.member_data_bytes / self.strip
    }

    pub fn size_bytes(&self) -> u64 {
        self.rows() * self.full_stripe_bytes()
    }

    /// How many members of one group may be lost without losing data.
    pub fn tolerance_per_group(&self) -> usize {
        if self.level.is_parity() {
            self.level.parity()
        } else {
            self.group - 1
        }
    }

    pub fn group_members(&self, group: usize) -> std::ops::Range<usize> {
        group * self.group..(group + 1) * self.group
    }

    /// Position of the P strip inside its group for a row: md's left-symmetric rotation puts it
    /// on the last drive in row 0 and moves it one drive left each row.
    fn parity_pos(&self, row: u64) -> usize {
        self.group - 1 - (row % self.group as u64) as usize
    }

    /// The members holding P (and Q) of a group in a row.
    pub fn parity_members(&self, row: u64, group: usize) -> (usize, Option<usize>) {
        let base = group * self.group;
        let pd = self.parity_pos(row);
        let q = (self.level.parity() == 2).then(|| base + (pd + 1) % self.group);
        (base + pd, q)
    }

    /// The member that holds data strip `index` of `group` in `row`.
    pub fn data_member(&self, row: u64, group: usize, index: usize) -> usize {
        let base = group * self.group;
        if self.level.is_parity() {
            let pd = self.parity_pos(row);
            base + (pd + self.level.parity() + index) % self.group
        } else {
            base
        }
    }

    /// Where data column `col` (0..data_cols) of `row` lives.
    pub fn locate(&self, row: u64, col: usize) -> StripLoc {
        let gd = self.group_data();
        let (group, index) = (col / gd, col % gd);
        StripLoc {
            group,
            index,
            member: self.data_member(row, group, index),
        }
    }

    /// The strips of a group in a row in syndrome order: data 0..k, then P, then Q.
    pub fn group_layout(&self, row: u64, group: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..self.group_data())
            .map(|i| self.data_member(row, group, i))
            .collect();
        if self.level.is_parity() {
            let (p, q) = self.parity_members(row, group);
            v.push(p);
            v.extend(q);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(level: Level, n: usize, g: Option<usize>) -> Geometry {
        Geometry::new(level, n, g, 65536, 65536 * 16).unwrap()
    }

    #[test]
    fn raid5_left_symmetric_matches_md() {
        // md's left-symmetric RAID5 on 4 drives, rows 0..4 (P marked):
        // row0: D0 D1 D2 P ; row1: D1 D2 P D0 ; row2: D2 P D0 D1 ; row3: P D0 D1 D2
        let g = geo(Level::Raid5, 4, None);
        let expect = [[0, 1, 2, 3], [3, 0, 1, 2], [2, 3, 0, 1], [1, 2, 3, 0]];
        for (row, members) in expect.iter().enumerate() {
            assert_eq!(&g.group_layout(row as u64, 0)[..], &members[..]);
        }
    }

    #[test]
    fn raid6_left_symmetric_matches_md() {
        // md's raid6 left-symmetric on 5 drives: P on the last drive in row 0, Q after it
        // (wrapping to drive 0), data after Q. Drives: row0 = Q D0 D1 D2 P ; row1 = D0 D1 D2 P Q ;
        // row2 = D1 D2 P Q D0. group_layout lists members in syndrome order D0 D1 D2 P Q.
        let g = geo(Level::Raid6, 5, None);
        assert_eq!(g.group_layout(0, 0), vec![1, 2, 3, 4, 0]);
        assert_eq!(g.group_layout(1, 0), vec![0, 1, 2, 3, 4]);
        assert_eq!(g.group_layout(2, 0), vec![4, 0, 1, 2, 3]);
    }

    #[test]
    fn every_member_used_once_per_row() {
        for (l, n, gr) in [
            (Level::Raid5, 5, None),
            (Level::Raid6, 8, None),
            (Level::Raid50, 9, Some(3)),
            (Level::Raid60, 12, Some(6)),
        ] {
            let g = geo(l, n, gr);
            for row in 0..20 {
                let mut all: Vec<usize> = (0..g.groups())
                    .flat_map(|gr| g.group_layout(row, gr))
                    .collect();
                all.sort();
                assert_eq!(all, (0..n).collect::<Vec<_>>(), "{l} row {row}");
            }
        }
    }

    #[test]
    fn sizes() {
        let g = geo(Level::Raid60, 12, Some(6));
        assert_eq!(g.data_cols(), 8);
        assert_eq!(g.full_stripe_bytes(), 8 * 65536);
        assert_eq!(g.size_bytes(), 16 * 8 * 65536);
        let g = geo(Level::Raid10, 6, None);
        assert_eq!(g.groups(), 3);
        assert_eq!(g.data_cols(), 3);
        assert_eq!(g.locate(0, 2).member, 4);
        let g = geo(Level::Raid1, 3, None);
        assert_eq!(g.size_bytes(), 65536 * 16);
    }

    #[test]
    fn impossible_geometries_are_refused_with_reasons() {
        let bad = [
            (Level::Raid6, 3, None, 65536, "at least 4 drives"),
            (Level::Raid5, 2, None, 65536, "at least 3 drives"),
            (Level::Raid50, 8, Some(3), 65536, "does not divide"),
            (Level::Raid60, 8, None, 65536, "needs --group"),
            (Level::Raid60, 6, Some(6), 65536, "at least two groups"),
            (Level::Raid5, 4, Some(2), 65536, "applies only"),
            (Level::Raid6, 6, None, 3000, "power of two"),
            (Level::Raid6, 6, None, 2 << 20, "power of two"),
        ];
        for (l, n, g, s, why) in bad {
            let e = Geometry::new(l, n, g, s, 1 << 30).unwrap_err();
            assert!(e.contains(why), "{l} {n} {g:?} {s}: {e}");
        }
        assert!("raid7"
            .parse::<Level>()
            .unwrap_err()
            .contains("unknown RAID level"));
        assert_eq!("RAID60".parse::<Level>().unwrap(), Level::Raid60);
    }
}
