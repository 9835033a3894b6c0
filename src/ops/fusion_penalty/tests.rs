//! Unit tests of the fused fusion penalty: against the composition of
//! generic ops, serial against parallel, row by row against the backward,
//! and on rows kept in half precision against the widened rows.

use super::*;
use crate::Rng;
use crate::ops::fusion_penalty::{FusionBlocks, FusionLayout};
use ndarray::Array2;

use crate::param::RowForm;

/// Rows in `n_groups` groups (some empty, some single, some with equal
/// rows so that deviations are exactly 0): (x, groups).
fn case(seed: u64, n: usize, n_groups: usize, width: usize) -> (Array2<f64>, RowGroups) {
    let mut rng = Rng::new(seed);
    let of: Vec<usize> = (0..n)
        .map(|_| rng.below(n_groups as u64) as usize)
        .collect();
    let mut x = Array2::from_shape_simple_fn((n, width), || rng.normal());
    // Group 0 (if any) has equal rows: every deviation is 0.
    let groups = RowGroups::new(&of, n_groups);
    let zero = groups.members(0).to_vec();
    if let Some(&f) = zero.first() {
        for &i in &zero {
            let r = x.row(f).to_owned();
            x.row_mut(i).assign(&r);
        }
    }
    (x, groups)
}

/// The composition the fused op replaces: (value, ∂x) for ∂P = gy.
fn naive(x: &Array2<f64>, groups: &RowGroups, gy: f64) -> (f64, ArrayD<f64>) {
    let mut t = Tape::new();
    let v = t.input(x.clone().into_dyn());
    let c = t.segment_mean(v, groups.group_of_rows(), groups.n_groups());
    let own = t.gather(c, groups.group_of_rows());
    let dev = t.sub(v, own);
    let norms = t.row_norm(dev);
    let p = t.mean(norms);
    let loss = t.scale(p, gy);
    let g = t.backward(loss);
    (t.scalar(p), g.input(v).unwrap().clone())
}

fn fused(x: &Array2<f64>, groups: &RowGroups, gy: f64) -> (f64, ArrayD<f64>) {
    let mut t = Tape::new();
    let v = t.input(x.clone().into_dyn());
    let p = t.fusion_penalty(v, groups);
    let loss = t.scale(p, gy);
    let g = t.backward(loss);
    (t.scalar(p), g.input(v).unwrap().clone())
}

#[test]
fn fused_equals_the_composition() {
    for (seed, n, n_groups, width) in [(1, 40, 9, 5), (2, 300, 120, 37), (3, 7, 1, 8), (4, 1, 1, 3)]
    {
        let (x, groups) = case(seed, n, n_groups, width);
        let (want_p, want_g) = naive(&x, &groups, 0.7);
        let (p, g) = fused(&x, &groups, 0.7);
        assert!(
            (p - want_p).abs() <= 1e-14 * want_p.abs().max(1.0),
            "{p} vs {want_p}"
        );
        let err = (&g - &want_g).iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(err <= 1e-15, "seed {seed}: gradient differs by {err}");
        // The zero-deviation group gets exactly 0, as the composition.
        for &i in groups.members(0) {
            assert!(g.index_axis(ndarray::Axis(0), i).iter().all(|&v| v == 0.0));
        }
    }
}

#[test]
fn serial_and_parallel_agree_bit_for_bit() {
    let (x, groups) = case(5, 3000, 1400, 64);
    let run = |threads: usize| {
        let pool = crate::kernels::threads(threads);
        pool.install(|| {
            let (p, norms) = fusion_penalty_forward(x.view().into_dyn(), &groups);
            let (_, g) = fused(&x, &groups, 1.3);
            (p.to_bits(), norms, g)
        })
    };
    let one = run(1);
    for threads in [2, 4] {
        let other = run(threads);
        assert_eq!(one.0, other.0, "{threads} threads: value");
        assert_eq!(one.1, other.1, "{threads} threads: norms");
        assert_eq!(one.2, other.2, "{threads} threads: gradient");
    }
}

