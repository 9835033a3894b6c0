//! The AVX2 (with F16C) and AVX-512 paths of the half-precision kernels,
//! each giving the bits of the plain code in `super`, which runs the tails.

use std::arch::x86_64::*;

use super::random::{MIX1, MIX2};
use super::{HalfFloat, SrKey};

/// Whether the 16 indices from `index` share their high word, and so do
/// their pairs `index >> 1` (bf16's words, [`super::bf16_sr_bits`]): the
/// vector code adds the lane to the low word. False twice in 2³³.
#[inline(always)]
pub(super) fn no_wrap(index: u64) -> bool {
    index as u32 <= u32::MAX - 15 && (index >> 1) as u32 <= u32::MAX - 8
}

/// The key's word for the high word of the indices from `index`
/// ([`SrKey::word`]): of the pairs `index >> 1` for bf16, of the indices
/// for f16.
#[inline(always)]
pub(super) fn key_word(key: SrKey, index: u64, bf16: bool) -> u32 {
    key.word((index >> if bf16 { 33 } else { 32 }) as u32)
}

// --- AVX2 and F16C: 8 lanes -------------------------------------------

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn mix32_avx2(x: __m256i) -> __m256i {
    let x = _mm256_xor_si256(x, _mm256_srli_epi32::<16>(x));
    let x = _mm256_mullo_epi32(x, _mm256_set1_epi32(MIX1 as i32));
    let x = _mm256_xor_si256(x, _mm256_srli_epi32::<15>(x));
    let x = _mm256_mullo_epi32(x, _mm256_set1_epi32(MIX2 as i32));
    _mm256_xor_si256(x, _mm256_srli_epi32::<16>(x))
}

/// `sr_bits` of the 8 indices from `index` (which share a high word).
#[inline]
#[target_feature(enable = "avx2")]
fn sr_bits_avx2(key: SrKey, index: u64) -> __m256i {
    let lo = _mm256_add_epi32(
        _mm256_set1_epi32(index as u32 as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    let word = key.word((index >> 32) as u32) as i32;
    mix32_avx2(_mm256_xor_si256(lo, _mm256_set1_epi32(word)))
}

/// [`super::bf16_sr_bits`] of the 8 elements `index + offs[l]` (the
/// offsets below 2³¹, the pairs sharing their high word), `w` the key's
/// word for it ([`key_word`]): lane l is `sr_bits` of its pair, shifted
/// left by 16 for an odd element.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn bf16_bits_avx2(index: u64, w: u32, offs: __m256i) -> __m256i {
    let t = _mm256_add_epi32(offs, _mm256_set1_epi32((index & 1) as i32));
    let pair = _mm256_add_epi32(
        _mm256_set1_epi32((index >> 1) as u32 as i32),
        _mm256_srli_epi32::<1>(t),
    );
    let r = mix32_avx2(_mm256_xor_si256(pair, _mm256_set1_epi32(w as i32)));
    _mm256_sllv_epi32(
        r,
        _mm256_slli_epi32::<4>(_mm256_and_si256(t, _mm256_set1_epi32(1))),
    )
}

/// 16 values below 2¹⁶ in two vectors of 32 bits, as 16 × 16 bits in order.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn pack16_avx2(a: __m256i, b: __m256i) -> __m256i {
    // packus interleaves the 128-bit halves: a0-3 b0-3 | a4-7 b4-7.
    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a, b))
}

/// [`super::bf16_widen`] on 8 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn bf16_widen_avx2(h: __m128i) -> __m256i {
    let set = _mm256_set1_epi32;
    let w = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h));
    let nan = _mm256_cmpgt_epi32(_mm256_and_si256(w, set(0x7FFF_FFFF)), set(0x7F80_0000));
    _mm256_or_si256(w, _mm256_and_si256(nan, set(0x40_0000)))
}

