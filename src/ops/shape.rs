//! Shape ops: `transpose` (2-D), `reshape` and `concat_rows`.
//! They move elements without arithmetic; each backward moves the gradient
//! back: `∂x += (∂y)ᵀ`, `∂x += reshape(∂y, shape x)`, and each part of a
//! concatenation takes its own rows of `∂y`.
//! Derivation: `docs/gradients.md#shape-ops`.

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn, Slice};

use crate::kernels::Real;
use crate::tape::{Tape, Var};

/// `g += gyᵀ`. gy: (n, m), g: (m, n).
pub fn transpose_backward<T: Real>(gy: ArrayViewD<'_, T>, g: &mut ArrayD<T>) {
    *g += &gy.t();
}

/// `g += gy` read in the shape of g (row-major order).
pub fn reshape_backward<T: Real>(gy: ArrayViewD<'_, T>, g: &mut ArrayD<T>) {
    let shaped = gy
        .as_standard_layout()
        .into_owned()
        .into_shape_with_order(g.raw_dim())
        .expect("same number of elements");
    *g += &shaped;
}

/// `g += gy[start .. start + rows of g]`.
pub fn concat_rows_backward<T: Real>(start: usize, gy: ArrayViewD<'_, T>, g: &mut ArrayD<T>) {
    let rows = g.shape()[0];
    *g += &gy.slice_axis(Axis(0), Slice::from(start..start + rows));
}

/// The saved state of `concat_rows`: the parts, in order.
struct ConcatRows {
    parts: Vec<Var>,
}

backward!(ConcatRows, |s, _y, gy, grads| {
    // Part k's rows of ∂y start after the rows of the parts before it.
    let starts: Vec<usize> = s
        .parts
        .iter()
        .scan(0, |start, &p| {
            let here = *start;
            *start += grads.value(p).shape()[0];
            Some(here)
        })
        .collect();
    grads.accumulate(gy, &s.parts, |k, gy, g| {
        concat_rows_backward(starts[k], gy, g)
    });
});

impl<'p, T: Real> Tape<'p, T> {
    /// The transpose of a 2-D value: (n, m) → (m, n).
    ///
    /// **Panics** if x is not 2-D.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let x = t.input(array![[1.0, 2.0]].into_dyn());
    /// let y = t.transpose(x);
    /// assert_eq!(t.value(y), array![[1.0], [2.0]].into_dyn());
    /// ```
    #[track_caller]
    pub fn transpose(&mut self, x: Var) -> Var {
        let v = self.value(x);
        assert_eq!(
            v.ndim(),
            2,
            "transpose: expected a 2-D value, got shape {:?}",
            v.shape()
        );
        let y = v.t().as_standard_layout().into_owned();
        self.push_unary(y, x, |_, _, gy, g| transpose_backward(gy, g))
    }

    /// The same elements, in row-major order, in another shape.
    ///
    /// **Panics** if the element counts differ.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let x = t.input(array![[1.0, 2.0], [3.0, 4.0]].into_dyn());
    /// let y = t.reshape(x, &[4]);
    /// assert_eq!(t.value(y), array![1.0, 2.0, 3.0, 4.0].into_dyn());
    /// ```
    #[track_caller]
    pub fn reshape(&mut self, x: Var, shape: &[usize]) -> Var {
        let v = self.value(x);
        let n: usize = shape.iter().product();
        assert_eq!(
            v.len(),
            n,
            "reshape: {:?} has {} elements, shape {shape:?} holds {n}",
            v.shape(),
            v.len()
        );
        let y = v
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order(IxDyn(shape))
            .expect("checked above");
        self.push_unary(y, x, |_, _, gy, g| reshape_backward(gy, g))
    }

    /// Stacks values along their first axis: (n₁, …), (n₂, …) → (n₁ + n₂, …).
    ///
    /// **Panics** if `parts` is empty or the trailing shapes differ.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let a = t.input(array![[1.0, 2.0]].into_dyn());
    /// let b = t.input(array![[3.0, 4.0], [5.0, 6.0]].into_dyn());
    /// let c = t.concat_rows(&[a, b]);
    /// assert_eq!(t.value(c), array![[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]].into_dyn());
    /// ```
    #[track_caller]
    pub fn concat_rows(&mut self, parts: &[Var]) -> Var {
        assert!(!parts.is_empty(), "concat_rows: no parts");
        let views: Vec<ArrayViewD<'_, T>> = parts.iter().map(|&p| self.value(p)).collect();
        let y = ndarray::concatenate(Axis(0), &views).unwrap_or_else(|_| {
            let shapes: Vec<&[usize]> = views.iter().map(|v| v.shape()).collect();
            panic!("concat_rows: shapes {shapes:?} do not stack along axis 0")
        });
        self.push_op_with(y, parts, || ConcatRows {
            parts: parts.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::input_grads;
    use ndarray::array;

    #[test]
    fn hand_case_concat_then_transpose() {
        // loss = Σ R ⊙ [a; b]ᵀ: each part gets its rows of Rᵀ.
        let (a, b) = (array![[1.0, 2.0]].into_dyn(), array![[3.0, 4.0]].into_dyn());
        let g = input_grads(vec![a, b], |t, x| {
            let c = t.concat_rows(x);
            let ct = t.transpose(c);
            t.dot_const(ct, array![[1.0, 2.0], [3.0, 4.0]].into_dyn())
        });
        assert_eq!(g[0], array![[1.0, 3.0]].into_dyn());
        assert_eq!(g[1], array![[2.0, 4.0]].into_dyn());
    }
}
