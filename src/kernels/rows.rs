//! Row copies and row scatter-adds: the bodies of a gather and of its
//! dense backward.
//!
//! [`rows_from`] writes each element of its output once, with no zero-fill
//! first, rows in parallel when the array is large and with streaming
//! stores from 4 MiB (`kernels::stream`).

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn};
use rayon::prelude::*;

use super::Real;
use super::pool::Pool;

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
