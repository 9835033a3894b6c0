//! The tape's fast paths held equal, bit for bit, to the plain ones:
//!
//! - `coalesce_sources` (rows read in place, scaled or listed), and the
//!   rows `Coalescing::sum_row` sums one at a time, against
//!   `coalesce_rows_naive` over the stacked, materialised rows;
//! - the gradient of `dot_const` kept as `c·R` and read row by row by a
//!   gather, against the same gradient materialised first;
//! - gathers that write each element once against the plain row-by-row copy
//!   (a table that is not in standard layout takes the plain path);
//! - the blocked inner product against its one-accumulator twin on 1, 2 and
//!   3 threads.

use ndarray::{Array2, ArrayD, Axis, IxDyn, ShapeBuilder, array, concatenate};
use proptest::prelude::*;
use splitgrad::kernels::pool::Pool;
use splitgrad::kernels::reduce::{dot_naive, dot_slices};
use splitgrad::kernels::routing::SplitRouting;
use splitgrad::kernels::scatter::{
    Coalesced, Coalescing, RowSource, SourceElem, coalesce_rows_naive, coalesce_sources,
    coalesce_sources_in,
};
use splitgrad::layers::SplitTokenEmbeddings;
use splitgrad::ops::gather::gather_forward;
use splitgrad::ops::split_gather::split_gather_forward;
use splitgrad::state::Module;
use splitgrad::{ParamGrad, Rng, Tape};

fn same_bits(a: &Coalesced<f32>, b: &Coalesced<f32>) -> Result<(), TestCaseError> {
    prop_assert_eq!(&a.rows, &b.rows);
    prop_assert_eq!(a.values.dim(), b.values.dim());
    for (x, y) in a.values.iter().zip(b.values.iter()) {
        prop_assert_eq!(x.to_bits(), y.to_bits(), "{} vs {}", x, y);
    }
    Ok(())
}

