//! A dense gradient given row by row ([`RowGradient`]), and the forms a
//! row of it can take ([`RowForm`]) that an optimiser computes itself; a
//! row-sparse gradient given row by row ([`SparseRowGradient`]).

use crate::kernels::Real;
use crate::kernels::rows::KeptRow;
use crate::kernels::scatter::{Coalescing, SourceElem};

/// A dense gradient of a 2-D parameter given row by row, for
/// [`Optimizer::update_by_rows`](crate::optim::Optimizer::update_by_rows): [`write`](Self::write) writes any row;
/// [`form`](Self::form) may name a row's form instead, which an optimiser
/// can compute in registers as it updates the row, never writing the row
/// out. Any `Fn(usize, &[T], &mut [T]) + Sync` closure is one (every row
/// written).
///
/// ```
/// use ndarray::Array2;
/// use splitgrad::optim::{LazyAdam, LazyAdamConfig, Optimizer};
/// use splitgrad::param::{Dtype, RowForm, RowGradient};
/// use splitgrad::Parameter;
/// # fn main() -> splitgrad::Result<()> {
/// // Rows 0, 2, 4, … are zero; the others are the row less 1.
/// fn row(r: usize, x: &[f32], g: &mut [f32]) {
///     for (g, &x) in g.iter_mut().zip(x) {
///         *g = if r % 2 == 0 { 0.0 } else { x - 1.0 };
///     }
/// }
/// struct Even;
/// impl RowGradient<f32> for Even {
///     fn write(&self, r: usize, x: &[f32], g: &mut [f32]) {
///         row(r, x, g)
///     }
///     fn form(&self, r: usize) -> RowForm<'_, f32> {
///         if r % 2 == 0 { RowForm::Zero } else { RowForm::Written }
///     }
/// }
/// // Updated with the forms, or with every row written (a closure): the same bits.
/// let init = Array2::from_shape_fn((6, 40), |(i, j)| (i * 40 + j) as f32 * 0.01).into_dyn();
/// let (mut a, mut b) = (Parameter::new("t", init.clone()), Parameter::new("t", init));
/// a.set_dtype(Dtype::BF16)?;
/// b.set_dtype(Dtype::BF16)?;
/// let (mut oa, mut ob) = (LazyAdam::new(LazyAdamConfig::default())?, LazyAdam::new(LazyAdamConfig::default())?);
/// oa.update_by_rows(&mut a, &Even)?;
/// ob.update_by_rows(&mut b, &row)?;
/// assert_eq!(a.widened(), b.widened());
/// # Ok(()) }
/// ```
pub trait RowGradient<T>: Sync {
    /// Writes row r's gradient into `g` (one row of D elements) from `x`,
    /// row r of the parameter before the update.
    fn write(&self, r: usize, x: &[T], g: &mut [T]);

    /// Row r's form, when it has one an optimiser can compute itself;
    /// [`RowForm::Written`] (this default) when it has not. A form must
    /// give [`write`](Self::write)'s bits.
    fn form(&self, r: usize) -> RowForm<'_, T> {
        let _ = r;
        RowForm::Written
    }
}

impl<T, F: Fn(usize, &[T], &mut [T]) + Sync> RowGradient<T> for F {
    fn write(&self, r: usize, x: &[T], g: &mut [T]) {
        self(r, x, g)
    }
}

