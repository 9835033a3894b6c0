//! SplitVocabulary end to end against central finite differences in f64,
//! with the loss of the golden vectors,
//! `L = Σ out ⊙ R + w_p·penalty + w_f·fusion_penalty` (the other two layers
//! are in `grad_layers.rs`); and the edge cases `docs/spec.md#2-layers`
//! names: `seed_from` making the output `shared` bit for bit, the fusion
//! penalty's zero-deviation rule, fusion mode, a batch without split rows.

use super::grad_layers::{CASES, bits, dense, none_or_zero};
use crate::common::{Report, Tally, array, check_grads, config, upstream};
use ndarray::{Array1, Array2, ArrayD, Axis, IxDyn};
use proptest::prelude::*;
use splitgrad::io::SplitIndex;
use splitgrad::kernels::pool::Pool;
use splitgrad::layers::{SplitVocabulary, SplitVocabularyConfig};
use splitgrad::{ParamGrad, Real, Tape};

// ---------------------------------------------------------------------------
// SplitVocabulary
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct SvCase {
    vocab: usize,
    languages: usize,
    dim: usize,
    language_index: Vec<usize>,
    token_index: Vec<usize>,
    rows: ArrayD<f64>,
    gate_logit: ArrayD<f64>,
    shared: ArrayD<f64>,
    tokens: Vec<i64>,
    langs: Vec<i64>,
    use_gate: bool,
    penalty_weight: f64,
    fusion_weight: f64,
}

/// What one pass of the SplitVocabulary loss gives.
struct SvPass {
    out: ArrayD<f64>,
    loss: f64,
    rows: Option<ParamGrad<f64>>,
    gate_logit: Option<ParamGrad<f64>>,
    shared: Option<ArrayD<f64>>,
}

impl SvCase {
    fn layer(&self, rows: &ArrayD<f64>, gate_logit: &ArrayD<f64>) -> SplitVocabulary<f64> {
        let index = SplitIndex::new(self.language_index.clone(), self.token_index.clone());
        let mut sv = SplitVocabulary::new(
            index,
            &SplitVocabularyConfig {
                vocab_size: self.vocab,
                dim: self.dim,
                n_languages: self.languages,
                gate_init: 0.0,
            },
        )
        .unwrap();
        *sv.rows_mut().value_mut() = rows.clone();
        *sv.gate_logit_mut().value_mut() = gate_logit.clone();
        sv
    }

    /// The row of token n, found by a linear search of the index.
    fn row_of(&self, n: usize) -> Option<usize> {
        (0..self.token_index.len()).find(|&i| {
            self.token_index[i] as i64 == self.tokens[n]
                && self.language_index[i] as i64 == self.langs[n]
        })
    }

    fn pass(&self, values: &[ArrayD<f64>]) -> SvPass {
        let sv = self.layer(&values[0], &values[1]);
        let mut tape = Tape::new();
        let shared = tape.input(values[2].clone());
        let out = sv
            .forward(&mut tape, &self.tokens, &self.langs, shared, self.use_gate)
            .unwrap();
        let out_value = tape.value(out).to_owned();
        let mut loss = tape.dot_const(out, upstream(out_value.shape()));
        if self.penalty_weight != 0.0 {
            let p = sv.penalty_var(&mut tape);
            let p = tape.scale(p, self.penalty_weight);
            loss = tape.add(loss, p);
        }
        if self.fusion_weight != 0.0 {
            let f = sv.fusion_penalty_var(&mut tape);
            let f = tape.scale(f, self.fusion_weight);
            loss = tape.add(loss, f);
        }
        let g = tape.backward(loss);
        SvPass {
            out: out_value,
            loss: tape.scalar(loss),
            rows: g.param(sv.rows()).cloned(),
            gate_logit: g.param(sv.gate_logit()).cloned(),
            shared: g.input(shared).cloned(),
        }
    }

