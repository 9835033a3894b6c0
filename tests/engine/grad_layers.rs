//! The three layers end to end against central finite differences in f64
//! (the harness is in `common`; SplitVocabulary's tests are in
//! `grad_vocabulary.rs`): every parameter and every differentiable input,
//! with the loss of the golden vectors (`docs/spec.md#4-golden-vectors`):
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
    Report, Tally, array, check_grads, config, head_arrays, split_head, trainable_grads,
    trainable_values, upstream, with_trainable,
};
use ndarray::{ArrayD, Axis, IxDyn};
use proptest::prelude::*;
use splitgrad::layers::{SplitLanguageModellingHead, SplitTokenEmbeddings};
use splitgrad::ops::fused_ce::ChunkSizes;
use splitgrad::state::Module;
use splitgrad::{ParamGrad, Real, Tape};

/// Cases of each property test (the head's: fewer, they are slower).
pub(super) const CASES: u32 = 64;
const HEAD_CASES: u32 = 48;
/// Split names `s0`, `s1`, … .
fn names(n: usize) -> Vec<String> {
    (0..n).map(|k| format!("s{k}")).collect()
}

/// The dense gradient of a parameter of this shape (zeros for none).
pub(super) fn dense(g: Option<&ParamGrad<f64>>, shape: &[usize]) -> ArrayD<f64> {
    g.map_or_else(|| ArrayD::zeros(IxDyn(shape)), ParamGrad::to_dense)
}

/// Whether a gradient is absent or exactly zero.
pub(super) fn none_or_zero(g: Option<&ParamGrad<f64>>) -> bool {
    g.is_none_or(|g| g.to_dense().iter().all(|&x| x == 0.0))
}

pub(super) fn bits<T: Real>(a: &ArrayD<T>) -> Vec<u64> {
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
    let values = trainable_values(&c.tables, &c.trainable);
    let analytic = trainable_grads(&grads, &c.tables, &c.trainable);
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
        let mut v = trainable_values(&self.weights, &self.trainable);
        v.push(self.hidden.clone());
        v
    }

    fn analytic(&self, p: &HeadPass) -> Vec<ArrayD<f64>> {
        let mut a = trainable_grads(&p.weights, &self.weights, &self.trainable);
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
            let chunks =
                (1..=n + 2, 1..=v + 2).prop_map(|(tokens, vocab)| ChunkSizes { tokens, vocab });
            let (weights, hidden, labels) = head_arrays(&sizes, h, shape, scale);
            (
                Just(sizes.clone()),
                Just(h),
                weights,
                prop::collection::vec(any::<bool>(), sizes.len()),
                hidden,
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
