//! Half-precision storage: bf16 and f16 values widened to f32 for the math
//! and narrowed back when stored, by rounding to nearest (ties to even) or by
//! stochastic rounding.
//!
//! | kernel | what |
//! |---|---|
//! | [`widen`] | `dst[i] = src[i]` as f32 (exact) |
//! | [`narrow_nearest`] | `dst[i]` = the representable value nearest `src[i]`, ties to even |
//! | [`narrow_stochastic`] | `dst[i]` = one of the two representable neighbours of `src[i]`, the upper with probability proportional to the distance from the lower |
//! | [`add_widened`] | `dst[i] += src[i]` (or `scale·src[i]`) widened, into f32 |
//! | [`update_fused`] | arrays widened, an element rule applied, each narrowed back: the three in registers, a block of [`LANES`] elements at a time |
//!
//! Each has a naive twin (`*_naive`) on the `half` crate's software
//! conversions (`to_f32_const`, `from_f32_const`, never the F16C
//! instructions, so the twins do not share the fast paths' hardware), and a
//! form `*_on` that runs one [`HalfPath`] of the caller's choice. The fast
//! forms run [`HalfPath::chosen`]: AVX-512 where the CPU has it, else AVX2
//! with F16C, else plain code; every path gives the same bits, and the tails
//! a vector does not cover run the plain code on the same global indices.
//!
//! **Conversions.** bf16 → f32 is a 16-bit shift of the bits; f16 → f32 is
//! exact (F16C's `vcvtph2ps`). Both quiet a NaN: its top mantissa bit is
//! set, the rest of the payload kept, as the `half` crate and F16C do. f32 → half
//! rounds to nearest, ties to even, keeps subnormals (never flushed to
//! zero), rounds to ±∞ from half an ulp past the largest finite value on
//! (bf16 from `(2 − 2⁻⁸)·2¹²⁷`, f16 from 65520), keeps ±∞, and turns a NaN
//! into a quiet NaN of the same sign with the payload's top bits. bf16
//! rounds with integer arithmetic on the bits (AVX-512 BF16's `vcvtneps2bf16`
//! would flush subnormal inputs to zero); f16 uses F16C's `vcvtps2ph` with
//! ties to even.
//!
//! **Stochastic rounding.** Let `lo ≤ |x| < hi` be the neighbours of `|x|`
//! (`hi` the next value up; past the largest finite value, `hi` is ∞ and
//! stands for the largest value plus its ulp) and `F` the part of `|x|`
//! below the ulp as a 32-bit fraction, `F = ⌊2³²·(|x| − lo)/(hi − lo)⌋`.
//! With 32 random bits `r`, the stored magnitude is `hi` if `F + r ≥ 2³²`,
//! else `lo`, with `x`'s sign: so `P(hi) = F/2³²`. For bf16 `F` has 16
//! bits, the f32 bits below the bf16 ulp: adding `r >> 16` to the f32 bits
//! and truncating them to 16 is exactly that, and exact, `P(hi) = (|x| −
//! lo)/(hi − lo)`. For f16, `F` is exact where f16 is normal (13 bits
//! below its ulp); in its subnormal range (|x| < 2⁻¹⁴, ulp 2⁻²⁴) bits of
//! `|x|` beyond 32 places below the ulp are dropped, so there `P(hi)`
//! falls short by less than 2⁻³²: the expected stored value is within
//! 2⁻³² ulp of `x`, toward zero. Values already representable are stored
//! exactly (`F = 0`), a NaN becomes the quiet NaN rounding to nearest
//! gives, ±∞ stays ±∞. The bits `r` of element `i` of a call are those of
//! its global index `first_index + i`: [`sr_bits`] for f16, and for bf16,
//! whose rounding uses only `r`'s top 16 bits, [`bf16_sr_bits`] (one
//! [`sr_bits`] word a pair of elements, half each); a pure function of
//! the [`SrKey`] and the element's global index, so the result does not
//! depend on how a caller cuts a parameter into calls or across threads.
//!
//! The semantics are `docs/spec.md#71-half-precision-storage`; why
//! stochastic rounding is unbiased, its variance and its cost,
//! `docs/gradients.md#stochastic-rounding`.
//!
//! These are internal kernels: a source and destination of different
//! lengths is a caller's bug and panics.

