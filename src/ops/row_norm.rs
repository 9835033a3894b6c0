//! Row-wise L2 norm: `y[i] = ‖x[i]‖₂ = √(Σ_j x[i, j]²)`.
//!
//! Backward: `∂x[i] += ∂y[i]·x[i] / y[i]`, and **0 where `y[i] = 0`**
//! (PyTorch's convention at the kink: the subgradient of smallest norm).
//! Derivation: `docs/gradients.md#row-norm`.

use ndarray::{Array1, ArrayD, ArrayViewD, Axis, Zip};

use crate::kernels::Real;
use crate::tape::{Tape, Var};

/// `y[i] = ‖x[i]‖₂`. x: (n, …) → (n).
///
/// **Panics** if x is 0-D.
#[track_caller]
pub fn row_norm_forward<T: Real>(x: ArrayViewD<'_, T>) -> ArrayD<T> {
    assert!(x.ndim() >= 1, "row_norm: a 0-D value has no rows");
    let y: Array1<T> = x
        .axis_iter(Axis(0))
        .map(|r| r.iter().map(|&v| v * v).sum::<T>().sqrt())
        .collect();
    y.into_dyn()
}

/// `g[i] += gy[i]·x[i] / y[i]` where `y[i] > 0`; nothing where `y[i] = 0`.
pub fn row_norm_backward<T: Real>(
    x: ArrayViewD<'_, T>,
    y: ArrayViewD<'_, T>,
    gy: ArrayViewD<'_, T>,
    g: &mut ArrayD<T>,
) {
    for (((mut gr, xr), &yi), &gyi) in g
        .axis_iter_mut(Axis(0))
        .zip(x.axis_iter(Axis(0)))
        .zip(y.iter())
        .zip(gy.iter())
    {
        if yi > T::zero() {
            let c = gyi / yi;
            Zip::from(&mut gr).and(&xr).for_each(|g, &x| *g += c * x);
        }
    }
}

impl<'p, T: Real> Tape<'p, T> {
    /// The L2 norm of each row: x: (n, …) → (n). Its gradient is 0 at a
    /// row that is exactly zero.
    ///
    /// **Panics** if x is 0-D.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let x = t.input(array![[0.0, 2.0], [0.0, 0.0]].into_dyn());
    /// let y = t.row_norm(x);
    /// assert_eq!(t.value(y), array![2.0, 0.0].into_dyn());
    /// let loss = t.sum(y);
    /// let g = t.backward(loss);
    /// assert_eq!(g.input(x).unwrap(), &array![[0.0, 1.0], [0.0, 0.0]].into_dyn());
    /// ```
    #[track_caller]
    pub fn row_norm(&mut self, x: Var) -> Var {
        let y = row_norm_forward(self.value(x));
        self.push_unary(y, x, row_norm_backward)
    }
}