/// The rows of a [`Coalescing`] each summed apart by `sum_row`, or by
/// `sum_cols` in two halves, in parallel (from the last, so that no row
/// follows the one before it).
fn summed_apart<S: SourceElem<f32>>(
    n_rows: usize,
    width: usize,
    ids: &[usize],
    sources: &[RowSource<'_, f32, S>],
) -> Coalesced<f32> {
    use rayon::prelude::*;
    let plan = Coalescing::new(n_rows, width, ids, sources);
    let rows = plan.rows().to_vec();
    let mut values = Array2::from_elem((rows.len(), width), f32::NAN);
    let mut each: Vec<_> = values.outer_iter_mut().enumerate().collect();
    each.reverse();
    // Even rows whole, odd ones in two runs of columns.
    each.into_par_iter().for_each(|(j, mut row)| {
        let row = row.as_slice_mut().unwrap();
        if j % 2 == 0 {
            plan.sum_row(j, row);
        } else {
            let (a, b) = row.split_at_mut(width / 2);
            plan.sum_cols(j, width / 2..width, b);
            plan.sum_cols(j, 0..width / 2, a);
        }
    });
    Coalesced { rows, values }
}

/// One source: a (rows, width) array, the rows listed (or all), a scale.
type Src = (Array2<f32>, Option<Vec<usize>>, Option<f32>);

fn sources(width: usize) -> impl Strategy<Value = Vec<Src>> {
    let one = (1..=12usize, any::<bool>(), prop::option::of(-3.0f32..3.0)).prop_flat_map(
        move |(rows, listed, scale)| {
            let values = prop::collection::vec(-4.0f32..4.0, rows * width)
                .prop_map(move |v| Array2::from_shape_vec((rows, width), v).unwrap());
            let list = if listed {
                prop::option::of(prop::collection::vec(0..rows, 0..=16)).boxed()
            } else {
                Just(None).boxed()
            };
            (values, list, Just(scale))
        },
    );
    prop::collection::vec(one, 1..=3)
}

proptest! {
    #![proptest_config(crate::common::config(64, "proptest-regressions/fast_paths.txt"))]

    #[test]
    fn coalesce_sources_equals_naive_over_the_stacked_rows(
        (width, srcs, n_rows, seed) in (0..=6usize).prop_flat_map(|w| (Just(w), sources(w), 1..=5usize, any::<u64>()))
    ) {
        // What the plain path would hold: each source's rows copied out in
        // contribution order, times the scale, plus 0 (a zero buffer added to).
        let stacked: Vec<Array2<f32>> = srcs
            .iter()
            .map(|(v, rows, scale)| {
                let picked = match rows {
                    Some(r) => v.select(Axis(0), r),
                    None => v.clone(),
                };
                match scale {
                    Some(c) => picked.mapv(|x| 0.0 + *c * x),
                    None => picked,
                }
            })
            .collect();
        let views: Vec<_> = stacked.iter().map(|a| a.view()).collect();
        let all = concatenate(Axis(0), &views).unwrap();
        let mut rng = Rng::new(seed);
        let ids: Vec<usize> = (0..all.nrows()).map(|_| rng.below(n_rows as u64) as usize).collect();
        let naive = coalesce_rows_naive(n_rows, &ids, all.view());

        let sources: Vec<RowSource<'_, f32>> = srcs
            .iter()
            .map(|(v, rows, scale)| RowSource { values: v.view(), rows: rows.as_deref(), scale: *scale })
            .collect();
        for threads in [1, 2, 3] {
            let fast = crate::common::threads(threads).install(|| coalesce_sources(n_rows, width, &ids, &sources));
            same_bits(&fast, &naive)?;
            let apart = crate::common::threads(threads).install(|| summed_apart(n_rows, width, &ids, &sources));
            same_bits(&apart, &naive)?;
        }
    }
}

proptest! {
    // Large enough for the parallel sort and sums.
    #![proptest_config(crate::common::config(4, "proptest-regressions/fast_paths.txt"))]

    #[test]
    fn coalesce_sources_parallel_path_equals_naive(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let (n, width, n_rows) = (5000, 8, 40);
        let values = Array2::from_shape_fn((n, width), |_| rng.normal() as f32);
        let rows: Vec<usize> = (0..n).map(|_| rng.below(n as u64) as usize).collect();
        let ids: Vec<usize> = (0..n).map(|_| rng.below(n_rows as u64) as usize).collect();
        let c = rng.normal() as f32;
        let plain = values.select(Axis(0), &rows).mapv(|x| 0.0 + c * x);
        let naive = coalesce_rows_naive(n_rows, &ids, plain.view());
        let src = [RowSource { values: values.view(), rows: Some(&rows[..]), scale: Some(c) }];
        for threads in [1, 2] {
            same_bits(&crate::common::threads(threads).install(|| coalesce_sources(n_rows, width, &ids, &src)), &naive)?;
        }
    }
}

/// Result rows too many for a task's cache are summed row by row instead
/// of in position order: still the naive sums bit for bit, from f32 rows
/// (listed and scaled) and from bf16 rows widened as they are added, on 1
/// and 2 threads; and so are the rows `Coalescing::sum_row` sums apart. (1,000 rows of 1,024 elements: 1 MiB of rows a task on
/// two threads, 4 KiB each; Zipf-like ids, a few rows summed many times.)
#[test]
fn coalescing_many_wide_rows_row_by_row_equals_naive() {
    let mut rng = Rng::new(11);
    let (n, width, n_rows) = (6000, 1024, 1000);
    let values = Array2::from_shape_fn((n, width), |_| rng.normal() as f32);
    let ids: Vec<usize> = (0..n)
        .map(|_| {
            let u = rng.uniform();
            ((n_rows as f64).powf(u) as usize - 1).min(n_rows - 1)
        })
        .collect();
    let rows: Vec<usize> = (0..n).map(|_| rng.below(n as u64) as usize).collect();
    let c = 0.75f32;
    let plain = values.select(Axis(0), &rows).mapv(|x| 0.0 + c * x);
    let naive = coalesce_rows_naive(n_rows, &ids, plain.view());
    let src = [RowSource {
        values: values.view(),
        rows: Some(&rows[..]),
        scale: Some(c),
    }];
    let half = values.mapv(half::bf16::from_f32);
    let naive_half = coalesce_rows_naive(n_rows, &ids, half.mapv(f32::from).view());
    let half_src = [RowSource::all(half.view())];
    for threads in [1, 2] {
        crate::common::threads(threads).install(|| {
            same_bits(&coalesce_sources(n_rows, width, &ids, &src), &naive).unwrap();
            let from_half = coalesce_sources_in(&Pool::new(), n_rows, width, &ids, &half_src);
            same_bits(&from_half, &naive_half).unwrap();
            same_bits(&summed_apart(n_rows, width, &ids, &src), &naive).unwrap();
            same_bits(&summed_apart(n_rows, width, &ids, &half_src), &naive_half).unwrap();
        });
    }
    assert!(naive.rows.len() > 600, "{} distinct rows", naive.rows.len());
}

/// The embedding gradient through `dot_const` (kept as `c·R`, read by the
/// split gather row by row) equals the rows of `c·R` coalesced the plain
/// way; and when `out` is also used elsewhere, the gradient is materialised
/// and still right.
#[test]
fn dot_const_gradient_read_in_place_equals_the_materialised_one() {
    let mut rng = Rng::new(3);
    let sizes = [("a", 5), ("b", 0), ("c", 3), ("d", 4)];
    let mut emb = SplitTokenEmbeddings::<f32>::new(&sizes, &["a", "b", "c", "d"], 6).unwrap();
    emb.reset_parameters(&mut rng);
    emb.set_trainable("d", false).unwrap();
    let ids = array![[0i64, 7, 5, 0], [11, 6, 7, 2], [0, 9, 10, 5]].into_dyn();
    let r = ArrayD::from_shape_simple_fn(IxDyn(&[3, 4, 6]), || rng.normal() as f32);
    let c = 0.37f32;
    let flat_ids: Vec<i64> = ids.iter().copied().collect();
    let routed = emb.splits().routing().route_all(&flat_ids).unwrap();
    let r2 = r.view().into_shape_with_order((12, 6)).unwrap();

    for also_summed in [false, true] {
        let mut tape = Tape::new();
        let out = emb.forward(&mut tape, ids.view()).unwrap();
        let fit = tape.dot_const_view(out, r.view());
        let mut loss = tape.scale(fit, c);
        if also_summed {
            let s = tape.sum(out);
            loss = tape.add(loss, s);
        }
        let grads = tape.backward(loss);
        for (k, p) in emb.parameters().iter().enumerate() {
            let got = grads.param(p);
            if !p.is_trainable() || routed.positions[k].is_empty() {
                assert!(got.is_none(), "split {k}");
                continue;
            }
            let plain = r2
                .select(Axis(0), &routed.positions[k])
                .mapv(|x| 0.0 + c * x + if also_summed { 1.0 } else { 0.0 });
            let want = coalesce_rows_naive(p.value().shape()[0], &routed.local[k], plain.view());
            let Some(ParamGrad::RowSparse(got)) = got else {
                panic!("split {k}: expected a row-sparse gradient, got {got:?}")
            };
            assert_eq!(got.rows, want.rows, "split {k}");
            let bits = |a: &Array2<f32>| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got.values),
                bits(&want.values),
                "split {k}, summed {also_summed}"
            );
        }
    }
}

