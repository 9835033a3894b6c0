//! The three layers end to end against central finite differences in f64
//! (the harness is in `common`): every parameter and every differentiable
//! input, with the loss of the golden vectors (`docs/spec.md#4-golden-vectors`):
//!
//! - SplitTokenEmbeddings: `L = Σ out ⊙ R`;
//! - SplitVocabulary: `L = Σ out ⊙ R + w_p·penalty + w_f·fusion_penalty`;
//! - SplitLanguageModellingHead: `L = Σ_n u_n·loss_n` (per-token
//!   cross-entropy times an upstream gradient).
//!
//! Besides the random cases, the edge cases `docs/spec.md#2-layers` names: ids of rank 0 to
//! 3, repeated ids, a split of size 0, frozen splits, a token that sends
//! nothing to the splits that do not own it; `seed_from` making the output
//! `shared` bit for bit; the fusion penalty's zero-deviation rule; fusion
//! mode; a batch without split rows; ignored labels; logits in the
//! thousands; the fused head's chunk boundaries.

use crate::common::{
    Report, Tally, array, check_grads, config, split_head, upstream, with_trainable,
};
use ndarray::{Array1, Array2, ArrayD, Axis, IxDyn};
use proptest::prelude::*;
use splitgrad::io::SplitIndex;
use splitgrad::kernels::pool::Pool;
use splitgrad::layers::{
    SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary, SplitVocabularyConfig,
};
use splitgrad::ops::fused_ce::ChunkSizes;
use splitgrad::state::Module;
use splitgrad::{ParamGrad, Real, Tape};

/// Cases of each property test (the head's: fewer, they are slower).
const CASES: u32 = 64;
const HEAD_CASES: u32 = 48;
/// Split names `s0`, `s1`, … .
fn names(n: usize) -> Vec<String> {
    (0..n).map(|k| format!("s{k}")).collect()
}

/// The dense gradient of a parameter of this shape (zeros for none).
fn dense(g: Option<&ParamGrad<f64>>, shape: &[usize]) -> ArrayD<f64> {
    g.map_or_else(|| ArrayD::zeros(IxDyn(shape)), ParamGrad::to_dense)
}

/// Whether a gradient is absent or exactly zero.
fn none_or_zero(g: Option<&ParamGrad<f64>>) -> bool {
    g.is_none_or(|g| g.to_dense().iter().all(|&x| x == 0.0))
}

fn bits<T: Real>(a: &ArrayD<T>) -> Vec<u64> {
    a.iter().map(|&x| Real::to_f64(x).to_bits()).collect()
}

// ---------------------------------------------------------------------------
// SplitTokenEmbeddings
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct EmbCase {
    sizes: Vec<usize>,
    hidden: usize,
    tables: Vec<ArrayD<f64>>,
    trainable: Vec<bool>,
    ids: ArrayD<i64>,
}

impl EmbCase {
    fn layer(&self, tables: &[ArrayD<f64>]) -> SplitTokenEmbeddings<f64> {
        let names = names(self.sizes.len());
        let sizes: Vec<(&str, usize)> = names
            .iter()
            .map(String::as_str)
            .zip(self.sizes.iter().copied())
            .collect();
        let mut e = SplitTokenEmbeddings::new(&sizes, &names, self.hidden).unwrap();
        for (k, name) in names.iter().enumerate() {
            *e.split_mut(name).unwrap().value_mut() = tables[k].clone();
            e.set_trainable(name, self.trainable[k]).unwrap();
        }
        e
    }

    /// The tables with those of the trainable splits replaced by `values`
    /// (in split order).
    fn with_trainable(&self, values: &[ArrayD<f64>]) -> Vec<ArrayD<f64>> {
        let mut next = values.iter();
        self.tables
            .iter()
            .zip(&self.trainable)
            .map(|(t, &tr)| {
                if tr {
                    next.next().unwrap().clone()
                } else {
                    t.clone()
                }
            })
            .collect()
    }

    /// (split, local row) of a global id.
    fn owner(&self, id: i64) -> (usize, usize) {
        let mut start = 0;
        for (k, &s) in self.sizes.iter().enumerate() {
            if (id as usize) < start + s {
                return (k, id as usize - start);
            }
            start += s;
        }
        unreachable!("id {id} is in range")
    }
}