    fn values(&self) -> Vec<ArrayD<f64>> {
        vec![
            self.rows.clone(),
            self.gate_logit.clone(),
            self.shared.clone(),
        ]
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The output, penalties and gradient of one case against `docs/spec.md#23-splitvocabulary`'s
/// formulas and finite differences.
fn check_split_vocabulary(c: &SvCase) -> Result<Report, TestCaseError> {
    let values = c.values();
    let p = c.pass(&values);
    let d = c.dim;
    // out_n = (1 − g)·shared_n + g·rows_r, rows_r in fusion mode, shared_n
    // without a row.
    for n in 0..c.tokens.len() {
        for j in 0..d {
            let s = c.shared[[n, j]];
            let want = match c.row_of(n) {
                None => s,
                Some(r) if c.use_gate => {
                    let g = sigmoid(c.gate_logit[[r]]);
                    (1.0 - g) * s + g * c.rows[[r, j]]
                }
                Some(r) => c.rows[[r, j]],
            };
            let got = p.out[[n, j]];
            prop_assert!(
                (got - want).abs() <= 4.0 * f64::EPSILON * want.abs().max(s.abs()).max(1.0),
                "out[{}, {}] = {} expected {}",
                n,
                j,
                got,
                want
            );
            if c.row_of(n).is_none() {
                prop_assert_eq!(got.to_bits(), s.to_bits());
            }
        }
    }
    // The penalties' values.
    let sv = c.layer(&c.rows, &c.gate_logit);
    let n_rows = c.token_index.len();
    let penalty: f64 = c.gate_logit.iter().map(|&x| sigmoid(x)).sum::<f64>() / n_rows as f64;
    prop_assert!((sv.penalty() - penalty).abs() <= 1e-15);
    let mut fusion = 0.0;
    for i in 0..n_rows {
        let same: Vec<usize> = (0..n_rows)
            .filter(|&k| c.token_index[k] == c.token_index[i])
            .collect();
        let dev: f64 = (0..d)
            .map(|j| {
                let centroid =
                    same.iter().map(|&k| c.rows[[k, j]]).sum::<f64>() / same.len() as f64;
                (c.rows[[i, j]] - centroid).powi(2)
            })
            .sum();
        fusion += dev.sqrt();
    }
    fusion /= n_rows as f64;
    prop_assert!(
        (sv.fusion_penalty() - fusion).abs() <= 1e-13 * fusion.max(1.0),
        "fusion penalty {} expected {}",
        sv.fusion_penalty(),
        fusion
    );
    // The gradients without the forward (the Python package's path) equal
    // the tape's, bit for bit.
    vocabulary_backward_from_matches(&sv, &c.tokens, &c.langs, &c.shared, c.use_gate)?;
    // The fusion penalty's backward from the forward's norms (the Python
    // package's path) equals the tape's, bit for bit.
    let (value, norms) = sv.fusion_penalty_norms();
    prop_assert_eq!(value.to_bits(), sv.fusion_penalty().to_bits());
    let w = 0.5 + c.fusion_weight;
    let from_norms = sv
        .fusion_penalty_grad(&Pool::new(), norms.as_slice().unwrap(), w)
        .unwrap();
    let mut tape = Tape::new();
    let f = sv.fusion_penalty_var(&mut tape);
    let f = tape.scale(f, w);
    let on_tape = tape.backward(f).dense(sv.rows());
    prop_assert_eq!(from_norms, on_tape);
    prop_assert!(
        sv.fusion_penalty_grad(&Pool::new(), &norms.as_slice().unwrap()[1..], w)
            .is_err()
    );
    // Gradients.
    let analytic = vec![
        dense(p.rows.as_ref(), c.rows.shape()),
        dense(p.gate_logit.as_ref(), c.gate_logit.shape()),
        p.shared
            .clone()
            .unwrap_or_else(|| ArrayD::zeros(c.shared.raw_dim())),
    ];
    check_grads(&values, &analytic, |v| c.pass(v).loss).map_err(TestCaseError::fail)
}

/// `SplitVocabulary::backward_from` against the tape's
/// `backward_from(forward(…))`, bit for bit, with and without ∂shared.
fn vocabulary_backward_from_matches<T: Real>(
    sv: &SplitVocabulary<T>,
    tokens: &[i64],
    langs: &[i64],
    shared: &ArrayD<T>,
    use_gate: bool,
) -> Result<(), TestCaseError> {
    let up = upstream(shared.shape()).mapv(T::from_f64);
    let bits = |a: &ArrayD<T>| {
        a.iter()
            .map(|x| Real::to_f64(*x).to_bits())
            .collect::<Vec<_>>()
    };
    let ids = |v: &[i64]| ndarray::ArrayView1::from(v).into_dyn().to_owned();
    let (t, l) = (ids(tokens), ids(langs));
    for want_shared in [true, false] {
        let mut tape = Tape::new();
        let s = if want_shared {
            tape.input(shared.clone())
        } else {
            tape.constant(shared.clone())
        };
        let out = sv.forward(&mut tape, tokens, langs, s, use_gate).unwrap();
        let want = tape.backward_from(out, up.view());
        let got = sv
            .backward_from(
                &Pool::new(),
                t.view(),
                l.view(),
                shared.view(),
                up.view(),
                use_gate,
                want_shared,
            )
            .unwrap();
        prop_assert_eq!(got.shared.as_ref().map(bits), want.input(s).map(bits));
        prop_assert_eq!(
            got.rows.map(|r| bits(&r.to_dense().into_dyn())),
            want.param(sv.rows()).map(|g| bits(&g.to_dense()))
        );
        prop_assert_eq!(
            got.gate_logit.as_ref().map(bits),
            want.param(sv.gate_logit()).map(|g| bits(&g.to_dense()))
        );
    }
    Ok(())
}

/// `backward_from` on a case large enough for the parallel kernels: f32,
/// ids of rank 2, and with the rows frozen.
#[test]
fn vocabulary_backward_from_equals_the_tape_on_a_large_case() {
    let (vocab, languages, dim, n) = (300, 4, 48, 4000);
    let mut rng = splitgrad::Rng::new(11);
    let cells: Vec<usize> = (0..vocab * languages)
        .filter(|_| rng.below(3) == 0)
        .collect();
    let index = SplitIndex::new(
        cells.iter().map(|c| c / vocab).collect(),
        cells.iter().map(|c| c % vocab).collect(),
    );
    let mut sv =
        SplitVocabulary::<f32>::new(index, &SplitVocabularyConfig::new(vocab, dim, languages))
            .unwrap();
    let n_rows = cells.len();
    *sv.rows_mut().value_mut() =
        Array2::from_shape_simple_fn((n_rows, dim), || rng.normal() as f32).into_dyn();
    *sv.gate_logit_mut().value_mut() =
        Array1::from_shape_simple_fn(n_rows, || rng.normal() as f32).into_dyn();
    let tokens: Vec<i64> = (0..n).map(|_| rng.below(vocab as u64) as i64).collect();
    let langs: Vec<i64> = (0..n).map(|_| rng.below(languages as u64) as i64).collect();
    let shared = ArrayD::from_shape_simple_fn(IxDyn(&[n, dim]), || rng.normal() as f32);
    for (use_gate, frozen) in [(true, false), (false, false), (true, true)] {
        sv.rows_mut().set_trainable(!frozen);
        vocabulary_backward_from_matches(&sv, &tokens, &langs, &shared, use_gate).unwrap();
    }
    // Ids of rank 2: shared (40, 100, D).
    let shared3 = shared
        .clone()
        .into_shape_with_order(IxDyn(&[40, 100, dim]))
        .unwrap();
    let up = upstream(shared3.shape()).mapv(|x| x as f32);
    let t = ArrayD::from_shape_vec(IxDyn(&[40, 100]), tokens.clone()).unwrap();
    let l = ArrayD::from_shape_vec(IxDyn(&[40, 100]), langs.clone()).unwrap();
    let g = sv
        .backward_from(
            &Pool::new(),
            t.view(),
            l.view(),
            shared3.view(),
            up.view(),
            true,
            true,
        )
        .unwrap();
    assert_eq!(g.shared.unwrap().shape(), &[40, 100, dim]);
    // A gradient of the wrong shape is an error naming it.
    let err = sv
        .backward_from(
            &Pool::new(),
            t.view(),
            l.view(),
            shared3.view(),
            shared.view(),
            true,
            true,
        )
        .unwrap_err();
    assert!(err.to_string().contains("grad_output"), "{err}");
}

/// A random subset (non-empty) of the L × V pairs, in random order.
fn index(languages: usize, vocab: usize) -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    let all: Vec<(usize, usize)> = (0..languages)
        .flat_map(|l| (0..vocab).map(move |t| (l, t)))
        .collect();
    let len = all.len();
    (Just(all).prop_shuffle(), 1..=len).prop_map(|(pairs, k)| pairs[..k].iter().copied().unzip())
}

fn weight() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), 0.1..2.0f64]
}

