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
    // Doubled (and two more) so that exp[log a + log b] needs no reduction mod 255.
    exp[510] = exp[0];
    exp[511] = exp[1];
    (exp, log)
}

const TABLES: ([u8; 512], [u8; 256]) = tables();
static EXP: [u8; 512] = TABLES.0;
static LOG: [u8; 256] = TABLES.1;

const fn mul_const(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        TABLES.0[TABLES.1[a as usize] as usize + TABLES.1[b as usize] as usize]
    }
}

/// Every product, row c = c * x: the scalar kernels look bytes up here rather than build a row
/// per call, which would cost more than short buffers take to multiply.
static MUL: [[u8; 256]; 256] = {
    let mut t = [[0u8; 256]; 256];
    let mut c = 0;
    while c < 256 {
        let mut x = 0;
        while x < 256 {
            t[c][x] = mul_const(c as u8, x as u8);
            x += 1;
        }
        c += 1;
    }
    t
};

/// a * b.
#[inline]
pub fn mul(a: u8, b: u8) -> u8 {
    MUL[a as usize][b as usize]
}

/// The multiplicative inverse. 0 has none; 0 is returned for it (rather than a panic), so a
/// caller that may pass 0 must check for it.
#[inline]
pub fn inv(a: u8) -> u8 {
    if a == 0 {
        0
    } else {
        EXP[255 - LOG[a as usize] as usize]
    }
}

/// g^i with g = 2, i taken mod 255.
#[inline]
pub fn exp(i: usize) -> u8 {
    EXP[i % 255]
}

/// The discrete logarithm base 2 of a non-zero element: exp(log(a)) == a. 0 has none; 0 is
/// returned for it.
#[inline]
pub fn log(a: u8) -> u8 {
    LOG[a as usize]
}

/// The row of products c * x for x = 0..=255.
#[inline]
pub(crate) fn mul_row(c: u8) -> &'static [u8; 256] {
    &MUL[c as usize]
}

/// Products of c with the 16 low nibbles and the 16 high nibbles: c * x is
/// lo[x & 15] ^ hi[x >> 4] because multiplication distributes over XOR.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn nibble_tables(c: u8) -> ([u8; 16], [u8; 16]) {
    let row = mul_row(c);
    let mut lo = [0u8; 16];
    let mut hi = [0u8; 16];
    for n in 0..16 {
        lo[n] = row[n];
        hi[n] = row[n << 4];
    }
    (lo, hi)
}

/// Multiplying by c is linear over GF(2), so it is an 8x8 bit matrix: the operand of the x86
/// GF2P8AFFINEQB instruction, which applies such a matrix to every byte (and thus multiplies in
/// our field although its own multiply instruction uses another polynomial). Output bit i is
/// the parity of (byte 7-i of the matrix) AND x; column j of the matrix is c * 2^j.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const fn affine_matrix(c: u8) -> u64 {
    let mut m = 0u64;
    let mut j = 0;
    while j < 8 {
        let col = mul_const(c, 1 << j);
        let mut i = 0;
        while i < 8 {
            if col >> i & 1 != 0 {
                m |= 1u64 << (8 * (7 - i) + j);
            }
            i += 1;
        }
        j += 1;
    }
    m
}
