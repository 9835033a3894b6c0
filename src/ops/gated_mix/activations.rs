//! The gated mix on activations kept in the tables' dtype, as torch keeps
//! a bf16 model's: `shared` (N, D) and the upstream gradient ∂out in bf16
//! or f16, the output and ∂shared returned in that dtype. The math is `T`:
//! each token's rows are widened (exactly) as they are read, its output row
//! and its ∂shared row computed in `T` by the formulas and in the order of
//! [`gated_mix_forward`](super::gated_mix_forward) and
//! [`gated_mix_backward`](super::gated_mix_backward), and rounded to
//! nearest once; ∂rows and ∂gate stay in `T`. So every result is the `T`
//! result on the widened activations (rounded once where it is an
//! activation), bit for bit, and no (N, D) array is ever held in `T`.
//!
//! Activations kept as `T` go to the `T` kernels unchanged.

use std::mem::MaybeUninit;

use ndarray::{ArrayD, ArrayViewD, Ix2, IxDyn};
use rayon::prelude::*;

use super::{
    MIN_TOKENS_PER_TASK, MixGrads, NO_ROW, Want, dot_diff, gate_sums, gated_mix_backward_stored,
    gated_mix_forward_stored_in, shared_grad_row,
};
use crate::kernels::half::{Requantize, requantize_into};
use crate::kernels::pool::Pool;
use crate::kernels::rows::TableRows;
use crate::kernels::{HalfFloat, PAR_MIN_ELEMS, Real};
use crate::param::{Stored, StoredView};

/// [`gated_mix_backward_act`]'s gradients: ∂shared in the activations'
/// dtype, the row contributions and ∂gate in `T`.
pub type MixGradsAct<T> = (
    Option<Stored<T>>,
    Option<(Vec<usize>, ArrayD<T>)>,
    Option<ArrayD<T>>,
);

/// N rows of width d kept as `H`: row k computed in `T` by `row` into a
/// buffer of its task (with the task's scratch `S`), then rounded to
/// nearest; or, for a token without a row of its own (`row_of[k]` is
/// [`NO_ROW`]), row k of `src` (N, d, as kept) taken through `how` by
/// [`requantize_into`], which gives the same bits with no arithmetic (and,
/// for a row with a NaN, leaves it to `row`). Each element is written
/// once, with no zero-fill first; tokens in parallel when the array is
/// large.
fn half_rows<T, H, S, I, F>(
    pool: &Pool<T>,
    d: usize,
    scratch: I,
    row: F,
    src: &[H],
    row_of: &[u32],
    how: Requantize,
) -> ArrayD<H>
where
    T: Real,
    H: HalfFloat,
    I: Fn() -> S + Sync + Send,
    F: Fn(usize, &mut S, &mut [T]) + Sync,
{
    let n = row_of.len();
    let mut out: Vec<H> = pool.take_half_vec(n * d);
    if d > 0 {
        let spare = &mut out.spare_capacity_mut()[..n * d];
        let init = || (scratch(), vec![T::zero(); d], vec![H::from_bits(0); d]);
        let one = |(s, wide, narrow): &mut (S, Vec<T>, Vec<H>),
                   (k, o): (usize, &mut [MaybeUninit<H>])| {
            if row_of[k] == NO_ROW && requantize_into(&src[k * d..(k + 1) * d], o, how) {
                return;
            }
            row(k, s, wide);
            T::narrow_half(wide, narrow, None);
            for (o, &h) in o.iter_mut().zip(narrow.iter()) {
                o.write(h);
            }
        };
        if n * d >= PAR_MIN_ELEMS {
            spare
                .par_chunks_mut(d)
                .enumerate()
                .with_min_len(MIN_TOKENS_PER_TASK)
                .for_each_init(init, one);
        } else {
            let mut s = init();
            spare
                .chunks_mut(d)
                .enumerate()
                .for_each(|item| one(&mut s, item));
        }
    }
    // SAFETY: the loop above wrote every one of the n·d elements (each row
    // of d once, by the copy or by `row`; with d = 0 there is none), and
    // `take_half_vec` has room for n·d.
    unsafe { out.set_len(n * d) };
    ArrayD::from_shape_vec(IxDyn(&[n, d]), out).expect("n·d elements")
}