/// Output, `Σ out ⊙ R` and each split's gradient.
fn emb_pass(
    e: &SplitTokenEmbeddings<f64>,
    ids: &ArrayD<i64>,
) -> (ArrayD<f64>, f64, Vec<Option<ParamGrad<f64>>>) {
    let mut tape = Tape::new();
    let y = e.forward(&mut tape, ids.view()).unwrap();
    let out = tape.value(y).to_owned();
    let loss = tape.dot_const(y, upstream(out.shape()));
    let g = tape.backward(loss);
    let grads = e.parameters().iter().map(|p| g.param(p).cloned()).collect();
    (out, tape.scalar(loss), grads)
}

fn emb_case() -> impl Strategy<Value = EmbCase> {
    (
        prop::collection::vec(0..=4usize, 1..=3),
        1..=3usize,
        // ids of rank 0 to 3
        prop::collection::vec(1..=3usize, 0..=3),
    )
        .prop_filter("a vocabulary of at least one id", |(s, _, _)| {
            s.iter().sum::<usize>() > 0
        })
        .prop_flat_map(|(sizes, hidden, shape)| {
            let v = sizes.iter().sum::<usize>() as i64;
            let n: usize = shape.iter().product();
            let tables: Vec<_> = sizes
                .iter()
                .map(|&s| array(vec![s, hidden], -2.0, 2.0))
                .collect();
            let ids = prop::collection::vec(0..v, n)
                .prop_map(move |v| ArrayD::from_shape_vec(IxDyn(&shape), v).unwrap());
            let trainable = prop::collection::vec(any::<bool>(), sizes.len());
            (Just(sizes), Just(hidden), tables, trainable, ids)
        })
        .prop_map(|(sizes, hidden, tables, trainable, ids)| EmbCase {
            sizes,
            hidden,
            tables,
            trainable,
            ids,
        })
}

/// Everything `docs/spec.md#21-splittokenembeddings` says of one case: the output rows, the gradient
/// against finite differences, frozen splits, row-sparse routing.
fn check_embeddings(c: &EmbCase) -> Result<Report, TestCaseError> {
    let e = c.layer(&c.tables);
    let (out, _, grads) = emb_pass(&e, &c.ids);
    let mut shape = c.ids.shape().to_vec();
    shape.push(c.hidden);
    prop_assert_eq!(out.shape(), &shape[..]);
    // Each output row is its table row, exactly.
    let out2 = out.to_shape((c.ids.len(), c.hidden)).unwrap();
    for (n, &id) in c.ids.iter().enumerate() {
        let (k, l) = c.owner(id);
        let want = c.tables[k].index_axis(Axis(0), l);
        prop_assert_eq!(out2.row(n).to_owned().into_dyn(), want.to_owned());
    }
    // Routing: split k's gradient carries exactly the rows its ids read.
    for (k, g) in grads.iter().enumerate() {
        let mut rows: Vec<usize> = c
            .ids
            .iter()
            .map(|&id| c.owner(id))
            .filter(|&(o, _)| o == k)
            .map(|(_, l)| l)
            .collect();
        rows.sort_unstable();
        rows.dedup();
        match g {
            None => prop_assert!(
                !c.trainable[k] || rows.is_empty(),
                "split {} read rows {:?} but got no gradient",
                k,
                rows
            ),
            Some(ParamGrad::RowSparse(rs)) => {
                prop_assert!(c.trainable[k], "frozen split {} got a gradient", k);
                prop_assert_eq!(&rs.rows, &rows, "split {}", k);
                prop_assert_eq!(rs.n_rows, c.sizes[k]);
            }
            Some(ParamGrad::Dense(_)) => prop_assert!(false, "split {} has a dense gradient", k),
        }
    }
    // Finite differences, over the trainable tables.
    let values: Vec<ArrayD<f64>> = c
        .tables
        .iter()
        .zip(&c.trainable)
        .filter(|&(_, &tr)| tr)
        .map(|(t, _)| t.clone())
        .collect();
    let analytic: Vec<ArrayD<f64>> = grads
        .iter()
        .zip(&c.tables)
        .zip(&c.trainable)
        .filter(|&(_, &tr)| tr)
        .map(|((g, t), _)| dense(g.as_ref(), t.shape()))
        .collect();
    check_grads(&values, &analytic, |v| {
        emb_pass(&c.layer(&c.with_trainable(v)), &c.ids).1
    })
    .map_err(TestCaseError::fail)
}