/// [`super::bf16_nearest`] on 8 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn bf16_nearest_avx2(x: __m256i) -> __m256i {
    let set = _mm256_set1_epi32;
    let high = _mm256_srli_epi32::<16>(x);
    let odd = _mm256_and_si256(high, set(1));
    let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(_mm256_add_epi32(x, set(0x7FFF)), odd));
    let nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, set(0x7FFF_FFFF)), set(0x7F80_0000));
    _mm256_blendv_epi8(rounded, _mm256_or_si256(high, set(0x40)), nan)
}

/// [`super::bf16_stochastic`] on 8 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn bf16_stochastic_avx2(x: __m256i, r: __m256i) -> __m256i {
    let set = _mm256_set1_epi32;
    let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(x, _mm256_srli_epi32::<16>(r)));
    let nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, set(0x7FFF_FFFF)), set(0x7F80_0000));
    let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(x), set(0x40));
    _mm256_blendv_epi8(rounded, quiet, nan)
}

/// [`super::f16_stochastic`] on 8 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn f16_stochastic_avx2(x: __m256i, r: __m256i) -> __m256i {
    let set = _mm256_set1_epi32;
    let sign = _mm256_and_si256(_mm256_srli_epi32::<16>(x), set(0x8000));
    let a = _mm256_and_si256(x, set(0x7FFF_FFFF));
    let e = _mm256_srli_epi32::<23>(a);
    // f16 normal: the bits, rebiased, and 13 bits below the ulp.
    let t_norm = _mm256_sub_epi32(_mm256_srli_epi32::<13>(a), set(0x1_C000));
    let f_norm = _mm256_slli_epi32::<19>(a);
    // f16 subnormal: m·2⁻ˢ in units of 2⁻²⁴ (shift counts ≥ 32 give 0).
    let implicit = _mm256_andnot_si256(_mm256_cmpeq_epi32(e, set(0)), set(0x80_0000));
    let m = _mm256_or_si256(_mm256_and_si256(a, set(0x7F_FFFF)), implicit);
    let s = _mm256_sub_epi32(set(126), _mm256_max_epu32(e, set(1)));
    let t_sub = _mm256_srlv_epi32(m, s);
    let f_sub = _mm256_or_si256(
        _mm256_sllv_epi32(m, _mm256_sub_epi32(set(32), s)),
        _mm256_srlv_epi32(m, _mm256_sub_epi32(s, set(32))),
    );
    let normal = _mm256_cmpgt_epi32(e, set(112));
    let t = _mm256_blendv_epi8(t_sub, t_norm, normal);
    let f = _mm256_blendv_epi8(f_sub, f_norm, normal);
    // f + r carries iff the sum wraps below f; no carry: the mask is −1.
    let sum = _mm256_add_epi32(f, r);
    let no_carry = _mm256_cmpeq_epi32(_mm256_min_epu32(sum, f), f);
    let up = _mm256_add_epi32(set(1), no_carry);
    let mag = _mm256_min_epu32(_mm256_add_epi32(t, up), set(0x7C00));
    let nan = _mm256_cmpgt_epi32(a, set(0x7F80_0000));
    let quiet = _mm256_or_si256(
        set(0x7E00),
        _mm256_and_si256(_mm256_srli_epi32::<13>(a), set(0x3FF)),
    );
    _mm256_or_si256(sign, _mm256_blendv_epi8(mag, quiet, nan))
}

/// # Safety
///
/// The CPU must have AVX2 and F16C; `src` and `dst` have one length.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn widen_avx2<H: HalfFloat>(src: &[u16], dst: &mut [f32]) {
    let body = src.len() - src.len() % 8;
    let bf16 = H::FORMAT == super::Format::Bf16;
    for i in (0..body).step_by(8) {
        // SAFETY: i + 8 ≤ body ≤ src.len() = dst.len(); the loads and
        // stores are unaligned ones.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
            let w = if bf16 {
                _mm256_castsi256_ps(bf16_widen_avx2(h))
            } else {
                _mm256_cvtph_ps(h)
            };
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), w);
        }
    }
    super::widen_scalar::<H>(&src[body..], &mut dst[body..]);
}

