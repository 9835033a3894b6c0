//! Row copies and row scatter-adds: the bodies of a gather and of its
//! dense backward.
//!
//! [`rows_from`] writes each element of its output once, with no zero-fill
//! first, rows in parallel when the array is large and with streaming
//! stores from 4 MiB (`kernels::stream`). [`TableRows`] reads the rows of
//! a table kept in half precision one at a time, widened, for the kernels
//! that would otherwise need the whole table widened first.

use std::borrow::Cow;

use half::{bf16, f16};
use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn};
use rayon::prelude::*;

use super::Real;
use super::pool::Pool;

/// The rows of a 2-D table as it is kept, in row-major order: at the
/// engine's precision (read in place), or in bf16/f16, each row widened
/// exactly into a caller's buffer as it is read. A kernel on `TableRows`
/// computes on the same values, bit for bit, as on the widened table.
///
/// ```
/// use half::bf16;
/// use ndarray::array;
/// use splitgrad::kernels::rows::{TableRows, row_major};
/// let t = array![[bf16::from_f32(1.5), bf16::ONE], [bf16::ZERO, bf16::from_f32(-2.0)]].into_dyn();
/// let rows = TableRows::<f32>::BF16(row_major(&t.view()), 2);
/// let mut buf = rows.scratch();
/// assert_eq!(rows.row(1, &mut buf), &[0.0, -2.0]);
/// ```
#[derive(Clone, Debug)]
pub enum TableRows<'a, T: Clone> {
    /// At the engine's precision.
    Full(Cow<'a, [T]>, usize),
    /// bfloat16, and the width.
    BF16(Cow<'a, [bf16]>, usize),
    /// IEEE half, and the width.
    F16(Cow<'a, [f16]>, usize),
}

/// One row of a table as it is kept, read-only: at the engine's precision,
/// or in bf16/f16 (widened exactly when read). A row that an update is
/// about to move, lent to the code that forms its gradient
/// ([`BlockGradient`](crate::param::BlockGradient)).
///
/// ```
/// use half::bf16;
/// use splitgrad::kernels::rows::KeptRow;
/// let bits = [bf16::from_f32(1.5), bf16::from_f32(-2.0)];
/// let row = KeptRow::<f32>::BF16(&bits);
/// let mut out = [0.0f32; 2];
/// row.widen_into(&mut out);
/// assert_eq!((out, row.len(), row.all_finite()), ([1.5, -2.0], 2, true));
/// ```
#[derive(Clone, Copy, Debug)]
pub enum KeptRow<'a, T> {
    /// At the engine's precision.
    Full(&'a [T]),
    /// bfloat16.
    BF16(&'a [bf16]),
    /// IEEE half.
    F16(&'a [f16]),
}

impl<'a, T: Real> KeptRow<'a, T> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            KeptRow::Full(s) => s.len(),
            KeptRow::BF16(s) => s.len(),
            KeptRow::F16(s) => s.len(),
        }
    }

    /// Whether it has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The row widened (exactly), or copied, into `out`.
    ///
    /// **Panics** if `out` is not as long.
    #[inline]
    #[track_caller]
    pub fn widen_into(&self, out: &mut [T]) {
        match self {
            KeptRow::Full(s) => out.copy_from_slice(s),
            KeptRow::BF16(s) => T::widen_half(s, out),
            KeptRow::F16(s) => T::widen_half(s, out),
        }
    }

    /// The row: borrowed in place, or widened into `buf` (at least a row
    /// long).
    ///
    /// **Panics** if `buf` is shorter than a row kept in half precision.
    #[inline]
    #[track_caller]
    pub fn read<'b>(&self, buf: &'b mut [T]) -> &'b [T]
    where
        'a: 'b,
    {
        match *self {
            KeptRow::Full(s) => s,
            KeptRow::BF16(s) => {
                T::widen_half(s, &mut buf[..s.len()]);
                &buf[..s.len()]
            }
            KeptRow::F16(s) => {
                T::widen_half(s, &mut buf[..s.len()]);
                &buf[..s.len()]
            }
        }
    }

    /// Whether every element is finite, read from the bits in half
    /// precision (no widening).
    pub fn all_finite(&self) -> bool {
        match self {
            KeptRow::Full(s) => s.iter().all(|x| x.is_finite()),
            KeptRow::BF16(s) => super::half::first_non_finite(s).is_none(),
            KeptRow::F16(s) => super::half::first_non_finite(s).is_none(),
        }
    }
}

/// A view's elements in row-major order: borrowed, or copied when the
/// view has other strides.
pub fn row_major<'a, E: Clone>(a: &ArrayViewD<'a, E>) -> Cow<'a, [E]> {
    match a.to_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(a.iter().cloned().collect()),
    }
}

impl<'a, T: Real> TableRows<'a, T> {
    /// The width of a row.
    pub fn width(&self) -> usize {
        match self {
            TableRows::Full(_, w) | TableRows::BF16(_, w) | TableRows::F16(_, w) => *w,
        }
    }

