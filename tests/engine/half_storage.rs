//! The half-precision storage kernels (`kernels::half`) against their naive
//! twins and against what they promise:
//!
//! - every path this CPU can run (the plain one always), and the path the
//!   fast kernels chose, which must be the widest the CPU has;
//! - widening: all 65,536 bit patterns of bf16 and of f16, bit for bit;
//! - rounding to nearest: every representable value, every halfway point
//!   and its f32 neighbours, the overflow threshold, f32 subnormals, NaNs
//!   with payloads and a million random f32 bit patterns, bit for bit, and
//!   `widen(narrow(widen(h))) = widen(h)` for every h;
//! - stochastic rounding: the twin's bits on the same inputs; the result
//!   always one of the two neighbours, representable values unchanged; the
//!   mean of 2¹⁶ draws within 5 binomial standard errors (plus the f16
//!   bias bound of 2⁻³² ulp) of x; an update below half an ulp that
//!   nearest rounding never applies while stochastic rounding follows the
//!   f32 sum; and the same bits for any cutting into calls or threads.

use std::mem::MaybeUninit;

use half::{bf16, f16};
use rayon::prelude::*;
use splitgrad::Rng;
use splitgrad::kernels::half::{
    HalfFloat, HalfPath, Requantize, SrKey, bf16_sr_bits, dot_lanes_on, narrow_nearest,
    narrow_nearest_naive, narrow_nearest_on, narrow_stochastic, narrow_stochastic_naive,
    narrow_stochastic_on, requantize_into, sr_bits, widen, widen_naive, widen_on,
};

/// Every path this CPU runs.
pub(super) fn paths() -> Vec<HalfPath> {
    HalfPath::ALL
        .into_iter()
        .filter(|p| p.available())
        .collect()
}

fn all_bits<H: HalfFloat>() -> Vec<H> {
    (0..=u16::MAX).map(H::from_bits).collect()
}

fn bits<H: HalfFloat>(h: &[H]) -> Vec<u16> {
    h.iter().map(|x| x.to_bits()).collect()
}

fn f32_bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|x| x.to_bits()).collect()
}

/// `got == want`, naming the first difference and its input.
#[track_caller]
fn assert_same<T: PartialEq + std::fmt::LowerHex, I: std::fmt::Debug>(
    got: &[T],
    want: &[T],
    inputs: &[I],
    what: &str,
) {
    assert_eq!(got.len(), want.len(), "{what}");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{what}: element {i} ({:?}) gave {:#x}, the twin {:#x}",
            inputs[i], got[i], want[i]
        );
    }
}

fn widened<H: HalfFloat>(h: &[H]) -> Vec<f32> {
    let mut out = vec![0.0; h.len()];
    widen_naive(h, &mut out);
    out
}

/// The f32 values narrowing must get right for `H`: every representable
/// value, each halfway point between neighbours (the largest finite value's
/// successor taken as one ulp above it) and the f32 values either side of
/// it, f32 subnormals, extremes and NaNs with payloads, each with both signs.
fn edge_cases<H: HalfFloat>() -> Vec<f32> {
    let max_bits = (0..=0x7FFFu16)
        .rev()
        .find(|&b| H::from_bits(b).to_f32_checked().is_finite())
        .unwrap();
    let mut out = Vec::new();
    for b in 0..=max_bits {
        let lo = H::from_bits(b).to_f32_checked() as f64;
        let hi = if b == max_bits {
            2.0 * lo - H::from_bits(b - 1).to_f32_checked() as f64
        } else {
            H::from_bits(b + 1).to_f32_checked() as f64
        };
        let mid = ((lo + hi) / 2.0) as f32;
        assert_eq!(mid as f64, (lo + hi) / 2.0, "midpoints are f32 values");
        out.extend([lo as f32, mid, mid.next_up(), mid.next_down()]);
    }
    out.extend([
        f32::from_bits(1),
        f32::from_bits(0x007F_FFFF),
        f32::MIN_POSITIVE,
        f32::MAX,
        f32::INFINITY,
        f32::from_bits(0x7F80_0001),
        f32::from_bits(0x7F80_8000),
        f32::from_bits(0x7F80_2000),
        f32::from_bits(0x7FA0_0000),
        f32::from_bits(0x7FC0_0000),
        f32::from_bits(0x7FC0_0001),
        f32::from_bits(0x7FFF_FFFF),
    ]);
    let negated: Vec<f32> = out.iter().map(|x| -x).collect();
    out.extend(negated);
    out
}

