//! x86-64 vector types for the generic kernels, and their `#[target_feature]` entry points.
//!
//! Multiply by 2, the step of Horner's scheme for Q, comes in two forms:
//! - shift-and-reduce: double every byte with a byte add, and XOR 0x1d into the bytes whose top
//!   bit fell off (selected by a compare, a blend on the sign bit, or an AVX-512 mask);
//! - GFNI: one GF2P8AFFINEQB with the bit matrix of "times 2" (see gf::affine_matrix).
//!
//! Multiply by an arbitrary constant uses split-nibble tables: PSHUFB looks up the products of
//! the low and of the high nibble of every byte in two 16-byte tables, and XORs them. With GFNI
//! it is again a single affine instruction. SSE2 alone has no byte shuffle, so it multiplies by
//! doubling and adding (one doubling per bit of the constant).

#![allow(clippy::missing_safety_doc)]

use crate::kernel::Lanes;
use std::arch::x86_64::*;

/// A module of entry points for one vector type and its target features (entry_points_body).
/// The unrolls are as many vectors as the registers hold beside the constants, so that
/// independent chains keep every vector port busy; 4 and 8 measured alike for AVX-512.
macro_rules! entry_points {
    ($name:ident, $v:ty, $feat:literal, $w_pq:literal, $w_p:literal, $w_mul:literal) => {
        pub(crate) mod $name {
            use super::*;
            entry_points_body!($v, $w_pq, $w_p, $w_mul, #[target_feature(enable = $feat)]);
        }
    };
}

/// `Lanes::stream` for a vector of `$n` bytes: the streaming store `$f` where `p` is aligned
/// to it (the instruction faults otherwise), else a plain store.
macro_rules! stream_aligned {
    ($n:literal, $f:ident, $t:ty) => {
        #[inline(always)]
        unsafe fn stream(p: *mut u8, v: Self) {
            if (p as usize) & ($n - 1) == 0 {
                $f(p as *mut $t, v.0)
            } else {
                Self::store(p, v)
            }
        }
    };
}

#[derive(Clone, Copy)]
pub(crate) struct Sse2(__m128i);
#[derive(Clone, Copy)]
pub(crate) struct Ssse3(__m128i);
#[derive(Clone, Copy)]
pub(crate) struct Avx2(__m256i);

#[inline(always)]
unsafe fn mul2_128(a: __m128i) -> __m128i {
    let zero = _mm_setzero_si128();
    let carry = _mm_and_si128(_mm_cmpgt_epi8(zero, a), _mm_set1_epi8(0x1d));
    _mm_xor_si128(_mm_add_epi8(a, a), carry)
}

impl Lanes for Sse2 {
    const N: usize = 16;
    type Table = u8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        Sse2(_mm_setzero_si128())
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        Sse2(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, v: Self) {
        _mm_storeu_si128(p as *mut __m128i, v.0)
    }
    stream_aligned!(16, _mm_stream_si128, __m128i);
    #[inline(always)]
    unsafe fn xor(a: Self, b: Self) -> Self {
        Sse2(_mm_xor_si128(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn mul2(a: Self) -> Self {
        Sse2(mul2_128(a.0))
    }
    #[inline(always)]
    unsafe fn table(c: u8) -> u8 {
        c
    }
    #[inline(always)]
    unsafe fn mul(c: &u8, v: Self) -> Self {
        let mut acc = _mm_setzero_si128();
        let mut x = v.0;
        let mut c = *c;
        while c != 0 {
            if c & 1 != 0 {
                acc = _mm_xor_si128(acc, x);
            }
            c >>= 1;
            x = mul2_128(x);
        }
        Sse2(acc)
    }
}

impl Lanes for Ssse3 {
    const N: usize = 16;
    type Table = (__m128i, __m128i);
    #[inline(always)]
    unsafe fn zero() -> Self {
        Ssse3(_mm_setzero_si128())
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        Ssse3(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, v: Self) {
        _mm_storeu_si128(p as *mut __m128i, v.0)
    }
    stream_aligned!(16, _mm_stream_si128, __m128i);
    #[inline(always)]
    unsafe fn xor(a: Self, b: Self) -> Self {
        Ssse3(_mm_xor_si128(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn mul2(a: Self) -> Self {
        Ssse3(mul2_128(a.0))
    }
    #[inline(always)]
    unsafe fn table(c: u8) -> Self::Table {
        let (lo, hi) = crate::gf::nibble_tables(c);
        (
            _mm_loadu_si128(lo.as_ptr() as *const __m128i),
            _mm_loadu_si128(hi.as_ptr() as *const __m128i),
        )
    }
    #[inline(always)]
    unsafe fn mul(t: &Self::Table, v: Self) -> Self {
        let mask = _mm_set1_epi8(0x0f);
        let l = _mm_shuffle_epi8(t.0, _mm_and_si128(v.0, mask));
        let h = _mm_shuffle_epi8(t.1, _mm_and_si128(_mm_srli_epi64(v.0, 4), mask));
        Ssse3(_mm_xor_si128(l, h))
    }
}

impl Lanes for Avx2 {
    const N: usize = 32;
    type Table = (__m256i, __m256i);
    #[inline(always)]
    unsafe fn zero() -> Self {
        Avx2(_mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        Avx2(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, v: Self) {
        _mm256_storeu_si256(p as *mut __m256i, v.0)
    }
    stream_aligned!(32, _mm256_stream_si256, __m256i);
    #[inline(always)]
    unsafe fn xor(a: Self, b: Self) -> Self {
        Avx2(_mm256_xor_si256(a.0, b.0))
    }
    /// The compare turns each byte's sign bit into a mask for 0x1d. (A blend on the sign bit
    /// would be one instruction on AMD, but LLVM lowers it to this pair anyway.)
    #[inline(always)]
    unsafe fn mul2(a: Self) -> Self {
        let mask = _mm256_cmpgt_epi8(_mm256_setzero_si256(), a.0);
        let carry = _mm256_and_si256(mask, _mm256_set1_epi8(0x1d));
        Avx2(_mm256_xor_si256(_mm256_add_epi8(a.0, a.0), carry))
    }
    #[inline(always)]
    unsafe fn table(c: u8) -> Self::Table {
        let (lo, hi) = crate::gf::nibble_tables(c);
        (
            _mm256_broadcastsi128_si256(_mm_loadu_si128(lo.as_ptr() as *const __m128i)),
            _mm256_broadcastsi128_si256(_mm_loadu_si128(hi.as_ptr() as *const __m128i)),
        )
    }
    #[inline(always)]
    unsafe fn mul(t: &Self::Table, v: Self) -> Self {
        let mask = _mm256_set1_epi8(0x0f);
        let l = _mm256_shuffle_epi8(t.0, _mm256_and_si256(v.0, mask));
        let h = _mm256_shuffle_epi8(t.1, _mm256_and_si256(_mm256_srli_epi64(v.0, 4), mask));
        Avx2(_mm256_xor_si256(l, h))
    }
}

/// The AVX-512 and GFNI intrinsics are stable from Rust 1.89 (build.rs sets the cfg); older
/// compilers build without these kernels.
#[cfg(millrace_avx512)]
mod wide {
    use super::*;
    use crate::gf::affine_matrix;

    const TIMES2: i64 = affine_matrix(2) as i64;

    #[derive(Clone, Copy)]
    pub(crate) struct Avx2Gfni(__m256i);
    #[derive(Clone, Copy)]
    pub(crate) struct Avx512(__m512i);
    #[derive(Clone, Copy)]
    pub(crate) struct Avx512Gfni(__m512i);

    impl Lanes for Avx2Gfni {
        const N: usize = 32;
        type Table = __m256i;
        #[inline(always)]
        unsafe fn zero() -> Self {
            Avx2Gfni(_mm256_setzero_si256())
        }
        #[inline(always)]
        unsafe fn load(p: *const u8) -> Self {
            Avx2Gfni(_mm256_loadu_si256(p as *const __m256i))
        }
        #[inline(always)]
        unsafe fn store(p: *mut u8, v: Self) {
            _mm256_storeu_si256(p as *mut __m256i, v.0)
        }
        stream_aligned!(32, _mm256_stream_si256, __m256i);
        #[inline(always)]
        unsafe fn xor(a: Self, b: Self) -> Self {
            Avx2Gfni(_mm256_xor_si256(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn mul2(a: Self) -> Self {
            Avx2Gfni(_mm256_gf2p8affine_epi64_epi8::<0>(
                a.0,
                _mm256_set1_epi64x(TIMES2),
            ))
        }
        #[inline(always)]
        unsafe fn table(c: u8) -> __m256i {
            _mm256_set1_epi64x(affine_matrix(c) as i64)
        }
        #[inline(always)]
        unsafe fn mul(t: &__m256i, v: Self) -> Self {
            Avx2Gfni(_mm256_gf2p8affine_epi64_epi8::<0>(v.0, *t))
        }
    }

    impl Lanes for Avx512 {
        const N: usize = 64;
        type Table = (__m512i, __m512i);
        #[inline(always)]
        unsafe fn zero() -> Self {
            Avx512(_mm512_setzero_si512())
        }
        #[inline(always)]
        unsafe fn load(p: *const u8) -> Self {
            Avx512(_mm512_loadu_si512(p as *const _))
        }
        #[inline(always)]
        unsafe fn store(p: *mut u8, v: Self) {
            _mm512_storeu_si512(p as *mut _, v.0)
        }
        stream_aligned!(64, _mm512_stream_si512, __m512i);
        #[inline(always)]
        unsafe fn xor(a: Self, b: Self) -> Self {
            Avx512(_mm512_xor_si512(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn mul2(a: Self) -> Self {
            let carry = _mm512_maskz_mov_epi8(_mm512_movepi8_mask(a.0), _mm512_set1_epi8(0x1d));
            Avx512(_mm512_xor_si512(_mm512_add_epi8(a.0, a.0), carry))
        }
        /// A three-input XOR is one VPTERNLOG.
        #[inline(always)]
        unsafe fn mul2_xor(a: Self, d: Self) -> Self {
            let carry = _mm512_maskz_mov_epi8(_mm512_movepi8_mask(a.0), _mm512_set1_epi8(0x1d));
            Avx512(_mm512_ternarylogic_epi64::<0x96>(
                _mm512_add_epi8(a.0, a.0),
                carry,
                d.0,
            ))
        }
        #[inline(always)]
        unsafe fn table(c: u8) -> Self::Table {
            let (lo, hi) = crate::gf::nibble_tables(c);
            (
                _mm512_broadcast_i32x4(_mm_loadu_si128(lo.as_ptr() as *const __m128i)),
                _mm512_broadcast_i32x4(_mm_loadu_si128(hi.as_ptr() as *const __m128i)),
            )
        }
        #[inline(always)]
        unsafe fn mul(t: &Self::Table, v: Self) -> Self {
            let mask = _mm512_set1_epi8(0x0f);
            let l = _mm512_shuffle_epi8(t.0, _mm512_and_si512(v.0, mask));
            let h = _mm512_shuffle_epi8(t.1, _mm512_and_si512(_mm512_srli_epi64::<4>(v.0), mask));
            Avx512(_mm512_xor_si512(l, h))
        }
    }

    impl Lanes for Avx512Gfni {
        const N: usize = 64;
        type Table = __m512i;
        #[inline(always)]
        unsafe fn zero() -> Self {
            Avx512Gfni(_mm512_setzero_si512())
        }
        #[inline(always)]
        unsafe fn load(p: *const u8) -> Self {
            Avx512Gfni(_mm512_loadu_si512(p as *const _))
        }
        #[inline(always)]
        unsafe fn store(p: *mut u8, v: Self) {
            _mm512_storeu_si512(p as *mut _, v.0)
        }
        stream_aligned!(64, _mm512_stream_si512, __m512i);
        #[inline(always)]
        unsafe fn xor(a: Self, b: Self) -> Self {
            Avx512Gfni(_mm512_xor_si512(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn mul2(a: Self) -> Self {
            Avx512Gfni(_mm512_gf2p8affine_epi64_epi8::<0>(
                a.0,
                _mm512_set1_epi64(TIMES2),
            ))
        }
        #[inline(always)]
        unsafe fn table(c: u8) -> __m512i {
            _mm512_set1_epi64(affine_matrix(c) as i64)
        }
        #[inline(always)]
        unsafe fn mul(t: &__m512i, v: Self) -> Self {
            Avx512Gfni(_mm512_gf2p8affine_epi64_epi8::<0>(v.0, *t))
        }
    }

    entry_points!(avx2_gfni, Avx2Gfni, "avx2,gfni", 4, 8, 4);
    entry_points!(avx512, Avx512, "avx512f,avx512bw", 4, 4, 2);
    entry_points!(avx512_gfni, Avx512Gfni, "avx512f,avx512bw,gfni", 4, 4, 2);
}
#[cfg(millrace_avx512)]
pub(crate) use wide::{avx2_gfni, avx512, avx512_gfni};

entry_points!(sse2, Sse2, "sse2", 4, 8, 4);
entry_points!(ssse3, Ssse3, "ssse3", 4, 8, 4);
entry_points!(avx2, Avx2, "avx2", 4, 8, 4);