    /// Whether the rows are kept in half precision.
    pub fn is_half(&self) -> bool {
        !matches!(self, TableRows::Full(..))
    }

    /// A buffer for [`Self::row`]: one row's width for half-precision rows,
    /// empty (no allocation) for rows read in place.
    pub fn scratch(&self) -> Vec<T> {
        if self.is_half() {
            vec![T::zero(); self.width()]
        } else {
            Vec::new()
        }
    }

    /// Row i: borrowed in place, or widened into `buf` (from
    /// [`Self::scratch`]).
    ///
    /// **Panics** if i is out of range or `buf` is shorter than a row of
    /// half-precision rows.
    #[inline]
    #[track_caller]
    pub fn row<'b>(&'b self, i: usize, buf: &'b mut [T]) -> &'b [T] {
        self.kept(i).read(buf)
    }

    /// Row i widened (or copied) into `out`, a row long.
    ///
    /// **Panics** if i is out of range or `out` is not a row long.
    #[inline]
    #[track_caller]
    pub fn row_into(&self, i: usize, out: &mut [T]) {
        self.kept(i).widen_into(out)
    }

    /// Row i as it is kept.
    ///
    /// **Panics** if i is out of range.
    #[inline]
    #[track_caller]
    pub fn kept(&self, i: usize) -> KeptRow<'_, T> {
        let w = self.width();
        match self {
            TableRows::Full(a, _) => KeptRow::Full(&a[i * w..(i + 1) * w]),
            TableRows::BF16(a, _) => KeptRow::BF16(&a[i * w..(i + 1) * w]),
            TableRows::F16(a, _) => KeptRow::F16(&a[i * w..(i + 1) * w]),
        }
    }

    /// A hint to load rows `ids` into the cache (every line of each), for
    /// a caller that reads them next.
    #[inline]
    pub fn prefetch_rows(&self, ids: &[usize]) {
        fn lines<E>(a: &[E], w: usize, ids: &[usize]) {
            let step = (64 / std::mem::size_of::<E>()).max(1);
            for &i in ids {
                let row = a.as_ptr().wrapping_add(i * w);
                for k in (0..w).step_by(step) {
                    super::scatter::prefetch(row.wrapping_add(k));
                }
            }
        }
        match self {
            TableRows::Full(a, w) => lines(a, *w, ids),
            TableRows::BF16(a, w) => lines(a, *w, ids),
            TableRows::F16(a, w) => lines(a, *w, ids),
        }
    }

    /// Rows `ids`, widened (or copied), one after the other into `out`,
    /// which is resized to `ids.len()` rows.
    ///
    /// **Panics** if an id is out of range.
    #[track_caller]
    pub fn rows_into(&self, ids: &[usize], out: &mut Vec<T>) {
        let w = self.width();
        out.resize(ids.len() * w, T::zero());
        for (o, &i) in out.chunks_exact_mut(w.max(1)).zip(ids) {
            self.row_into(i, o);
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
pub fn rows_from<'a, T: Real, F>(shape: &[usize], width: usize, row: F) -> ArrayD<T>
where
    F: Fn(usize) -> &'a [T] + Sync,
{
    rows_from_in(&Pool::new(), shape, width, row)
}

/// [`rows_from`] into a buffer from `pool`.
///
/// **Panics** as [`rows_from`].
#[track_caller]
pub fn rows_from_in<'a, T: Real, F>(
    pool: &Pool<T>,
    shape: &[usize],
    width: usize,
    row: F,
) -> ArrayD<T>
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
    let mut out = pool.uninit(shape);
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
pub fn scatter_add_rows<T: Real>(ids: &[usize], gy: ArrayViewD<'_, T>, g: &mut ArrayD<T>) {
    for (row, &id) in gy.axis_iter(Axis(0)).zip(ids) {
        let mut dst = g.index_axis_mut(Axis(0), id);
        dst += &row;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn hand_case_repeated_ids_accumulate() {
        // Rows [1, 0, 1] scattered: g0 = gy[1], g1 = gy[0] + gy[2].
        let gy = array![[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]].into_dyn();
        let mut g = ArrayD::<f64>::zeros(IxDyn(&[3, 2]));
        scatter_add_rows(&[1, 0, 1], gy.view(), &mut g);
        assert_eq!(
            g,
            array![[10.0, 20.0], [101.0, 202.0], [0.0, 0.0]].into_dyn()
        );
    }

    #[test]
    fn rows_from_writes_every_row() {
        let src = [1.0f32, 2.0, 3.0, 4.0];
        let out = rows_from(&[3, 2], 2, |i| &src[(i % 2) * 2..(i % 2) * 2 + 2]);
        assert_eq!(
            out,
            array![[1.0f32, 2.0], [3.0, 4.0], [1.0, 2.0]].into_dyn()
        );
    }
}