/// Widening through the naive twin, for the tests' own arithmetic.
trait Value {
    fn to_f32_checked(self) -> f32;
}

impl<H: HalfFloat> Value for H {
    fn to_f32_checked(self) -> f32 {
        let mut out = [0.0];
        widen_naive(&[self], &mut out);
        out[0]
    }
}

fn random_f32s(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| f32::from_bits(rng.next_u64() as u32))
        .collect()
}

#[test]
fn the_chosen_path_is_the_widest_the_cpu_has() {
    let chosen = HalfPath::chosen();
    assert!(chosen.available());
    #[cfg(target_arch = "x86_64")]
    {
        let avx512 = is_x86_feature_detected!("avx512f");
        let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c");
        assert_eq!(HalfPath::Avx512.available(), avx512);
        assert_eq!(HalfPath::Avx2.available(), avx2);
        let expected = match std::env::var("SPLITGRAD_SIMD").as_deref() {
            Ok("baseline") => HalfPath::Scalar,
            Ok("avx2") if avx2 => HalfPath::Avx2,
            Ok("avx2") => HalfPath::Scalar,
            _ if avx512 => HalfPath::Avx512,
            _ if avx2 => HalfPath::Avx2,
            _ => HalfPath::Scalar,
        };
        assert_eq!(chosen, expected);
    }
    #[cfg(not(target_arch = "x86_64"))]
    assert_eq!(chosen, HalfPath::Scalar);
}

fn widen_every_pattern<H: HalfFloat>() {
    let all = all_bits::<H>();
    let naive = widened(&all);
    for path in paths() {
        let mut fast = vec![0.0; all.len()];
        widen_on(path, &all, &mut fast);
        let what = format!("{} on {path:?}", H::NAME);
        assert_same(&f32_bits(&fast), &f32_bits(&naive), &bits(&all), &what);
        // Unaligned starts and every tail length.
        for (start, len) in [(1, 0), (3, 1), (5, 15), (7, 17), (9, 31), (11, 1000)] {
            let mut part = vec![0.0; len];
            widen_on(path, &all[start..start + len], &mut part);
            let want = f32_bits(&naive[start..start + len]);
            assert_same(&f32_bits(&part), &want, &bits(&all)[start..], &what);
        }
    }
    let mut fast = vec![0.0; all.len()];
    widen(&all, &mut fast);
    assert_same(&f32_bits(&fast), &f32_bits(&naive), &bits(&all), H::NAME);
    for (h, x) in all.iter().zip(&naive) {
        assert_eq!(x.is_nan(), h.to_f32_checked().is_nan());
    }
}

#[test]
fn widening_gives_the_twins_bits_for_every_pattern() {
    widen_every_pattern::<bf16>();
    widen_every_pattern::<f16>();
    // The reference itself: bf16 is the top half of the f32 bits, a NaN
    // quieted.
    let all = all_bits::<bf16>();
    for (h, x) in all.iter().zip(widened(&all)) {
        let quiet = if x.is_nan() { 0x40_0000 } else { 0 };
        assert_eq!(x.to_bits(), (h.to_bits() as u32) << 16 | quiet);
    }
    assert_eq!(f16::from_bits(1).to_f32_checked(), 2f32.powi(-24));
}

