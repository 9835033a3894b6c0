//! The logistic sigmoid `y = σ(x) = 1 / (1 + e^{−x})`.
//!
//! Backward from the saved output: `∂x += ∂y·y·(1 − y)`.
//! Derivation: `docs/gradients.md#sigmoid`.

use ndarray::{ArrayD, ArrayViewD, Zip};

use crate::kernels::Real;
use crate::tape::{Tape, Var};

/// σ(x) without overflow: `1 / (1 + e^{−x})` for x ≥ 0, `e^x / (1 + e^x)`
/// for x < 0.
#[inline]
pub fn sigmoid<T: Real>(x: T) -> T {
    if x >= T::zero() {
        T::one() / (T::one() + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::one() + e)
    }
}

/// `g += gy·y·(1 − y)`, with y = σ(x) the saved output.
pub fn sigmoid_backward<T: Real>(y: ArrayViewD<'_, T>, gy: ArrayViewD<'_, T>, g: &mut ArrayD<T>) {
    Zip::from(g)
        .and(&y)
        .and(&gy)
        .for_each(|g, &y, &gy| *g += gy * y * (T::one() - y));
}

impl<'p, T: Real> Tape<'p, T> {
    /// `σ(x)`, element-wise. Its backward uses only the output.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let x = t.input(array![0.0, 1000.0, -1000.0].into_dyn());
    /// let y = t.sigmoid(x);
    /// assert_eq!(t.value(y), array![0.5, 1.0, 0.0].into_dyn());
    /// ```
    pub fn sigmoid(&mut self, x: Var) -> Var {
        let y = self.value(x).mapv(sigmoid);
        self.push_unary(y, x, |_, y, gy, g| sigmoid_backward(y, gy, g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn hand_case() {
        // σ(0) = 1/2, σ'(0) = 1/2·1/2 = 1/4.
        let g = crate::ops::input_grads(vec![array![0.0].into_dyn()], |t, x| {
            let y = t.sigmoid(x[0]);
            t.sum(y)
        });
        assert_eq!(g, [array![0.25].into_dyn()]);
    }

    #[test]
    fn symmetric_and_finite() {
        for &x in &[-800.0f64, -30.0, -1.0, 0.3, 30.0, 800.0] {
            let (a, b) = (sigmoid(x), sigmoid(-x));
            assert!((a + b - 1.0).abs() < 1e-15, "{x}");
            assert!(a.is_finite());
        }
    }
}
