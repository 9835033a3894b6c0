//! The gated mix, the op of the split vocabulary layer (`SplitVocabulary`):
//! its forward and backward kernels, and their serial twins.
//!
//! ```text
//! out_n = shared_n + g_r·(rows_r − shared_n)    r = row_of[n]; rows_r in fusion mode; shared_n without a row
//! ∂shared_n = (1 − g_r)·∂out_n                   0 in fusion mode, ∂out_n without a row
//! ∂rows_r  += g_r·∂out_n                         ∂out_n in fusion mode
//! ∂g_r     += Σ_d ∂out_nd·(rows_rd − shared_nd)
//! ```
//!
//! Both kernels run in parallel over tokens; every token writes only its
//! own output rows, and the gate's sums over repeated rows are added in
//! increasing token order after the parallel part, so the result is the
//! same bit for bit for any number of threads, and equals the serial
//! twins' ([`gated_mix_forward_naive`], [`gated_mix_backward_naive`]).
//! Derivation: `docs/gradients.md#the-gated-mix`.

use std::mem::MaybeUninit;

use ndarray::{Array1, Array2, ArrayD, ArrayView2, ArrayViewD, Ix2};
use rayon::prelude::*;

use crate::kernels::PAR_MIN_ELEMS;
use crate::kernels::Real;
use crate::kernels::pool::Pool;
use crate::param::StoredView;
use crate::tape::{RowPart, Tape, Var};

mod activations;
pub use activations::{MixGradsAct, gated_mix_backward_act, gated_mix_forward_act};

/// The row of a token that has none.
pub const NO_ROW: u32 = u32::MAX;

/// Tokens per rayon task, at least.
const MIN_TOKENS_PER_TASK: usize = 16;

/// The saved state of the gated mix.
struct GatedMix {
    shared: Var,
    rows: Var,
    /// The gate probabilities σ(gate_logit), (n_rows); `None` in fusion mode.
    gate: Option<Var>,
    /// The row of each token, [`NO_ROW`] for none.
    row_of: Vec<u32>,
}

backward!(GatedMix, |s, _y, gy, grads| {
    let want = Want {
        shared: grads.wants(s.shared),
        rows: grads.wants(s.rows),
        gate: s.gate.is_some_and(|g| grads.wants(g)),
    };
    let gate = s.gate.map(|g| grads.value(g));
    // The rows as they are kept: a half-precision table is widened row
    // by row as the gate's sums read it, never whole.
    let (gs, row_contrib, gg) = gated_mix_backward_stored(
        grads.pool(),
        &s.row_of,
        grads.value(s.shared),
        grads.stored_value(s.rows),
        gate,
        gy.into_owned_in(grads.pool()),
        want,
    );
    // ∂shared is ∂out changed in place: it becomes the buffer when
    // there is none yet.
    if let Some(d) = gs {
        grads.add(s.shared, d);
    }
    if let (Some(gate), Some(d)) = (s.gate, gg) {
        grads.add(gate, d);
    }
    if let Some((ids, vals)) = row_contrib {
        grads.add_rows(s.rows, RowPart::owned(ids, vals));
    }
});

impl<'p, T: Real> Tape<'p, T> {
    /// The gated mix: shared (N, D), rows (n_rows, D), gate (n_rows) or
    /// `None` for fusion mode, `row_of` (N) the row of each token or
    /// [`NO_ROW`] → out (N, D), `out_n = shared_n + g_r·(rows_r − shared_n)`
    /// (`rows_r` in fusion mode, `shared_n` without a row).
    ///
    /// **Panics** if the shapes disagree or a row is out of range (the
    /// layer checks its inputs first).
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::{ops::gated_mix::NO_ROW, Tape};
    /// let mut t = Tape::<f64>::new();
    /// let shared = t.input(array![[1.0, 2.0], [5.0, 5.0]].into_dyn());
    /// let rows = t.input(array![[3.0, 0.0]].into_dyn());
    /// let gate = t.input(array![0.75].into_dyn());
    /// let out = t.gated_mix(shared, rows, Some(gate), vec![0, NO_ROW]);
    /// assert_eq!(t.value(out), array![[2.5, 0.5], [5.0, 5.0]].into_dyn());
    /// let loss = t.sum(out);
    /// let g = t.backward(loss);
    /// // ∂gate = Σ_d (rows − shared) = (3 − 1) + (0 − 2).
    /// assert_eq!(g.input(gate).unwrap(), &array![0.0].into_dyn());
    /// ```
    #[track_caller]
    pub fn gated_mix(
        &mut self,
        shared: Var,
        rows: Var,
        gate: Option<Var>,
        row_of: Vec<u32>,
    ) -> Var {
        let out = {
            let g: Option<Vec<T>> = gate.map(|g| self.value(g).iter().copied().collect());
            let s = self
                .value(shared)
                .into_dimensionality::<Ix2>()
                .expect("gated_mix: shared must be 2-D");
            let r = self.stored_value(rows);
            assert_eq!(r.shape().len(), 2, "gated_mix: rows must be 2-D");
            gated_mix_forward_stored_in(self.pool(), s, r, g.as_deref(), &row_of)
        };
        let mut inputs = vec![shared, rows];
        inputs.extend(gate);
        self.push_op(
            out.into_dyn(),
            &inputs,
            GatedMix {
                shared,
                rows,
                gate,
                row_of,
            },
        )
    }
}

