//! Routed gather: each id read from the split that owns it,
//! `out[n] = table_{k(n)}[local(n)]`.
//!
//! Backward sends each row of `∂out` to its owner's row and nowhere else
//! ([`split_gather_backward`]): split k receives the rows of the tokens
//! routed to it, read in place from `∂out` (or from a lazy `c·R`). A
//! frozen split gets nothing. Derivation: `docs/gradients.md#split-routing`.

use std::borrow::Cow;
use std::mem::MaybeUninit;
use std::rc::Rc;

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use crate::kernels::HalfFloat;
use crate::kernels::Real;
use crate::kernels::pool::Pool;
use crate::kernels::routing::Routed;
use crate::kernels::rows::{row_major, rows_from_in};
use crate::param::StoredView;
use crate::tape::{Flow, RowPart, Tape, Var};
use rayon::prelude::*;

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
    split_gather_forward_in(&Pool::new(), tables, routed, ids_shape)
}

/// [`split_gather_forward`] into a buffer from `pool`.
///
/// **Panics** as [`split_gather_forward`].
#[track_caller]
pub fn split_gather_forward_in<T: Real>(
    pool: &Pool<T>,
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
        let out = rows_from_in(pool, &[n, width], width, |i| {
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

/// [`split_gather_forward_in`] on tables kept as they are
/// ([`StoredView`]): a table kept in half precision has its rows widened
/// (exactly) as they are read, so the output is `T` and equals the gather
/// of the widened tables bit for bit.
///
/// **Panics** as [`split_gather_forward`].
#[track_caller]
pub fn split_gather_stored_in<T: Real>(
    pool: &Pool<T>,
    tables: &[StoredView<'_, T>],
    routed: &Routed,
    ids_shape: &[usize],
) -> ArrayD<T> {
    let full: Option<Vec<ArrayViewD<'_, T>>> = tables
        .iter()
        .map(|t| match t {
            StoredView::Full(a) => Some(a.view()),
            _ => None,
        })
        .collect();
    if let Some(full) = full {
        return split_gather_forward_in(pool, &full, routed, ids_shape);
    }
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
    let flat: Vec<Rows<'_, T>> = tables
        .iter()
        .enumerate()
        .map(|(k, t)| {
            assert!(
                t.shape().len() == 2 && t.shape()[1] == width,
                "split_gather: table {k} has shape {:?}, expected (rows, {width})",
                t.shape()
            );
            if let Some(&bad) = routed.local[k].iter().find(|&&l| l >= t.shape()[0]) {
                panic!(
                    "split_gather: row {bad} is out of range 0..{} of table {k}",
                    t.shape()[0]
                );
            }
            Rows::of(t)
        })
        .collect();
    let mut shape = ids_shape.to_vec();
    shape.push(width);
    if width == 0 || n == 0 {
        return ArrayD::zeros(IxDyn(&shape));
    }
    // Written once, with no zero-fill first: every row is widened (or
    // copied) into its place.
    let mut out = pool.uninit(&[n, width]);
    let owners = routed.owners();
    let dst = out.as_slice_mut().expect("fresh array is contiguous");
    let rows_per_task = (crate::kernels::PAR_MIN_ELEMS / width).max(1);
    dst.par_chunks_mut(rows_per_task * width)
        .enumerate()
        .for_each(|(b, block)| {
            for (i, o) in block.chunks_mut(width).enumerate() {
                let (k, l) = owners[b * rows_per_task + i];
                let span = l * width..(l + 1) * width;
                match &flat[k] {
                    Rows::Full(a) => write_row(o, &a[span]),
                    Rows::BF16(a) => widen_row(o, &a[span]),
                    Rows::F16(a) => widen_row(o, &a[span]),
                }
            }
        });
    // SAFETY: the n rows of `width` were each written whole just above.
    unsafe { out.assume_init() }
        .into_shape_with_order(IxDyn(&shape))
        .expect("standard layout reshapes")
}

/// `o = src`, every element written.
fn write_row<T: Copy>(o: &mut [MaybeUninit<T>], src: &[T]) {
    o.iter_mut().zip(src).for_each(|(o, &x)| {
        o.write(x);
    });
}

/// `o = src` widened (exactly), every element written, through a buffer
/// in L1.
fn widen_row<T: Real, H: HalfFloat>(o: &mut [MaybeUninit<T>], src: &[H]) {
    const STEP: usize = 256;
    let mut buf = [T::zero(); STEP];
    for (o, s) in o.chunks_mut(STEP).zip(src.chunks(STEP)) {
        let b = &mut buf[..s.len()];
        T::widen_half(s, b);
        write_row(o, b);
    }
}

/// The gather of tables all kept in the half-precision type `H` into an
/// output of `H`: each row copied bit for bit, so the output is the f32
/// gather of the widened tables rounded once to `H` (exactly, since every
/// value is representable). The output buffer comes from `pool`.
///
/// **Panics** as [`split_gather_forward`].
#[track_caller]
pub fn split_gather_half_in<T: Real, H: HalfFloat>(
    pool: &Pool<T>,
    tables: &[ArrayViewD<'_, H>],
    routed: &Routed,
    ids_shape: &[usize],
) -> ArrayD<H> {
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
    let flat: Vec<Cow<'_, [H]>> = tables
        .iter()
        .enumerate()
        .map(|(k, t)| {
            assert!(
                t.ndim() == 2 && t.shape()[1] == width,
                "split_gather: table {k} has shape {:?}, expected (rows, {width})",
                t.shape()
            );
            if let Some(&bad) = routed.local[k].iter().find(|&&l| l >= t.shape()[0]) {
                panic!(
                    "split_gather: row {bad} is out of range 0..{} of table {k}",
                    t.shape()[0]
                );
            }
            row_major(t)
        })
        .collect();
    let mut shape = ids_shape.to_vec();
    shape.push(width);
    let mut out = pool.take_half_vec::<H>(n * width);
    if width > 0 && n > 0 {
        let owners = routed.owners();
        let spare = &mut out.spare_capacity_mut()[..n * width];
        let rows_per_task = (crate::kernels::PAR_MIN_ELEMS / width).max(1);
        spare
            .par_chunks_mut(rows_per_task * width)
            .enumerate()
            .for_each(|(b, block)| {
                for (i, o) in block.chunks_mut(width).enumerate() {
                    let (k, l) = owners[b * rows_per_task + i];
                    let src = &flat[k][l * width..(l + 1) * width];
                    o.iter_mut().zip(src).for_each(|(o, &x)| {
                        o.write(x);
                    });
                }
            });
        // SAFETY: the n·width elements were all written just above (every
        // row of every block; the blocks cover the first n·width slots).
        unsafe { out.set_len(n * width) };
    }
    ArrayD::from_shape_vec(IxDyn(&shape), out).expect("one element per index")
}

/// A table's elements in row-major order: borrowed, or copied when the
/// view has other strides.
enum Rows<'a, T: Clone> {
    Full(Cow<'a, [T]>),
    BF16(Cow<'a, [half::bf16]>),
    F16(Cow<'a, [half::f16]>),
}

impl<'a, T: Real> Rows<'a, T> {
    fn of(t: &StoredView<'a, T>) -> Self {
        match t {
            StoredView::Full(a) => Rows::Full(row_major(a)),
            StoredView::BF16(a) => Rows::BF16(row_major(a)),
            StoredView::F16(a) => Rows::F16(row_major(a)),
        }
    }
}

/// Row n of `gy` for row `local(n)` of split `k(n)`'s table: one
/// [`RowPart`] for each split k that was routed a token, `(k, part)`, all
/// reading the same `gy` in place.
pub fn split_gather_backward<'a, T: Real>(
    routed: &'a Routed,
    gy: Flow<'a, T>,
) -> impl Iterator<Item = (usize, RowPart<'a, T>)> {
    let src = Rc::new(gy);
    (0..routed.positions.len())
        .filter(|&k| !routed.positions[k].is_empty())
        .map(move |k| {
            let (ids, rows) = (&routed.local[k], &routed.positions[k]);
            (
                k,
                RowPart::routed(ids, rows, routed.n_ids(), Rc::clone(&src)),
            )
        })
}

/// The saved state of `split_gather`: the tables and the routing.
struct SplitGather {
    tables: Vec<Var>,
    routed: Routed,
}

backward!(SplitGather, |s, _y, gy, grads| {
    // A split that wants no gradient (a frozen one) declines its part.
    for (k, part) in split_gather_backward(&s.routed, gy) {
        grads.add_rows(s.tables[k], part);
    }
});

impl<'p, T: Real> Tape<'p, T> {
    /// Gathers each id's row from the split that owns it (the routed form of
    /// [`Tape::gather`]): `out[n] = tables[k(n)][local(n)]`.
    ///
    /// tables: (size_k, H) each; `routed` from
    /// [`SplitRouting::route_all`](crate::kernels::routing::SplitRouting::route_all)
    /// → `(*ids_shape, H)`. A token routed to split k sends gradient to split
    /// k only; a 2-D parameter table gets a row-sparse gradient.
    ///
    /// **Panics** if the tables disagree with the routing (a caller bug).
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::{kernels::routing::SplitRouting, Tape};
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
        let views: Vec<StoredView<'_, T>> = tables.iter().map(|&t| self.stored_value(t)).collect();
        let out = split_gather_stored_in(self.pool(), &views, routed, ids_shape);
        self.push_op_with(out, tables, || SplitGather {
            tables: tables.to_vec(),
            routed: routed.clone(),
        })
    }
}