/// Random cases: V ≤ 5, L ≤ 4, D ≤ 3, N ≤ 6 tokens (pairs with and
/// without a row), gate logits in [−3, 3].
fn sv_case(use_gate: impl Strategy<Value = bool>) -> impl Strategy<Value = SvCase> {
    (1..=5usize, 1..=4usize, 1..=3usize, 1..=6usize, use_gate).prop_flat_map(
        |(vocab, languages, dim, n, use_gate)| {
            index(languages, vocab).prop_flat_map(move |(li, ti)| {
                let n_rows = li.len();
                (
                    Just((li, ti)),
                    array(vec![n_rows, dim], -2.0, 2.0),
                    array(vec![n_rows], -3.0, 3.0),
                    array(vec![n, dim], -2.0, 2.0),
                    prop::collection::vec(0..vocab as i64, n),
                    prop::collection::vec(0..languages as i64, n),
                    (weight(), weight()),
                )
                    .prop_map(
                        move |((li, ti), rows, gate_logit, shared, tokens, langs, (wp, wf))| {
                            SvCase {
                                vocab,
                                languages,
                                dim,
                                language_index: li.clone(),
                                token_index: ti.clone(),
                                rows,
                                gate_logit,
                                shared,
                                tokens,
                                langs,
                                use_gate,
                                penalty_weight: wp,
                                fusion_weight: wf,
                            }
                        },
                    )
            })
        },
    )
}

