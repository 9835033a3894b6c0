//! The AVX-512 and AVX2 (with F16C) paths of [`super::update_fused`]: whole
//! blocks of [`LANES`] elements; the caller runs the tail in the plain code.
//! Every array bf16, or only the first with the others f32, every bf16
//! array rounded the same way (stochastically from an even first index, or
//! to nearest), runs the kernels of `layouts`, compiled for that layout;
//! any other layout of f32 and bf16 arrays, the
//! kernels of `paired`, which match each array's kind as they go; a layout
//! with an f16 array, the kernels here, in the natural order. All give the
//! same bits. The block loop they share is here.

use std::arch::x86_64::*;

use super::super::x86::{
    bf16_bits_avx2, bf16_bits_avx512, bf16_nearest_avx2, bf16_nearest_avx512, bf16_stochastic_avx2,
    bf16_stochastic_avx512, f16_stochastic_avx2, f16_stochastic_avx512, key_word, mix32_avx2,
    mix32_avx512, pack16_avx2,
};
use super::{FusedArray, LANES, LaneRule, Lanes, blocks_scalar};

mod layouts;
mod paired;

use paired::{update_avx2_paired, update_avx512_paired};

/// Whether the indices of the block from `index` share their high word,
/// and so do their pairs `index >> 1` (bf16's words): the vector code adds
/// the lane to the low word. False twice in 2³³.
#[inline(always)]
fn block_no_wrap(index: u64) -> bool {
    index as u32 <= u32::MAX - (LANES as u32 - 1)
        && (index >> 1) as u32 <= u32::MAX - LANES as u32 / 2
}

