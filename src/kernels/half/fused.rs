//! A fused update of arrays kept as f32 or in half precision: for each
//! block of [`LANES`] elements, every array's elements are widened into
//! registers, an element rule runs on the lanes, and every half-precision
//! array is narrowed back, without passes over buffers in between. It is
//! what an optimiser's step on a half-precision parameter and its moments
//! runs (`optim::moments`): one read and one write of each array, and the
//! gradient read once.
//!
//! The result is that of the three passes it fuses — each array widened
//! ([`super::widen`]), the rule applied element by element, each array
//! narrowed ([`super::narrow_stochastic`] with its key at the element's
//! global index, or [`super::narrow_nearest`]) — bit for bit, on every
//! [`HalfPath`]: [`update_fused_naive`] computes exactly those three passes
//! with the naive conversions, and the tests hold every path to it.
//!
//! **The fast path and NaN.** The vector paths widen a bf16 block with a
//! shift and narrow it with an add and a shift, which are the definitions
//! for every value but NaN (widening quiets a NaN, narrowing keeps its top
//! payload bits). A block with a NaN among its bf16 inputs runs the plain
//! code instead, and a bf16 output block with a NaN is narrowed by the
//! full kernel: so the fast path costs two comparisons a block and gives
//! the definitions' bits everywhere.

use half::{bf16, f16};

use super::{
    HalfFloat, HalfPath, SrKey, bf16_nearest, bf16_sr_bits, bf16_stochastic, bf16_widen,
    check_lengths, f16_nearest, f16_stochastic, f16_widen, sr_bits,
};

#[cfg(target_arch = "x86_64")]
mod x86;

/// Elements a block: two AVX-512 registers of f32, so that the rule's two
/// halves, independent, overlap their divisions and square roots.
pub const LANES: usize = 32;

/// One block's values of one array, widened.
pub type Lanes = [f32; LANES];

/// The element rule [`update_fused`] runs on each block: `arrays` holds
/// the block's lanes of every array (what it leaves there is stored),
/// `inputs` those of every input. Every closure
/// `Fn(&mut [[T; LANES]; N], &[[T; LANES]; K])` is one (its arguments'
/// types written out: the compiler does not infer them through the
/// trait). A type that implements it with an `#[inline(always)]` method
/// is compiled into the vector kernels whatever its size, where the
/// compiler may leave a large closure out of line, compiled for baseline
/// x86-64 (four lanes an instruction): the optimisers' rules are such
/// types.
///
/// A rule works lane by lane: each lane's results depend on that lane's
/// values only (the vector paths' tails and fallbacks run it on blocks
/// padded with zeros).
pub trait LaneRule<T, const N: usize, const K: usize> {
    /// The rule on one block.
    fn apply(&self, arrays: &mut [[T; LANES]; N], inputs: &[[T; LANES]; K]);

    /// The rule on a block of [`HALF_LANES`] lanes: the AVX2 kernels' block,
    /// whose lanes of three arrays and two inputs fit the sixteen AVX2
    /// registers where [`LANES`] would not. By default, [`Self::apply`]
    /// on the lanes followed by zeros; the optimisers' rules run the
    /// half block alone.
    #[inline(always)]
    fn apply_half(&self, arrays: &mut [[T; HALF_LANES]; N], inputs: &[[T; HALF_LANES]; K])
    where
        T: Copy + Default,
    {
        let mut a = [[T::default(); LANES]; N];
        let mut i = [[T::default(); LANES]; K];
        for (w, h) in a.iter_mut().zip(arrays.iter()) {
            w[..HALF_LANES].copy_from_slice(h);
        }
        for (w, h) in i.iter_mut().zip(inputs.iter()) {
            w[..HALF_LANES].copy_from_slice(h);
        }
        self.apply(&mut a, &i);
        for (h, w) in arrays.iter_mut().zip(a.iter()) {
            h.copy_from_slice(&w[..HALF_LANES]);
        }
    }
}

/// Elements a block of the AVX2 kernels of the two layouts the optimisers
/// run most ([`LaneRule::apply_half`]).
pub const HALF_LANES: usize = LANES / 2;

impl<T, const N: usize, const K: usize, F: Fn(&mut [[T; LANES]; N], &[[T; LANES]; K])>
    LaneRule<T, N, K> for F
{
    #[inline(always)]
    fn apply(&self, arrays: &mut [[T; LANES]; N], inputs: &[[T; LANES]; K]) {
        self(arrays, inputs)
    }
}

