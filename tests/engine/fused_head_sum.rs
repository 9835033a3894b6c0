//! The summed head equals the per-token one:
//! `SplitLanguageModellingHead::forward_sum` against `forward` then
//! `Tape::sum`, for the loss and every gradient, in f64 (tight) and f32,
//! with an upstream gradient that is not 1 (the loss scaled, or used twice),
//! across token-chunk boundaries (N not a multiple of the chunk, chunks of
//! one token, N smaller than a chunk), ignored labels, a batch of ignored
//! labels only, frozen splits and splits of size 0; on a tape that does not
//! record it gives the same loss. And its gradients match central finite
//! differences in f64.

use crate::common::{
    HeadInputs, Tally, all_within, check_grads, config, head_inputs,
    head_with_logits_in_the_thousands, in_f64_and_f32, split_head, trainable_values,
    with_trainable,
};
use ndarray::{ArrayD, ArrayView2, Ix2, IxDyn};
use proptest::prelude::*;
use splitgrad::layers::SplitLanguageModellingHead;
use splitgrad::ops::fused_ce_sum::{SumChunks, fused_ce_sum_forward};
use splitgrad::state::Module;
use splitgrad::{Real, Rng, Tape};

#[derive(Clone, Debug)]
struct Case {
    sizes: Vec<usize>,
    hidden_size: usize,
    weights: Vec<ArrayD<f64>>,
    trainable: Vec<bool>,
    /// (…, H)
    hidden: ArrayD<f64>,
    /// (…), in [0, V) or −100.
    labels: ArrayD<i64>,
    chunks: SumChunks,
    /// The loss differentiated is `upstream · Σ_n loss_n`.
    upstream: f64,
}

/// How the summed loss is made.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    /// `forward_sum`.
    Summed,
    /// `forward`, then `tape.sum`.
    PerToken,
}

/// Σ loss, then ∂hidden and ∂W_k (None when frozen), as f64.
#[derive(Debug)]
struct Pass {
    total: f64,
    grads: Vec<Option<ArrayD<f64>>>,
}

impl Case {
    fn new(inputs: HeadInputs, trainable: Vec<bool>, chunks: SumChunks, upstream: f64) -> Self {
        Case {
            sizes: inputs.sizes,
            hidden_size: inputs.hidden_size,
            weights: inputs.weights,
            trainable,
            hidden: inputs.hidden,
            labels: inputs.labels,
            chunks,
            upstream,
        }
    }

    fn head<T: Real>(&self, weights: &[ArrayD<f64>]) -> SplitLanguageModellingHead<T> {
        let mut head = split_head(&self.sizes, self.hidden_size, weights, &self.trainable);
        head.set_sum_chunks(self.chunks);
        head
    }

    /// One forward and backward with these weights and hidden states.
    fn run<T: Real>(
        &self,
        weights: &[ArrayD<f64>],
        hidden: &ArrayD<f64>,
        path: Path,
        record: bool,
    ) -> Pass {
        let head = self.head::<T>(weights);
        let mut tape = if record { Tape::new() } else { Tape::no_grad() };
        let h = tape.input(hidden.mapv(T::from_f64));
        let total = match path {
            Path::Summed => head.forward_sum(&mut tape, h, self.labels.view()).unwrap(),
            Path::PerToken => {
                let l = head.forward(&mut tape, h, self.labels.view()).unwrap();
                tape.sum(l)
            }
        };
        assert_eq!(tape.value(total).shape(), &[] as &[usize]);
        let loss = tape.scale(total, T::from_f64(self.upstream));
        let g = tape.backward(loss);
        let mut grads = vec![g.input(h).map(|x| x.mapv(Real::to_f64))];
        for p in head.parameters() {
            grads.push(g.param(p).map(|g| g.to_dense().mapv(Real::to_f64)));
        }
        Pass {
            total: Real::to_f64(tape.scalar(total)),
            grads,
        }
    }

    fn pass<T: Real>(&self, path: Path) -> Pass {
        self.run::<T>(&self.weights, &self.hidden, path, true)
    }

    fn n(&self) -> usize {
        self.labels.len()
    }

    /// The trainable weights, then hidden.
    fn values(&self) -> Vec<ArrayD<f64>> {
        let mut v = trainable_values(&self.weights, &self.trainable);
        v.push(self.hidden.clone());
        v
    }

    /// `upstream · Σ loss` with the trainable weights and hidden replaced.
    fn loss_at(&self, values: &[ArrayD<f64>]) -> f64 {
        let (weights, rest) = with_trainable(&self.weights, &self.trainable, values);
        let hidden = &rest[0];
        self.upstream * self.run::<f64>(&weights, hidden, Path::Summed, false).total
    }
}