#[test]
fn row_grads_equal_the_backward_bit_for_bit() {
    for (seed, n, n_groups, width) in [(6, 3000, 1400, 64), (7, 40, 9, 5), (8, 5, 5, 3)] {
        let (x, groups) = case(seed, n, n_groups, width);
        let (_, norms) = fusion_penalty_forward(x.view().into_dyn(), &groups);
        let norms = norms.to_vec();
        let want = fusion_penalty_backward(
            &Pool::new(),
            x.view().into_dyn(),
            &groups,
            &norms,
            arr0(0.7).into_dyn().view(),
        );
        let rg = FusionRowGrads::new(x.view(), &groups, &norms, 0.7);
        let mut g = vec![f64::NAN; width];
        for i in 0..n {
            let x_i = x.row(i);
            let x_i = x_i.as_slice().unwrap();
            rg.row(i, x_i, &mut g);
            let w = want.index_axis(ndarray::Axis(0), i);
            assert!(
                g.iter()
                    .zip(w.iter())
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "seed {seed}, row {i}"
            );
            // The row's form, computed as an optimiser computes it, gives
            // the same bits.
            let formed: Vec<f64> = match rg.form(i) {
                RowForm::Zero => vec![0.0; width],
                RowForm::Deviation { k, c, s } => {
                    (0..width).map(|j| k * (x_i[j] - c[j]) - s[j]).collect()
                }
                RowForm::Written => panic!("row {i}: every row has a form"),
            };
            assert!(
                formed
                    .iter()
                    .zip(&g)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "seed {seed}, row {i}: form"
            );
            assert_eq!(
                matches!(rg.form(i), RowForm::Zero),
                groups.members(groups.group_of_rows()[i]).len() == 1,
                "seed {seed}, row {i}: zero exactly for a row alone"
            );
        }
    }
}

#[test]
fn a_row_alone_has_norm_zero_or_nan() {
    // Rows of 70 elements (eight full blocks of 8 and a tail): finite,
    // or with one infinite or NaN element in a block or in the tail.
    for at in [None, Some(3), Some(40), Some(68)] {
        for bad in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
            let mut x: Vec<f64> = (0..70).map(|j| j as f64 * 0.37 - 9.0).collect();
            if let Some(j) = at {
                x[j] = bad;
            }
            let y = lone_norm(&x);
            match at {
                None => assert_eq!(y.to_bits(), 0.0f64.to_bits()),
                Some(j) => assert!(y.is_nan(), "{bad} at {j}: {y}"),
            }
        }
    }
}

#[test]
fn no_rows_no_penalty() {
    let groups = RowGroups::new(&[], 3);
    let (p, norms) =
        fusion_penalty_forward(Array2::<f32>::zeros((0, 4)).view().into_dyn(), &groups);
    assert_eq!((p, norms.len()), (0.0, 0));
}

/// One element of every eleventh row (from row 3) made ±∞ or NaN: rows
/// alone in their group among them, whose norm is then NaN.
fn poison(x: &mut Array2<f64>) {
    let width = x.ncols();
    for i in (3..x.nrows()).step_by(11) {
        if width > 0 {
            x[[i, (7 * i) % width]] = [f64::INFINITY, f64::NEG_INFINITY, f64::NAN][i % 3];
        }
    }
}

/// x rounded to bf16 and to f16, each with its widened rows (f64, as
/// the tests' rows are).
fn half_rows(x: &Array2<f64>) -> Vec<(crate::param::Stored<f64>, Array2<f64>)> {
    use crate::param::{Dtype, Stored};
    [Dtype::BF16, Dtype::F16]
        .into_iter()
        .map(|d| {
            let s = Stored::from_full(x.clone().into_dyn(), d).unwrap();
            let w = s.widened().into_owned().into_dimensionality().unwrap();
            (s, w)
        })
        .collect()
}

#[test]
fn half_rows_equal_the_widened_rows_bit_for_bit() {
    for (seed, n, n_groups, width, bad) in [
        (9, 3000, 1400, 64, false),
        (9, 3000, 1400, 64, true),
        (10, 40, 9, 5, false),
        (11, 7, 1, 8, false),
    ] {
        let (mut x, groups) = case(seed, n, n_groups, width);
        if bad {
            poison(&mut x);
        }
        for (stored, wide) in half_rows(&x) {
            let (p0, n0) = fusion_penalty_forward(wide.view().into_dyn(), &groups);
            let norms = n0.to_vec();
            let g0 = fusion_penalty_backward(
                &Pool::new(),
                wide.view().into_dyn(),
                &groups,
                &norms,
                arr0(0.7).into_dyn().view(),
            );
            let rg0 = FusionRowGrads::new(wide.view(), &groups, &norms, 0.7);
            for threads in [1, 2, 4] {
                let what = format!(
                    "{:?}, seed {seed}, non-finite {bad}, {threads} threads",
                    stored.dtype()
                );
                let pool = crate::kernels::threads(threads);
                let (p1, n1, g1, rg1) = pool.install(|| {
                    let (p, n) = fusion_penalty_forward_stored(stored.view(), &groups);
                    let g = fusion_penalty_backward_stored(
                        &Pool::new(),
                        stored.view(),
                        &groups,
                        &norms,
                        arr0(0.7).into_dyn().view(),
                    );
                    let rg = FusionRowGrads::from_stored(stored.view(), &groups, &norms, 0.7);
                    (p, n, g, rg)
                });
                assert_eq!(p1.to_bits(), p0.to_bits(), "value, {what}");
                let b = |a: &[f64]| a.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(b(n1.as_slice().unwrap()), b(&norms), "norms, {what}");
                assert_eq!(
                    b(g1.as_slice().unwrap()),
                    b(g0.as_slice().unwrap()),
                    "gradient, {what}"
                );
                assert_eq!(rg1.terms.len(), rg0.terms.len());
                assert_eq!(b(&rg1.terms), b(&rg0.terms), "row terms, {what}");
                assert_eq!(b(&rg1.k), b(&rg0.k), "row factors, {what}");
            }
        }
    }
}