fn nearest_matches_the_twin<H: HalfFloat>() {
    let mut xs = edge_cases::<H>();
    xs.extend(random_f32s(25, 1_000_000));
    let mut naive = vec![H::from_bits(0); xs.len()];
    narrow_nearest_naive(&xs, &mut naive);
    for path in paths() {
        let mut fast = vec![H::from_bits(0); xs.len()];
        narrow_nearest_on(path, &xs, &mut fast);
        let n = bits(&naive);
        let what = format!("{} on {path:?}", H::NAME);
        assert_same(&bits(&fast), &n, &xs, &what);
        for (start, len) in [(1, 0), (3, 1), (5, 15), (7, 17), (9, 31), (11, 1001)] {
            let mut part = vec![H::from_bits(0); len];
            narrow_nearest_on(path, &xs[start..start + len], &mut part);
            assert_same(&bits(&part), &n[start..start + len], &xs[start..], &what);
        }
    }
    let mut fast = vec![H::from_bits(0); xs.len()];
    narrow_nearest(&xs, &mut fast);
    assert_same(&bits(&fast), &bits(&naive), &xs, H::NAME);
}

#[test]
fn rounding_to_nearest_gives_the_twins_bits() {
    nearest_matches_the_twin::<bf16>();
    nearest_matches_the_twin::<f16>();
}

#[test]
fn rounding_to_nearest_follows_ieee() {
    let one = |x: f32| {
        let (mut b, mut h) = ([bf16::ZERO], [f16::ZERO]);
        narrow_nearest(&[x], &mut b);
        narrow_nearest(&[x], &mut h);
        (b[0].to_bits(), h[0].to_bits())
    };
    // Ties to even: 1 + half an ulp stays 1; 1 + 3 half-ulps goes up to 1 + 2 ulps.
    assert_eq!(one(1.0 + 2f32.powi(-8)).0, 0x3F80);
    assert_eq!(one(1.0 + 3.0 * 2f32.powi(-8)).0, 0x3F82);
    assert_eq!(one(1.0 + 2f32.powi(-11)).1, 0x3C00);
    assert_eq!(one(1.0 + 3.0 * 2f32.powi(-11)).1, 0x3C02);
    // Overflow: f16 65504 is the largest; 65519.99 stays, 65520 is ∞.
    assert_eq!(one(65519.996).1, 0x7BFF);
    assert_eq!(one(65520.0).1, 0x7C00);
    assert_eq!(one(-1e6).1, 0xFC00);
    assert_eq!(one(f32::MAX).0, 0x7F80);
    // Subnormals are kept: f16's smallest, 2⁻²⁴, and its half (a tie to 0).
    assert_eq!(one(2f32.powi(-24)).1, 0x0001);
    assert_eq!(one(2f32.powi(-25)).1, 0x0000);
    assert_eq!(one(2f32.powi(-25).next_up()).1, 0x0001);
    assert_eq!(one(f32::from_bits(0x0000_8000)).0, 0x0000); // a tie, even
    assert_eq!(one(f32::from_bits(0x0001_8000)).0, 0x0002); // a tie, to even
    assert_eq!(one(f32::from_bits(0x0001_0000)).0, 0x0001); // bf16's smallest
    assert_eq!(one(-0.0), (0x8000, 0x8000));
    // NaN stays NaN, quiet, even when only the bits that are dropped were set.
    assert_eq!(one(f32::from_bits(0x7F80_0001)), (0x7FC0, 0x7E00));
    assert_eq!(one(f32::from_bits(0xFFA0_0000)), (0xFFE0, 0xFF00));
}

fn round_trip<H: HalfFloat>() {
    let all = all_bits::<H>();
    let once = widened(&all);
    for path in paths() {
        let mut back = vec![H::from_bits(0); all.len()];
        narrow_nearest_on(path, &once, &mut back);
        let mut twice = vec![0.0; all.len()];
        widen_on(path, &back, &mut twice);
        // Bit for bit, a NaN included (widening quieted it, and a quiet
        // NaN's payload survives narrowing).
        let what = format!("{} on {path:?}", H::NAME);
        assert_same(&f32_bits(&twice), &f32_bits(&once), &bits(&all), &what);
        for (k, (x, h)) in once.iter().zip(&back).enumerate() {
            assert!(x.is_nan() || h.to_bits() == k as u16, "{what}: {k:#06x}");
        }
    }
}