proptest! {
    #![proptest_config(config(CASES, "proptest-regressions/grad_layers.txt"))]

    /// Random splits (some of size 0, some frozen), ids of rank 0 to 3 with
    /// repeats.
    #[test]
    fn split_embeddings_match_finite_differences(c in emb_case()) {
        static TALLY: Tally = Tally::new();
        let report = check_embeddings(&c)?;
        TALLY.count(&report, CASES).map_err(TestCaseError::fail)?;
    }
}

/// A case with fixed sizes and ids, random tables from a seed.
fn emb_fixed(sizes: &[usize], hidden: usize, trainable: &[bool], ids: ArrayD<i64>) -> EmbCase {
    let mut rng = splitgrad::Rng::new(17);
    EmbCase {
        sizes: sizes.to_vec(),
        hidden,
        tables: sizes
            .iter()
            .map(|&s| ArrayD::from_shape_simple_fn(IxDyn(&[s, hidden]), || rng.normal()))
            .collect(),
        trainable: trainable.to_vec(),
        ids,
    }
}

#[test]
fn split_embeddings_ids_of_rank_0_to_3() {
    let sizes = [3, 0, 2];
    let ids = [
        ArrayD::from_elem(IxDyn(&[]), 4i64),
        ndarray::array![4i64, 0, 4, 2].into_dyn(),
        ndarray::array![[1i64, 3], [3, 3]].into_dyn(),
        ndarray::array![[[0i64], [4]], [[0], [1]]].into_dyn(),
    ];
    for ids in ids {
        let c = emb_fixed(&sizes, 2, &[true, true, true], ids.clone());
        let report = check_embeddings(&c).unwrap_or_else(|e| panic!("ids {ids}: {e}"));
        report.non_vacuous().unwrap();
        let (out, _, _) = emb_pass(&c.layer(&c.tables), &ids);
        let mut shape = ids.shape().to_vec();
        shape.push(2);
        assert_eq!(out.shape(), &shape[..]);
    }
}

#[test]
fn split_embeddings_no_ids_no_gradient() {
    for shape in [vec![0], vec![2, 0]] {
        let c = emb_fixed(&[2, 1], 3, &[true, true], ArrayD::zeros(IxDyn(&shape)));
        let (out, loss, grads) = emb_pass(&c.layer(&c.tables), &c.ids);
        let mut want = shape.clone();
        want.push(3);
        assert_eq!(out.shape(), &want[..]);
        assert_eq!(loss, 0.0);
        assert!(grads.iter().all(Option::is_none), "{grads:?}");
    }
}

#[test]
fn split_embeddings_repeated_id_sums_its_upstream_rows() {
    // ids [3, 3, 3] all read split 1's row 0: its gradient is R0 + R1 + R2,
    // and split 0 gets nothing (d9d's masked lookup would send zeros to its
    // row 0).
    let c = emb_fixed(
        &[3, 2],
        2,
        &[true, true],
        ndarray::array![3i64, 3, 3].into_dyn(),
    );
    let (_, _, grads) = emb_pass(&c.layer(&c.tables), &c.ids);
    assert!(grads[0].is_none());
    let Some(ParamGrad::RowSparse(rs)) = &grads[1] else {
        panic!("{:?}", grads[1])
    };
    assert_eq!(rs.rows, vec![0]);
    let r = upstream(&[3, 2]);
    let want = r.sum_axis(Axis(0));
    for (a, b) in rs.values.row(0).iter().zip(want.iter()) {
        assert!((a - b).abs() <= 1e-15, "{a} vs {b}");
    }
    check_embeddings(&c).unwrap().non_vacuous().unwrap();
}