use std::sync::OnceLock;

use half::{bf16, f16};

mod sealed {
    /// Which half-precision format, for the dispatch.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Format {
        Bf16,
        F16,
    }

    pub trait Sealed: Copy + 'static {
        const FORMAT: Format;
        /// The bits of the largest finite value.
        const MAX_BITS: u16;
        /// The bits of +∞.
        const INF_BITS: u16;
        fn bits(s: &[Self]) -> &[u16];
        fn bits_mut(s: &mut [Self]) -> &mut [u16];
        /// The `half` crate's software conversions.
        fn naive_to_f32(self) -> f32;
        fn naive_from_f32(x: f32) -> Self;
        fn from_raw(bits: u16) -> Self;
    }

    impl Sealed for half::bf16 {
        const FORMAT: Format = Format::Bf16;
        const MAX_BITS: u16 = 0x7F7F;
        const INF_BITS: u16 = 0x7F80;
        fn bits(s: &[Self]) -> &[u16] {
            half::slice::HalfFloatSliceExt::reinterpret_cast(s)
        }
        fn bits_mut(s: &mut [Self]) -> &mut [u16] {
            half::slice::HalfFloatSliceExt::reinterpret_cast_mut(s)
        }
        fn naive_to_f32(self) -> f32 {
            self.to_f32_const()
        }
        fn naive_from_f32(x: f32) -> Self {
            half::bf16::from_f32_const(x)
        }
        fn from_raw(bits: u16) -> Self {
            half::bf16::from_bits(bits)
        }
    }

    impl Sealed for half::f16 {
        const FORMAT: Format = Format::F16;
        const MAX_BITS: u16 = 0x7BFF;
        const INF_BITS: u16 = 0x7C00;
        fn bits(s: &[Self]) -> &[u16] {
            half::slice::HalfFloatSliceExt::reinterpret_cast(s)
        }
        fn bits_mut(s: &mut [Self]) -> &mut [u16] {
            half::slice::HalfFloatSliceExt::reinterpret_cast_mut(s)
        }
        fn naive_to_f32(self) -> f32 {
            self.to_f32_const()
        }
        fn naive_from_f32(x: f32) -> Self {
            half::f16::from_f32_const(x)
        }
        fn from_raw(bits: u16) -> Self {
            half::f16::from_bits(bits)
        }
    }
}

use sealed::Format;

mod random;
pub use random::{SrKey, bf16_sr_bits, sr_bits};

/// A half-precision storage type: `half::bf16` or `half::f16`.
///
/// ```
/// use splitgrad::kernels::half::HalfFloat;
/// assert_eq!(<half::bf16 as HalfFloat>::NAME, "bf16");
/// assert_eq!(<half::f16 as HalfFloat>::from_bits(0x3C00).to_f32(), 1.0);
/// ```
pub trait HalfFloat: Copy + Send + Sync + 'static + sealed::Sealed {
    /// `"bf16"` or `"f16"`.
    const NAME: &'static str;
    /// The 16 bits of the value.
    fn to_bits(self) -> u16;
    /// The value of 16 bits.
    fn from_bits(bits: u16) -> Self;
    /// A vector of bit patterns as values, reusing its allocation.
    fn vec_from_bits(v: Vec<u16>) -> Vec<Self>;
    /// A vector of values as their bit patterns, reusing its allocation.
    fn vec_into_bits(v: Vec<Self>) -> Vec<u16>;
}