/// # Safety
///
/// The CPU must have AVX2 and F16C; `src` and `dst` have one length.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn nearest_avx2<H: HalfFloat>(src: &[f32], dst: &mut [u16]) {
    let body = src.len() - src.len() % 16;
    let bf16 = H::FORMAT == super::Format::Bf16;
    for i in (0..body).step_by(16) {
        // SAFETY: i + 16 ≤ body ≤ src.len() = dst.len(); the loads and
        // stores are unaligned ones.
        unsafe {
            let p = src.as_ptr().add(i);
            let q = dst.as_mut_ptr().add(i);
            if bf16 {
                let a = bf16_nearest_avx2(_mm256_loadu_si256(p.cast()));
                let b = bf16_nearest_avx2(_mm256_loadu_si256(p.add(8).cast()));
                _mm256_storeu_si256(q.cast(), pack16_avx2(a, b));
            } else {
                let a = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(p));
                let b = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(p.add(8)));
                _mm_storeu_si128(q.cast(), a);
                _mm_storeu_si128(q.add(8).cast(), b);
            }
        }
    }
    super::nearest_scalar::<H>(&src[body..], &mut dst[body..]);
}

/// # Safety
///
/// The CPU must have AVX2; `src` and `dst` have one length.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn stochastic_avx2<H: HalfFloat>(
    src: &[f32],
    dst: &mut [u16],
    key: SrKey,
    first_index: u64,
) {
    let body = src.len() - src.len() % 16;
    let bf16 = H::FORMAT == super::Format::Bf16;
    for i in (0..body).step_by(16) {
        let index = first_index.wrapping_add(i as u64);
        if !no_wrap(index) {
            super::stochastic_scalar::<H>(&src[i..i + 16], &mut dst[i..i + 16], key, index);
            continue;
        }
        let (ra, rb) = if bf16 {
            let (w, step) = (
                key_word(key, index, true),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            );
            let step8 = _mm256_add_epi32(step, _mm256_set1_epi32(8));
            (
                bf16_bits_avx2(index, w, step),
                bf16_bits_avx2(index, w, step8),
            )
        } else {
            (sr_bits_avx2(key, index), sr_bits_avx2(key, index + 8))
        };
        // SAFETY: i + 16 ≤ body ≤ src.len() = dst.len(); the loads and
        // stores are unaligned ones.
        unsafe {
            let p = src.as_ptr().add(i);
            let (xa, xb) = (
                _mm256_loadu_si256(p.cast()),
                _mm256_loadu_si256(p.add(8).cast()),
            );
            let (a, b) = if bf16 {
                (bf16_stochastic_avx2(xa, ra), bf16_stochastic_avx2(xb, rb))
            } else {
                (f16_stochastic_avx2(xa, ra), f16_stochastic_avx2(xb, rb))
            };
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), pack16_avx2(a, b));
        }
    }
    let tail = first_index.wrapping_add(body as u64);
    super::stochastic_scalar::<H>(&src[body..], &mut dst[body..], key, tail);
}

// --- AVX-512: 16 lanes --------------------------------------------------

#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn mix32_avx512(x: __m512i) -> __m512i {
    let x = _mm512_xor_si512(x, _mm512_srli_epi32::<16>(x));
    let x = _mm512_mullo_epi32(x, _mm512_set1_epi32(MIX1 as i32));
    let x = _mm512_xor_si512(x, _mm512_srli_epi32::<15>(x));
    let x = _mm512_mullo_epi32(x, _mm512_set1_epi32(MIX2 as i32));
    _mm512_xor_si512(x, _mm512_srli_epi32::<16>(x))
}

/// `sr_bits` of the 16 indices from `index` (which share a high word).
#[inline]
#[target_feature(enable = "avx512f")]
fn sr_bits_avx512(key: SrKey, index: u64) -> __m512i {
    let lo = _mm512_add_epi32(
        _mm512_set1_epi32(index as u32 as i32),
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
    );
    let word = key.word((index >> 32) as u32) as i32;
    mix32_avx512(_mm512_xor_si512(lo, _mm512_set1_epi32(word)))
}

