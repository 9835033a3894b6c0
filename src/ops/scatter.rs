//! Coalescing a scatter-add into a row-sparse gradient.
//!
//! Given contributions `(ids[k], values[k])`, the gradient of row `r` is
//! `Σ_{k : ids[k] = r} values[k]`, summed **in increasing k**. Fixing the
//! order makes the result identical bit for bit whatever the number of
//! threads: the parallel kernel sorts positions by id (a stable sort keeps
//! equal ids in position order) and gives each unique row to one task.
//! No V × H dense buffer is ever touched.

use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;

use crate::Real;
use crate::param::RowSparse;

/// Sorted unique rows and their summed gradients (the fast kernel).
///
/// ids: (n), values: (n, width), every id < n_rows.
///
/// **Panics** if the lengths differ or an id is ≥ n_rows.
#[track_caller]
pub fn coalesce_rows<T: Real>(
    n_rows: usize,
    ids: &[usize],
    values: ArrayView2<'_, T>,
) -> RowSparse<T> {
    assert_eq!(
        ids.len(),
        values.nrows(),
        "coalesce_rows: {} ids for {} rows",
        ids.len(),
        values.nrows()
    );
    if let Some(&bad) = ids.iter().find(|&&i| i >= n_rows) {
        panic!("coalesce_rows: id {bad} is out of range 0..{n_rows}");
    }
    assert!(
        ids.len() <= u32::MAX as usize,
        "coalesce_rows: more than 2^32 contributions"
    );
    let width = values.ncols();
    let mut order: Vec<u32> = (0..ids.len() as u32).collect();
    if ids.len() >= 1 << 12 {
        order.par_sort_by_key(|&k| ids[k as usize]);
    } else {
        order.sort_by_key(|&k| ids[k as usize]);
    }
    // Group boundaries: starts[j]..starts[j + 1] is the j-th unique id.
    let mut starts = Vec::with_capacity(ids.len() + 1);
    for (p, &k) in order.iter().enumerate() {
        if p == 0 || ids[k as usize] != ids[order[p - 1] as usize] {
            starts.push(p);
        }
    }
    starts.push(order.len());
    let n_unique = starts.len() - 1;
    let rows: Vec<usize> = starts[..n_unique]
        .iter()
        .map(|&p| ids[order[p] as usize])
        .collect();
    let mut out = Array2::<T>::zeros((n_unique, width));
    // Contiguous input rows are summed as slices (the loop vectorises);
    // other layouts go through ndarray's row views.
    let flat_values = values.as_slice();
    let sum_group = |(j, dst): (usize, &mut [T])| {
        for &k in &order[starts[j]..starts[j + 1]] {
            let k = k as usize;
            match flat_values {
                Some(v) => {
                    for (d, &s) in dst.iter_mut().zip(&v[k * width..(k + 1) * width]) {
                        *d += s;
                    }
                }
                None => {
                    for (d, &s) in dst.iter_mut().zip(values.row(k).iter()) {
                        *d += s;
                    }
                }
            }
        }
    };
    if width > 0 {
        let flat = out.as_slice_mut().expect("fresh array is contiguous");
        if ids.len() * width >= super::PAR_MIN_ELEMS {
            flat.par_chunks_mut(width).enumerate().for_each(sum_group);
        } else {
            flat.chunks_mut(width).enumerate().for_each(sum_group);
        }
    }
    RowSparse {
        n_rows,
        rows,
        values: out,
    }
}

/// The naive twin of [`coalesce_rows`]: one pass in position order into a
/// map from row to sum. Same result, bit for bit.
pub fn coalesce_rows_naive<T: Real>(
    n_rows: usize,
    ids: &[usize],
    values: ArrayView2<'_, T>,
) -> RowSparse<T> {
    let mut acc: std::collections::BTreeMap<usize, Vec<T>> = Default::default();
    for (k, &id) in ids.iter().enumerate() {
        assert!(
            id < n_rows,
            "coalesce_rows_naive: id {id} is out of range 0..{n_rows}"
        );
        let row = acc
            .entry(id)
            .or_insert_with(|| vec![T::zero(); values.ncols()]);
        for (d, &s) in row.iter_mut().zip(values.row(k).iter()) {
            *d += s;
        }
    }
    let rows: Vec<usize> = acc.keys().copied().collect();
    let mut out = Array2::<T>::zeros((rows.len(), values.ncols()));
    for (mut o, v) in out.outer_iter_mut().zip(acc.values()) {
        o.assign(&ndarray::ArrayView1::from(v.as_slice()));
    }
    RowSparse {
        n_rows,
        rows,
        values: out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn hand_case() {
        let v = array![[1.0f64, 1.0], [2.0, 2.0], [4.0, 4.0], [8.0, 8.0]];
        let rs = coalesce_rows(10, &[7, 2, 7, 7], v.view());
        assert_eq!(rs.rows, vec![2, 7]);
        assert_eq!(rs.values, array![[2.0, 2.0], [13.0, 13.0]]);
        assert_eq!(rs, coalesce_rows_naive(10, &[7, 2, 7, 7], v.view()));
    }

    #[test]
    fn empty() {
        let v = Array2::<f32>::zeros((0, 3));
        let rs = coalesce_rows(4, &[], v.view());
        assert!(rs.rows.is_empty());
        assert_eq!(rs.values.dim(), (0, 3));
    }
}