#[test]
fn narrowing_a_widened_value_gives_it_back() {
    round_trip::<bf16>();
    round_trip::<f16>();
}

/// `requantize_into` on every pattern, one element at a time and in rows:
/// the twins' widening, `1·x + 0` (under PlusZero) and rounding, bit for
/// bit; false exactly for a row with a NaN.
fn requantize_every_pattern<H: HalfFloat>() {
    let all = all_bits::<H>();
    for how in [Requantize::Same, Requantize::PlusZero] {
        let want: Vec<u16> = all
            .iter()
            .map(|&h| {
                let x = widened(&[h])[0];
                let x = if how == Requantize::PlusZero {
                    1.0 * x + 0.0
                } else {
                    x
                };
                let mut out = [H::from_bits(0)];
                narrow_nearest_naive(&[x], &mut out);
                out[0].to_bits()
            })
            .collect();
        let what = format!("{} {how:?}", H::NAME);
        for (k, &h) in all.iter().enumerate() {
            let mut out = [MaybeUninit::uninit()];
            let plain = requantize_into(&[h], &mut out, how);
            let nan = widened(&[h])[0].is_nan();
            assert_eq!(plain, !nan, "{what}: {k:#06x}");
            if plain {
                // SAFETY: written by requantize_into.
                let got = unsafe { out[0].assume_init() }.to_bits();
                assert_eq!(got, want[k], "{what}: {k:#06x}");
            }
        }
        // Rows of 64 consecutive patterns: a row without a NaN whole.
        for (r, row) in all.chunks(64).enumerate() {
            let mut out = vec![MaybeUninit::uninit(); row.len()];
            let plain = requantize_into(row, &mut out, how);
            assert_eq!(
                plain,
                !widened(row).iter().any(|x| x.is_nan()),
                "{what}: row {r}"
            );
            if plain {
                // SAFETY: written by requantize_into.
                let got: Vec<u16> = out
                    .iter()
                    .map(|o| unsafe { o.assume_init() }.to_bits())
                    .collect();
                assert_eq!(got, want[r * 64..(r + 1) * 64], "{what}: row {r}");
            }
        }
    }
}

#[test]
fn requantizing_a_kept_row_gives_the_long_ways_bits() {
    requantize_every_pattern::<bf16>();
    requantize_every_pattern::<f16>();
}

fn stochastic_matches_the_twin<H: HalfFloat>() {
    let mut xs = edge_cases::<H>();
    xs.extend(random_f32s(26, 1_000_000));
    let key = SrKey::new(3, 11, SrKey::param_hash("table"));
    // Starts where the low word of the index wraps within a vector, and
    // where the index itself wraps.
    for first in [0, 7, (1u64 << 32) - 37, (1u64 << 33) - 37, u64::MAX - 20] {
        let mut naive = vec![H::from_bits(0); xs.len()];
        narrow_stochastic_naive(&xs, &mut naive, key, first);
        for path in paths() {
            let mut fast = vec![H::from_bits(0); xs.len()];
            narrow_stochastic_on(path, &xs, &mut fast, key, first);
            let what = format!("{} on {path:?} from index {first}", H::NAME);
            assert_same(&bits(&fast), &bits(&naive), &xs, &what);
        }
        check_neighbours(&xs, &naive);
    }
}

/// Each result is x when x is representable, else one of its two
/// neighbours (∞ standing for the one above the largest finite value).
fn check_neighbours<H: HalfFloat>(xs: &[f32], out: &[H]) {
    for (&x, &h) in xs.iter().zip(out) {
        let v = h.to_f32_checked();
        if x.is_nan() {
            assert!(v.is_nan());
            continue;
        }
        assert_eq!(
            v.is_sign_negative(),
            x.is_sign_negative(),
            "{x:e} gave {v:e}"
        );
        let (a, m) = (x.abs(), h.to_bits() & 0x7FFF);
        let (va, step) = (v.abs(), |b: u16| H::from_bits(b).to_f32_checked());
        if va < a {
            assert!(step(m + 1) > a, "{x:e} gave {v:e}, not its lower neighbour");
        } else if va > a {
            assert!(
                m > 0 && step(m - 1) < a,
                "{x:e} gave {v:e}, not its upper neighbour"
            );
        }
    }
}