/// One row a token, kept as `src`'s dtype (a half type): computed by
/// `row`, or copied from `src` (the token's activations as the caller
/// reads them), as [`half_rows`] makes them.
fn rows_as<T, S, I, F>(
    pool: &Pool<T>,
    src: &TableRows<'_, T>,
    scratch: I,
    row: F,
    row_of: &[u32],
    how: Requantize,
) -> Stored<T>
where
    T: Real,
    I: Fn() -> S + Sync + Send,
    F: Fn(usize, &mut S, &mut [T]) + Sync,
{
    match src {
        TableRows::BF16(a, d) => Stored::BF16(half_rows(pool, *d, scratch, row, a, row_of, how)),
        TableRows::F16(a, d) => Stored::F16(half_rows(pool, *d, scratch, row, a, row_of, how)),
        TableRows::Full(..) => unreachable!("activations kept as T take the T kernels"),
    }
}

/// The gated mix of `shared` (N, D) as it is kept (`T`, bf16 or f16),
/// rows (n_rows, D) as they are kept, gate (n_rows) or `None` for fusion
/// mode, row_of (N): the output (N, D) in shared's dtype. In half
/// precision each output row is the `T` mix of the widened rows
/// (`shared_n + g_r·(rows_r − shared_n)`, `rows_r`, or `shared_n`),
/// rounded to nearest once.
///
/// **Panics** if the shapes disagree or a row is out of range (the layer
/// checks its inputs first).
///
/// ```
/// use half::bf16;
/// use ndarray::array;
/// use splitgrad::ops::gated_mix::{gated_mix_forward_act, NO_ROW};
/// use splitgrad::param::{Stored, StoredView};
/// let shared = array![[1.0f32, 2.0], [5.0, 5.0]].mapv(bf16::from_f32).into_dyn();
/// let rows = array![[3.0f32, 0.0]].into_dyn();
/// let out = gated_mix_forward_act(
///     &Default::default(),
///     StoredView::BF16(shared.view()),
///     StoredView::Full(rows.view()),
///     Some(&[0.75]),
///     &[0, NO_ROW],
/// );
/// let Stored::BF16(out) = out else { panic!("the output is bf16") };
/// assert_eq!(out, array![[2.5f32, 0.5], [5.0, 5.0]].mapv(bf16::from_f32).into_dyn());
/// ```
#[track_caller]
pub fn gated_mix_forward_act<T: Real>(
    pool: &Pool<T>,
    shared: StoredView<'_, T>,
    rows: StoredView<'_, T>,
    gate: Option<&[T]>,
    row_of: &[u32],
) -> Stored<T> {
    assert_eq!(shared.shape().len(), 2, "gated_mix: shared must be 2-D");
    let (n, d) = (shared.shape()[0], shared.shape()[1]);
    if let StoredView::Full(s) = &shared {
        let s = s.view().into_dimensionality::<Ix2>().expect("2-D");
        return Stored::Full(gated_mix_forward_stored_in(pool, s, rows, gate, row_of).into_dyn());
    }
    assert_eq!(row_of.len(), n, "gated_mix: one row id per token");
    assert_eq!(rows.shape().len(), 2, "gated_mix: rows must be 2-D");
    assert_eq!(rows.shape()[1], d, "gated_mix: rows and shared widths");
    let (s_rows, r_rows) = (shared.table_rows(), rows.table_rows());
    let scratch = || (s_rows.scratch(), r_rows.scratch());
    let row = |k: usize, (sb, rb): &mut (Vec<T>, Vec<T>), o: &mut [T]| {
        let sn = s_rows.row(k, sb);
        let r = row_of[k];
        if r == NO_ROW {
            o.copy_from_slice(sn);
            return;
        }
        let x = r_rows.row(r as usize, rb);
        match gate {
            Some(g) => {
                let g = g[r as usize];
                o.iter_mut()
                    .zip(sn)
                    .zip(x)
                    .for_each(|((o, &s), &x)| *o = s + g * (x - s));
            }
            None => o.copy_from_slice(x),
        }
    };
    // A token without a row of its own: its shared row, as kept.
    rows_as(pool, &s_rows, scratch, row, row_of, Requantize::Same)
}