/// A seeded table (V, D) of values of very different magnitudes.
fn wild_table<T: Real>(seed: u64, vocab: usize, dim: usize) -> Array2<T> {
    let mut rng = splitgrad::Rng::new(seed);
    Array2::from_shape_simple_fn((vocab, dim), || {
        let x = rng.normal();
        T::from_f64(match rng.below(3) {
            0 => x * 1e-3,
            1 => x,
            _ => x * 1e4,
        })
    })
}

/// After `seed_from(table)` with `shared = table[tokens]`: the output is
/// `shared` bit for bit, gated or not, whatever the gates.
fn seeded_output_is_shared<T: Real>(c: &SvCase, seed: u64) -> Result<(), TestCaseError> {
    let index = SplitIndex::new(c.language_index.clone(), c.token_index.clone());
    let mut sv = SplitVocabulary::<T>::new(
        index,
        &SplitVocabularyConfig {
            vocab_size: c.vocab,
            dim: c.dim,
            n_languages: c.languages,
            gate_init: 0.0,
        },
    )
    .unwrap();
    let table = wild_table::<T>(seed, c.vocab, c.dim);
    sv.seed_from(table.view()).unwrap();
    // Gates anywhere in (0, 1), including saturated ones.
    *sv.gate_logit_mut().value_mut() = c.gate_logit.mapv(|x| T::from_f64(x * 8.0));
    let ids: Vec<usize> = c.tokens.iter().map(|&t| t as usize).collect();
    let shared = table.select(Axis(0), &ids).into_dyn();
    for use_gate in [true, false] {
        let mut tape = Tape::new();
        let s = tape.input(shared.clone());
        let out = sv
            .forward(&mut tape, &c.tokens, &c.langs, s, use_gate)
            .unwrap();
        prop_assert_eq!(bits(&tape.value(out).to_owned()), bits(&shared));
    }
    // Every deviation is 0: the fusion penalty is 0 and so is its gradient
    // (the norm's gradient at 0 is 0).
    prop_assert_eq!(Real::to_f64(sv.fusion_penalty()), 0.0);
    let mut tape = Tape::new();
    let f = sv.fusion_penalty_var(&mut tape);
    let grads = tape.backward(f);
    let g = grads.dense(sv.rows());
    prop_assert!(g.iter().all(|&x| x == T::zero()), "{}", g);
    Ok(())
}

