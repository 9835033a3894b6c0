//! The fused half-precision update (`kernels::half::update_fused`) against
//! its naive twin, the three passes it fuses: on every path this CPU runs,
//! for every layout of three arrays (f32, bf16 and f16, stochastic and
//! nearest rounding), lengths around the 32-element blocks, first indices
//! at 0, odd, and across the 2³² and 2⁶⁴ wraps of the index, and values
//! with NaNs (quiet and signalling, with payloads), infinities, subnormals
//! and an element rule that makes NaN and ∞ from finite inputs. Every
//! element is the twin's bits but for a NaN's payload where the rule's
//! arithmetic met two NaNs.
//!
//! And the sum of a half-precision row into an f32 one
//! (`kernels::half::add_widened`), widened in registers, against widening
//! with the `half` crate and summing in f32.

use super::half_storage::paths;
use half::{bf16, f16};
use splitgrad::Rng;
use splitgrad::kernels::half::{
    FusedArray, HalfFloat, HalfPath, LANES, Lanes, SrKey, add_widened_on, update_fused,
    update_fused_naive, update_fused_on, widen_naive,
};

/// How one array is kept.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kept {
    F32,
    Bf16,
    F16,
}

/// An array's elements as kept: f32 bits or 16-bit patterns.
#[derive(Clone, Debug, PartialEq)]
enum Data {
    F32(Vec<f32>),
    Half(Vec<u16>),
}

impl Data {
    fn bits(&self) -> Vec<u32> {
        match self {
            Data::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
            Data::Half(v) => v.iter().map(|&h| h as u32).collect(),
        }
    }

    /// The bits, every NaN as one pattern: an element rule's arithmetic on
    /// two NaNs may return either's payload (Rust leaves it unspecified),
    /// so a NaN result's payload is not compared.
    fn bits_nan_as_one(&self, kept: Kept) -> Vec<u32> {
        let nan = |b: u32| match kept {
            Kept::F32 => f32::from_bits(b).is_nan(),
            Kept::Bf16 => bf16::from_bits(b as u16).is_nan(),
            Kept::F16 => f16::from_bits(b as u16).is_nan(),
        };
        self.bits()
            .into_iter()
            .map(|b| if nan(b) { u32::MAX } else { b })
            .collect()
    }
}

/// A value of mixed magnitude, now and then (one in `rate` with `rate`
/// 64) a special one.
fn draw(rng: &mut Rng, rate: u64) -> f32 {
    match rng.below(rate * 64) {
        0 => f32::from_bits(0x7F80_0001 | (rng.next_u64() as u32 & 0x003F_0000)),
        1 => f32::from_bits(0xFFC1_0000),
        2 => f32::INFINITY,
        3 => -0.0,
        4 => f32::from_bits(rng.below(1 << 23) as u32),
        _ => (rng.normal() * 2f64.powi(rng.below(40) as i32 - 30)) as f32,
    }
}

/// `n` elements kept as `kept`; specials one in `rate` with `rate` 16.
fn data(kept: Kept, n: usize, rng: &mut Rng, rate: u64) -> Data {
    // Now and then any pattern at all: signalling NaNs among them.
    let half = |rng: &mut Rng, round: fn(f32) -> u16| match rng.below(rate * 32) {
        0 => 0x7F81 | (rng.next_u64() as u16 & 0x803E),
        1 => rng.next_u64() as u16,
        _ => round(draw(rng, rate)),
    };
    match kept {
        Kept::F32 => Data::F32((0..n).map(|_| draw(rng, rate)).collect()),
        Kept::Bf16 => Data::Half(
            (0..n)
                .map(|_| half(rng, |x| bf16::from_f32(x).to_bits()))
                .collect(),
        ),
        Kept::F16 => Data::Half(
            (0..n)
                .map(|_| half(rng, |x| f16::from_f32(x).to_bits()))
                .collect(),
        ),
    }
}