/// `Σ_d a_d·(b_d − c_d)` in eight interleaved partial sums, added in a
/// fixed tree: the loop vectorises, and the order is the same wherever it
/// runs.
#[inline]
fn dot_diff<T: Real>(a: &[T], b: &[T], c: &[T]) -> T {
    const LANES: usize = 8;
    let mut acc = [T::zero(); LANES];
    let (ac, bc, cc) = (
        a.chunks_exact(LANES),
        b.chunks_exact(LANES),
        c.chunks_exact(LANES),
    );
    let (ar, br, cr) = (ac.remainder(), bc.remainder(), cc.remainder());
    for ((a, b), c) in ac.zip(bc).zip(cc) {
        for k in 0..LANES {
            acc[k] += a[k] * (b[k] - c[k]);
        }
    }
    let mut tail = T::zero();
    for ((&a, &b), &c) in ar.iter().zip(br).zip(cr) {
        tail += a * (b - c);
    }
    fold_lanes(acc) + tail
}

#[inline]
fn fold_lanes<T: Real>(acc: [T; 8]) -> T {
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// The gated mix (the fast kernel): shared (N, D), rows (n_rows, D), gate
/// (n_rows) or `None` for fusion mode, row_of (N) → out (N, D).
///
/// **Panics** if the shapes disagree or a row is out of range.
///
/// ```
/// use ndarray::array;
/// use splitgrad::ops::gated_mix::gated_mix_forward;
/// let shared = array![[1.0f32, 2.0], [5.0, 5.0]];
/// let rows = array![[3.0f32, 0.0]];
/// let out = gated_mix_forward(shared.view(), rows.view(), Some(&[0.75]), &[0, u32::MAX]);
/// assert_eq!(out, array![[2.5, 0.5], [5.0, 5.0]]);
/// ```
#[track_caller]
pub fn gated_mix_forward<T: Real>(
    shared: ArrayView2<'_, T>,
    rows: ArrayView2<'_, T>,
    gate: Option<&[T]>,
    row_of: &[u32],
) -> Array2<T> {
    gated_mix_forward_in(&Pool::new(), shared, rows, gate, row_of)
}

/// [`gated_mix_forward`] into a buffer from `pool`.
///
/// **Panics** as [`gated_mix_forward`].
#[track_caller]
pub fn gated_mix_forward_in<T: Real>(
    pool: &Pool<T>,
    shared: ArrayView2<'_, T>,
    rows: ArrayView2<'_, T>,
    gate: Option<&[T]>,
    row_of: &[u32],
) -> Array2<T> {
    gated_mix_forward_stored_in(
        pool,
        shared,
        StoredView::Full(rows.into_dyn()),
        gate,
        row_of,
    )
}

/// [`gated_mix_forward_in`] on rows (n_rows, D) as they are kept: rows in
/// half precision are widened (exactly) one at a time as the tokens read
/// them, so the output equals the mix of the widened table bit for bit
/// and the table is never widened whole.
///
/// **Panics** as [`gated_mix_forward`].
#[track_caller]
pub fn gated_mix_forward_stored_in<T: Real>(
    pool: &Pool<T>,
    shared: ArrayView2<'_, T>,
    rows: StoredView<'_, T>,
    gate: Option<&[T]>,
    row_of: &[u32],
) -> Array2<T> {
    let (n, d) = shared.dim();
    assert_eq!(row_of.len(), n, "gated_mix: one row id per token");
    assert_eq!(rows.shape().len(), 2, "gated_mix: rows must be 2-D");
    assert_eq!(rows.shape()[1], d, "gated_mix: rows and shared widths");
    let shared = shared.as_standard_layout();
    let s = shared.as_slice().expect("standard layout");
    let rows = rows.table_rows();
    let mut out = pool.uninit_2d((n, d));
    if d > 0 {
        let dst = out.as_slice_mut().expect("fresh array is contiguous");
        let mix = |buf: &mut Vec<T>, (k, o): (usize, &mut [MaybeUninit<T>])| {
            let sn = &s[k * d..(k + 1) * d];
            let row = row_of[k];
            if row == NO_ROW {
                o.iter_mut().zip(sn).for_each(|(o, &v)| {
                    o.write(v);
                });
                return;
            }
            let x = rows.row(row as usize, buf);
            match gate {
                Some(g) => {
                    let g = g[row as usize];
                    o.iter_mut().zip(sn).zip(x).for_each(|((o, &s), &x)| {
                        o.write(s + g * (x - s));
                    });
                }
                None => o.iter_mut().zip(x).for_each(|(o, &x)| {
                    o.write(x);
                }),
            }
        };
        if dst.len() >= PAR_MIN_ELEMS {
            dst.par_chunks_mut(d)
                .enumerate()
                .with_min_len(MIN_TOKENS_PER_TASK)
                .for_each_init(|| rows.scratch(), mix);
        } else {
            let mut buf = rows.scratch();
            dst.chunks_mut(d)
                .enumerate()
                .for_each(|item| mix(&mut buf, item));
        }
    }
    // SAFETY: the loop above wrote every element: each of the N rows of
    // width d once (and with d = 0 there is no element).
    unsafe { out.assume_init() }
}

/// [`gated_mix_forward`] serially through `ndarray` rows: the reference
/// it is tested against, bit for bit.
///
/// ```
/// use ndarray::array;
/// use splitgrad::ops::gated_mix::gated_mix_forward_naive;
/// let out = gated_mix_forward_naive(array![[1.0f32]].view(), array![[3.0f32]].view(), None, &[0]);
/// assert_eq!(out, array![[3.0]]);
/// ```
pub fn gated_mix_forward_naive<T: Real>(
    shared: ArrayView2<'_, T>,
    rows: ArrayView2<'_, T>,
    gate: Option<&[T]>,
    row_of: &[u32],
) -> Array2<T> {
    let mut out = shared.to_owned();
    for (n, mut o) in out.outer_iter_mut().enumerate() {
        let r = row_of[n];
        if r == NO_ROW {
            continue;
        }
        let row = rows.row(r as usize);
        match gate {
            Some(g) => {
                let g = g[r as usize];
                o.zip_mut_with(&row, |s, &x| *s = *s + g * (x - *s));
            }
            None => o.assign(&row),
        }
    }
    out
}

/// Gradients of the gated mix: (∂shared, row contributions (rows, values),
/// ∂gate), each computed only when wanted.
pub type MixGrads<T> = (
    Option<ArrayD<T>>,
    Option<(Vec<usize>, ArrayD<T>)>,
    Option<ArrayD<T>>,
);

/// The gradients [`gated_mix_backward`] is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Want {
    /// ∂shared.
    pub shared: bool,
    /// ∂rows (as row contributions).
    pub rows: bool,
    /// ∂gate.
    pub gate: bool,
}