proptest! {
    #![proptest_config(config(CASES, "proptest-regressions/grad_layers.txt"))]

    /// Gated and fusion mode, with and without the penalties.
    #[test]
    fn split_vocabulary_matches_finite_differences(c in sv_case(any::<bool>())) {
        static TALLY: Tally = Tally::new();
        let report = check_split_vocabulary(&c)?;
        TALLY.count(&report, CASES).map_err(TestCaseError::fail)?;
    }

    /// Fusion mode (no gate): `gate_logit` gets gradient from the penalty
    /// alone; `shared` none where a token has a row, all of R elsewhere.
    #[test]
    fn split_vocabulary_fusion_mode(c in sv_case(Just(false))) {
        static TALLY: Tally = Tally::new();
        let report = check_split_vocabulary(&c)?;
        TALLY.count(&report, CASES).map_err(TestCaseError::fail)?;
        let c = SvCase { penalty_weight: 0.0, fusion_weight: 0.0, ..c };
        let p = c.pass(&c.values());
        prop_assert!(none_or_zero(p.gate_logit.as_ref()), "{:?}", p.gate_logit);
        let gs = p.shared.unwrap();
        let r = upstream(c.shared.shape());
        for n in 0..c.tokens.len() {
            let want = if c.row_of(n).is_some() { 0.0 } else { 1.0 };
            for j in 0..c.dim {
                prop_assert_eq!(gs[[n, j]], want * r[[n, j]]);
            }
        }
    }

    /// `seed_from`: output == shared exactly (f64 and f32), fusion penalty
    /// 0 with gradient exactly 0.
    #[test]
    fn split_vocabulary_seed_from_gives_shared_exactly(
        c in sv_case(Just(true)),
        seed in any::<u64>(),
    ) {
        seeded_output_is_shared::<f64>(&c, seed)?;
        seeded_output_is_shared::<f32>(&c, seed)?;
    }

    /// The fusion penalty alone: its gradient flows through the centroid
    /// (finite differences see it), and the row of a token with a single
    /// row has deviation 0 and gradient exactly 0.
    #[test]
    fn split_vocabulary_fusion_penalty_alone(c in sv_case(Just(true))) {
        let sv = c.layer(&c.rows, &c.gate_logit);
        let mut tape = Tape::new();
        let f = sv.fusion_penalty_var(&mut tape);
        let g = tape.backward(f);
        let analytic = g.dense(sv.rows());
        for i in 0..c.token_index.len() {
            let single = c.token_index.iter().filter(|&&t| t == c.token_index[i]).count() == 1;
            if single {
                prop_assert!(
                    analytic.index_axis(Axis(0), i).iter().all(|&x| x == 0.0),
                    "row {} (a token's only row): {}", i, analytic
                );
            }
        }
        static TALLY: Tally = Tally::new();
        let report = check_grads(std::slice::from_ref(&c.rows), &[analytic], |v| {
            c.layer(&v[0], &c.gate_logit).fusion_penalty()
        })
        .map_err(TestCaseError::fail)?;
        TALLY.count(&report, CASES).map_err(TestCaseError::fail)?;
    }

    /// A batch where no token has a row: out is shared bit for bit, shared's
    /// gradient is R, rows and gates get nothing (or zeros).
    #[test]
    fn split_vocabulary_batch_without_split_rows(
        c in sv_case(any::<bool>()),
    ) {
        // Keep only the pairs of language 0, and put every token in
        // language 1: no token has a row.
        let keep: Vec<usize> = (0..c.language_index.len())
            .filter(|&i| c.language_index[i] == 0)
            .collect();
        prop_assume!(!keep.is_empty());
        let c = SvCase {
            languages: 2,
            language_index: vec![0; keep.len()],
            token_index: keep.iter().map(|&i| c.token_index[i]).collect(),
            rows: c.rows.select(Axis(0), &keep),
            gate_logit: c.gate_logit.select(Axis(0), &keep),
            langs: vec![1; c.tokens.len()],
            penalty_weight: 0.0,
            fusion_weight: 0.0,
            ..c
        };
        static TALLY: Tally = Tally::new();
        let report = check_split_vocabulary(&c)?;
        TALLY.count(&report, CASES).map_err(TestCaseError::fail)?;
        let p = c.pass(&c.values());
        prop_assert_eq!(bits(&p.out), bits(&c.shared));
        prop_assert_eq!(p.shared.unwrap(), upstream(c.shared.shape()));
        prop_assert!(none_or_zero(p.rows.as_ref()), "{:?}", p.rows);
        prop_assert!(none_or_zero(p.gate_logit.as_ref()), "{:?}", p.gate_logit);
    }
}