/// Borrows `d` as an array of `update_fused`, kept as `kept`.
fn array<'a>(d: &'a mut Data, kept: Kept, key: Option<SrKey>) -> FusedArray<'a> {
    use half::slice::HalfBitsSliceExt;
    match (d, kept) {
        (Data::F32(v), Kept::F32) => FusedArray::Full(v),
        (Data::Half(v), Kept::Bf16) => FusedArray::Bf16(v.reinterpret_cast_mut(), key),
        (Data::Half(v), Kept::F16) => FusedArray::F16(v.reinterpret_cast_mut(), key),
        _ => unreachable!("data of its kind"),
    }
}

/// Lazy Adam's element rule, whose ∞ gradients make ∞ and NaN, on lane l
/// with gradient g.
fn adam_lane([p, m, v]: &mut [Lanes; 3], l: usize, g: f32) {
    m[l] = m[l] + (g - m[l]) * 0.1;
    v[l] = v[l] + (g * g - v[l]) * 0.001;
    p[l] += -1e-3 * (m[l] / (v[l].sqrt() + 1e-8));
}

/// The rule with the gradient read from one input.
fn rule(a: &mut [Lanes; 3], [g]: &[Lanes; 1]) {
    for (l, &g) in g.iter().enumerate() {
        adam_lane(a, l, g);
    }
}

/// The rule with no input: a zero gradient.
fn rule_zero(a: &mut [Lanes; 3], _: &[Lanes; 0]) {
    for l in 0..LANES {
        adam_lane(a, l, 0.0);
    }
}

/// The rule with the gradient formed from two inputs and the parameter's
/// own lanes, as an optimiser forms the fusion penalty's rows.
fn rule_formed(a: &mut [Lanes; 3], [c, s]: &[Lanes; 2]) {
    for l in 0..LANES {
        let g = 0.75 * (a[0][l] - c[l]) - s[l];
        adam_lane(a, l, g);
    }
}

/// The arrays `start` updated by `f` with `inputs` on `path` (`None`: the
/// naive twin).
fn updated<const K: usize>(
    start: &[Data],
    layout: [Kept; 3],
    keys: &[Option<SrKey>],
    path: Option<HalfPath>,
    inputs: [&[f32]; K],
    first: u64,
    f: fn(&mut [Lanes; 3], &[Lanes; K]),
) -> Vec<Data> {
    let mut d = start.to_vec();
    let [a, b, c] = &mut d[..] else {
        unreachable!()
    };
    let arrays = [
        array(a, layout[0], keys[0]),
        array(b, layout[1], keys[1]),
        array(c, layout[2], keys[2]),
    ];
    match path {
        Some(p) => update_fused_on(p, arrays, inputs, first, f),
        None => update_fused_naive(arrays, inputs, first, f),
    }
    d
}