/// One array of [`update_fused`]: kept as `T` (updated in place), or in
/// half precision with the key its store rounds with stochastically
/// (`None`: to nearest, ties to even). The kernels compute in f32; `T` is
/// a parameter so that generic code over [`Real`](crate::Real) can name
/// it ([`Real::update_fused`](crate::Real::update_fused)).
#[derive(Debug)]
pub enum FusedArray<'a, T = f32> {
    /// Kept as `T`.
    Full(&'a mut [T]),
    /// Kept in bf16, and its rounding.
    Bf16(&'a mut [bf16], Option<SrKey>),
    /// Kept in f16, and its rounding.
    F16(&'a mut [f16], Option<SrKey>),
}

impl<T> FusedArray<'_, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            FusedArray::Full(s) => s.len(),
            FusedArray::Bf16(s, _) => s.len(),
            FusedArray::F16(s, _) => s.len(),
        }
    }

    /// Whether it has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl FusedArray<'_> {
    /// Elements `[at, at + out.len())` widened into `out` (the plain code).
    fn load(&self, at: usize, out: &mut [f32]) {
        let n = out.len();
        match self {
            FusedArray::Full(s) => out.copy_from_slice(&s[at..at + n]),
            FusedArray::Bf16(s, _) => {
                for (o, h) in out.iter_mut().zip(&s[at..at + n]) {
                    *o = f32::from_bits(bf16_widen(h.to_bits()));
                }
            }
            FusedArray::F16(s, _) => {
                for (o, h) in out.iter_mut().zip(&s[at..at + n]) {
                    *o = f32::from_bits(f16_widen(h.to_bits()));
                }
            }
        }
    }

    /// `x` stored at `[at, at + x.len())`, narrowed as the array rounds,
    /// `x[0]` being the element of global index `index` (the plain code).
    fn store(&mut self, at: usize, x: &[f32], index: u64) {
        let index = |i: usize| index.wrapping_add(i as u64);
        let n = x.len();
        match self {
            FusedArray::Full(s) => s[at..at + n].copy_from_slice(x),
            FusedArray::Bf16(s, key) => {
                for (i, (d, &v)) in s[at..at + n].iter_mut().zip(x).enumerate() {
                    let b = match key {
                        Some(k) => bf16_stochastic(v.to_bits(), bf16_sr_bits(*k, index(i))),
                        None => bf16_nearest(v.to_bits()),
                    };
                    *d = bf16::from_bits(b);
                }
            }
            FusedArray::F16(s, key) => {
                for (i, (d, &v)) in s[at..at + n].iter_mut().zip(x).enumerate() {
                    let b = match key {
                        Some(k) => f16_stochastic(v.to_bits(), sr_bits(*k, index(i))),
                        None => f16_nearest(v.to_bits()),
                    };
                    *d = f16::from_bits(b);
                }
            }
        }
    }
}