#[test]
fn split_embeddings_prompt_tuning_freezes_orig() {
    // d9d's case: `orig` frozen, `prompt` trained, ids from both.
    let ids = ndarray::array![[0i64, 5, 6, 1], [6, 2, 5, 4]].into_dyn();
    let c = emb_fixed(&[5, 2], 3, &[false, true], ids);
    let (_, _, grads) = emb_pass(&c.layer(&c.tables), &c.ids);
    assert!(grads[0].is_none());
    let Some(ParamGrad::RowSparse(rs)) = &grads[1] else {
        panic!("{:?}", grads[1])
    };
    assert_eq!(rs.rows, vec![0, 1]);
    check_embeddings(&c).unwrap().non_vacuous().unwrap();
    // All frozen: no gradient at all.
    let c = emb_fixed(&[5, 2], 3, &[false, false], c.ids.clone());
    let (_, _, grads) = emb_pass(&c.layer(&c.tables), &c.ids);
    assert!(grads.iter().all(Option::is_none));
}

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

// ---------------------------------------------------------------------------
// SplitLanguageModellingHead
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct HeadCase {
    sizes: Vec<usize>,
    hidden_size: usize,
    weights: Vec<ArrayD<f64>>,
    trainable: Vec<bool>,
    /// (…, H)
    hidden: ArrayD<f64>,
    /// (…), in [0, V) or −100
    labels: ArrayD<i64>,
    chunks: ChunkSizes,
}

struct HeadPass {
    loss: ArrayD<f64>,
    total: f64,
    weights: Vec<Option<ParamGrad<f64>>>,
    hidden: Option<ArrayD<f64>>,
}

impl HeadCase {
    fn layer(&self, weights: &[ArrayD<f64>]) -> SplitLanguageModellingHead<f64> {
        let mut head = split_head(&self.sizes, self.hidden_size, weights, &self.trainable);
        head.set_chunks(self.chunks);
        head
    }

    /// values: the trainable weights, then hidden.
    fn pass(&self, values: &[ArrayD<f64>], naive: bool) -> HeadPass {
        let (weights, rest) = with_trainable(&self.weights, &self.trainable, values);
        let hidden = rest[0].clone();
        let head = self.layer(&weights);
        let mut tape = Tape::new();
        let h = tape.input(hidden);
        let loss = if naive {
            head.forward_naive(&mut tape, h, self.labels.view())
        } else {
            head.forward(&mut tape, h, self.labels.view())
        }
        .unwrap();
        let loss_value = tape.value(loss).to_owned();
        let total = tape.dot_const(loss, upstream(self.labels.shape()));
        let g = tape.backward(total);
        HeadPass {
            loss: loss_value,
            total: tape.scalar(total),
            weights: head
                .parameters()
                .iter()
                .map(|p| g.param(p).cloned())
                .collect(),
            hidden: g.input(h).cloned(),
        }
    }

    fn values(&self) -> Vec<ArrayD<f64>> {
        let mut v: Vec<ArrayD<f64>> = self
            .weights
            .iter()
            .zip(&self.trainable)
            .filter(|&(_, &tr)| tr)
            .map(|(w, _)| w.clone())
            .collect();
        v.push(self.hidden.clone());
        v
    }

    fn analytic(&self, p: &HeadPass) -> Vec<ArrayD<f64>> {
        let mut a: Vec<ArrayD<f64>> = p
            .weights
            .iter()
            .zip(&self.weights)
            .zip(&self.trainable)
            .filter(|&(_, &tr)| tr)
            .map(|((g, w), _)| dense(g.as_ref(), w.shape()))
            .collect();
        a.push(
            p.hidden
                .clone()
                .unwrap_or_else(|| ArrayD::zeros(self.hidden.raw_dim())),
        );
        a
    }
}

/// Finite differences, ignored labels, frozen splits for one head case.
fn check_head(c: &HeadCase) -> Result<Report, TestCaseError> {
    let values = c.values();
    let p = c.pass(&values, false);
    prop_assert_eq!(p.loss.shape(), c.labels.shape());
    prop_assert!(p.loss.iter().all(|x| x.is_finite()), "{}", p.loss);
    let h = c.hidden_size;
    let n = c.labels.len();
    let gh = p
        .hidden
        .clone()
        .unwrap_or_else(|| ArrayD::zeros(c.hidden.raw_dim()));
    let gh = gh.to_shape((n, h)).unwrap();
    for (i, (&l, &loss)) in c.labels.iter().zip(p.loss.iter()).enumerate() {
        if l == -100 {
            prop_assert_eq!(loss, 0.0, "ignored token {} has a loss", i);
            prop_assert!(
                gh.row(i).iter().all(|&x| x == 0.0),
                "ignored token {} has a gradient",
                i
            );
        } else {
            prop_assert!(loss >= 0.0);
        }
    }
    for (k, g) in p.weights.iter().enumerate() {
        if !c.trainable[k] {
            prop_assert!(g.is_none(), "frozen split {} got a gradient", k);
        }
    }
    check_grads(&values, &c.analytic(&p), |v| c.pass(v, false).total).map_err(TestCaseError::fail)
}

