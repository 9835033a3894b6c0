//! The paired order of the vector paths: a block's 32 elements as the
//! even ones, then the odd ones (on AVX2, for each 16 elements), so that a
//! bf16 word's two halves widen and narrow with a shift each. The loads and
//! stores between that order and memory, the random bits of a block's
//! pairs, and the kernels that match each array's kind in that order
//! (every array f32 or bf16, any first index); `layouts` builds its
//! kernels on the same pieces.

use std::arch::x86_64::*;

use super::super::super::x86::{
    bf16_bits_avx2, bf16_bits_avx512, bf16_nearest_avx2, bf16_nearest_avx512, bf16_stochastic_avx2,
    bf16_stochastic_avx512, mix32_avx2, mix32_avx512, pack16_avx2,
};
use super::super::{FusedArray, LANES, LaneRule, Lanes};
use super::{blocks, prefetch_ahead};

/// An input's block from `at` in the AVX-512 paired order: its even
/// elements, then its odd ones.
///
/// **Panics** if the input has fewer than `at + 32` elements.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn input_paired_avx512(i: &[f32], at: usize, l: &mut Lanes) {
    let i = &i[at..at + LANES];
    // SAFETY: `i` holds 32 floats, and so does `l`.
    unsafe {
        let (e, o) = split_pairs_avx512(
            _mm512_loadu_ps(i.as_ptr()),
            _mm512_loadu_ps(i.as_ptr().add(16)),
        );
        _mm512_storeu_ps(l.as_mut_ptr(), e);
        _mm512_storeu_ps(l.as_mut_ptr().add(16), o);
    }
}

/// An input's block from `at` in the AVX2 paired order: for each 16
/// elements, their 8 even ones, then their 8 odd ones.
///
/// **Panics** if the input has fewer than `at + 32` elements.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn input_paired_avx2(i: &[f32], at: usize, l: &mut Lanes) {
    let i = &i[at..at + LANES];
    for h in (0..LANES).step_by(16) {
        // SAFETY: `i` and `l` hold 32 floats.
        unsafe {
            let (e, o) = split_pairs_avx2(
                _mm256_loadu_ps(i.as_ptr().add(h)),
                _mm256_loadu_ps(i.as_ptr().add(h + 8)),
            );
            _mm256_storeu_ps(l.as_mut_ptr().add(h), e);
            _mm256_storeu_ps(l.as_mut_ptr().add(h + 8), o);
        }
    }
}

/// A bf16 block whose rounded lanes (`e`, `o`, in paired order) hold a
/// NaN: put back in the natural order and rounded stochastically by the
/// full kernel (`w` the array's word, [`Words`]).
/// Out of line: it is rare, and inline it would hold registers the loop
/// needs.
///
/// # Safety
///
/// `dst` is valid for writing 32 bf16.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn store_nan_avx512(dst: *mut u16, e: __m512, o: __m512, index: u64, w: u32) {
    let natural = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let (x0, x1) = join_pairs_avx512(e, o);
    for (v, x) in [x0, x1].into_iter().enumerate() {
        let offs = _mm512_add_epi32(natural, _mm512_set1_epi32(16 * v as i32));
        let h = bf16_stochastic_avx512(_mm512_castps_si512(x), bf16_bits_avx512(index, w, offs));
        // SAFETY: the caller's.
        unsafe { _mm256_storeu_si256(dst.add(16 * v).cast(), h) };
    }
}

/// [`store_nan_avx512`] for 16 elements on AVX2.
///
/// # Safety
///
/// `dst` is valid for writing 16 bf16.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn store_nan_avx2(dst: *mut u16, e: __m256, o: __m256, index: u64, w: u32) {
    let natural = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let (x0, x1) = join_pairs_avx2(e, o);
    let round = |x: __m256, from: i32| {
        let offs = _mm256_add_epi32(natural, _mm256_set1_epi32(from));
        bf16_stochastic_avx2(_mm256_castps_si256(x), bf16_bits_avx2(index, w, offs))
    };
    let h = pack16_avx2(round(x0, 0), round(x1, 8));
    // SAFETY: the caller's.
    unsafe { _mm256_storeu_si256(dst.cast(), h) };
}

/// The element of each lane of the even vector (0, 2, …, 30) and of the
/// odd one (1, 3, …, 31) of a block in the paired order.
const EVEN: [i32; 16] = [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30];
const ODD: [i32; 16] = [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31];

/// The block's elements 0–15 and 16–31 from its even and odd vectors
/// (the inverse of the pairing), as `vpermt2ps` indices: lane j of the
/// result is lane `idx & 15` of the even vector (`idx < 16`) or of the
/// odd one.
const LOW: [i32; 16] = [0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23];
const HIGH: [i32; 16] = [8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31];