/// [`bf16_bits_avx2`] on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn bf16_bits_avx512(index: u64, w: u32, offs: __m512i) -> __m512i {
    let t = _mm512_add_epi32(offs, _mm512_set1_epi32((index & 1) as i32));
    let pair = _mm512_add_epi32(
        _mm512_set1_epi32((index >> 1) as u32 as i32),
        _mm512_srli_epi32::<1>(t),
    );
    let r = mix32_avx512(_mm512_xor_si512(pair, _mm512_set1_epi32(w as i32)));
    _mm512_sllv_epi32(
        r,
        _mm512_slli_epi32::<4>(_mm512_and_si512(t, _mm512_set1_epi32(1))),
    )
}

/// Whether each lane of `x` is an f32 NaN.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn is_nan_avx512(x: __m512i) -> __mmask16 {
    let a = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFF_FFFF));
    _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F80_0000))
}

/// [`super::bf16_widen`] on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn bf16_widen_avx512(h: __m256i) -> __m512i {
    let w = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h));
    _mm512_mask_or_epi32(w, is_nan_avx512(w), w, _mm512_set1_epi32(0x40_0000))
}

/// [`super::bf16_nearest`] on 16 lanes, as 16 × 16 bits.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn bf16_nearest_avx512(x: __m512i) -> __m256i {
    let set = _mm512_set1_epi32;
    let high = _mm512_srli_epi32::<16>(x);
    let odd = _mm512_and_si512(high, set(1));
    let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(_mm512_add_epi32(x, set(0x7FFF)), odd));
    let quiet = _mm512_or_si512(high, set(0x40));
    _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan_avx512(x), rounded, quiet))
}

/// [`super::bf16_stochastic`] on 16 lanes, as 16 × 16 bits.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn bf16_stochastic_avx512(x: __m512i, r: __m512i) -> __m256i {
    let set = _mm512_set1_epi32;
    let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(x, _mm512_srli_epi32::<16>(r)));
    let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(x), set(0x40));
    _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan_avx512(x), rounded, quiet))
}

/// [`super::f16_stochastic`] on 16 lanes, as 16 × 16 bits.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn f16_stochastic_avx512(x: __m512i, r: __m512i) -> __m256i {
    let set = _mm512_set1_epi32;
    let sign = _mm512_and_si512(_mm512_srli_epi32::<16>(x), set(0x8000));
    let a = _mm512_and_si512(x, set(0x7FFF_FFFF));
    let e = _mm512_srli_epi32::<23>(a);
    let t_norm = _mm512_sub_epi32(_mm512_srli_epi32::<13>(a), set(0x1_C000));
    let f_norm = _mm512_slli_epi32::<19>(a);
    let has_implicit = _mm512_cmpneq_epi32_mask(e, set(0));
    let m = _mm512_or_si512(
        _mm512_and_si512(a, set(0x7F_FFFF)),
        _mm512_maskz_mov_epi32(has_implicit, set(0x80_0000)),
    );
    let s = _mm512_sub_epi32(set(126), _mm512_max_epu32(e, set(1)));
    let t_sub = _mm512_srlv_epi32(m, s);
    let f_sub = _mm512_or_si512(
        _mm512_sllv_epi32(m, _mm512_sub_epi32(set(32), s)),
        _mm512_srlv_epi32(m, _mm512_sub_epi32(s, set(32))),
    );
    let normal = _mm512_cmpgt_epu32_mask(e, set(112));
    let t = _mm512_mask_blend_epi32(normal, t_sub, t_norm);
    let f = _mm512_mask_blend_epi32(normal, f_sub, f_norm);
    let sum = _mm512_add_epi32(f, r);
    let carry = _mm512_cmplt_epu32_mask(sum, f);
    let t = _mm512_mask_add_epi32(t, carry, t, set(1));
    let mag = _mm512_min_epu32(t, set(0x7C00));
    let quiet = _mm512_or_si512(
        set(0x7E00),
        _mm512_and_si512(_mm512_srli_epi32::<13>(a), set(0x3FF)),
    );
    let nan = _mm512_cmpgt_epu32_mask(a, set(0x7F80_0000));
    _mm512_cvtepi32_epi16(_mm512_or_si512(
        sign,
        _mm512_mask_blend_epi32(nan, mag, quiet),
    ))
}