/// A dense gradient of a 2-D parameter formed a block of rows at a time,
/// for [`Optimizer::update_by_blocks`](crate::optim::Optimizer::update_by_blocks):
/// the rows are cut into blocks, and each block's gradient is formed from
/// the block's rows as they are before the update, just before the
/// optimiser moves them. A gradient whose rows depend on other rows (the
/// fusion penalty's: each row's depends on its group's) is then formed
/// while those rows are in cache, and never stored whole, nor its terms.
///
/// ```
/// use ndarray::{Array2, array};
/// use splitgrad::kernels::rows::KeptRow;
/// use splitgrad::optim::{LazyAdam, LazyAdamConfig, Optimizer};
/// use splitgrad::param::{BlockGradient, RowGradient};
/// use splitgrad::{ParamGrad, Parameter};
/// # fn main() -> splitgrad::Result<()> {
/// // Rows in pairs (0, 1) and (2, 3): each row's gradient is its pair's sum.
/// struct Pairs([[usize; 2]; 2]);
/// impl BlockGradient<f32> for Pairs {
///     fn n_blocks(&self) -> usize { 2 }
///     fn rows(&self, b: usize) -> &[usize] { &self.0[b] }
///     fn block<'s>(&'s self, _: usize, rows: &[KeptRow<'_, f32>], _: &'s mut Vec<f32>) -> Box<dyn RowGradient<f32> + 's> {
///         let (mut sum, mut x) = (vec![0.0f32; 2], vec![0.0f32; 2]);
///         for row in rows {
///             row.widen_into(&mut x);
///             sum.iter_mut().zip(&x).for_each(|(s, &x)| *s += x);
///         }
///         Box::new(move |_: usize, _: &[f32], g: &mut [f32]| g.copy_from_slice(&sum))
///     }
/// }
/// let init = Array2::from_shape_fn((4, 2), |(i, j)| (i + j) as f32).into_dyn();
/// let (mut a, mut b) = (Parameter::new("t", init.clone()), Parameter::new("t", init));
/// let (mut oa, mut ob) = (LazyAdam::new(LazyAdamConfig::default())?, LazyAdam::new(LazyAdamConfig::default())?);
/// oa.update_by_blocks(&mut a, &Pairs([[0, 1], [2, 3]]))?;
/// let dense = array![[1.0f32, 3.0], [1.0, 3.0], [5.0, 7.0], [5.0, 7.0]].into_dyn();
/// ob.update(&mut b, &ParamGrad::Dense(dense))?;
/// assert_eq!(a.value(), b.value());
/// # Ok(()) }
/// ```
pub trait BlockGradient<T>: Sync {
    /// The number of blocks.
    fn n_blocks(&self) -> usize;

    /// The rows of block b, in increasing order. The blocks are a
    /// partition of the parameter's rows: every row in exactly one.
    fn rows(&self, b: usize) -> &[usize];

    /// Block b's gradient from its rows as they are before the update
    /// (`rows[i]` is row `self.rows(b)[i]`), given row by row: the
    /// returned [`RowGradient`] is asked for the block's rows only, each
    /// once. `scratch` is a buffer of the caller's task, for the block's
    /// terms.
    fn block<'s>(
        &'s self,
        b: usize,
        rows: &[KeptRow<'_, T>],
        scratch: &'s mut Vec<T>,
    ) -> Box<dyn RowGradient<T> + 's>;
}

/// How a row of a [`RowGradient`] is formed from the row `x` of the
/// parameter before the update.
#[derive(Clone, Copy, Debug)]
pub enum RowForm<'a, T> {
    /// Every element +0.
    Zero,
    /// Element j is `k·(x_j − c_j) − s_j`, computed as written (the
    /// difference, its product by k, then the second difference, each
    /// rounded in `T`): the fusion penalty's row
    /// ([`FusionRowGrads`](crate::ops::fusion_penalty::FusionRowGrads)). `c` and `s` are a
    /// row long.
    Deviation {
        /// The factor.
        k: T,
        /// Subtracted from the row before the product.
        c: &'a [T],
        /// Subtracted after it.
        s: &'a [T],
    },
    /// Written by [`RowGradient::write`].
    Written,
}

