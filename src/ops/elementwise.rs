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

use crate::kernels::Real;
use crate::tape::{Backward, Flow, NodeGrads, Tape, Var};

#[track_caller]
fn same_shape(op: &str, a: &[usize], b: &[usize]) {
    assert_eq!(
        a, b,
        "{op}: shapes {a:?} and {b:?} differ (no broadcasting)"
    );
}

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

/// The saved state of `add`: its inputs.
struct Add {
    a: Var,
    b: Var,
}

impl<T: Real> Backward<T> for Add {
    fn backward<'a>(
        &'a self,
        _y: ArrayViewD<'a, T>,
        gy: Flow<'a, T>,
        grads: &mut NodeGrads<'a, T>,
    ) {
        let gy = gy.into_owned_in(grads.pool());
        for v in [self.a, self.b] {
            if let Some(g) = grads.buffer(v) {
                add_backward(gy.view(), g);
            }
        }
        grads.recycle(gy);
    }
}

/// The saved state of `sub`: its inputs.
struct Sub {
    a: Var,
    b: Var,
}

impl<T: Real> Backward<T> for Sub {
    fn backward<'a>(
        &'a self,
        _y: ArrayViewD<'a, T>,
        gy: Flow<'a, T>,
        grads: &mut NodeGrads<'a, T>,
    ) {
        let gy = gy.into_owned_in(grads.pool());
        if let Some(g) = grads.buffer(self.a) {
            add_backward(gy.view(), g);
        }
        if let Some(g) = grads.buffer(self.b) {
            sub_backward_rhs(gy.view(), g);
        }
        grads.recycle(gy);
    }
}

/// The saved state of `mul`: its inputs (each side's gradient reads the
/// other's value).
struct Mul {
    a: Var,
    b: Var,
}

impl<T: Real> Backward<T> for Mul {
    fn backward<'a>(
        &'a self,
        _y: ArrayViewD<'a, T>,
        gy: Flow<'a, T>,
        grads: &mut NodeGrads<'a, T>,
    ) {
        let gy = gy.into_owned_in(grads.pool());
        let (va, vb) = (grads.value(self.a), grads.value(self.b));
        if let Some(g) = grads.buffer(self.a) {
            mul_backward(gy.view(), vb, g);
        }
        if let Some(g) = grads.buffer(self.b) {
            mul_backward(gy.view(), va, g);
        }
        grads.recycle(gy);
    }
}

/// The saved state of `scale`: its input and the constant.
struct Scale<T> {
    a: Var,
    c: T,
}

impl<T: Real> Backward<T> for Scale<T> {
    fn backward<'a>(
        &'a self,
        _y: ArrayViewD<'a, T>,
        gy: Flow<'a, T>,
        grads: &mut NodeGrads<'a, T>,
    ) {
        let gy = gy.into_owned_in(grads.pool());
        if let Some(g) = grads.buffer(self.a) {
            scale_backward(gy.view(), self.c, g);
        }
        grads.recycle(gy);
    }
}

impl<'p, T: Real> Tape<'p, T> {
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
        let (va, vb) = (self.value(a), self.value(b));
        same_shape("add", va.shape(), vb.shape());
        let y = &va + &vb;
        self.push_op(y, &[a, b], Add { a, b })
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
        let (va, vb) = (self.value(a), self.value(b));
        same_shape("sub", va.shape(), vb.shape());
        let y = &va - &vb;
        self.push_op(y, &[a, b], Sub { a, b })
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
        let (va, vb) = (self.value(a), self.value(b));
        same_shape("mul", va.shape(), vb.shape());
        let y = &va * &vb;
        self.push_op(y, &[a, b], Mul { a, b })
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
    use ndarray::array;

    #[test]
    fn hand_case_product_rule() {
        // y = a ⊙ b with a = [2, 3], b = [5, 7], ∂y = [1, 10]:
        // ∂a = ∂y ⊙ b = [5, 70]; ∂b = ∂y ⊙ a = [2, 30].
        let mut t = Tape::<f64>::new();
        let a = t.input(array![2.0, 3.0].into_dyn());
        let b = t.input(array![5.0, 7.0].into_dyn());
        let y = t.mul(a, b);
        let r = array![1.0, 10.0].into_dyn();
        let loss = t.dot_const(y, r);
        let g = t.backward(loss);
        assert_eq!(g.input(a).unwrap(), &array![5.0, 70.0].into_dyn());
        assert_eq!(g.input(b).unwrap(), &array![2.0, 30.0].into_dyn());
    }

    #[test]
    fn hand_case_sub_and_scale() {
        // loss = Σ 3·(a − b): ∂a = 3, ∂b = −3.
        let mut t = Tape::<f64>::new();
        let a = t.input(array![1.0, 2.0].into_dyn());
        let b = t.input(array![5.0, 7.0].into_dyn());
        let d = t.sub(a, b);
        let y = t.scale(d, 3.0);
        let loss = t.sum(y);
        let g = t.backward(loss);
        assert_eq!(g.input(a).unwrap(), &array![3.0, 3.0].into_dyn());
        assert_eq!(g.input(b).unwrap(), &array![-3.0, -3.0].into_dyn());
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