/// A gather from a differentiable input (a dense gradient) reads the lazy
/// `c·R` rows the same way.
#[test]
fn dense_scatter_of_a_lazy_gradient() {
    // out = t[[2, 0, 2]]; ∂t[2] = c·(R0 + R2), ∂t[0] = c·R1, ∂t[1] = 0.
    let mut tape = Tape::<f64>::new();
    let t = tape.input(array![[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]].into_dyn());
    let out = tape.gather(t, &[2, 0, 2]);
    let r = array![[1.0, -1.0], [10.0, 20.0], [100.0, 200.0]].into_dyn();
    let fit = tape.dot_const(out, r);
    let loss = tape.scale(fit, 0.5);
    let g = tape.backward(loss);
    assert_eq!(
        g.input(t).unwrap(),
        &array![[5.0, 10.0], [0.0, 0.0], [50.5, 99.5]].into_dyn()
    );
}

#[test]
fn gathers_write_what_the_plain_copy_writes() {
    // Big enough for the parallel copy; then for the streaming stores
    // (5 MiB of output).
    for (rows, width, n) in [(300, 40, 2000), (500, 161, 8192)] {
        gather_case(rows, width, n);
    }
}

fn gather_case(rows: usize, width: usize, n: usize) {
    let mut rng = Rng::new(5);
    let table = Array2::from_shape_fn((rows, width), |_| rng.normal() as f32);
    let ids: Vec<usize> = (0..n).map(|_| rng.below(rows as u64) as usize).collect();
    // The same table in column-major order takes the row-by-row path.
    let mut fortran = Array2::zeros((rows, width).f());
    fortran.assign(&table);
    let fast = gather_forward(table.view().into_dyn(), &ids);
    let plain = gather_forward(fortran.view().into_dyn(), &ids);
    assert_eq!(fast, plain);
    assert_eq!(fast, table.select(Axis(0), &ids).into_dyn());

    let routing = SplitRouting::new(&[100, 0, rows - 100]);
    let global: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
    let routed = routing.route_all(&global).unwrap();
    let (a, b) = (
        table.slice(ndarray::s![..100, ..]),
        table.slice(ndarray::s![100.., ..]),
    );
    let empty = Array2::<f32>::zeros((0, width));
    let (fa, fb) = (
        fortran.slice(ndarray::s![..100, ..]),
        fortran.slice(ndarray::s![100.., ..]),
    );
    for threads in [1, 2] {
        let split = crate::common::threads(threads).install(|| {
            split_gather_forward(
                &[a.into_dyn(), empty.view().into_dyn(), b.into_dyn()],
                &routed,
                &[n / 4, 4],
            )
        });
        let split_plain = split_gather_forward(
            &[fa.into_dyn(), empty.view().into_dyn(), fb.into_dyn()],
            &routed,
            &[n / 4, 4],
        );
        assert_eq!(split, split_plain);
        assert_eq!(
            split.into_shape_with_order((n, width)).unwrap(),
            table.select(Axis(0), &ids)
        );
    }
}