impl HalfFloat for bf16 {
    const NAME: &'static str = "bf16";
    fn to_bits(self) -> u16 {
        bf16::to_bits(self)
    }
    fn from_bits(bits: u16) -> Self {
        bf16::from_bits(bits)
    }
    fn vec_from_bits(v: Vec<u16>) -> Vec<Self> {
        half::vec::HalfBitsVecExt::reinterpret_into(v)
    }
    fn vec_into_bits(v: Vec<Self>) -> Vec<u16> {
        half::vec::HalfFloatVecExt::reinterpret_into(v)
    }
}

impl HalfFloat for f16 {
    const NAME: &'static str = "f16";
    fn to_bits(self) -> u16 {
        f16::to_bits(self)
    }
    fn from_bits(bits: u16) -> Self {
        f16::from_bits(bits)
    }
    fn vec_from_bits(v: Vec<u16>) -> Vec<Self> {
        half::vec::HalfBitsVecExt::reinterpret_into(v)
    }
    fn vec_into_bits(v: Vec<Self>) -> Vec<u16> {
        half::vec::HalfFloatVecExt::reinterpret_into(v)
    }
}

// ---------------------------------------------------------------------------
// The plain code.

mod scalar;
use scalar::{
    bf16_nearest, bf16_stochastic, bf16_widen, f16_nearest, f16_stochastic, f16_widen,
    nearest_scalar, stochastic_scalar, widen_scalar,
};

// ---------------------------------------------------------------------------
// The vector paths.

#[cfg(target_arch = "x86_64")]
mod x86;

mod fused;
pub use fused::{
    FusedArray, HALF_LANES, LANES, LaneRule, Lanes, update_fused, update_fused_naive,
    update_fused_on,
};

// ---------------------------------------------------------------------------
// The paths and the public kernels.

/// A code path of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HalfPath {
    /// Plain Rust on the bits, one element at a time: the reference the
    /// vector paths' tails also run.
    Scalar,
    /// AVX2 and F16C (x86-64), 8 lanes.
    Avx2,
    /// AVX-512F (x86-64), 16 lanes.
    Avx512,
}

impl HalfPath {
    /// Every path, the plain one first.
    pub const ALL: [HalfPath; 3] = [HalfPath::Scalar, HalfPath::Avx2, HalfPath::Avx512];

    /// Whether this CPU can run the path.
    pub fn available(self) -> bool {
        match self {
            HalfPath::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            HalfPath::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c"),
            #[cfg(target_arch = "x86_64")]
            HalfPath::Avx512 => is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            HalfPath::Avx2 | HalfPath::Avx512 => false,
        }
    }

    /// The path the fast kernels run, chosen once: the widest this CPU
    /// has (AVX-512F, else AVX2 with F16C, else the plain code).
    /// `SPLITGRAD_SIMD=baseline` forces the plain code and
    /// `SPLITGRAD_SIMD=avx2` the AVX2 path where the CPU has it.
    pub fn chosen() -> HalfPath {
        static CHOSEN: OnceLock<HalfPath> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let (avx512, avx2) = (HalfPath::Avx512.available(), HalfPath::Avx2.available());
            match super::exp::forced().as_deref() {
                Some("baseline") => HalfPath::Scalar,
                Some("avx2") if avx2 => HalfPath::Avx2,
                Some("avx2") => HalfPath::Scalar,
                _ if avx512 => HalfPath::Avx512,
                _ if avx2 => HalfPath::Avx2,
                _ => HalfPath::Scalar,
            }
        })
    }

    #[track_caller]
    fn check(self) {
        assert!(self.available(), "{self:?} is not available on this CPU");
    }
}

#[track_caller]
fn check_lengths(kernel: &str, src: usize, dst: usize) {
    assert_eq!(
        src, dst,
        "{kernel}: the source has {src} elements and the destination {dst}"
    );
}

