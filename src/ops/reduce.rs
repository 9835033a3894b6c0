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
//! threads: blocks of [`DOT_BLOCK`] elements, each summed in
//! [`DOT_LANES`] interleaved partial sums (element i goes to lane
//! i mod [`DOT_LANES`], which the compiler turns into vector adds), the lanes
//! then added left to right, and the block sums added in block order.
//! [`dot_naive`] is the one-accumulator twin.

use ndarray::{ArrayD, ArrayViewD, Zip, arr0};
use rayon::prelude::*;

use crate::Real;
use crate::tape::{Op, Tape, Value, Var};

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

/// `g += gy·R`.
pub fn dot_const_backward<T: Real>(gy: ArrayViewD<'_, T>, r: ArrayViewD<'_, T>, g: &mut ArrayD<T>) {
    add_scaled(scalar_of(&gy), r, g);
}

/// `g += c·r`, in parallel blocks when both are contiguous and large.
///
/// **Panics** if the shapes differ.
#[track_caller]
pub fn add_scaled<T: Real>(c: T, r: ArrayViewD<'_, T>, g: &mut ArrayD<T>) {
    assert_eq!(
        g.shape(),
        r.shape(),
        "add_scaled: shapes {:?} and {:?} differ",
        g.shape(),
        r.shape()
    );
    match (g.as_slice_mut(), r.as_slice()) {
        (Some(g), Some(r)) if g.len() >= super::PAR_MIN_ELEMS => g
            .par_chunks_mut(DOT_BLOCK)
            .zip(r.par_chunks(DOT_BLOCK))
            .for_each(|(g, r)| g.iter_mut().zip(r).for_each(|(g, &r)| *g += c * r)),
        _ => Zip::from(g).and(&r).for_each(|g, &r| *g += c * r),
    }
}

/// `c·r + 0` as a new array in standard layout, in one pass: the bits
/// [`dot_const_backward`] leaves in a zero buffer, without writing the
/// zeros first.
pub fn scaled_copy<T: Real>(c: T, r: ArrayViewD<'_, T>) -> ArrayD<T> {
    match r.as_slice() {
        Some(s) if s.len() >= super::PAR_MIN_ELEMS => {
            let mut v = Vec::with_capacity(s.len());
            s.par_iter()
                .map(|&x| c * x + T::zero())
                .collect_into_vec(&mut v);
            ArrayD::from_shape_vec(r.raw_dim(), v).expect("one element per element")
        }
        // Logical order, so the result is in standard layout whatever r's.
        _ => ArrayD::from_shape_vec(r.raw_dim(), r.iter().map(|&x| c * x + T::zero()).collect())
            .expect("one element per element"),
    }
}

/// Elements per block of the inner product.
pub const DOT_BLOCK: usize = 1 << 14;
/// Partial sums per block of the inner product.
pub const DOT_LANES: usize = 16;

/// `Σ x ⊙ r` over two slices of one length, in the fixed order of the
/// module docs, blocks in parallel.
///
/// **Panics** if the lengths differ.
#[track_caller]
pub fn dot_slices<T: Real>(x: &[T], r: &[T]) -> T {
    assert_eq!(
        x.len(),
        r.len(),
        "dot: lengths {} and {} differ",
        x.len(),
        r.len()
    );
    let block = |(x, r): (&[T], &[T])| dot_block(x, r);
    let sums: Vec<T> = if x.len() >= super::PAR_MIN_ELEMS {
        x.par_chunks(DOT_BLOCK)
            .zip(r.par_chunks(DOT_BLOCK))
            .map(block)
            .collect()
    } else {
        x.chunks(DOT_BLOCK)
            .zip(r.chunks(DOT_BLOCK))
            .map(block)
            .collect()
    };
    sums.into_iter().fold(T::zero(), |acc, s| acc + s)
}

