//! The paired kernels of the layouts the optimisers run most: every
//! array in bf16 (a bf16 parameter with bf16 moments), or only the first (a
//! bf16 parameter with f32 moments), every bf16 array rounded the same way:
//! stochastically from an even first index, or to nearest from any. Each
//! array's kind and the rounding are constants of the monomorphised loop,
//! so the per-array loops unroll, no enum is matched between the vector
//! instructions and a block's lanes stay in registers: on a Zen 4 core the
//! Adam rule's block runs in about two thirds of the general paired
//! kernel's time, which matches each array at run time (`docs/bench.md`).
//! The bits are the general kernel's: the same pairing, the same random
//! words, and the same fallbacks (a block with a NaN input, or whose
//! indices cross a high word, in the plain code; a bf16 output block with
//! a NaN by the full rounding kernel, in the natural order). Rounding to
//! nearest is the stochastic store with the increments `bf16_nearest` adds
//! in place of random bits.

use std::arch::x86_64::*;

use super::super::{FusedArray, HALF_LANES, LaneRule, blocks_scalar};
use super::paired::{
    even_pair_bits_avx2, even_pair_bits_avx512, input_paired_avx512, join_pairs_avx2,
    join_pairs_avx512, nearest_increments_avx2, nearest_increments_avx512, split_pairs_avx2,
    split_pairs_avx512, store_nan_avx2, store_nan_avx512, store_nan_nearest_avx2,
    store_nan_nearest_avx512, store_stochastic_avx2, store_stochastic_avx512, widen_pairs_avx2,
    widen_pairs_avx512,
};
use super::{AHEAD, Words, blocks};

/// A layout with a kernel of its own ([`layout`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Layout {
    /// Only the first array is bf16, the others f32 (else every one is
    /// bf16).
    pub first_only: bool,
    /// The bf16 arrays round to nearest (else stochastically).
    pub nearest: bool,
}

