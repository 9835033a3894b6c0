//! The softmax arithmetic of the fused cross-entropy, vectorised: the row
//! maximum, `Σ exp(z − m)`, and `z ← u·exp(z − l)` in place.
//!
//! f64 uses the standard library's `exp`. f32 uses a branch-free `exp`
//! (Cody–Waite reduction by ln 2, Cephes' polynomial, the exponent put
//! back through the bits; within 2 ulp of `f32::exp` on `[−87, 88]`)
//! that the compiler vectorises; on x86-64 the same code is compiled again
//! for AVX2 and for AVX-512 and the widest the CPU has is chosen at run
//! time (`SPLITGRAD_SIMD=baseline|avx2` forces a narrower one). Every path
//! does the same operations in the same order on 16 fixed lanes (no fused
//! multiply-add), so they give the same bits, whatever the machine or the
//! thread count.
//! The scalar twins ([`max_naive`], [`sum_exp_naive`]) are the reference
//! the tests hold the fast ones to.

use super::Real;

/// Lanes of the accumulators: the summation order is fixed by it.
const LANES: usize = 16;

/// `exp(x)` for f32 without branches, within 2 ulp on `[−87, 88]`; inputs
/// below −87.3 give a tiny positive number instead of a subnormal or 0,
/// which cannot change a sum that holds a term ≥ 1.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5·2²³: adding it rounds to an integer
    // Written so that it vectorises: comparisons (a NaN stays NaN), and
    // the integer n read from the bits of `t` rather than cast.
    let x = if x > 88.7 { 88.7 } else { x };
    let x = if x < -87.3 { -87.3 } else { x };
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // exp(r) = 1 + r + r²·P(r) on |r| ≤ ln2/2 (Cephes' minimax P).
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let p = (p * (r * r) + r) + 1.0;
    // t = 1.5·2²³ + n, so its bits are those of 1.5·2²³ plus n (|n| ≤ 128).
    let biased = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127);
    let scale = f32::from_bits(biased << 23);
    p * scale
}

/// `exp(x)` for f32 as [`exp_f32`], with fused multiply-adds where
/// `exp_f32` multiplies then adds (fewer operations; within 2 ulp of
/// `f32::exp` on `[−87, 88]`). It uses `f32::mul_add`, which is one
/// instruction where the CPU has FMA and exact in software elsewhere, so it
/// gives the same bits on every machine.
#[inline(always)]
pub fn exp_fma(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0;
    let x = if x > 88.7 { 88.7 } else { x };
    let x = if x < -87.3 { -87.3 } else { x };
    let t = x.mul_add(LOG2E, ROUND);
    let n = t - ROUND;
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    let p = 1.987_569_1e-4f32;
    let p = p.mul_add(r, 1.398_199_9e-3);
    let p = p.mul_add(r, 8.333_452e-3);
    let p = p.mul_add(r, 4.166_579_6e-2);
    let p = p.mul_add(r, 1.666_666_5e-1);
    let p = p.mul_add(r, 0.5);
    let p = p.mul_add(r * r, r) + 1.0;
    let biased = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127);
    p * f32::from_bits(biased << 23)
}

#[inline(always)]
fn max_lanes(z: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = z.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &x in acc.iter().chain(chunks.remainder()) {
        m = if x > m { x } else { m };
    }
    m
}

#[inline(always)]
fn sum_exp_lanes(z: &[f32], m: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = z.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += exp_f32(x - m);
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a += exp_f32(x - m);
    }
    // Pairwise in a fixed order.
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0]
}

#[inline(always)]
fn scaled_exp_lanes(z: &mut [f32], shift: f32, scale: f32) {
    for x in z.iter_mut() {
        *x = scale * exp_f32(*x - shift);
    }
}

