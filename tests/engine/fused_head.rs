//! The fused head equals the naive one: `SplitLanguageModellingHead::forward`
//! (chunked, online log-sum-exp, no N × V logits) against `forward_naive`
//! (the full logits through the tape's primitive ops), in f64 and f32, for
//! loss values and every gradient, on random sizes, chunk sizes, ignored
//! labels and logits from O(1) to the thousands. The memory side is in
//! `fused_head_memory.rs` (it needs a binary to itself).

use crate::common::{
    HeadInputs, all_within, array, head_inputs, head_with_logits_in_the_thousands, in_f64_and_f32,
    split_head,
};
use ndarray::ArrayD;
use proptest::prelude::*;
use splitgrad::ops::fused_ce::ChunkSizes;
use splitgrad::state::Module;
use splitgrad::{Real, Tape};

#[derive(Clone, Debug)]
struct Case {
    sizes: Vec<usize>,
    hidden_size: usize,
    weights: Vec<ArrayD<f64>>,
    /// (…, H)
    hidden: ArrayD<f64>,
    /// (…)
    labels: ArrayD<i64>,
    /// (…), the upstream gradient of each token's loss.
    upstream: ArrayD<f64>,
    chunks: ChunkSizes,
    frozen: Option<usize>,
}

impl Case {
    fn new(
        inputs: HeadInputs,
        upstream: ArrayD<f64>,
        chunks: ChunkSizes,
        frozen: Option<usize>,
    ) -> Self {
        Case {
            sizes: inputs.sizes,
            hidden_size: inputs.hidden_size,
            weights: inputs.weights,
            hidden: inputs.hidden,
            labels: inputs.labels,
            upstream,
            chunks,
            frozen,
        }
    }
}

/// Loss (…), ∂hidden (…, H) and ∂W_k (dense, zeros if frozen), as f64.
struct Pass {
    loss: ArrayD<f64>,
    grads: Vec<ArrayD<f64>>,
}

fn pass<T: Real>(c: &Case, naive: bool) -> Pass {
    let trainable: Vec<bool> = (0..c.sizes.len()).map(|k| c.frozen != Some(k)).collect();
    let mut head = split_head::<T>(&c.sizes, c.hidden_size, &c.weights, &trainable);
    head.set_chunks(c.chunks);
    let mut tape = Tape::new();
    let h = tape.input(c.hidden.mapv(T::from_f64));
    let loss = if naive {
        head.forward_naive(&mut tape, h, c.labels.view())
    } else {
        head.forward(&mut tape, h, c.labels.view())
    }
    .unwrap();
    let loss_value = tape.value(loss).mapv(Real::to_f64);
    let total = tape.dot_const(loss, c.upstream.mapv(T::from_f64));
    let g = tape.backward(total);
    let mut grads = vec![g.input(h).unwrap().mapv(Real::to_f64)];
    for (k, p) in head.parameters().iter().enumerate() {
        assert_eq!(g.param(p).is_none(), c.frozen == Some(k));
        grads.push(g.dense(p).mapv(Real::to_f64));
    }
    Pass {
        loss: loss_value,
        grads,
    }
}

/// The rounding a pass in `T` may commit, as absolute bounds for the
/// loss, ∂hidden and ∂W.
///
/// Logits are `z = h·W_v` with |z| ≤ Z = H·max|h|·max|W|; each is computed
/// to about ε·Z, and so are lse and the loss. A softmax entry `exp(z − lse)`
/// then has relative error about ε·Z, so `∂h_n = u_n·Σ_v (p_v − δ)·W_v`
/// (Σ_v p_v = 1) is off by about `|u|·ε·Z·max|W|`, and
/// `∂W_v = Σ_n u_n·(p_nv − δ)·h_n` by up to `N·|u|·ε·Z·max|h|`. A factor
/// 16 leaves room for the two paths' different summation orders.
fn tolerance(c: &Case, eps: f64) -> [f64; 3] {
    let max = |a: &ArrayD<f64>| a.iter().fold(0f64, |m, &x| m.max(x.abs()));
    let mh = max(&c.hidden);
    let mw = c.weights.iter().map(max).fold(0.0, f64::max);
    let mu = max(&c.upstream);
    let v: usize = c.sizes.iter().sum();
    let z = c.hidden_size as f64 * mh * mw + (v as f64).ln();
    let n = c.labels.len() as f64;
    let e = 16.0 * eps * (1.0 + z);
    [e, e * (1.0 + mw) * mu, e * (1.0 + mh) * mu * n]
}

fn fused_equals_naive<T: Real>(c: &Case, eps: f64) -> Result<(), TestCaseError> {
    let fused = pass::<T>(c, false);
    let naive = pass::<T>(c, true);
    let [tol_loss, tol_hidden, tol_weight] = tolerance(c, eps);
    all_within(
        &fused.loss,
        &naive.loss,
        tol_loss,
        "loss",
        ("fused", "naive"),
    )?;
    for (l, (&label, &x)) in c.labels.iter().zip(fused.loss.iter()).enumerate() {
        if label == -100 {
            prop_assert_eq!(x, 0.0, "ignored token {} has a loss", l);
        }
    }
    for (k, (a, b)) in fused.grads.iter().zip(&naive.grads).enumerate() {
        let (what, tol) = if k == 0 {
            ("∂hidden".to_string(), tol_hidden)
        } else {
            (format!("∂W_{}", k - 1), tol_weight)
        };
        all_within(a, b, tol, &what, ("fused", "naive"))?;
    }
    Ok(())
}