/// Runs `f` on every block of [`LANES`] elements of the arrays: the lanes
/// hold each array's elements widened (exactly) and each input's (`inputs`,
/// read only: a gradient, or the terms a rule forms its gradient from), in
/// an order of the path's choosing, the same for every array and input
/// (with no f16 array the vector paths pair a bf16 word's two elements:
/// evens, then odds);
/// what `f` leaves in an array's lanes is stored, narrowed as the array
/// rounds, element `i` being global index `first + i` (wrapping) for
/// stochastic rounding. The last block is padded with zeros, whose lanes
/// are not stored; `f` must compute each lane from that lane alone (an
/// element rule), so a lane's result does not depend on the blocking.
/// Runs [`HalfPath::chosen`].
///
/// **Panics** if there is no array, or if an array's or an input's length
/// differs from the first array's.
///
/// ```
/// use half::bf16;
/// use splitgrad::kernels::half::{FusedArray, LANES, Lanes, SrKey, update_fused};
/// let mut p = vec![bf16::from_f32(1.0); 20];
/// let mut m = vec![0.0f32; 20];
/// let key = SrKey::new(0, 1, SrKey::param_hash("p"));
/// let g = vec![0.5f32; 20];
/// // m ← m + g; p ← p − m, the new p stored stochastically.
/// // (A closure's arguments are written with their types.)
/// let rule = |[p, m]: &mut [Lanes; 2], [g]: &[Lanes; 1]| {
///     for l in 0..LANES {
///         m[l] += g[l];
///         p[l] -= m[l];
///     }
/// };
/// update_fused([FusedArray::Bf16(&mut p, Some(key)), FusedArray::Full(&mut m)], [&g], 0, rule);
/// assert!(p.iter().all(|&x| x == bf16::from_f32(0.5)));
/// assert_eq!(m, vec![0.5; 20]);
/// ```
#[track_caller]
pub fn update_fused<const N: usize, const K: usize>(
    arrays: [FusedArray<'_>; N],
    inputs: [&[f32]; K],
    first: u64,
    f: impl LaneRule<f32, N, K>,
) {
    update_fused_on(HalfPath::chosen(), arrays, inputs, first, f)
}

/// [`update_fused`] on `path`.
///
/// **Panics** as [`update_fused`], or if the CPU cannot run `path`.
#[track_caller]
pub fn update_fused_on<const N: usize, const K: usize>(
    path: HalfPath,
    mut arrays: [FusedArray<'_>; N],
    inputs: [&[f32]; K],
    first: u64,
    f: impl LaneRule<f32, N, K>,
) {
    let len = common_length(&arrays, &inputs);
    path.check();
    let done = match path {
        HalfPath::Scalar => 0,
        // SAFETY: `check` found AVX2 and F16C on this CPU; the lengths agree.
        #[cfg(target_arch = "x86_64")]
        HalfPath::Avx2 => unsafe { x86::update_avx2(&mut arrays, &inputs, first, &f) },
        // SAFETY: `check` found AVX-512F on this CPU; the lengths agree.
        #[cfg(target_arch = "x86_64")]
        HalfPath::Avx512 => unsafe { x86::update_avx512(&mut arrays, &inputs, first, &f) },
        #[cfg(not(target_arch = "x86_64"))]
        HalfPath::Avx2 | HalfPath::Avx512 => unreachable!("checked above"),
    };
    blocks_scalar(&mut arrays, &inputs, first, done, len, &f);
}

/// The arrays' and the inputs' common length.
///
/// **Panics** if there is no array or two lengths differ.
#[track_caller]
fn common_length<const N: usize, const K: usize>(
    arrays: &[FusedArray<'_>; N],
    inputs: &[&[f32]; K],
) -> usize {
    let len = arrays.first().expect("update_fused: no array").len();
    for a in arrays {
        check_lengths("update_fused", len, a.len());
    }
    for i in inputs {
        check_lengths("update_fused", i.len(), len);
    }
    len
}

/// The blocks of elements `[from, to)` in the plain code: the reference
/// the vector paths' tails, and their blocks with a NaN input, run.
fn blocks_scalar<const N: usize, const K: usize, F: LaneRule<f32, N, K>>(
    arrays: &mut [FusedArray<'_>; N],
    inputs: &[&[f32]; K],
    first: u64,
    from: usize,
    to: usize,
    f: &F,
) {
    let mut at = from;
    while at < to {
        let n = (to - at).min(LANES);
        let mut lanes = [[0.0f32; LANES]; N];
        for (a, l) in arrays.iter().zip(lanes.iter_mut()) {
            a.load(at, &mut l[..n]);
        }
        let mut il = [[0.0f32; LANES]; K];
        for (i, l) in inputs.iter().zip(il.iter_mut()) {
            l[..n].copy_from_slice(&i[at..at + n]);
        }
        f.apply(&mut lanes, &il);
        let index = first.wrapping_add(at as u64);
        for (a, l) in arrays.iter_mut().zip(lanes.iter()) {
            a.store(at, &l[..n], index);
        }
        at += n;
    }
}

/// [`update_fused`]'s naive twin: the three passes it fuses, with the
/// naive conversions ([`super::widen_naive`],
/// [`super::narrow_stochastic_naive`], [`super::narrow_nearest_naive`]):
/// every half-precision array widened whole, `f` on the blocks of the
/// widened arrays, every array narrowed whole.
///
/// **Panics** as [`update_fused`].
#[track_caller]
pub fn update_fused_naive<const N: usize, const K: usize>(
    arrays: [FusedArray<'_>; N],
    inputs: [&[f32]; K],
    first: u64,
    f: impl LaneRule<f32, N, K>,
) {
    let len = common_length(&arrays, &inputs);
    let mut wide: Vec<Vec<f32>> = arrays
        .iter()
        .map(|a| {
            let mut w = vec![0.0f32; len];
            match a {
                FusedArray::Full(s) => w.copy_from_slice(s),
                FusedArray::Bf16(s, _) => super::widen_naive(s, &mut w),
                FusedArray::F16(s, _) => super::widen_naive(s, &mut w),
            }
            w
        })
        .collect();
    for at in (0..len).step_by(LANES) {
        let n = (len - at).min(LANES);
        let mut lanes = [[0.0f32; LANES]; N];
        for (w, l) in wide.iter().zip(lanes.iter_mut()) {
            l[..n].copy_from_slice(&w[at..at + n]);
        }
        let mut il = [[0.0f32; LANES]; K];
        for (i, l) in inputs.iter().zip(il.iter_mut()) {
            l[..n].copy_from_slice(&i[at..at + n]);
        }
        f.apply(&mut lanes, &il);
        for (w, l) in wide.iter_mut().zip(lanes.iter()) {
            w[at..at + n].copy_from_slice(&l[..n]);
        }
    }
    for (a, w) in arrays.into_iter().zip(&wide) {
        match a {
            FusedArray::Full(s) => s.copy_from_slice(w),
            FusedArray::Bf16(s, key) => narrow_naive(w, s, key, first),
            FusedArray::F16(s, key) => narrow_naive(w, s, key, first),
        }
    }
}

fn narrow_naive<H: HalfFloat>(src: &[f32], dst: &mut [H], key: Option<SrKey>, first: u64) {
    match key {
        Some(k) => super::narrow_stochastic_naive(src, dst, k, first),
        None => super::narrow_nearest_naive(src, dst),
    }
}