/// The index of the first element of `x` that is not finite (±∞ or NaN:
/// every exponent bit set), scanned in blocks the compiler vectorises,
/// compiled for the CPU's widest vectors ([`wide`](super::wide::wide)).
///
/// ```
/// use half::bf16;
/// use splitgrad::kernels::half::first_non_finite;
/// assert_eq!(first_non_finite(&[bf16::ONE, bf16::NAN, bf16::INFINITY]), Some(1));
/// assert_eq!(first_non_finite(&[bf16::MAX, bf16::MIN]), None);
/// ```
pub fn first_non_finite<H: HalfFloat>(x: &[H]) -> Option<usize> {
    const BLOCK: usize = 4096;
    let bad = |b: &u16| b & H::INF_BITS == H::INF_BITS;
    super::wide::wide(
        #[inline(always)]
        || {
            H::bits(x)
                .chunks(BLOCK)
                .enumerate()
                .find(|(_, c)| c.iter().fold(false, |any, b| any | bad(b)))
                .and_then(|(k, c)| c.iter().position(bad).map(|i| k * BLOCK + i))
        },
    )
}

/// `dst[i] = src[i]` as f32, exactly, on [`HalfPath::chosen`].
///
/// **Panics** if the lengths differ.
///
/// ```
/// use half::bf16;
/// use splitgrad::kernels::half::widen;
/// let mut out = [0.0f32; 2];
/// widen(&[bf16::from_f32(1.5), bf16::from_f32(-2.0)], &mut out);
/// assert_eq!(out, [1.5, -2.0]);
/// ```
#[track_caller]
pub fn widen<H: HalfFloat>(src: &[H], dst: &mut [f32]) {
    widen_on(HalfPath::chosen(), src, dst)
}

/// [`widen`] on `path`.
///
/// **Panics** if the lengths differ or the CPU cannot run `path`.
#[track_caller]
pub fn widen_on<H: HalfFloat>(path: HalfPath, src: &[H], dst: &mut [f32]) {
    check_lengths("widen", src.len(), dst.len());
    path.check();
    let src = H::bits(src);
    match path {
        HalfPath::Scalar => widen_scalar::<H>(src, dst),
        // SAFETY: `check` found AVX2 and F16C on this CPU; the lengths agree.
        #[cfg(target_arch = "x86_64")]
        HalfPath::Avx2 => unsafe { x86::widen_avx2::<H>(src, dst) },
        // SAFETY: `check` found AVX-512F on this CPU; the lengths agree.
        #[cfg(target_arch = "x86_64")]
        HalfPath::Avx512 => unsafe { x86::widen_avx512::<H>(src, dst) },
        #[cfg(not(target_arch = "x86_64"))]
        HalfPath::Avx2 | HalfPath::Avx512 => unreachable!("checked above"),
    }
}

/// Adds `x[i]·r[i]` into `lanes[i mod 16]` for every i in order, both
/// factors widened exactly, the product and the sum each rounded in f32
/// (never fused): the lanes of an inner product of half-precision arrays
/// (`kernels::reduce::dot_half`), widened in registers, on `path`.
///
/// **Panics** if the lengths differ or the CPU cannot run `path`.
///
/// ```
/// use half::bf16;
/// use splitgrad::kernels::half::{HalfPath, dot_lanes_on};
/// let x: Vec<bf16> = (0..40).map(|i| bf16::from_f32(i as f32)).collect();
/// let mut lanes = [0.0f32; 16];
/// dot_lanes_on(HalfPath::Scalar, &x, &x, &mut lanes);
/// assert_eq!(lanes[1], 1.0 + 17.0 * 17.0 + 33.0 * 33.0);
/// ```
#[track_caller]
pub fn dot_lanes_on<H: HalfFloat>(path: HalfPath, x: &[H], r: &[H], lanes: &mut [f32; 16]) {
    check_lengths("dot_lanes", x.len(), r.len());
    path.check();
    let body = x.len() - x.len() % 16;
    let (xb, rb) = (H::bits(&x[..body]), H::bits(&r[..body]));
    match path {
        HalfPath::Scalar => dot_lanes_scalar::<H>(xb, rb, lanes),
        // SAFETY: `check` found AVX2 and F16C; equal lengths, multiples of 16.
        #[cfg(target_arch = "x86_64")]
        HalfPath::Avx2 => unsafe { x86::dot_lanes_avx2::<H>(xb, rb, lanes) },
        // SAFETY: `check` found AVX-512F; equal lengths, multiples of 16.
        #[cfg(target_arch = "x86_64")]
        HalfPath::Avx512 => unsafe { x86::dot_lanes_avx512::<H>(xb, rb, lanes) },
        #[cfg(not(target_arch = "x86_64"))]
        HalfPath::Avx2 | HalfPath::Avx512 => unreachable!("checked above"),
    }
    dot_lanes_scalar::<H>(H::bits(&x[body..]), H::bits(&r[body..]), lanes);
}

