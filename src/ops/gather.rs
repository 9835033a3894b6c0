//! Row gather (embedding lookup): `out[i] = table[ids[i]]`.
//!
//! Backward is a scatter-add: `∂table[r] += Σ_{i : ids[i] = r} ∂out[i]`.
//! When the table is a 2-D parameter the tape keeps the contributions
//! row-sparse and coalesces them with [`super::scatter::coalesce_rows`];
//! otherwise [`gather_backward`] adds them into a dense buffer.
//! Derivation: `docs/gradients.md#gather`.

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn};
use rayon::prelude::*;

use super::routing::Routed;
use crate::Real;
use crate::tape::{Op, Tape, Var};

/// `out[i, …] = table[ids[i], …]`.
///
/// table: (R, …), ids: (n) → out: (n, …).
///
/// **Panics** if an id is ≥ R.
#[track_caller]
pub fn gather_forward<T: Real>(table: ArrayViewD<'_, T>, ids: &[usize]) -> ArrayD<T> {
    assert!(
        table.ndim() >= 1,
        "gather: the table must have at least one axis"
    );
    let n_rows = table.shape()[0];
    if let Some(&bad) = ids.iter().find(|&&i| i >= n_rows) {
        panic!("gather: id {bad} is out of range 0..{n_rows}");
    }
    let mut shape = table.shape().to_vec();
    shape[0] = ids.len();
    let width: usize = shape[1..].iter().product();
    match table.as_slice() {
        Some(src) => rows_from(&shape, width, |i| {
            &src[ids[i] * width..(ids[i] + 1) * width]
        }),
        None => {
            let mut out = ArrayD::<T>::zeros(IxDyn(&shape));
            for (mut o, &id) in out.axis_iter_mut(Axis(0)).zip(ids) {
                o.assign(&table.index_axis(Axis(0), id));
            }
            out
        }
    }
}

/// A standard-layout array of `shape` whose i-th row of `width` elements is
/// `row(i)`: each element written once, with no zero-fill first, rows in
/// parallel when the array is large.
///
/// **Panics** if a row does not have `width` elements or `shape` does not
/// hold `shape[0]` rows of `width`.
#[track_caller]
pub(crate) fn rows_from<'a, T: Real, F>(shape: &[usize], width: usize, row: F) -> ArrayD<T>
where
    F: Fn(usize) -> &'a [T] + Sync,
{
    let n = shape.first().copied().unwrap_or(1);
    assert_eq!(
        shape.iter().product::<usize>(),
        n * width,
        "rows_from: shape {shape:?} does not hold {n} rows of {width}"
    );
    if width == 0 || n == 0 {
        return ArrayD::zeros(IxDyn(shape));
    }
    let mut out = ArrayD::<T>::uninit(IxDyn(shape));
    let dst = out.as_slice_mut().expect("fresh array is contiguous");
    let streaming = super::stream::use_streaming(std::mem::size_of_val(dst));
    // Blocks of rows per task, each ending with the fence its streaming
    // stores need before the array is handed on.
    let rows_per_task = (super::PAR_MIN_ELEMS / width).max(1);
    let block = |(b, o): (usize, &mut [std::mem::MaybeUninit<T>])| {
        for (i, o) in o.chunks_mut(width).enumerate() {
            let i = b * rows_per_task + i;
            let src = row(i);
            assert_eq!(
                src.len(),
                width,
                "rows_from: row {i} has {} elements",
                src.len()
            );
            super::stream::copy(o, src, streaming);
        }
        if streaming {
            super::stream::fence();
        }
    };
    if dst.len() >= super::PAR_MIN_ELEMS {
        dst.par_chunks_mut(rows_per_task * width)
            .enumerate()
            .for_each(block);
    } else {
        dst.chunks_mut(rows_per_task * width)
            .enumerate()
            .for_each(block);
    }
    // SAFETY: `dst` is the whole array, cut into `n` chunks of `width`; the
    // loop above wrote every element of every chunk (each `src` has `width`
    // elements, checked), so every element is initialised.
    unsafe { out.assume_init() }
}

/// `g[ids[i]] += gy[i]` for every i, in order (a dense scatter-add).
///
/// ids: (n), gy: (n, …), g: (R, …).
pub fn gather_backward<T: Real>(ids: &[usize], gy: ArrayViewD<'_, T>, g: &mut ArrayD<T>) {
    for (row, &id) in gy.axis_iter(Axis(0)).zip(ids) {
        let mut dst = g.index_axis_mut(Axis(0), id);
        dst += &row;
    }
}

impl<'p, T: Real> Tape<'p, T> {
    /// Gathers rows: `out[i] = table[ids[i]]`.
    ///
    /// table: (R, …), ids: (n) → (n, …). Repeated ids are allowed; their
    /// gradients add up. A 2-D parameter table gets a row-sparse gradient.
    ///
    /// **Panics** if an id is ≥ R (layers check ids first and return an
    /// [`Error`](crate::Error)).
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut tape = Tape::<f64>::new();
    /// let t = tape.input(array![[1.0, 2.0], [3.0, 4.0]].into_dyn());
    /// let g = tape.gather(t, &[1, 0, 1]);
    /// assert_eq!(tape.value(g), array![[3.0, 4.0], [1.0, 2.0], [3.0, 4.0]].into_dyn());
    /// ```
    #[track_caller]
    pub fn gather(&mut self, table: Var, ids: &[usize]) -> Var {
        let out = gather_forward(self.value(table), ids);
        self.push(
            out,
            Op::Gather {
                table,
                ids: ids.to_vec(),
            },
            &[table],
        )
    }
}