#[test]
fn stochastic_rounding_gives_the_twins_bits_and_a_neighbour() {
    stochastic_matches_the_twin::<bf16>();
    stochastic_matches_the_twin::<f16>();
}

fn representable_unchanged<H: HalfFloat>() {
    let all: Vec<H> = all_bits::<H>();
    let values = widened(&all);
    for step in 0..4 {
        let key = SrKey::new(9, step, SrKey::param_hash(H::NAME));
        let mut out = vec![H::from_bits(0); all.len()];
        narrow_stochastic(&values, &mut out, key, step << 20);
        for (k, (h, x)) in out.iter().zip(&values).enumerate() {
            if x.is_nan() {
                assert!(h.to_f32_checked().is_nan());
            } else {
                assert_eq!(h.to_bits(), k as u16, "{} {x:e}", H::NAME);
            }
        }
    }
}

#[test]
fn stochastic_rounding_keeps_representable_values() {
    representable_unchanged::<bf16>();
    representable_unchanged::<f16>();
}

/// The neighbours of `|x|` (below the largest finite value), and the
/// fraction of the way from the lower to the upper, in f64 (exact).
fn neighbours<H: HalfFloat>(x: f32) -> (f64, f64, f64) {
    let x = x.abs();
    let mut lo = [H::from_bits(0)];
    narrow_nearest_naive(&[x], &mut lo);
    let mut b = lo[0].to_bits();
    if lo[0].to_f32_checked() > x {
        b -= 1;
    }
    let lo = H::from_bits(b).to_f32_checked() as f64;
    let hi = H::from_bits(b + 1).to_f32_checked() as f64;
    (lo, hi, (x as f64 - lo) / (hi - lo))
}

/// The mean of `n` draws of x, by index (one call) and by step (one element).
fn mean_of_draws<H: HalfFloat>(x: f32, n: usize, bias_ulps: f64) {
    let (lo, hi, p) = neighbours::<H>(x);
    let ulp = hi - lo;
    // 5 standard errors of a mean of n Bernoulli(p) draws, in ulps, plus the
    // bias the finite random bits allow.
    let bound = (5.0 * (p * (1.0 - p) / n as f64).sqrt() + bias_ulps) * ulp;
    let param = SrKey::param_hash("w");
    let src = vec![x; n];
    let mut out = vec![H::from_bits(0); n];
    narrow_stochastic(&src, &mut out, SrKey::new(1, 0, param), 1000);
    let by_index: f64 = widened(&out).iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    let by_step: f64 = (0..n as u64)
        .map(|step| {
            let mut one = [H::from_bits(0)];
            narrow_stochastic(&[x], &mut one, SrKey::new(1, step, param), 12345);
            one[0].to_f32_checked() as f64
        })
        .sum::<f64>()
        / n as f64;
    for (how, mean) in [("index", by_index), ("step", by_step)] {
        let err = (mean - x as f64).abs();
        assert!(
            err <= bound && mean.is_sign_negative() == x.is_sign_negative(),
            "{} x = {x:e} (p = {p}): the mean by {how} is {mean:e}, off by {:.3} ulp (bound {:.3})",
            H::NAME,
            err / ulp,
            bound / ulp
        );
    }
    if p == 0.0 {
        assert_eq!(by_index, x as f64);
    }
}