/// `max`, `sum_exp` and `scaled_exp`: the portable lanes above compiled
/// for the instruction set `$feature` (the CPU must have it).
#[cfg(target_arch = "x86_64")]
macro_rules! lanes_compiled_for {
    ($feature:literal) => {
        #[target_feature(enable = $feature)]
        pub(super) unsafe fn max(z: &[f32]) -> f32 {
            super::max_lanes(z)
        }
        #[target_feature(enable = $feature)]
        pub(super) unsafe fn sum_exp(z: &[f32], m: f32) -> f32 {
            super::sum_exp_lanes(z, m)
        }
        #[target_feature(enable = $feature)]
        pub(super) unsafe fn scaled_exp(z: &mut [f32], shift: f32, scale: f32) {
            super::scaled_exp_lanes(z, shift, scale)
        }
    };
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// [`super::exp_fma`] on eight lanes: the same operations in the same
    /// order, so the same bits lane by lane (held by a test).
    ///
    /// # Safety
    ///
    /// The CPU must have AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn exp_fma_ps(x: __m256) -> __m256 {
        const LOG2E: f32 = std::f32::consts::LOG2_E;
        const LN2_HI: f32 = 0.693_359_4;
        const LN2_LO: f32 = -2.121_944_4e-4;
        const ROUND: f32 = 12_582_912.0;
        let set = _mm256_set1_ps;
        // `if x > c { c } else { x }` is `min(c, x)` (a NaN x stays x), and
        // `if x < c { c } else { x }` is `max(c, x)`.
        let x = _mm256_min_ps(set(88.7), x);
        let x = _mm256_max_ps(set(-87.3), x);
        let t = _mm256_fmadd_ps(x, set(LOG2E), set(ROUND));
        let n = _mm256_sub_ps(t, set(ROUND));
        let nn = _mm256_xor_ps(n, set(-0.0));
        let r = _mm256_fmadd_ps(nn, set(LN2_HI), x);
        let r = _mm256_fmadd_ps(nn, set(LN2_LO), r);
        let p = _mm256_fmadd_ps(set(1.987_569_1e-4), r, set(1.398_199_9e-3));
        let p = _mm256_fmadd_ps(p, r, set(8.333_452e-3));
        let p = _mm256_fmadd_ps(p, r, set(4.166_579_6e-2));
        let p = _mm256_fmadd_ps(p, r, set(1.666_666_5e-1));
        let p = _mm256_fmadd_ps(p, r, set(0.5));
        let p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), set(1.0));
        let bits = _mm256_sub_epi32(
            _mm256_castps_si256(t),
            _mm256_set1_epi32(ROUND.to_bits() as i32),
        );
        let biased = _mm256_add_epi32(bits, _mm256_set1_epi32(127));
        _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased)))
    }

    lanes_compiled_for!("avx2");
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    lanes_compiled_for!("avx512f");
}

/// The widest vector path of this CPU, checked once. `SPLITGRAD_SIMD`
/// forces one: `baseline`, `avx2` or `avx512` (a path the CPU lacks falls
/// back to the baseline), for tests and comparisons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Baseline,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// Whether `SPLITGRAD_SIMD=baseline` asks for the plain code everywhere
/// (the exp kernels, and the gathers' streaming stores).
pub(crate) fn baseline_forced() -> bool {
    forced().as_deref() == Some("baseline")
}

/// `SPLITGRAD_SIMD`, read once.
pub(crate) fn forced() -> &'static Option<String> {
    static FORCED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    FORCED.get_or_init(|| std::env::var("SPLITGRAD_SIMD").ok())
}