/// Absolute bounds on the rounding of the total loss, ∂hidden and ∂W for
/// a pass in a type of epsilon `eps`, as in `fused_head.rs`: logits are
/// computed to about ε·Z with Z = H·max|h|·max|W| (+ ln V), each token's
/// loss too; a softmax entry has relative error ε·Z, so ∂h_n is off by
/// |u|·ε·Z·max|W| and ∂W_v by N·|u|·ε·Z·max|h|. The total sums N losses.
/// A factor 16 covers the two paths' different summation orders.
fn tolerance(c: &Case, eps: f64) -> [f64; 3] {
    let max = |a: &ArrayD<f64>| a.iter().fold(0f64, |m, &x| m.max(x.abs()));
    let mh = max(&c.hidden);
    let mw = c.weights.iter().map(max).fold(0.0, f64::max);
    let v: usize = c.sizes.iter().sum();
    let z = c.hidden_size as f64 * mh * mw + (v.max(1) as f64).ln();
    let n = c.n().max(1) as f64;
    let u = c.upstream.abs();
    let e = 16.0 * eps * (1.0 + z);
    [e * n, e * (1.0 + mw) * u, e * (1.0 + mh) * u * n]
}

/// Loss and every gradient of the two paths agree within the rounding of
/// `T`; the same gradients are present; on a no-grad tape the summed loss
/// is the same bits.
fn summed_equals_per_token<T: Real>(c: &Case, eps: f64) -> Result<(), TestCaseError> {
    let s = c.pass::<T>(Path::Summed);
    let p = c.pass::<T>(Path::PerToken);
    let [tol_loss, tol_hidden, tol_weight] = tolerance(c, eps);
    prop_assert!(
        (s.total - p.total).abs() <= tol_loss,
        "loss: summed {} per-token {} (tol {})",
        s.total,
        p.total,
        tol_loss
    );
    for (k, (a, b)) in s.grads.iter().zip(&p.grads).enumerate() {
        let what = if k == 0 {
            "∂hidden".to_string()
        } else {
            format!("∂W_{}", k - 1)
        };
        prop_assert_eq!(
            a.is_some(),
            b.is_some(),
            "{} present in one path only",
            what
        );
        if k > 0 {
            prop_assert_eq!(a.is_some(), c.trainable[k - 1], "{}", what);
        }
        if let (Some(a), Some(b)) = (a, b) {
            let tol = if k == 0 { tol_hidden } else { tol_weight };
            all_within(a, b, tol, &what, ("summed", "per-token"))?;
        }
    }
    let quiet = c.run::<T>(&c.weights, &c.hidden, Path::Summed, false);
    prop_assert_eq!(quiet.total.to_bits(), s.total.to_bits(), "no-grad loss");
    prop_assert!(quiet.grads.iter().all(Option::is_none));
    Ok(())
}

/// Random heads ([`common::head_inputs`]) with token chunks from 1 to past
/// N (or the default budget), any splits frozen, an upstream gradient of 1
/// or not.
fn case() -> impl Strategy<Value = Case> {
    head_inputs()
        .prop_flat_map(|inputs| {
            let n = inputs.n_tokens();
            let chunks = prop_oneof![
                3 => (1..=n + 3).prop_map(SumChunks::Tokens),
                1 => Just(SumChunks::default()),
            ];
            let trainable = prop::collection::vec(prop::bool::weighted(0.75), inputs.sizes.len());
            let upstream = prop_oneof![Just(1.0), Just(0.5), -3.0..3.0f64];
            (Just(inputs), trainable, chunks, upstream)
        })
        // Rounded to f32 so that both types scale by the same number.
        .prop_map(|(inputs, trainable, chunks, upstream)| {
            Case::new(inputs, trainable, chunks, upstream as f32 as f64)
        })
}

/// Cases of the finite-difference property test.
const FD_CASES: u32 = 32;

in_f64_and_f32!(
    64,
    "proptest-regressions/fused_head_sum.txt",
    case(),
    summed_equals_per_token => summed_equals_per_token_f64, summed_equals_per_token_f32
);

proptest! {
    #![proptest_config(config(FD_CASES, "proptest-regressions/fused_head_sum.txt"))]

    /// O(1) logits: every derivative of `u·Σ loss` against central
    /// differences (`common::check_grads`).
    #[test]
    fn summed_matches_finite_differences(c in case().prop_filter("O(1) logits", |c| {
        c.weights.iter().all(|w| w.iter().all(|x| x.abs() <= 1.0)) && c.n() <= 8
    })) {
        let p = c.pass::<f64>(Path::Summed);
        let mut analytic: Vec<ArrayD<f64>> = p.grads[1..]
            .iter()
            .filter_map(Clone::clone)
            .collect();
        analytic.push(p.grads[0].clone().unwrap());
        static TALLY: Tally = Tally::new();
        let report = check_grads(&c.values(), &analytic, |v| c.loss_at(v))
            .map_err(TestCaseError::fail)?;
        TALLY.count(&report, FD_CASES).map_err(TestCaseError::fail)?;
    }
}