#[test]
fn stochastic_rounding_is_unbiased() {
    let n = 1 << 16;
    for x in [
        1.0 + 2f32.powi(-9),  // a quarter of an ulp above 1
        1.0 + 2f32.powi(-20), // 2⁻¹³ of an ulp: rounds up 8 times in 2¹⁶
        0.1,
        3.3,
        2.9e38, // near the largest finite value
        1e-39,  // an f32 subnormal, a bf16 subnormal
        2.0,
    ] {
        mean_of_draws::<bf16>(x, n, 0.0);
        mean_of_draws::<bf16>(-x, n, 0.0);
    }
    // f16: normal values (exact), the subnormal range (ulp 2⁻²⁴, bias below
    // 2⁻³² ulp), below the smallest subnormal, and an f32 subnormal.
    let bias = 2f64.powi(-32);
    for x in [
        0.1,
        1.0 + 2f32.powi(-12),
        60000.5,
        1e-6,
        3.3e-7,
        2f32.powi(-24) + 2f32.powi(-40),
        3e-8,
        1e-30,
        1e-40,
    ] {
        mean_of_draws::<f16>(x, n, bias);
        mean_of_draws::<f16>(-x, n, bias);
    }
}

#[test]
fn past_the_largest_f16_the_upper_neighbour_is_infinity() {
    // 65504 + 8 is a quarter of the way to 65536, the next value the
    // exponent would give: ∞ about a quarter of the time.
    let n = 1 << 16;
    let mut out = vec![f16::ZERO; n];
    narrow_stochastic(&vec![65512.0; n], &mut out, SrKey::new(2, 0, 0), 0);
    let inf = out.iter().filter(|h| h.is_infinite()).count();
    assert!(out.iter().all(|h| h.is_infinite() || *h == f16::MAX));
    let sd = (n as f64 * 0.25 * 0.75).sqrt();
    assert!(
        (inf as f64 - n as f64 / 4.0).abs() < 5.0 * sd,
        "{inf} of {n}"
    );
    narrow_stochastic(&vec![65536.0; n], &mut out, SrKey::new(2, 1, 0), 0);
    assert!(out.iter().all(|h| h.is_infinite()));
}

/// Adds `u` (exact in f32, below half an ulp of the start value 1) `steps`
/// times to `m` copies of 1 stored in `H`, rounding each step's f32 sum to
/// nearest and stochastically. Nearest never moves; the stochastic copies'
/// mean follows the f32 sum `1 + steps·u` within 5 standard errors of a sum
/// of `steps` independent roundings, each of variance `p(1 − p)·ulp²` with
/// `p = u/ulp` (the values stay in [1, 2), where the ulp is fixed and every
/// sum is exact in f32), averaged over m copies; and each copy is within 6
/// standard errors of it.
fn stall<H: HalfFloat>(ulp: f64, u: f32, steps: u64, m: usize) {
    assert!((u as f64) < ulp / 2.0);
    let param = SrKey::param_hash("stalled");
    let mut nearest = vec![H::from_bits(0); m];
    let mut stochastic = vec![H::from_bits(0); m];
    narrow_nearest(&vec![1.0; m], &mut nearest);
    narrow_nearest(&vec![1.0; m], &mut stochastic);
    let mut exact = 1.0f32;
    let mut wide = vec![0.0f32; m];
    for step in 0..steps {
        exact += u;
        widen(&nearest, &mut wide);
        wide.iter_mut().for_each(|w| *w += u);
        narrow_nearest(&wide, &mut nearest);
        widen(&stochastic, &mut wide);
        wide.iter_mut().for_each(|w| *w += u);
        narrow_stochastic(&wide, &mut stochastic, SrKey::new(5, step, param), 0);
    }
    assert_eq!(
        exact as f64,
        1.0 + steps as f64 * u as f64,
        "the f32 sum is exact"
    );
    assert!(
        widened(&nearest).iter().all(|&w| w == 1.0),
        "nearest rounding moved"
    );
    let p = u as f64 / ulp;
    let sd = ulp * (steps as f64 * p * (1.0 - p)).sqrt();
    let values = widened(&stochastic);
    let mean = values.iter().map(|&v| v as f64).sum::<f64>() / m as f64;
    let err = (mean - exact as f64).abs();
    assert!(
        err <= 5.0 * sd / (m as f64).sqrt(),
        "{}: mean {mean} against the f32 sum {exact}: off by {err:e}, sd of the mean {:e}",
        H::NAME,
        sd / (m as f64).sqrt()
    );
    for v in values {
        assert!(
            (v as f64 - exact as f64).abs() <= 6.0 * sd,
            "{}: {v}",
            H::NAME
        );
    }
}