/// Which layout `arrays` is, from `first`: every array bf16, or only the
/// first with the others f32, every bf16 array rounded the same way;
/// `None` otherwise, or for stochastic rounding from an odd `first` (a
/// word's two elements then belong to two pairs).
pub(super) fn layout<const N: usize>(arrays: &[FusedArray<'_>; N], first: u64) -> Option<Layout> {
    let full = |a: &FusedArray<'_>| matches!(a, FusedArray::Full(_));
    let (a, rest) = arrays.split_first()?;
    let FusedArray::Bf16(_, key) = a else {
        return None;
    };
    let nearest = key.is_none();
    let alike = |a: &FusedArray<'_>| matches!(a, FusedArray::Bf16(_, k) if k.is_none() == nearest);
    if !nearest && first & 1 == 1 {
        return None;
    }
    let first_only = if rest.iter().all(alike) {
        false
    } else if rest.iter().all(full) {
        true
    } else {
        return None;
    };
    Some(Layout {
        first_only,
        nearest,
    })
}

/// Whether array `i` is bf16 in the layout (otherwise f32).
#[inline(always)]
const fn bf16_at<const FIRST_ONLY: bool>(i: usize) -> bool {
    !FIRST_ONLY || i == 0
}

/// Each array's first element, as bytes, to read.
#[inline(always)]
fn bases<const N: usize>(arrays: &[FusedArray<'_>; N]) -> [*const u8; N] {
    arrays.each_ref().map(|a| match a {
        FusedArray::Full(s) => s.as_ptr().cast(),
        FusedArray::Bf16(s, _) => s.as_ptr().cast(),
        FusedArray::F16(s, _) => s.as_ptr().cast(),
    })
}

/// Each array's first element, as bytes, to write.
#[inline(always)]
fn bases_mut<const N: usize>(arrays: &mut [FusedArray<'_>; N]) -> [*mut u8; N] {
    arrays.each_mut().map(|a| match a {
        FusedArray::Full(s) => s.as_mut_ptr().cast(),
        FusedArray::Bf16(s, _) => s.as_mut_ptr().cast(),
        FusedArray::F16(s, _) => s.as_mut_ptr().cast(),
    })
}

/// The AVX-512 kernel of the layout (`FIRST_ONLY` and `NEAREST`:
/// [`layout`]'s answer) over the whole blocks, in `update_avx512_paired`'s
/// order and loop ([`blocks`]); returns the elements done.
///
/// # Safety
///
/// The CPU must have AVX-512F; every array and input has the first array's
/// length; `arrays` is the layout from `first` ([`layout`]).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn update_avx512<
    const FIRST_ONLY: bool,
    const NEAREST: bool,
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
            let base = bases(arrays);
            let mut nan: __mmask16 = 0;
            for (i, l) in lanes.iter_mut().enumerate() {
                // SAFETY: at + 32 ≤ the whole blocks' end ≤ the array's
                // length, the array of the kind the layout says; unaligned
                // loads; a prefetch never faults; `l` holds 32 floats.
                unsafe {
                    let (e, o) = if bf16_at::<FIRST_ONLY>(i) {
                        let p = base[i].cast::<u16>().add(at);
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(AHEAD).cast());
                        let (e, o) = widen_pairs_avx512(_mm512_loadu_si512(p.cast()));
                        nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(e, o);
                        (e, o)
                    } else {
                        let p = base[i].cast::<f32>().add(at);
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(AHEAD).cast());
                        split_pairs_avx512(_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
                    };
                    _mm512_storeu_ps(l.as_mut_ptr(), e);
                    _mm512_storeu_ps(l.as_mut_ptr().add(16), o);
                }
            }
            nan == 0
        },
        |i, at, l| input_paired_avx512(i, at, l),
        |arrays, at, index, word, lanes| {
            let base = bases_mut(arrays);
            for (i, l) in lanes.iter().enumerate() {
                // SAFETY: as the loads.
                unsafe {
                    let e = _mm512_loadu_ps(l.as_ptr());
                    let o = _mm512_loadu_ps(l.as_ptr().add(16));
                    if bf16_at::<FIRST_ONLY>(i) {
                        let dst = base[i].cast::<u16>().add(at);
                        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(e, o) != 0;
                        match (NEAREST, nan) {
                            (true, false) => {
                                let inc = nearest_increments_avx512(e, o);
                                store_stochastic_avx512(dst, e, o, inc);
                            }
                            (true, true) => store_nan_nearest_avx512(dst, e, o),
                            (false, false) => {
                                // `index` is even (the layout's).
                                let bits = even_pair_bits_avx512(index, word[i]);
                                store_stochastic_avx512(dst, e, o, bits);
                            }
                            (false, true) => store_nan_avx512(dst, e, o, index, word[i]),
                        }
                    } else {
                        let dst = base[i].cast::<f32>().add(at);
                        let (x0, x1) = join_pairs_avx512(e, o);
                        _mm512_storeu_ps(dst, x0);
                        _mm512_storeu_ps(dst.add(16), x1);
                    }
                }
            }
        },
    )
}

/// The AVX2 kernel of the layout over the whole half blocks of
/// [`HALF_LANES`] elements (8 lanes of even elements, then 8 of odd ones,
/// as `update_avx2_paired` orders each 16), the rule on each through
/// [`LaneRule::apply_half`]: a half block's lanes of three arrays and two
/// inputs fit the sixteen AVX2 registers, where a block of
/// [`LANES`](super::super::LANES)
/// spilled some and loaded its constants again. The same fallbacks as
/// [`blocks`] (a half block with a NaN input, or whose indices cross a
/// high word, in the plain code), and the same bits: a rule works lane by
/// lane. Returns the elements done.
///
/// # Safety
///
/// The CPU must have AVX2; every array and input has the first array's
/// length; `arrays` is the layout from `first` ([`layout`]).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn update_avx2<
    const FIRST_ONLY: bool,
    const NEAREST: bool,
    const N: usize,
    const K: usize,
    F: LaneRule<f32, N, K>,
