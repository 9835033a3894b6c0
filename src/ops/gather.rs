//! Row gather (embedding lookup): `out[i] = table[ids[i]]`.
//!
//! Backward is a scatter-add: `∂table[r] += Σ_{i : ids[i] = r} ∂out[i]`
//! ([`gather_backward`]). When the table is a 2-D parameter the tape keeps
//! the contributions row-sparse and coalesces them after the sweep
//! ([`crate::kernels::scatter::coalesce_sources`]); otherwise they are
//! added into the table's dense buffer. Derivation:
//! `docs/gradients.md#gather`.

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn};

use crate::kernels::Real;
use crate::kernels::pool::Pool;
use crate::kernels::rows::rows_from_in;
use crate::param::StoredView;
use crate::tape::{Flow, RowPart, Tape, Var};

/// `out[i, …] = table[ids[i], …]`.
///
/// table: (R, …), ids: (n) → out: (n, …).
///
/// **Panics** if an id is ≥ R.
#[track_caller]
pub fn gather_forward<T: Real>(table: ArrayViewD<'_, T>, ids: &[usize]) -> ArrayD<T> {
    gather_forward_in(&Pool::new(), table, ids)
}

/// [`gather_forward`] into a buffer from `pool`.
///
/// **Panics** if an id is ≥ R.
#[track_caller]
pub fn gather_forward_in<T: Real>(
    pool: &Pool<T>,
    table: ArrayViewD<'_, T>,
    ids: &[usize],
) -> ArrayD<T> {
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
        Some(src) => rows_from_in(pool, &shape, width, |i| {
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

/// `∂table[ids[i]] += ∂out[i]` for every i: the rows of `gy`, read where
/// they are (a lazy `c·R` included), as the part the table receives.
pub fn gather_backward<'a, T: Real>(ids: &'a [usize], gy: Flow<'a, T>) -> RowPart<'a, T> {
    RowPart::new(ids, gy)
}

/// The saved state of `gather`: the table and the ids read.
struct Gather {
    table: Var,
    ids: Vec<usize>,
}

backward!(Gather, |s, _y, gy, grads| {
    grads.add_rows(s.table, gather_backward(&s.ids, gy));
});

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
        let out = match self.stored_value(table) {
            StoredView::Full(t) => gather_forward_in(self.pool(), t, ids),
            half => gather_stored_in(self.pool(), half, ids),
        };
        self.push_op_with(out, &[table], || Gather {
            table,
            ids: ids.to_vec(),
        })
    }
}

/// [`gather_forward_in`] from a table kept in half precision: each row
/// read widened (exactly), the bits of the gather of the widened table.
///
/// **Panics** as [`gather_forward`], and if the table is not 2-D.
#[track_caller]
pub fn gather_stored_in<T: Real>(
    pool: &Pool<T>,
    table: StoredView<'_, T>,
    ids: &[usize],
) -> ArrayD<T> {
    let shape = table.shape().to_vec();
    assert_eq!(shape.len(), 2, "gather: a half-precision table must be 2-D");
    let routed = crate::kernels::routing::SplitRouting::new(&[shape[0]])
        .route_all(&ids.iter().map(|&i| i as i64).collect::<Vec<_>>())
        .unwrap_or_else(|e| panic!("gather: {e}"));
    super::split_gather::split_gather_stored_in(pool, &[table], &routed, &[ids.len()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn hand_case_repeated_ids_accumulate() {
        // out = [t1, t0, t1]; ∂t0 = gy[1], ∂t1 = gy[0] + gy[2] (an input:
        // a dense scatter-add).
        let mut tape = Tape::<f64>::new();
        let t = tape.input(ArrayD::zeros(IxDyn(&[3, 2])));
        let y = tape.gather(t, &[1, 0, 1]);
        let gy = array![[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]].into_dyn();
        let loss = tape.dot_const(y, gy);
        assert_eq!(
            tape.backward(loss).input(t).unwrap(),
            &array![[10.0, 20.0], [101.0, 202.0], [0.0, 0.0]].into_dyn()
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