/// Per array, the word its stochastic rounding mixes the low words with
/// ([`key_word`]: of the pairs for bf16, of the indices for f16) for the
/// indices from `index`; 0 for an array that rounds to nearest or is kept
/// as f32.
fn words<const N: usize>(arrays: &[FusedArray<'_>; N], index: u64) -> [u32; N] {
    arrays.each_ref().map(|a| match a {
        FusedArray::Bf16(_, Some(k)) => key_word(*k, index, true),
        FusedArray::F16(_, Some(k)) => key_word(*k, index, false),
        _ => 0,
    })
}

/// The arrays' [`words`] for the high word of the block being updated,
/// refreshed when it changes.
struct Words<const N: usize> {
    hi: u32,
    word: [u32; N],
}

impl<const N: usize> Words<N> {
    fn new(arrays: &[FusedArray<'_>; N], first: u64) -> Self {
        Words {
            hi: (first >> 32) as u32,
            word: words(arrays, first),
        }
    }

    /// The words of the block from `index`; `None` when its indices cross
    /// into the next high word (the caller runs that block in the plain
    /// code).
    #[inline(always)]
    fn of(&mut self, arrays: &[FusedArray<'_>; N], index: u64) -> Option<[u32; N]> {
        if !block_no_wrap(index) {
            return None;
        }
        let hi = (index >> 32) as u32;
        if hi != self.hi {
            self.hi = hi;
            self.word = words(arrays, index);
        }
        Some(self.word)
    }
}

/// Elements ahead of the block being updated whose line is requested:
/// the arrays stream through the kernel, a few hundred compute cycles a
/// line, too slowly for the hardware's prefetcher to run ahead far enough.
const AHEAD: usize = 256;

/// A hint to load the line `AHEAD` elements past `at` (a prefetch never
/// faults, past the end of the array too).
#[inline(always)]
fn prefetch_ahead(a: &FusedArray<'_>, at: usize) {
    let p: *const i8 = match a {
        FusedArray::Full(s) => s.as_ptr().wrapping_add(at + AHEAD).cast(),
        FusedArray::Bf16(s, _) => s.as_ptr().wrapping_add(at + AHEAD).cast(),
        FusedArray::F16(s, _) => s.as_ptr().wrapping_add(at + AHEAD).cast(),
    };
    // SAFETY: a prefetch reads nothing the program sees and never faults;
    // SSE is part of x86-64.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p) };
}

/// The loop of every vector kernel over the whole blocks: for each block
/// of [`LANES`] elements, `load` fills the lanes of the arrays (in the
/// kernel's order; `false` when a bf16 input is NaN) and `load_input` those
/// of each input (in the same order), `f` runs on them, and `store`
/// narrows them back, `index` the global index of the block's first
/// element and `word` the arrays' [`Words`]. A block whose
/// indices cross a high word, or with a NaN input, runs in the plain code
/// instead. Returns the elements done.
#[inline(always)]
fn blocks<const N: usize, const K: usize, F: LaneRule<f32, N, K>>(
    arrays: &mut [FusedArray<'_>; N],
    inputs: &[&[f32]; K],
    first: u64,
    f: &F,
    mut load: impl FnMut(&[FusedArray<'_>; N], usize, &mut [Lanes; N]) -> bool,
    mut load_input: impl FnMut(&[f32], usize, &mut Lanes),
    mut store: impl FnMut(&mut [FusedArray<'_>; N], usize, u64, &[u32; N], &[Lanes; N]),
) -> usize {
    // Every array and input has the first array's length (the caller's check).
    let len = arrays[0].len();
    let body = len - len % LANES;
    let mut words = Words::new(arrays, first);
    for at in (0..body).step_by(LANES) {
        let index = first.wrapping_add(at as u64);
        let (mut lanes, mut il) = ([[0.0f32; LANES]; N], [[0.0f32; LANES]; K]);
        match words.of(arrays, index) {
            Some(word) if load(arrays, at, &mut lanes) => {
                for (i, l) in inputs.iter().zip(il.iter_mut()) {
                    load_input(i, at, l);
                }
                f.apply(&mut lanes, &il);
                store(arrays, at, index, &word, &lanes);
            }
            _ => blocks_scalar(arrays, inputs, first, at, at + LANES, f),
        }
    }
    body
}

/// The AVX-512 path over the whole blocks; returns the elements done.
///
/// # Safety
///
/// The CPU must have AVX-512F; there is an array, and every array and
/// input has its length.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn update_avx512<const N: usize, const K: usize, F: LaneRule<f32, N, K>>(
    arrays: &mut [FusedArray<'_>; N],
    inputs: &[&[f32]; K],
    first: u64,
    f: &F,
) -> usize {
    // SAFETY (the calls): as this function's; `layout` found the layout
    // each kernel takes.
    if let Some(l) = layouts::layout(arrays, first) {
        let run = match (l.first_only, l.nearest) {
            (false, false) => layouts::update_avx512::<false, false, N, K, F>,
            (false, true) => layouts::update_avx512::<false, true, N, K, F>,
            (true, false) => layouts::update_avx512::<true, false, N, K, F>,
            (true, true) => layouts::update_avx512::<true, true, N, K, F>,
        };
        return unsafe { run(arrays, inputs, first, f) };
    }
    if arrays.iter().all(|a| !matches!(a, FusedArray::F16(..))) {
        // SAFETY: as this function's.
        return unsafe { update_avx512_paired(arrays, inputs, first, f) };
    }
    let step = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    blocks(
        arrays,
        inputs,
        first,
        f,
        |arrays, at, lanes| {
            let mut nan: __mmask16 = 0;
            for (a, l) in arrays.iter().zip(lanes.iter_mut()) {
                prefetch_ahead(a, at);
                for v in (0..LANES).step_by(16) {
                    let at = at + v;
                    // SAFETY: at + 16 ≤ the whole blocks' end ≤ the array's length; unaligned
                    // loads, and `l` holds LANES floats.
                    unsafe {
                        let x = match a {
                            FusedArray::Full(s) => _mm512_loadu_ps(s.as_ptr().add(at)),
                            FusedArray::Bf16(s, _) => {
                                let h = _mm256_loadu_si256(s.as_ptr().add(at).cast());
                                // The widening of every value but NaN.
                                let w = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(
                                    _mm512_cvtepu16_epi32(h),
                                ));
                                nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(w, w);
                                w
                            }
                            FusedArray::F16(s, _) => {
                                _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr().add(at).cast()))
                            }
                        };
                        _mm512_storeu_ps(l.as_mut_ptr().add(v), x);
                    }
                }
            }
            nan == 0
        },
        |i, at, l| l.copy_from_slice(&i[at..at + LANES]),
        |arrays, at, index, word, lanes| {
            for ((a, l), &w) in arrays.iter_mut().zip(lanes.iter()).zip(word.iter()) {
                for v in (0..LANES).step_by(16) {
                    let at = at + v;
                    let lo = _mm512_add_epi32(
                        _mm512_set1_epi32((index as u32).wrapping_add(v as u32) as i32),
                        step,
                    );
                    let bits = || mix32_avx512(_mm512_xor_si512(lo, _mm512_set1_epi32(w as i32)));
                    // SAFETY: as the loads.
                    unsafe {
                        let x = _mm512_loadu_ps(l.as_ptr().add(v));
                        let xi = _mm512_castps_si512(x);
                        let h = match a {
                            FusedArray::Full(s) => {
                                _mm512_storeu_ps(s.as_mut_ptr().add(at), x);
                                continue;
                            }
                            FusedArray::Bf16(_, Some(_)) => {
                                let offs = _mm512_add_epi32(step, _mm512_set1_epi32(v as i32));
                                let r = bf16_bits_avx512(index, w, offs);
                                if _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x) == 0 {
                                    // `bf16_stochastic` of every value but NaN.
                                    let up = _mm512_add_epi32(xi, _mm512_srli_epi32::<16>(r));
                                    _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(up))
                                } else {
                                    bf16_stochastic_avx512(xi, r)
                                }
                            }
                            FusedArray::Bf16(_, None) => bf16_nearest_avx512(xi),
                            FusedArray::F16(_, Some(_)) => f16_stochastic_avx512(xi, bits()),
                            FusedArray::F16(_, None) => _mm512_cvtps_ph::<
                                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                            >(x),
                        };
                        let dst: *mut u16 = match a {
                            FusedArray::Bf16(s, _) => s.as_mut_ptr().cast(),
                            FusedArray::F16(s, _) => s.as_mut_ptr().cast(),
                            FusedArray::Full(_) => unreachable!("stored above"),
                        };
                        _mm256_storeu_si256(dst.add(at).cast(), h);
                    }
                }
            }
        },
    )
}

/// The AVX2 path over the whole blocks, two vectors of 8 a block; returns
/// the elements done.
///
/// # Safety
///
/// The CPU must have AVX2 and F16C; there is an array, and every array
/// and input has its length.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn update_avx2<const N: usize, const K: usize, F: LaneRule<f32, N, K>>(
    arrays: &mut [FusedArray<'_>; N],
    inputs: &[&[f32]; K],
    first: u64,
    f: &F,
) -> usize {
    // SAFETY (the calls): as this function's; `layout` found the layout
    // each kernel takes.
    if let Some(l) = layouts::layout(arrays, first) {
        let run = match (l.first_only, l.nearest) {
            (false, false) => layouts::update_avx2::<false, false, N, K, F>,
            (false, true) => layouts::update_avx2::<false, true, N, K, F>,
            (true, false) => layouts::update_avx2::<true, false, N, K, F>,
            (true, true) => layouts::update_avx2::<true, true, N, K, F>,
        };
        return unsafe { run(arrays, inputs, first, f) };
    }
    if arrays.iter().all(|a| !matches!(a, FusedArray::F16(..))) {
        // SAFETY: as this function's.
        return unsafe { update_avx2_paired(arrays, inputs, first, f) };
    }
    let step = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    blocks(
        arrays,
        inputs,
        first,
        f,
        |arrays, at, lanes| {
            let mut nan = _mm256_setzero_ps();
            for (a, l) in arrays.iter().zip(lanes.iter_mut()) {
                prefetch_ahead(a, at);
                for half in (0..LANES).step_by(8) {
                    // SAFETY: at + 16 ≤ the whole blocks' end ≤ the array's length; unaligned
                    // loads, and `l` holds 16 floats.
                    unsafe {
                        let x = match a {
                            FusedArray::Full(s) => _mm256_loadu_ps(s.as_ptr().add(at + half)),
                            FusedArray::Bf16(s, _) => {
                                let h = _mm_loadu_si128(s.as_ptr().add(at + half).cast());
                                let w = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(
                                    _mm256_cvtepu16_epi32(h),
                                ));
                                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(w, w));
                                w
                            }
                            FusedArray::F16(s, _) => {
                                _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().add(at + half).cast()))
                            }
                        };
                        _mm256_storeu_ps(l.as_mut_ptr().add(half), x);
                    }
                }
            }
            _mm256_movemask_ps(nan) == 0
        },
        |i, at, l| l.copy_from_slice(&i[at..at + LANES]),
        |arrays, at, index, word, lanes| {
            for ((a, l), &w) in arrays.iter_mut().zip(lanes.iter()).zip(word.iter()) {
                for v in (0..LANES).step_by(16) {
                    let at = at + v;
                    let base = _mm256_add_epi32(
                        _mm256_set1_epi32((index as u32).wrapping_add(v as u32) as i32),
                        step,
                    );
                    // The random bits of the lanes from `half`.
                    let bits = |half: i32| {
                        let lo = _mm256_add_epi32(base, _mm256_set1_epi32(half));
                        mix32_avx2(_mm256_xor_si256(lo, _mm256_set1_epi32(w as i32)))
                    };
                    // SAFETY: as the loads.
                    unsafe {
                        let (x0, x1) = (
                            _mm256_loadu_ps(l.as_ptr().add(v)),
                            _mm256_loadu_ps(l.as_ptr().add(v + 8)),
                        );
                        let (i0, i1) = (_mm256_castps_si256(x0), _mm256_castps_si256(x1));
                        let h = match a {
                            FusedArray::Full(s) => {
                                _mm256_storeu_ps(s.as_mut_ptr().add(at), x0);
                                _mm256_storeu_ps(s.as_mut_ptr().add(at + 8), x1);
                                continue;
                            }
                            FusedArray::Bf16(_, Some(_)) => {
                                let offs = |half: i32| {
                                    _mm256_add_epi32(step, _mm256_set1_epi32(v as i32 + half))
                                };
                                let (r0, r1) = (
                                    bf16_bits_avx2(index, w, offs(0)),
                                    bf16_bits_avx2(index, w, offs(8)),
                                );
                                let nan = _mm256_or_ps(
                                    _mm256_cmp_ps::<_CMP_UNORD_Q>(x0, x0),
                                    _mm256_cmp_ps::<_CMP_UNORD_Q>(x1, x1),
                                );
                                if _mm256_movemask_ps(nan) == 0 {
                                    let round = |x: __m256i, r: __m256i| {
                                        let up = _mm256_add_epi32(x, _mm256_srli_epi32::<16>(r));
                                        _mm256_srli_epi32::<16>(up)
                                    };
                                    pack16_avx2(round(i0, r0), round(i1, r1))
                                } else {
                                    pack16_avx2(
                                        bf16_stochastic_avx2(i0, r0),
                                        bf16_stochastic_avx2(i1, r1),
                                    )
                                }
                            }
                            FusedArray::Bf16(_, None) => {
                                pack16_avx2(bf16_nearest_avx2(i0), bf16_nearest_avx2(i1))
                            }
                            FusedArray::F16(_, Some(_)) => pack16_avx2(
                                f16_stochastic_avx2(i0, bits(0)),
                                f16_stochastic_avx2(i1, bits(8)),
                            ),
                            FusedArray::F16(_, None) => _mm256_set_m128i(
                                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x1),
                                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x0),
                            ),
                        };
                        let dst: *mut u16 = match a {
                            FusedArray::Bf16(s, _) => s.as_mut_ptr().cast(),
                            FusedArray::F16(s, _) => s.as_mut_ptr().cast(),
                            FusedArray::Full(_) => unreachable!("stored above"),
                        };
                        _mm256_storeu_si256(dst.add(at).cast(), h);
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::super::bf16_widen;

    #[test]
    fn the_fast_widening_is_the_definition_but_for_nan() {
        for h in 0..=u16::MAX {
            let fast = (h as u32) << 16;
            if !f32::from_bits(fast).is_nan() {
                assert_eq!(fast, bf16_widen(h), "{h:#x}");
            }
        }
    }
}