#[test]
fn every_path_gives_the_naive_twins_bits() {
    let layouts = [
        [Kept::Bf16, Kept::Bf16, Kept::Bf16],
        [Kept::Bf16, Kept::F32, Kept::F32],
        [Kept::F16, Kept::F32, Kept::F32],
        [Kept::F16, Kept::Bf16, Kept::Bf16],
        [Kept::F32, Kept::Bf16, Kept::Bf16],
        [Kept::F32, Kept::F16, Kept::F32],
        [Kept::F32, Kept::F32, Kept::F32],
    ];
    // Odd and even; the indices' high word changing inside a block, and
    // the pairs' (bf16's words) too.
    let firsts = [
        0u64,
        7,
        (1 << 32) - 20,
        (1 << 33) - 21,
        u64::MAX - 5,
        123 << 32,
    ];
    let mut rng = Rng::new(52);
    for layout in layouts {
        for n in [0usize, 1, 15, 16, 17, 31, 32, 33, 40, 64, 333] {
            for &first in &firsts {
                for (stochastic, rate) in [(true, 1), (false, 1), (true, 64), (false, 64)] {
                    let keys: Vec<Option<SrKey>> = (0..3u64)
                        .map(|k| stochastic.then(|| SrKey::new(9, first ^ k, k)))
                        .collect();
                    let start: Vec<Data> =
                        layout.iter().map(|&k| data(k, n, &mut rng, rate)).collect();
                    let g: Vec<f32> = (0..n).map(|_| draw(&mut rng, rate)).collect();
                    let c: Vec<f32> = (0..n).map(|_| draw(&mut rng, rate)).collect();
                    // One gradient input, none (a zero gradient), or two
                    // (a gradient formed from the parameter's lanes).
                    let run = |path: Option<HalfPath>, inputs: usize| match inputs {
                        0 => updated(&start, layout, &keys, path, [], first, rule_zero),
                        1 => updated(&start, layout, &keys, path, [&g], first, rule),
                        _ => updated(&start, layout, &keys, path, [&c, &g], first, rule_formed),
                    };
                    for (path, inputs) in paths()
                        .into_iter()
                        .flat_map(|p| (0..3).map(move |k| (p, k)))
                    {
                        let want = run(None, inputs);
                        let got = run(Some(path), inputs);
                        for k in 0..3 {
                            let (gb, wb) = (
                                got[k].bits_nan_as_one(layout[k]),
                                want[k].bits_nan_as_one(layout[k]),
                            );
                            if let Some(i) = (0..n).find(|&i| gb[i] != wb[i]) {
                                panic!(
                                    "{path:?} {layout:?} n {n} first {first} stochastic \
                                     {stochastic} inputs {inputs}: array {k} element {i} gave \
                                     {:#x}, the twin \
                                     {:#x} (start {:#x}, g {:?})",
                                    gb[i],
                                    wb[i],
                                    start[k].bits()[i],
                                    g[i]
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_chosen_path_runs_the_rule_once_per_element() {
    // A rule that counts: every element, tail included, moves once.
    let mut p = vec![bf16::from_f32(0.0); 37];
    let mut m = vec![0.0f32; 37];
    let g: Vec<f32> = (0..37).map(|i| i as f32).collect();
    update_fused(
        [FusedArray::Bf16(&mut p, None), FusedArray::Full(&mut m)],
        [&g],
        0,
        |[p, m]: &mut [Lanes; 2], [g]: &[Lanes; 1]| {
            for l in 0..LANES {
                p[l] += 1.0;
                m[l] += g[l];
            }
        },
    );
    assert!(p.iter().all(|&x| x == bf16::ONE));
    assert_eq!(m, g);
}

#[test]
#[should_panic(expected = "update_fused: the source has 3 elements and the destination 2")]
fn arrays_of_another_length_panic() {
    let mut p = vec![0.0f32; 2];
    update_fused(
        [FusedArray::Full(&mut p)],
        [&[0.0; 3]],
        0,
        |_: &mut [Lanes; 1], _: &[Lanes; 1]| {},
    );
}

#[test]
#[should_panic(expected = "update_fused: the source has 3 elements and the destination 2")]
fn a_second_input_of_another_length_panics() {
    let mut p = vec![0.0f32; 2];
    update_fused(
        [FusedArray::Full(&mut p)],
        [&[0.0; 2], &[0.0; 3]],
        0,
        |_: &mut [Lanes; 1], _: &[Lanes; 2]| {},
    );
}

#[test]
fn add_widened_is_the_same_bits_on_every_path() {
    fn check<H: HalfFloat>(from: fn(f32) -> H) {
        let mut rng = Rng::new(61);
        for n in [0usize, 1, 7, 8, 9, 15, 16, 17, 100, 1027] {
            for scale in [None, Some(0.3f32), Some(-2.0)] {
                let src: Vec<H> = (0..n).map(|_| from(draw(&mut rng, 1))).collect();
                let start: Vec<f32> = (0..n).map(|_| draw(&mut rng, 1)).collect();
                let mut wide = vec![0.0f32; n];
                widen_naive(&src, &mut wide);
                let want: Vec<f32> = start
                    .iter()
                    .zip(&wide)
                    .map(|(&d, &x)| d + scale.map_or(x, |c| c * x))
                    .collect();
                let key = |v: &[f32]| -> Vec<u32> {
                    // A NaN's payload where two NaNs met is not compared.
                    v.iter()
                        .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
                        .collect()
                };
                for path in paths() {
                    let mut got = start.clone();
                    add_widened_on(path, &src, &mut got, scale);
                    assert_eq!(
                        key(&got),
                        key(&want),
                        "{} {path:?} n {n} {scale:?}",
                        H::NAME
                    );
                }
            }
        }
    }
    check(bf16::from_f32);
    check(f16::from_f32);
}
