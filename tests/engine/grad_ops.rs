//! Property tests: every op's hand-derived backward against central finite
//! differences in f64 (the harness is in `common`), on random shapes —
//! batches of one, width 1, repeated ids — and the integer machinery the
//! layers build on: split routing and the row-sparse coalescing kernel.

use crate::common::{Kind, Leaf, Tally, array, check, ids, input, matrix, param, sorted_unique};
use ndarray::{ArrayD, Axis, IxDyn};
use proptest::prelude::*;
use splitgrad::kernels::routing::SplitRouting;
use splitgrad::kernels::scatter::{coalesce_rows, coalesce_rows_naive};
use splitgrad::{ErrorKind, ParamGrad, Parameter, RowSparse, Tape, Var};

/// Cases of each property test (the slow ones: fewer).
const CASES: u32 = 64;
const SLOW_CASES: u32 = 4;

/// [`check`] as a proptest result, counted in `tally` (a test of `cases`
/// cases must compare a non-zero derivative in at least one).
fn run<F>(tally: &Tally, cases: u32, leaves: &[Leaf], build: F) -> Result<(), TestCaseError>
where
    F: for<'p> Fn(&mut Tape<'p, f64>, &[Var], &[&'p Parameter<f64>]) -> Var,
{
    let report = check(leaves, build).map_err(TestCaseError::fail)?;
    tally.count(&report, cases).map_err(TestCaseError::fail)
}

/// `run` with a tally of its own for each test (`cases` cases).
macro_rules! run {
    ($cases:expr; $($arg:expr),+ $(,)?) => {{
        static TALLY: Tally = Tally::new();
        run(&TALLY, $cases, $($arg),+)
    }};
}

/// A shape of 1 to 3 axes of 1 to 4 each.
fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1..=4usize, 1..=3)
}

/// Two arrays of one random shape.
fn pair() -> impl Strategy<Value = (ArrayD<f64>, ArrayD<f64>)> {
    shape().prop_flat_map(|s| (array(s.clone(), -2.0, 2.0), array(s, -2.0, 2.0)))
}

/// The axes after the first of a gathered table: none (a 1-D table), a
/// row of width w, or a (2, w) block.
fn trailing() -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        Just(vec![]),
        (1..=4usize).prop_map(|w| vec![w]),
        (1..=3usize).prop_map(|w| vec![2, w]),
    ]
}

fn with_rows(n: usize, trailing: &[usize]) -> Vec<usize> {
    std::iter::once(n).chain(trailing.iter().copied()).collect()
}

/// Logits of shape (n, V) in one of three regimes: O(1); spread over the
/// thousands (a near one-hot softmax); 1000 + O(1) (a smooth softmax that
/// only the max-shift keeps from overflowing).
fn logits() -> impl Strategy<Value = ArrayD<f64>> {
    (1..=5usize, 1..=6usize, 0..3u8).prop_flat_map(|(n, v, regime)| {
        array(vec![n, v], -3.0, 3.0).prop_map(move |x| match regime {
            0 => x,
            1 => x * 1000.0,
            _ => x + 1000.0,
        })
    })
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![Just(Kind::Input), Just(Kind::Param)]
}

/// Values of very different magnitudes, so that the order of a sum shows
/// in its last bits.
fn wild() -> impl Strategy<Value = f64> {
    prop_oneof![-1e-3..1e-3f64, -1.0..1.0f64, -1e6..1e6f64]
}