/// Random heads: 1–3 splits of 0–5 rows (V ≥ 1), H ≤ 4, labels of rank
/// 0 to 2 with about one in four ignored, weights scaled by `scale`,
/// random chunk sizes from 1 to past N and V.
fn head_case(scale: f64) -> impl Strategy<Value = HeadCase> {
    (
        prop::collection::vec(0..=5usize, 1..=3),
        1..=4usize,
        prop::collection::vec(1..=4usize, 0..=2),
    )
        .prop_filter("a vocabulary of at least one id", |(s, _, _)| {
            s.iter().sum::<usize>() > 0
        })
        .prop_flat_map(move |(sizes, h, shape)| {
            let v = sizes.iter().sum::<usize>();
            let n: usize = shape.iter().product();
            let weights: Vec<_> = sizes
                .iter()
                .map(|&s| array(vec![s, h], -1.0, 1.0).prop_map(move |w| w * scale))
                .collect();
            let mut hshape = shape.clone();
            hshape.push(h);
            let label = prop_oneof![1 => Just(-100i64), 3 => 0..v as i64];
            let labels = prop::collection::vec(label, n)
                .prop_map(move |l| ArrayD::from_shape_vec(IxDyn(&shape), l).unwrap());
            let chunks =
                (1..=n + 2, 1..=v + 2).prop_map(|(tokens, vocab)| ChunkSizes { tokens, vocab });
            (
                Just(sizes.clone()),
                Just(h),
                weights,
                prop::collection::vec(any::<bool>(), sizes.len()),
                array(hshape, -1.0, 1.0),
                labels,
                chunks,
            )
        })
        .prop_map(
            |(sizes, hidden_size, weights, trainable, hidden, labels, chunks)| HeadCase {
                sizes,
                hidden_size,
                weights,
                trainable,
                hidden,
                labels,
                chunks,
            },
        )
}

/// `|a − b| ≤ tol·max(1, |a|, |b|)` element-wise.
fn all_close(a: &ArrayD<f64>, b: &ArrayD<f64>, tol: f64) -> Result<(), TestCaseError> {
    prop_assert_eq!(a.shape(), b.shape());
    for (x, y) in a.iter().zip(b.iter()) {
        prop_assert!(
            (x - y).abs() <= tol * x.abs().max(y.abs()).max(1.0),
            "{} vs {}\n{}\n{}",
            x,
            y,
            a,
            b
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(HEAD_CASES, "proptest-regressions/grad_layers.txt"))]

    /// O(1) logits, random chunks, frozen splits, ignored labels.
    #[test]
    fn lm_head_matches_finite_differences(c in head_case(2.0)) {
        static TALLY: Tally = Tally::new();
        let report = check_head(&c)?;
        TALLY.count(&report, HEAD_CASES).map_err(TestCaseError::fail)?;
    }

    /// Logits up to a few hundred (weights × 40): a near one-hot softmax,
    /// still within reach of finite differences.
    #[test]
    fn lm_head_scaled_logits_match_finite_differences(c in head_case(40.0)) {
        static TALLY: Tally = Tally::new();
        let report = check_head(&c)?;
        TALLY.count(&report, HEAD_CASES).map_err(TestCaseError::fail)?;
    }

    /// Logits in the thousands (weights × 3000): the loss is finite and
    /// the fused head equals the naive one (values and gradients) to
    /// rounding.
    #[test]
    fn lm_head_logits_in_the_thousands_equal_naive(c in head_case(3000.0)) {
        let values = c.values();
        let fused = c.pass(&values, false);
        let naive = c.pass(&values, true);
        prop_assert!(fused.loss.iter().all(|x| x.is_finite()), "{}", fused.loss);
        // Logits are at most 3000·H in size; their rounding is ~ε·that.
        let tol = 64.0 * f64::EPSILON * 3000.0 * c.hidden_size as f64;
        all_close(&fused.loss, &naive.loss, tol)?;
        for (a, b) in c.analytic(&fused).iter().zip(&c.analytic(&naive)) {
            all_close(a, b, tol)?;
        }
    }
}