/// `∂shared_n = (1 − g_r)·∂out_n` (or ∂out_n without a row, 0 in fusion
/// mode with one); `∂rows_r += g_r·∂out_n` (∂out_n in fusion mode);
/// `∂g_r += Σ_d ∂out_nd·(rows_rd − shared_nd)`, the Σ_d as
/// `dot_diff`'s and the sum over tokens in increasing n.
///
/// shared: (N, D); rows: (n_rows, D); gate: (n_rows); gy = ∂out:
/// (N, D), taken: ∂shared is written in its place.
///
/// **Panics** if the shapes disagree.
#[track_caller]
pub fn gated_mix_backward<T: Real>(
    pool: &Pool<T>,
    row_of: &[u32],
    shared: ArrayViewD<'_, T>,
    rows: ArrayViewD<'_, T>,
    gate: Option<ArrayViewD<'_, T>>,
    gy: ArrayD<T>,
    want: Want,
) -> MixGrads<T> {
    gated_mix_backward_stored(pool, row_of, shared, StoredView::Full(rows), gate, gy, want)
}

/// [`gated_mix_backward`] on rows (n_rows, D) as they are kept: rows in
/// half precision are widened (exactly) one at a time where the gate's
/// sums read them, so the gradients equal those of the widened table bit
/// for bit and the table is never widened whole.
///
/// **Panics** as [`gated_mix_backward`].
#[track_caller]
pub fn gated_mix_backward_stored<T: Real>(
    pool: &Pool<T>,
    row_of: &[u32],
    shared: ArrayViewD<'_, T>,
    rows: StoredView<'_, T>,
    gate: Option<ArrayViewD<'_, T>>,
    gy: ArrayD<T>,
    want: Want,
) -> MixGrads<T> {
    let shared = shared.into_dimensionality::<Ix2>().expect("2-D shared");
    assert_eq!(rows.shape().len(), 2, "gated_mix: 2-D rows");
    let n_rows = rows.shape()[0];
    let (n, d) = shared.dim();
    assert_eq!(gy.shape(), &[n, d], "gated_mix: gradient shape");
    let gy = if gy.is_standard_layout() {
        gy
    } else {
        gy.as_standard_layout().into_owned()
    };
    let mut gy = gy.into_dimensionality::<Ix2>().expect("2-D gradient");
    let shared = shared.as_standard_layout();
    let rows = rows.table_rows();
    let gate: Option<Vec<T>> = gate.map(|g| g.iter().copied().collect());
    let with_row: Vec<usize> = (0..n).filter(|&k| row_of[k] != NO_ROW).collect();
    let want_gate = want.gate && gate.is_some();
    let par = n * d >= PAR_MIN_ELEMS;

    // Row contributions and the gate's per-token sums, read from ∂out
    // before it becomes ∂shared.
    let mut contrib = want.rows.then(|| pool.zeros_2d((with_row.len(), d)));
    let mut acc = vec![T::zero(); if want_gate { with_row.len() } else { 0 }];
    if d > 0 && (want.rows || want_gate) {
        let gys = gy.as_slice().expect("standard layout");
        let s = shared.as_slice().expect("standard layout");
        let one = |buf: &mut Vec<T>, j: usize, c: Option<&mut [T]>, a: Option<&mut T>| {
            let k = with_row[j];
            let row = row_of[k] as usize;
            let gyn = &gys[k * d..(k + 1) * d];
            let g = gate.as_ref().map(|g| g[row]);
            if let Some(c) = c {
                match g {
                    Some(g) => c.iter_mut().zip(gyn).for_each(|(c, &v)| *c = g * v),
                    None => c.copy_from_slice(gyn),
                }
            }
            if let Some(a) = a {
                *a = dot_diff(gyn, rows.row(row, buf), &s[k * d..(k + 1) * d]);
            }
        };
        let m = with_row.len();
        let min = MIN_TOKENS_PER_TASK;
        let scratch = || rows.scratch();
        match (contrib.as_mut(), want_gate) {
            (Some(c), true) => {
                let c = c.as_slice_mut().expect("fresh array is contiguous");
                let it = c.par_chunks_mut(d).zip(acc.par_iter_mut()).enumerate();
                if par {
                    it.with_min_len(min)
                        .for_each_init(scratch, |b, (j, (c, a))| one(b, j, Some(c), Some(a)));
                } else {
                    let mut b = scratch();
                    c.chunks_mut(d)
                        .zip(acc.iter_mut())
                        .enumerate()
                        .for_each(|(j, (c, a))| one(&mut b, j, Some(c), Some(a)));
                }
            }
            (Some(c), false) => {
                // The rows are not read: no buffer.
                let c = c.as_slice_mut().expect("fresh array is contiguous");
                if par {
                    c.par_chunks_mut(d)
                        .enumerate()
                        .with_min_len(min)
                        .for_each(|(j, c)| one(&mut Vec::new(), j, Some(c), None));
                } else {
                    c.chunks_mut(d)
                        .enumerate()
                        .for_each(|(j, c)| one(&mut Vec::new(), j, Some(c), None));
                }
            }
            (None, true) => {
                if par {
                    acc.par_iter_mut()
                        .enumerate()
                        .with_min_len(min)
                        .for_each_init(scratch, |b, (j, a)| one(b, j, None, Some(a)));
                } else {
                    let mut b = scratch();
                    (0..m)
                        .zip(acc.iter_mut())
                        .for_each(|(j, a)| one(&mut b, j, None, Some(a)));
                }
            }
            (None, false) => {}
        }
    }
    let ggate = want_gate.then(|| gate_sums(n_rows, &with_row, row_of, &acc));

    // ∂shared in place of ∂out: only the rows of tokens with a row change.
    if want.shared && d > 0 {
        let scale = |(k, o): (usize, &mut [T])| shared_grad_row(row_of[k], gate.as_deref(), o);
        let gys = gy.as_slice_mut().expect("standard layout");
        if par {
            gys.par_chunks_mut(d)
                .enumerate()
                .with_min_len(MIN_TOKENS_PER_TASK)
                .for_each(scale);
        } else {
            gys.chunks_mut(d).enumerate().for_each(scale);
        }
    }
    let gs = want.shared.then(|| gy.into_dyn());
    let ids: Vec<usize> = with_row.iter().map(|&k| row_of[k] as usize).collect();
    (gs, contrib.map(|c| (ids, c.into_dyn())), ggate)
}

