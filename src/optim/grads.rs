//! What an optimiser checks of a gradient against its parameter, the
//! gradients given by rows written out (the defaults of
//! `Optimizer::update_by_rows` and `update_sparse_by_rows`, and the
//! references their overrides are tested against), and a parameter's value
//! as one slice for the update kernels.

use ndarray::ArrayD;
use rayon::prelude::*;

use super::moments::walk_blocks;
use crate::error::{Error, Result};
use crate::kernels::Real;
use crate::param::{BlockGradient, ParamGrad, Parameter, RowGradient, SparseRowGradient};

/// Checks a gradient against its parameter: same shape, or a row-sparse
/// gradient of the `(n_rows, width)` parameter with rows in range.
///
/// **Panics** if a row-sparse gradient's rows are not sorted and unique.
#[track_caller]
pub(super) fn check_grad<T: Real>(param: &Parameter<T>, grad: &ParamGrad<T>) -> Result<()> {
    let shape = param.shape();
    match grad {
        ParamGrad::Dense(g) if g.shape() != shape => Err(Error::shape(
            "gradient",
            format!("{shape:?} (the parameter's)"),
            g.shape(),
        )
        .in_array(param.name())),
        ParamGrad::Dense(_) => Ok(()),
        ParamGrad::RowSparse(s) => {
            check_row_sparse(param, s.n_rows, s.values.ncols(), &s.rows, s.values.nrows())
        }
    }
}

/// [`check_grad`] of a row-sparse gradient of `n_rows` rows of `width`
/// reaching `rows`, with `n_values` rows of values.
///
/// **Panics** if the rows are not sorted and unique.
#[track_caller]
pub(super) fn check_row_sparse<T: Real>(
    param: &Parameter<T>,
    n_rows: usize,
    width: usize,
    rows: &[usize],
    n_values: usize,
) -> Result<()> {
    let shape = param.shape();
    if shape != [n_rows, width] {
        return Err(Error::shape(
            "row-sparse gradient",
            format!("{shape:?} (the parameter's)"),
            &[n_rows, width],
        )
        .in_array(param.name()));
    }
    if n_values != rows.len() {
        return Err(Error::shape(
            "row-sparse gradient values",
            format!("({}, {width}), one row per gradient row", rows.len()),
            &[n_values, width],
        )
        .in_array(param.name()));
    }
    assert!(
        rows.windows(2).all(|w| w[0] < w[1]),
        "row-sparse gradient of `{}`: rows are not sorted and unique",
        param.name()
    );
    match rows.last() {
        Some(&last) if last >= n_rows => Err(Error::out_of_range(
            "gradient row",
            vec![rows.len() - 1],
            last as i64,
            0,
            n_rows as i64,
        )
        .in_array(param.name())),
        _ => Ok(()),
    }
}

/// The row length of a parameter whose gradient comes by rows: an error
/// unless it is 2-D.
pub(super) fn rows_width<T: Real>(param: &Parameter<T>) -> Result<usize> {
    match param.shape() {
        &[_, width] => Ok(width),
        shape => Err(Error::shape(
            param.name(),
            "2-D (a gradient given by rows)",
            shape,
        )),
    }
}

/// The row-sparse gradient `grad` gives row by row, every row written in
/// parallel (the default of [`Optimizer::update_sparse_by_rows`], and the
/// reference its overrides are tested against), checked as an optimiser's
/// row-sparse gradient is.
///
/// **Panics** if the rows are not sorted and unique.
#[track_caller]
pub(super) fn sparse_by_rows<T: Real>(
    param: &Parameter<T>,
    grad: &dyn SparseRowGradient<T>,
) -> Result<crate::RowSparse<T>> {
    let width = check_sparse_rows(param, grad)?;
    let rows = grad.rows().to_vec();
    let mut values = ndarray::Array2::<T>::zeros((rows.len(), width));
    if width > 0 {
        values
            .as_slice_mut()
            .expect("a fresh array")
            .par_chunks_mut(width)
            .enumerate()
            .for_each(|(j, g)| grad.write(j, g));
    }
    let n_rows = grad.n_rows();
    Ok(crate::RowSparse {
        n_rows,
        rows,
        values,
    })
}

/// The row length of a parameter whose row-sparse gradient comes by rows,
/// checked as [`check_grad`] checks a stored one: the parameter 2-D, of
/// the gradient's number of rows, every row in range; an error otherwise.
///
/// **Panics** if the rows are not sorted and unique.
#[track_caller]
pub(super) fn check_sparse_rows<T: Real>(
    param: &Parameter<T>,
    grad: &dyn SparseRowGradient<T>,
) -> Result<usize> {
    let width = rows_width(param)?;
    let rows = grad.rows();
    check_row_sparse(param, grad.n_rows(), width, rows, rows.len())?;
    Ok(width)
}