/// N = 7 tokens (two ignored), splits of 5, 0 and 6 rows: `(sizes, h,
/// hidden, labels)` from a seed.
fn fixed(seed: u64) -> Case {
    let mut rng = Rng::new(seed);
    let sizes = vec![5, 0, 6];
    let h = 3;
    let mut normal = |shape: &[usize]| ArrayD::from_shape_simple_fn(IxDyn(shape), || rng.normal());
    Case {
        weights: sizes.iter().map(|&s| normal(&[s, h])).collect(),
        hidden: normal(&[7, h]),
        sizes,
        hidden_size: h,
        trainable: vec![true; 3],
        labels: ndarray::array![10i64, -100, 0, 4, 5, 4, -100].into_dyn(),
        chunks: SumChunks::default(),
        upstream: 1.0,
    }
}

fn check(c: &Case) {
    summed_equals_per_token::<f64>(c, f64::EPSILON).unwrap_or_else(|e| panic!("f64 {c:?}: {e}"));
    summed_equals_per_token::<f32>(c, f32::EPSILON as f64)
        .unwrap_or_else(|e| panic!("f32 {c:?}: {e}"));
}

#[test]
fn token_chunk_boundaries() {
    // 5 active tokens: chunks of 1, that divide it, that do not, equal to
    // N, larger than N, and budgets (0 bytes: one token; one row's bytes).
    let base = fixed(5);
    let reference = base.pass::<f64>(Path::PerToken);
    for chunks in [
        SumChunks::Tokens(1),
        SumChunks::Tokens(2),
        SumChunks::Tokens(3),
        SumChunks::Tokens(5),
        SumChunks::Tokens(7),
        SumChunks::Tokens(1000),
        SumChunks::Budget(0),
        SumChunks::Budget(11 * 8 * 2),
        SumChunks::default(),
    ] {
        for upstream in [1.0, 0.5, -2.25] {
            let c = Case {
                chunks,
                upstream,
                ..base.clone()
            };
            check(&c);
        }
        let p = Case {
            chunks,
            ..base.clone()
        }
        .pass::<f64>(Path::Summed);
        assert!((p.total - reference.total).abs() < 1e-13, "{chunks:?}");
    }
}

#[test]
fn every_label_ignored() {
    let c = Case {
        labels: ndarray::ArrayD::from_elem(IxDyn(&[7]), -100),
        chunks: SumChunks::Tokens(2),
        upstream: 0.5,
        ..fixed(6)
    };
    check(&c);
    let p = c.pass::<f64>(Path::Summed);
    // +0, as torch's sum of nothing (the bits, not only the value).
    assert_eq!(p.total.to_bits(), 0f64.to_bits());
    assert_eq!(c.pass::<f32>(Path::Summed).total.to_bits(), 0f64.to_bits());
    for g in &p.grads {
        assert!(g.as_ref().unwrap().iter().all(|&x| x == 0.0));
    }
}

#[test]
fn frozen_splits_get_no_gradient_and_still_normalise() {
    for trainable in [
        [false, true, true],
        [true, true, false],
        [false, false, false],
    ] {
        let c = Case {
            trainable: trainable.to_vec(),
            chunks: SumChunks::Tokens(3),
            upstream: 0.5,
            ..fixed(7)
        };
        check(&c);
        let p = c.pass::<f64>(Path::Summed);
        for (k, g) in p.grads[1..].iter().enumerate() {
            assert_eq!(g.is_some(), trainable[k], "split {k}");
        }
        check_grads(&c.values(), &finite_order(&p), |v| c.loss_at(v))
            .unwrap()
            .non_vacuous()
            .unwrap();
    }
}

/// The pass's gradients in the order of [`Case::values`].
fn finite_order(p: &Pass) -> Vec<ArrayD<f64>> {
    let mut a: Vec<ArrayD<f64>> = p.grads[1..].iter().filter_map(Clone::clone).collect();
    a.push(p.grads[0].clone().unwrap());
    a
}