/// ∂gate: the sums `acc[j]` of the tokens `with_row[j]` added into their
/// rows, in increasing token order.
fn gate_sums<T: Real>(n_rows: usize, with_row: &[usize], row_of: &[u32], acc: &[T]) -> ArrayD<T> {
    let mut gg = Array1::<T>::zeros(n_rows);
    for (&k, &a) in with_row.iter().zip(acc) {
        gg[row_of[k] as usize] += a;
    }
    gg.into_dyn()
}

/// ∂shared_n from ∂out_n (`o`), in place, for a token whose row is `row`:
/// `(1 − g_r)·∂out_n`, 0 in fusion mode (no gate), unchanged without a row.
#[inline]
fn shared_grad_row<T: Real>(row: u32, gate: Option<&[T]>, o: &mut [T]) {
    if row == NO_ROW {
        return;
    }
    match gate {
        Some(g) => {
            let keep = T::one() - g[row as usize];
            o.iter_mut().for_each(|v| *v *= keep);
        }
        None => o.fill(T::zero()),
    }
}

/// [`gated_mix_backward`] serially through `ndarray` rows, reading ∂out
/// without taking it: the reference it is tested against, bit for bit.
pub fn gated_mix_backward_naive<T: Real>(
    row_of: &[u32],
    shared: ArrayViewD<'_, T>,
    rows: ArrayViewD<'_, T>,
    gate: Option<ArrayViewD<'_, T>>,
    gy: ArrayViewD<'_, T>,
    want: Want,
) -> MixGrads<T> {
    let shared = shared.into_dimensionality::<Ix2>().expect("2-D shared");
    let rows = rows.into_dimensionality::<Ix2>().expect("2-D rows");
    let gy = gy.into_dimensionality::<Ix2>().expect("2-D gradient");
    let gate: Option<Vec<T>> = gate.map(|g| g.iter().copied().collect());
    let mut gs = want.shared.then(|| gy.to_owned());
    let mut ggate = (want.gate && gate.is_some()).then(|| Array1::<T>::zeros(rows.nrows()));
    let with_row: Vec<usize> = (0..row_of.len()).filter(|&n| row_of[n] != NO_ROW).collect();
    let mut contrib = want
        .rows
        .then(|| Array2::<T>::zeros((with_row.len(), rows.ncols())));
    for (j, &n) in with_row.iter().enumerate() {
        let r = row_of[n] as usize;
        let gyn = gy.row(n);
        match &gate {
            Some(g) => {
                let g = g[r];
                if let Some(gs) = gs.as_mut() {
                    gs.row_mut(n).mapv_inplace(|v| v * (T::one() - g));
                }
                if let Some(c) = contrib.as_mut() {
                    c.row_mut(j).zip_mut_with(&gyn, |c, &d| *c = g * d);
                }
                if let Some(gg) = ggate.as_mut() {
                    // dot_diff's order: lane d mod 8 of the full
                    // chunks, then the tail.
                    let full = gyn.len() / 8 * 8;
                    let mut lanes = [T::zero(); 8];
                    let mut tail = T::zero();
                    for (i, ((&d, &x), &s)) in
                        gyn.iter().zip(rows.row(r)).zip(shared.row(n)).enumerate()
                    {
                        if i < full {
                            lanes[i % 8] += d * (x - s);
                        } else {
                            tail += d * (x - s);
                        }
                    }
                    gg[r] += fold_lanes(lanes) + tail;
                }
            }
            None => {
                if let Some(gs) = gs.as_mut() {
                    gs.row_mut(n).fill(T::zero());
                }
                if let Some(c) = contrib.as_mut() {
                    c.row_mut(j).assign(&gyn);
                }
            }
        }
    }
    let ids: Vec<usize> = with_row.iter().map(|&n| row_of[n] as usize).collect();
    (
        gs.map(|a| a.into_dyn()),
        contrib.map(|c| (ids, c.into_dyn())),
        ggate.map(|a| a.into_dyn()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;
    use ndarray::{Array1, Array2};

    struct Case {
        shared: Array2<f32>,
        rows: Array2<f32>,
        gate: Array1<f32>,
        gy: Array2<f32>,
        row_of: Vec<u32>,
    }

    /// n tokens, about a third with a row (rows repeat), D = `width`.
    fn case(seed: u64, n: usize, n_rows: usize, width: usize) -> Case {
        let mut rng = Rng::new(seed);
        let mut normal =
            |shape: (usize, usize)| Array2::from_shape_simple_fn(shape, || rng.normal() as f32);
        let (shared, rows, gy) = (
            normal((n, width)),
            normal((n_rows, width)),
            normal((n, width)),
        );
        let mut rng = Rng::new(seed + 100);
        let gate = (0..n_rows).map(|_| rng.uniform() as f32).collect();
        let row_of = (0..n)
            .map(|_| match rng.below(3) {
                0 => rng.below(n_rows as u64) as u32,
                _ => NO_ROW,
            })
            .collect();
        Case {
            shared,
            rows,
            gate,
            gy,
            row_of,
        }
    }

    fn bits(a: Option<ArrayD<f32>>) -> Option<Vec<u32>> {
        a.map(|a| a.iter().map(|v| v.to_bits()).collect())
    }

    #[test]
    fn forward_equals_the_naive_twin_bit_for_bit() {
        for (n, width) in [(5000, 33), (40, 8), (3, 0)] {
            let c = case(1, n, 50, width);
            for gate in [Some(c.gate.as_slice().unwrap()), None] {
                let want = gated_mix_forward_naive(c.shared.view(), c.rows.view(), gate, &c.row_of);
                for threads in [1, 2, 4] {
                    let pool = crate::kernels::threads(threads);
                    let got = pool.install(|| {
                        gated_mix_forward(c.shared.view(), c.rows.view(), gate, &c.row_of)
                    });
                    assert_eq!(
                        bits(Some(got.into_dyn())),
                        bits(Some(want.clone().into_dyn()))
                    );
                }
            }
        }
    }

    #[test]
    fn backward_equals_the_naive_twin_bit_for_bit() {
        for (n, width) in [(5000, 37), (40, 8)] {
            let c = case(2, n, 60, width);
            let gate = c.gate.view().into_dyn();
            for use_gate in [true, false] {
                for (shared, rows, g) in [
                    (true, true, true),
                    (false, true, false),
                    (true, false, true),
                    (false, false, true),
                ] {
                    let want = Want {
                        shared,
                        rows,
                        gate: g,
                    };
                    let gate = use_gate.then_some(gate.view());
                    let (s0, r0, g0) = gated_mix_backward_naive(
                        &c.row_of,
                        c.shared.view().into_dyn(),
                        c.rows.view().into_dyn(),
                        gate.clone(),
                        c.gy.view().into_dyn(),
                        want,
                    );
                    for threads in [1, 2, 4] {
                        let pool = crate::kernels::threads(threads);
                        let (s1, r1, g1) = pool.install(|| {
                            gated_mix_backward(
                                &crate::kernels::pool::Pool::new(),
                                &c.row_of,
                                c.shared.view().into_dyn(),
                                c.rows.view().into_dyn(),
                                gate.clone(),
                                c.gy.clone().into_dyn(),
                                want,
                            )
                        });
                        let what = format!("n {n}, gate {use_gate}, {threads} threads");
                        assert_eq!(bits(s1), bits(s0.clone()), "∂shared, {what}");
                        assert_eq!(bits(g1), bits(g0.clone()), "∂gate, {what}");
                        let (ids1, v1) = r1.map_or((vec![], None), |(i, v)| (i, Some(v)));
                        let (ids0, v0) = r0.clone().map_or((vec![], None), |(i, v)| (i, Some(v)));
                        assert_eq!(ids1, ids0, "row ids, {what}");
                        assert_eq!(bits(v1), bits(v0), "∂rows, {what}");
                    }
                }
            }
        }
    }

    /// A table rounded to bf16 and to f16 (through the software
    /// conversions), each with its widened f32 twin.
    fn half_tables(rows: &Array2<f32>) -> Vec<(Stored<f32>, Array2<f32>)> {
        use crate::kernels::half::widen_naive;
        let wide = |h: &[f32]| Array2::from_shape_vec(rows.raw_dim(), h.to_vec()).unwrap();
        let src = rows.as_slice().unwrap();
        let bf: Vec<half::bf16> = src.iter().map(|&x| half::bf16::from_f32_const(x)).collect();
        let f: Vec<half::f16> = src.iter().map(|&x| half::f16::from_f32_const(x)).collect();
        let mut wb = vec![0f32; src.len()];
        widen_naive(&bf, &mut wb);
        let mut wf = vec![0f32; src.len()];
        widen_naive(&f, &mut wf);
        let dim = ndarray::IxDyn(rows.shape());
        vec![
            (
                Stored::BF16(ArrayD::from_shape_vec(dim.clone(), bf).unwrap()),
                wide(&wb),
            ),
            (
                Stored::F16(ArrayD::from_shape_vec(dim, f).unwrap()),
                wide(&wf),
            ),
        ]
    }

    use crate::param::Stored;

    #[test]
    fn half_rows_equal_the_naive_twin_on_the_widened_rows() {
        for (n, width) in [(5000, 37), (40, 8), (3, 0)] {
            let c = case(3, n, 50, width);
            for (stored, wide) in half_tables(&c.rows) {
                let gate = c.gate.view().into_dyn();
                for use_gate in [true, false] {
                    let g = use_gate.then(|| c.gate.as_slice().unwrap());
                    let want = gated_mix_forward_naive(c.shared.view(), wide.view(), g, &c.row_of);
                    let want_b = Want {
                        shared: true,
                        rows: true,
                        gate: true,
                    };
                    let gv = use_gate.then_some(gate.view());
                    let (s0, r0, g0) = gated_mix_backward_naive(
                        &c.row_of,
                        c.shared.view().into_dyn(),
                        wide.view().into_dyn(),
                        gv.clone(),
                        c.gy.view().into_dyn(),
                        want_b,
                    );
                    for threads in [1, 2, 4] {
                        let pool = crate::kernels::threads(threads);
                        let what = format!(
                            "{:?}, n {n}, gate {use_gate}, {threads} threads",
                            stored.dtype()
                        );
                        let got = pool.install(|| {
                            gated_mix_forward_stored_in(
                                &Pool::new(),
                                c.shared.view(),
                                stored.view(),
                                g,
                                &c.row_of,
                            )
                        });
                        assert_eq!(
                            bits(Some(got.into_dyn())),
                            bits(Some(want.clone().into_dyn())),
                            "forward, {what}"
                        );
                        let (s1, r1, g1) = pool.install(|| {
                            gated_mix_backward_stored(
                                &Pool::new(),
                                &c.row_of,
                                c.shared.view().into_dyn(),
                                stored.view(),
                                gv.clone(),
                                c.gy.clone().into_dyn(),
                                want_b,
                            )
                        });
                        assert_eq!(bits(s1), bits(s0.clone()), "∂shared, {what}");
                        assert_eq!(bits(g1), bits(g0.clone()), "∂gate, {what}");
                        let (ids1, v1) = r1.map_or((vec![], None), |(i, v)| (i, Some(v)));
                        let (ids0, v0) = r0.clone().map_or((vec![], None), |(i, v)| (i, Some(v)));
                        assert_eq!(ids1, ids0, "row ids, {what}");
                        assert_eq!(bits(v1), bits(v0), "∂rows, {what}");
                    }
                }
            }
        }
    }
}