#[test]
fn split_vocabulary_tokens_of_a_single_row() {
    // Pairs: (0, 1), (1, 1), (0, 2), (2, 3): tokens 2 and 3 have one row
    // each; every token of the batch reads row 2 (language 0, token 2).
    let c = SvCase {
        vocab: 4,
        languages: 3,
        dim: 3,
        language_index: vec![0, 1, 0, 2],
        token_index: vec![1, 1, 2, 3],
        rows: ndarray::array![
            [0.5, -1.0, 2.0],
            [1.5, 0.25, -0.5],
            [-0.75, 1.0, 0.125],
            [2.0, 2.0, -2.0]
        ]
        .into_dyn(),
        gate_logit: ndarray::array![0.3, -1.2, 0.8, 2.0].into_dyn(),
        shared: ndarray::array![[1.0, 2.0, 3.0], [-1.0, 0.5, 0.0]].into_dyn(),
        tokens: vec![2, 2],
        langs: vec![0, 0],
        use_gate: true,
        penalty_weight: 0.5,
        fusion_weight: 1.5,
    };
    check_split_vocabulary(&c).unwrap().non_vacuous().unwrap();
    for use_gate in [true, false] {
        let c = SvCase {
            use_gate,
            ..c.clone()
        };
        check_split_vocabulary(&c).unwrap().non_vacuous().unwrap();
        // Without the penalties only row 2 is touched, and (gated) gate 2.
        let c = SvCase {
            penalty_weight: 0.0,
            fusion_weight: 0.0,
            ..c
        };
        let p = c.pass(&c.values());
        let gr = dense(p.rows.as_ref(), &[4, 3]);
        for i in [0, 1, 3] {
            assert!(gr.index_axis(Axis(0), i).iter().all(|&x| x == 0.0));
        }
        assert!(gr.index_axis(Axis(0), 2).iter().any(|&x| x != 0.0));
        let gg = dense(p.gate_logit.as_ref(), &[4]);
        for i in [0, 1, 3] {
            assert_eq!(gg[[i]], 0.0);
        }
        assert_eq!(gg[[2]] != 0.0, use_gate);
    }
    // The fusion penalty's gradient for rows 2 and 3 (single rows) is 0;
    // rows 0 and 1 pull apart from their centroid: ∂ = ±(r0 − r1)/‖r0 − r1‖
    // / n_rows.
    let sv = c.layer(&c.rows, &c.gate_logit);
    let mut tape = Tape::new();
    let f = sv.fusion_penalty_var(&mut tape);
    let g = tape.backward(f).dense(sv.rows());
    let diff: Array1<f64> = (0..3).map(|j| c.rows[[0, j]] - c.rows[[1, j]]).collect();
    let unit = &diff / diff.dot(&diff).sqrt();
    for j in 0..3 {
        assert!((g[[0, j]] - unit[j] / 4.0).abs() < 1e-15);
        assert!((g[[1, j]] + unit[j] / 4.0).abs() < 1e-15);
        assert_eq!(g[[2, j]], 0.0);
        assert_eq!(g[[3, j]], 0.0);
    }
}