#[test]
fn half_rows_on_the_tape_equal_the_widened_rows() {
    // A bf16 parameter read only by the fusion penalty: its value and
    // gradient are the widened rows', bit for bit.
    let (x, groups) = case(12, 200, 60, 16);
    let mut p = crate::Parameter::new("rows", x.clone().into_dyn());
    p.set_dtype(crate::param::Dtype::BF16).unwrap();
    let wide = crate::Parameter::new("wide", p.widened().into_owned());
    let run = |q: &crate::Parameter<f64>| {
        let mut t = Tape::new();
        let v = t.param(q);
        let y = t.fusion_penalty(v, &groups);
        let g = t.backward(y);
        (t.scalar(y).to_bits(), g.dense(q))
    };
    let (a, ga) = run(&p);
    let (b, gb) = run(&wide);
    assert_eq!(a, b);
    assert_eq!(ga, gb);
}

/// The one-pass forward with row gradients gives the bits of the forward
/// and of `FusionRowGrads::from_stored`, on rows kept as T and in half
/// precision, under 1, 2 and 4 threads.
#[test]
fn forward_with_row_grads_is_the_two_passes() {
    for (seed, n, n_groups, width) in [
        (12, 3000, 1400, 64),
        (13, 40, 9, 5),
        (14, 7, 1, 8),
        (15, 0, 1, 4),
    ] {
        let (mut x, groups) = case(seed, n, n_groups, width);
        poison(&mut x);
        let mut kept = half_rows(&x);
        kept.push((crate::param::Stored::Full(x.clone().into_dyn()), x.clone()));
        for (stored, _) in kept {
            let (p0, n0) = fusion_penalty_forward_stored(stored.view(), &groups);
            let rg0 =
                FusionRowGrads::from_stored(stored.view(), &groups, n0.as_slice().unwrap(), 0.3);
            for threads in [1, 2, 4] {
                let what = format!("{:?}, seed {seed}, {threads} threads", stored.dtype());
                let pool = crate::kernels::threads(threads);
                let (p1, n1, rg1) = pool.install(|| {
                    fusion_penalty_forward_row_grads(&Pool::new(), stored.view(), &groups, 0.3)
                });
                // Bits, a NaN's aside: the two passes compile apart (one
                // for the widest vectors), and x86 gives the sign of an
                // operation's NaN by its operands' order.
                let b = |a: &[f64]| {
                    a.iter()
                        .map(|v| if v.is_nan() { u64::MAX } else { v.to_bits() })
                        .collect::<Vec<_>>()
                };
                assert_eq!(p1.to_bits(), p0.to_bits(), "value, {what}");
                assert_eq!(
                    b(n1.as_slice().unwrap()),
                    b(n0.as_slice().unwrap()),
                    "norms, {what}"
                );
                assert_eq!(rg1.slot, rg0.slot, "slots, {what}");
                assert_eq!(b(&rg1.terms), b(&rg0.terms), "row terms, {what}");
                assert_eq!(b(&rg1.k), b(&rg0.k), "row factors, {what}");
            }
        }
    }
}

