//! Select by a row mask (`where`): `out[i] = mask[i] ? a[i] : b[i]`.
//!
//! Backward routes the gradient to the side that was chosen:
//! `∂a[i] += mask[i]·∂out[i]`, `∂b[i] += (1 − mask[i])·∂out[i]`.
//! Derivation: `docs/gradients.md#select`.

use ndarray::{ArrayD, ArrayViewD, Axis};

use super::same_shape;
use crate::kernels::Real;
use crate::tape::{Tape, Var};

/// `out[i] = if mask[i] { a[i] } else { b[i] }`. a, b: (n, …), mask: (n).
///
/// **Panics** if a and b differ in shape or the mask is not one per row.
#[track_caller]
pub fn select_forward<T: Real>(
    mask: &[bool],
    a: ArrayViewD<'_, T>,
    b: ArrayViewD<'_, T>,
) -> ArrayD<T> {
    same_shape("select", a.shape(), b.shape(), "");
    assert!(
        a.ndim() >= 1 && a.shape()[0] == mask.len(),
        "select: mask of length {} for rows of {:?}",
        mask.len(),
        a.shape()
    );
    let mut out = b.to_owned();
    for (i, mut row) in out.axis_iter_mut(Axis(0)).enumerate() {
        if mask[i] {
            row.assign(&a.index_axis(Axis(0), i));
        }
    }
    out
}

/// `g[i] += gy[i]` for the rows where `mask[i] == side`.
pub fn select_backward<T: Real>(
    mask: &[bool],
    side: bool,
    gy: ArrayViewD<'_, T>,
    g: &mut ArrayD<T>,
) {
    for (i, mut row) in g.axis_iter_mut(Axis(0)).enumerate() {
        if mask[i] == side {
            row += &gy.index_axis(Axis(0), i);
        }
    }
}

/// The saved state of `select`: the mask and both inputs.
struct Select {
    mask: Vec<bool>,
    a: Var,
    b: Var,
}

backward!(Select, |s, _y, gy, grads| {
    // a takes the rows where the mask is true, b the others.
    grads.accumulate(gy, &[s.a, s.b], |k, gy, g| {
        select_backward(&s.mask, k == 0, gy, g)
    });
});

impl<'p, T: Real> Tape<'p, T> {
    /// Row-wise choice: `out[i] = mask[i] ? a[i] : b[i]`.
    ///
    /// a, b: (n, …), mask: (n) → (n, …).
    ///
    /// **Panics** if a and b differ in shape or the mask length is not n.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let a = t.input(array![[1.0], [2.0]].into_dyn());
    /// let b = t.input(array![[10.0], [20.0]].into_dyn());
    /// let y = t.select(&[true, false], a, b);
    /// assert_eq!(t.value(y), array![[1.0], [20.0]].into_dyn());
    /// ```
    #[track_caller]
    pub fn select(&mut self, mask: &[bool], a: Var, b: Var) -> Var {
        let y = select_forward(mask, self.value(a), self.value(b));
        self.push_op_with(y, &[a, b], || Select {
            mask: mask.to_vec(),
            a,
            b,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::input_grads;
    use ndarray::array;

    #[test]
    fn hand_case() {
        // Row 0 from a, row 1 from b: ∂a = [1, 0], ∂b = [0, 1] (per row).
        let a = array![[1.0, 1.0], [2.0, 2.0]].into_dyn();
        let b = array![[10.0, 10.0], [20.0, 20.0]].into_dyn();
        let g = input_grads(vec![a, b], |t, x| {
            let y = t.select(&[true, false], x[0], x[1]);
            t.sum(y)
        });
        assert_eq!(g[0], array![[1.0, 1.0], [0.0, 0.0]].into_dyn());
        assert_eq!(g[1], array![[0.0, 0.0], [1.0, 1.0]].into_dyn());
    }
}