/// `out[n] = table_{k(n)}[local(n)]`: each id read from the split that
/// owns it. tables: (size_k, H) each, routed: N ids → (N, H), reshaped to
/// `(*ids_shape, H)`.
///
/// **Panics** if the tables are not 2-D of one width, a local row is out of
/// range, or `ids_shape` does not hold N ids.
#[track_caller]
pub fn split_gather_forward<T: Real>(
    tables: &[ArrayViewD<'_, T>],
    routed: &Routed,
    ids_shape: &[usize],
) -> ArrayD<T> {
    let n = routed.n_ids();
    assert_eq!(
        ids_shape.iter().product::<usize>(),
        n,
        "split_gather: shape {ids_shape:?} does not hold {n} ids"
    );
    assert_eq!(
        tables.len(),
        routed.positions.len(),
        "split_gather: {} tables for {} splits",
        tables.len(),
        routed.positions.len()
    );
    let width = tables
        .first()
        .map_or(0, |t| t.shape().get(1).copied().unwrap_or(0));
    let flat: Vec<ndarray::ArrayView2<'_, T>> = tables
        .iter()
        .map(|t| {
            t.view()
                .into_dimensionality::<ndarray::Ix2>()
                .expect("split_gather: tables must be 2-D")
        })
        .collect();
    for (k, t) in flat.iter().enumerate() {
        assert_eq!(
            t.ncols(),
            width,
            "split_gather: table {k} has width {}, expected {width}",
            t.ncols()
        );
        if let Some(&bad) = routed.local[k].iter().find(|&&l| l >= t.nrows()) {
            panic!(
                "split_gather: row {bad} is out of range 0..{} of table {k}",
                t.nrows()
            );
        }
    }
    let mut shape = ids_shape.to_vec();
    shape.push(width);
    let owners = routed.owners();
    let flat_tables: Option<Vec<&[T]>> = flat.iter().map(|t| t.to_slice()).collect();
    if let Some(srcs) = flat_tables {
        let out = rows_from(&[n, width], width, |i| {
            let (k, l) = owners[i];
            &srcs[k][l * width..(l + 1) * width]
        });
        return out
            .into_shape_with_order(IxDyn(&shape))
            .expect("standard layout reshapes");
    }
    let mut out = ArrayD::<T>::zeros(IxDyn(&shape));
    if width == 0 || n == 0 {
        return out;
    }
    let dst = out.as_slice_mut().expect("fresh array is contiguous");
    for (o, &(k, l)) in dst.chunks_mut(width).zip(&owners) {
        o.iter_mut()
            .zip(flat[k].row(l).iter())
            .for_each(|(d, &s)| *d = s);
    }
    out
}

impl<'p, T: Real> Tape<'p, T> {
    /// Gathers each id's row from the split that owns it (the routed form of
    /// [`Tape::gather`]): `out[n] = tables[k(n)][local(n)]`.
    ///
    /// tables: (size_k, H) each; `routed` from
    /// [`SplitRouting::route_all`](super::routing::SplitRouting::route_all)
    /// → `(*ids_shape, H)`. A token routed to split k sends gradient to split
    /// k only; a 2-D parameter table gets a row-sparse gradient.
    ///
    /// **Panics** if the tables disagree with the routing (a caller bug).
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::{ops::routing::SplitRouting, Tape};
    /// let mut t = Tape::<f64>::new();
    /// let a = t.input(array![[1.0], [2.0]].into_dyn());
    /// let b = t.input(array![[30.0]].into_dyn());
    /// let routed = SplitRouting::new(&[2, 1]).route_all(&[2, 0, 1, 2])?;
    /// let y = t.split_gather(&[a, b], &routed, &[2, 2]);
    /// assert_eq!(t.value(y), array![[[30.0], [1.0]], [[2.0], [30.0]]].into_dyn());
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    #[track_caller]
    pub fn split_gather(&mut self, tables: &[Var], routed: &Routed, ids_shape: &[usize]) -> Var {
        let views: Vec<ArrayViewD<'_, T>> = tables.iter().map(|&t| self.value(t)).collect();
        let out = split_gather_forward(&views, routed, ids_shape);
        self.push(
            out,
            Op::SplitGather {
                tables: tables.to_vec(),
                routed: routed.clone(),
            },
            tables,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn hand_case_repeated_ids_accumulate() {
        // out = [t1, t0, t1]; ∂t0 = gy[1], ∂t1 = gy[0] + gy[2].
        let gy = array![[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]].into_dyn();
        let mut g = ArrayD::<f64>::zeros(IxDyn(&[3, 2]));
        gather_backward(&[1, 0, 1], gy.view(), &mut g);
        assert_eq!(
            g,
            array![[10.0, 20.0], [101.0, 202.0], [0.0, 0.0]].into_dyn()
        );
    }

    #[test]
    fn one_dimensional_table() {
        let t = array![5.0f32, 6.0, 7.0].into_dyn();
        assert_eq!(
            gather_forward(t.view(), &[2, 2, 0]),
            array![7.0f32, 7.0, 5.0].into_dyn()
        );
    }

    #[test]
    #[should_panic(expected = "id 3 is out of range 0..3")]
    fn out_of_range_panics() {
        let t = array![[1.0f64], [2.0], [3.0]].into_dyn();
        gather_forward(t.view(), &[3]);
    }
}