fn dot_lanes_scalar<H: HalfFloat>(x: &[u16], r: &[u16], lanes: &mut [f32; 16]) {
    let w = |h: u16| match H::FORMAT {
        Format::Bf16 => f32::from_bits(bf16_widen(h)),
        Format::F16 => f32::from_bits(f16_widen(h)),
    };
    for (i, (&a, &b)) in x.iter().zip(r).enumerate() {
        lanes[i % 16] += w(a) * w(b);
    }
}

/// `dst[i] += src[i]` widened, or `dst[i] += scale·src[i]` (the product
/// rounded in f32, then the sum: never fused): a half-precision row summed
/// into an f32 one, widened in registers, on [`HalfPath::chosen`]. The bits
/// are those of [`widen`] into a buffer, then the sum in f32.
///
/// **Panics** if the lengths differ.
///
/// ```
/// use half::bf16;
/// use splitgrad::kernels::half::add_widened;
/// let mut acc = [1.0f32, 2.0];
/// add_widened(&[bf16::from_f32(0.5), bf16::from_f32(-4.0)], &mut acc, Some(2.0));
/// assert_eq!(acc, [2.0, -6.0]);
/// ```
#[track_caller]
pub fn add_widened<H: HalfFloat>(src: &[H], dst: &mut [f32], scale: Option<f32>) {
    add_widened_on(HalfPath::chosen(), src, dst, scale)
}

/// [`add_widened`] on `path`.
///
/// **Panics** if the lengths differ or the CPU cannot run `path`.
#[track_caller]
pub fn add_widened_on<H: HalfFloat>(
    path: HalfPath,
    src: &[H],
    dst: &mut [f32],
    scale: Option<f32>,
) {
    check_lengths("add_widened", src.len(), dst.len());
    path.check();
    let src = H::bits(src);
    match path {
        HalfPath::Scalar => add_widened_scalar::<H>(src, dst, scale),
        // SAFETY: `check` found AVX2 and F16C on this CPU; the lengths agree.
        #[cfg(target_arch = "x86_64")]
        HalfPath::Avx2 => unsafe { x86::add_widened_avx2::<H>(src, dst, scale) },
        // SAFETY: `check` found AVX-512F on this CPU; the lengths agree.
        #[cfg(target_arch = "x86_64")]
        HalfPath::Avx512 => unsafe { x86::add_widened_avx512::<H>(src, dst, scale) },
        #[cfg(not(target_arch = "x86_64"))]
        HalfPath::Avx2 | HalfPath::Avx512 => unreachable!("checked above"),
    }
}

fn add_widened_scalar<H: HalfFloat>(src: &[u16], dst: &mut [f32], scale: Option<f32>) {
    let w = |h: u16| match H::FORMAT {
        Format::Bf16 => f32::from_bits(bf16_widen(h)),
        Format::F16 => f32::from_bits(f16_widen(h)),
    };
    match scale {
        None => dst.iter_mut().zip(src).for_each(|(d, &h)| *d += w(h)),
        Some(c) => dst.iter_mut().zip(src).for_each(|(d, &h)| *d += c * w(h)),
    }
}