/// Random heads ([`common::head_inputs`]) with chunks from 1 to past N
/// and V, an upstream gradient per token, sometimes a frozen split.
fn case() -> impl Strategy<Value = Case> {
    head_inputs()
        .prop_flat_map(|inputs| {
            let (n, v) = (inputs.n_tokens(), inputs.vocab_size());
            let chunks =
                (1..=n + 3, 1..=v + 3).prop_map(|(tokens, vocab)| ChunkSizes { tokens, vocab });
            let frozen = prop_oneof![3 => Just(None), 1 => (0..inputs.sizes.len()).prop_map(Some)];
            let upstream = array(inputs.labels.shape().to_vec(), -1.0, 1.0);
            (Just(inputs), upstream, chunks, frozen)
        })
        .prop_map(|(inputs, upstream, chunks, frozen)| Case::new(inputs, upstream, chunks, frozen))
}

in_f64_and_f32!(
    64,
    "proptest-regressions/fused_head.txt",
    case(),
    fused_equals_naive => fused_equals_naive_f64, fused_equals_naive_f32
);

#[test]
fn logits_in_the_thousands_one_token() {
    // z = [3000, 2990, −3000]: lse = 3000 + ln(1 + e^−10) (+ e^−6000, 0);
    // naive exp(3000) overflows, the stable forms do not.
    let chunks = ChunkSizes {
        tokens: 1,
        vocab: 1,
    };
    let upstream = ndarray::array![1.0].into_dyn();
    let c = Case::new(head_with_logits_in_the_thousands(), upstream, chunks, None);
    let want = 10.0 + (-10f64).exp().ln_1p();
    let f = pass::<f64>(&c, false);
    assert!((f.loss[[0]] - want).abs() < 1e-12, "{}", f.loss);
    fused_equals_naive::<f64>(&c, f64::EPSILON).unwrap();
    let f = pass::<f32>(&c, false);
    assert!((f.loss[[0]] - want).abs() < 1e-3, "{}", f.loss);
    fused_equals_naive::<f32>(&c, f32::EPSILON as f64).unwrap();
}

/// Logits that overflow to −∞ in f32 (h·W ≈ −10⁴⁰ for every row of the
/// first split, which come first, so whole tiles and vocabulary blocks of
/// them come before any finite logit): they weigh nothing in the softmax,
/// as in the naive head (and torch's cross-entropy), where the fused head
/// once took e^{−∞ − (−∞)} = NaN. Loss and every gradient finite and equal
/// to the naive pass's, for several chunkings.
#[test]
fn logits_of_minus_infinity_weigh_nothing() {
    let (sizes, h, n) = ([40usize, 40], 8usize, 40usize);
    let mut w0 = ndarray::Array2::<f64>::from_elem((sizes[0], h), 0.5);
    w0.column_mut(0).fill(-1e20);
    let w1 = ndarray::Array2::<f64>::from_shape_fn((sizes[1], h), |(i, j)| {
        if j == 0 {
            0.0
        } else {
            ((i * 7 + j * 3) % 11) as f64 * 0.1 - 0.5
        }
    });
    let weights = vec![w0.into_dyn(), w1.into_dyn()];
    let hidden = ndarray::Array2::<f64>::from_shape_fn((n, h), |(t, j)| {
        if j == 0 {
            1e20
        } else {
            ((t + j) % 5) as f64 * 0.2 - 0.4
        }
    })
    .into_dyn();
    let labels =
        ndarray::Array1::<i64>::from_shape_fn(n, |t| (sizes[0] + (t * 3) % sizes[1]) as i64)
            .into_dyn();
    let upstream = ndarray::Array1::<f64>::from_shape_fn(n, |t| 1.0 + (t % 3) as f64).into_dyn();
    for chunks in [
        ChunkSizes {
            tokens: 4096,
            vocab: 4096,
        },
        ChunkSizes {
            tokens: 16,
            vocab: 12,
        },
        ChunkSizes {
            tokens: 7,
            vocab: 41,
        },
    ] {
        let c = Case {
            sizes: sizes.to_vec(),
            hidden_size: h,
            weights: weights.clone(),
            hidden: hidden.clone(),
            labels: labels.clone(),
            upstream: upstream.clone(),
            chunks,
            frozen: None,
        };
        let (fused, naive) = (pass::<f32>(&c, false), pass::<f32>(&c, true));
        // The summed forward walks the same tiles.
        let mut head = split_head::<f32>(&c.sizes, h, &c.weights, &[true, true]);
        head.set_chunks(chunks);
        let mut tape = Tape::new();
        let x = tape.input(c.hidden.mapv(|v| v as f32));
        let sum = head.forward_sum(&mut tape, x, c.labels.view()).unwrap();
        let (got, want) = (tape.value(sum).sum() as f64, naive.loss.sum());
        assert!(
            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
            "{chunks:?} forward_sum {got}, the naive losses' sum {want}"
        );
        let pairs = std::iter::once((&fused.loss, &naive.loss, "loss".to_string())).chain(
            fused
                .grads
                .iter()
                .zip(&naive.grads)
                .enumerate()
                .map(|(k, (a, b))| {
                    (
                        a,
                        b,
                        if k == 0 {
                            "∂hidden".into()
                        } else {
                            format!("∂W_{}", k - 1)
                        },
                    )
                }),
        );
        for (a, b, what) in pairs {
            let scale = b.iter().fold(1f64, |m, &x| m.max(x.abs()));
            for (i, (&x, &y)) in a.iter().zip(b.iter()).enumerate() {
                assert!(
                    x.is_finite() && y.is_finite() && (x - y).abs() <= 1e-4 * scale,
                    "{chunks:?} {what} element {i}: fused {x}, naive {y}"
                );
            }
        }
    }
}