/// # Safety
///
/// The CPU must have AVX-512F; `src` and `dst` have one length.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn widen_avx512<H: HalfFloat>(src: &[u16], dst: &mut [f32]) {
    let body = src.len() - src.len() % 16;
    let bf16 = H::FORMAT == super::Format::Bf16;
    for i in (0..body).step_by(16) {
        // SAFETY: i + 16 ≤ body ≤ src.len() = dst.len(); the loads and
        // stores are unaligned ones.
        unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
            let w = if bf16 {
                _mm512_castsi512_ps(bf16_widen_avx512(h))
            } else {
                _mm512_cvtph_ps(h)
            };
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), w);
        }
    }
    super::widen_scalar::<H>(&src[body..], &mut dst[body..]);
}

/// # Safety
///
/// The CPU must have AVX-512F; `src` and `dst` have one length.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn nearest_avx512<H: HalfFloat>(src: &[f32], dst: &mut [u16]) {
    let body = src.len() - src.len() % 16;
    let bf16 = H::FORMAT == super::Format::Bf16;
    for i in (0..body).step_by(16) {
        // SAFETY: i + 16 ≤ body ≤ src.len() = dst.len(); the loads and
        // stores are unaligned ones.
        unsafe {
            let p = src.as_ptr().add(i);
            let h = if bf16 {
                bf16_nearest_avx512(_mm512_loadu_si512(p.cast()))
            } else {
                _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm512_loadu_ps(p),
                )
            };
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), h);
        }
    }
    super::nearest_scalar::<H>(&src[body..], &mut dst[body..]);
}

/// # Safety
///
/// The CPU must have AVX-512F; `src` and `dst` have one length.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn stochastic_avx512<H: HalfFloat>(
    src: &[f32],
    dst: &mut [u16],
    key: SrKey,
    first_index: u64,
) {
    let body = src.len() - src.len() % 16;
    let bf16 = H::FORMAT == super::Format::Bf16;
    for i in (0..body).step_by(16) {
        let index = first_index.wrapping_add(i as u64);
        if !no_wrap(index) {
            super::stochastic_scalar::<H>(&src[i..i + 16], &mut dst[i..i + 16], key, index);
            continue;
        }
        let r = if bf16 {
            let step = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            bf16_bits_avx512(index, key_word(key, index, true), step)
        } else {
            sr_bits_avx512(key, index)
        };
        // SAFETY: i + 16 ≤ body ≤ src.len() = dst.len(); the loads and
        // stores are unaligned ones.
        unsafe {
            let x = _mm512_loadu_si512(src.as_ptr().add(i).cast());
            let h = if bf16 {
                bf16_stochastic_avx512(x, r)
            } else {
                f16_stochastic_avx512(x, r)
            };
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), h);
        }
    }
    let tail = first_index.wrapping_add(body as u64);
    super::stochastic_scalar::<H>(&src[body..], &mut dst[body..], key, tail);
}

/// # Safety
///
/// The CPU must have AVX2 and F16C; `x` and `r` have one length, a
/// multiple of 16.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn dot_lanes_avx2<H: HalfFloat>(x: &[u16], r: &[u16], lanes: &mut [f32; 16]) {
    let bf16 = H::FORMAT == super::Format::Bf16;
    let widen = |h: __m128i| {
        if bf16 {
            _mm256_castsi256_ps(bf16_widen_avx2(h))
        } else {
            _mm256_cvtph_ps(h)
        }
    };
    // SAFETY: `lanes` holds 16 floats; the loads are unaligned ones.
    let (mut lo, mut hi) = unsafe {
        (
            _mm256_loadu_ps(lanes.as_ptr()),
            _mm256_loadu_ps(lanes.as_ptr().add(8)),
        )
    };
    for i in (0..x.len()).step_by(16) {
        // SAFETY: i + 16 ≤ x.len() = r.len(); unaligned loads.
        unsafe {
            let (px, pr) = (x.as_ptr().add(i), r.as_ptr().add(i));
            let (x0, x1) = (
                _mm_loadu_si128(px.cast()),
                _mm_loadu_si128(px.add(8).cast()),
            );
            let (r0, r1) = (
                _mm_loadu_si128(pr.cast()),
                _mm_loadu_si128(pr.add(8).cast()),
            );
            lo = _mm256_add_ps(lo, _mm256_mul_ps(widen(x0), widen(r0)));
            hi = _mm256_add_ps(hi, _mm256_mul_ps(widen(x1), widen(r1)));
        }
    }
    // SAFETY: as the loads.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), lo);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi);
    }
}