/// [`widen`]'s naive twin: the `half` crate's software `to_f32_const`.
///
/// **Panics** if the lengths differ.
#[track_caller]
pub fn widen_naive<H: HalfFloat>(src: &[H], dst: &mut [f32]) {
    check_lengths("widen", src.len(), dst.len());
    for (d, &h) in dst.iter_mut().zip(src) {
        *d = h.naive_to_f32();
    }
}

/// `dst[i]` = the value of `H` nearest `src[i]`, ties to even (subnormals
/// kept, ±∞ past the range, NaN quiet), on [`HalfPath::chosen`].
///
/// **Panics** if the lengths differ.
///
/// ```
/// use half::bf16;
/// use splitgrad::kernels::half::narrow_nearest;
/// let mut out = [bf16::ZERO; 2];
/// // 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷: the even one, 1, wins.
/// narrow_nearest(&[1.0 + 1.0 / 256.0, 3.0], &mut out);
/// assert_eq!(out, [bf16::ONE, bf16::from_f32(3.0)]);
/// ```
#[track_caller]
pub fn narrow_nearest<H: HalfFloat>(src: &[f32], dst: &mut [H]) {
    narrow_nearest_on(HalfPath::chosen(), src, dst)
}

/// [`narrow_nearest`] on `path`.
///
/// **Panics** if the lengths differ or the CPU cannot run `path`.
#[track_caller]
pub fn narrow_nearest_on<H: HalfFloat>(path: HalfPath, src: &[f32], dst: &mut [H]) {
    check_lengths("narrow_nearest", src.len(), dst.len());
    path.check();
    let dst = H::bits_mut(dst);
    match path {
        HalfPath::Scalar => nearest_scalar::<H>(src, dst),
        // SAFETY: `check` found AVX2 and F16C on this CPU; the lengths agree.
        #[cfg(target_arch = "x86_64")]
        HalfPath::Avx2 => unsafe { x86::nearest_avx2::<H>(src, dst) },
        // SAFETY: `check` found AVX-512F on this CPU; the lengths agree.
        #[cfg(target_arch = "x86_64")]
        HalfPath::Avx512 => unsafe { x86::nearest_avx512::<H>(src, dst) },
        #[cfg(not(target_arch = "x86_64"))]
        HalfPath::Avx2 | HalfPath::Avx512 => unreachable!("checked above"),
    }
}

/// [`narrow_nearest`]'s naive twin: the `half` crate's software
/// `from_f32_const`.
///
/// **Panics** if the lengths differ.
#[track_caller]
pub fn narrow_nearest_naive<H: HalfFloat>(src: &[f32], dst: &mut [H]) {
    check_lengths("narrow_nearest", src.len(), dst.len());
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = H::naive_from_f32(x);
    }
}

/// What a half value goes through on its way back to half precision in
/// [`requantize_into`]: widened and rounded to nearest (`Same`), or
/// widened, taken as `1·x + 0` and rounded to nearest (`PlusZero`, how a
/// backward reads an upstream gradient).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requantize {
    /// `round(widen(h))`.
    Same,
    /// `round(1·widen(h) + 0)`.
    PlusZero,
}

