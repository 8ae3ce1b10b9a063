//! The portable kernel: eight bytes at a time in a u64 (SWAR), which every target has.

use crate::kernel::Lanes;

const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
const HIGH: u64 = 0x8080_8080_8080_8080;

#[derive(Clone, Copy)]
pub(crate) struct Swar(u64);

impl Lanes for Swar {
    const N: usize = 8;
    type Table = &'static [u8; 256];

    #[inline(always)]
    unsafe fn zero() -> Self {
        Swar(0)
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        Swar((p as *const u64).read_unaligned())
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, v: Self) {
        (p as *mut u64).write_unaligned(v.0)
    }
    #[inline(always)]
    unsafe fn xor(a: Self, b: Self) -> Self {
        Swar(a.0 ^ b.0)
    }
    /// Shift each byte left within its lane, and fold the bit shifted out of each byte back in
    /// as the polynomial 0x1d (a multiply by 0/1 per byte, which cannot carry between bytes).
    #[inline(always)]
    unsafe fn mul2(a: Self) -> Self {
        let hi = (a.0 & HIGH) >> 7;
        Swar(((a.0 & LOW7) << 1) ^ (hi * 0x1d))
    }
    #[inline(always)]
    unsafe fn table(c: u8) -> Self::Table {
        crate::gf::mul_row(c)
    }
    /// No portable way to multiply bytes by an arbitrary constant in parallel: a table lookup
    /// per byte.
    #[inline(always)]
    unsafe fn mul(t: &Self::Table, v: Self) -> Self {
        Swar(u64::from_ne_bytes(v.0.to_ne_bytes().map(|b| t[b as usize])))
    }
}

// Four u64 per column of the syndromes and of P: enough independent chains for a superscalar
// core without vectors. The multiplies look bytes up one at a time; unrolling does not help.
entry_points_body!(Swar, 4, 4, 1);