/// The gradients of the gated mix for activations as they are kept:
/// shared (N, D) and ∂out (N, D) in one dtype (`T`, bf16 or f16), rows
/// (n_rows, D) as they are kept, gate (n_rows) or `None`. In half
/// precision ∂out is read as the `T` backward reads it (`1·∂out + 0`,
/// widened): ∂shared (in the activations' dtype) is each `T` row
/// `(1 − g_r)·∂out_n` (0 in fusion mode, `∂out_n` without a row) rounded
/// to nearest once; the row contributions `g_r·∂out_n` and ∂gate
/// (`Σ_d ∂out_nd·(rows_rd − shared_nd)`, summed over tokens in increasing
/// n) are `T`, each equal to [`gated_mix_backward`](super::gated_mix_backward)'s
/// on the widened activations bit for bit. With activations kept as `T`
/// it is that kernel's result.
///
/// **Panics** if the shapes disagree or shared and ∂out are kept in
/// different dtypes.
#[track_caller]
pub fn gated_mix_backward_act<T: Real>(
    pool: &Pool<T>,
    row_of: &[u32],
    shared: StoredView<'_, T>,
    rows: StoredView<'_, T>,
    gate: Option<ArrayViewD<'_, T>>,
    gy: StoredView<'_, T>,
    want: Want,
) -> MixGradsAct<T> {
    assert_eq!(
        shared.dtype(),
        gy.dtype(),
        "gated_mix: shared and its gradient in one dtype"
    );
    assert_eq!(shared.shape().len(), 2, "gated_mix: 2-D shared");
    assert_eq!(gy.shape(), shared.shape(), "gated_mix: gradient shape");
    if let (StoredView::Full(s), StoredView::Full(g)) = (&shared, &gy) {
        let gy = crate::kernels::reduce::scaled_copy_in(pool, T::one(), g.view());
        let (gs, contrib, gg): MixGrads<T> =
            gated_mix_backward_stored(pool, row_of, s.view(), rows, gate, gy, want);
        return (gs.map(Stored::Full), contrib, gg);
    }
    assert_eq!(rows.shape().len(), 2, "gated_mix: 2-D rows");
    let (n, d) = (shared.shape()[0], shared.shape()[1]);
    assert_eq!(row_of.len(), n, "gated_mix: one row id per token");
    let n_rows = rows.shape()[0];
    let (s_rows, r_rows, g_rows) = (shared.table_rows(), rows.table_rows(), gy.table_rows());
    let gate: Option<Vec<T>> = gate.map(|g| g.iter().copied().collect());
    let with_row: Vec<usize> = (0..n).filter(|&k| row_of[k] != NO_ROW).collect();
    let want_gate = want.gate && gate.is_some();
    let par = n * d >= PAR_MIN_ELEMS;
    // ∂out_n as the T backward reads it: 1·∂out_n + 0, widened.
    let read_gy = |k: usize, buf: &mut [T]| {
        g_rows.row_into(k, buf);
        buf.iter_mut().for_each(|v| *v = T::one() * *v + T::zero());
    };

    let mut contrib = want.rows.then(|| pool.zeros_2d((with_row.len(), d)));
    let mut acc = vec![T::zero(); if want_gate { with_row.len() } else { 0 }];
    if d > 0 && (want.rows || want_gate) {
        type Bufs<T> = (Vec<T>, Vec<T>, Vec<T>);
        let scratch = || -> Bufs<T> { (vec![T::zero(); d], s_rows.scratch(), r_rows.scratch()) };
        let one = |(gb, sb, rb): &mut Bufs<T>, j: usize, c: Option<&mut [T]>, a: Option<&mut T>| {
            let k = with_row[j];
            let row = row_of[k] as usize;
            read_gy(k, gb);
            let g = gate.as_ref().map(|g| g[row]);
            if let Some(c) = c {
                match g {
                    Some(g) => c.iter_mut().zip(gb.iter()).for_each(|(c, &v)| *c = g * v),
                    None => c.copy_from_slice(gb),
                }
            }
            if let Some(a) = a {
                *a = dot_diff(gb, r_rows.row(row, rb), s_rows.row(k, sb));
            }
        };
        let min = MIN_TOKENS_PER_TASK;
        match contrib.as_mut() {
            Some(c) => {
                let c = c.as_slice_mut().expect("fresh array is contiguous");
                let mut accs: Vec<Option<&mut T>> = if want_gate {
                    acc.iter_mut().map(Some).collect()
                } else {
                    (0..with_row.len()).map(|_| None).collect()
                };
                if par {
                    c.par_chunks_mut(d)
                        .zip(accs.par_iter_mut())
                        .enumerate()
                        .with_min_len(min)
                        .for_each_init(scratch, |b, (j, (c, a))| one(b, j, Some(c), a.take()));
                } else {
                    let mut b = scratch();
                    c.chunks_mut(d)
                        .zip(accs.iter_mut())
                        .enumerate()
                        .for_each(|(j, (c, a))| one(&mut b, j, Some(c), a.take()));
                }
            }
            None if want_gate => {
                if par {
                    acc.par_iter_mut()
                        .enumerate()
                        .with_min_len(min)
                        .for_each_init(scratch, |b, (j, a)| one(b, j, None, Some(a)));
                } else {
                    let mut b = scratch();
                    acc.iter_mut()
                        .enumerate()
                        .for_each(|(j, a)| one(&mut b, j, None, Some(a)));
                }
            }
            None => {}
        }
    }
    let ggate = want_gate.then(|| gate_sums(n_rows, &with_row, row_of, &acc));
    let gs = want.shared.then(|| {
        let row = |k: usize, _: &mut (), o: &mut [T]| {
            read_gy(k, o);
            shared_grad_row(row_of[k], gate.as_deref(), o);
        };
        // A token without a row of its own: 1·∂out_n + 0, as kept.
        rows_as(pool, &g_rows, || (), row, row_of, Requantize::PlusZero)
    });
    let ids: Vec<usize> = with_row.iter().map(|&k| row_of[k] as usize).collect();
    (gs, contrib.map(|c| (ids, c.into_dyn())), ggate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;
    use crate::kernels::reduce::scaled_copy;
    use crate::param::Dtype;
    use half::{bf16, f16};
    use ndarray::{Array1, Array2};

    /// Bits of a `T` array, or of a half array's elements.
    fn bits(a: &Stored<f32>) -> Vec<u32> {
        match a {
            Stored::Full(a) => a.iter().map(|v| v.to_bits()).collect(),
            Stored::BF16(a) => a.iter().map(|v| v.to_bits() as u32).collect(),
            Stored::F16(a) => a.iter().map(|v| v.to_bits() as u32).collect(),
        }
    }

    fn f32_bits(a: &ArrayD<f32>) -> Vec<u32> {
        a.iter().map(|v| v.to_bits()).collect()
    }

    /// The activations (N, D) in `dtype` with values of mixed magnitude
    /// (zeros of both signs among them), and the same widened.
    /// One element in 200 a NaN: quiet or signalling, of either sign, the
    /// latter set on the bits (rounding would quiet it).
    fn act(rng: &mut Rng, n: usize, d: usize, dtype: Dtype) -> (Stored<f32>, ArrayD<f32>) {
        let full = Array2::from_shape_simple_fn((n, d), || match rng.below(16) {
            0 => -0.0,
            1 => 0.0,
            _ => (rng.normal() * 2f64.powi(rng.below(12) as i32 - 6)) as f32,
        })
        .into_dyn();
        let mut kept = Stored::from_full(full, dtype).unwrap();
        let mut nan = |h: &mut u16, inf: u16| {
            if rng.below(200) == 0 {
                let sign = if rng.below(2) == 0 { 0 } else { 0x8000 };
                *h = sign | inf | [1, inf >> 1 & !inf][rng.below(2) as usize];
            }
        };
        match &mut kept {
            Stored::BF16(a) => a.map_inplace(|x| {
                let mut h = x.to_bits();
                nan(&mut h, 0x7F80);
                *x = bf16::from_bits(h);
            }),
            Stored::F16(a) => a.map_inplace(|x| {
                let mut h = x.to_bits();
                nan(&mut h, 0x7C00);
                *x = f16::from_bits(h);
            }),
            Stored::Full(_) => {}
        }
        let wide = kept.widened().into_owned();
        (kept, wide)
    }

    /// Every result of the activation kernels against the `T` kernels on
    /// the widened activations (the activations' results rounded once):
    /// bf16 and f16 activations, rows kept as `T` and in bf16, with and
    /// without the gate, every subset of the gradients, 1 and 4 threads.
    #[test]
    fn half_activations_give_the_t_results_rounded_once() {
        let mut rng = Rng::new(5);
        for (n, d, n_rows) in [(3000, 37, 50), (40, 8, 6), (5, 0, 2)] {
            for dtype in [Dtype::BF16, Dtype::F16] {
                for rows_dtype in [Dtype::F32, Dtype::BF16] {
                    let (shared, shared_w) = act(&mut rng, n, d, dtype);
                    let (gy, gy_w) = act(&mut rng, n, d, dtype);
                    let rows = Array2::from_shape_simple_fn((n_rows, d), || rng.normal() as f32);
                    let rows = Stored::from_full(rows.into_dyn(), rows_dtype).unwrap();
                    let gate: Array1<f32> = (0..n_rows).map(|_| rng.uniform() as f32).collect();
                    let row_of: Vec<u32> = (0..n)
                        .map(|_| match rng.below(3) {
                            0 => rng.below(n_rows as u64) as u32,
                            _ => NO_ROW,
                        })
                        .collect();
                    let pool = Pool::new();
                    let round = |a: ArrayD<f32>| Stored::from_full(a, dtype).unwrap();
                    for use_gate in [true, false] {
                        let g = use_gate.then(|| gate.as_slice().unwrap());
                        let s2 = shared_w.view().into_dimensionality::<Ix2>().unwrap();
                        let want_out = round(
                            gated_mix_forward_stored_in(&pool, s2, rows.view(), g, &row_of)
                                .into_dyn(),
                        );
                        for (shared_g, rows_g, gate_g) in [
                            (true, true, true),
                            (true, false, false),
                            (false, true, true),
                        ] {
                            let want = Want {
                                shared: shared_g,
                                rows: rows_g,
                                gate: gate_g,
                            };
                            let gv = use_gate.then(|| gate.view().into_dyn());
                            let (ws, wc, wg) = gated_mix_backward_stored(
                                &pool,
                                &row_of,
                                shared_w.view(),
                                rows.view(),
                                gv.clone(),
                                scaled_copy(1.0, gy_w.view()),
                                want,
                            );
                            for threads in [1, 4] {
                                let tp = crate::kernels::threads(threads);
                                let what = format!(
                                    "n {n} d {d} {dtype} rows {rows_dtype} gate {use_gate} \
                                     {want:?} {threads} threads"
                                );
                                let out = tp.install(|| {
                                    gated_mix_forward_act(
                                        &pool,
                                        shared.view(),
                                        rows.view(),
                                        g,
                                        &row_of,
                                    )
                                });
                                assert_eq!(out.dtype(), dtype, "{what}");
                                assert_eq!(bits(&out), bits(&want_out), "{what}: out");
                                let (gs, gc, gg) = tp.install(|| {
                                    gated_mix_backward_act(
                                        &pool,
                                        &row_of,
                                        shared.view(),
                                        rows.view(),
                                        gv.clone(),
                                        gy.view(),
                                        want,
                                    )
                                });
                                assert_eq!(
                                    gs.as_ref().map(bits),
                                    ws.clone().map(|w| bits(&round(w))),
                                    "{what}: ∂shared"
                                );
                                assert_eq!(
                                    gc.as_ref().map(|(i, v)| (i.clone(), f32_bits(v))),
                                    wc.as_ref().map(|(i, v)| (i.clone(), f32_bits(v))),
                                    "{what}: ∂rows"
                                );
                                assert_eq!(
                                    gg.as_ref().map(f32_bits),
                                    wg.as_ref().map(f32_bits),
                                    "{what}: ∂gate"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn activations_kept_as_t_take_the_t_kernels() {
        let shared = Array2::from_shape_fn((4, 3), |(i, j)| (i * 3 + j) as f32).into_dyn();
        let rows = Array2::from_elem((2, 3), 1.5f32).into_dyn();
        let row_of = [0, NO_ROW, 1, 0];
        let pool = Pool::new();
        let out = gated_mix_forward_act(
            &pool,
            StoredView::Full(shared.view()),
            StoredView::Full(rows.view()),
            Some(&[0.25, 0.5]),
            &row_of,
        );
        let s2 = shared.view().into_dimensionality::<Ix2>().unwrap();
        let want = super::super::gated_mix_forward(
            s2,
            rows.view().into_dimensionality().unwrap(),
            Some(&[0.25, 0.5]),
            &row_of,
        );
        assert_eq!(out.as_full().unwrap(), &want.into_dyn());
    }
}