/// The dense gradient `grad` gives row by row, every row written (the
/// default of [`Optimizer::update_by_rows`], and the reference its
/// overrides are tested against).
pub(super) fn dense_by_rows<T: Real>(
    param: &Parameter<T>,
    grad: &dyn RowGradient<T>,
) -> Result<ArrayD<T>> {
    rows_width(param)?;
    let v = param.widened();
    let v = v.view().into_dimensionality::<ndarray::Ix2>().expect("2-D");
    let mut g = ndarray::Array2::<T>::zeros(v.raw_dim());
    let mut x = vec![T::zero(); v.ncols()];
    for (r, mut out) in g.outer_iter_mut().enumerate() {
        x.iter_mut().zip(v.row(r)).for_each(|(x, &p)| *x = p);
        grad.write(r, &x, out.as_slice_mut().expect("a fresh array"));
    }
    Ok(g.into_dyn())
}

/// The dense gradient of a [`BlockGradient`] (the default
/// [`Optimizer::update_by_blocks`](super::Optimizer::update_by_blocks)):
/// each block formed from the parameter's rows as they are kept, its rows
/// written from the rows widened.
///
/// Errors if the parameter is not 2-D; **panics** if the blocks are not a
/// partition of its rows.
pub(super) fn dense_by_blocks<T: Real>(
    param: &Parameter<T>,
    grad: &dyn BlockGradient<T>,
) -> Result<ArrayD<T>> {
    let width = rows_width(param)?;
    let n = param.shape()[0];
    let stored = param.stored().view();
    let table = stored.table_rows();
    let mut g = ndarray::Array2::<T>::zeros((n, width));
    let out = g.as_slice_mut().expect("a fresh array");
    // One slice a row, empty ones too.
    let outs: Vec<&mut [T]> = match width {
        0 => (0..n).map(|_| &mut [][..]).collect(),
        _ => out.chunks_mut(width).collect(),
    };
    let rows = (0..n).map(|r| table.kept(r)).zip(outs);
    walk_blocks(
        rows.collect(),
        grad,
        None,
        true,
        || vec![T::zero(); width],
        |x, r, (kept, out), block| {
            kept.widen_into(x);
            block.write(r, x, out);
        },
    );
    Ok(g.into_dyn())
}

/// The parameter's value as one row-major slice, making it standard layout
/// first if it is not (its values are unchanged).
pub(super) fn flat_mut<T: Real>(param: &mut Parameter<T>) -> &mut [T] {
    if !param.value().is_standard_layout() {
        let v = param.value().as_standard_layout().into_owned();
        *param.value_mut() = v;
    }
    param
        .value_mut()
        .as_slice_mut()
        .expect("standard layout is contiguous")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RowSparse;
    use ndarray::{Array2, array};

    /// A (4, 2) parameter `t` of zeros, and a gradient of ones in `rows`.
    fn table_and_rows(rows: Vec<usize>) -> (Parameter<f64>, RowSparse<f64>) {
        let p = Parameter::new("t", Array2::<f64>::zeros((4, 2)).into_dyn());
        let values = Array2::ones((rows.len(), 2));
        let g = RowSparse {
            n_rows: 4,
            rows,
            values,
        };
        (p, g)
    }

    #[test]
    fn gradients_are_checked_against_the_parameter() {
        let (p, ok) = table_and_rows(vec![0, 3]);
        assert!(check_grad(&p, &ParamGrad::RowSparse(ok.clone())).is_ok());
        let far = RowSparse {
            rows: vec![0, 4],
            ..ok.clone()
        };
        let e = check_grad(&p, &ParamGrad::RowSparse(far)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "array `t`: gradient row 4 at position [1] is out of range 0..4"
        );
        let short = RowSparse {
            rows: vec![1],
            ..ok.clone()
        };
        let e = check_grad(&p, &ParamGrad::RowSparse(short)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "array `t`: row-sparse gradient values has shape [2, 2], expected (1, 2), one row per gradient row"
        );
        let e = check_grad(&p, &ParamGrad::Dense(array![1.0, 2.0].into_dyn())).unwrap_err();
        assert_eq!(
            e.to_string(),
            "array `t`: gradient has shape [2], expected [4, 2] (the parameter's)"
        );
    }

    #[test]
    #[should_panic(expected = "rows are not sorted and unique")]
    fn unsorted_rows_are_a_caller_bug() {
        let (p, g) = table_and_rows(vec![2, 1]);
        let _ = check_grad(&p, &ParamGrad::RowSparse(g));
    }

    #[test]
    fn flat_mut_makes_a_transposed_value_standard() {
        let mut p = Parameter::new(
            "t",
            array![[1.0f64, 2.0], [3.0, 4.0]].reversed_axes().into_dyn(),
        );
        assert_eq!(flat_mut(&mut p), &[1.0, 3.0, 2.0, 4.0]);
        assert_eq!(p.value(), &array![[1.0, 3.0], [2.0, 4.0]].into_dyn());
    }
}
