//! Broadcasting a per-row scalar over a row: `out[i, …] = s[i]·x[i, …]`
//! (the gate of a split vocabulary applied to its row).
//!
//! Backward: `∂x[i, …] += s[i]·∂out[i, …]`, `∂s[i] += Σ_… ∂out[i, …]·x[i, …]`.
//! Derivation: `docs/gradients.md#row-scale`.

use ndarray::{ArrayD, ArrayViewD, Axis, Zip};

use super::SideBackward;
use crate::kernels::Real;
use crate::tape::{Tape, Var};

/// `out[i, …] = s[i]·x[i, …]`. x: (n, …), s: (n).
///
/// **Panics** if `s` is not 1-D of length n.
#[track_caller]
pub fn row_scale_forward<T: Real>(x: ArrayViewD<'_, T>, s: ArrayViewD<'_, T>) -> ArrayD<T> {
    check(x.shape(), s.shape());
    let mut y = x.to_owned();
    for (mut row, &si) in y.axis_iter_mut(Axis(0)).zip(s.iter()) {
        row.mapv_inplace(|v| si * v);
    }
    y
}

#[track_caller]
fn check(x: &[usize], s: &[usize]) {
    assert!(
        !x.is_empty() && s.len() == 1 && s[0] == x[0],
        "row_scale: scale of shape {s:?} does not match the rows of {x:?}"
    );
}

/// `g[i, …] += s[i]·gy[i, …]`. gy, g: (n, …), s: (n).
pub fn row_scale_backward_x<T: Real>(
    gy: ArrayViewD<'_, T>,
    s: ArrayViewD<'_, T>,
    g: &mut ArrayD<T>,
) {
    for ((mut gr, gyr), &si) in g
        .axis_iter_mut(Axis(0))
        .zip(gy.axis_iter(Axis(0)))
        .zip(s.iter())
    {
        Zip::from(&mut gr)
            .and(&gyr)
            .for_each(|g, &gy| *g += si * gy);
    }
}

/// `g[i] += Σ_… gy[i, …]·x[i, …]`. gy, x: (n, …), g: (n).
pub fn row_scale_backward_s<T: Real>(
    gy: ArrayViewD<'_, T>,
    x: ArrayViewD<'_, T>,
    g: &mut ArrayD<T>,
) {
    for ((gi, gyr), xr) in g
        .iter_mut()
        .zip(gy.axis_iter(Axis(0)))
        .zip(x.axis_iter(Axis(0)))
    {
        let mut acc = T::zero();
        Zip::from(&gyr).and(&xr).for_each(|&a, &b| acc += a * b);
        *gi += acc;
    }
}

impl<'p, T: Real> Tape<'p, T> {
    /// Scales each row by its own scalar: `out[i, …] = s[i]·x[i, …]`.
    ///
    /// x: (n, …), s: (n) → (n, …).
    ///
    /// **Panics** if `s` is not 1-D with one entry per row of `x`.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let x = t.input(array![[1.0, 2.0], [3.0, 4.0]].into_dyn());
    /// let s = t.input(array![10.0, 0.5].into_dyn());
    /// let y = t.row_scale(x, s);
    /// assert_eq!(t.value(y), array![[10.0, 20.0], [1.5, 2.0]].into_dyn());
    /// ```
    #[track_caller]
    pub fn row_scale(&mut self, x: Var, s: Var) -> Var {
        let y = row_scale_forward(self.value(x), self.value(s));
        let backward: [SideBackward<T>; 2] = [
            |s, gy, g| row_scale_backward_x(gy, s, g),
            |x, gy, g| row_scale_backward_s(gy, x, g),
        ];
        self.push_binary(y, (x, s), backward)
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::input_grads;
    use ndarray::array;

    #[test]
    fn hand_case() {
        // y = s_i·x_i, loss = Σ y ⊙ R with R = 1:
        // ∂x[i, j] = s_i, ∂s_i = Σ_j x[i, j] → [3, 7].
        let x = array![[1.0, 2.0], [3.0, 4.0]].into_dyn();
        let s = array![10.0, 0.5].into_dyn();
        let g = input_grads(vec![x, s], |t, v| {
            let y = t.row_scale(v[0], v[1]);
            t.sum(y)
        });
        assert_eq!(g[0], array![[10.0, 10.0], [0.5, 0.5]].into_dyn());
        assert_eq!(g[1], array![3.0, 7.0].into_dyn());
    }
}