/// The 16 random bits of the even lanes and of the odd ones of a block in
/// paired order from an odd `index`: there a word's two elements belong to
/// two pairs, so each half takes hashes of its own. Out of line: it is
/// rare (an odd first index), and inline it would hold registers the loop
/// needs.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx512f")]
pub(super) fn odd_pair_bits_avx512(index: u64, w: u32) -> (__m512i, __m512i) {
    let bits = |offs| _mm512_srli_epi32::<16>(bf16_bits_avx512(index, w, offs));
    (bits(vector(EVEN)), bits(vector(ODD)))
}

/// [`odd_pair_bits_avx512`] for the 16 elements of a half block on AVX2.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx2")]
pub(super) fn odd_pair_bits_avx2(index: u64, w: u32) -> (__m256i, __m256i) {
    let bits = |offs| _mm256_srli_epi32::<16>(bf16_bits_avx2(index, w, offs));
    (
        bits(_mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
        bits(_mm256_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15)),
    )
}

/// The random bits of a paired block's lanes from an even `index` under
/// the array's word `w` (`bf16_sr_bits`' top halves): lane j of both
/// vectors comes from one `sr_bits` word, pair index/2 + j's, its top half
/// (the even element's) in the first and its bottom half (the odd one's)
/// in the second.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn even_pair_bits_avx512(index: u64, w: u32) -> (__m512i, __m512i) {
    let natural = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let pair = _mm512_add_epi32(_mm512_set1_epi32((index >> 1) as u32 as i32), natural);
    let r = mix32_avx512(_mm512_xor_si512(pair, _mm512_set1_epi32(w as i32)));
    (
        _mm512_srli_epi32::<16>(r),
        _mm512_and_si512(r, _mm512_set1_epi32(0xFFFF)),
    )
}

/// [`even_pair_bits_avx512`] for the 16 elements of a half block on AVX2.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn even_pair_bits_avx2(index: u64, w: u32) -> (__m256i, __m256i) {
    let natural = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let pair = _mm256_add_epi32(_mm256_set1_epi32((index >> 1) as u32 as i32), natural);
    let r = mix32_avx2(_mm256_xor_si256(pair, _mm256_set1_epi32(w as i32)));
    (
        _mm256_srli_epi32::<16>(r),
        _mm256_and_si256(r, _mm256_set1_epi32(0xFFFF)),
    )
}

/// The increments that make [`store_stochastic_avx512`] round a paired
/// block's lanes (`e`, `o`, no NaN among them) to nearest, ties to even:
/// `0x7FFF` plus the lowest bit kept, as `bf16_nearest` adds them.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn nearest_increments_avx512(e: __m512, o: __m512) -> (__m512i, __m512i) {
    let inc = |x: __m512| {
        let kept = _mm512_srli_epi32::<16>(_mm512_castps_si512(x));
        let lowest = _mm512_and_si512(kept, _mm512_set1_epi32(1));
        _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lowest)
    };
    (inc(e), inc(o))
}

/// [`nearest_increments_avx512`] for the 16 elements of a half block on
/// AVX2.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn nearest_increments_avx2(e: __m256, o: __m256) -> (__m256i, __m256i) {
    let inc = |x: __m256| {
        let kept = _mm256_srli_epi32::<16>(_mm256_castps_si256(x));
        let lowest = _mm256_and_si256(kept, _mm256_set1_epi32(1));
        _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lowest)
    };
    (inc(e), inc(o))
}

/// A paired bf16 block with a NaN among its lanes rounded to nearest and
/// stored in the natural order by the full kernel, which quiets the NaN.
/// Out of line, as [`store_nan_avx512`].
///
/// # Safety
///
/// `dst` is valid for writing 32 bf16.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn store_nan_nearest_avx512(dst: *mut u16, e: __m512, o: __m512) {
    let (x0, x1) = join_pairs_avx512(e, o);
    for (v, x) in [x0, x1].into_iter().enumerate() {
        let h = bf16_nearest_avx512(_mm512_castps_si512(x));
        // SAFETY: the caller's.
        unsafe { _mm256_storeu_si256(dst.add(16 * v).cast(), h) };
    }
}