#[test]
fn lm_head_chunk_boundaries() {
    // N = 7 tokens, splits of 5, 0 and 6 rows (V = 11): chunk sizes that
    // divide neither, equal to them, larger than both, and 1.
    let mut rng = splitgrad::Rng::new(5);
    let sizes = vec![5, 0, 6];
    let h = 3;
    let mut normal = |shape: &[usize]| ArrayD::from_shape_simple_fn(IxDyn(shape), || rng.normal());
    let weights: Vec<ArrayD<f64>> = sizes.iter().map(|&s| normal(&[s, h])).collect();
    let hidden = normal(&[7, h]);
    let labels = ndarray::array![10i64, -100, 0, 4, 5, 4, -100].into_dyn();
    let base = HeadCase {
        sizes,
        hidden_size: h,
        weights,
        trainable: vec![true; 3],
        hidden,
        labels,
        chunks: ChunkSizes::default(),
    };
    let reference = base.pass(&base.values(), true);
    for (tokens, vocab) in [
        (1, 1),
        (2, 4),
        (3, 5),
        (4, 6),
        (7, 11),
        (6, 10),
        (8, 12),
        (1000, 1000),
        (1, 1000),
        (1000, 1),
    ] {
        let c = HeadCase {
            chunks: ChunkSizes { tokens, vocab },
            ..base.clone()
        };
        let report = check_head(&c).unwrap_or_else(|e| panic!("chunks ({tokens}, {vocab}): {e}"));
        report.non_vacuous().unwrap();
        let p = c.pass(&c.values(), false);
        all_close(&p.loss, &reference.loss, 1e-13).unwrap();
        for (a, b) in c.analytic(&p).iter().zip(&c.analytic(&reference)) {
            all_close(a, b, 1e-13).unwrap();
        }
    }
}

#[test]
fn lm_head_every_label_ignored() {
    let c = HeadCase {
        sizes: vec![3, 2],
        hidden_size: 2,
        weights: vec![ArrayD::ones(IxDyn(&[3, 2])), ArrayD::ones(IxDyn(&[2, 2]))],
        trainable: vec![true, true],
        hidden: ArrayD::ones(IxDyn(&[2, 2, 2])),
        labels: ArrayD::from_elem(IxDyn(&[2, 2]), -100),
        chunks: ChunkSizes {
            tokens: 3,
            vocab: 2,
        },
    };
    let p = c.pass(&c.values(), false);
    assert!(p.loss.iter().all(|&x| x == 0.0));
    assert_eq!(p.total, 0.0);
    assert!(p.weights.iter().all(|g| none_or_zero(g.as_ref())));
    assert!(p.hidden.is_none_or(|g| g.iter().all(|&x| x == 0.0)));
}

#[test]
fn lm_head_frozen_split_still_normalises() {
    // The frozen split's logits stay in the softmax: the trainable split's
    // and hidden's gradients match finite differences of the full loss.
    let mut rng = splitgrad::Rng::new(8);
    let mut normal = |shape: &[usize]| ArrayD::from_shape_simple_fn(IxDyn(shape), || rng.normal());
    let c = HeadCase {
        sizes: vec![6, 2],
        hidden_size: 3,
        weights: vec![normal(&[6, 3]), normal(&[2, 3])],
        trainable: vec![false, true],
        hidden: normal(&[5, 3]),
        labels: ndarray::array![0i64, 6, 7, -100, 3].into_dyn(),
        chunks: ChunkSizes {
            tokens: 2,
            vocab: 4,
        },
    };
    check_head(&c).unwrap().non_vacuous().unwrap();
    let p = c.pass(&c.values(), false);
    assert!(p.weights[0].is_none());
    assert!(p.weights[1].is_some());
}