#[test]
fn split_vocabulary_fusion_penalty_through_the_centroid() {
    // Three rows of token 5: r0 = [1, 0], r1 = [0, 1], r2 = [0, 0]; the
    // centroid is c = [1/3, 1/3]. With u_i = (r_i − c)/‖r_i − c‖:
    // u0 = [2, −1]/√5, u1 = [−1, 2]/√5, u2 = [−1, −1]/√2, and
    // ∂/∂r_i (1/3) Σ_k ‖r_k − c‖ = (u_i − mean_k u_k)/3. (With two rows the
    // centroid's term vanishes, u0 + u1 = 0; with three it does not.)
    let c = SvCase {
        vocab: 6,
        languages: 3,
        dim: 2,
        language_index: vec![0, 1, 2],
        token_index: vec![5, 5, 5],
        rows: ndarray::array![[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]].into_dyn(),
        gate_logit: ndarray::array![0.0, 0.0, 0.0].into_dyn(),
        shared: ArrayD::zeros(IxDyn(&[1, 2])),
        tokens: vec![0],
        langs: vec![0],
        use_gate: true,
        penalty_weight: 0.0,
        fusion_weight: 1.0,
    };
    let (s5, s2) = (5f64.sqrt(), 2f64.sqrt());
    let u = [
        [2.0 / s5, -1.0 / s5],
        [-1.0 / s5, 2.0 / s5],
        [-1.0 / s2, -1.0 / s2],
    ];
    let mean = [
        (u[0][0] + u[1][0] + u[2][0]) / 3.0,
        (u[0][1] + u[1][1] + u[2][1]) / 3.0,
    ];
    let sv = c.layer(&c.rows, &c.gate_logit);
    let want = (s5 / 3.0 * 2.0 + s2 / 3.0) / 3.0;
    assert!((sv.fusion_penalty() - want).abs() < 1e-15);
    let mut tape = Tape::new();
    let f = sv.fusion_penalty_var(&mut tape);
    let g = tape.backward(f).dense(sv.rows());
    for i in 0..3 {
        for j in 0..2 {
            let want = (u[i][j] - mean[j]) / 3.0;
            assert!(
                (g[[i, j]] - want).abs() < 1e-15,
                "∂r{i}[{j}] = {} expected {want}",
                g[[i, j]]
            );
        }
    }
    check_split_vocabulary(&c).unwrap().non_vacuous().unwrap();
}

#[test]
fn split_vocabulary_empty_batch() {
    let c = SvCase {
        vocab: 3,
        languages: 1,
        dim: 2,
        language_index: vec![0],
        token_index: vec![1],
        rows: ndarray::array![[1.0, 2.0]].into_dyn(),
        gate_logit: ndarray::array![0.0].into_dyn(),
        shared: ArrayD::zeros(IxDyn(&[0, 2])),
        tokens: vec![],
        langs: vec![],
        use_gate: true,
        penalty_weight: 0.0,
        fusion_weight: 0.0,
    };
    let p = c.pass(&c.values());
    assert_eq!(p.out.shape(), &[0, 2]);
    assert_eq!(p.loss, 0.0);
    assert!(none_or_zero(p.rows.as_ref()));
    assert!(none_or_zero(p.gate_logit.as_ref()));
}