/// `dst[i]` = `src[i]` widened, taken through `how` and rounded to
/// nearest, from the bits alone: widening is exact, so for every value but
/// NaN that is `src[i]` itself, but −0 under [`Requantize::PlusZero`]
/// (`−0 + 0 = +0`). A NaN's rounding quiets it, which this copy does not
/// do: it returns false when `src` holds a NaN, and the caller computes the
/// row the long way (what `dst` holds then is unspecified, but written).
/// For a layer whose output row is a row of its input as kept (a token
/// without a row of its own), this is one copy where the long way is a
/// widening, a rounding and a copy.
///
/// **Panics** if the lengths differ.
///
/// ```
/// use std::mem::MaybeUninit;
/// use half::bf16;
/// use splitgrad::kernels::half::{requantize_into, Requantize};
/// let src = [bf16::from_f32(1.5), bf16::NEG_ZERO];
/// let mut dst = [MaybeUninit::uninit(); 2];
/// assert!(requantize_into(&src, &mut dst, Requantize::PlusZero));
/// let dst = dst.map(|d| unsafe { d.assume_init() }.to_bits());
/// assert_eq!(dst, [bf16::from_f32(1.5).to_bits(), 0]);
/// assert!(!requantize_into(&[bf16::NAN], &mut [MaybeUninit::uninit()], Requantize::Same));
/// ```
#[track_caller]
pub fn requantize_into<H: HalfFloat>(
    src: &[H],
    dst: &mut [std::mem::MaybeUninit<H>],
    how: Requantize,
) -> bool {
    check_lengths("requantize_into", src.len(), dst.len());
    // The value that becomes +0: −0 under PlusZero; +0 itself otherwise.
    let zero = match how {
        Requantize::Same => 0,
        Requantize::PlusZero => 0x8000,
    };
    let mut nan = false;
    for (d, &h) in dst.iter_mut().zip(H::bits(src)) {
        nan |= h & 0x7FFF > H::INF_BITS;
        d.write(H::from_raw(if h == zero { 0 } else { h }));
    }
    !nan
}

/// `dst[i]` = `src[i]` rounded stochastically to one of its two neighbours
/// in `H`, with the random bits of global index `first_index + i`
/// (wrapping; [`bf16_sr_bits`] for bf16, [`sr_bits`] for f16), on
/// [`HalfPath::chosen`]. The module's documentation states
/// the rounding; its expected value is `src[i]` (for f16 within 2⁻³² ulp
/// in the subnormal range).
///
/// **Panics** if the lengths differ.
///
/// ```
/// use half::bf16;
/// use splitgrad::kernels::half::{narrow_stochastic, SrKey};
/// let key = SrKey::new(1, 0, SrKey::param_hash("w"));
/// let x = vec![1.0 + 1.0 / 512.0; 4096]; // a quarter of an ulp above 1
/// let mut out = vec![bf16::ZERO; 4096];
/// narrow_stochastic(&x, &mut out, key, 0);
/// let up = out.iter().filter(|&&h| h == bf16::from_f32(1.0 + 1.0 / 128.0)).count();
/// assert!(out.iter().all(|&h| h == bf16::ONE || h == bf16::from_f32(1.0 + 1.0 / 128.0)));
/// assert!((900..1150).contains(&up)); // 1024 expected
/// ```
#[track_caller]
pub fn narrow_stochastic<H: HalfFloat>(src: &[f32], dst: &mut [H], key: SrKey, first_index: u64) {
    narrow_stochastic_on(HalfPath::chosen(), src, dst, key, first_index)
}

/// [`narrow_stochastic`] on `path`.
///
/// **Panics** if the lengths differ or the CPU cannot run `path`.
#[track_caller]
pub fn narrow_stochastic_on<H: HalfFloat>(
    path: HalfPath,
    src: &[f32],
    dst: &mut [H],
    key: SrKey,
    first_index: u64,
) {
    check_lengths("narrow_stochastic", src.len(), dst.len());
    path.check();
    let dst = H::bits_mut(dst);
    match path {
        HalfPath::Scalar => stochastic_scalar::<H>(src, dst, key, first_index),
        // SAFETY: `check` found AVX2 on this CPU; the lengths agree.
        #[cfg(target_arch = "x86_64")]
        HalfPath::Avx2 => unsafe { x86::stochastic_avx2::<H>(src, dst, key, first_index) },
        // SAFETY: `check` found AVX-512F on this CPU; the lengths agree.
        #[cfg(target_arch = "x86_64")]
        HalfPath::Avx512 => unsafe { x86::stochastic_avx512::<H>(src, dst, key, first_index) },
        #[cfg(not(target_arch = "x86_64"))]
        HalfPath::Avx2 | HalfPath::Avx512 => unreachable!("checked above"),
    }
}