/// `FusionBlocks`: blocks that partition the rows, each row's form and
/// gradient row those of `fusion_penalty_forward_row_grads`, and the
/// penalty and norms its, bit for bit (a NaN's sign aside), on rows kept
/// as T and in half precision, with the blocks formed or not.
#[test]
fn blocks_are_the_one_pass_row_grads() {
    for (seed, n, n_groups, width) in [
        (16, 3000, 1400, 64),
        (17, 700, 90, 5),
        (18, 40, 9, 5),
        (19, 7, 1, 8),
        (20, 0, 1, 4),
        (21, 30, 7, 0),
    ] {
        let (mut x, groups) = case(seed, n, n_groups, width);
        poison(&mut x);
        let mut kept = half_rows(&x);
        kept.push((crate::param::Stored::Full(x.clone().into_dyn()), x.clone()));
        // One layout lent to the blocks of every dtype below.
        let layout = FusionLayout::new::<f64>(&groups, width);
        let b = |a: &[f64]| {
            a.iter()
                .map(|v| if v.is_nan() { u64::MAX } else { v.to_bits() })
                .collect::<Vec<_>>()
        };
        for (stored, wide) in kept {
            let what = format!("{:?}, seed {seed}", stored.dtype());
            let (p0, n0, rg0) =
                fusion_penalty_forward_row_grads(&Pool::new(), stored.view(), &groups, 0.3);
            let blocks = FusionBlocks::new(&groups, width, 0.3);
            // Not formed: the penalty forms every block from the rows.
            let (p1, n1) = blocks.penalty(stored.view());
            assert_eq!(b(&[p1]), b(&[p0]), "value, blocks not formed, {what}");
            assert_eq!(
                b(n1.as_slice().unwrap()),
                b(n0.as_slice().unwrap()),
                "{what}"
            );
            let blocks = FusionBlocks::with_layout(&groups, &layout, 0.3);
            assert_eq!(blocks.n_blocks(), layout.n_blocks());
            let table = stored.view().table_rows();
            let mut all: Vec<usize> = Vec::new();
            let (mut scratch, mut g0, mut g1) = (Vec::new(), vec![0.0; width], vec![0.0; width]);
            for k in 0..blocks.n_blocks() {
                let rows = blocks.rows(k);
                assert!(rows.windows(2).all(|w| w[0] < w[1]), "block {k} in order");
                all.extend_from_slice(rows);
                let rows_kept: Vec<_> = rows.iter().map(|&r| table.kept(r)).collect();
                let block = blocks.block(k, &rows_kept, &mut scratch);
                for &r in rows {
                    let xr = wide.row(r).to_vec();
                    rg0.row(r, &xr, &mut g0);
                    block.row(r, &xr, &mut g1);
                    assert_eq!(b(&g1), b(&g0), "row {r}, {what}");
                    match (block.form(r), rg0.form(r)) {
                        (RowForm::Zero, RowForm::Zero) => {}
                        (
                            RowForm::Deviation { k, c, s },
                            RowForm::Deviation {
                                k: k0,
                                c: c0,
                                s: s0,
                            },
                        ) => {
                            assert_eq!(b(&[k]), b(&[k0]), "k of row {r}, {what}");
                            assert_eq!((b(c), b(s)), (b(c0), b(s0)), "terms of row {r}, {what}");
                        }
                        (f, f0) => panic!("row {r}, {what}: {f:?} against {f0:?}"),
                    }
                }
            }
            all.sort_unstable();
            assert_eq!(all, (0..n).collect::<Vec<_>>(), "a partition, {what}");
            assert_eq!(blocks.n_rows(), n);
            let (p2, n2) = blocks.penalty(stored.view());
            assert_eq!(b(&[p2]), b(&[p0]), "value, {what}");
            assert_eq!(
                b(n2.as_slice().unwrap()),
                b(n0.as_slice().unwrap()),
                "{what}"
            );
        }
    }
}

#[test]
#[should_panic(expected = "a layout of 40 rows in 9 groups for 40 rows in 8 groups")]
fn a_layout_of_other_groups_is_refused() {
    let (_, groups) = case(18, 40, 9, 5);
    let (_, other) = case(18, 40, 8, 5);
    let layout = FusionLayout::new::<f64>(&groups, 5);
    FusionBlocks::<f64>::with_layout(&other, &layout, 0.3);
}

/// A layout of other groups of as many rows and groups is caught when a
/// block is formed, not read wrongly.
#[test]
#[should_panic(expected = "is not among the block's rows: the layout is of other groups")]
fn a_layout_of_other_groups_of_the_same_counts_is_refused() {
    let (x, groups) = case(16, 3000, 1400, 64);
    let (_, other) = case(17, 3000, 1400, 64);
    let layout = FusionLayout::new::<f64>(&other, 64);
    let blocks = FusionBlocks::with_layout(&groups, &layout, 0.3);
    blocks.penalty(crate::param::StoredView::Full(x.view().into_dyn()));
}