/// [`store_nan_nearest_avx512`] for 16 elements on AVX2.
///
/// # Safety
///
/// `dst` is valid for writing 16 bf16.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn store_nan_nearest_avx2(dst: *mut u16, e: __m256, o: __m256) {
    let (x0, x1) = join_pairs_avx2(e, o);
    let round = |x: __m256| bf16_nearest_avx2(_mm256_castps_si256(x));
    let h = pack16_avx2(round(x0), round(x1));
    // SAFETY: the caller's.
    unsafe { _mm256_storeu_si256(dst.cast(), h) };
}

/// `bf16_stochastic` of a bf16 block's lanes (`e`, `o`, in paired order,
/// no NaN among them) with their random bits (`re` of the even lanes, `ro`
/// of the odd ones), stored in the natural order: each lane plus its bits,
/// the high half of the sum kept; the odd lane's in place, the even lane's
/// shifted under it.
///
/// # Safety
///
/// `dst` is valid for writing 32 bf16.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn store_stochastic_avx512(
    dst: *mut u16,
    e: __m512,
    o: __m512,
    (re, ro): (__m512i, __m512i),
) {
    let ue = _mm512_add_epi32(_mm512_castps_si512(e), re);
    let uo = _mm512_add_epi32(_mm512_castps_si512(o), ro);
    let top = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
    let both = _mm512_ternarylogic_epi32::<0xCA>(top, uo, _mm512_srli_epi32::<16>(ue));
    // SAFETY: the caller's.
    unsafe { _mm512_storeu_si512(dst.cast(), both) };
}

/// [`store_stochastic_avx512`] for the 16 elements of a half block on
/// AVX2.
///
/// # Safety
///
/// `dst` is valid for writing 16 bf16.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn store_stochastic_avx2(
    dst: *mut u16,
    e: __m256,
    o: __m256,
    (re, ro): (__m256i, __m256i),
) {
    let ue = _mm256_add_epi32(_mm256_castps_si256(e), re);
    let uo = _mm256_add_epi32(_mm256_castps_si256(o), ro);
    let both = _mm256_blend_epi16::<0b1010_1010>(_mm256_srli_epi32::<16>(ue), uo);
    // SAFETY: the caller's.
    unsafe { _mm256_storeu_si256(dst.cast(), both) };
}

#[inline(always)]
fn vector(i: [i32; 16]) -> __m512i {
    // SAFETY: an unaligned load of 16 i32 from an array of 16.
    unsafe { _mm512_loadu_si512(i.as_ptr().cast()) }
}

/// The even and odd elements of 32 f32 in `x0`, `x1` (elements 0–15 and
/// 16–31): the block in the AVX-512 paired order.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn split_pairs_avx512(x0: __m512, x1: __m512) -> (__m512, __m512) {
    (
        _mm512_permutex2var_ps(x0, vector(EVEN), x1),
        _mm512_permutex2var_ps(x0, vector(ODD), x1),
    )
}

/// The inverse of [`split_pairs_avx512`]: elements 0–15 and 16–31 from the
/// even and odd ones.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn join_pairs_avx512(e: __m512, o: __m512) -> (__m512, __m512) {
    (
        _mm512_permutex2var_ps(e, vector(LOW), o),
        _mm512_permutex2var_ps(e, vector(HIGH), o),
    )
}

/// 32 bf16 (16 words) widened into the paired order: the even elements
/// (each word's low half, shifted up) and the odd ones (its high half, the
/// low half cleared). Exact for every value but NaN, whose payload the
/// caller checks for (`_CMP_UNORD_Q` of the two).
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn widen_pairs_avx512(x: __m512i) -> (__m512, __m512) {
    let top = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
    (
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(x)),
        _mm512_castsi512_ps(_mm512_and_si512(x, top)),
    )
}

/// [`widen_pairs_avx512`] for 16 bf16 (8 words) on AVX2.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn widen_pairs_avx2(x: __m256i) -> (__m256, __m256) {
    let top = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    (
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x)),
        _mm256_castsi256_ps(_mm256_and_si256(x, top)),
    )
}

/// The AVX-512 path when no array is kept in f16, with the block's
/// elements in the paired order: lanes 0–15 hold its even elements and
/// lanes 16–31 its odd ones, for every array and every input. A bf16 array's
/// 32 elements are one 512-bit load, each 32-bit word two elements: the
/// even one widened by a shift, the odd one by masking off the low half;
/// and one 512-bit store, each word the high halves of the two rounded
/// lanes. The rule is an element rule, so the order of its lanes is
/// free; the random bits of a lane are those of its element's index, so
/// every stored bit is the natural order's. Returns the elements done.
///
/// # Safety
///
/// The CPU must have AVX-512F; there is an array, and every array and
/// input has its length; no array is kept in f16.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn update_avx512_paired<
    const N: usize,
    const K: usize,
    F: LaneRule<f32, N, K>,