/// [`narrow_stochastic`] of elements whose indices do not follow one
/// another: element i draws the bits of global index `index(i)`. Scalar,
/// for short runs (a vector's elements, each a row of its own with a place
/// of its own, [`Parameter::set_rounding_rows`](crate::Parameter::set_rounding_rows)),
/// where a call of [`narrow_stochastic`] a run would cost more than the
/// run; each element's bits are [`narrow_stochastic`]'s for that index.
///
/// ```
/// use half::bf16;
/// use splitgrad::kernels::half::{SrKey, narrow_stochastic, narrow_stochastic_at};
/// let key = SrKey::new(1, 2, 3);
/// let x: Vec<f32> = (0..40).map(|i| 1.0 + i as f32 * 1e-3).collect();
/// let (mut a, mut b) = (vec![bf16::ZERO; 40], vec![bf16::ZERO; 40]);
/// narrow_stochastic(&x, &mut a, key, 100);
/// narrow_stochastic_at(&x, &mut b, key, |i| 100 + i as u64);
/// assert_eq!(a, b);
/// ```
///
/// **Panics** if the lengths differ.
#[track_caller]
pub fn narrow_stochastic_at<H: HalfFloat>(
    src: &[f32],
    dst: &mut [H],
    key: SrKey,
    index: impl Fn(usize) -> u64,
) {
    check_lengths("narrow_stochastic", src.len(), dst.len());
    let dst = H::bits_mut(dst);
    for (i, (d, &x)) in dst.iter_mut().zip(src).enumerate() {
        *d = match H::FORMAT {
            Format::Bf16 => bf16_stochastic(x.to_bits(), bf16_sr_bits(key, index(i))),
            Format::F16 => f16_stochastic(x.to_bits(), sr_bits(key, index(i))),
        };
    }
}

/// [`narrow_stochastic`]'s naive twin, from the definition in f64: the
/// lower neighbour `lo` found with the `half` crate's software rounding to
/// nearest (one step down when that rounded up), the ulp above it from the
/// next value, `F = ⌊2³²·(|x| − lo)/ulp⌋`, and `lo`'s successor if
/// `F + r ≥ 2³²`.
///
/// **Panics** if the lengths differ.
#[track_caller]
pub fn narrow_stochastic_naive<H: HalfFloat>(
    src: &[f32],
    dst: &mut [H],
    key: SrKey,
    first_index: u64,
) {
    check_lengths("narrow_stochastic", src.len(), dst.len());
    for (i, (d, &x)) in dst.iter_mut().zip(src).enumerate() {
        let r = rounding_bits::<H>(key, first_index.wrapping_add(i as u64));
        *d = stochastic_naive_one::<H>(x, r);
    }
}

/// The random bits of element `index` of an `H` array: [`bf16_sr_bits`]
/// for bf16, [`sr_bits`] for f16.
fn rounding_bits<H: HalfFloat>(key: SrKey, index: u64) -> u32 {
    match H::FORMAT {
        Format::Bf16 => bf16_sr_bits(key, index),
        Format::F16 => sr_bits(key, index),
    }
}

fn stochastic_naive_one<H: HalfFloat>(x: f32, r: u32) -> H {
    if x.is_nan() {
        return H::naive_from_f32(x);
    }
    let value = |bits: u16| H::from_raw(bits).naive_to_f32() as f64;
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs() as f64;
    let mut lo = H::naive_from_f32(x.abs()).to_bits();
    if value(lo) > a {
        lo -= 1;
    }
    if lo == H::INF_BITS {
        return H::from_raw(sign | lo);
    }
    let ulp = if lo == H::MAX_BITS {
        value(lo) - value(lo - 1)
    } else {
        value(lo + 1) - value(lo)
    };
    let below = a - value(lo);
    if below >= ulp {
        // Past the largest finite value by a whole ulp or more.
        return H::from_raw(sign | H::INF_BITS);
    }
    let f = (below / ulp * 4_294_967_296.0).floor() as u64;
    let up = (f + r as u64 >= 1 << 32) as u16;
    H::from_raw(sign | (lo + up))
}