/// # Safety
///
/// The CPU must have AVX-512F; `x` and `r` have one length, a multiple of
/// 16.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dot_lanes_avx512<H: HalfFloat>(x: &[u16], r: &[u16], lanes: &mut [f32; 16]) {
    let bf16 = H::FORMAT == super::Format::Bf16;
    let widen = |h: __m256i| {
        if bf16 {
            _mm512_castsi512_ps(bf16_widen_avx512(h))
        } else {
            _mm512_cvtph_ps(h)
        }
    };
    // SAFETY: `lanes` holds 16 floats.
    let mut acc = unsafe { _mm512_loadu_ps(lanes.as_ptr()) };
    for i in (0..x.len()).step_by(16) {
        // SAFETY: i + 16 ≤ x.len() = r.len(); unaligned loads.
        unsafe {
            let hx = _mm256_loadu_si256(x.as_ptr().add(i).cast());
            let hr = _mm256_loadu_si256(r.as_ptr().add(i).cast());
            // A product then a sum, never fused: the scalar twin's bits.
            acc = _mm512_add_ps(acc, _mm512_mul_ps(widen(hx), widen(hr)));
        }
    }
    // SAFETY: as the load.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc) };
}

/// # Safety
///
/// The CPU must have AVX2 and F16C; `src` and `dst` have one length.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn add_widened_avx2<H: HalfFloat>(
    src: &[u16],
    dst: &mut [f32],
    scale: Option<f32>,
) {
    let body = src.len() - src.len() % 8;
    let bf16 = H::FORMAT == super::Format::Bf16;
    let c = _mm256_set1_ps(scale.unwrap_or(1.0));
    for i in (0..body).step_by(8) {
        // SAFETY: i + 8 ≤ body ≤ src.len() = dst.len(); unaligned loads
        // and stores.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
            let w = if bf16 {
                _mm256_castsi256_ps(bf16_widen_avx2(h))
            } else {
                _mm256_cvtph_ps(h)
            };
            // The product, then the sum: never fused.
            let w = if scale.is_some() {
                _mm256_mul_ps(c, w)
            } else {
                w
            };
            let d = dst.as_mut_ptr().add(i);
            _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), w));
        }
    }
    super::add_widened_scalar::<H>(&src[body..], &mut dst[body..], scale);
}

/// # Safety
///
/// The CPU must have AVX-512F; `src` and `dst` have one length.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn add_widened_avx512<H: HalfFloat>(
    src: &[u16],
    dst: &mut [f32],
    scale: Option<f32>,
) {
    let body = src.len() - src.len() % 16;
    let bf16 = H::FORMAT == super::Format::Bf16;
    let c = _mm512_set1_ps(scale.unwrap_or(1.0));
    for i in (0..body).step_by(16) {
        // SAFETY: i + 16 ≤ body ≤ src.len() = dst.len(); unaligned loads
        // and stores.
        unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
            let w = if bf16 {
                _mm512_castsi512_ps(bf16_widen_avx512(h))
            } else {
                _mm512_cvtph_ps(h)
            };
            // The product, then the sum: never fused.
            let w = if scale.is_some() {
                _mm512_mul_ps(c, w)
            } else {
                w
            };
            let d = dst.as_mut_ptr().add(i);
            _mm512_storeu_ps(d, _mm512_add_ps(_mm512_loadu_ps(d), w));
        }
    }
    super::add_widened_scalar::<H>(&src[body..], &mut dst[body..], scale);
}