#[test]
fn nearest_rounding_stalls_where_stochastic_rounding_follows_the_sum() {
    // bf16: ulp 2⁻⁷ on [1, 2), updates of 2⁻¹² (a 32nd of an ulp).
    stall::<bf16>(2f64.powi(-7), 2f32.powi(-12), 2048, 1024);
    // f16: ulp 2⁻¹⁰ on [1, 2), updates of 2⁻¹⁵.
    stall::<f16>(2f64.powi(-10), 2f32.powi(-15), 16384, 256);
}

fn chunking<H: HalfFloat>() {
    let mut rng = Rng::new(27);
    let xs: Vec<f32> = (0..50_003).map(|_| 10.0 * rng.normal() as f32).collect();
    let key = SrKey::new(4, 2, SrKey::param_hash("rows"));
    for first in [0u64, 7, (1u64 << 32) - 5_000] {
        let mut whole = vec![H::from_bits(0); xs.len()];
        narrow_stochastic(&xs, &mut whole, key, first);
        // Arbitrary cuts, every path.
        for path in paths() {
            let mut parts = vec![H::from_bits(0); xs.len()];
            let mut start = 0;
            while start < xs.len() {
                let len = (1 + rng.below(300) as usize).min(xs.len() - start);
                let end = start + len;
                narrow_stochastic_on(
                    path,
                    &xs[start..end],
                    &mut parts[start..end],
                    key,
                    first + start as u64,
                );
                start = end;
            }
            let what = format!("{} on {path:?} in pieces", H::NAME);
            assert_same(&bits(&parts), &bits(&whole), &xs, &what);
        }
        // Chunks on 1, 2 and 4 threads.
        for threads in [1, 2, 4] {
            let pool = crate::common::threads(threads);
            let mut par = vec![H::from_bits(0); xs.len()];
            pool.install(|| {
                par.par_chunks_mut(997)
                    .zip(xs.par_chunks(997))
                    .enumerate()
                    .for_each(|(c, (d, s))| narrow_stochastic(s, d, key, first + 997 * c as u64))
            });
            let what = format!("{} on {threads} threads", H::NAME);
            assert_same(&bits(&par), &bits(&whole), &xs, &what);
        }
    }
}

#[test]
fn stochastic_rounding_does_not_depend_on_the_cutting_or_threads() {
    chunking::<bf16>();
    chunking::<f16>();
}

#[test]
fn the_random_bits_follow_their_definition() {
    // docs/spec.md's words: SplitMix64's output of z + γ, three times, and
    // lowbias32 on the index's low word, mixed with the
    // key and lowbias32 of the high word; bf16's pairs.
    fn s(z: u64) -> u64 {
        let z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn lowbias32(x: u32) -> u32 {
        let x = (x ^ (x >> 16)).wrapping_mul(0x7FEB_352D);
        let x = (x ^ (x >> 15)).wrapping_mul(0x846C_A68B);
        x ^ (x >> 16)
    }
    let mut rng = Rng::new(28);
    for _ in 0..1000 {
        let (seed, step, param, index) = (
            rng.next_u64(),
            rng.next_u64(),
            rng.next_u64(),
            rng.next_u64(),
        );
        let key = SrKey::new(seed, step, param);
        let h = s(s(s(seed) ^ step) ^ param);
        assert_eq!(key.words(), (h as u32, (h >> 32) as u32));
        let (k0, k1) = key.words();
        let want = lowbias32(index as u32 ^ k0 ^ lowbias32((index >> 32) as u32 ^ k1));
        assert_eq!(sr_bits(key, index), want);
        // bf16 takes 16 bits an element: pair index >> 1's word, its top
        // half for the even element, its bottom half for the odd one.
        let pair = sr_bits(key, index >> 1);
        let half = if index % 2 == 0 {
            pair >> 16
        } else {
            pair & 0xFFFF
        };
        assert_eq!(bf16_sr_bits(key, index) >> 16, half);
        // …which a bf16 rounding adds below the kept bits.
        let x = f32::from_bits(rng.next_u64() as u32 & 0x7F7F_FFFF);
        let mut out = [bf16::ZERO];
        narrow_stochastic(&[x], &mut out, key, index);
        assert_eq!(out[0].to_bits() as u32, (x.to_bits() + half) >> 16);
    }
    // FNV-1a 64 of "splitgrad", byte by byte.
    let fnv = b"splitgrad".iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01B3)
    });
    assert_eq!(SrKey::param_hash("splitgrad"), fnv);
    assert_ne!(SrKey::param_hash("a.weight"), SrKey::param_hash("b.weight"));
}