#[test]
fn blocked_dot_equals_its_twin_on_any_thread_count() {
    let mut rng = Rng::new(9);
    let n = 100_003;
    let x: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
    let r: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
    let want = dot_naive(&x, &r).to_bits();
    for threads in [1, 2, 3] {
        assert_eq!(
            crate::common::threads(threads)
                .install(|| dot_slices(&x, &r))
                .to_bits(),
            want
        );
    }
}

/// A lazy `c·R` reaching an op that needs the array is written out as
/// `c·r + 0` (so −0 becomes +0, as a zero buffer added to would hold).
#[test]
fn lazy_gradient_written_out_has_the_bits_of_a_zero_buffer_added_to() {
    let mut rng = Rng::new(11);
    for n in [3usize, 40_000] {
        let mut r: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
        r[0] = -0.0;
        r[1] = 0.0;
        let r = ArrayD::from_shape_vec(IxDyn(&[n]), r).unwrap();
        let mut tape = Tape::new();
        let x = tape.input(ArrayD::zeros(IxDyn(&[n])));
        let fit = tape.dot_const_view(x, r.view());
        let loss = tape.scale(fit, -1.5);
        let g = tape.backward(loss);
        let mut want = ArrayD::<f32>::zeros(IxDyn(&[n]));
        want.zip_mut_with(&r, |w, &r| *w += -1.5 * r);
        let bits = |a: &ArrayD<f32>| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(g.input(x).unwrap()), bits(&want), "n = {n}");
    }
}

/// R in another layout than `out`'s (a transposed view) gives the same
/// gradients, bit for bit, through the row-sparse and the dense paths.
#[test]
fn dot_const_with_a_transposed_constant() {
    let mut rng = Rng::new(13);
    let mut emb = SplitTokenEmbeddings::<f32>::new(&[("a", 4), ("b", 3)], &["a", "b"], 5).unwrap();
    emb.reset_parameters(&mut rng);
    let ids = array![0i64, 6, 2, 0, 4, 6].into_dyn();
    let r = Array2::from_shape_fn((6, 5), |_| rng.normal() as f32);
    let r_t = r.t().to_owned(); // (5, 6), standard layout
    let run = |r: ndarray::ArrayViewD<'_, f32>| {
        let mut tape = Tape::new();
        let out = emb.forward(&mut tape, ids.view()).unwrap();
        let fit = tape.dot_const_view(out, r);
        let loss = tape.scale(fit, 0.25);
        let g = tape.backward(loss);
        emb.parameters()
            .iter()
            .map(|p| g.dense(p).iter().map(|x| x.to_bits()).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(r.view().into_dyn()), run(r_t.t().into_dyn()));

    // A dense gradient: the table is a differentiable input.
    let dense = |r: ndarray::ArrayViewD<'_, f32>| {
        let mut tape = Tape::new();
        let t = tape.input(Array2::<f32>::ones((4, 5)).into_dyn());
        let out = tape.gather(t, &[3, 0, 3, 1, 2, 0]);
        let fit = tape.dot_const_view(out, r);
        let loss = tape.scale(fit, -2.0);
        let g = tape.backward(loss);
        g.input(t)
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(dense(r.view().into_dyn()), dense(r_t.t().into_dyn()));
}