/// One block: [`DOT_LANES`] interleaved sums, added left to right.
fn dot_block<T: Real>(x: &[T], r: &[T]) -> T {
    let mut lanes = [T::zero(); DOT_LANES];
    let mut xs = x.chunks_exact(DOT_LANES);
    let mut rs = r.chunks_exact(DOT_LANES);
    for (xc, rc) in (&mut xs).zip(&mut rs) {
        for l in 0..DOT_LANES {
            lanes[l] += xc[l] * rc[l];
        }
    }
    for (l, (&a, &b)) in xs.remainder().iter().zip(rs.remainder()).enumerate() {
        lanes[l] += a * b;
    }
    lanes.into_iter().fold(T::zero(), |acc, s| acc + s)
}

/// The naive twin of [`dot_slices`]: the same order, one element at a time
/// on one thread. Equal bit for bit.
pub fn dot_naive<T: Real>(x: &[T], r: &[T]) -> T {
    assert_eq!(
        x.len(),
        r.len(),
        "dot: lengths {} and {} differ",
        x.len(),
        r.len()
    );
    let mut total = T::zero();
    for (xb, rb) in x.chunks(DOT_BLOCK).zip(r.chunks(DOT_BLOCK)) {
        let mut lanes = [T::zero(); DOT_LANES];
        for (i, (&a, &b)) in xb.iter().zip(rb).enumerate() {
            lanes[i % DOT_LANES] += a * b;
        }
        let mut s = T::zero();
        for l in lanes {
            s += l;
        }
        total += s;
    }
    total
}

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
        self.push(arr0(y).into_dyn(), Op::Sum(x), &[x])
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
        self.push(arr0(y).into_dyn(), Op::Mean(x), &[x])
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
        let y = dot(self.value(x), r.view());
        self.push(
            arr0(y).into_dyn(),
            Op::DotConst {
                x,
                r: Value::Owned(r),
            },
            &[x],
        )
    }

    /// [`Tape::dot_const`] with a borrowed `r` (no copy).
    ///
    /// **Panics** if the shapes differ.
    #[track_caller]
    pub fn dot_const_view(&mut self, x: Var, r: ArrayViewD<'p, T>) -> Var {
        let y = dot(self.value(x), r.view());
        self.push(
            arr0(y).into_dyn(),
            Op::DotConst {
                x,
                r: Value::Borrowed(r),
            },
            &[x],
        )
    }
}

#[track_caller]
fn dot<T: Real>(x: ArrayViewD<'_, T>, r: ArrayViewD<'_, T>) -> T {
    assert_eq!(
        x.shape(),
        r.shape(),
        "dot_const: shapes {:?} and {:?} differ",
        x.shape(),
        r.shape()
    );
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
    use super::*;
    use ndarray::array;

    #[test]
    fn dot_equals_its_naive_twin_across_block_edges() {
        let mut rng = crate::Rng::new(7);
        for n in [
            0,
            1,
            15,
            16,
            17,
            DOT_BLOCK - 1,
            DOT_BLOCK,
            3 * DOT_BLOCK + 5,
        ] {
            let x: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
            let r: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
            let fast = dot_slices(&x, &r);
            assert_eq!(fast.to_bits(), dot_naive(&x, &r).to_bits(), "n = {n}");
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                assert_eq!(
                    pool.install(|| dot_slices(&x, &r)).to_bits(),
                    fast.to_bits()
                );
            }
            let exact: f64 = x.iter().zip(&r).map(|(&a, &b)| a as f64 * b as f64).sum();
            assert!(
                (fast as f64 - exact).abs() <= 1e-5 * (1.0 + n as f64),
                "n = {n}"
            );
        }
    }

    #[test]
    fn hand_case_mean() {
        // y = (x0 + x1 + x2 + x3)/4: ∂x_i = 1/4.
        let mut t = Tape::<f64>::new();
        let x = t.input(array![[1.0, 2.0], [3.0, 4.0]].into_dyn());
        let m = t.mean(x);
        assert_eq!(
            t.backward(m).input(x).unwrap(),
            &array![[0.25, 0.25], [0.25, 0.25]].into_dyn()
        );
    }
}