#[test]
fn the_random_bits_are_uniform() {
    // Over consecutive indices, in 256 bins of 2⁸ values (a χ² with 255
    // degrees of freedom, far below its 5σ bound): the top byte of the
    // 32 bits (f16's); bf16's 16 bits, the even and the odd elements of
    // the pairs apart and together.
    let key = SrKey::new(6, 3, SrKey::param_hash("uniform"));
    let n = 1u64 << 18;
    let chi2_ok = |top_byte: &dyn Fn(u64) -> u32, indices: &mut dyn Iterator<Item = u64>| {
        let mut bins = [0u64; 256];
        let mut count = 0;
        for i in indices {
            bins[top_byte(i) as usize] += 1;
            count += 1;
        }
        let e = count as f64 / 256.0;
        let chi2: f64 = bins.iter().map(|&b| (b as f64 - e).powi(2) / e).sum();
        assert!(chi2 < 255.0 + 5.0 * (2.0 * 255f64).sqrt(), "χ² = {chi2}");
    };
    chi2_ok(&|i| sr_bits(key, i) >> 24, &mut (0..n));
    let bf16 = |i| bf16_sr_bits(key, i) >> 24;
    chi2_ok(&bf16, &mut (0..n).map(|i| 2 * i));
    chi2_ok(&bf16, &mut (0..n).map(|i| 2 * i + 1));
    chi2_ok(&bf16, &mut (0..n));
}

#[test]
#[should_panic(expected = "narrow_stochastic: the source has 3 elements and the destination 2")]
fn lengths_that_differ_panic() {
    let mut out = [bf16::ZERO; 2];
    narrow_stochastic(&[1.0, 2.0, 3.0], &mut out, SrKey::new(0, 0, 0), 0);
}

#[test]
#[should_panic(expected = "widen: the source has 1 elements and the destination 2")]
fn widening_lengths_that_differ_panic() {
    widen(&[f16::ONE], &mut [0.0f32; 2]);
}

/// The lanes of an inner product widened in registers, on every path of
/// this CPU, equal the scalar twin's bits, and the scalar twin equals the
/// definition (widen with the `half` crate, multiply, add, in f32), for
/// lengths around the 16-element vectors and for finite values of every
/// binade.
#[test]
fn dot_lanes_are_the_same_bits_on_every_path() {
    fn check<H: HalfFloat + std::fmt::Debug>(from: impl Fn(f32) -> H) {
        let mut rng = Rng::new(41);
        for n in [0usize, 1, 15, 16, 17, 31, 33, 1000, 4099] {
            let draw = |rng: &mut Rng| -> Vec<H> {
                (0..n)
                    .map(|_| from((rng.normal() * 2f64.powi(rng.below(20) as i32 - 10)) as f32))
                    .collect()
            };
            let (x, r) = (draw(&mut rng), draw(&mut rng));
            let mut want = [0.5f32; 16];
            for (i, (a, b)) in x.iter().zip(&r).enumerate() {
                want[i % 16] += a.naive_to_f32() * b.naive_to_f32();
            }
            for path in paths() {
                let mut lanes = [0.5f32; 16];
                dot_lanes_on(path, &x, &r, &mut lanes);
                assert_eq!(
                    lanes.map(f32::to_bits),
                    want.map(f32::to_bits),
                    "{} {path:?} n = {n}",
                    H::NAME
                );
            }
        }
    }
    check(bf16::from_f32);
    check(f16::from_f32);
}