proptest! {
    #![proptest_config(crate::common::config(CASES, "proptest-regressions/grad_ops.txt"))]

    #[test]
    fn gather(
        (table, ids, kind) in (1..=5usize, trailing(), kind()).prop_flat_map(|(r, tr, k)| {
            (array(with_rows(r, &tr), -2.0, 2.0), ids(r, 1..=8), Just(k))
        })
    ) {
        let leaf = Leaf { kind, value: table };
        run!(CASES; &[leaf], |t, v, _| t.gather(v[0], &ids))?;
    }

    #[test]
    fn add((a, b) in pair()) {
        run!(CASES; &[input(a), input(b)], |t, v, _| t.add(v[0], v[1]))?;
    }

    #[test]
    fn sub((a, b) in pair()) {
        run!(CASES; &[input(a), input(b)], |t, v, _| t.sub(v[0], v[1]))?;
    }

    #[test]
    fn mul((a, b) in pair()) {
        run!(CASES; &[input(a), input(b)], |t, v, _| t.mul(v[0], v[1]))?;
    }

    #[test]
    fn mul_same_value_twice(a in shape().prop_flat_map(|s| array(s, -2.0, 2.0))) {
        run!(CASES; &[input(a)], |t, v, _| t.mul(v[0], v[0]))?;
    }

    #[test]
    fn scale(a in shape().prop_flat_map(|s| array(s, -2.0, 2.0)), c in -3.0..3.0f64) {
        run!(CASES; &[input(a)], |t, v, _| t.scale(v[0], c))?;
    }

    #[test]
    fn row_scale(
        (x, s) in (1..=5usize, trailing()).prop_flat_map(|(n, tr)| {
            (array(with_rows(n, &tr), -2.0, 2.0), array(vec![n], -2.0, 2.0))
        })
    ) {
        run!(CASES; &[input(x), input(s)], |t, v, _| t.row_scale(v[0], v[1]))?;
    }

    #[test]
    fn sigmoid(x in shape().prop_flat_map(|s| array(s, -6.0, 6.0))) {
        run!(CASES; &[input(x)], |t, v, _| t.sigmoid(v[0]))?;
    }

    #[test]
    fn select(
        (a, b, mask) in (1..=6usize, trailing()).prop_flat_map(|(n, tr)| {
            let s = with_rows(n, &tr);
            (array(s.clone(), -2.0, 2.0), array(s, -2.0, 2.0), prop::collection::vec(any::<bool>(), n))
        })
    ) {
        run!(CASES; &[input(a), input(b)], |t, v, _| t.select(&mask, v[0], v[1]))?;
    }

    #[test]
    fn segment_sum((x, seg, n_seg) in segments()) {
        run!(CASES; &[input(x)], |t, v, _| t.segment_sum(v[0], &seg, n_seg))?;
    }

    #[test]
    fn segment_mean((x, seg, n_seg) in segments()) {
        run!(CASES; &[input(x)], |t, v, _| t.segment_mean(v[0], &seg, n_seg))?;
    }

    #[test]
    fn row_norm_away_from_zero(
        x in (1..=6usize, trailing()).prop_flat_map(|(n, tr)| array(with_rows(n, &tr), -2.0, 2.0))
    ) {
        // ‖·‖ has a kink at 0 where differences are meaningless: lift any
        // row of norm < 1/4 to norm ≥ 1 (the exact zero row is tested below).
        let mut x = x;
        for mut row in x.axis_iter_mut(Axis(0)) {
            if row.iter().map(|v| v * v).sum::<f64>() < 1.0 / 16.0 {
                *row.iter_mut().next().expect("rows are not empty") = 1.0;
            }
        }
        run!(CASES; &[input(x)], |t, v, _| t.row_norm(v[0]))?;
    }

    #[test]
    fn row_norm_of_a_zero_row_has_zero_gradient(
        (x, zero) in (1..=6usize, 1..=4usize).prop_flat_map(|(n, m)| {
            (array(vec![n, m], 0.5, 2.0), prop::collection::vec(any::<bool>(), n))
        })
    ) {
        let mut x = x;
        for (mut row, &z) in x.axis_iter_mut(Axis(0)).zip(&zero) {
            if z {
                row.fill(0.0);
            }
        }
        let mut t = Tape::<f64>::new();
        let xv = t.input(x.clone());
        let y = t.row_norm(xv);
        let r = crate::common::upstream(&[x.shape()[0]]);
        let loss = t.dot_const(y, r.clone());
        let g = t.backward(loss);
        let g = g.input(xv).expect("x gets a gradient");
        for (i, &z) in zero.iter().enumerate() {
            let norm = x.index_axis(Axis(0), i).iter().map(|v| v * v).sum::<f64>().sqrt();
            prop_assert_eq!(t.value(y)[[i]], norm);
            for (j, &gij) in g.index_axis(Axis(0), i).iter().enumerate() {
                // The subgradient of least norm at 0, exactly — not NaN.
                let expect = if z { 0.0 } else { r[[i]] * x[[i, j]] / norm };
                prop_assert!(if z { gij == 0.0 } else { crate::common::close(gij, expect) },
                    "row {i} col {j}: got {gij}, expected {expect}");
            }
        }
    }

    #[test]
    fn sum(x in prop::collection::vec(1..=4usize, 0..=3).prop_flat_map(|s| array(s, -2.0, 2.0))) {
        run!(CASES; &[input(x)], |t, v, _| t.sum(v[0]))?;
    }

    #[test]
    fn mean(x in prop::collection::vec(1..=4usize, 0..=3).prop_flat_map(|s| array(s, -2.0, 2.0))) {
        run!(CASES; &[input(x)], |t, v, _| t.mean(v[0]))?;
    }

    #[test]
    fn dot_const((x, r) in pair()) {
        run!(CASES; &[input(x)], |t, v, _| t.dot_const(v[0], r.clone()))?;
    }

    #[test]
    fn matmul(
        (a, b) in (1..=6usize, 1..=6usize, 1..=6usize).prop_flat_map(|(m, k, n)| {
            (array(vec![m, k], -2.0, 2.0), array(vec![k, n], -2.0, 2.0))
        }),
        ka in kind(),
        kb in kind(),
    ) {
        let leaves = [Leaf { kind: ka, value: a }, Leaf { kind: kb, value: b }];
        run!(CASES; &leaves, |t, v, _| t.matmul(v[0], v[1]))?;
    }

    #[test]
    fn transpose(x in matrix(6, 6)) {
        run!(CASES; &[input(x)], |t, v, _| t.transpose(v[0]))?;
    }

    #[test]
    fn reshape(
        (x, target) in (1..=4usize, 1..=4usize, 1..=4usize, 0..4u8).prop_flat_map(|(a, b, c, k)| {
            let target = match k {
                0 => vec![a * b * c],
                1 => vec![a, b * c],
                2 => vec![c, a * b],
                _ => vec![b, c, a],
            };
            (array(vec![a, b, c], -2.0, 2.0), Just(target))
        })
    ) {
        run!(CASES; &[input(x)], |t, v, _| t.reshape(v[0], &target))?;
    }

    #[test]
    fn concat_rows(
        parts in (1..=4usize, prop::collection::vec(1..=4usize, 1..=3)).prop_flat_map(|(m, rows)| {
            rows.into_iter().map(|n| array(vec![n, m], -2.0, 2.0)).collect::<Vec<_>>()
        }),
        repeat_first in any::<bool>(),
    ) {
        // With `repeat_first`, part 0 appears twice: its gradient is the sum
        // of its two row blocks.
        let leaves: Vec<Leaf> = parts.into_iter().map(input).collect();
        run!(CASES; &leaves, |t, v, _| {
            let mut vars = v.to_vec();
            if repeat_first {
                vars.push(v[0]);
            }
            t.concat_rows(&vars)
        })?;
    }

    #[test]
    fn logsumexp(x in logits()) {
        run!(CASES; &[input(x)], |t, v, _| t.logsumexp(v[0]))?;
    }

    #[test]
    fn cross_entropy(
        (x, labels) in logits().prop_flat_map(|x| {
            let (n, v) = (x.shape()[0], x.shape()[1] as i64);
            let label = prop_oneof![3 => 0..v, 1 => Just(-100i64)];
            (Just(x), prop::collection::vec(label, n))
        })
    ) {
        run!(CASES; &[input(x)], |t, v, _| t.cross_entropy(v[0], &labels))?;
    }

    #[test]
    fn split_vocabulary_chain(
        (shared, table, gate, ids) in (1..=6usize, 1..=4usize, 1..=4usize).prop_flat_map(|(n, r, d)| {
            (array(vec![n, d], -2.0, 2.0), array(vec![r, d], -2.0, 2.0),
             array(vec![r], -3.0, 3.0), ids(r, n..=n))
        })
    ) {
        // out = (1 − g)·shared + g·row, g = σ(gate[id]): gather from two
        // parameters (one of them 1-D), sigmoid, row_scale, sub, add.
        let leaves = [input(shared), param(table), param(gate)];
        run!(CASES; &leaves, |t, v, _| {
            let row = t.gather(v[1], &ids);
            let logit = t.gather(v[2], &ids);
            let g = t.sigmoid(logit);
            let diff = t.sub(row, v[0]);
            let gated = t.row_scale(diff, g);
            t.add(v[0], gated)
        })?;
    }

    #[test]
    fn parameter_registered_twice_and_used_densely(
        (table, ids_a, ids_b) in (1..=5usize, 1..=4usize).prop_flat_map(|(r, w)| {
            (array(vec![r, w], -2.0, 2.0), ids(r, 1..=6), ids(r, 1..=6))
        }),
        dense_too in any::<bool>(),
    ) {
        // Two registrations of one parameter, each gathered; optionally the
        // table itself is also used whole (the gradient becomes dense).
        run!(CASES; &[param(table)], |t, v, p| {
            let again = t.param(p[0]);
            let a = t.gather(v[0], &ids_a);
            let b = t.gather(again, &ids_b);
            let mut parts = vec![a, b];
            if dense_too {
                parts.push(t.mul(again, again));
            }
            t.concat_rows(&parts)
        })?;
    }

    #[test]
    fn row_sparse_gradient_has_sorted_unique_rows(
        (table, ids_a, ids_b) in (1..=8usize, 1..=4usize).prop_flat_map(|(r, w)| {
            // At least one id each: a gather of no ids is a known failure,
            // tested by itself in `grad_hand.rs`.
            (array(vec![r, w], -2.0, 2.0), ids(r, 1..=10), ids(r, 1..=10))
        })
    ) {
        let p = Parameter::new("table", table);
        let mut t = Tape::new();
        let (a, b) = (t.param(&p), t.param(&p));
        let ga = t.gather(a, &ids_a);
        let gb = t.gather(b, &ids_b);
        let both = t.concat_rows(&[ga, gb]);
        let r = crate::common::upstream(t.value(both).shape());
        let loss = t.dot_const(both, r.clone());
        let grads = t.backward(loss);
        let Some(ParamGrad::RowSparse(rs)) = grads.param(&p) else {
            return Err(TestCaseError::fail(format!("not row-sparse: {:?}", grads.param(&p))));
        };
        let all: Vec<usize> = ids_a.iter().chain(&ids_b).copied().collect();
        prop_assert_eq!(&rs.rows, &sorted_unique(&all));
        prop_assert_eq!(rs.n_rows, p.value().shape()[0]);
        prop_assert_eq!(rs.values.dim(), (rs.rows.len(), p.value().shape()[1]));
        // The values: R's rows scattered onto the ids, in tape order.
        let mut expect = ArrayD::<f64>::zeros(IxDyn(p.value().shape()));
        for (k, &id) in all.iter().enumerate() {
            let mut dst = expect.index_axis_mut(Axis(0), id);
            dst += &r.index_axis(Axis(0), k);
        }
        prop_assert_eq!(rs.to_dense().into_dyn(), expect);
    }

    #[test]
    fn routing_sends_every_id_to_its_owner(
        (sizes, ids) in prop::collection::vec(0..=4usize, 1..=5).prop_flat_map(|sizes| {
            let v: usize = sizes.iter().sum();
            (Just(sizes), prop::collection::vec(-3..v as i64 + 3, 0..=12))
        })
    ) {
        let r = SplitRouting::new(&sizes);
        let v = r.vocab_size() as i64;
        prop_assert_eq!(v, sizes.iter().sum::<usize>() as i64);
        // Every id of [0, V), one by one: owned by the one split whose
        // range holds it, never by a size-0 split.
        for id in -2..v + 2 {
            let owner = (0..sizes.len()).find(|&k| {
                (r.start(k) as i64..(r.start(k) + r.size(k)) as i64).contains(&id)
            });
            prop_assert_eq!(r.route(id), owner.map(|k| (k, id as usize - r.start(k))));
        }
        match ids.iter().position(|&id| id < 0 || id >= v) {
            None => {
                let routed = r.route_all(&ids).expect("all in range");
                let mut seen = vec![false; ids.len()];
                for (k, &size) in sizes.iter().enumerate() {
                    prop_assert_eq!(routed.positions[k].len(), routed.local[k].len());
                    prop_assert!(routed.positions[k].windows(2).all(|w| w[0] < w[1]));
                    for (&pos, &local) in routed.positions[k].iter().zip(&routed.local[k]) {
                        prop_assert!(local < size);
                        prop_assert_eq!(ids[pos], (r.start(k) + local) as i64);
                        prop_assert!(!seen[pos]);
                        seen[pos] = true;
                    }
                }
                prop_assert!(seen.iter().all(|&s| s));
            }
            Some(pos) => {
                let e = r.route_all(&ids).expect_err("an id is out of range");
                prop_assert_eq!(
                    e.to_string(),
                    format!("input id {} at position [{pos}] is out of range 0..{v}", ids[pos])
                );
                let ok = e.what == "input id" && e.position == pos && e.id == ids[pos] && e.vocab_size == v;
                prop_assert!(ok, "{:?}", e);
                let e = splitgrad::Error::from(e);
                let ok = matches!(e.kind(), ErrorKind::OutOfRange { what: "input id", position, value, low: 0, high }
                    if position == &vec![pos] && *value == ids[pos] && *high == v);
                prop_assert!(ok, "{:?}", e.kind());
            }
        }
    }

    #[test]
    fn coalesce_matches_naive_bit_for_bit(
        (n_rows, ids, values) in (1..=6usize, 0..=64usize, 0..=5usize).prop_flat_map(|(r, n, w)| {
            (Just(r), ids(r, n..=n), prop::collection::vec(wild(), n * w).prop_map(move |v| {
                ndarray::Array2::from_shape_vec((n, w), v).unwrap()
            }))
        })
    ) {
        let fast = RowSparse::from_coalesced(n_rows, coalesce_rows(n_rows, &ids, values.view()));
        let naive = RowSparse::from_coalesced(n_rows, coalesce_rows_naive(n_rows, &ids, values.view()));
        assert_bitwise(&fast, &naive)?;
        let narrow = values.mapv(|v| v as f32);
        assert_bitwise(
            &RowSparse::from_coalesced(n_rows, coalesce_rows(n_rows, &ids, narrow.view())),
            &RowSparse::from_coalesced(n_rows, coalesce_rows_naive(n_rows, &ids, narrow.view())),
        )?;
    }
}