>(
    arrays: &mut [FusedArray<'_>; N],
    inputs: &[&[f32]; K],
    first: u64,
    f: &F,
) -> usize {
    const H: usize = HALF_LANES;
    let len = arrays[0].len();
    let body = len - len % H;
    let mut words = Words::new(arrays, first);
    // Each array's first element, found once: the arrays stay where they
    // are (a fallback below writes them through `arrays` and the pointers
    // are taken again after it).
    let mut base = bases_mut(arrays);
    for at in (0..body).step_by(H) {
        let index = first.wrapping_add(at as u64);
        let (mut lanes, mut il) = ([[0.0f32; H]; N], [[0.0f32; H]; K]);
        let word = match words.of(arrays, index) {
            Some(word) => word,
            None => {
                blocks_scalar(arrays, inputs, first, at, at + H, f);
                base = bases_mut(arrays);
                continue;
            }
        };
        let mut nan = _mm256_setzero_ps();
        for (i, l) in lanes.iter_mut().enumerate() {
            // SAFETY: at + 16 ≤ the whole half blocks' end ≤ the array's
            // length, the array of the kind the layout says; unaligned
            // loads; a prefetch never faults; `l` holds 16 floats.
            unsafe {
                let (e, o) = if bf16_at::<FIRST_ONLY>(i) {
                    let p = base[i].cast::<u16>().add(at);
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(AHEAD).cast());
                    let (e, o) = widen_pairs_avx2(_mm256_loadu_si256(p.cast()));
                    nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(e, o));
                    (e, o)
                } else {
                    let p = base[i].cast::<f32>().add(at);
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(AHEAD).cast());
                    split_pairs_avx2(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
                };
                _mm256_storeu_ps(l.as_mut_ptr(), e);
                _mm256_storeu_ps(l.as_mut_ptr().add(8), o);
            }
        }
        if _mm256_movemask_ps(nan) != 0 {
            blocks_scalar(arrays, inputs, first, at, at + H, f);
            base = bases_mut(arrays);
            continue;
        }
        for (input, l) in inputs.iter().zip(il.iter_mut()) {
            let input = &input[at..at + H];
            // SAFETY: `input` and `l` hold 16 floats.
            unsafe {
                let (e, o) = split_pairs_avx2(
                    _mm256_loadu_ps(input.as_ptr()),
                    _mm256_loadu_ps(input.as_ptr().add(8)),
                );
                _mm256_storeu_ps(l.as_mut_ptr(), e);
                _mm256_storeu_ps(l.as_mut_ptr().add(8), o);
            }
        }
        f.apply_half(&mut lanes, &il);
        for (i, l) in lanes.iter().enumerate() {
            // SAFETY: as the loads.
            unsafe {
                let e = _mm256_loadu_ps(l.as_ptr());
                let o = _mm256_loadu_ps(l.as_ptr().add(8));
                if bf16_at::<FIRST_ONLY>(i) {
                    let dst = base[i].cast::<u16>().add(at);
                    let nan = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(e, o)) != 0;
                    match (NEAREST, nan) {
                        (true, false) => {
                            let inc = nearest_increments_avx2(e, o);
                            store_stochastic_avx2(dst, e, o, inc);
                        }
                        (true, true) => store_nan_nearest_avx2(dst, e, o),
                        (false, false) => {
                            // `index` is even (the layout's).
                            let bits = even_pair_bits_avx2(index, word[i]);
                            store_stochastic_avx2(dst, e, o, bits);
                        }
                        (false, true) => store_nan_avx2(dst, e, o, index, word[i]),
                    }
                } else {
                    let dst = base[i].cast::<f32>().add(at);
                    let (x0, x1) = join_pairs_avx2(e, o);
                    _mm256_storeu_ps(dst, x0);
                    _mm256_storeu_ps(dst.add(8), x1);
                }
            }
        }
    }
    body
}
