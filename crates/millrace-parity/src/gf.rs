//! GF(2^8) with polynomial 0x11d and generator 2: the field of Linux md's RAID6 and ISA-L.

const fn tables() -> ([u8; 512], [u8; 256]) {
    let mut exp = [0u8; 512];
    let mut log = [0u8; 256];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        exp[i + 255] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= 0x11d;
        }
        i += 1;
    }
    exp[510] = exp[0];
    exp[511] = exp[1];
    (exp, log)
}

const TABLES: ([u8; 512], [u8; 256]) = tables();
static EXP: [u8; 512] = TABLES.0;
static LOG: [u8; 256] = TABLES.1;

pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
    }
}

/// The multiplicative inverse; 0 has none, and 0 is returned for it.
pub fn inv(a: u8) -> u8 {
    if a == 0 {
        0
    } else {
        EXP[255 - LOG[a as usize] as usize]
    }
}

/// g^i, with i taken mod 255.
pub fn exp(i: usize) -> u8 {
    EXP[i % 255]
}

/// The discrete logarithm of a non-zero element (0 for 0, which has none).
pub fn log(a: u8) -> u8 {
    LOG[a as usize]
}

/// c * x for every x: the table a scalar multiply-by-constant uses.
pub(crate) fn mul_row(c: u8) -> [u8; 256] {
    core::array::from_fn(|x| mul(c, x as u8))
}
