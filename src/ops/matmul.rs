//! Matrix product through `matrixmultiply`: `C = A·B`.
//!
//! A: (m, k), B: (k, n) → C: (m, n). Backward: `∂A += ∂C·Bᵀ`,
//! `∂B += Aᵀ·∂C` (each one more gemm, accumulating with β = 1).
//! Derivation: `docs/gradients.md#matmul`.

use ndarray::{Array2, ArrayD, ArrayViewD};

use super::{SideBackward, as_2d, grad_2d};
use crate::kernels::Real;
use crate::tape::{Tape, Var};

#[track_caller]
fn two_d<'a, T>(what: &str, x: ArrayViewD<'a, T>) -> ndarray::ArrayView2<'a, T> {
    as_2d(x, format_args!("matmul: {what} must be 2-D, it has shape"))
}

/// `A·B`. a: (m, k), b: (k, n) → (m, n).
///
/// **Panics** if either is not 2-D or the inner sizes differ.
#[track_caller]
pub fn matmul_forward<T: Real>(a: ArrayViewD<'_, T>, b: ArrayViewD<'_, T>) -> ArrayD<T> {
    let (a, b) = (two_d("the left side", a), two_d("the right side", b));
    assert_eq!(
        a.ncols(),
        b.nrows(),
        "matmul: ({}, {}) · ({}, {}) do not agree",
        a.nrows(),
        a.ncols(),
        b.nrows(),
        b.ncols()
    );
    let mut c = Array2::zeros((a.nrows(), b.ncols()));
    T::gemm(T::one(), a, b, T::zero(), c.view_mut());
    c.into_dyn()
}

/// `∂A += ∂C·Bᵀ`. gy: (m, n), b: (k, n), g: (m, k).
pub fn matmul_backward_lhs<T: Real>(
    gy: ArrayViewD<'_, T>,
    b: ArrayViewD<'_, T>,
    g: &mut ArrayD<T>,
) {
    let (gy, b) = (two_d("∂C", gy), two_d("B", b));
    T::gemm(T::one(), gy, b.t(), T::one(), grad_2d(g));
}

/// `∂B += Aᵀ·∂C`. gy: (m, n), a: (m, k), g: (k, n).
pub fn matmul_backward_rhs<T: Real>(
    gy: ArrayViewD<'_, T>,
    a: ArrayViewD<'_, T>,
    g: &mut ArrayD<T>,
) {
    let (gy, a) = (two_d("∂C", gy), two_d("A", a));
    T::gemm(T::one(), a.t(), gy, T::one(), grad_2d(g));
}

impl<'p, T: Real> Tape<'p, T> {
    /// The matrix product `a·b`: (m, k)·(k, n) → (m, n).
    ///
    /// **Panics** if either is not 2-D or the inner sizes differ.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let a = t.input(array![[1.0, 2.0]].into_dyn());
    /// let b = t.input(array![[3.0], [4.0]].into_dyn());
    /// let c = t.matmul(a, b);
    /// assert_eq!(t.value(c), array![[11.0]].into_dyn());
    /// ```
    #[track_caller]
    pub fn matmul(&mut self, a: Var, b: Var) -> Var {
        let c = matmul_forward(self.value(a), self.value(b));
        let backward: [SideBackward<T>; 2] = [
            |b, gy, g| matmul_backward_lhs(gy, b, g),
            |a, gy, g| matmul_backward_rhs(gy, a, g),
        ];
        self.push_binary(c, (a, b), backward)
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::input_grads;
    use ndarray::array;

    #[test]
    fn hand_case() {
        // c = a·b = a0·b0 + a1·b1 (1×2 · 2×1): ∂a = bᵀ, ∂b = aᵀ.
        let (a, b) = (
            array![[1.0, 2.0]].into_dyn(),
            array![[3.0], [4.0]].into_dyn(),
        );
        let g = input_grads(vec![a, b], |t, x| {
            let c = t.matmul(x[0], x[1]);
            t.sum(c)
        });
        assert_eq!(g[0], array![[3.0, 4.0]].into_dyn());
        assert_eq!(g[1], array![[1.0], [2.0]].into_dyn());
    }
}
