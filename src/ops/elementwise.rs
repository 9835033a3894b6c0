//! Element-wise `add`, `sub`, `mul` and `scale` on arrays of one shape.
//!
//! | op | forward | backward |
//! |---|---|---|
//! | add | `y = a + b` | `∂a += ∂y`, `∂b += ∂y` |
//! | sub | `y = a − b` | `∂a += ∂y`, `∂b −= ∂y` |
//! | mul | `y = a ⊙ b` | `∂a += ∂y ⊙ b`, `∂b += ∂y ⊙ a` |
//! | scale | `y = c·a` | `∂a += c·∂y` |
//!
//! Derivation: `docs/gradients.md#element-wise-ops`.

use ndarray::{ArrayD, ArrayViewD, Zip};

use super::{SideBackward, same_shape};
use crate::kernels::Real;
use crate::tape::{Tape, Var};

/// `g += gy` (the backward of `add`, and of `sub` for its left side).
pub fn add_backward<T: Real>(gy: ArrayViewD<'_, T>, g: &mut ArrayD<T>) {
    *g += &gy;
}

/// `g −= gy` (the backward of `sub` for its right side).
pub fn sub_backward_rhs<T: Real>(gy: ArrayViewD<'_, T>, g: &mut ArrayD<T>) {
    *g -= &gy;
}

/// `g += gy ⊙ other` (the backward of `mul` for one side; `other` is the
/// other side's value).
pub fn mul_backward<T: Real>(gy: ArrayViewD<'_, T>, other: ArrayViewD<'_, T>, g: &mut ArrayD<T>) {
    Zip::from(g)
        .and(&gy)
        .and(&other)
        .for_each(|g, &gy, &o| *g += gy * o);
}

/// `g += c·gy` (the backward of `scale`).
pub fn scale_backward<T: Real>(gy: ArrayViewD<'_, T>, c: T, g: &mut ArrayD<T>) {
    Zip::from(g).and(&gy).for_each(|g, &gy| *g += c * gy);
}

/// The saved state of `scale`: its input and the constant.
struct Scale<T> {
    a: Var,
    c: T,
}

backward!(Scale<T>, |s, _y, gy, grads| {
    grads.accumulate(gy, &[s.a], |_, gy, g| scale_backward(gy, s.c, g));
});

impl<'p, T: Real> Tape<'p, T> {
    /// `f(a, b)` for values of one shape, recorded with the accumulating
    /// backwards of its two sides.
    ///
    /// **Panics** if the shapes differ.
    #[track_caller]
    fn elementwise(
        &mut self,
        op: &str,
        (a, b): (Var, Var),
        f: impl FnOnce(&ArrayViewD<'_, T>, &ArrayViewD<'_, T>) -> ArrayD<T>,
        backward: [SideBackward<T>; 2],
    ) -> Var {
        let (va, vb) = (self.value(a), self.value(b));
        same_shape(op, va.shape(), vb.shape(), " (no broadcasting)");
        let y = f(&va, &vb);
        self.push_binary(y, (a, b), backward)
    }

    /// `a + b`, element-wise; both of one shape.
    ///
    /// **Panics** if the shapes differ.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let a = t.input(array![1.0, 2.0].into_dyn());
    /// let b = t.input(array![10.0, 20.0].into_dyn());
    /// let y = t.add(a, b);
    /// assert_eq!(t.value(y), array![11.0, 22.0].into_dyn());
    /// ```
    #[track_caller]
    pub fn add(&mut self, a: Var, b: Var) -> Var {
        let backward: SideBackward<T> = |_, gy, g| add_backward(gy, g);
        self.elementwise("add", (a, b), |a, b| a + b, [backward; 2])
    }

    /// `a − b`, element-wise; both of one shape.
    ///
    /// **Panics** if the shapes differ.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let a = t.input(array![1.0, 2.0].into_dyn());
    /// let b = t.input(array![10.0, 20.0].into_dyn());
    /// let y = t.sub(a, b);
    /// assert_eq!(t.value(y), array![-9.0, -18.0].into_dyn());
    /// ```
    #[track_caller]
    pub fn sub(&mut self, a: Var, b: Var) -> Var {
        let backward: [SideBackward<T>; 2] = [
            |_, gy, g| add_backward(gy, g),
            |_, gy, g| sub_backward_rhs(gy, g),
        ];
        self.elementwise("sub", (a, b), |a, b| a - b, backward)
    }

    /// `a ⊙ b`, element-wise; both of one shape.
    ///
    /// **Panics** if the shapes differ.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let a = t.input(array![1.0, 2.0].into_dyn());
    /// let y = t.mul(a, a); // a², gradient 2a
    /// let loss = t.sum(y);
    /// assert_eq!(t.backward(loss).input(a).unwrap(), &array![2.0, 4.0].into_dyn());
    /// ```
    #[track_caller]
    pub fn mul(&mut self, a: Var, b: Var) -> Var {
        let backward: SideBackward<T> = |other, gy, g| mul_backward(gy, other, g);
        self.elementwise("mul", (a, b), |a, b| a * b, [backward; 2])
    }

    /// `c·a` for a constant `c`.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let a = t.input(array![1.0, -2.0].into_dyn());
    /// let y = t.scale(a, 3.0);
    /// assert_eq!(t.value(y), array![3.0, -6.0].into_dyn());
    /// ```
    pub fn scale(&mut self, a: Var, c: T) -> Var {
        let y = self.value(a).mapv(|x| c * x);
        self.push_op(y, &[a], Scale { a, c })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::input_grads;
    use ndarray::array;

    #[test]
    fn hand_case_product_rule() {
        // y = a ⊙ b with a = [2, 3], b = [5, 7], ∂y = [1, 10]:
        // ∂a = ∂y ⊙ b = [5, 70]; ∂b = ∂y ⊙ a = [2, 30].
        let (a, b) = (array![2.0, 3.0].into_dyn(), array![5.0, 7.0].into_dyn());
        let g = input_grads(vec![a, b], |t, x| {
            let y = t.mul(x[0], x[1]);
            t.dot_const(y, array![1.0, 10.0].into_dyn())
        });
        assert_eq!(
            g,
            [array![5.0, 70.0].into_dyn(), array![2.0, 30.0].into_dyn()]
        );
    }

    #[test]
    fn hand_case_sub_and_scale() {
        // loss = Σ 3·(a − b): ∂a = 3, ∂b = −3.
        let (a, b) = (array![1.0, 2.0].into_dyn(), array![5.0, 7.0].into_dyn());
        let g = input_grads(vec![a, b], |t, x| {
            let d = t.sub(x[0], x[1]);
            let y = t.scale(d, 3.0);
            t.sum(y)
        });
        assert_eq!(
            g,
            [array![3.0, 3.0].into_dyn(), array![-3.0, -3.0].into_dyn()]
        );
    }

    #[test]
    #[should_panic(expected = "add: shapes [2] and [3] differ")]
    fn shape_mismatch_panics() {
        let mut t = Tape::<f64>::new();
        let a = t.input(ArrayD::zeros(ndarray::IxDyn(&[2])));
        let b = t.input(ArrayD::zeros(ndarray::IxDyn(&[3])));
        t.add(a, b);
    }
}
