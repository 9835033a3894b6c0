//! Reductions to a scalar (a 0-D array): `sum`, `mean`, and the inner
//! product with a constant array `Σ x ⊙ R` (the test losses).
//!
//! | op | forward | backward |
//! |---|---|---|
//! | sum | `y = Σ x` | `∂x += ∂y` |
//! | mean | `y = Σ x / n` | `∂x += ∂y / n` |
//! | dot_const | `y = Σ x ⊙ R` | `∂x += ∂y·R` |
//!
//! Derivation: `docs/gradients.md#reductions`.
//!
//! The inner product is summed in a fixed order whatever the number of
//! threads ([`dot_slices`], with its naive twin
//! [`dot_naive`](crate::kernels::reduce::dot_naive)). Its backward never
//! writes `∂y·R` out: it returns the pair, which the tape keeps as a lazy
//! gradient ([`NodeGrads::add_scaled`](crate::tape::NodeGrads::add_scaled)) that a gather reads row by row.

use ndarray::{ArrayD, ArrayViewD, arr0};

use super::same_shape;
use crate::kernels::Real;
use crate::kernels::reduce::dot_slices;
use crate::tape::{Flow, Tape, Value, Var};

fn scalar_of<T: Real>(gy: &ArrayViewD<'_, T>) -> T {
    *gy.iter().next().expect("a scalar gradient")
}

/// `g += gy` (broadcast of a scalar).
pub fn sum_backward<T: Real>(gy: ArrayViewD<'_, T>, g: &mut ArrayD<T>) {
    let c = scalar_of(&gy);
    g.mapv_inplace(|v| v + c);
}

/// `g += gy / n`.
pub fn mean_backward<T: Real>(gy: ArrayViewD<'_, T>, g: &mut ArrayD<T>) {
    let c = scalar_of(&gy) / T::from_f64(g.len().max(1) as f64);
    g.mapv_inplace(|v| v + c);
}

/// `∂x += ∂y·R` as the pair `(∂y, R)`, for the tape to keep as it is
/// ([`NodeGrads::add_scaled`](crate::tape::NodeGrads::add_scaled)): written out only if an op other than a
/// gather reads it.
pub fn dot_const_backward<'a, T: Real>(
    r: ArrayViewD<'a, T>,
    gy: Flow<'a, T>,
) -> (T, ArrayViewD<'a, T>) {
    (gy.first(), r)
}

/// The saved state of `dot_const`: its input and the constant `R`.
struct DotConst<'p, T> {
    x: Var,
    r: Value<'p, T>,
}

backward!(DotConst<'_, T>, |s, _y, gy, grads| {
    let (c, r) = dot_const_backward(s.r.view(), gy);
    grads.add_scaled(s.x, c, r);
});

impl<'p, T: Real> Tape<'p, T> {
    /// `Σ x` over every element, as a 0-D value.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let x = t.input(array![[1.0, 2.0], [3.0, 4.0]].into_dyn());
    /// let s = t.sum(x);
    /// assert_eq!(t.scalar(s), 10.0);
    /// ```
    pub fn sum(&mut self, x: Var) -> Var {
        let y = self.value(x).sum();
        self.push_unary(arr0(y).into_dyn(), x, |_, _, gy, g| sum_backward(gy, g))
    }

    /// The mean of every element (0 for an empty array), as a 0-D value.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let x = t.input(array![1.0, 2.0, 6.0].into_dyn());
    /// let m = t.mean(x);
    /// assert_eq!(t.scalar(m), 3.0);
    /// ```
    pub fn mean(&mut self, x: Var) -> Var {
        let v = self.value(x);
        let y = v.sum() / T::from_f64(v.len().max(1) as f64);
        self.push_unary(arr0(y).into_dyn(), x, |_, _, gy, g| mean_backward(gy, g))
    }

    /// `Σ x ⊙ r` for a constant `r` of x's shape, as a 0-D value.
    ///
    /// **Panics** if the shapes differ.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let x = t.input(array![1.0, 2.0].into_dyn());
    /// let y = t.dot_const(x, array![3.0, -1.0].into_dyn());
    /// assert_eq!(t.scalar(y), 1.0);
    /// assert_eq!(t.backward(y).input(x).unwrap(), &array![3.0, -1.0].into_dyn());
    /// ```
    #[track_caller]
    pub fn dot_const(&mut self, x: Var, r: ArrayD<T>) -> Var {
        self.dot_const_value(x, Value::Owned(r))
    }

    /// [`Tape::dot_const`] with a borrowed `r` (no copy).
    ///
    /// **Panics** if the shapes differ.
    #[track_caller]
    pub fn dot_const_view(&mut self, x: Var, r: ArrayViewD<'p, T>) -> Var {
        self.dot_const_value(x, Value::Borrowed(r))
    }

    #[track_caller]
    fn dot_const_value(&mut self, x: Var, r: Value<'p, T>) -> Var {
        let y = dot(self.value(x), r.view());
        self.push_op(arr0(y).into_dyn(), &[x], DotConst { x, r })
    }
}

#[track_caller]
fn dot<T: Real>(x: ArrayViewD<'_, T>, r: ArrayViewD<'_, T>) -> T {
    same_shape("dot_const", x.shape(), r.shape(), "");
    match (x.as_slice(), r.as_slice()) {
        (Some(x), Some(r)) => dot_slices(x, r),
        _ => {
            let (x, r) = (x.as_standard_layout(), r.as_standard_layout());
            dot_slices(
                x.as_slice().expect("standard layout"),
                r.as_slice().expect("standard layout"),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::input_grads;
    use ndarray::array;

    #[test]
    fn hand_case_mean() {
        // y = (x0 + x1 + x2 + x3)/4: ∂x_i = 1/4.
        let x = array![[1.0, 2.0], [3.0, 4.0]].into_dyn();
        let g = input_grads(vec![x], |t, x| t.mean(x[0]));
        assert_eq!(g, [array![[0.25, 0.25], [0.25, 0.25]].into_dyn()]);
    }
}