/// A row-sparse gradient of a 2-D parameter given row by row, for
/// [`Optimizer::update_sparse_by_rows`](crate::optim::Optimizer::update_sparse_by_rows):
/// the rows it reaches and, on demand, each one's gradient, so that an
/// optimiser can form a row just before it updates it and the gradient is
/// never stored whole. [`Coalescing`] is one: each row the sum of its
/// contributions, formed in cache.
///
/// ```
/// use ndarray::array;
/// use splitgrad::optim::{LazyAdam, LazyAdamConfig, Optimizer};
/// use splitgrad::param::SparseRowGradient;
/// use splitgrad::{ParamGrad, Parameter, RowSparse};
/// # fn main() -> splitgrad::Result<()> {
/// // Rows 1 and 3 of a 4-row table, each gradient the row's index.
/// struct Two;
/// impl SparseRowGradient<f32> for Two {
///     fn n_rows(&self) -> usize { 4 }
///     fn rows(&self) -> &[usize] { &[1, 3] }
///     fn write_cols(&self, j: usize, _: std::ops::Range<usize>, g: &mut [f32]) { g.fill([1.0, 3.0][j]) }
/// }
/// let init = array![[0.0f32, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0]].into_dyn();
/// let (mut a, mut b) = (Parameter::new("t", init.clone()), Parameter::new("t", init));
/// let (mut oa, mut ob) = (LazyAdam::new(LazyAdamConfig::default())?, LazyAdam::new(LazyAdamConfig::default())?);
/// oa.update_sparse_by_rows(&mut a, &Two)?;
/// let stored = RowSparse { n_rows: 4, rows: vec![1, 3], values: array![[1.0f32, 1.0], [3.0, 3.0]] };
/// ob.update(&mut b, &ParamGrad::RowSparse(stored))?;
/// assert_eq!(a.value(), b.value());
/// # Ok(()) }
/// ```
pub trait SparseRowGradient<T>: Sync {
    /// The rows of the parameter (its first dimension).
    fn n_rows(&self) -> usize;

    /// The rows the gradient reaches, sorted and unique; every other row's
    /// gradient is absent (a lazy optimiser leaves it alone).
    fn rows(&self) -> &[usize];

    /// Writes columns `cols` of the gradient of `rows()[j]` into `g`
    /// (`cols.len()` elements, every one written): the bits of those
    /// columns of the whole row.
    fn write_cols(&self, j: usize, cols: std::ops::Range<usize>, g: &mut [T]);

    /// Writes the gradient of `rows()[j]` into `g` (one row of D elements,
    /// every element written): [`write_cols`](Self::write_cols) of every
    /// column.
    fn write(&self, j: usize, g: &mut [T]) {
        self.write_cols(j, 0..g.len(), g)
    }

    /// The work of forming row j's gradient, against the other rows' (1
    /// by default): an optimiser splits a row much heavier than its share
    /// of a task into runs of columns, each formed and updated apart, so
    /// that one heavy row does not hold the others' threads waiting.
    fn weight(&self, j: usize) -> usize {
        let _ = j;
        1
    }
}

impl<T: Real, S: SourceElem<T>> SparseRowGradient<T> for Coalescing<'_, '_, T, S> {
    fn n_rows(&self) -> usize {
        Coalescing::n_rows(self)
    }

    fn rows(&self) -> &[usize] {
        Coalescing::rows(self)
    }

    fn write_cols(&self, j: usize, cols: std::ops::Range<usize>, g: &mut [T]) {
        self.sum_cols(j, cols, g)
    }

    /// The number of contributions to the row.
    fn weight(&self, j: usize) -> usize {
        self.contributions(j)
    }
}

/// A stored row-sparse gradient, given row by row.
impl<T: Real> SparseRowGradient<T> for super::RowSparse<T> {
    fn n_rows(&self) -> usize {
        self.n_rows
    }

    fn rows(&self) -> &[usize] {
        &self.rows
    }

    fn write_cols(&self, j: usize, cols: std::ops::Range<usize>, g: &mut [T]) {
        let row = self.values.row(j);
        g.iter_mut()
            .zip(row.iter().skip(cols.start).take(cols.len()))
            .for_each(|(g, &v)| *g = v);
    }
}