fn path() -> Path {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static PATH: OnceLock<Path> = OnceLock::new();
        *PATH.get_or_init(|| {
            let avx512 = is_x86_feature_detected!("avx512f");
            let avx2 = is_x86_feature_detected!("avx2");
            match forced().as_deref() {
                Some("baseline") => Path::Baseline,
                Some("avx2") if avx2 => Path::Avx2,
                Some("avx2") => Path::Baseline,
                _ if avx512 => Path::Avx512,
                _ if avx2 => Path::Avx2,
                _ => Path::Baseline,
            }
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Path::Baseline
    }
}

fn max_f32(z: &[f32]) -> f32 {
    match path() {
        // SAFETY: `path` chose AVX-512 only where the CPU has it.
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => unsafe { avx512::max(z) },
        // SAFETY: `path` chose AVX2 only where the CPU has it.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { avx2::max(z) },
        Path::Baseline => max_lanes(z),
    }
}

fn sum_exp_f32(z: &[f32], m: f32) -> f32 {
    match path() {
        // SAFETY: `path` chose AVX-512 only where the CPU has it.
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => unsafe { avx512::sum_exp(z, m) },
        // SAFETY: `path` chose AVX2 only where the CPU has it.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { avx2::sum_exp(z, m) },
        Path::Baseline => sum_exp_lanes(z, m),
    }
}

fn scaled_exp_f32(z: &mut [f32], shift: f32, scale: f32) {
    match path() {
        // SAFETY: `path` chose AVX-512 only where the CPU has it.
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => unsafe { avx512::scaled_exp(z, shift, scale) },
        // SAFETY: `path` chose AVX2 only where the CPU has it.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { avx2::scaled_exp(z, shift, scale) },
        Path::Baseline => scaled_exp_lanes(z, shift, scale),
    }
}

/// The largest element (−∞ for an empty row). NaN elements are skipped
/// here; they still make [`sum_exp`] NaN.
///
/// ```
/// use splitgrad::kernels::exp::max;
/// assert_eq!(max(&[1.0f32, 3.0, -2.0]), 3.0);
/// ```
pub fn max<T: Real>(z: &[T]) -> T {
    if let Some(z) = as_f32(z) {
        return T::from_f64(max_f32(z) as f64);
    }
    max_naive(z)
}

/// `Σ_v exp(z_v − m)`.
///
/// ```
/// use splitgrad::kernels::exp::sum_exp;
/// let s = sum_exp(&[0.0f64, 0.0], 0.0);
/// assert_eq!(s, 2.0);
/// ```
pub fn sum_exp<T: Real>(z: &[T], m: T) -> T {
    if let Some(z) = as_f32(z) {
        return T::from_f64(sum_exp_f32(z, m.to_f64() as f32) as f64);
    }
    sum_exp_naive(z, m)
}

/// `z_v ← scale·exp(z_v − shift)` in place.
///
/// ```
/// use splitgrad::kernels::exp::scaled_exp;
/// let mut z = [0.0f64, 1.0];
/// scaled_exp(&mut z, 1.0, 2.0);
/// assert_eq!(z[1], 2.0);
/// ```
pub fn scaled_exp<T: Real>(z: &mut [T], shift: T, scale: T) {
    if let Some(z) = as_f32_mut(z) {
        scaled_exp_f32(z, shift.to_f64() as f32, scale.to_f64() as f32);
        return;
    }
    for x in z.iter_mut() {
        *x = scale * (*x - shift).exp();
    }
}

/// The scalar twin of [`max`].
pub fn max_naive<T: Real>(z: &[T]) -> T {
    z.iter()
        .fold(T::neg_infinity(), |a, &b| if b > a { b } else { a })
}

/// The scalar twin of [`sum_exp`] (the standard library's `exp`, summed
/// left to right).
pub fn sum_exp_naive<T: Real>(z: &[T], m: T) -> T {
    z.iter()
        .map(|&x| (x - m).exp())
        .fold(T::zero(), |a, b| a + b)
}

fn as_f32<T: Real>(z: &[T]) -> Option<&[f32]> {
    (T::NAME == "f32").then(|| {
        // SAFETY: `T` is the sealed `Real` whose NAME is "f32", so `T` is
        // `f32`: same size, alignment and bit validity.
        unsafe { std::slice::from_raw_parts(z.as_ptr().cast::<f32>(), z.len()) }
    })
}

fn as_f32_mut<T: Real>(z: &mut [T]) -> Option<&mut [f32]> {
    (T::NAME == "f32").then(|| {
        // SAFETY: as in `as_f32`; the borrow is unique.
        unsafe { std::slice::from_raw_parts_mut(z.as_mut_ptr().cast::<f32>(), z.len()) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;

    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    /// `exp` is within two ulp of the standard library's over
    /// [−87, 88) and at its edges, underflows to a tiny non-negative
    /// value, and keeps NaN.
    fn within_two_ulp_of_std(exp: fn(f32) -> f32) {
        let mut worst = 0;
        let mut x = -87.0f32;
        while x < 88.0 {
            worst = worst.max(ulps(exp(x), x.exp()));
            x += 0.000_731;
        }
        for x in [0.0f32, -0.0, 1.0, -1.0, 1e-8, -1e-8, 88.0, -87.0] {
            worst = worst.max(ulps(exp(x), x.exp()));
        }
        assert!(worst <= 2, "worst error {worst} ulp");
        assert!(exp(-1e4) >= 0.0 && exp(-1e4) < 1e-37);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn exp_is_within_two_ulp_of_std() {
        within_two_ulp_of_std(exp_f32);
    }

    #[test]
    fn the_fma_exp_is_within_two_ulp_of_std() {
        within_two_ulp_of_std(exp_fma);
    }

    #[test]
    fn fast_paths_match_the_naive_twins() {
        let mut rng = Rng::new(5);
        for len in [0usize, 1, 7, 15, 16, 17, 100, 1000] {
            let z: Vec<f32> = (0..len).map(|_| 30.0 * rng.normal() as f32).collect();
            let m = max(&z);
            assert_eq!(m, max_naive(&z));
            if len == 0 {
                continue;
            }
            let (fast, slow) = (sum_exp(&z, m), sum_exp_naive(&z, m));
            assert!((fast - slow).abs() <= 1e-6 * slow, "{fast} vs {slow}");
            let mut a = z.clone();
            scaled_exp(&mut a, m, 0.5);
            for (&x, &y) in a.iter().zip(&z) {
                let want = 0.5 * (y - m).exp();
                if want < 1e-37 {
                    assert!(x < 1e-37, "{x} for {want}");
                } else {
                    assert!((x - want).abs() <= 3e-7 * want, "{x} vs {want}");
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_eight_lane_exp_gives_the_scalar_bits() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("skipped: this CPU has no AVX2 + FMA");
            return;
        }
        let mut xs: Vec<f32> = (-2_000_000..=2_000_000).map(|i| i as f32 * 5e-5).collect();
        xs.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            0.0,
            88.7,
            88.8,
            -87.3,
            -87.4,
            1e30,
            -1e30,
            f32::MIN_POSITIVE,
        ]);
        while !xs.len().is_multiple_of(8) {
            xs.push(0.5);
        }
        for c in xs.chunks_exact(8) {
            let mut out = [0.0f32; 8];
            // SAFETY: AVX2 and FMA were checked above; c holds 8 floats.
            unsafe {
                use std::arch::x86_64::*;
                _mm256_storeu_ps(
                    out.as_mut_ptr(),
                    super::avx2::exp_fma_ps(_mm256_loadu_ps(c.as_ptr())),
                )
            };
            for (&x, &y) in c.iter().zip(&out) {
                let want = exp_fma(x);
                assert!(
                    want.to_bits() == y.to_bits() || (want.is_nan() && y.is_nan()),
                    "exp_fma_ps({x}) = {y}, exp_fma gives {want}"
                );
            }
        }
    }

    #[test]
    fn every_vector_path_gives_the_baseline_bits() {
        let mut rng = Rng::new(6);
        let z: Vec<f32> = (0..1003).map(|_| 10.0 * rng.normal() as f32).collect();
        let m = max_lanes(&z);
        let base = sum_exp_lanes(&z, m);
        let mut scaled = z.clone();
        scaled_exp_lanes(&mut scaled, m, 0.25);
        let same = |a: &[f32]| {
            a.iter()
                .zip(&scaled)
                .all(|(x, y)| x.to_bits() == y.to_bits())
        };
        #[cfg(target_arch = "x86_64")]
        {
            /// One instruction set's max, Σ exp and scaled exp.
            type Kernels = (
                unsafe fn(&[f32]) -> f32,
                unsafe fn(&[f32], f32) -> f32,
                unsafe fn(&mut [f32], f32, f32),
            );
            let avx2: Kernels = (avx2::max, avx2::sum_exp, avx2::scaled_exp);
            let avx512: Kernels = (avx512::max, avx512::sum_exp, avx512::scaled_exp);
            let detected = [
                (is_x86_feature_detected!("avx2"), avx2),
                (is_x86_feature_detected!("avx512f"), avx512),
            ];
            for (_, (max, sum_exp, scaled_exp)) in detected.into_iter().filter(|d| d.0) {
                // SAFETY: the instruction set of these kernels was detected
                // on this CPU.
                let (am, asum) = unsafe { (max(&z), sum_exp(&z, m)) };
                assert_eq!(am.to_bits(), m.to_bits());
                assert_eq!(asum.to_bits(), base.to_bits());
                let mut b = z.clone();
                // SAFETY: as above.
                unsafe { scaled_exp(&mut b, m, 0.25) };
                assert!(same(&b));
            }
        }
        assert!(same(&scaled));
    }

    #[test]
    fn f64_uses_the_standard_exp() {
        let z = [0.5f64, -2.0, 3.0];
        assert_eq!(sum_exp(&z, 3.0), sum_exp_naive(&z, 3.0));
    }
}