>(
    arrays: &mut [FusedArray<'_>; N],
    inputs: &[&[f32]; K],
    first: u64,
    f: &F,
) -> usize {
    blocks(
        arrays,
        inputs,
        first,
        f,
        |arrays, at, lanes| {
            let mut nan: __mmask16 = 0;
            for (a, l) in arrays.iter().zip(lanes.iter_mut()) {
                prefetch_ahead(a, at);
                // SAFETY: at + 32 ≤ the whole blocks' end ≤ the array's length; unaligned loads,
                // and `l` holds 32 floats.
                unsafe {
                    let (e, o) = match a {
                        FusedArray::Full(s) => split_pairs_avx512(
                            _mm512_loadu_ps(s.as_ptr().add(at)),
                            _mm512_loadu_ps(s.as_ptr().add(at + 16)),
                        ),
                        FusedArray::Bf16(s, _) => {
                            let (e, o) =
                                widen_pairs_avx512(_mm512_loadu_si512(s.as_ptr().add(at).cast()));
                            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(e, o);
                            (e, o)
                        }
                        FusedArray::F16(..) => unreachable!("no f16 array (the caller's check)"),
                    };
                    _mm512_storeu_ps(l.as_mut_ptr(), e);
                    _mm512_storeu_ps(l.as_mut_ptr().add(16), o);
                }
            }
            nan == 0
        },
        |i, at, l| input_paired_avx512(i, at, l),
        |arrays, at, index, word, lanes| {
            // The 16 random bits (`bf16_sr_bits`' top half) of the even
            // lanes and of the odd ones, `w` the array's word.
            let pair_bits = |index: u64, w: u32| {
                if index & 1 == 0 {
                    even_pair_bits_avx512(index, w)
                } else {
                    odd_pair_bits_avx512(index, w)
                }
            };
            for ((a, l), &w) in arrays.iter_mut().zip(lanes.iter()).zip(word.iter()) {
                // SAFETY: as the loads.
                unsafe {
                    let e = _mm512_loadu_ps(l.as_ptr());
                    let o = _mm512_loadu_ps(l.as_ptr().add(16));
                    match a {
                        FusedArray::Full(s) => {
                            let (x0, x1) = join_pairs_avx512(e, o);
                            _mm512_storeu_ps(s.as_mut_ptr().add(at), x0);
                            _mm512_storeu_ps(s.as_mut_ptr().add(at + 16), x1);
                        }
                        FusedArray::Bf16(s, key) => {
                            let dst: *mut u16 = s.as_mut_ptr().add(at).cast();
                            if key.is_some() && _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(e, o) == 0 {
                                store_stochastic_avx512(dst, e, o, pair_bits(index, w));
                            } else if key.is_some() {
                                // A NaN among the lanes.
                                store_nan_avx512(dst, e, o, index, w);
                            } else {
                                // Nearest: in the natural order, by the full
                                // kernel.
                                let nearest =
                                    |x: __m512| bf16_nearest_avx512(_mm512_castps_si512(x));
                                let (x0, x1) = join_pairs_avx512(e, o);
                                _mm256_storeu_si256(dst.cast(), nearest(x0));
                                _mm256_storeu_si256(dst.add(16).cast(), nearest(x1));
                            }
                        }
                        FusedArray::F16(..) => unreachable!("no f16 array (the caller's check)"),
                    }
                }
            }
        },
    )
}

/// The even and odd elements of 16 f32 in `x0`, `x1` (elements 0–7 and
/// 8–15): (0, 2, …, 14), (1, 3, …, 15).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn split_pairs_avx2(x0: __m256, x1: __m256) -> (__m256, __m256) {
    // shuffle_ps works within 128-bit lanes: x0[0] x0[2] x1[0] x1[2] | x0[4] x0[6] x1[4] x1[6];
    // the 64-bit quarters reordered (0, 2, 1, 3) put x0's before x1's.
    let order =
        |v: __m256| _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(v)));
    (
        order(_mm256_shuffle_ps::<0b10_00_10_00>(x0, x1)),
        order(_mm256_shuffle_ps::<0b11_01_11_01>(x0, x1)),
    )
}

/// The inverse of [`split_pairs_avx2`]: elements 0–7 and 8–15 from the
/// even and odd ones.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn join_pairs_avx2(e: __m256, o: __m256) -> (__m256, __m256) {
    // unpacklo: e0 o0 e1 o1 | e4 o4 e5 o5; unpackhi: e2 o2 e3 o3 | e6 o6 e7 o7.
    let (lo, hi) = (_mm256_unpacklo_ps(e, o), _mm256_unpackhi_ps(e, o));
    (
        _mm256_permute2f128_ps::<0x20>(lo, hi),
        _mm256_permute2f128_ps::<0x31>(lo, hi),
    )
}