proptest! {
    // Large enough for the parallel sort (≥ 4096 ids) and the parallel
    // sums (≥ 32768 elements); few cases, as each is big.
    #![proptest_config(crate::common::config(SLOW_CASES, "proptest-regressions/grad_ops.txt"))]

    #[test]
    fn coalesce_parallel_path_matches_naive_bit_for_bit(
        (ids, values) in (4096..=6000usize).prop_flat_map(|n| {
            (ids(50, n..=n), prop::collection::vec(wild(), n * 8).prop_map(move |v| {
                ndarray::Array2::from_shape_vec((n, 8), v).unwrap()
            }))
        })
    ) {
        let fast = RowSparse::from_coalesced(50, coalesce_rows(50, &ids, values.view()));
        let naive = RowSparse::from_coalesced(50, coalesce_rows_naive(50, &ids, values.view()));
        assert_bitwise(&fast, &naive)?;
    }
}

fn segments() -> impl Strategy<Value = (ArrayD<f64>, Vec<usize>, usize)> {
    // n rows in s used segment ids plus up to 2 more that stay empty.
    (1..=8usize, 1..=4usize, 1..=4usize, 0..=2usize).prop_flat_map(|(n, m, s, extra)| {
        (array(vec![n, m], -2.0, 2.0), ids(s, n..=n), Just(s + extra))
    })
}

fn assert_bitwise<T: splitgrad::Real>(
    fast: &splitgrad::RowSparse<T>,
    naive: &splitgrad::RowSparse<T>,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(fast.n_rows, naive.n_rows);
    prop_assert_eq!(&fast.rows, &naive.rows);
    prop_assert_eq!(fast.values.dim(), naive.values.dim());
    let bits = |a: &ndarray::Array2<T>| -> Vec<u64> {
        a.iter()
            .map(|&v| splitgrad::Real::to_f64(v).to_bits())
            .collect()
    };
    prop_assert_eq!(bits(&fast.values), bits(&naive.values));
    Ok(())
}