#[test]
fn upstream_from_two_uses_of_the_loss() {
    // ℒ = ½·S + S: the node's upstream gradient is 1.5, summed from two
    // uses; its gradients are 1.5 times the per-token path's with ℒ = S.
    let c = Case {
        chunks: SumChunks::Tokens(2),
        ..fixed(8)
    };
    let head = c.head::<f64>(&c.weights);
    let mut tape = Tape::new();
    let h = tape.input(c.hidden.clone());
    let s = head.forward_sum(&mut tape, h, c.labels.view()).unwrap();
    let half = tape.scale(s, 0.5);
    let loss = tape.add(half, s);
    let g = tape.backward(loss);
    let reference = Case {
        upstream: 1.5,
        ..c.clone()
    }
    .pass::<f64>(Path::PerToken);
    let mut got = vec![g.input(h).cloned()];
    got.extend(
        head.parameters()
            .iter()
            .map(|p| g.param(p).map(|g| g.to_dense())),
    );
    for (a, b) in got.iter().zip(&reference.grads) {
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        all_within(a, b, 1e-12, "gradient", ("summed", "per-token")).unwrap();
    }
}

#[test]
fn unit_upstream_passes_the_kernel_gradients_on_bit_for_bit() {
    // With ∂ℒ/∂S = 1 the backward adds the gradients formed in the
    // forward into zeroed buffers, unscaled: the same bits.
    let c = Case {
        chunks: SumChunks::Tokens(3),
        ..fixed(9)
    };
    let p = c.pass::<f32>(Path::Summed);
    let weights: Vec<ArrayD<f32>> = c.weights.iter().map(|w| w.mapv(|x| x as f32)).collect();
    let views: Vec<ArrayView2<'_, f32>> = weights
        .iter()
        .map(|w| w.view().into_dimensionality::<Ix2>().unwrap())
        .collect();
    let hidden = c
        .hidden
        .mapv(|x| x as f32)
        .into_dimensionality::<Ix2>()
        .unwrap();
    let flat: Vec<i64> = c.labels.iter().copied().collect();
    let (total, g) = fused_ce_sum_forward(hidden.view(), &views, &flat, c.chunks, true, &[true; 3]);
    assert_eq!((total as f64).to_bits(), p.total.to_bits());
    let bits = |a: &ArrayD<f64>| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let want_h = g.hidden.unwrap().mapv(|x| x as f64).into_dyn();
    assert_eq!(bits(p.grads[0].as_ref().unwrap()), bits(&want_h));
    for (k, w) in g.weights.into_iter().enumerate() {
        let want = w.unwrap().mapv(|x| x as f64).into_dyn();
        assert_eq!(
            bits(p.grads[k + 1].as_ref().unwrap()),
            bits(&want),
            "split {k}"
        );
    }
}

#[test]
fn no_gradient_wanted_computes_the_same_loss() {
    // Hidden a constant and every split frozen: the node is a constant,
    // only the loss is computed, and it is the same bits.
    let c = Case {
        chunks: SumChunks::Tokens(4),
        ..fixed(10)
    };
    let recorded = c.pass::<f32>(Path::Summed).total;
    let mut head = c.head::<f32>(&c.weights);
    for p in head.parameters_mut() {
        p.set_trainable(false);
    }
    let mut tape = Tape::new();
    let h = tape.constant(c.hidden.mapv(|x| x as f32));
    let s = head.forward_sum(&mut tape, h, c.labels.view()).unwrap();
    assert!(!tape.requires_grad(s));
    assert_eq!((tape.scalar(s) as f64).to_bits(), recorded.to_bits());
}

#[test]
fn the_same_bits_for_any_rayon_thread_count() {
    let c = Case {
        chunks: SumChunks::Tokens(3),
        ..fixed(11)
    };
    let run = |threads: usize| {
        let pool = crate::common::threads(threads);
        pool.install(|| c.pass::<f32>(Path::Summed))
    };
    let (one, four) = (run(1), run(4));
    assert_eq!(one.total.to_bits(), four.total.to_bits());
    for (a, b) in one.grads.iter().zip(&four.grads) {
        assert_eq!(a, b);
    }
}

#[test]
fn logits_in_the_thousands() {
    // z = [3000, 2990, −3000] for label 1: loss 10 + ln(1 + e^−10), no
    // overflow; the same as the per-token path in both types.
    let trainable = vec![true, true];
    let c = Case::new(
        head_with_logits_in_the_thousands(),
        trainable,
        SumChunks::Tokens(1),
        1.0,
    );
    let want = 10.0 + (-10f64).exp().ln_1p();
    assert!((c.pass::<f64>(Path::Summed).total - want).abs() < 1e-12);
    assert!((c.pass::<f32>(Path::Summed).total - want).abs() < 1e-3);
    check(&c);
}

#[test]
fn errors_as_forward() {
    let c = fixed(12);
    let head = c.head::<f64>(&c.weights);
    let mut tape = Tape::new();
    let h = tape.input(c.hidden.clone());
    let bad = ndarray::array![0i64, 1, 2, 3, 4, 5, 11].into_dyn();
    assert!(head.forward_sum(&mut tape, h, bad.view()).is_err());
    let short = ndarray::array![0i64, 1].into_dyn();
    assert!(head.forward_sum(&mut tape, h, short.view()).is_err());
}