/// The AVX2 path when no array is kept in f16, in paired order: for each
/// 16 elements of a block, 8 lanes hold its even elements and the next 8
/// its odd ones, for every array and every input ([`update_avx512_paired`]'s
/// scheme on 256-bit vectors: a bf16 array's 16 elements one load and one
/// store, the rounded lanes merged by one word blend). Returns the
/// elements done.
///
/// # Safety
///
/// The CPU must have AVX2 and F16C; there is an array, and every array
/// and input has its length; no array is kept in f16.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn update_avx2_paired<const N: usize, const K: usize, F: LaneRule<f32, N, K>>(
    arrays: &mut [FusedArray<'_>; N],
    inputs: &[&[f32]; K],
    first: u64,
    f: &F,
) -> usize {
    blocks(
        arrays,
        inputs,
        first,
        f,
        |arrays, at, lanes| {
            let mut nan = _mm256_setzero_ps();
            for (a, l) in arrays.iter().zip(lanes.iter_mut()) {
                prefetch_ahead(a, at);
                for h in (0..LANES).step_by(16) {
                    // SAFETY: at + 32 ≤ the whole blocks' end ≤ the array's length; unaligned
                    // loads, and `l` holds 32 floats.
                    unsafe {
                        let (e, o) = match a {
                            FusedArray::Full(s) => split_pairs_avx2(
                                _mm256_loadu_ps(s.as_ptr().add(at + h)),
                                _mm256_loadu_ps(s.as_ptr().add(at + h + 8)),
                            ),
                            FusedArray::Bf16(s, _) => {
                                let (e, o) = widen_pairs_avx2(_mm256_loadu_si256(
                                    s.as_ptr().add(at + h).cast(),
                                ));
                                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(e, o));
                                (e, o)
                            }
                            FusedArray::F16(..) => {
                                unreachable!("no f16 array (the caller's check)")
                            }
                        };
                        _mm256_storeu_ps(l.as_mut_ptr().add(h), e);
                        _mm256_storeu_ps(l.as_mut_ptr().add(h + 8), o);
                    }
                }
            }
            _mm256_movemask_ps(nan) == 0
        },
        |i, at, l| input_paired_avx2(i, at, l),
        |arrays, at, index, word, lanes| {
            for ((a, l), &w) in arrays.iter_mut().zip(lanes.iter()).zip(word.iter()) {
                for h in (0..LANES).step_by(16) {
                    // The first of these 16 elements.
                    let index = index.wrapping_add(h as u64);
                    // The pairs' words of the even lanes and of the odd
                    // ones, as the AVX-512 path makes them.
                    let pair_bits = || {
                        if index & 1 == 0 {
                            even_pair_bits_avx2(index, w)
                        } else {
                            odd_pair_bits_avx2(index, w)
                        }
                    };
                    // SAFETY: as the loads.
                    unsafe {
                        let e = _mm256_loadu_ps(l.as_ptr().add(h));
                        let o = _mm256_loadu_ps(l.as_ptr().add(h + 8));
                        match a {
                            FusedArray::Full(s) => {
                                let (x0, x1) = join_pairs_avx2(e, o);
                                _mm256_storeu_ps(s.as_mut_ptr().add(at + h), x0);
                                _mm256_storeu_ps(s.as_mut_ptr().add(at + h + 8), x1);
                            }
                            FusedArray::Bf16(s, key) => {
                                let dst: *mut u16 = s.as_mut_ptr().add(at + h).cast();
                                let no_nan =
                                    _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(e, o)) == 0;
                                if key.is_some() && no_nan {
                                    store_stochastic_avx2(dst, e, o, pair_bits());
                                } else if key.is_some() {
                                    // A NaN among the lanes.
                                    store_nan_avx2(dst, e, o, index, w);
                                } else {
                                    // Nearest: in the natural order, by the
                                    // full kernel.
                                    let (x0, x1) = join_pairs_avx2(e, o);
                                    let h16 = pack16_avx2(
                                        bf16_nearest_avx2(_mm256_castps_si256(x0)),
                                        bf16_nearest_avx2(_mm256_castps_si256(x1)),
                                    );
                                    _mm256_storeu_si256(dst.cast(), h16);
                                }
                            }
                            FusedArray::F16(..) => {
                                unreachable!("no f16 array (the caller's check)")
                            }
                        }
                    }
                }
            }
        },
    )
}
